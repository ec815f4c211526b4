//! TLS to PostgreSQL (`sslmode=verify-full`, with the `tls` feature): a
//! private server accepting TLS with a certificate from a throwaway CA.
//! Trusted through `sslrootcert`; refused under another CA.
#![cfg(feature = "tls")]

use std::time::Duration;

use lock_core::{Error, Locker};
use lock_postgres::PostgresBackend;
use lock_testkit::{Postgres, TestCa};

const TTL: Duration = Duration::from_secs(10);

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
    let first = locker.try_acquire("tls/a", TTL).await.expect("acquire");
    let refused = locker.try_acquire("tls/a", TTL).await.unwrap_err();
    assert!(matches!(refused, Error::Contended { .. }), "{refused}");
    let token = first.fencing_token();
    locker.release(first).await.expect("release");
    let second = locker
        .try_acquire("tls/a", TTL)
        .await
        .expect("acquire again");
    assert!(second.fencing_token() > token);
    locker.release(second).await.expect("release");
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
