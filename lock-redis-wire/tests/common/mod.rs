//! What more than one test file of this crate sets up.

// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use lock_redis_wire::scripts::{Operation, run_batch};
use lock_redis_wire::{KeyLayout, LockKeys, TokenRule};
use lock_testkit::RedisServer;
use redis::aio::MultiplexedConnection;

/// A multiplexed connection to `server`.
pub async fn connect(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// Every way of taking tokens, with `layout`'s shared counter.
pub fn every_rule(layout: &KeyLayout) -> [TokenRule; 3] {
    [
        TokenRule::SharedClockFloor {
            counter: layout.shared_counter().into(),
        },
        TokenRule::ClockFloor,
        TokenRule::CounterFirst,
    ]
}

/// The integer answers of one batch-script call of `operations`, which
/// must each succeed.
pub async fn answers(
    conn: &mut MultiplexedConnection,
    rule: &TokenRule,
    operations: &[(&LockKeys, &String, Operation)],
) -> Vec<i64> {
    let operations: Vec<_> = operations
        .iter()
        .map(|(keys, owner, op)| (*keys, owner.as_str(), *op))
        .collect();
    run_batch(conn, rule, &operations)
        .await
        .expect("the call")
        .into_iter()
        .map(|answer| answer.expect("an operation failed"))
        .collect()
}

/// The value of `layout`'s shared counter on `server`.
pub fn shared_counter(server: &RedisServer, layout: &KeyLayout) -> i64 {
    server
        .cli(&["GET", &layout.shared_counter()])
        .expect("GET")
        .trim()
        .parse()
        .expect("the shared counter holds a number")
}
