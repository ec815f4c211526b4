//! A guard learns that the server ended its session long before its next
//! renewal: terminated on the shared server (only this test's own
//! sessions), or lost with a restart of a private server (lock-testkit).

use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{GuardOptions, LockGuard, Locker, LostReason};
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lock_testkit::Postgres;
use tokio::time::timeout;

/// Renewal comes every 20 s (a third of it): a loss noticed within
/// [`NOTICED`] was not noticed by renewal.
const TTL: Duration = Duration::from_secs(60);

/// Generous, and still far below the first renewal.
const NOTICED: Duration = Duration::from_secs(10);

async fn lost_before_renewal(guard: &LockGuard) -> LostReason {
    timeout(NOTICED, guard.lost())
        .await
        .expect("lost() did not fire before the first renewal")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_fires_lost_long_before_the_renewal() {
    let Some(url) = server_url("LOCKKIT_POSTGRES_URL") else {
        return;
    };
    let backend = PostgresBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let (ended, kept) = (unique_key("pg-loss-ended"), unique_key("pg-loss-kept"));
    let guard = locker.guard(&ended, GuardOptions::new(TTL)).await.unwrap();
    let bystander = locker.guard(&kept, GuardOptions::new(TTL)).await.unwrap();
    let pid = backend.holder_pid(&ended).await.unwrap().expect("a holder");
    let mut admin = PgConnection::connect(&url).await.expect("a connection");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(
        terminated,
        "pg_terminate_backend({pid}) did not end the session"
    );
    assert_eq!(
        lost_before_renewal(&guard).await,
        LostReason::ConnectionLost
    );
    // The check that found the ended session saw the bystander's alive.
    assert_eq!(bystander.lost_reason(), None);
    bystander
        .release()
        .await
        .expect("the bystander still holds its lock");
    assert!(guard.release().await.unwrap_err().is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_fires_lost_long_before_the_renewal() {
    let server = tokio::task::spawn_blocking(Postgres::start)
        .await
        .unwrap()
        .expect("start postgres");
    let locker = Locker::new(PostgresBackend::connect(&server.url()).await.unwrap());
    let guards = [
        locker
            .guard("restart/a", GuardOptions::new(TTL))
            .await
            .unwrap(),
        locker
            .guard("restart/b", GuardOptions::new(TTL))
            .await
            .unwrap(),
    ];
    let server = tokio::task::spawn_blocking(move || server.restart().map(|()| server))
        .await
        .unwrap()
        .expect("restart");
    for guard in &guards {
        assert_eq!(lost_before_renewal(guard).await, LostReason::ConnectionLost);
    }
    // The same backend works on the restarted server.
    let lease = locker.try_acquire("restart/a", TTL).await.unwrap();
    locker.release(lease).await.unwrap();
    drop(server);
}
