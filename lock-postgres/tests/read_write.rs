//! Read-write locks on PostgreSQL: the waiting writer's mark, the key's
//! readers' gate (an advisory lock), which the shared conformance cases
//! cannot see. Against the shared server of `scripts/servers.sh`; these
//! tests end only sessions they opened.

use std::time::Duration;

use conformance_tests::server_url;
use lock_core::{Error, Locker, Mode, Wait};
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use tokio::time::{Instant, timeout};

/// Generous: a slow machine must not fail these tests.
const LIMIT: Duration = Duration::from_secs(20);

/// Longer than any test: a hold that ends ended for another reason.
const HOUR: Duration = Duration::from_secs(3600);

/// A writer's wait, longer than `LIMIT`: a mark that goes within `LIMIT`
/// went because its session went, not because the wait ran out.
const LONG_WAIT: Duration = Duration::from_secs(60);

fn key(name: &str) -> String {
    format!("pgrw-{:016x}/{name}", getrandom::u64().expect("random"))
}

async fn lockers() -> Option<(String, Locker, Locker)> {
    let url = server_url("LOCKKIT_POSTGRES_URL")?;
    let connect = || async { Locker::new(PostgresBackend::connect(&url).await.expect("connect")) };
    let (one, two) = (connect().await, connect().await);
    let admin = url.split('?').next().unwrap_or(&url).to_owned();
    Some((admin, one, two))
}

/// The writers' marks on `key`'s gate (default names): the server
/// processes holding or queued for it exclusively.
async fn writer_marks(admin: &mut PgConnection, key: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' \
         AND classid = hashtext('\"lockkit\".\"locks\"')::oid AND objid = hashtext($1)::oid \
         AND objsubid = 2 AND mode = 'ExclusiveLock'",
    )
    .bind(key)
    .fetch_all(admin)
    .await
    .expect("the gate's writers")
}

/// Waits until a new reader of `key` is refused: a writer's mark is up.
async fn until_readers_are_refused(locker: &Locker, key: &str) {
    timeout(LIMIT, async {
        loop {
            match locker.acquire_in(key, Mode::Shared, HOUR, Wait::NONE).await {
                Ok(read) => locker.release(read).await.expect("release"),
                Err(Error::Contended { .. }) => return,
                Err(e) => panic!("a reader: {e}"),
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the waiting writer never refused a reader");
}

/// A writer waits behind a reader, so new readers are refused; then its
/// session goes, one way or the other, and with it its mark: a new reader
/// gets in long before the writer's wait would have run out.
async fn the_mark_goes_with_the_writers_session(end: End) {
    let Some((admin, readers, writers)) = lockers().await else {
        return;
    };
    let key = key(end.name());
    let mut admin = PgConnection::connect(&admin)
        .await
        .expect("admin connection");
    let reading = readers
        .acquire_in(&key, Mode::Shared, HOUR, Wait::NONE)
        .await
        .expect("a reader");
    let writer = {
        let (writers, key) = (writers.clone(), key.clone());
        tokio::spawn(async move { writers.acquire(&key, HOUR, Wait::at_most(LONG_WAIT)).await })
    };
    until_readers_are_refused(&readers, &key).await;
    let marks = writer_marks(&mut admin, &key).await;
    assert_eq!(marks.len(), 1, "one writer waits: {marks:?}");
    let ended = Instant::now();
    match end {
        End::Terminated => {
            let pid = marks[0];
            let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
                .bind(pid)
                .fetch_one(&mut admin)
                .await
                .expect("terminate");
            assert!(done);
            // The mark went with the session (the call waits for its exit)...
            let marks = writer_marks(&mut admin, &key).await;
            assert!(!marks.contains(&pid), "{marks:?}");
            // ...but the writer's client, alive, would queue again on a new one.
            writer.abort();
        }
        // The acquire is dropped: its connection closes, the server notices.
        End::ClientGone => writer.abort(),
    }
    let next = readers
        .acquire_in(&key, Mode::Shared, HOUR, Wait::at_most(LIMIT))
        .await
        .expect("a reader once the writer's session is gone");
    let took = ended.elapsed();
    assert!(took < LIMIT, "{took:?}");
    assert_eq!(writer_marks(&mut admin, &key).await, Vec::<i32>::new());
    eprintln!("{}: a new reader got in {took:?} after", end.name());
    readers.release(next).await.expect("release");
    readers.release(reading).await.expect("release");
}

#[derive(Clone, Copy)]
enum End {
    /// The server ends the waiting writer's session.
    Terminated,
    /// The writer's client goes away (its acquire is dropped).
    ClientGone,
}

impl End {
    fn name(self) -> &'static str {
        match self {
            End::Terminated => "terminated",
            End::ClientGone => "client-gone",
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writers_mark_vanishes_when_the_server_ends_its_session() {
    the_mark_goes_with_the_writers_session(End::Terminated).await;
}

/// On PostgreSQL 14 and newer, a waiter's session checks its client every
/// second (`client_connection_check_interval`), so a dropped acquire's
/// mark goes within about a second, not at the end of its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writers_mark_vanishes_when_its_client_goes_away() {
    the_mark_goes_with_the_writers_session(End::ClientGone).await;
}

/// A writer that asks once (`Wait::NONE`) is refused while a reader holds,
/// or while another writer holds, and leaves no mark: the next reader gets
/// in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_does_not_wait_leaves_no_mark() {
    let Some((admin, readers, writers)) = lockers().await else {
        return;
    };
    let key = key("no-wait");
    let mut admin = PgConnection::connect(&admin)
        .await
        .expect("admin connection");
    let reading = readers
        .acquire_in(&key, Mode::Shared, HOUR, Wait::NONE)
        .await
        .expect("a reader");
    for _ in 0..3 {
        let refused = writers.acquire(&key, HOUR, Wait::NONE).await;
        assert!(
            matches!(refused, Err(Error::Contended { .. })),
            "{refused:?}"
        );
        let refused = writers.try_acquire(&key, HOUR).await;
        assert!(
            matches!(refused, Err(Error::Contended { .. })),
            "{refused:?}"
        );
    }
    assert_eq!(writer_marks(&mut admin, &key).await, Vec::<i32>::new());
    let next = readers
        .acquire_in(&key, Mode::Shared, HOUR, Wait::NONE)
        .await
        .expect("a reader beside the first, at once");
    readers.release(next).await.expect("release");
    readers.release(reading).await.expect("release");

    let writing = readers.try_acquire(&key, HOUR).await.expect("a writer");
    for _ in 0..3 {
        let refused = writers.acquire(&key, HOUR, Wait::NONE).await;
        assert!(
            matches!(refused, Err(Error::Contended { .. })),
            "{refused:?}"
        );
    }
    readers.release(writing).await.expect("release");
    assert_eq!(writer_marks(&mut admin, &key).await, Vec::<i32>::new());
    let next = readers
        .acquire_in(&key, Mode::Shared, HOUR, Wait::NONE)
        .await
        .expect("a reader once the writer left, at once");
    readers.release(next).await.expect("release");
}

/// A writer that waits twice, for the readers' gate and then for the row
/// (held by a writer that did not wait, so never through the gate), gives
/// up when its one wait is over, not a wait later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_waiting_twice_gives_up_within_its_one_wait() {
    let Some((admin, one, two)) = lockers().await else {
        return;
    };
    let key = key("twice");
    let wait = Duration::from_secs(4);
    let holder = one.try_acquire(&key, HOUR).await.expect("the row's holder");
    // A reader's share of the gate, held by hand.
    let mut reader = PgConnection::connect(&admin).await.expect("a connection");
    sqlx::raw_sql("BEGIN")
        .execute(&mut reader)
        .await
        .expect("begin");
    sqlx::query(
        "SELECT pg_advisory_xact_lock_shared(hashtext('\"lockkit\".\"locks\"'), hashtext($1))",
    )
    .bind(&key)
    .execute(&mut reader)
    .await
    .expect("the gate, shared");
    let started = Instant::now();
    let waiting = {
        let (two, key) = (two.clone(), key.clone());
        tokio::spawn(async move { two.acquire(&key, HOUR, Wait::at_most(wait)).await })
    };
    let mut watch = PgConnection::connect(&admin).await.expect("a connection");
    timeout(LIMIT, async {
        while writer_marks(&mut watch, &key).await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the writer queues for the gate");
    // Half the wait in the gate's queue; then the row, whose holder stays.
    tokio::time::sleep_until(started + wait / 2).await;
    sqlx::raw_sql("COMMIT")
        .execute(&mut reader)
        .await
        .expect("the gate opens");
    let outcome = timeout(LIMIT, waiting)
        .await
        .expect("the writer returns")
        .expect("task");
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(Error::TimedOut { .. })),
        "{outcome:?}"
    );
    // Its row wait alone would have lasted a whole wait (to 1.5 waits).
    assert!(took < wait + wait / 4, "gave up after {took:?}");
    one.release(holder).await.expect("release");
}

/// Two callers that ask for one mode at once, on a key last held in
/// another, are never answered a mode conflict: the one that finds the
/// key's mode row changed by the other under its feet looks again, rather
/// than report the key held in a mode it is not held in. (It may be
/// refused as contended while the other's change runs: the key is taken
/// for that moment.) Readers after a semaphore, then permits after
/// readers; many rounds, since it is a race.
#[tokio::test]
async fn callers_of_one_mode_at_once_are_not_refused_as_a_conflict() {
    let Some((_, one, two)) = lockers().await else {
        return;
    };
    for round in 0..40 {
        let key = key(&format!("mode-race-{round}"));
        let permit = one
            .acquire_in(&key, Mode::semaphore(2), HOUR, Wait::NONE)
            .await
            .expect("a permit");
        one.release(permit).await.expect("release");
        for mode in [Mode::Shared, Mode::semaphore(3)] {
            let (a, b) = tokio::join!(
                one.acquire_in(&key, mode, HOUR, Wait::NONE),
                two.acquire_in(&key, mode, HOUR, Wait::NONE),
            );
            for (who, got) in [("one", a), ("two", b)] {
                match got {
                    Ok(lease) => {
                        let locker = if who == "one" { &one } else { &two };
                        locker.release(lease).await.expect("release");
                    }
                    Err(Error::Contended { .. }) => {}
                    Err(e) => panic!("round {round}, {mode:?}, caller {who}: {e}"),
                }
            }
        }
    }
}
