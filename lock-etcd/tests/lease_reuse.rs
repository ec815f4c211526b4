//! A released lock's etcd lease serves the next acquire with the same TTL
//! (renewed, or used as is when renewed moments ago; never granted anew),
//! never two locks at once, and a lease that ended while idle is replaced by
//! a fresh grant.

mod common;

use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, LockBackend, Locker};
use lock_etcd::EtcdBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_locks_lease_serves_the_next_acquire_and_only_that_one() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let (a, b, c) = (
        unique_key("lease-reuse-a"),
        unique_key("lease-reuse-b"),
        unique_key("lease-reuse-c"),
    );
    let ttl = Duration::from_secs(10);

    let first = locker.try_acquire(&a, ttl).await.expect("acquire a");
    let first_lease = holder_lease(&backend, &a).await;
    locker.release(first).await.expect("release a");

    let second = locker.try_acquire(&b, ttl).await.expect("acquire b");
    let second_lease = holder_lease(&backend, &b).await;
    assert_eq!(second_lease, first_lease, "the idle lease is reused");

    // While `b` holds it, the lease is not handed to anyone else.
    let third = locker.try_acquire(&c, ttl).await.expect("acquire c");
    let third_lease = holder_lease(&backend, &c).await;
    assert_ne!(third_lease, second_lease);

    // Another TTL gets a lease of its own TTL, not the idle one.
    locker.release(second).await.expect("release b");
    let longer = locker
        .try_acquire(&a, Duration::from_secs(20))
        .await
        .expect("acquire a, longer");
    let longer_lease = holder_lease(&backend, &a).await;
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
    let key = unique_key("lease-reuse-revoked");
    let ttl = Duration::from_secs(10);

    let lease = locker.try_acquire(&key, ttl).await.expect("acquire");
    let idle = holder_lease(&backend, &key).await;
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

/// Closing the idle resources revokes the idle leases (gone from the
/// server at once, not at the end of their TTL), and not a lease that
/// holds a lock; the next acquire is granted a fresh lease (on a private
/// one-member cluster, asked directly whether each lease lives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_idle_resources_revokes_the_idle_leases_only() {
    let (cluster, backend, locker) = common::on_private_cluster().await;
    let (idle_key, held_key) = (unique_key("close-idle"), unique_key("close-idle-held"));
    let ttl = Duration::from_secs(10);

    let released = locker.try_acquire(&idle_key, ttl).await.expect("acquire");
    let mut held = locker.try_acquire(&held_key, ttl).await.expect("acquire");
    let idle = holder_lease(&backend, &idle_key).await;
    let holding = holder_lease(&backend, &held_key).await;
    locker.release(released).await.expect("release");

    locker.close_idle().await;
    assert!(
        !common::lease_lives(cluster.endpoints(), idle).await,
        "the idle lease is revoked"
    );
    assert!(
        common::lease_lives(cluster.endpoints(), holding).await,
        "the held lock's lease lives"
    );
    locker
        .extend(&mut held, ttl)
        .await
        .expect("extend the held lock");

    let again = locker
        .try_acquire(&idle_key, ttl)
        .await
        .expect("acquire again");
    let fresh = holder_lease(&backend, &idle_key).await;
    assert!(fresh != idle && fresh != holding, "a new lease");
    locker.release(again).await.expect("release");
    locker.release(held).await.expect("release");
}

/// A grant released twice through the backend (the `Locker` takes the lease
/// by value, the backend does not): the second release reports the lock
/// lost and leaves alone the etcd lease, which now serves another lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_release_does_not_touch_the_reused_lease() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let (a, b) = (
        unique_key("lease-reuse-twice-a"),
        unique_key("lease-reuse-twice-b"),
    );
    let ttl = Duration::from_secs(10);

    let first = locker.try_acquire(&a, ttl).await.expect("acquire a");
    backend.release(&first).await.expect("release a");
    let mut second = locker.try_acquire(&b, ttl).await.expect("acquire b");
    let shared = holder_lease(&backend, &b).await;
    assert_eq!(
        backend.holder(&a).await.expect("holder"),
        None,
        "a is free after its release"
    );

    match backend.release(&first).await {
        Err(Error::Lost { .. }) => {}
        other => panic!("a second release: expected lost, got {other:?}"),
    }
    match backend.extend(&first, ttl).await {
        Err(Error::Lost { .. }) => {}
        other => panic!("extend after release: expected lost, got {other:?}"),
    }
    let holder = backend.holder(&b).await.expect("holder");
    assert_eq!(
        holder.map(|h| h.lease_id),
        Some(shared),
        "b still holds, on the reused lease"
    );
    locker.extend(&mut second, ttl).await.expect("b extends");
    locker.release(second).await.expect("release b");
}

/// A grant on a reused lease, never renewed, lapses on the server no
/// earlier than the deadline it was given: taken again within a tenth of
/// the TTL the lease is not renewed, and the deadline counts from its last
/// renewal (here its grant), not from the new acquire; taken later, it is
/// renewed first. Either way the check below holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_on_a_reused_lease_lapses_no_earlier_than_its_deadline() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    // The cluster's minimum: the shortest wait for the expiry.
    let ttl = Duration::from_secs(2);
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let key = unique_key("lease-reuse-lapse");

    let first = locker.try_acquire(&key, ttl).await.expect("acquire");
    let lease_id = holder_lease(&backend, &key).await;
    locker.release(first).await.expect("release");
    let lapsing = locker.try_acquire(&key, ttl).await.expect("acquire again");
    assert_eq!(
        holder_lease(&backend, &key).await,
        lease_id,
        "the grant is on the reused lease"
    );

    let other = Locker::new(EtcdBackend::connect(&url).await.expect("connect"));
    common::lapses_no_earlier_than_its_deadline(&other, &key, &lapsing).await;
}

/// Taken again within a tenth of the TTL of its lease's last renewal, a lock
/// is granted on the idle lease without a renewal, its deadline counting
/// from that renewal; after a longer pause the lease is renewed first (on a
/// private one-member cluster, whose metrics count the requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewed_moments_ago_is_reused_without_a_renewal() {
    let (cluster, _backend, locker) = common::on_private_cluster().await;
    let calls = |method: &str| common::calls_started(&cluster, method);
    // A tenth of it (4 s) is ample for the five acquires (ten writes) even
    // on a loaded machine, and short enough to wait out below.
    let ttl = Duration::from_secs(40);
    let (grants, renewals) = (calls("LeaseGrant"), calls("LeaseKeepAlive"));

    let first = locker.try_acquire("again", ttl).await.expect("acquire");
    let first_deadline = first.deadline();
    locker.release(first).await.expect("release");
    for _ in 0..4 {
        let again = locker
            .try_acquire("again", ttl)
            .await
            .expect("acquire again");
        assert!(
            again.deadline() <= first_deadline,
            "the deadline counts from the lease's grant, not from this acquire"
        );
        locker.release(again).await.expect("release");
    }
    assert_eq!(calls("LeaseGrant") - grants, 1, "one lease serves all five");
    assert_eq!(
        calls("LeaseKeepAlive") - renewals,
        0,
        "and is never renewed"
    );

    // What is tested here is time passing: no event to wait for.
    let pause = ttl / 10 + Duration::from_millis(500);
    tokio::time::sleep(pause).await;
    let later = locker
        .try_acquire("again", ttl)
        .await
        .expect("acquire later");
    assert_eq!(calls("LeaseKeepAlive") - renewals, 1, "renewed first");
    assert!(later.deadline() > first_deadline + pause);
    assert_eq!(calls("LeaseGrant") - grants, 1, "on the same lease");
    locker.release(later).await.expect("release");
}

/// An idle lease revoked moments after its release (when it would be used
/// without a renewal) is found gone by the enqueue, which takes a new lease:
/// the acquire succeeds, with one more grant and no renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_lease_revoked_moments_after_its_release_is_replaced() {
    let (cluster, backend, locker) = common::on_private_cluster().await;
    let calls = |method: &str| common::calls_started(&cluster, method);
    // A tenth of it (4 s) is ample for the release, revoke and acquire.
    let ttl = Duration::from_secs(40);
    let (grants, renewals) = (calls("LeaseGrant"), calls("LeaseKeepAlive"));

    let first = locker.try_acquire("revoked", ttl).await.expect("acquire");
    let idle = holder_lease(&backend, "revoked").await;
    locker.release(first).await.expect("release");
    backend
        .revoke_lease(idle)
        .await
        .expect("revoke the idle lease");
    let again = locker
        .try_acquire("revoked", ttl)
        .await
        .expect("acquire again");
    assert_ne!(holder_lease(&backend, "revoked").await, idle, "a new lease");
    assert_eq!(calls("LeaseGrant") - grants, 2);
    assert_eq!(calls("LeaseKeepAlive") - renewals, 0);
    locker.release(again).await.expect("release");
}

/// The etcd lease of the entry that holds `key`.
async fn holder_lease(backend: &EtcdBackend, key: &str) -> i64 {
    backend
        .holder(key)
        .await
        .expect("holder")
        .expect("someone holds it")
        .lease_id
}
