//! A released lock's etcd lease serves the next acquire with the same TTL
//! (renewed, not granted anew), never two locks at once, and a lease that
//! ended while idle is replaced by a fresh grant.

use std::time::Duration;

use conformance_tests::server_url;
use lock_core::Locker;
use lock_etcd::EtcdBackend;

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("lease-reuse-{name}-{nanos}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_locks_lease_serves_the_next_acquire_and_only_that_one() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let (a, b, c) = (unique("a"), unique("b"), unique("c"));
    let ttl = Duration::from_secs(10);

    let first = locker.try_acquire(&a, ttl).await.expect("acquire a");
    let first_lease = backend.holder(&a).await.expect("holder").unwrap().lease_id;
    locker.release(first).await.expect("release a");

    let second = locker.try_acquire(&b, ttl).await.expect("acquire b");
    let second_lease = backend.holder(&b).await.expect("holder").unwrap().lease_id;
    assert_eq!(second_lease, first_lease, "the idle lease is reused");

    // While `b` holds it, the lease is not handed to anyone else.
    let third = locker.try_acquire(&c, ttl).await.expect("acquire c");
    let third_lease = backend.holder(&c).await.expect("holder").unwrap().lease_id;
    assert_ne!(third_lease, second_lease);

    // Another TTL gets a lease of its own TTL, not the idle one.
    locker.release(second).await.expect("release b");
    let longer = locker
        .try_acquire(&a, Duration::from_secs(20))
        .await
        .expect("acquire a, longer");
    let longer_lease = backend.holder(&a).await.expect("holder").unwrap().lease_id;
    assert_ne!(longer_lease, first_lease);
    locker.release(longer).await.expect("release");
    locker.release(third).await.expect("release c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_lease_revoked_behind_the_backends_back_is_replaced() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let key = unique("revoked");
    let ttl = Duration::from_secs(10);

    let lease = locker.try_acquire(&key, ttl).await.expect("acquire");
    let idle = backend
        .holder(&key)
        .await
        .expect("holder")
        .unwrap()
        .lease_id;
    locker.release(lease).await.expect("release");
    backend
        .revoke_lease(idle)
        .await
        .expect("revoke the idle lease");

    let mut again = locker.try_acquire(&key, ttl).await.expect("acquire again");
    let holder = backend.holder(&key).await.expect("holder").unwrap();
    assert_ne!(holder.lease_id, idle, "a fresh lease, not the revoked one");
    assert_eq!(holder.fencing_token, again.fencing_token());
    // The grant is real: the lease is alive and keeps the entry.
    locker
        .extend(&mut again, ttl)
        .await
        .expect("extend on the new lease");
    locker.release(again).await.expect("release");
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 0);
}
