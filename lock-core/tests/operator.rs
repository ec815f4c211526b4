//! The operator hooks: listing held locks and force-releasing one.

use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::Grant;
use lock_core::{
    Capabilities, GuardOptions, Lease, LockBackend, LockKey, Locker, LostReason, MemoryBackend,
    OwnerToken, Result, SafetyModel,
};

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "current_thread")]
async fn memory_lists_held_locks_under_a_prefix_with_ttl_and_token() {
    let locker = Locker::new(MemoryBackend::new());
    let a = locker.try_acquire("jobs/a", LONG).await.unwrap();
    let b = locker.try_acquire("jobs/b", LONG).await.unwrap();
    let _other = locker.try_acquire("other", LONG).await.unwrap();

    let held = locker.inspect("jobs/").await.unwrap();
    let keys: Vec<_> = held.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(keys, ["jobs/a", "jobs/b"]);
    assert_eq!(held[0].fencing_token, Some(a.fencing_token()));
    assert_eq!(held[1].fencing_token, Some(b.fencing_token()));
    assert!(
        held.iter()
            .all(|h| h.remaining.is_some_and(|r| r <= LONG && r > LONG / 2))
    );

    locker.release(a).await.unwrap();
    assert_eq!(locker.inspect("").await.unwrap().len(), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn force_release_frees_the_key_and_the_holder_is_told() {
    let locker = Locker::new(MemoryBackend::new());
    let guard = locker.guard("k", GuardOptions::new(LONG)).await.unwrap();
    assert!(locker.force_release("k").await.unwrap());
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fired");
    assert_eq!(reason, LostReason::NotHeld);
    locker.try_acquire("k", LONG).await.expect("free again");
    assert!(!locker.force_release("nothing-here").await.unwrap());
    assert!(
        locker
            .force_release("")
            .await
            .unwrap_err()
            .is_invalid_input()
    );
}

/// A backend without the hooks answers `Unsupported`, naming itself.
#[derive(Debug)]
struct Minimal(Capabilities);

#[async_trait]
impl LockBackend for Minimal {
    fn capabilities(&self) -> &Capabilities {
        &self.0
    }
    async fn try_acquire(&self, _: &LockKey, _: &OwnerToken, _: Duration) -> Result<Grant> {
        unreachable!("not called")
    }
    async fn extend(&self, _: &Lease, _: Duration) -> Result<()> {
        unreachable!("not called")
    }
    async fn release(&self, _: &Lease) -> Result<()> {
        unreachable!("not called")
    }
}

#[tokio::test(flavor = "current_thread")]
async fn backends_without_the_hooks_say_unsupported() {
    let locker = Locker::new(Minimal(Capabilities::new(
        "minimal",
        SafetyModel::SingleNode,
    )));
    let err = locker.inspect("").await.unwrap_err();
    assert!(err.is_unsupported(), "{err}");
    assert!(err.to_string().contains("minimal"), "{err}");
    assert!(
        locker
            .force_release("k")
            .await
            .unwrap_err()
            .is_unsupported()
    );
}
