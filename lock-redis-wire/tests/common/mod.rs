//! What more than one test file of this crate sets up.

// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use lock_redis_wire::{KeyLayout, TokenRule};
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
