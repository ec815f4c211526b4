//! The conformance cases: plain async functions over a [`Fixture`].
//!
//! Every case waits on events with generous limits, so a slow machine does
//! not fail them; cases that depend on a capability read `capabilities()`.

mod exclusion;
mod fencing;
mod guard;
mod in_mode;
mod input;
mod lifecycle;
mod operator;
mod order;
mod read_write;
mod reentrant;
mod semaphore;
mod waiting;

pub use exclusion::mutual_exclusion;
pub use fencing::fencing_tokens_strictly_increase;
pub use guard::{
    a_lock_handle_and_fallible_work, dropped_guard_frees_the_lock,
    guard_keeps_the_lock_across_ttls, guard_reports_loss_when_the_grant_is_removed,
    with_lock_runs_the_work_and_releases,
};
pub use input::{capabilities_are_consistent, invalid_input_is_refused_and_leaves_nothing_held};
pub use lifecycle::{
    busy_reads_as_contended_at_every_entry_point, closing_idle_resources_keeps_held_locks,
    extend_after_expiry_is_lost_and_does_not_resurrect, extend_after_removal_is_lost,
    extend_moves_the_deadline, forged_lease_can_neither_extend_nor_release,
    grant_expires_after_its_ttl, keys_are_independent, rebuilt_lease_works_in_another_client,
    release_of_a_lost_lease_is_reported_and_harmless, release_then_reacquire,
    try_acquire_on_held_key_is_contended,
};
pub use operator::operator_view_and_force_release_keep_their_promises;
pub use order::{
    a_cancelled_waiter_leaves_the_line,
    a_waiter_killed_in_line_stalls_the_next_no_longer_than_the_bound,
    waiters_are_granted_in_order_of_arrival,
};
pub use read_write::{
    a_waiting_writer_blocks_new_readers, an_expired_reader_frees_the_key,
    dropped_read_attempt_gives_its_hold_back, no_writer_overlaps_anyone_under_contention,
    read_write_is_offered_or_refused_with_a_reason, readers_and_semaphores_do_not_mix,
    readers_share_and_a_writer_excludes_them,
};
pub use reentrant::{
    a_holder_name_is_one_identity_in_one_process, a_lost_grant_reaches_every_hold,
    reentrant_holds_count_and_the_last_release_frees,
};
pub use semaphore::{
    an_expired_permit_comes_back, disagreeing_modes_are_refused,
    dropped_permit_attempt_gives_its_permit_back, never_more_than_n_holders_under_contention,
    semaphore_admits_n_holders_and_then_the_next, semaphore_input_is_validated,
    semaphores_are_offered_or_refused_with_a_reason,
};
pub use waiting::{
    acquire_succeeds_soon_after_release, acquire_times_out_cleanly,
    cancelled_acquire_leaves_no_grant_beyond_its_ttl, dropped_attempt_gives_its_grant_back_at_once,
};

use std::future::Future;
use std::time::Duration;

use crate::Fixture;

/// A TTL long enough that nothing in a case outlives it by accident.
pub(crate) const LONG_TTL: Duration = Duration::from_secs(30);

/// Slack added to every wait: a slow machine must not fail a case.
pub(crate) const SLACK: Duration = Duration::from_secs(15);

/// Awaits `fut`, failing the case with `what` if it takes longer than `limit`.
pub(crate) async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not happen within {limit:?}"),
    }
}

/// How long to wait for a grant of `ttl` to lapse on its own.
pub(crate) fn expiry_wait(ttl: Duration) -> Duration {
    ttl * 3 + SLACK
}

/// The short TTL most cases use: 300 ms, or the backend's minimum.
pub(crate) fn short(fx: &Fixture) -> Duration {
    fx.short_ttl(Duration::from_millis(300))
}
