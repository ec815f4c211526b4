//! Member failures on a private 3-member cluster: a minority down changes
//! nothing, a majority down makes every operation fail fast as unavailable,
//! and a lease revoked from outside fires the holder's `lost()` at once.

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Error, GuardOptions, Locker};
use lock_etcd::EtcdBackend;
use lock_testkit::EtcdCluster;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

async fn cluster() -> EtcdCluster {
    tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .unwrap()
        .expect("start a 3-member etcd cluster")
}

async fn locker(cluster: &EtcdCluster, query: &str) -> (EtcdBackend, Locker) {
    let backend = EtcdBackend::connect(&format!("{}?{query}", cluster.url()))
        .await
        .expect("connect");
    (backend.clone(), Locker::new(backend))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_one_member_killed_locks_still_work() {
    let cluster = cluster().await;
    let (_backend, locker) = locker(&cluster, "response_timeout_ms=2000").await;
    assert_eq!(locker.capabilities().tolerated_server_failures, 1);
    // Long enough that a renewal stuck behind the election (up to one
    // response timeout) still lands before the deadline on a slow machine.
    let guard_ttl = Duration::from_secs(8);
    let guard = locker
        .guard("survivor", GuardOptions::new(guard_ttl))
        .await
        .expect("guard");
    let before = guard.fencing_token();

    // Kill the leader: the hardest member to lose (a new election follows).
    let leader = cluster.leader_index().expect("a leader");
    cluster.member(leader).kill().expect("kill the leader");
    let killed_at = tokio::time::Instant::now();

    // Waiting absorbs the election; afterwards everything works on two members.
    let lease = locker
        .acquire("other", TTL, Wait::at_most(Duration::from_secs(60)))
        .await
        .expect("acquire with one member down");
    assert!(lease.fencing_token() > before);
    match locker.try_acquire("other", TTL).await {
        Err(Error::Contended { .. }) => {}
        other => panic!("a second holder was not refused: {other:?}"),
    }
    let mut lease = lease;
    locker.extend(&mut lease, TTL).await.expect("extend");
    locker.release(lease).await.expect("release");
    let again = locker.try_acquire("other", TTL).await.expect("reacquire");
    locker.release(again).await.expect("release again");

    // The guard taken before the kill renews through the election: wait for
    // a deadline that only a renewal sent after the kill can give.
    let renewed_after_kill = killed_at + guard_ttl - Duration::from_millis(200);
    let lost = guard.lost();
    tokio::select! {
        reason = lost => panic!("the guard lost its lock to a minority failure: {reason:?}"),
        () = async {
            while guard.deadline() < renewed_after_kill {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } => {}
        () = tokio::time::sleep(Duration::from_secs(60)) => panic!("the guard never renewed after the kill"),
    }
    guard.release().await.expect("release the guard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_two_of_three_members_down_acquire_is_unavailable_in_time() {
    let cluster = cluster().await;
    let response_timeout = Duration::from_millis(1500);
    let (_backend, locker) = locker(&cluster, "response_timeout_ms=1500").await;
    let guard = locker
        .guard("held", GuardOptions::new(Duration::from_secs(3)))
        .await
        .expect("guard");
    let lost = guard.lost();

    // One killed, one paused: a paused member accepts connections and never
    // answers, the worst case for a client.
    cluster.member(0).kill().expect("kill");
    cluster.member(1).pause().expect("pause");

    let started = Instant::now();
    let err = locker
        .try_acquire("fresh", TTL)
        .await
        .expect_err("no quorum, no grant");
    assert!(err.is_unavailable(), "{err}");
    assert!(
        started.elapsed() < response_timeout * 3,
        "try_acquire took {:?}",
        started.elapsed()
    );
    let message = err.to_string();
    assert!(
        message.contains("etcd://127.0.0.1:"),
        "the error names the endpoints: {message}"
    );

    let wait = Duration::from_secs(3);
    let started = Instant::now();
    let err = locker
        .acquire("fresh", TTL, Wait::at_most(wait))
        .await
        .expect_err("no quorum, no grant");
    assert!(
        err.is_unavailable(),
        "acquire reports why it failed, not a plain timeout: {err}"
    );
    let took = started.elapsed();
    assert!(took < wait + response_timeout * 2, "acquire hung: {took:?}");

    // The holder cannot renew: its guard says so by its deadline.
    let reason = tokio::time::timeout(Duration::from_secs(30), lost)
        .await
        .expect("lost() fires");
    assert!(guard.lost_reason().is_some(), "{reason:?}");
    cluster.member(1).resume().expect("resume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_the_holders_lease_from_outside_fires_lost() {
    let cluster = cluster().await;
    let (backend, locker) = locker(&cluster, "response_timeout_ms=2000").await;
    // A long TTL and renewal interval: only the watch can notice in time.
    let ttl = Duration::from_secs(30);
    let guard = locker
        .guard("revoked", GuardOptions::new(ttl))
        .await
        .expect("guard");
    let lost = guard.lost();
    let holder = backend
        .holder("revoked")
        .await
        .expect("read holder")
        .expect("a holder");
    assert_eq!(holder.fencing_token, guard.fencing_token());

    let lease_hex = format!("{:x}", holder.lease_id);
    let out = cluster
        .etcdctl(&["lease", "revoke", &lease_hex])
        .expect("etcdctl lease revoke");
    assert!(out.contains("revoked"), "{out}");
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("lost() fires long before the next renewal");
    assert!(started.elapsed() < ttl / 3);
    assert!(
        guard.release().await.is_err(),
        "releasing a lost guard reports it"
    );
    let next = locker
        .try_acquire("revoked", ttl)
        .await
        .expect("the lock is free");
    assert!(next.fencing_token() > holder.fencing_token);
    locker.release(next).await.expect("release");
}
