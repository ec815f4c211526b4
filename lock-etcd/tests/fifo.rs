//! Waiters are granted in the order they queued, follow the queue as
//! entries ahead of them leave, and are granted no longer than their own
//! lease lasts (on the shared cluster).

mod common;

use lock_core::Wait;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Locker, Mode};
use lock_etcd::EtcdBackend;
use tokio::time::Instant;

const WAITERS: usize = 20;
const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_waiters_are_granted_in_the_order_they_queued() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let key = unique_key("fifo");
    let first = locker.try_acquire(&key, TTL).await.expect("first holder");

    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let (locker, k, granted) = (locker.clone(), key.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let lease = locker
                .acquire(&k, TTL, Wait::at_most(Duration::from_secs(120)))
                .await
                .expect("acquire");
            granted.lock().unwrap().push((i, lease.fencing_token()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            locker.release(lease).await.expect("release");
        }));
        // The next waiter starts only once this one is in the queue.
        let deadline = Instant::now() + Duration::from_secs(30);
        while backend.queue_len(&key).await.expect("queue length") < i + 2 {
            assert!(Instant::now() < deadline, "waiter {i} never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    locker
        .release(first)
        .await
        .expect("release the first holder");
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .expect("waiters finish")
            .expect("waiter panicked");
    }
    let granted = granted.lock().unwrap().clone();
    let order: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "grants out of queue order"
    );
    assert!(
        granted.windows(2).all(|w| w[0].1 < w[1].1),
        "fencing tokens follow the grant order"
    );
    assert_eq!(
        backend.queue_len(&key).await.expect("queue length"),
        0,
        "the queue is empty at the end"
    );
}

/// When the waiter just ahead gives up, the one behind it watches the next
/// entry ahead instead, and is granted as soon as that one is released (not
/// at its next lease renewal, a third of the TTL later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_follows_the_queue_when_the_entry_ahead_leaves() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let key = unique_key("follow");
    let (_, lease) =
        common::a_waiter_follows_the_queue(&backend, &locker, &key, Mode::Exclusive, TTL).await;
    locker.release(lease).await.expect("release");
}

/// A waiter's grant, never renewed, lapses on the server no earlier than the
/// deadline it was given, also when its deadline counts from the lease
/// renewal before its wait rather than from a keep-alive at the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_grant_lapses_no_earlier_than_its_deadline() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    // The cluster's minimum: the shortest wait for the expiry.
    let ttl = Duration::from_secs(2);
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let key = unique_key("lapse");
    let holder = locker.try_acquire(&key, TTL).await.expect("holder");
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            locker
                .acquire(&key, ttl, Wait::at_most(Duration::from_secs(30)))
                .await
                .expect("acquire")
        })
    };
    common::wait_for_queue_len(&backend, &key, 2).await;
    locker.release(holder).await.expect("release the holder");
    let lapsing = waiter.await.expect("waiter panicked");
    // The next contender gets the lock once the waiter's lease has expired.
    common::lapses_no_earlier_than_its_deadline(&locker, &key, &lapsing).await;
}
