//! A timeout too long for the clock to count (`Duration::MAX`, or
//! `u64::MAX` milliseconds in a URL) means "as long as it takes": the
//! backend connects and locks, and nothing panics.

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Lease, Locker};
use lock_redis::{RedisBackend, RedisOptions};
use lock_testkit::RedisServer;
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(30);
/// Far beyond what any step below takes, far below "forever".
const PATIENCE: Duration = Duration::from_secs(30);

/// Acquire, a refused acquire, extend, a waiter woken by the release (so
/// the wake-up's connection runs too), release.
async fn locks_work(locker: &Locker, key: &str) {
    let mut held = timeout(PATIENCE, locker.try_acquire(key, TTL))
        .await
        .expect("acquire hung")
        .expect("acquire");
    let refused = timeout(PATIENCE, locker.try_acquire(key, TTL))
        .await
        .expect("a refused acquire hung");
    assert!(refused.unwrap_err().is_contended());
    timeout(PATIENCE, locker.extend(&mut held, TTL))
        .await
        .expect("extend hung")
        .expect("extend");
    let waiter = tokio::spawn({
        let (locker, key) = (locker.clone(), key.to_owned());
        async move {
            locker
                .acquire(&key, TTL, Wait::at_most(Duration::MAX))
                .await
        }
    });
    let token = held.fencing_token();
    release(locker, held).await;
    let next = timeout(PATIENCE, waiter)
        .await
        .expect("the waiter was never granted")
        .expect("the waiting task panicked")
        .expect("acquire after the release");
    assert!(next.fencing_token() > token);
    release(locker, next).await;
}

async fn release(locker: &Locker, lease: Lease) {
    timeout(PATIENCE, locker.release(lease))
        .await
        .expect("release hung")
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_timeouts_too_long_for_the_clock_wait_as_long_as_it_takes() {
    let server = RedisServer::start().expect("start redis");
    let forever = u64::MAX;
    for option in ["response_timeout_ms", "connect_timeout_ms", "timeout_ms"] {
        let url = format!("{}?{option}={forever}", server.url());
        let backend = RedisBackend::connect(&url).await.expect(&url);
        locks_work(&Locker::new(backend), &format!("forever/{option}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builder_timeouts_of_duration_max_wait_as_long_as_it_takes() {
    let server = RedisServer::start().expect("start redis");
    let options = RedisOptions::from_url(&server.url())
        .unwrap()
        .connect_timeout(Duration::MAX)
        .response_timeout(Duration::MAX);
    let backend = RedisBackend::connect_with(options).await.expect("connect");
    locks_work(&Locker::new(backend), "forever/builder").await;
}

/// On the shared Redis Cluster (`scripts/servers.sh`), when it is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_timeouts_too_long_for_the_clock_locks() {
    let Some(cluster) = shared_url("LOCKKIT_REDIS_CLUSTER_URL") else {
        return;
    };
    let run = std::process::id();
    let url = format!("{cluster}?timeout_ms={}", u64::MAX);
    let backend = RedisBackend::connect(&url).await.expect("connect");
    locks_work(&Locker::new(backend), &format!("forever/cluster/{run}")).await;
    let options = RedisOptions::from_url(&cluster)
        .unwrap()
        .connect_timeout(Duration::MAX)
        .response_timeout(Duration::MAX);
    let backend = RedisBackend::connect_with(options).await.expect("connect");
    locks_work(
        &Locker::new(backend),
        &format!("forever/cluster-builder/{run}"),
    )
    .await;
}

/// A shared server's URL from the environment; a missing one fails the
/// test when `LOCKKIT_REQUIRE_SERVERS=1`.
fn shared_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("LOCKKIT_REQUIRE_SERVERS").as_deref() == Ok("1") => {
            panic!("{var} is not set and LOCKKIT_REQUIRE_SERVERS=1")
        }
        _ => None,
    }
}
