//! TLS (`rediss://`, with the `tls` feature) against a private Redis serving
//! TLS with a certificate from a throwaway CA: trusted through `ca_file`,
//! refused without it; a bad `ca_file` is an input error naming it.
#![cfg(feature = "tls")]

use std::time::Duration;

use lock_core::Locker;
use lock_redis::RedisBackend;
use lock_testkit::{RedisOptions, RedisServer, TestCa, lock_round_trip};

const TTL: Duration = Duration::from_secs(30);

/// A Redis with a TLS port (and its plain one, which the testkit pings),
/// the CA that signed its certificate, and the TLS port.
fn tls_server() -> (RedisServer, TestCa, u16) {
    let ca = TestCa::generate().expect("make a test CA");
    let (args, port) = ca.redis_args().expect("TLS arguments");
    let server = RedisServer::start_with(RedisOptions {
        extra_args: args,
        ..RedisOptions::default()
    })
    .expect("start redis with TLS");
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
    let outcome = match RedisBackend::connect(&url).await {
        Ok(backend) => Locker::new(backend)
            .try_acquire("tls/b", TTL)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    let err = outcome.expect_err("an untrusted certificate must not connect");
    assert!(err.is_unavailable(), "{err}");
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
