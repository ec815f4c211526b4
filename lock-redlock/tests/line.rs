//! Redlock's waiting line with a node of five paused or down while waiters
//! queue, on private Redis nodes: the majority keeps the line going, in
//! order of arrival.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{Locker, Wait};
use lock_redlock::{RedlockBackend, RedlockOptions};
use lock_testkit::RedisNodes;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
/// Larger than the default so a loaded test machine does not fail the live
/// nodes; a paused node costs each attempt this long.
const NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// Far beyond what the test needs: a waiter that is never served fails it.
const PATIENCE: Duration = Duration::from_secs(30);

async fn connect(nodes: &RedisNodes) -> (RedlockBackend, Locker) {
    let options = RedlockOptions::from_url(&nodes.url())
        .expect("the node set's URL")
        .node_timeout(NODE_TIMEOUT);
    let backend = RedlockBackend::connect_with(options)
        .await
        .expect("connect");
    (backend.clone(), Locker::new(backend))
}

/// How many places the line of `key` holds on node `i`.
fn in_line(nodes: &RedisNodes, backend: &RedlockBackend, i: usize, key: &str) -> usize {
    let queue = format!("{}:queue", backend.redis_keys(key).lock);
    let len = nodes.node(i).cli(&["LLEN", &queue]).expect("redis-cli");
    len.trim().parse().expect("a length")
}

/// Waits until node `i`'s line of `key` holds `n` places.
async fn await_in_line(
    nodes: &RedisNodes,
    backend: &RedlockBackend,
    i: usize,
    key: &str,
    n: usize,
) {
    let give_up = Instant::now() + PATIENCE;
    while in_line(nodes, backend, i, key) < n {
        assert!(
            Instant::now() < give_up,
            "node {i}'s line of {key} never held {n} places"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A holder keeps `key`; four waiters on two clients join the line one
/// after another (each in line on node `watch` before the next starts),
/// then the holder lets go: they are granted in the order they came.
async fn waiters_are_served_in_order(
    nodes: &RedisNodes,
    clients: &[(RedlockBackend, Locker)],
    key: &str,
    watch: usize,
) {
    let (backend, holder_locker) = &clients[0];
    let holder = holder_locker
        .try_acquire(key, TTL)
        .await
        .expect("the holder's grant");
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for name in 0..4 {
        let locker = clients[name % clients.len()].1.clone();
        let (wanted, granted) = (key.to_owned(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let lease = locker
                .acquire(&wanted, TTL, Wait::at_most(PATIENCE))
                .await
                .expect("the waiter's grant");
            granted.lock().expect("the grant order").push(name);
            locker.release(lease).await.expect("the waiter's release");
        }));
        await_in_line(nodes, backend, watch, key, name + 1).await;
    }
    holder_locker
        .release(holder)
        .await
        .expect("the holder's release");
    for waiter in waiters {
        tokio::time::timeout(PATIENCE, waiter)
            .await
            .expect("a waiter was never served")
            .expect("waiter task");
    }
    assert_eq!(
        *granted.lock().unwrap(),
        [0, 1, 2, 3],
        "waiters were not granted in order of arrival"
    );
}

/// Resumes a paused node even when an assertion fails, so that dropping
/// the node set can reap it.
struct Paused<'a>(&'a RedisNodes, usize);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        let _ = self.0.node(self.1).resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_queue_and_are_served_in_order_while_one_node_of_five_is_paused() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let clients = [connect(&nodes).await, connect(&nodes).await];
    nodes.node(0).pause().expect("SIGSTOP");
    let _paused = Paused(&nodes, 0);
    waiters_are_served_in_order(&nodes, &clients, "paused-one", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_queue_and_are_served_in_order_while_one_node_of_five_is_down() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let clients = [connect(&nodes).await, connect(&nodes).await];
    nodes.node(4).kill().expect("SIGKILL");
    waiters_are_served_in_order(&nodes, &clients, "down-one", 0).await;
}
