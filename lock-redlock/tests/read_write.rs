//! Read-write locks on Redlock, against a private node set whose nodes are
//! pre-loaded with another owner's grant: a read hold, like a write hold,
//! counts only on a majority, and a grant on a minority is given back.

use std::time::Duration;

use lock_core::{Locker, Mode, Wait};
use lock_redlock::{RedlockBackend, RedlockOptions};
use lock_testkit::RedisNodes;

const TTL: Duration = Duration::from_secs(10);
/// Larger than the default, so that a loaded test machine does not fail nodes.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);

async fn connect(nodes: &RedisNodes) -> (RedlockBackend, Locker) {
    let options = RedlockOptions::from_url(&nodes.url())
        .expect("options")
        .node_timeout(NODE_TIMEOUT);
    let backend = RedlockBackend::connect_with(options)
        .await
        .expect("connect");
    (backend.clone(), Locker::new(backend))
}

/// Another owner's exclusive grant of `lock` on nodes `which`, for a minute.
fn foreign_grant(nodes: &RedisNodes, lock: &str, which: &[usize]) {
    for &i in which {
        nodes
            .node(i)
            .cli(&["SET", lock, "someone-else", "PX", "60000"])
            .expect("SET");
    }
}

fn remove(nodes: &RedisNodes, lock: &str, which: &[usize]) {
    for &i in which {
        nodes.node(i).cli(&["DEL", lock]).expect("DEL");
    }
}

/// Whether node `i` has the key `name` (a grant, a readers' marker or set).
fn exists(nodes: &RedisNodes, i: usize, name: &str) -> bool {
    nodes.node(i).cli(&["EXISTS", name]).expect("redis-cli") == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_needs_a_majority_and_gives_a_minority_back() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    let lock = backend.redis_keys("doc").lock;
    let readers = format!("{lock}:readers");
    // A writer holds on three nodes: a reader can win two at most.
    foreign_grant(&nodes, &lock, &[0, 1, 2]);
    let refused = locker
        .acquire_in("doc", Mode::Shared, TTL, Wait::NONE)
        .await
        .unwrap_err();
    assert!(refused.is_contended(), "{refused}");
    for i in [3, 4] {
        assert!(
            !exists(&nodes, i, &lock) && !exists(&nodes, i, &readers),
            "node {i} kept the minority's read hold"
        );
    }
    // With the writer on two nodes, the other three are a majority.
    remove(&nodes, &lock, &[0]);
    let read = locker
        .acquire_in("doc", Mode::Shared, TTL, Wait::NONE)
        .await
        .expect("three of five is a majority");
    assert_eq!(read.mode(), Mode::Shared);
    locker.release(read).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_on_a_majority_refuse_a_writer_granted_on_the_minority() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    let lock = backend.redis_keys("ledger").lock;
    // The reader holds on nodes 0, 1 and 2 only: 3 and 4 were taken.
    foreign_grant(&nodes, &lock, &[3, 4]);
    let read = locker
        .acquire_in("ledger", Mode::Shared, TTL, Wait::NONE)
        .await
        .expect("a read hold on three of five");
    remove(&nodes, &lock, &[3, 4]);
    // The writer wins nodes 3 and 4, a minority: refused, and gives them back.
    let refused = locker.try_acquire("ledger", TTL).await.unwrap_err();
    assert!(refused.is_contended(), "{refused}");
    for i in [3, 4] {
        assert!(
            !exists(&nodes, i, &lock),
            "node {i} kept the minority's write hold"
        );
    }
    let read_token = read.fencing_token();
    locker.release(read).await.expect("release");
    let write = locker
        .try_acquire("ledger", TTL)
        .await
        .expect("the readers left");
    assert!(write.fencing_token() > read_token);
    locker.release(write).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_on_a_majority_refuses_a_reader_granted_on_the_minority() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    let lock = backend.redis_keys("report").lock;
    let readers = format!("{lock}:readers");
    foreign_grant(&nodes, &lock, &[3, 4]);
    let write = locker
        .try_acquire("report", TTL)
        .await
        .expect("a write hold on three of five");
    remove(&nodes, &lock, &[3, 4]);
    let refused = locker
        .acquire_in("report", Mode::Shared, TTL, Wait::NONE)
        .await
        .unwrap_err();
    assert!(refused.is_contended(), "{refused}");
    for i in [3, 4] {
        assert!(
            !exists(&nodes, i, &lock) && !exists(&nodes, i, &readers),
            "node {i} kept the minority's read hold"
        );
    }
    let write_token = write.fencing_token();
    locker.release(write).await.expect("release");
    let mut read = locker
        .acquire_in("report", Mode::Shared, TTL, Wait::NONE)
        .await
        .expect("the writer left");
    assert!(read.fencing_token() > write_token);
    // Extended and released on the majority that holds it.
    locker.extend(&mut read, TTL).await.expect("extend");
    locker.release(read).await.expect("release");
}
