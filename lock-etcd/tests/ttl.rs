//! TTLs etcd cannot honour exactly are refused, never shortened or raised
//! behind the caller's back (on the shared cluster, default election timeout).

mod common;

use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, Locker};
use lock_etcd::EtcdBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_below_the_clusters_minimum_is_refused_and_leaves_nothing_held() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let key = unique_key("ttl");
    // Declared minimum (2 s by default): refused before any request.
    let locker = Locker::new(EtcdBackend::connect(&url).await.expect("connect"));
    let err = locker
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("at least 2s"), "{err}");
    let err = locker
        .try_acquire(&key, Duration::from_millis(2500))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("whole multiples of 1s"), "{err}");

    // A declared minimum below the cluster's: etcd would raise the TTL, so the grant is refused.
    let backend = EtcdBackend::connect(&format!("{url}?min_ttl_s=1"))
        .await
        .expect("connect");
    let locker = Locker::new(backend.clone());
    match locker.try_acquire(&key, Duration::from_secs(1)).await {
        Err(Error::InvalidInput {
            field: "ttl",
            problem,
        }) => {
            assert!(
                problem.contains("at least 2s") && problem.contains("min_ttl_s"),
                "{problem}"
            )
        }
        other => panic!("expected the raised TTL to be refused, got {other:?}"),
    }
    assert_eq!(
        backend.queue_len(&key).await.expect("queue length"),
        0,
        "nothing left behind"
    );
    let lease = locker
        .try_acquire(&key, Duration::from_secs(2))
        .await
        .expect("2 s is honoured");
    locker.release(lease).await.expect("release");
}

/// Extending with a shorter TTL keeps the grant on its lease (which then
/// lives at least as long as the new deadline); a longer TTL moves it to a
/// longer lease. The token stays the same and the lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_to_a_shorter_or_longer_ttl_keeps_the_lock() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let key = unique_key("ttl-extend");
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let mut lease = locker
        .try_acquire(&key, Duration::from_secs(6))
        .await
        .unwrap();
    let token = lease.fencing_token();
    let lease_id = || async { backend.holder(&key).await.unwrap().expect("held").lease_id };
    let mut on = lease_id().await;
    for ttl in [2, 10, 4] {
        locker
            .extend(&mut lease, Duration::from_secs(ttl))
            .await
            .unwrap();
        assert!(lease.remaining() <= Duration::from_secs(ttl));
        assert_eq!(lease.fencing_token(), token);
        assert!(matches!(
            locker.try_acquire(&key, Duration::from_secs(2)).await,
            Err(Error::Contended { .. })
        ));
        // The cluster keeps the grant's lease at least as long as the
        // holder's new deadline (both counts in whole seconds, rounded down).
        let now_on = lease_id().await;
        let left = common::lease_seconds_left(common::endpoints(&url), now_on).await;
        assert!(
            left >= lease.remaining().as_secs() as i64,
            "extended to {ttl} s: the lease has {left} s left, the holder {:?}",
            lease.remaining()
        );
        if ttl == 10 {
            assert_ne!(now_on, on, "a longer TTL moves the grant to a longer lease");
        } else {
            assert_eq!(now_on, on, "a shorter TTL keeps the grant on its lease");
        }
        on = now_on;
    }
    locker.release(lease).await.unwrap();
}
