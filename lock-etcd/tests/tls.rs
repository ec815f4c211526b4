//! TLS to the members (`ca_file`, with the `tls` feature): a private
//! one-member cluster serving clients over TLS with a certificate from a
//! throwaway CA. Trusted through `ca_file`; refused under another CA, and
//! over plain HTTP.
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
    let timeouts = "connect_timeout_ms=2000&request_timeout_ms=2000";
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
