//! The connection a single server's batcher opens for itself (plain TCP):
//! it logs in as the URL says, loads a script the server has lost, and
//! opens itself again when the server closes it. Each test has a private
//! Redis.

use std::time::Duration;

use lock_core::Locker;
use lock_redis::RedisBackend;
use lock_redis_wire::socket::CONNECTION_NAME;
use lock_testkit::RedisServer;
use tokio::time::timeout;

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
