//! TLS to PostgreSQL (`sslmode=verify-full`, with the `tls` feature): a
//! private server accepting TLS with a certificate from a throwaway CA.
//! Trusted through `sslrootcert`; refused under another CA. A server that
//! asks for a client certificate gets one through `sslcert` and `sslkey`.
#![cfg(feature = "tls")]

use lock_core::Locker;
use lock_postgres::PostgresBackend;
use lock_testkit::{Postgres, TestCa, lock_round_trip};

async fn tls_server() -> (Postgres, TestCa) {
    start(Postgres::start_tls).await
}

/// A server that also asks for a client certificate signed by its CA.
async fn mtls_server() -> (Postgres, TestCa) {
    start(Postgres::start_mtls).await
}

async fn start(how: fn(&TestCa) -> std::io::Result<Postgres>) -> (Postgres, TestCa) {
    tokio::task::spawn_blocking(move || {
        let ca = TestCa::generate().expect("make a test CA");
        let server = how(&ca).expect("start postgres with TLS");
        (server, ca)
    })
    .await
    .expect("start task")
}

/// A URL trusting `ca` (verify-full), with `more` parameters.
fn verified_url(server: &Postgres, ca: &TestCa, more: &str) -> String {
    format!(
        "{}?sslmode=verify-full&sslrootcert={}{more}",
        server.url(),
        ca.ca_file().display()
    )
}

/// Connects to `url` and runs [`lock_round_trip`] on `key`.
async fn round_trip(url: &str, key: &str) {
    let backend = PostgresBackend::connect(url).await;
    let locker = Locker::new(backend.unwrap_or_else(|e| panic!("connect over TLS: {e}")));
    lock_round_trip(&locker, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_verified_tls() {
    let (server, ca) = tls_server().await;
    round_trip(&verified_url(&server, &ca, ""), "tls/a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused() {
    let (server, _ca) = tls_server().await;
    let other = tokio::task::spawn_blocking(TestCa::generate)
        .await
        .expect("task")
        .expect("another CA");
    let url = verified_url(&server, &other, "&connect_timeout_ms=3000");
    let err = PostgresBackend::connect(&url)
        .await
        .expect_err("an untrusted certificate must not connect");
    assert!(err.is_unavailable(), "refused by the handshake: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_sent_to_a_server_that_asks_for_one() {
    let (server, ca) = mtls_server().await;
    let url = verified_url(
        &server,
        &ca,
        &format!(
            "&sslcert={}&sslkey={}",
            ca.client_cert_file().display(),
            ca.client_key_file().display()
        ),
    );
    round_trip(&url, "mtls/a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_client_certificate_a_server_that_asks_for_one_refuses() {
    let (server, ca) = mtls_server().await;
    let url = verified_url(&server, &ca, "&connect_timeout_ms=3000");
    let err = PostgresBackend::connect(&url)
        .await
        .expect_err("no client certificate: refused");
    assert!(
        matches!(err, lock_core::Error::Auth { .. }),
        "refused by the server's authentication: {err}"
    );
}
