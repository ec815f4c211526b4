//! Waiters are granted in the order they queued (on the shared cluster).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance_tests::server_url;
use lock_core::Locker;
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
    let key = format!("fifo-{:016x}", unique());
    let first = locker.try_acquire(&key, TTL).await.expect("first holder");

    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let (locker, k, granted) = (locker.clone(), key.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let lease = locker
                .acquire(&k, TTL, Duration::from_secs(120))
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

/// A key suffix no earlier run used.
fn unique() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}
