//! TLS (`rediss://` and `rediss+cluster://`, with the `tls` feature) against
//! a private Redis, and a private Redis Cluster, serving TLS with a
//! certificate from a throwaway CA: trusted through `ca_file`, refused
//! without it; a bad `ca_file` is an input error naming it.
#![cfg(feature = "tls")]

use std::time::Duration;

use lock_core::Locker;
use lock_redis::RedisBackend;
use lock_testkit::{RedisCluster, RedisOptions, RedisServer, RedisTls, TestCa, lock_round_trip};

const TTL: Duration = Duration::from_secs(30);

/// A Redis with a TLS port (and its plain one, which the testkit pings),
/// the CA that signed its certificate, and the TLS port.
fn tls_server() -> (RedisServer, TestCa, u16) {
    tls_server_with(TestCa::redis_tls)
}

/// As [`tls_server`], serving TLS as `tls` says.
fn tls_server_with(tls: fn(&TestCa) -> RedisTls) -> (RedisServer, TestCa, u16) {
    let ca = TestCa::generate().expect("make a test CA");
    let server = RedisServer::start_with(RedisOptions {
        tls: Some(tls(&ca)),
        ..RedisOptions::default()
    })
    .expect("start redis with TLS");
    let port = server.tls_port().expect("a TLS port");
    (server, ca, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_tls_with_the_urls_ca() {
    let (_server, ca, port) = tls_server();
    let url = format!(
        "rediss://127.0.0.1:{port}/?ca_file={}",
        ca.ca_file().display()
    );
    let locker = Locker::new(RedisBackend::connect(&url).await.expect("connect over TLS"));
    lock_round_trip(&locker, "tls/a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let (_server, _ca, port) = tls_server();
    // The system's roots do not include the test CA.
    let url = format!("rediss://127.0.0.1:{port}/?timeout_ms=2000");
    let err = untrusted(&url).await;
    assert!(
        err.to_string()
            .contains(&format!("rediss://127.0.0.1:{port}")),
        "names the endpoint: {err}"
    );
}

#[tokio::test]
async fn a_ca_file_that_cannot_be_read_or_without_tls_is_an_input_error() {
    for (url, expect) in [
        (
            "rediss://127.0.0.1:1/?ca_file=/nonexistent/ca.pem",
            "/nonexistent/ca.pem",
        ),
        ("redis://127.0.0.1:1/?ca_file=/etc/hostname", "TLS"),
    ] {
        let err = RedisBackend::connect(url).await.unwrap_err();
        assert!(err.is_invalid_input(), "{url}: {err}");
        assert!(err.to_string().contains(expect), "{url}: {err}");
        assert!(err.to_string().contains("ca_file"), "{url}: {err}");
    }
}

/// A server that asks every client for a certificate
/// (`tls-auth-clients yes`): the URL's `cert_file` and `key_file` present
/// one; without them no lock is taken; half of the pair is an input error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_to_a_server_that_asks_for_one() {
    let (_server, ca, port) = tls_server_with(TestCa::redis_mtls);
    let base = format!(
        "rediss://127.0.0.1:{port}/?timeout_ms=2000&ca_file={}",
        ca.ca_file().display()
    );
    let cert = format!("cert_file={}", ca.client_cert_file().display());
    let url = format!("{base}&{cert}&key_file={}", ca.client_key_file().display());
    let locker = Locker::new(
        RedisBackend::connect(&url)
            .await
            .expect("connect with a client certificate"),
    );
    lock_round_trip(&locker, "mtls/a").await;

    untrusted(&base).await;
    let err = RedisBackend::connect(&format!("{base}&{cert}"))
        .await
        .expect_err("a certificate without its key");
    assert!(err.is_invalid_input(), "{err}");
    assert!(err.to_string().contains("key_file"), "{err}");
}

/// A private 3-node Redis Cluster serving TLS, and the CA of its certificates.
async fn tls_cluster() -> (RedisCluster, TestCa) {
    tokio::task::spawn_blocking(|| {
        let ca = TestCa::generate().expect("make a test CA");
        let cluster = RedisCluster::start_tls(3, &ca).expect("start a TLS Redis Cluster");
        (cluster, ca)
    })
    .await
    .expect("start task")
}

/// Over `rediss+cluster://`, every node is reached over TLS with the URL's
/// CA: the seed, the nodes learned from it (each holds some of the locks),
/// and the operator view's connections to every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_on_a_redis_cluster_over_tls() {
    let (cluster, ca) = tls_cluster().await;
    let url = format!("{}/?ca_file={}", cluster.url(), ca.ca_file().display());
    let backend = RedisBackend::connect(&url)
        .await
        .expect("connect to the cluster over TLS");
    let locker = Locker::new(backend.clone());
    lock_round_trip(&locker, "tls-cluster/round-trip").await;

    // 30 keys over 3 nodes' slots: their hash slots spread them over every
    // node (fixed keys, so always the same spread).
    let mut held = Vec::new();
    for i in 0..30 {
        let key = format!("tls-cluster/{i}");
        held.push(locker.try_acquire(&key, TTL).await.expect("acquire"));
    }
    for node in cluster.nodes() {
        let keys = node.cli(&["KEYS", "lockkit:{tls-cluster/*"]).expect("KEYS");
        let locks = keys.lines().filter(|k| !k.ends_with(":fence")).count();
        assert!(locks > 0, "every node holds some of the locks");
    }
    let report = backend.report("tls-cluster/").await.expect("operator view");
    assert_eq!(report.held.len(), 30, "every master listed, over TLS");
    for lease in held {
        locker.release(lease).await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_certificates_come_from_an_unknown_ca_is_refused() {
    let (cluster, _ca) = tls_cluster().await;
    untrusted(&format!("{}/?timeout_ms=2000", cluster.url())).await;
}

/// The error of a first lock through `url`, whose TLS handshake must fail
/// (an untrusted server certificate, or no client certificate for a server
/// that asks for one), at the connect or at the first request: unavailable.
async fn untrusted(url: &str) -> lock_core::Error {
    let outcome = match RedisBackend::connect(url).await {
        Ok(backend) => Locker::new(backend)
            .try_acquire("tls/untrusted", TTL)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    let err = outcome.expect_err("the handshake must fail");
    assert!(err.is_unavailable(), "{err}");
    err
}
