//! Deadlines at their edges: replies that come late, grants whose validity
//! was partly spent before the guard got them, and margins or TTLs at the
//! limits of what a `Duration` holds. Time is tokio's paused clock, so the
//! cases run in an instant and wait on nothing real.

use lock_core::Wait;
use std::time::Duration;

use lock_core::{
    DriftMargin, Error, GuardOptions, Locker, LockerOptions, LostReason, MemoryBackend,
};
use tokio::time::Instant;

fn setup() -> (MemoryBackend, Locker) {
    let memory = MemoryBackend::new();
    (memory.clone(), Locker::new(memory))
}

/// A grant whose reply comes after its validity ran out is refused and given
/// back, and a wait with time left asks again rather than failing. The
/// reply comes after the lease's validity (988 ms) but before the grant's
/// TTL (1 s) ends on the server, so only the give-back frees it in time for
/// the retry to win at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_late_reply_is_given_back_and_the_wait_goes_on() {
    let (memory, locker) = setup();
    let started = Instant::now();
    memory.delay_next_grants(1, Duration::from_millis(995));
    let lease = locker
        .acquire(
            "k",
            Duration::from_secs(1),
            Wait::at_most(Duration::from_secs(30)),
        )
        .await
        .expect("the second attempt, answered in time, holds the lock");
    assert_eq!(
        lease.fencing_token().get(),
        2,
        "the late grant was the first"
    );
    let validity = DriftMargin::default().validity(Duration::from_secs(1), Duration::ZERO);
    assert!(
        lease.deadline() <= started + Duration::from_millis(995) + validity,
        "the retry waited for the late grant's TTL instead of its give-back"
    );
    locker.release(lease).await.unwrap();
}

/// One attempt whose reply came too late says so, and gives the grant back.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_late_reply_to_one_attempt_is_reported_as_late() {
    let (memory, locker) = setup();
    // Late past the deadline, but within the TTL: the grant is still on the
    // server when the reply comes, so it must be given back.
    memory.delay_next_grants(1, Duration::from_millis(995));
    let err = locker
        .try_acquire("k", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LostReason::ReplyTooLate,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("late"), "{err}");
    // The grant's TTL has 5 ms left: a wait of 2 ms wins only if it was given back.
    let next = locker
        .acquire(
            "k",
            Duration::from_secs(1),
            Wait::at_most(Duration::from_millis(2)),
        )
        .await
        .expect("the late grant was given back");
    locker.release(next).await.unwrap();
}

/// The guard's renewals are timed from when the grant's request was sent,
/// not from when the guard got it: a reply that took half the TTL leaves a
/// renewal interval close to the TTL still in time.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn renewals_count_from_the_grant_not_from_its_reply() {
    let (memory, locker) = setup();
    memory.delay_next_grants(1, Duration::from_millis(500));
    let options = GuardOptions::new(Duration::from_secs(1)).renew_every(Duration::from_millis(900));
    let guard = locker.guard("k", options).await.expect("guard");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(guard.lost_reason(), None, "the guard did not renew in time");
    assert_eq!(memory.holder_token("k"), Some(guard.fencing_token()));
    guard.release().await.unwrap();
}

/// Margins and TTLs at the limits of a `Duration` are refused as input,
/// never a panic.
#[tokio::test(flavor = "current_thread")]
async fn odd_margins_with_huge_ttls_are_refused_not_panics() {
    for fraction in [f64::NAN, f64::INFINITY, 1.0, 2.0, -1.0, 0.5] {
        let locker = Locker::new(MemoryBackend::new()).with_options(
            LockerOptions::default().drift(DriftMargin {
                fraction,
                fixed: Duration::MAX,
            }),
        );
        for ttl in [
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            Duration::from_secs(10),
        ] {
            let err = locker.try_acquire("k", ttl).await.unwrap_err();
            assert!(
                err.is_invalid_input(),
                "fraction {fraction}, ttl {ttl:?}: {err}"
            );
            let err = locker.guard("k", GuardOptions::new(ttl)).await.unwrap_err();
            assert!(
                err.is_invalid_input(),
                "fraction {fraction}, ttl {ttl:?}: {err}"
            );
        }
    }
    assert!(MemoryBackend::new().held().is_empty());
}
