//! What an uncontended lock costs the server: the statements a grant and a
//! release send, each one a round trip, and how often a grant waits for a
//! WAL flush (on a private server that logs every statement it is sent).

use std::time::Duration;

use lock_core::{Locker, Mode, Wait};
use lock_postgres::PostgresBackend;
use lock_testkit::Postgres;

const TTL: Duration = Duration::from_secs(30);
const PAIRS: usize = 64;
/// A semaphore's permit, as the lab measures it.
const PERMIT: Mode = Mode::Semaphore { permits: 4 };

/// The statements the server logged since byte `from` of its log that
/// concern the lock `key` or the token flush, as (statements sent for the
/// key's grants and releases, token flushes).
fn sent_since(server: &Postgres, from: usize, key: &str) -> (usize, usize) {
    let log = std::fs::read_to_string(server.log_path()).expect("read the server log");
    let mut lines = log[from..].lines().peekable();
    let (mut grants, mut flushes) = (0, 0);
    while let Some(line) = lines.next() {
        let Some(at) = line.find("LOG:  ").map(|at| at + 6) else {
            continue;
        };
        let logged = &line[at..];
        let statement = logged.starts_with("statement: ") || logged.starts_with("execute ");
        if !statement || logged.contains("pg_stat_activity") {
            continue;
        }
        if logged.contains("synchronous_commit") {
            flushes += 1;
            continue;
        }
        // A prepared statement's parameters follow on a DETAIL line.
        let detail = lines.peek().filter(|l| l.contains("DETAIL:  parameters:"));
        let about_key = logged.contains(key) || detail.is_some_and(|d| d.contains(key));
        let transaction = ["statement: BEGIN", "statement: ROLLBACK"]
            .iter()
            .any(|s| logged.starts_with(s));
        if about_key || transaction {
            grants += 1;
        }
    }
    (grants, flushes)
}

/// With its row in place, an uncontended try_acquire and release (or read
/// hold and release, or permit and release) are three round trips (BEGIN, the one statement that locks the row and draws the
/// token, ROLLBACK), and the tokens' WAL flush is needed only when the
/// sequence logs ahead again: about once in 32 grants, not once a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_is_three_round_trips_and_rarely_a_flush() {
    let server = tokio::task::spawn_blocking(Postgres::start)
        .await
        .expect("start task")
        .expect("start a private postgres");
    let locker = Locker::new(
        PostgresBackend::connect(&server.url())
            .await
            .expect("connect"),
    );
    let key = "round-trips/one";
    // The row goes in with the first grant.
    let first = locker.try_acquire(key, TTL).await.expect("acquire");
    locker.release(first).await.expect("release");
    let read_key = "round-trips/read";
    let first = locker
        .acquire_in(read_key, Mode::Shared, TTL, Wait::NONE)
        .await
        .expect("read");
    locker.release(first).await.expect("release");
    let permit_key = "round-trips/permit";
    let first = locker
        .acquire_in(permit_key, PERMIT, TTL, Wait::NONE)
        .await
        .expect("permit");
    locker.release(first).await.expect("release");
    server
        .psql("ALTER SYSTEM SET log_statement = 'all'")
        .expect("log statements");
    server.psql("SELECT pg_reload_conf()").expect("reload");
    // The postmaster reloads on its own time, and new sessions inherit
    // what it has read: no event tells when, so ask new sessions.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.psql("SHOW log_statement").expect("show") != "all" {
        assert!(std::time::Instant::now() < deadline, "not reloaded in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // An open session reloads only after its next command: the backend's
    // connections are new from here on, so every statement is logged.
    locker.backend().close_idle().await;
    let from = std::fs::metadata(server.log_path()).expect("log").len() as usize;

    for _ in 0..PAIRS {
        let lease = locker.try_acquire(key, TTL).await.expect("acquire");
        locker.release(lease).await.expect("release");
    }
    let (sent, flushes) = sent_since(&server, from, key);
    assert_eq!(sent, 3 * PAIRS, "three round trips a pair");
    assert!(
        flushes <= PAIRS / 16 + 1,
        "{flushes} token flushes for {PAIRS} grants"
    );

    // A read hold and its release cost what an exclusive pair does.
    let from = std::fs::metadata(server.log_path()).expect("log").len() as usize;
    for _ in 0..PAIRS {
        let lease = locker
            .acquire_in(read_key, Mode::Shared, TTL, Wait::NONE)
            .await
            .expect("read");
        locker.release(lease).await.expect("release");
    }
    let (sent, flushes) = sent_since(&server, from, read_key);
    assert_eq!(sent, 3 * PAIRS, "three round trips a read pair");
    assert!(
        flushes <= PAIRS / 16 + 1,
        "{flushes} token flushes for {PAIRS} read holds"
    );

    // So does a permit, once its key's rows are in place.
    let from = std::fs::metadata(server.log_path()).expect("log").len() as usize;
    for _ in 0..PAIRS {
        let lease = locker
            .acquire_in(permit_key, PERMIT, TTL, Wait::NONE)
            .await
            .expect("permit");
        locker.release(lease).await.expect("release");
    }
    let (sent, flushes) = sent_since(&server, from, permit_key);
    assert_eq!(sent, 3 * PAIRS, "three round trips a permit pair");
    assert!(
        flushes <= PAIRS / 16 + 1,
        "{flushes} token flushes for {PAIRS} permits"
    );
}
