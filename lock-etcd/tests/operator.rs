//! The operator's view on the shared cluster: held locks are listed with
//! their token and remaining TTL, and a forced release takes a lock away.

mod common;

use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{GuardOptions, Locker};
use lock_etcd::EtcdBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspect_lists_held_locks_and_force_release_takes_one_away() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let locker = Locker::new(EtcdBackend::connect(&url).await.expect("connect"));
    let backend = locker.backend().clone();
    let prefix = format!("{}/", unique_key("operator"));
    let ttl = Duration::from_secs(30);
    let guard = locker
        .guard(&format!("{prefix}a"), GuardOptions::new(ttl))
        .await
        .expect("guard");
    let other = locker
        .try_acquire(&format!("{prefix}b/c"), ttl)
        .await
        .expect("second lock");

    let held = backend.inspect(&prefix).await.expect("inspect");
    let keys: Vec<&str> = held.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(keys, [format!("{prefix}a"), format!("{prefix}b/c")]);
    assert_eq!(held[0].fencing_token, Some(guard.fencing_token()));
    assert!(
        held[0]
            .remaining
            .is_some_and(|r| r <= ttl && r > Duration::ZERO),
        "{:?}",
        held[0]
    );

    let lost = guard.lost();
    let etcd = EtcdBackend::connect(&url).await.expect("connect");
    let lease_id = etcd
        .holder(guard.key().as_str())
        .await
        .expect("holder")
        .expect("held")
        .lease_id;
    assert!(
        backend
            .force_release(guard.key())
            .await
            .expect("force release")
    );
    // Only the entry goes: the lease may already serve another lock when a
    // forced release lands (see `force_release`), so it is not revoked.
    assert!(
        common::lease_lives(common::endpoints(&url), lease_id).await,
        "the holder's lease was revoked"
    );
    // Well before the guard's first renewal (a third of its TTL from its
    // grant), which would also find the grant gone.
    tokio::time::timeout(Duration::from_secs(3), lost)
        .await
        .expect("the holder learns at once");
    assert!(
        !backend
            .force_release(guard.key())
            .await
            .expect("force release again")
    );
    locker.release(other).await.expect("release");
    assert!(backend.inspect(&prefix).await.expect("inspect").is_empty());
}
