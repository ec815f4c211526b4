//! What an uncontended lock costs the cluster: the requests and the reads
//! and writes each one applies (on a private one-member cluster, whose
//! metrics count them).

mod common;

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Error, Mode};
use lock_testkit::EtcdCluster;

const TTL: Duration = Duration::from_secs(30);

/// The member's counts of applied puts, deletes, reads and transactions,
/// and of the requests started on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    puts: u64,
    deletes: u64,
    reads: u64,
    txns: u64,
    lease_grants: u64,
    lease_revokes: u64,
    requests: u64,
}

fn counts(cluster: &EtcdCluster) -> Counts {
    let member = cluster.member(0);
    let counter = |name: &str| member.counter(name).expect("read the member's metrics");
    let calls = |method: &str| common::calls_started(cluster, method);
    Counts {
        puts: counter("etcd_mvcc_put_total"),
        deletes: counter("etcd_mvcc_delete_total"),
        reads: counter("etcd_mvcc_range_total"),
        txns: counter("etcd_mvcc_txn_total"),
        lease_grants: calls("LeaseGrant"),
        lease_revokes: calls("LeaseRevoke"),
        requests: [
            "Range",
            "Put",
            "DeleteRange",
            "Txn",
            "LeaseGrant",
            "LeaseRevoke",
        ]
        .iter()
        .map(|m| calls(m))
        .sum::<u64>()
            + calls("LeaseKeepAlive"),
    }
}

fn since(before: Counts, after: Counts) -> Counts {
    Counts {
        puts: after.puts - before.puts,
        deletes: after.deletes - before.deletes,
        reads: after.reads - before.reads,
        txns: after.txns - before.txns,
        lease_grants: after.lease_grants - before.lease_grants,
        lease_revokes: after.lease_revokes - before.lease_revokes,
        requests: after.requests - before.requests,
    }
}

/// With its lease reused, taking a free lock and releasing it are two
/// requests: one put (no read of the queue: the entry heads an empty one)
/// and one delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_grant_and_release_are_one_put_and_one_delete() {
    let (cluster, _backend, locker) = common::on_private_cluster().await;
    // The first pair grants the lease the next ones reuse.
    let first = locker.try_acquire("free", TTL).await.expect("acquire");
    locker.release(first).await.expect("release");

    const PAIRS: u64 = 5;
    for acquire_with_wait in [false, true] {
        let before = counts(&cluster);
        for _ in 0..PAIRS {
            let lease = if acquire_with_wait {
                locker
                    .acquire("free", TTL, Wait::at_most(Duration::from_secs(5)))
                    .await
            } else {
                locker.try_acquire("free", TTL).await
            }
            .expect("acquire");
            locker.release(lease).await.expect("release");
        }
        let spent = since(before, counts(&cluster));
        let what = if acquire_with_wait {
            "acquire"
        } else {
            "try_acquire"
        };
        assert_eq!(
            spent.requests,
            2 * PAIRS,
            "{what}: two requests a pair: {spent:?}"
        );
        assert_eq!(spent.puts, PAIRS, "{what}: {spent:?}");
        assert_eq!(spent.deletes, PAIRS, "{what}: {spent:?}");
        // The compare that finds the queue empty reads its range once; no
        // other read.
        assert!(
            spent.reads <= PAIRS,
            "{what}: a read of the queue: {spent:?}"
        );
        assert_eq!(
            spent.lease_grants + spent.lease_revokes,
            0,
            "{what}: {spent:?}"
        );
    }
}

/// A try on a held lock writes nothing: no entry put and taken back, no
/// lease granted or revoked (its lease waits for the next acquire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_on_a_held_lock_writes_nothing() {
    let (cluster, _backend, locker) = common::on_private_cluster().await;
    let holder = locker.try_acquire("held", TTL).await.expect("acquire");
    // The first try grants the lease the next ones reuse.
    let first = locker.try_acquire("held", TTL).await;
    assert!(matches!(first, Err(Error::Contended { .. })), "{first:?}");

    let before = counts(&cluster);
    for _ in 0..5 {
        match locker.try_acquire("held", TTL).await {
            Err(Error::Contended { remaining, .. }) => {
                assert!(remaining.is_some(), "the holder's TTL left is known");
            }
            other => panic!("a try on a held lock: {other:?}"),
        }
    }
    let spent = since(before, counts(&cluster));
    assert_eq!(
        (
            spent.puts,
            spent.deletes,
            spent.lease_grants,
            spent.lease_revokes
        ),
        (0, 0, 0, 0),
        "{spent:?}"
    );
    locker.release(holder).await.expect("release");
}

/// Takes `key` in `mode` and releases it, `PAIRS` times, and checks that
/// each pair costs what a free lock's does: one put and one delete, with
/// the lease reused (a first pair grants the lease the next ones reuse).
async fn free_pairs_cost_what_a_free_lock_does(
    cluster: &EtcdCluster,
    locker: &lock_core::Locker,
    key: &str,
    mode: Mode,
) {
    let first = locker
        .acquire_in(key, mode, TTL, Wait::NONE)
        .await
        .expect("a grant");
    locker.release(first).await.expect("release");
    const PAIRS: u64 = 5;
    let before = counts(cluster);
    for _ in 0..PAIRS {
        let held = locker
            .acquire_in(key, mode, TTL, Wait::NONE)
            .await
            .expect("a grant");
        locker.release(held).await.expect("release");
    }
    let spent = since(before, counts(cluster));
    assert_eq!(spent.requests, 2 * PAIRS, "two requests a pair: {spent:?}");
    assert_eq!((spent.puts, spent.deletes), (PAIRS, PAIRS), "{spent:?}");
    assert_eq!(spent.lease_grants + spent.lease_revokes, 0, "{spent:?}");
}

/// Asks for the held `key` in `mode` 5 times, and checks that each is
/// refused (with the holder's time left) and writes nothing (after a first
/// refusal, which grants the lease the next ones reuse).
async fn refusals_write_nothing(
    cluster: &EtcdCluster,
    locker: &lock_core::Locker,
    key: &str,
    mode: Mode,
) {
    let warm_up = locker.acquire_in(key, mode, TTL, Wait::NONE).await;
    assert!(
        matches!(warm_up, Err(Error::Contended { .. })),
        "{warm_up:?}"
    );
    let before = counts(cluster);
    for _ in 0..5 {
        let refused = locker.acquire_in(key, mode, TTL, Wait::NONE).await;
        assert!(
            matches!(
                refused,
                Err(Error::Contended {
                    remaining: Some(_),
                    ..
                })
            ),
            "{refused:?}"
        );
    }
    let spent = since(before, counts(cluster));
    assert_eq!(
        (
            spent.puts,
            spent.deletes,
            spent.lease_grants,
            spent.lease_revokes
        ),
        (0, 0, 0, 0),
        "{spent:?}"
    );
}

/// A permit of a free semaphore costs what a free lock does: one put and
/// one delete, with its lease reused. An attempt on a full semaphore
/// writes nothing (its lease waits for the next acquire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_permit_is_one_put_and_a_full_semaphore_writes_nothing() {
    let (cluster, _backend, locker) = common::on_private_cluster().await;
    let one = Mode::semaphore(1);
    free_pairs_cost_what_a_free_lock_does(&cluster, &locker, "permits", one).await;

    let holder = locker
        .acquire_in("permits", one, TTL, Wait::NONE)
        .await
        .expect("a permit");
    refusals_write_nothing(&cluster, &locker, "permits", one).await;
    locker.release(holder).await.expect("release");
}

/// A read hold on a free key costs what a free lock does. A reader beside
/// readers costs two requests: the refused put, whose reply is the look
/// at the queue, and the put. A reader refused by a writer writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_read_hold_is_one_put_and_a_writer_refuses_readers_without_a_write() {
    let (cluster, _backend, locker) = common::on_private_cluster().await;
    free_pairs_cost_what_a_free_lock_does(&cluster, &locker, "readers", Mode::Shared).await;

    let first = locker
        .acquire_in("readers", Mode::Shared, TTL, Wait::NONE)
        .await
        .expect("a reader");
    let before = counts(&cluster);
    let second = locker
        .acquire_in("readers", Mode::Shared, TTL, Wait::NONE)
        .await
        .expect("a reader beside the first");
    let spent = since(before, counts(&cluster));
    // Besides the grant of a lease of its own (the first reader holds the
    // one kept for reuse).
    assert_eq!(
        (spent.requests - spent.lease_grants, spent.puts),
        (2, 1),
        "{spent:?}"
    );
    locker.release(first).await.expect("release");
    locker.release(second).await.expect("release");

    let writer = locker
        .try_acquire("readers", TTL)
        .await
        .expect("the writer");
    refusals_write_nothing(&cluster, &locker, "readers", Mode::Shared).await;
    locker.release(writer).await.expect("release");
}

/// A forced release of a key that readers hold deletes every reader's
/// entry in one transaction: one read of the queue and one request, all
/// the readers' holds gone at once or none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_of_readers_is_one_read_and_one_transaction() {
    let (cluster, _backend, locker) = common::on_private_cluster().await;
    const READERS: u64 = 3;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let reader = locker
            .acquire_in("forced", Mode::Shared, TTL, Wait::NONE)
            .await
            .expect("a reader");
        readers.push(reader);
    }
    let before = counts(&cluster);
    let txns_before = common::calls_started(&cluster, "Txn");
    assert!(locker.force_release("forced").await.expect("force release"));
    let spent = since(before, counts(&cluster));
    let txns = common::calls_started(&cluster, "Txn") - txns_before;
    assert_eq!(
        (spent.requests, txns, spent.deletes),
        (2, 1, READERS),
        "{spent:?}"
    );
    let writer = locker
        .try_acquire("forced", TTL)
        .await
        .expect("the key is free");
    locker.release(writer).await.expect("release");
}
