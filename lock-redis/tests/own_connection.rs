//! The connection a single server's batcher opens for itself (plain TCP):
//! it logs in as the URL says, loads a script the server has lost, and
//! opens itself again when the server closes it, and refuses new calls
//! while the server leaves one unanswered. Each test has a private Redis.

use std::time::Duration;

use lock_core::{Error, Locker};
use lock_redis::RedisBackend;
use lock_redis_wire::socket::CONNECTION_NAME;
use lock_testkit::RedisServer;
use tokio::time::{Instant, timeout};

const TTL: Duration = Duration::from_secs(30);

/// The `CLIENT LIST` lines of the batcher's connections.
fn batcher_connections(server: &RedisServer) -> Vec<String> {
    let name = format!("name={CONNECTION_NAME} ");
    server
        .cli(&["CLIENT", "LIST"])
        .unwrap()
        .lines()
        .filter(|l| l.contains(&name))
        .map(str::to_owned)
        .collect()
}

/// The value of `field` (`id`, `user`, `db`) in a `CLIENT LIST` line.
fn field<'a>(line: &'a str, field: &str) -> &'a str {
    line.split(' ')
        .find_map(|pair| pair.strip_prefix(field)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {field} in {line}"))
}

#[tokio::test]
async fn the_batchers_connection_logs_in_as_the_urls_user_into_its_database() {
    let server = RedisServer::start().expect("start redis");
    server
        .cli(&[
            "ACL", "SETUSER", "locker", "on", ">pw-4c1d", "~*", "&*", "+@all",
        ])
        .unwrap();
    let url = format!("redis://locker:pw-4c1d@{}/3", server.host_port());
    let locker = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let lease = locker.try_acquire("acl", TTL).await.unwrap();

    let connections = batcher_connections(&server);
    assert_eq!(connections.len(), 1, "{connections:?}");
    assert_eq!(field(&connections[0], "user"), "locker");
    assert_eq!(field(&connections[0], "db"), "3");
    assert_ne!(server.cli(&["-n", "3", "DBSIZE"]).unwrap(), "0");
    assert_eq!(
        server.cli(&["DBSIZE"]).unwrap(),
        "0",
        "a grant in database 0"
    );
    locker.release(lease).await.unwrap();
}

#[tokio::test]
async fn a_user_not_allowed_to_name_its_connection_still_locks() {
    let server = RedisServer::start().expect("start redis");
    server
        .cli(&[
            "ACL",
            "SETUSER",
            "plain",
            "on",
            ">pw-77aa",
            "~*",
            "&*",
            "+@all",
            "-client|setname",
        ])
        .unwrap();
    let url = format!("redis://plain:pw-77aa@{}", server.host_port());
    let locker = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let lease = locker.try_acquire("unnamed", TTL).await.unwrap();
    locker.release(lease).await.unwrap();
    assert!(batcher_connections(&server).is_empty(), "named after all");
}

#[tokio::test]
async fn a_flushed_script_cache_is_loaded_again_by_the_next_call() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let lease = locker.try_acquire("flushed", TTL).await.unwrap();
    locker.release(lease).await.unwrap();

    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let sent_with_text = server.command_calls("eval").unwrap();
    let lease = locker.try_acquire("flushed", TTL).await.unwrap();
    locker.release(lease).await.unwrap();
    assert_eq!(
        server.command_calls("eval").unwrap(),
        sent_with_text + 1,
        "the call answered NOSCRIPT is sent once more, with the script's text"
    );
}

#[tokio::test]
async fn a_connection_the_server_closes_while_idle_is_opened_again_before_the_next_call() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let lease = locker.try_acquire("idle", TTL).await.unwrap();
    locker.release(lease).await.unwrap();

    let connections = batcher_connections(&server);
    assert_eq!(connections.len(), 1, "{connections:?}");
    let first = field(&connections[0], "id").to_owned();
    server.cli(&["CLIENT", "KILL", "ID", &first]).unwrap();
    timeout(Duration::from_secs(10), async {
        loop {
            let connections = batcher_connections(&server);
            if connections.iter().any(|c| field(c, "id") != first) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the batcher opens its connection again");

    // Not an error from writing to the closed connection: the first call
    // after the close is granted.
    let lease = locker.try_acquire("idle", TTL).await.unwrap();
    locker.release(lease).await.unwrap();
}

/// Resumes a paused server even when an assertion fails, so that dropping
/// it can reap it.
struct Paused<'a>(&'a RedisServer);

impl<'a> Paused<'a> {
    fn pause(server: &'a RedisServer) -> Self {
        server.pause().expect("SIGSTOP");
        Paused(server)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        let _ = self.0.resume();
    }
}

/// A server that leaves a call unanswered for the response timeout (here,
/// paused) stalls the connection: a new call fails at once, unsent, rather
/// than queue behind it, while the give-back of the stuck acquire waits
/// for it, and runs after it once the server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_refuses_new_calls_at_once_and_gives_the_stuck_one_back_after_it() {
    const RESPONSE_TIMEOUT: Duration = Duration::from_millis(300);
    let server = RedisServer::start().expect("start redis");
    let url = format!("{}?response_timeout_ms=300", server.url());
    let locker = Locker::new(RedisBackend::connect(&url).await.unwrap());
    // Loads the script, so that the calls counted below are ours.
    let lease = locker.try_acquire("warm-up", TTL).await.unwrap();
    locker.release(lease).await.unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();

    let paused = Paused::pause(&server);
    match locker.try_acquire("stuck", TTL).await {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("a paused server: expected unavailable, got {other:?}"),
    }
    // The connection stalls once its oldest call is a response timeout old
    // by the batcher's clock, which the call just failed may reach a hair
    // before; a call written in that gap waits its whole timeout, once.
    let mut refused_after = None;
    for _ in 0..3 {
        let asked = Instant::now();
        match locker.try_acquire("other", TTL).await {
            Err(e @ Error::Unavailable { .. }) if e.to_string().contains("not sent") => {
                refused_after = Some(asked.elapsed());
                break;
            }
            Err(Error::Unavailable { .. }) => {}
            other => panic!("a paused server: expected unavailable, got {other:?}"),
        }
    }
    let refused_after = refused_after.expect("a stalled connection refuses new calls");
    assert!(
        refused_after < RESPONSE_TIMEOUT / 2,
        "refused only after {refused_after:?}"
    );

    drop(paused);
    // The stuck acquire runs, then its give-back (a call of its own, as it
    // waited for the acquire's answer); in the other order, the grant would
    // stay for its whole TTL.
    timeout(Duration::from_secs(10), async {
        while server.command_calls("evalsha").unwrap() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the resumed server runs the stuck acquire and its give-back");
    let lease = locker
        .try_acquire("stuck", TTL)
        .await
        .expect("the stuck acquire was given back after it ran");
    locker.release(lease).await.unwrap();
}

/// With nothing of the stuck call's waiting behind it (a release times
/// out: no give-back follows, so no blocked request holds the queue), new
/// calls on a stalled connection are still refused unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_sends_nothing_new_even_with_room_on_the_wire() {
    let server = RedisServer::start().expect("start redis");
    let url = format!("{}?response_timeout_ms=300", server.url());
    let locker = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let held = locker.try_acquire("held", TTL).await.unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();

    let paused = Paused::pause(&server);
    match locker.release(held).await {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("a paused server: expected unavailable, got {other:?}"),
    }
    let mut refused = 0;
    for i in 0..3 {
        match locker.try_acquire(&format!("other-{i}"), TTL).await {
            Err(e @ Error::Unavailable { .. }) if e.to_string().contains("not sent") => {
                refused += 1;
            }
            Err(Error::Unavailable { .. }) => {}
            other => panic!("a paused server: expected unavailable, got {other:?}"),
        }
    }
    // The first may be written in the gap before the batcher's clock says
    // stalled (see the test above); the others are not.
    assert!(refused >= 2, "only {refused} of 3 refused unsent");

    drop(paused);
    timeout(Duration::from_secs(10), async {
        while server.command_calls("evalsha").unwrap() < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the resumed server runs the stuck release");
    let lease = locker
        .try_acquire("held", TTL)
        .await
        .expect("released once the server ran the stuck call");
    locker.release(lease).await.unwrap();
}
