//! TLS to PostgreSQL (`sslmode=verify-full`, with the `tls` feature): a
//! private server accepting TLS with a certificate from a throwaway CA.
//! Trusted through `sslrootcert`; refused under another CA.
#![cfg(feature = "tls")]

use lock_core::Locker;
use lock_postgres::PostgresBackend;
use lock_testkit::{Postgres, TestCa, lock_round_trip};

async fn tls_server() -> (Postgres, TestCa) {
    tokio::task::spawn_blocking(|| {
        let ca = TestCa::generate().expect("make a test CA");
        let server = Postgres::start_tls(&ca).expect("start postgres with TLS");
        (server, ca)
    })
    .await
    .expect("start task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_verified_tls() {
    let (server, ca) = tls_server().await;
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url(),
        ca.ca_file().display()
    );
    let locker = Locker::new(
        PostgresBackend::connect(&url)
            .await
            .expect("connect over TLS"),
    );
    lock_round_trip(&locker, "tls/a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused() {
    let (server, _ca) = tls_server().await;
    let other = tokio::task::spawn_blocking(TestCa::generate)
        .await
        .expect("task")
        .expect("another CA");
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}&connect_timeout_ms=3000",
        server.url(),
        other.ca_file().display()
    );
    let err = PostgresBackend::connect(&url)
        .await
        .expect_err("an untrusted certificate must not connect");
    assert!(err.is_unavailable(), "refused by the handshake: {err}");
}
