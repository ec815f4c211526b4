//! The memory backend's scripted faults reach a semaphore's permits too.

use std::time::Duration;

use lock_core::{GuardOptions, Locker, LostReason, MemoryBackend, Mode, Wait};

const LONG: Duration = Duration::from_secs(60);

fn setup() -> (MemoryBackend, Locker) {
    let memory = MemoryBackend::new();
    (memory.clone(), Locker::new(memory))
}

/// `expire_now` removes every permit of the key: each holder's `lost()`
/// fires at once, and the permits are free for others.
#[tokio::test(flavor = "current_thread")]
async fn expire_now_takes_every_permit_and_each_holder_is_told() {
    let (memory, locker) = setup();
    let jobs = locker
        .semaphore("jobs", 2, GuardOptions::new(LONG))
        .unwrap();
    let (first, second) = (jobs.guard().await.unwrap(), jobs.guard().await.unwrap());
    assert!(memory.expire_now("jobs"));
    for guard in [&first, &second] {
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("lost() fired");
        assert_eq!(reason, LostReason::NotHeld);
    }
    let again = jobs.guard().await.expect("the permits are free");
    assert!(again.fencing_token() > second.fencing_token());
}

/// Releasing one permit tells no other holder it was lost.
#[tokio::test(flavor = "current_thread")]
async fn one_release_leaves_the_other_permits_alone() {
    let (_memory, locker) = setup();
    let jobs = locker
        .semaphore("jobs", 2, GuardOptions::new(LONG))
        .unwrap();
    let (first, second) = (jobs.guard().await.unwrap(), jobs.guard().await.unwrap());
    first.release().await.unwrap();
    tokio::task::yield_now().await;
    assert_eq!(second.lost_reason(), None);
    assert!(second.is_held());
    second.release().await.unwrap();
}

/// Failed renewals hit permits as they hit locks: the guard rides them out.
#[tokio::test(flavor = "current_thread")]
async fn a_permit_rides_out_failed_renewals() {
    tokio::time::pause();
    let (memory, locker) = setup();
    let options = GuardOptions::new(Duration::from_secs(3));
    let permit = locker
        .semaphore("jobs", 3, options)
        .unwrap()
        .guard()
        .await
        .unwrap();
    memory.fail_next_renewals(1);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        permit.lost_reason(),
        None,
        "one failed renewal is ridden out"
    );
    permit.release().await.unwrap();
}

/// The operator's view lists each holder of a semaphore with its mode.
#[tokio::test(flavor = "current_thread")]
async fn inspect_lists_each_permit_holder() {
    let (_memory, locker) = setup();
    let mode = Mode::semaphore(3);
    let _a = locker
        .acquire_in("jobs", mode, LONG, Wait::NONE)
        .await
        .unwrap();
    let _b = locker
        .acquire_in("jobs", mode, LONG, Wait::NONE)
        .await
        .unwrap();
    let held = locker.inspect("jobs").await.unwrap();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(
        held.iter()
            .all(|h| h.mode == mode && h.fencing_token.is_some())
    );
}
