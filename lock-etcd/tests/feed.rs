//! The waiters of one backend on one lock share one watch (the lock's feed)
//! and, knowing how many entries are ahead of them, read nothing when woken,
//! however long the queue; a feed
//! that breaks sends them back to watches of their own (on a private
//! one-member cluster, whose metrics count the requests).

mod common;

use lock_core::Wait;
use std::time::Duration;

use common::on_private_cluster;
use lock_core::Lease;
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
                .acquire(key, TTL, Wait::at_most(Duration::from_secs(60)))
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

/// Both kinds of waiter on a feed that breaks fall back to watches of their
/// own: the first, which set the feed up after its entry and follows the
/// entry ahead, and the second, which joined it before its entry and handed
/// its count of the entries ahead to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_whose_feed_broke_are_still_woken_by_the_releases() {
    let (cluster, backend, locker) = on_private_cluster().await;
    let key = "broken-feed";
    let holder = locker.try_acquire(key, TTL).await.expect("holder");
    let waiter = || {
        let locker = locker.clone();
        tokio::spawn(async move {
            // A long TTL puts the waiters' first renewal (a third of it),
            // which re-checks the queue, well past the grants below.
            let lease = locker
                .acquire(
                    key,
                    Duration::from_secs(90),
                    Wait::at_most(Duration::from_secs(60)),
                )
                .await
                .expect("acquire after the restart");
            let granted = Instant::now();
            let token = lease.fencing_token();
            locker.release(lease).await.expect("release");
            (token, granted, Instant::now())
        })
    };
    let (first, second) = two_waiters(&cluster, &backend, key, waiter).await;

    // The restart ends every stream to the member, the feed's too; the
    // leases and entries outlive it.
    let member = cluster.member(0);
    tokio::task::block_in_place(|| member.restart()).expect("restart the member");
    let held = holder.fencing_token();
    locker
        .release(holder)
        .await
        .expect("release after the restart");
    let mut released = Instant::now();

    // Each grant follows the release ahead of it at once: their watches
    // wake the waiters, not their renewals.
    let mut tokens = vec![held];
    for (name, w) in [("first", first), ("second", second)] {
        let (token, granted, its_release) = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .unwrap_or_else(|_| panic!("the {name} waiter is granted once the one ahead released"))
            .expect("waiter panicked");
        let handoff = granted.saturating_duration_since(released);
        assert!(
            handoff < Duration::from_secs(5),
            "the {name} waiter was granted {handoff:?} after the release ahead of it"
        );
        tokens.push(token);
        released = its_release;
    }
    assert!(
        tokens.windows(2).all(|t| t[0] < t[1]),
        "granted in queue order: {tokens:?}"
    );
    assert_eq!(backend.queue_len(key).await.expect("queue length"), 0);
}

/// Starts two waiters (`waiter()` spawns one) behind the holder of `key`:
/// the first finds no feed and sets one up, then follows the entry ahead
/// of it; the second joins that feed before it enqueues, and the feed
/// counts the entries ahead for it. Returns once both are queued.
async fn two_waiters<T>(
    cluster: &EtcdCluster,
    backend: &lock_etcd::EtcdBackend,
    key: &str,
    waiter: impl Fn() -> tokio::task::JoinHandle<T>,
) -> (tokio::task::JoinHandle<T>, tokio::task::JoinHandle<T>) {
    let before = watch_streams(cluster);
    let first = waiter();
    until("the first waiter's feed", || async {
        watch_streams(cluster) > before
    })
    .await;
    let second = waiter();
    until("the second waiter in the queue", || async {
        backend.queue_len(key).await.expect("queue length") == 3
    })
    .await;
    (first, second)
}

/// The next lease a waiter was granted, within 30 s.
async fn next_grant(grants: &mut tokio::sync::mpsc::UnboundedReceiver<Lease>) -> Lease {
    tokio::time::timeout(Duration::from_secs(30), grants.recv())
        .await
        .expect("a waiter is granted")
        .expect("the waiters hold the sender")
}

/// An operator deletes a lock's whole queue in one transaction, the holder's
/// entry first: each waiter sees its own entry deleted along with the last
/// one ahead of it. Neither takes that for the lock passing to it (which
/// would grant both, on entries no longer there): each queues again, and
/// the two are granted one after the other, each on an entry the queue
/// holds. One waiter follows the entry ahead of it, the other had its
/// count of the entries ahead kept by the feed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_whose_entries_are_deleted_with_the_ones_ahead_queue_again() {
    let (cluster, backend, locker) = on_private_cluster().await;
    let key = "queue-deleted-at-once";
    let holder = locker.try_acquire(key, TTL).await.expect("holder");
    let (granted, mut grants) = tokio::sync::mpsc::unbounded_channel();
    let waiter = || {
        let (locker, granted) = (locker.clone(), granted.clone());
        tokio::spawn(async move {
            let lease = locker
                .acquire(key, TTL, Wait::at_most(Duration::from_secs(60)))
                .await
                .expect("acquire after the queue was deleted");
            granted.send(lease).expect("the test listens");
        })
    };
    let _waiters = two_waiters(&cluster, &backend, key, waiter).await;

    // The queue's entries, oldest (the holder's) first, deleted in that
    // order by one transaction.
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("a client of our own");
    let all = etcd_client::GetOptions::new().with_all_keys().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let listed = client.get("", Some(all)).await.expect("list the keys");
    let entries: Vec<Vec<u8>> = listed
        .kvs()
        .iter()
        .map(|kv| kv.key().to_vec())
        .filter(|k| String::from_utf8_lossy(k).contains(&format!("/{key}/")))
        .collect();
    assert_eq!(entries.len(), 3, "the holder's and two waiters' entries");
    let delete_all = entries
        .iter()
        .map(|k| etcd_client::TxnOp::delete(k.clone(), None))
        .collect::<Vec<_>>();
    client
        .txn(etcd_client::Txn::new().and_then(delete_all))
        .await
        .expect("delete the queue in one transaction");

    let first = next_grant(&mut grants).await;
    let held = backend.holder(key).await.expect("read the holder");
    assert_eq!(
        held.map(|h| h.fencing_token),
        Some(first.fencing_token()),
        "the lock is granted on an entry the queue holds"
    );
    until("the other waiter queued again", || async {
        backend.queue_len(key).await.expect("queue length") == 2
    })
    .await;
    assert!(
        grants.try_recv().is_err(),
        "the other waiter waits its turn"
    );
    let token = first.fencing_token();
    locker.release(first).await.expect("release the first");
    let second = next_grant(&mut grants).await;
    assert!(second.fencing_token() > token, "tokens increase");
    locker.release(second).await.expect("release the second");
    drop(holder);
    assert_eq!(backend.queue_len(key).await.expect("queue length"), 0);
}
