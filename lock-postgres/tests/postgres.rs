//! PostgreSQL-specific behaviour against the shared server of
//! `scripts/servers.sh`. These tests end only sessions they opened.

use lock_core::Wait;
use std::time::Duration;

use conformance_tests::server_url;
use lock_core::{Error, FencingToken, GuardOptions, LockBackend, Locker, LostReason};
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lock_postgres::{FenceTable, PostgresBackend};
use tokio::time::{Instant, timeout};

/// Generous: a slow machine must not fail these tests.
const LIMIT: Duration = Duration::from_secs(20);

fn prefix() -> String {
    format!("pgtest-{:016x}/", getrandom::u64().expect("random"))
}

async fn setup(params: &str) -> Option<(String, PostgresBackend)> {
    let url = server_url("LOCKKIT_POSTGRES_URL")?;
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = if params.is_empty() {
        url
    } else {
        format!("{url}{sep}{params}")
    };
    let backend = PostgresBackend::connect(&url).await.expect("connect");
    Some((url, backend))
}

async fn plain(url: &str) -> PgConnection {
    let url = url.split('?').next().unwrap_or(url);
    PgConnection::connect(url).await.expect("plain connection")
}

async fn terminate(conn: &mut PgConnection, pid: i32) {
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(conn)
        .await
        .unwrap();
    assert!(ended, "pg_terminate_backend({pid}) did not end the session");
}

/// A setting as the holder's own statements see it, in the lock's transaction.
async fn shown(backend: &PostgresBackend, lease: &lock_core::Lease, setting: &str) -> String {
    sqlx::query_scalar(&format!("SHOW {setting}"))
        .fetch_one(&mut backend.transaction(lease).await.unwrap())
        .await
        .unwrap()
}

/// A table of the test's own for its writes: `(id int PRIMARY KEY)`.
async fn scratch_table(check: &mut PgConnection) -> String {
    let table = format!("lockkit_test_{:016x}", getrandom::u64().unwrap());
    sqlx::raw_sql(&format!("CREATE TABLE {table} (id int PRIMARY KEY)"))
        .execute(check)
        .await
        .unwrap();
    table
}

/// The ids written to the scratch `table`, in order; drops the table.
async fn ids_then_drop(check: &mut PgConnection, table: &str) -> Vec<i32> {
    let ids = sqlx::query_scalar(&format!("SELECT id FROM {table} ORDER BY id"))
        .fetch_all(&mut *check)
        .await
        .unwrap();
    sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(check)
        .await
        .unwrap();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_the_holder_fires_lost_and_lets_the_next_in() {
    let Some((url, backend)) = setup("").await else {
        return;
    };
    let key = format!("{}terminated", prefix());
    let locker = Locker::new(backend.clone());
    let guard = locker
        .guard(&key, GuardOptions::new(Duration::from_secs(3)))
        .await
        .unwrap();
    let lost = guard.lost();
    let contender = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            locker
                .acquire(&key, Duration::from_secs(30), Wait::at_most(LIMIT))
                .await
        }
    });
    // The contender is queued in the server behind the holder.
    let pid = backend.holder_pid(&key).await.unwrap().expect("a holder");
    terminate(&mut plain(&url).await, pid).await;
    let reason = timeout(LIMIT, lost).await.expect("lost() did not fire");
    assert_eq!(reason, LostReason::ConnectionLost);
    let next = timeout(LIMIT, contender)
        .await
        .expect("contender still waiting")
        .unwrap()
        .expect("contender");
    assert!(next.fencing_token() > guard.fencing_token());
    assert_ne!(backend.holder_pid(&key).await.unwrap(), Some(pid));
    locker.release(next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stops_renewing_is_ended_by_the_idle_timeout() {
    // Until a grant is handed out its idle limit is the TTL plus twice the
    // response timeout (20 s here); the hand-out must set it to the TTL.
    let Some((_, backend)) = setup("response_timeout_ms=10000").await else {
        return;
    };
    let key = format!("{}stalled", prefix());
    let locker = Locker::new(backend.clone());
    let ttl = Duration::from_millis(300);
    let stalled = locker.try_acquire(&key, ttl).await.unwrap();
    let started = Instant::now();
    // Waits in the server; the row is freed when the idle timeout ends the holder's session.
    let next = locker
        .acquire(&key, Duration::from_secs(30), Wait::at_most(LIMIT))
        .await
        .expect("freed by the idle timeout");
    let waited = started.elapsed();
    assert!(
        waited >= ttl / 2,
        "granted after {waited:?}, before the TTL could end the holder"
    );
    assert!(
        waited < Duration::from_secs(10),
        "granted after {waited:?}: the holder kept the grant's longer idle limit"
    );
    // The stalled holder learns it lost the lock (the backend is asked directly:
    // the client-side deadline check would answer first otherwise).
    let err = backend.extend(&stalled, ttl).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LostReason::ConnectionLost,
                ..
            }
        ),
        "{err}"
    );
    assert!(backend.release(&stalled).await.unwrap_err().is_lost());
    locker.release(next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_the_lock_transaction_commit_only_while_held() {
    let Some((url, backend)) = setup("").await else {
        return;
    };
    let prefix = prefix();
    let locker = Locker::new(backend.clone());
    let mut check = plain(&url).await;
    let table = scratch_table(&mut check).await;
    let write = |id: i32| format!("INSERT INTO {table} VALUES ({id})");

    // Held all along: the write commits at release.
    let lease = locker
        .try_acquire(&format!("{prefix}kept"), Duration::from_secs(30))
        .await
        .unwrap();
    sqlx::query(&write(1))
        .execute(&mut backend.transaction(&lease).await.unwrap())
        .await
        .unwrap();
    locker.release(lease).await.unwrap();

    // Ended by the idle timeout after writing: release fails and the write is gone.
    let ttl = Duration::from_millis(200);
    let stalled = format!("{prefix}stalled");
    let lease = locker.try_acquire(&stalled, ttl).await.unwrap();
    sqlx::query(&write(2))
        .execute(&mut backend.transaction(&lease).await.unwrap())
        .await
        .unwrap();
    // The server ends the idle session; then nobody holds the row.
    tokio::time::timeout(Duration::from_secs(15), async {
        while backend.holder_pid(&stalled).await.unwrap().is_some() {
            tokio::time::sleep(ttl / 10).await;
        }
    })
    .await
    .expect("the idle timeout ends the holder's session");
    assert!(locker.release(lease).await.unwrap_err().is_lost());

    // Terminated before writing: the write itself fails.
    let key = format!("{prefix}terminated");
    let lease = locker
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap();
    terminate(
        &mut check,
        backend.holder_pid(&key).await.unwrap().expect("a holder"),
    )
    .await;
    let mut tx = backend.transaction(&lease).await.unwrap();
    assert!(
        sqlx::query(&write(3)).execute(&mut tx).await.is_err(),
        "a write after termination succeeded"
    );
    drop(tx);
    assert!(locker.release(lease).await.unwrap_err().is_lost());

    let ids = ids_then_drop(&mut check, &table).await;
    assert_eq!(
        ids,
        vec![1],
        "only the write of the holder that kept its lock may persist"
    );
}

/// A waiting acquire bounds its wait in the server with `lock_timeout` set
/// to the time left; once granted, the holder's own statements get the
/// response timeout back, not what was left of the wait, and a setting of
/// the holder's own outlives renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_statements_wait_for_row_locks_as_long_as_the_response_timeout() {
    let Some((_, backend)) = setup("response_timeout_ms=4000").await else {
        return;
    };
    let key = format!("{}lock-timeout", prefix());
    let locker = Locker::new(backend.clone());
    let mut lease = locker
        .acquire(
            &key,
            Duration::from_secs(30),
            Wait::at_most(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    let granted = shown(&backend, &lease, "lock_timeout").await;
    // The holder's own setting outlives a renewal.
    sqlx::raw_sql("SET LOCAL lock_timeout = '7s'")
        .execute(&mut backend.transaction(&lease).await.unwrap())
        .await
        .unwrap();
    locker
        .extend(&mut lease, Duration::from_secs(30))
        .await
        .unwrap();
    let renewed = shown(&backend, &lease, "lock_timeout").await;
    locker.release(lease).await.unwrap();
    assert_eq!(granted, "4s");
    assert_eq!(
        renewed, "7s",
        "a renewal undid the holder's own lock_timeout"
    );
}

/// A session's default `statement_timeout` (the server's, the role's, or as
/// here the connection's) bounds the holder's statements,
/// not the lock's own: an acquire waits its whole wait (here 4x the
/// statement timeout) and ends as timed out, not cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_cuts_neither_the_wait_nor_the_lock_but_binds_the_holder() {
    let Some((_, backend)) = setup("").await else {
        return;
    };
    // A session default, as a role's or the server's setting would be.
    let Some((_, short)) = setup("options[statement_timeout]=100").await else {
        return;
    };
    let key = format!("{}statement-timeout", prefix());
    let holder = Locker::new(backend);
    let waiter = Locker::new(short.clone());
    let held = holder
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap();
    let started = Instant::now();
    let waited = waiter
        .acquire(
            &key,
            Duration::from_secs(30),
            Wait::at_most(Duration::from_millis(400)),
        )
        .await
        .map(|_| ());
    let waited_for = started.elapsed();
    holder.release(held).await.unwrap();
    assert!(
        matches!(waited, Err(ref e) if e.is_timed_out()),
        "{waited:?} after {waited_for:?}"
    );
    // Well past the 100 ms statement timeout.
    assert!(waited_for >= Duration::from_millis(300), "{waited_for:?}");

    let lease = waiter
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap();
    let shown = shown(&short, &lease, "statement_timeout").await;
    waiter.release(lease).await.unwrap();
    assert_eq!(
        shown, "100ms",
        "the holder's statements lost the session's setting"
    );
}

/// The documented way to recover from a failed statement: a savepoint.
/// The holder keeps the lock and its writes before and after the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_recovers_from_a_failed_statement_and_keeps_the_lock() {
    let Some((url, backend)) = setup("").await else {
        return;
    };
    let key = format!("{}savepoint", prefix());
    let locker = Locker::new(backend.clone());
    let mut check = plain(&url).await;
    let table = scratch_table(&mut check).await;

    let lease = locker
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap();
    let mut tx = backend.transaction(&lease).await.unwrap();
    let mut run = async |sql: String| sqlx::raw_sql(&sql).execute(&mut tx).await.map(|_| ());
    run(format!("INSERT INTO {table} VALUES (1)"))
        .await
        .unwrap();
    run("SAVEPOINT s".into()).await.unwrap();
    let duplicate = run(format!("INSERT INTO {table} VALUES (1)")).await;
    run("ROLLBACK TO SAVEPOINT s".into()).await.unwrap();
    run(format!("INSERT INTO {table} VALUES (2)"))
        .await
        .unwrap();
    drop(tx);
    let still_held = locker.try_acquire(&key, Duration::from_secs(30)).await;
    let released = locker.release(lease).await;

    let ids = ids_then_drop(&mut check, &table).await;
    assert!(duplicate.is_err(), "the duplicate insert succeeded");
    assert!(
        still_held.as_ref().is_err_and(|e| e.is_contended()),
        "the lock was not held after the savepoint: {still_held:?}"
    );
    released.expect("release commits the writes");
    assert_eq!(ids, vec![1, 2]);
}

/// A try is refused at once when every connection of the budget is pinned;
/// an acquire queues for one, and times out if none comes within its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_refuses_a_try_at_once_times_out_a_wait_and_recovers_after_releases() {
    let Some((_, backend)) = setup("max_held_locks=2").await else {
        return;
    };
    let prefix = prefix();
    let locker = Locker::new(backend);
    let ttl = Duration::from_secs(30);
    let a = locker
        .try_acquire(&format!("{prefix}a"), ttl)
        .await
        .unwrap();
    let b = locker
        .try_acquire(&format!("{prefix}b"), ttl)
        .await
        .unwrap();
    let tried = timeout(LIMIT, locker.try_acquire(&format!("{prefix}c"), ttl)).await;
    let err = tried.expect("hung instead of refusing").unwrap_err();
    assert!(matches!(err, Error::LimitReached { limit: 2, .. }), "{err}");
    let waited = locker
        .acquire(
            &format!("{prefix}c"),
            ttl,
            Wait::at_most(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(waited, Err(Error::TimedOut { .. })),
        "a wait that ran out in the queue for a connection: {waited:?}"
    );
    locker.release(a).await.unwrap();
    let c = locker
        .try_acquire(&format!("{prefix}c"), ttl)
        .await
        .expect("a released connection is reused");
    // A lease dropped without release gives its connection back too, and frees its row.
    drop(b);
    let b2 = locker
        .acquire(&format!("{prefix}b"), ttl, Wait::at_most(LIMIT))
        .await
        .expect("dropped lease freed its budget and row");
    locker.release(b2).await.unwrap();
    locker.release(c).await.unwrap();
}

/// More waiters on one key than the budget has connections: those without
/// a connection queue for one, and every waiter gets the lock in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_waiters_than_connections_all_get_the_lock_in_turn() {
    let Some((_, backend)) = setup("max_held_locks=2").await else {
        return;
    };
    let key = format!("{}queued", prefix());
    let locker = Locker::new(backend);
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let (locker, key) = (locker.clone(), key.clone());
            tokio::spawn(async move {
                let lease = locker
                    .acquire(&key, Duration::from_secs(30), Wait::at_most(LIMIT))
                    .await?;
                let token = lease.fencing_token();
                locker.release(lease).await?;
                Ok::<_, Error>(token)
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for waiter in waiters {
        let outcome = timeout(LIMIT * 2, waiter).await.expect("a waiter hung");
        tokens.push(outcome.unwrap().expect("every waiter gets the lock"));
    }
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 8, "each grant has a token of its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_contender_is_refused_at_once_not_blocked() {
    // A long response timeout: a blocking INSERT or lock would show as a long wait, not an error.
    let Some((url, first)) = setup("response_timeout_ms=60000").await else {
        return;
    };
    let second = PostgresBackend::connect(&url).await.unwrap();
    let (first, second) = (Locker::new(first), Locker::new(second));
    // A fresh key: the holder inserted its row just now.
    let key = format!("{}fresh", prefix());
    let held = first
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let err = second
            .try_acquire(&key, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Contended {
                    remaining: None,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "contended only after {:?}",
            started.elapsed()
        );
    }
    first.release(held).await.unwrap();
    let lease = second
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .expect("free after release");
    second.release(lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_table_refuses_a_stale_holder() {
    let Some((url, backend)) = setup("").await else {
        return;
    };
    let key = format!("{}fenced", prefix());
    let locker = Locker::new(backend.clone());
    let mut conn = plain(&url).await;
    let table = format!("lockkit_fences_{:016x}", getrandom::u64().unwrap());
    let fences = FenceTable::new("public", &table).unwrap();
    sqlx::raw_sql(&fences.create_sql())
        .execute(&mut conn)
        .await
        .unwrap();

    let old = locker
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap();
    let old_token = old.fencing_token();
    fences
        .admit(&mut conn, "invoice/42", old_token)
        .await
        .unwrap()
        .expect("first writer");
    fences
        .admit(&mut conn, "invoice/42", old_token)
        .await
        .unwrap()
        .expect("same holder, next write");
    // The old holder is ended behind its back; a new holder writes.
    assert!(locker.force_release(&key).await.unwrap());
    let new = locker
        .acquire(&key, Duration::from_secs(30), Wait::at_most(LIMIT))
        .await
        .unwrap();
    assert!(new.fencing_token() > old_token);
    fences
        .admit(&mut conn, "invoice/42", new.fencing_token())
        .await
        .unwrap()
        .expect("new holder");
    // The old holder, unaware, tries again: refused, naming the newer token.
    let stale = fences
        .admit(&mut conn, "invoice/42", old_token)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (stale.offered, stale.highest),
        (old_token, new.fencing_token())
    );
    assert!(
        fences
            .admit(&mut conn, "invoice/43", FencingToken::new(1))
            .await
            .unwrap()
            .is_ok(),
        "resources are independent"
    );
    locker.release(new).await.unwrap();
    sqlx::raw_sql(&format!("DROP TABLE public.{table}"))
        .execute(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_locks_are_listed_and_the_url_password_never_shown() {
    let Some((_, backend)) = setup("").await else {
        return;
    };
    let prefix = prefix();
    let locker = Locker::new(backend);
    let a = locker
        .try_acquire(&format!("{prefix}a"), Duration::from_secs(30))
        .await
        .unwrap();
    let b = locker
        .try_acquire(&format!("{prefix}b"), Duration::from_secs(30))
        .await
        .unwrap();
    locker.release(b).await.unwrap();
    let held: Vec<String> = locker
        .inspect(&prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.key)
        .collect();
    assert_eq!(held, vec![format!("{prefix}a")]);
    locker.release(a).await.unwrap();

    let err =
        PostgresBackend::connect("postgres://u:hunter2@127.0.0.1:1/db?connect_timeout_ms=2000")
            .await
            .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(
        !err.to_string().contains("hunter2") && err.to_string().contains("127.0.0.1:1"),
        "{err}"
    );
}

/// A schema of this test's own, with its own table, sequence and reserved row.
fn own_schema() -> String {
    format!("pgtest_{:016x}", getrandom::u64().expect("random"))
}

async fn drop_schema(conn: &mut PgConnection, schema: &str) {
    sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(conn)
        .await
        .unwrap();
}

/// A schema of this test's own, created by a first connect: its URL, an
/// admin connection, the schema, and its token sequence's quoted name.
async fn own_schema_created(url: &str) -> (String, PgConnection, String, String) {
    let schema = own_schema();
    let own = format!("{url}?schema={schema}");
    let admin = plain(url).await;
    PostgresBackend::connect(&own)
        .await
        .expect("creates the schema");
    let sequence = format!("\"{schema}\".\"fencing_tokens\"");
    (own, admin, schema, sequence)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_with_a_session_cache_is_refused() {
    let Some((url, _)) = setup("").await else {
        return;
    };
    let (own, mut admin, schema, sequence) = own_schema_created(&url).await;
    sqlx::raw_sql(&format!("ALTER SEQUENCE {sequence} CACHE 20"))
        .execute(&mut admin)
        .await
        .unwrap();
    let refused = PostgresBackend::connect(&own).await.map(|_| ());
    sqlx::raw_sql(&format!("ALTER SEQUENCE {sequence} CACHE 1"))
        .execute(&mut admin)
        .await
        .unwrap();
    let accepted = PostgresBackend::connect(&own).await.map(|_| ());
    // Not a sequence at all: a table under the sequence's name.
    sqlx::raw_sql(&format!(
        "DROP SEQUENCE {sequence}; CREATE TABLE {sequence} (x int)"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    let not_a_sequence = PostgresBackend::connect(&own).await.map(|_| ());
    drop_schema(&mut admin, &schema).await;

    let err = refused.expect_err("a sequence with CACHE 20 was accepted");
    let message = err.to_string();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert!(
        message.contains(&sequence)
            && message.contains("CACHE 20")
            && message.contains(&format!("ALTER SEQUENCE {sequence} CACHE 1")),
        "{message}"
    );
    accepted.expect("CACHE 1 is accepted");
    let err = not_a_sequence.expect_err("a table was accepted as the sequence");
    assert!(err.to_string().contains("is not a sequence"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlogged_cycling_or_decreasing_sequence_is_refused() {
    let Some((url, _)) = setup("").await else {
        return;
    };
    let (own, mut admin, schema, sequence) = own_schema_created(&url).await;
    // (what breaks the sequence, what the refusal says, the fix it names)
    let mut cases = vec![
        ("CYCLE", "has CYCLE", "NO CYCLE"),
        ("INCREMENT BY -1", "has INCREMENT BY -1", "INCREMENT BY 1"),
    ];
    // Unlogged sequences exist from PostgreSQL 15 on.
    if admin.server_version_num().is_some_and(|v| v >= 150_000) {
        cases.push(("SET UNLOGGED", "is UNLOGGED", "SET LOGGED"));
    }
    let mut outcomes = Vec::new();
    for (breaks, why, fix) in cases {
        sqlx::raw_sql(&format!("ALTER SEQUENCE {sequence} {breaks}"))
            .execute(&mut admin)
            .await
            .unwrap();
        let refused = PostgresBackend::connect(&own).await.map(|_| ());
        sqlx::raw_sql(&format!("ALTER SEQUENCE {sequence} {fix}"))
            .execute(&mut admin)
            .await
            .unwrap();
        let accepted = PostgresBackend::connect(&own).await.map(|_| ());
        outcomes.push((breaks, why, fix, refused, accepted));
    }
    drop_schema(&mut admin, &schema).await;

    for (breaks, why, fix, refused, accepted) in outcomes {
        let Err(err) = refused else {
            panic!("a sequence with {breaks} was accepted");
        };
        let message = err.to_string();
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
        assert!(
            message.contains(&format!("sequence {sequence} {why}"))
                && message.contains(&format!("`ALTER SEQUENCE {sequence} {fix}`")),
            "{message}"
        );
        accepted.unwrap_or_else(|e| panic!("still refused after {fix}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_that_can_hand_out_values_below_1_is_refused() {
    let Some((url, _)) = setup("").await else {
        return;
    };
    let (_, mut admin, schema, _) = own_schema_created(&url).await;
    // (sequence, how it is created, values drawn before connecting, what the
    // refusal says, the fixes it names, the first token after them)
    let cases = [
        (
            "fresh",
            "MINVALUE -10 START -5",
            0,
            "has MINVALUE -10",
            vec!["MINVALUE 1 START WITH 1 RESTART"],
            1,
        ),
        (
            "still_below_1",
            "MINVALUE -10 START -5",
            3,
            "has MINVALUE -10",
            vec!["MINVALUE 1 START WITH 1 RESTART"],
            1,
        ),
        // Values 1 and 2 were handed out: the sequence must go on from there.
        (
            "past_0",
            "MINVALUE -10 START -2",
            5,
            "has MINVALUE -10",
            vec!["MINVALUE 1 START WITH 1"],
            3,
        ),
        (
            "from_0",
            "MINVALUE 0 MAXVALUE 1 START 0",
            0,
            "has MINVALUE 0",
            vec!["MINVALUE 1 NO MAXVALUE START WITH 1 RESTART"],
            1,
        ),
        // PostgreSQL's default descending sequence: MAXVALUE -1.
        (
            "descending",
            "INCREMENT -1",
            1,
            "has MINVALUE -9223372036854775808",
            vec![
                "INCREMENT BY 1",
                "MINVALUE 1 NO MAXVALUE START WITH 1 RESTART",
            ],
            1,
        ),
    ];
    let mut outcomes = Vec::new();
    for (name, create, drawn, why, fixes, first) in cases {
        let sequence = format!("\"{schema}\".\"{name}\"");
        let own = format!("{url}?schema={schema}&sequence={name}");
        sqlx::raw_sql(&format!(
            "CREATE SEQUENCE {sequence} AS bigint {create} CACHE 1 NO CYCLE; \
             SELECT nextval('{sequence}') FROM generate_series(1, {drawn})"
        ))
        .execute(&mut admin)
        .await
        .unwrap();
        let refused = PostgresBackend::connect(&own).await.map(|_| ());
        // Runs the fix exactly as the refusal words it.
        let named = refused.as_ref().err().and_then(|e| {
            let message = e.to_string();
            let (_, fix) = message.split_once("; run `")?;
            Some(fix.strip_suffix('`')?.to_owned())
        });
        let fixed = match &named {
            Some(fix) => sqlx::raw_sql(fix).execute(&mut admin).await.map(|_| ()),
            None => Ok(()),
        };
        let token = async {
            let backend = PostgresBackend::connect(&own).await?;
            let locker = Locker::new(backend);
            let lease = locker
                .try_acquire(&format!("{}{name}", prefix()), Duration::from_secs(30))
                .await?;
            let token = lease.fencing_token();
            locker.release(lease).await?;
            Ok::<_, Error>(token)
        }
        .await;
        let expected = fixes
            .iter()
            .map(|f| format!("ALTER SEQUENCE {sequence} {f}"))
            .collect::<Vec<_>>()
            .join("; ");
        outcomes.push((sequence, why, expected, first, refused, named, fixed, token));
    }
    drop_schema(&mut admin, &schema).await;

    for (sequence, why, expected, first, refused, named, fixed, token) in outcomes {
        let Err(err) = refused else {
            panic!("{sequence} was accepted");
        };
        let message = err.to_string();
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
        assert!(
            message.contains(&format!("sequence {sequence} "))
                && message.contains(&format!(" {why}, so it can hand out values below 1")),
            "{message}"
        );
        assert_eq!(named.as_deref(), Some(expected.as_str()), "{message}");
        fixed.unwrap_or_else(|e| panic!("`{expected}` failed: {e}"));
        let token = token.unwrap_or_else(|e| panic!("still refused after `{expected}`: {e}"));
        assert_eq!(token, FencingToken::new(first), "after `{expected}`");
    }
}

/// A backend on a schema of its own, with the given response timeout: the
/// server's URL, the schema, the backend and a locker over it.
async fn on_own_schema(
    response_timeout_ms: u64,
) -> Option<(String, String, PostgresBackend, Locker)> {
    let schema = own_schema();
    let params = format!("schema={schema}&response_timeout_ms={response_timeout_ms}");
    let (url, backend) = setup(&params).await?;
    let locker = Locker::new(backend.clone());
    Some((url, schema, backend, locker))
}

/// A session that locks the token flush's reserved row (name '') `FOR
/// UPDATE` in an open transaction: every flush on `schema` waits behind it
/// until it rolls back.
async fn flush_blocker(url: &str, schema: &str) -> PgConnection {
    let mut blocker = plain(url).await;
    sqlx::raw_sql(&format!(
        "INSERT INTO \"{schema}\".locks (name) VALUES ('') ON CONFLICT (name) DO NOTHING; \
         BEGIN; SELECT 1 FROM \"{schema}\".locks WHERE name = '' FOR UPDATE"
    ))
    .execute(&mut blocker)
    .await
    .unwrap();
    blocker
}

/// Moves `schema`'s sequence on, so that the next token is beyond every
/// value its last WAL record logged ahead: the next grant needs a flush.
async fn past_the_flushed_tokens(conn: &mut PgConnection, schema: &str) {
    let sequence = format!("\"{schema}\".fencing_tokens");
    sqlx::query("SELECT setval($1::regclass, nextval($1::regclass) + 100)")
        .bind(&sequence)
        .execute(conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_token_flush_frees_the_lock_and_hands_out_no_token() {
    let Some((url, schema, backend, locker)) = on_own_schema(500).await else {
        return;
    };
    let key = format!("{}flush", prefix());
    let lease = locker
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap();
    locker.release(lease).await.unwrap();

    let mut blocker = flush_blocker(&url, &schema).await;
    past_the_flushed_tokens(&mut blocker, &schema).await;
    let failed = timeout(LIMIT, locker.try_acquire(&key, Duration::from_secs(30)))
        .await
        .expect("the grant hung");
    let holder = backend.holder_pid(&key).await.unwrap();
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .unwrap();
    let next = locker
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .map(|lease| lease.fencing_token());
    drop_schema(&mut blocker, &schema).await;

    let err = failed.expect_err("a token was handed out without its flush");
    assert!(
        !matches!(err, Error::Contended { .. }) && err.to_string().contains("flush"),
        "{err}"
    );
    assert_eq!(holder, None, "the failed grant kept the row locked");
    next.expect("granted once the flush could run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_flush_slower_than_the_ttl_still_grants_a_live_lease() {
    let Some((url, schema, backend, locker)) = on_own_schema(5000).await else {
        return;
    };
    let key = format!("{}slow-flush", prefix());
    // Long enough that the checks after the grant run well within it.
    let ttl = Duration::from_secs(1);

    // The next grant's flush waits in the server's lock queue until the
    // blocker lets go.
    let mut blocker = flush_blocker(&url, &schema).await;
    let grant = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move { locker.try_acquire(&key, ttl).await }
    });
    // Once the grant's flush is queued behind the blocker, the grant's own
    // transaction holds the row and sits idle; keep it so for two TTLs.
    // (Asked on a connection of its own: within the blocker's transaction
    // the server would answer from one snapshot of its statistics.)
    let mut watcher = plain(&url).await;
    let queued = timeout(LIMIT, async {
        loop {
            // This schema's flush, not another test's.
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE '%' || $1 || '%FOR KEY SHARE%'",
            )
            .bind(&schema)
            .fetch_one(&mut watcher)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let stalled_from = Instant::now();
    tokio::time::sleep(ttl * 2).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .unwrap();
    let granted = timeout(LIMIT, grant)
        .await
        .expect("the grant hung")
        .unwrap();
    let stalled = stalled_from.elapsed();
    // Extended, its row locked, then released: the lease works like any other.
    let used = match granted {
        Ok(mut lease) => {
            let extended = locker.extend(&mut lease, ttl).await;
            let holder = backend.holder_pid(&key).await;
            Ok((extended, holder, locker.release(lease).await))
        }
        Err(e) => Err(e),
    };
    drop_schema(&mut blocker, &schema).await;

    queued.expect("the grant's flush never queued behind the blocker");
    assert!(stalled > ttl * 2, "the flush was held for {stalled:?} only");
    let (extended, holder, released) = used.expect("a flush slower than the TTL failed the grant");
    extended.expect("the fresh lease could not be extended");
    assert!(
        holder.unwrap().is_some(),
        "the granted lease's row is not locked"
    );
    released.expect("the fresh lease could not be released");
}

/// An operator's cancel of a waiting acquire's statement (`pg_cancel_backend`)
/// is an error, seen at once: not a wait that ran out long before its end.
#[tokio::test]
async fn a_cancelled_wait_is_an_error_not_a_timeout() {
    let Some((url, backend)) = setup("").await else {
        return;
    };
    let locker = Locker::new(backend.clone());
    let key = format!("{}cancelled-wait", prefix());
    let held = locker.try_acquire(&key, LIMIT).await.expect("the holder");
    let holder = backend
        .holder_pid(&key)
        .await
        .expect("the holder's session")
        .expect("a holder");
    let waiter = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            let started = Instant::now();
            let got = locker.acquire(&key, LIMIT, Wait::at_most(LIMIT)).await;
            (got, started.elapsed())
        }
    });
    let mut admin = plain(&url).await;
    timeout(LIMIT, async {
        loop {
            // The session the holder blocks: the waiter's.
            let cancelled: Option<bool> = sqlx::query_scalar(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity \
                 WHERE $1 = ANY(pg_blocking_pids(pid)) LIMIT 1",
            )
            .bind(holder)
            .fetch_optional(&mut admin)
            .await
            .expect("the blocked sessions");
            if cancelled == Some(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the waiter waits in the server");
    let (got, waited) = timeout(LIMIT, waiter)
        .await
        .expect("the cancelled waiter returns")
        .expect("task");
    match got {
        Err(Error::TimedOut { .. }) => {
            panic!(
                "a cancelled wait was read as a wait that ran out, after {waited:?} of {LIMIT:?}"
            )
        }
        Ok(lease) => panic!("granted while held: {lease:?}"),
        Err(e) => assert!(waited < LIMIT / 2, "{e} after {waited:?}"),
    }
    locker.release(held).await.expect("release");
}
