//! Guards: renewal, loss, release on drop, `with_lock`.

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Error, GuardOptions, LostReason};
use tokio::time::Instant;

use super::{LONG_TTL, SLACK, short, within};
use crate::Fixture;

/// A guard keeps its lock across at least five TTLs, renewing it, while
/// others are refused; its deadline moves and its token stays.
pub async fn guard_keeps_the_lock_across_ttls(fx: &Fixture) {
    let key = fx.key("guard-keeps");
    let ttl = short(fx);
    let guard = fx
        .locker
        .guard(&key, GuardOptions::new(ttl))
        .await
        .expect("guard");
    let (token, first_deadline) = (guard.fencing_token(), guard.deadline());
    let until = Instant::now() + ttl * 5 + ttl / 2;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 2).await;
        assert_eq!(guard.lost_reason(), None, "the guard lost its lock");
        match fx.locker.try_acquire(&key, ttl).await {
            Err(Error::Contended { .. }) => {}
            other => panic!("a contender was not refused while the guard held the lock: {other:?}"),
        }
    }
    assert_eq!(guard.fencing_token(), token);
    assert!(
        guard.deadline() > first_deadline + ttl * 4,
        "the deadline did not move with renewals"
    );
    guard.release().await.expect("release");
}

/// Options under which a guard learns of a removed grant from the backend
/// (at its next renewal, every short TTL, or sooner), long before its own
/// deadline (30 s) could pass for it.
fn renewing_often(fx: &Fixture) -> GuardOptions {
    GuardOptions::new(LONG_TTL).renew_every(short(fx))
}

/// The backend, not the client's deadline, told the guard of its loss.
fn told_by_the_backend(reason: LostReason) {
    assert!(
        matches!(reason, LostReason::NotHeld | LostReason::ConnectionLost),
        "the loss was not reported by the backend: {reason}"
    );
}

/// When the grant is removed behind the guard's back, `lost()` fires, from
/// what the backend says, work run with `run_until_lost` is stopped, the
/// guard says it is no longer held, and the lock is free for others.
pub async fn guard_reports_loss_when_the_grant_is_removed(fx: &Fixture) {
    let key = fx.key("guard-lost");
    let guard = fx
        .locker
        .guard(&key, renewing_often(fx))
        .await
        .expect("guard");
    assert!(guard.is_held(), "a new guard is held");
    let left = guard.remaining();
    assert!(
        !left.is_zero() && left <= LONG_TTL,
        "remaining {left:?} out of (0, {LONG_TTL:?}]"
    );
    let lost = guard.lost();
    let lease_key = guard.key().to_string();
    let endless_work = guard.run_until_lost(std::future::pending::<()>());
    fx.sabotage.remove_grant(&lease_key).await;
    let stopped = within(SLACK, "run_until_lost stops the work", endless_work).await;
    assert!(
        matches!(stopped, Err(Error::Lost { .. })),
        "work under a lost lock must end in Error::Lost: {stopped:?}"
    );
    within(SLACK, "the guard's lost() fires", lost).await;
    told_by_the_backend(guard.lost_reason().expect("a lost guard has a reason"));
    assert!(!guard.is_held(), "a lost guard says it is not held");
    assert_eq!(
        guard.remaining(),
        Duration::ZERO,
        "a lost guard has no time left"
    );
    let next = fx
        .locker
        .acquire(&key, LONG_TTL, Wait::at_most(SLACK))
        .await
        .expect("the lock is free after the loss");
    fx.locker.release(next).await.expect("release");
    assert!(
        guard.release().await.is_err(),
        "releasing a lost guard must report it"
    );
}

/// Dropping a guard releases in the background: the next contender gets
/// the lock long before the guard's TTL would have freed it.
pub async fn dropped_guard_frees_the_lock(fx: &Fixture) {
    let key = fx.key("guard-dropped");
    let guard = fx
        .locker
        .guard(&key, GuardOptions::new(LONG_TTL))
        .await
        .expect("guard");
    drop(guard);
    let started = Instant::now();
    let next = fx
        .locker
        .acquire(&key, LONG_TTL, Wait::at_most(LONG_TTL / 3))
        .await
        .expect("the dropped guard released the lock");
    assert!(started.elapsed() < LONG_TTL / 3);
    fx.locker.release(next).await.expect("release");
}

/// `with_lock` runs the work under the lock and releases after it; if the
/// lock is lost during the work, the work is cancelled and `Lost` returned.
pub async fn with_lock_runs_the_work_and_releases(fx: &Fixture) {
    let key = fx.key("with-lock");
    let ttl = short(fx);
    let out = fx
        .locker
        .with_lock(&key, GuardOptions::new(ttl), |token| async move {
            tokio::time::sleep(ttl).await; // longer than a renewal interval
            token
        })
        .await
        .expect("with_lock");
    assert!(out.get() > 0, "the work received a fencing token");
    let after = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("with_lock released the lock");
    fx.locker.release(after).await.expect("release");

    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let often = renewing_often(fx);
    let saboteur = async {
        started_rx.await.expect("the work started");
        fx.sabotage.remove_grant(&key).await;
    };
    let work = fx.locker.with_lock(&key, often, |_token| async move {
        let _ = started_tx.send(());
        std::future::pending::<()>().await
    });
    let (result, ()) = within(SLACK, "with_lock notices the loss", async {
        tokio::join!(work, saboteur)
    })
    .await;
    match result {
        Err(Error::Lost { reason, .. }) => told_by_the_backend(reason),
        other => panic!("expected lost, got {other:?}"),
    }
}

/// A `Lock` handle takes its key with its options; `try_with_lock` hands
/// the work's own error back, releases the lock after it, and turns the
/// lock's errors (here: busy) into the work's error type.
pub async fn a_lock_handle_and_fallible_work(fx: &Fixture) {
    #[derive(Debug)]
    enum JobError {
        Lock(Error),
        Failed(u64),
    }
    impl From<Error> for JobError {
        fn from(e: Error) -> Self {
            JobError::Lock(e)
        }
    }

    let key = fx.key("handle");
    let lock = fx
        .locker
        .lock(&key, GuardOptions::new(LONG_TTL))
        .expect("a valid key");
    assert_eq!(lock.key(), key);
    let failed: Result<(), JobError> = lock
        .try_with_lock(|token| async move { Err(JobError::Failed(token.get())) })
        .await;
    assert!(
        matches!(failed, Err(JobError::Failed(t)) if t > 0),
        "{failed:?}"
    );

    let guard = lock.guard().await.expect("free again after failed work");
    let busy: Result<(), JobError> = lock.try_with_lock(|_| async { Ok(()) }).await;
    assert!(
        matches!(&busy, Err(JobError::Lock(e)) if e.is_contended()),
        "{busy:?}"
    );
    guard.release().await.expect("release");
    assert!(
        fx.locker.lock("", GuardOptions::new(LONG_TTL)).is_err(),
        "an empty key is refused when the handle is made"
    );
}
