//! The memory backend's scripted faults, as a user's test would use them.

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Error, GuardOptions, Locker, LostReason, MemoryBackend};

const LONG: Duration = Duration::from_secs(60);

fn setup() -> (MemoryBackend, Locker) {
    let memory = MemoryBackend::new();
    (memory.clone(), Locker::new(memory))
}

/// The loss is noticed through the backend's signal, long before the first
/// renewal (at TTL/3 = 20 s), even on a single-threaded runtime where the
/// guard's task has not run yet when the fault strikes.
#[tokio::test(flavor = "current_thread")]
async fn expire_now_fires_lost_at_once() {
    let (memory, locker) = setup();
    let guard = locker.guard("k", GuardOptions::new(LONG)).await.unwrap();
    assert!(memory.expire_now("k"));
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fired");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(guard.release().await.unwrap_err().is_lost());
}

#[tokio::test(flavor = "current_thread")]
async fn drop_holder_reports_a_lost_connection_and_frees_the_key() {
    let (memory, locker) = setup();
    let guard = locker.guard("k", GuardOptions::new(LONG)).await.unwrap();
    assert!(memory.drop_holder("k"));
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fired");
    assert_eq!(reason, LostReason::ConnectionLost);
    let next = locker
        .try_acquire("k", LONG)
        .await
        .expect("the key is free");
    assert!(next.fencing_token() > guard.fencing_token());
}

/// Renewals failing as unreachable are retried; a guard survives failures
/// that end before its deadline.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_guard_rides_out_failed_renewals_within_its_deadline() {
    let (memory, locker) = setup();
    let guard = locker
        .guard("k", GuardOptions::new(Duration::from_secs(3)))
        .await
        .unwrap();
    memory.fail_next_renewals(2);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(guard.lost_reason(), None);
    assert_eq!(memory.holder_token("k"), Some(guard.fencing_token()));
    guard.release().await.unwrap();
}

/// When renewals keep failing, the guard reports the lock lost at its
/// deadline, on tokio's (paused) clock.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_guard_whose_renewals_keep_failing_is_lost_at_its_deadline() {
    let (memory, locker) = setup();
    let guard = locker
        .guard("k", GuardOptions::new(Duration::from_secs(3)))
        .await
        .unwrap();
    let deadline = guard.deadline();
    memory.fail_next_renewals(u32::MAX);
    let reason = guard.lost().await;
    assert_eq!(reason, LostReason::DeadlinePassed);
    assert!(tokio::time::Instant::now() >= deadline);
}

#[tokio::test(flavor = "current_thread")]
async fn an_unavailable_backend_fails_every_call_with_unavailable() {
    let (memory, locker) = setup();
    memory.set_unavailable(true);
    let err = locker.try_acquire("k", LONG).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    // A wait keeps retrying, then reports the outage rather than "timed out".
    let err = locker
        .acquire("k", LONG, Wait::at_most(Duration::from_millis(50)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    memory.set_unavailable(false);
    assert!(locker.try_acquire("k", LONG).await.is_ok());
}

/// Grants expire on tokio's clock: a paused test can skip the TTL.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grants_expire_on_tokios_clock() {
    let (memory, locker) = setup();
    let _held = locker
        .try_acquire("k", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(memory.held().len(), 1);
    tokio::time::advance(Duration::from_secs(31)).await;
    assert!(memory.held().is_empty());
    assert!(
        locker
            .try_acquire("k", Duration::from_secs(30))
            .await
            .is_ok()
    );
}

/// Makes the backend unavailable now and available again after `d`.
fn unavailable_for(memory: &MemoryBackend, d: Duration) -> tokio::task::JoinHandle<()> {
    memory.set_unavailable(true);
    let memory = memory.clone();
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        memory.set_unavailable(false);
    })
}

/// A wait retries with a fresh owner after an attempt that failed, so that
/// nothing given back for that attempt (a late release of its owner's
/// grant) can end the retry's grant. The grant says whose it is, and the
/// lease built from it releases it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_wait_retries_with_a_fresh_owner_and_the_lease_is_the_winners() {
    let (memory, locker) = setup();
    let key = locker.key("k").unwrap();
    let asked = lock_core::OwnerToken::random();
    let back_up = unavailable_for(&memory, Duration::from_millis(100));
    let waiting = lock_core::raw::Waiting {
        started: tokio::time::Instant::now(),
        until: tokio::time::Instant::now() + LONG,
        backoff: lock_core::Backoff::default(),
    };
    let grant = lock_core::raw::wait::poll_until_granted(&memory, &key, &asked, LONG, &waiting)
        .await
        .expect("granted once the backend is back");
    back_up.await.unwrap();
    let won = grant.owner.clone().expect("won by a retry's owner");
    assert_ne!(won, asked, "the retry asked with the first attempt's owner");
    assert_eq!(memory.holder_token("k"), Some(grant.token));

    // Through the Locker: the lease is the retry's, so it releases.
    let back_up = unavailable_for(&memory, Duration::from_millis(100));
    let lease = locker
        .acquire("k2", LONG, Wait::at_most(LONG))
        .await
        .expect("granted");
    back_up.await.unwrap();
    locker
        .release(lease)
        .await
        .expect("the lease names the owner that won");
    assert_eq!(memory.holder_token("k2"), None);
}
