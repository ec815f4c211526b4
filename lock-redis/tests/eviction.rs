//! A Redis that may evict keys when it is full may evict a held lock's:
//! the backend reads the policy when it connects and says so.

use std::time::Duration;

use lock_core::{Assumption, LockBackend, Locker};
use lock_redis::RedisBackend;
use lock_testkit::{RedisOptions, RedisServer};

const TTL: Duration = Duration::from_secs(60);

fn server_with(args: &[&str]) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        extra_args: args.iter().map(|a| a.to_string()).collect(),
        ..RedisOptions::default()
    })
    .expect("start redis")
}

#[tokio::test]
async fn an_evicting_server_is_named_with_its_policy_in_the_capabilities() {
    for policy in ["allkeys-lru", "volatile-ttl"] {
        let server = server_with(&["--maxmemory", "2mb", "--maxmemory-policy", policy]);
        let backend = RedisBackend::connect(&server.url()).await.expect("connect");
        let caps = backend.capabilities();
        assert!(
            caps.exclusion_rests_on
                .contains(&Assumption::ServerEvictsNoLockKeys),
            "{caps:?}"
        );
        assert_eq!(
            caps.lock_key_eviction.as_deref(),
            Some(
                format!(
                    "`{policy}` (maxmemory 2097152 bytes) on redis://{}",
                    server.host_port()
                )
                .as_str()
            ),
        );
    }
}

#[tokio::test]
async fn a_server_that_evicts_nothing_is_not_named() {
    for args in [
        &["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"][..],
        // A policy without a limit evicts nothing.
        &["--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"][..],
    ] {
        let server = server_with(args);
        let backend = RedisBackend::connect(&server.url()).await.expect("connect");
        assert_eq!(backend.capabilities().lock_key_eviction, None, "{args:?}");
    }
}

/// Managed services rename or refuse CONFIG: the policy is read from
/// `INFO memory` instead.
#[tokio::test]
async fn without_config_the_policy_is_read_from_info() {
    let server = server_with(&[
        "--maxmemory",
        "2mb",
        "--maxmemory-policy",
        "allkeys-random",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    assert!(
        !server
            .cli(&["CONFIG", "GET", "maxmemory"])
            .is_ok_and(|out| out.contains("2097152")),
        "CONFIG still answers: INFO would not be asked"
    );
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    let eviction = backend.capabilities().lock_key_eviction.clone();
    assert!(
        eviction
            .as_deref()
            .is_some_and(|e| e.starts_with("`allkeys-random` (maxmemory 2097152 bytes)")),
        "{eviction:?}"
    );
}

/// What the check is for: a full server evicts a held lock's key, and
/// the next contender is granted while the holder is well within its
/// deadline.
#[tokio::test]
async fn a_full_evicting_server_grants_a_held_lock_again() {
    let server = server_with(&["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]);
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let holder = locker.try_acquire("evicted", TTL).await.expect("free");
    let lock_key = backend.layout().keys("evicted").lock;

    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let filler = "x".repeat(10_000);
    // Bounded: 2 MB fill up long before 200 MB are written.
    for i in 0..20_000 {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&lock_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !exists {
            break;
        }
        let _: () = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&filler)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert!(holder.is_within_deadline());
    let contender = locker
        .try_acquire("evicted", TTL)
        .await
        .expect("the evicted lock is granted again");
    assert!(contender.fencing_token() > holder.fencing_token());
    assert!(
        holder.is_within_deadline(),
        "the holder's deadline passed: this would show nothing"
    );
}

/// On a cluster every master holds locks: each is asked, and the one that
/// may evict is named by its address.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evicting_master_of_a_cluster_is_named() {
    use lock_testkit::{RedisCluster, TestCa};
    let (cluster, ca) = tokio::task::spawn_blocking(|| {
        let ca = TestCa::generate().expect("make a test CA");
        let cluster = RedisCluster::start_tls(3, &ca).expect("start a TLS Redis Cluster");
        (cluster, ca)
    })
    .await
    .expect("start task");
    let evicting = &cluster.nodes()[1];
    evicting
        .cli(&[
            "CONFIG",
            "SET",
            "maxmemory",
            "64mb",
            "maxmemory-policy",
            "volatile-lru",
        ])
        .expect("CONFIG SET");
    let url = format!("{}/?ca_file={}", cluster.url(), ca.ca_file().display());
    let backend = RedisBackend::connect(&url).await.expect("connect");
    let tls_port = evicting.tls_port().expect("a TLS port");
    assert_eq!(
        backend.capabilities().lock_key_eviction.as_deref(),
        Some(
            format!(
                "`volatile-lru` (maxmemory 67108864 bytes) on rediss+cluster://127.0.0.1:{tls_port}"
            )
            .as_str()
        )
    );
}
