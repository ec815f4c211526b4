//! Semaphores on PostgreSQL, where a permit is a slot row locked in an open
//! transaction: what the shared conformance cases cannot see. Against the
//! shared server of `scripts/servers.sh`; these tests end only sessions
//! they opened.

use std::time::Duration;

use conformance_tests::server_url;
use lock_core::{Error, GuardOptions, Locker, LostReason, Mode, Wait};
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lock_postgres::{PostgresBackend, PostgresOptions};
use tokio::time::timeout;

/// Generous: a slow machine must not fail these tests.
const LIMIT: Duration = Duration::from_secs(20);

/// Longer than any test: a permit that comes back came back for another reason.
const HOUR: Duration = Duration::from_secs(3600);

fn key(name: &str) -> String {
    format!("pgsem-{:016x}/{name}", getrandom::u64().expect("random"))
}

async fn locker(params: &str) -> Option<(String, Locker)> {
    let url = server_url("LOCKKIT_POSTGRES_URL")?;
    let sep = if url.contains('?') { '&' } else { '?' };
    let with = format!("{url}{sep}{params}");
    let backend = PostgresBackend::connect(&with).await.expect("connect");
    Some((url, Locker::new(backend)))
}

/// The server process of the session holding a permit of `key` (default names).
async fn permit_holder_pid(conn: &mut PgConnection, key: &str) -> i32 {
    sqlx::query_scalar(
        "SELECT l.pid FROM lockkit.locks_permits p JOIN pg_locks l ON l.locktype = 'transactionid' \
         AND l.transactionid = p.xmax AND l.mode = 'ExclusiveLock' AND l.granted \
         WHERE p.name = $1 AND p.slot >= 0",
    )
    .bind(key)
    .fetch_one(conn)
    .await
    .expect("a permit holder")
}

/// The server ends a permit holder's session: its transaction rolls back,
/// the slot is free at once (not after the hour-long TTL), and the
/// holder's guard reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holders_session_ended_frees_the_permit_and_fires_lost() {
    let Some((url, holder)) = locker("").await else {
        return;
    };
    let (_, other) = locker("").await.expect("a second client");
    let key = key("terminated");
    let permit = holder
        .semaphore(&key, 1, GuardOptions::new(HOUR))
        .expect("semaphore")
        .guard()
        .await
        .expect("a permit");
    let lost = permit.lost();
    let url = url.split('?').next().unwrap_or(&url).to_owned();
    let mut admin = PgConnection::connect(&url).await.expect("admin connection");
    let pid = permit_holder_pid(&mut admin, &key).await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(ended);
    let reason = timeout(LIMIT, lost).await.expect("lost() did not fire");
    assert_eq!(reason, LostReason::ConnectionLost);
    let next = other
        .acquire_in(&key, Mode::semaphore(1), HOUR, Wait::at_most(LIMIT))
        .await
        .expect("the ended holder's permit");
    assert!(next.fencing_token() > permit.fencing_token());
    other.release(next).await.expect("release");
}

/// A permit's lease dropped without release closes its connection, and
/// the server gives the permit back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_lease_closes_its_connection_and_frees_the_permit() {
    let Some((_, holder)) = locker("").await else {
        return;
    };
    let (_, other) = locker("").await.expect("a second client");
    let key = key("dropped");
    let mode = Mode::semaphore(1);
    let lease = holder
        .acquire_in(&key, mode, HOUR, Wait::NONE)
        .await
        .expect("a permit");
    assert!(
        other
            .acquire_in(&key, mode, HOUR, Wait::NONE)
            .await
            .unwrap_err()
            .is_contended()
    );
    drop(lease);
    let next = other
        .acquire_in(&key, mode, HOUR, Wait::at_most(LIMIT))
        .await
        .expect("the dropped lease's permit");
    other.release(next).await.expect("release");
}

/// Failed attempts of every kind on a fresh key (the holder inserted its
/// rows just now) are refused, never blocked behind the holder (a long
/// response timeout would show a block as a timeout, not a refusal), and
/// leave the holder's permit and its number of permits alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_leave_the_holders_permit_alone() {
    let Some((_, holder)) = locker("response_timeout_ms=60000").await else {
        return;
    };
    let (_, other) = locker("response_timeout_ms=60000")
        .await
        .expect("a second client");
    let key = key("held");
    let ttl = Duration::from_secs(30);
    let mut lease = holder
        .acquire_in(&key, Mode::semaphore(1), ttl, Wait::NONE)
        .await
        .expect("a permit");
    let full = other
        .acquire_in(&key, Mode::semaphore(1), ttl, Wait::NONE)
        .await;
    assert!(matches!(full, Err(Error::Contended { .. })), "{full:?}");
    let two = other
        .acquire_in(&key, Mode::semaphore(2), ttl, Wait::NONE)
        .await;
    assert!(
        matches!(
            two,
            Err(Error::ModeConflict {
                held: Some(Mode::Semaphore { permits: 1 }),
                asked: Mode::Semaphore { permits: 2 },
                ..
            })
        ),
        "{two:?}"
    );
    let exclusive = other.try_acquire(&key, ttl).await;
    assert!(
        matches!(
            exclusive,
            Err(Error::ModeConflict {
                held: Some(Mode::Semaphore { permits: 1 }),
                ..
            })
        ),
        "{exclusive:?}"
    );
    // An exclusive waiter queues in the server behind the permit's shared
    // row lock; when its wait ends, it learns why.
    let waited = other
        .acquire(&key, ttl, Wait::at_most(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(waited, Err(Error::ModeConflict { .. })),
        "{waited:?}"
    );
    holder.extend(&mut lease, ttl).await.expect("still held");
    let listed = holder.inspect(&key).await.expect("inspect");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].mode, Mode::semaphore(1));
    let still_full = other
        .acquire_in(&key, Mode::semaphore(1), ttl, Wait::NONE)
        .await;
    assert!(
        matches!(still_full, Err(Error::Contended { .. })),
        "the refused 2 did not change the number: {still_full:?}"
    );
    holder.release(lease).await.expect("release");
    // Free now, the key takes another number.
    let two = other
        .acquire_in(&key, Mode::semaphore(2), ttl, Wait::NONE)
        .await
        .expect("a free key takes 2 permits");
    let listed = other.inspect(&key).await.expect("inspect");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].mode, Mode::semaphore(2));
    other.release(two).await.expect("release");
}

/// Slot rows go in with a key's first permit and again only for a larger
/// number: a key that was a semaphore of 1, once free, takes 3 and admits
/// 3 holders at once (its slots 1 and 2 go in when first needed), then 2,
/// which admits 2 holders and not a third (slot 2 exists, but only slots
/// below the key's number are permits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_number_gets_its_slots_and_a_smaller_one_keeps_to_its_own() {
    let Some((_, locker)) = locker("").await else {
        return;
    };
    let key = key("renumbered");
    let ttl = Duration::from_secs(30);
    let one = locker
        .acquire_in(&key, Mode::semaphore(1), ttl, Wait::NONE)
        .await
        .expect("a permit of 1");
    locker.release(one).await.expect("release");
    for permits in [3, 2] {
        let mode = Mode::semaphore(permits);
        let mut held = Vec::new();
        for i in 0..permits {
            let lease = locker
                .acquire_in(&key, mode, ttl, Wait::NONE)
                .await
                .unwrap_or_else(|e| panic!("permit {} of {permits}: {e}", i + 1));
            held.push(lease);
        }
        let listed = locker.inspect(&key).await.expect("inspect");
        assert_eq!(listed.len(), permits as usize, "{listed:?}");
        let full = locker.acquire_in(&key, mode, ttl, Wait::NONE).await;
        assert!(
            matches!(full, Err(Error::Contended { .. })),
            "{permits} held of {permits}: {full:?}"
        );
        for lease in held {
            locker.release(lease).await.expect("release");
        }
    }
}

/// A schema made before semaphores lacks the permits table: with
/// `create_schema=false`, connect refuses naming it, and the schema SQL,
/// run again, adds it, after which permits work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_gains_the_permits_table_from_the_schema_sql() {
    let Some(url) = server_url("LOCKKIT_POSTGRES_URL") else {
        return;
    };
    let base = url.split('?').next().unwrap_or(&url).to_owned();
    let schema = format!("pgsem_{:016x}", getrandom::u64().expect("random"));
    let own = format!("{base}?schema={schema}");
    let mut admin = PgConnection::connect(&base)
        .await
        .expect("admin connection");
    PostgresBackend::connect(&own)
        .await
        .expect("creates the schema");
    let older = format!("DROP TABLE \"{schema}\".\"locks_permits\"");
    sqlx::raw_sql(&older)
        .execute(&mut admin)
        .await
        .expect("drop");
    let manual = PostgresOptions::from_url(&own)
        .expect("options")
        .create_schema(false);
    let refused = PostgresBackend::connect_with(manual.clone())
        .await
        .map(drop);
    let schema_sql = manual.schema_sql().expect("schema SQL");
    sqlx::raw_sql(&schema_sql)
        .execute(&mut admin)
        .await
        .expect("schema SQL");
    let locker = Locker::new(
        PostgresBackend::connect_with(manual)
            .await
            .expect("the schema is complete"),
    );
    let permit = locker
        .acquire_in(&key("migrated"), Mode::semaphore(2), HOUR, Wait::NONE)
        .await
        .expect("a permit after the migration");
    locker.release(permit).await.expect("release");
    drop(locker);
    let drop_schema = format!("DROP SCHEMA \"{schema}\" CASCADE");
    sqlx::raw_sql(&drop_schema)
        .execute(&mut admin)
        .await
        .expect("drop schema");
    let err = refused.expect_err("connected without the permits table");
    assert!(
        err.to_string()
            .contains(&format!("\"{schema}\".\"locks_permits\""))
            && err.to_string().contains("schema_sql"),
        "{err}"
    );
}
