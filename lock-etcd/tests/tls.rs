//! TLS to the members (`ca_file`, with the `tls` feature): a private
//! one-member cluster serving clients over TLS with a certificate from a
//! throwaway CA. Trusted through `ca_file`; refused under another CA, and
//! over plain HTTP. Members that ask for a client certificate get the one in
//! `cert_file` and `key_file`, and refuse a client without one.
#![cfg(feature = "tls")]

use lock_core::Locker;
use lock_etcd::EtcdBackend;
use lock_testkit::{EtcdCluster, TestCa, lock_round_trip};

async fn tls_cluster() -> (EtcdCluster, TestCa) {
    tokio::task::spawn_blocking(|| {
        let ca = TestCa::generate().expect("make a test CA");
        let cluster = EtcdCluster::start_tls(1, &ca).expect("start etcd serving TLS");
        (cluster, ca)
    })
    .await
    .expect("start task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_tls_with_the_urls_ca() {
    let (cluster, ca) = tls_cluster().await;
    let url = format!("{}?ca_file={}", cluster.url(), ca.ca_file().display());
    let locker = Locker::new(EtcdBackend::connect(&url).await.expect("connect over TLS"));
    lock_round_trip(&locker, "tls/a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ca_or_plain_http_does_not_connect() {
    let (cluster, _ca) = tls_cluster().await;
    let other = tokio::task::spawn_blocking(TestCa::generate)
        .await
        .expect("task")
        .expect("another CA");
    let timeouts = "connect_timeout_ms=2000&response_timeout_ms=2000";
    for url in [
        format!(
            "{}?ca_file={}&{timeouts}",
            cluster.url(),
            other.ca_file().display()
        ),
        format!("{}?{timeouts}", cluster.url()),
    ] {
        let err = EtcdBackend::connect(&url)
            .await
            .expect_err("must not connect");
        assert!(err.is_unavailable(), "{url}: {err}");
    }
}

/// Members that ask every client for a certificate (`--client-cert-auth`):
/// the URL's `cert_file` and `key_file` present one; without them the
/// cluster does not answer; a key that cannot be read is an input error
/// naming `key_file`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_to_members_that_ask_for_one() {
    let (cluster, ca) = tokio::task::spawn_blocking(|| {
        let ca = TestCa::generate().expect("make a test CA");
        let cluster = EtcdCluster::start_mtls(1, &ca).expect("start etcd asking for certificates");
        (cluster, ca)
    })
    .await
    .expect("start task");
    let base = format!("{}?ca_file={}", cluster.url(), ca.ca_file().display());
    let cert = format!("cert_file={}", ca.client_cert_file().display());
    let url = format!("{base}&{cert}&key_file={}", ca.client_key_file().display());
    let locker = Locker::new(
        EtcdBackend::connect(&url)
            .await
            .expect("connect with a client certificate"),
    );
    lock_round_trip(&locker, "mtls/a").await;

    // Short timeouts for the refusal only.
    let err = EtcdBackend::connect(&format!(
        "{base}&connect_timeout_ms=2000&response_timeout_ms=2000"
    ))
    .await
    .expect_err("no certificate, no connection");
    assert!(err.is_unavailable(), "{err}");

    let err = EtcdBackend::connect(&format!("{base}&{cert}&key_file=/nonexistent/client.key"))
        .await
        .expect_err("an unreadable key");
    assert!(err.is_invalid_input(), "{err}");
    assert!(err.to_string().contains("key_file"), "{err}");
}
