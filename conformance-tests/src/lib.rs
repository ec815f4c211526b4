#![doc = include_str!("../README.md")]

pub mod cases;
mod fixture;
mod waiting_signal;

pub use fixture::{Fixture, ForceRelease, Sabotage, server_url, unique_key};
#[doc(hidden)]
pub use waiting_signal::waiting_signal;

/// Stamps every conformance case as a `#[tokio::test]` for one backend.
///
/// `$fixture` is an `async fn() -> Option<Fixture>`; `None` means the
/// backend's server is not configured, which [`server_url`] turns into a
/// failure when `LOCKKIT_REQUIRE_SERVERS=1` (as in CI) and a skip otherwise.
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:path) => {
        $crate::conformance_suite!(@cases $fixture;
            mutual_exclusion,
            try_acquire_on_held_key_is_contended,
            busy_reads_as_contended_at_every_entry_point,
            keys_are_independent,
            release_then_reacquire,
            closing_idle_resources_keeps_held_locks,
            release_of_a_lost_lease_is_reported_and_harmless,
            forged_lease_can_neither_extend_nor_release,
            rebuilt_lease_works_in_another_client,
            extend_moves_the_deadline,
            extend_after_expiry_is_lost_and_does_not_resurrect,
            extend_after_removal_is_lost,
            grant_expires_after_its_ttl,
            fencing_tokens_strictly_increase,
            acquire_succeeds_soon_after_release,
            acquire_times_out_cleanly,
            cancelled_acquire_leaves_no_grant_beyond_its_ttl,
            dropped_attempt_gives_its_grant_back_at_once,
            waiters_are_granted_in_order_of_arrival,
            a_cancelled_waiter_leaves_the_line,
            a_waiter_killed_in_line_stalls_the_next_no_longer_than_the_bound,
            guard_keeps_the_lock_across_ttls,
            guard_reports_loss_when_the_grant_is_removed,
            dropped_guard_frees_the_lock,
            with_lock_runs_the_work_and_releases,
            a_lock_handle_and_fallible_work,
            invalid_input_is_refused_and_leaves_nothing_held,
            capabilities_are_consistent,
            operator_view_and_force_release_keep_their_promises,
            reentrant_holds_count_and_the_last_release_frees,
            a_lost_grant_reaches_every_hold,
            a_holder_name_is_one_identity_in_one_process,
            semaphores_are_offered_or_refused_with_a_reason,
            semaphore_admits_n_holders_and_then_the_next,
            an_expired_permit_comes_back,
            disagreeing_modes_are_refused,
            semaphore_input_is_validated,
            never_more_than_n_holders_under_contention,
            dropped_permit_attempt_gives_its_permit_back,
            read_write_is_offered_or_refused_with_a_reason,
            readers_share_and_a_writer_excludes_them,
            a_waiting_writer_blocks_new_readers,
            an_expired_reader_frees_the_key,
            readers_and_semaphores_do_not_mix,
            no_writer_overlaps_anyone_under_contention,
            dropped_read_attempt_gives_its_hold_back,
        );
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(fixture) = $fixture().await else { return };
                // A waiter in a process of its own, for the case that kills one.
                let fixture = fixture.with_waiter_binary(env!("CARGO_BIN_EXE_conformance-waiter"));
                $crate::cases::$case(&fixture).await;
            }
        )*
    };
}
