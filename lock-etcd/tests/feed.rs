//! The waiters of one backend on one lock share one watch (the lock's feed)
//! and, knowing how many entries are ahead of them, read nothing when woken,
//! however long the queue; a feed
//! that breaks sends them back to watches of their own (on a private
//! one-member cluster, whose metrics count the requests).

mod common;

use std::time::Duration;

use common::on_private_cluster;
use lock_testkit::EtcdCluster;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
/// More than the 16 entries ahead an enqueue lists: the later waiters
/// count the deletions of entries ahead rather than follow a list of them.
const WAITERS: usize = 24;

/// How many watch streams the member has opened since it started.
fn watch_streams(cluster: &EtcdCluster) -> u64 {
    common::calls_started(cluster, "Watch")
}

/// Polls until `ready` holds (etcd has no event for a queue's length or a
/// member's counters); panics after 30 s, naming `what`.
async fn until<F: Future<Output = bool>>(what: &str, mut ready: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready().await {
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_waiters_on_a_lock_share_one_watch() {
    let (cluster, backend, locker) = on_private_cluster().await;
    let key = "shared-feed";
    let first = locker.try_acquire(key, TTL).await.expect("first holder");
    let before = watch_streams(&cluster);

    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let locker = locker.clone();
        waiters.push(tokio::spawn(async move {
            let lease = locker
                .acquire(key, TTL, Duration::from_secs(60))
                .await
                .expect("acquire");
            let token = lease.fencing_token();
            locker.release(lease).await.expect("release");
            token
        }));
        until(&format!("waiter {i} in the queue"), || async {
            backend.queue_len(key).await.expect("queue length") == i + 2
        })
        .await;
        if i == 0 {
            // The first waiter found no feed and set one up: the others
            // join it.
            until("the first waiter's feed", || async {
                watch_streams(&cluster) > before
            })
            .await;
        }
    }
    let reads_before = common::calls_started(&cluster, "Range");
    locker
        .release(first)
        .await
        .expect("release the first holder");
    let mut tokens = Vec::new();
    for w in waiters {
        let token = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("every waiter is granted")
            .expect("waiter panicked");
        tokens.push(token);
    }
    assert!(
        tokens.windows(2).all(|t| t[0] < t[1]),
        "granted in queue order: {tokens:?}"
    );
    let reads = common::calls_started(&cluster, "Range") - reads_before;
    assert_eq!(
        reads, 0,
        "the handoffs read the queue {reads} times: each waiter knew how many entries were ahead of it"
    );
    let opened = watch_streams(&cluster) - before;
    assert_eq!(
        opened, 1,
        "{WAITERS} waits and their handoffs opened {opened} watch streams, not one shared feed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_whose_feed_broke_is_still_woken_by_the_release() {
    let (cluster, backend, locker) = on_private_cluster().await;
    let key = "broken-feed";
    let holder = locker.try_acquire(key, TTL).await.expect("holder");
    let before = watch_streams(&cluster);
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .acquire(key, TTL, Duration::from_secs(60))
                .await
                .expect("acquire after the restart")
        })
    };
    until("the waiter's feed", || async {
        watch_streams(&cluster) > before
    })
    .await;

    // The restart ends every stream to the member, the feed's too; the
    // holder's lease and entry outlive it.
    let member = cluster.member(0);
    tokio::task::block_in_place(|| member.restart()).expect("restart the member");
    locker
        .release(holder)
        .await
        .expect("release after the restart");

    let granted = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter is granted once the holder released")
        .expect("waiter panicked");
    assert_eq!(
        backend
            .holder(key)
            .await
            .expect("holder")
            .map(|h| h.fencing_token),
        Some(granted.fencing_token())
    );
}
