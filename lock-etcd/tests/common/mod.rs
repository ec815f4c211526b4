//! What more than one etcd test file checks or sets up.

// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Lease, Locker, Mode};
use lock_etcd::EtcdBackend;
use lock_testkit::EtcdCluster;
use tokio::time::Instant;

/// A private one-member cluster, whose metrics count the requests, a
/// backend on it, and a `Locker` over that.
pub async fn on_private_cluster() -> (EtcdCluster, EtcdBackend, Locker) {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .expect("start task")
        .expect("start a private etcd cluster");
    let backend = EtcdBackend::connect(&cluster.url()).await.expect("connect");
    let locker = Locker::new(backend.clone());
    (cluster, backend, locker)
}

/// How many calls of the gRPC `method` the member has started since it started.
pub fn calls_started(cluster: &EtcdCluster, method: &str) -> u64 {
    cluster
        .member(0)
        .grpc_calls_started(method)
        .expect("read the member's metrics")
}

/// The lock `lapsing` holds, never renewed, lapses on the server no earlier
/// than its deadline: `next` (another contender) waits for it, and is
/// granted at or after that deadline.
pub async fn lapses_no_earlier_than_its_deadline(next: &Locker, key: &str, lapsing: &Lease) {
    let granted_lease = next
        .acquire(
            key,
            Duration::from_secs(10),
            Wait::at_most(Duration::from_secs(30)),
        )
        .await
        .expect("granted after the lapse");
    let granted = Instant::now();
    assert!(
        granted >= lapsing.deadline(),
        "granted again {:?} before the lapsed holder's deadline",
        lapsing.deadline() - granted
    );
    next.release(granted_lease).await.expect("release");
}

/// Whether the etcd lease `id` exists on the cluster at `endpoints`.
pub async fn lease_lives(endpoints: Vec<String>, id: i64) -> bool {
    lease_seconds_left(endpoints, id).await > 0
}

/// What the cluster at `endpoints` says is left of lease `id`, in whole
/// seconds; -1 for a lease it does not know.
pub async fn lease_seconds_left(endpoints: Vec<String>, id: i64) -> i64 {
    let mut client = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("a client of our own");
    client
        .lease_time_to_live(id, None)
        .await
        .expect("lease time-to-live")
        .ttl()
}

/// The client addresses in an `etcd://` URL.
pub fn endpoints(url: &str) -> Vec<String> {
    lock_core::url::ServerUrl::parse(url)
        .expect("url")
        .servers
        .iter()
        .map(|s| s.address(2379))
        .collect()
}

/// Waits until the queue of `key` holds `len` entries.
pub async fn wait_for_queue_len(backend: &EtcdBackend, key: &str, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while backend.queue_len(key).await.expect("queue length") != len {
        assert!(
            Instant::now() < deadline,
            "the queue never held {len} entries"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A holder (the exclusive lock), a writer queued behind it that gives up,
/// and a waiter in `mode` queued behind that one: when the writer just
/// ahead leaves, the waiter follows the queue to the holder, and is
/// granted as soon as the holder releases (well before its next lease
/// renewal, a third of `ttl` later, when it would look again had it missed
/// the release). Returns the holder's fencing token and the waiter's lease.
pub async fn a_waiter_follows_the_queue(
    backend: &EtcdBackend,
    locker: &Locker,
    key: &str,
    mode: Mode,
    ttl: Duration,
) -> (lock_core::FencingToken, Lease) {
    let holder = locker.try_acquire(key, ttl).await.expect("holder");
    let quitter = {
        let (locker, key) = (locker.clone(), key.to_owned());
        tokio::spawn(async move {
            locker
                .acquire(&key, ttl, Wait::at_most(Duration::from_millis(1500)))
                .await
        })
    };
    wait_for_queue_len(backend, key, 2).await;
    let waiter = {
        let (locker, key) = (locker.clone(), key.to_owned());
        tokio::spawn(async move {
            let lease = locker
                .acquire_in(&key, mode, ttl, Wait::at_most(Duration::from_secs(60)))
                .await
                .expect("acquire");
            (lease, Instant::now())
        })
    };
    wait_for_queue_len(backend, key, 3).await;
    assert!(
        quitter.await.expect("quitter panicked").is_err(),
        "the quitter's wait ends while the lock is held"
    );
    wait_for_queue_len(backend, key, 2).await;
    assert!(!waiter.is_finished(), "the waiter got in beside the holder");
    let released = Instant::now();
    let token = holder.fencing_token();
    locker.release(holder).await.expect("release the holder");
    let (lease, granted) = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter is granted")
        .expect("waiter panicked");
    assert!(
        granted >= released,
        "the waiter was granted before the holder released"
    );
    assert!(
        granted - released < ttl / 6,
        "granted {:?} after the release",
        granted - released
    );
    (token, lease)
}
