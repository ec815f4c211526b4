//! Redis Sentinel: the backend follows a failover to the new master, with
//! locks held and waiters waiting, on a deployment of its own (a master, a
//! replica, three sentinels).

use std::time::Duration;

use lock_core::{LockBackend, Locker, Wait};
use lock_redis::{RedisOptions, SentinelBackend};
use lock_testkit::RedisSentinel;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
/// The bound this test states for reaching the new master and granting
/// again, counted from `SENTINEL FAILOVER`: generous, so that a slow
/// machine does not fail it (the measured time is printed).
const GRANTS_AGAIN_WITHIN: Duration = Duration::from_secs(20);

async fn start() -> RedisSentinel {
    tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start a Sentinel deployment")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_and_waiters_are_granted_on_the_new_master() {
    let deployment = start().await;
    let backend = SentinelBackend::connect(&deployment.url())
        .await
        .expect("connect");
    let old = deployment.master_port().unwrap();
    assert_eq!(backend.master_address(), format!("127.0.0.1:{old}"));
    assert!(
        backend
            .capabilities()
            .exclusion_rests_on
            .contains(&lock_core::Assumption::ReplicationCaughtUp)
    );
    let locker = Locker::new(backend.clone());
    let held = locker.try_acquire("failover/held", TTL).await.unwrap();
    // The grant reached the replica before the failover: it survives it.
    deployment
        .master()
        .unwrap()
        .cli(&["WAIT", "1", "5000"])
        .unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let lease = locker
                    .acquire("failover/held", TTL, Wait::at_most(Duration::from_secs(60)))
                    .await?;
                let token = lease.fencing_token().get();
                locker.release(lease).await?;
                Ok::<u64, lock_core::Error>(token)
            })
        })
        .collect();

    let started = Instant::now();
    let new = tokio::task::spawn_blocking(move || {
        let new = deployment.failover().expect("failover");
        (deployment, new)
    });
    let (deployment, new) = new.await.unwrap();
    assert_ne!(new, old);
    // A fresh key, granted by the new master once the backend reaches it.
    let new_master = format!("127.0.0.1:{new}");
    let first = loop {
        match locker.try_acquire("failover/fresh", TTL).await {
            Ok(lease) if backend.master_address() == new_master => break lease,
            // The old master may take writes until the sentinels make it a
            // replica; the backend has not moved yet.
            Ok(lease) => drop(locker.release(lease).await),
            Err(e) if e.is_unavailable() => {}
            Err(e) => panic!("after SENTINEL FAILOVER: {e}"),
        }
        assert!(
            started.elapsed() < GRANTS_AGAIN_WITHIN,
            "not on the new master {GRANTS_AGAIN_WITHIN:?} after SENTINEL FAILOVER"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    eprintln!("granted again {took:?} after SENTINEL FAILOVER");
    assert!(took < GRANTS_AGAIN_WITHIN, "{took:?}");
    locker.release(first).await.unwrap();

    // The held lock was replicated: its holder still holds it there.
    let held_token = held.fencing_token().get();
    locker
        .release(held)
        .await
        .expect("released on the new master");
    for waiter in waiters {
        let token = waiter.await.unwrap().expect("the waiter is granted");
        assert!(token > held_token);
    }
    drop(deployment);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_grants_only_what_a_replica_acknowledged() {
    let deployment = start().await;
    let url = deployment.url();
    let options = RedisOptions::from_url(&url)
        .unwrap()
        .min_replicas(1)
        .connect_timeout(Duration::from_secs(3))
        .response_timeout(Duration::from_millis(400));
    let locker = Locker::new(
        SentinelBackend::connect_with(options)
            .await
            .expect("connect"),
    );
    let lease = locker.try_acquire("replicas/a", TTL).await.unwrap();
    locker.release(lease).await.unwrap();

    // A paused replica acknowledges nothing: the grant is refused, not kept.
    let replica = deployment.replica().unwrap();
    replica.pause().unwrap();
    let refused = locker.try_acquire("replicas/b", TTL).await;
    replica.resume().unwrap();
    let err = refused.expect_err("granted with no replica acknowledging");
    assert!(
        err.is_unavailable() && err.to_string().contains("min_replicas"),
        "{err}"
    );
    // Given back: granted again long before its 30 s TTL would free it.
    let lease = locker
        .acquire("replicas/b", TTL, Wait::at_most(Duration::from_secs(5)))
        .await
        .expect("the refused grant was left held");
    locker.release(lease).await.unwrap();
}

/// What a failover does to a lock whose grant the replica never received:
/// the replica's link is cut (paused, and its connection closed by the
/// master) before client A's grant, the master is killed after it, and
/// the sentinels promote the replica. Returns whether A was granted, and
/// whether client B was then granted the same key while A's lease was
/// still valid (two holders at once).
async fn failover_after_an_unreplicated_grant(min_replicas: u32) -> (bool, bool) {
    let deployment = start().await;
    let options = || {
        RedisOptions::from_url(&deployment.url())
            .unwrap()
            .min_replicas(min_replicas)
            .connect_timeout(Duration::from_secs(3))
            .response_timeout(Duration::from_millis(400))
    };
    let a = Locker::new(SentinelBackend::connect_with(options()).await.unwrap());
    let b = Locker::new(SentinelBackend::connect_with(options()).await.unwrap());
    let old = deployment.master_port().unwrap();
    let (master, replica) = (deployment.master().unwrap(), deployment.replica().unwrap());
    replica.pause().unwrap();
    master.cli(&["CLIENT", "KILL", "TYPE", "replica"]).unwrap();
    let held = a.try_acquire("hole/x", TTL).await;
    master.kill().unwrap();
    replica.resume().unwrap();
    let promoted = tokio::task::spawn_blocking(move || {
        let new = deployment.wait_promoted(old);
        (deployment, new)
    });
    let (deployment, new) = promoted.await.unwrap();
    new.expect("the sentinels promote the replica");
    let Ok(held) = held else {
        return (false, false);
    };
    let started = Instant::now();
    let second = loop {
        match b.try_acquire("hole/x", TTL).await {
            Ok(lease) => break Some(lease),
            Err(e) if e.is_contended() => break None,
            Err(e) if e.is_unavailable() && started.elapsed() < GRANTS_AGAIN_WITHIN => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("B after the failover: {e}"),
        }
    };
    let overlap = second.is_some() && held.deadline() > Instant::now();
    drop(deployment);
    (true, overlap)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_hands_an_unreplicated_grant_to_a_second_client() {
    let (granted, overlap) = failover_after_an_unreplicated_grant(0).await;
    assert!(granted, "A was not granted");
    assert!(overlap, "B was not granted the key A still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_refuses_the_grant_a_failover_would_hand_on() {
    let (granted, overlap) = failover_after_an_unreplicated_grant(1).await;
    assert!(!granted, "A was granted with no replica acknowledging");
    assert!(!overlap);
}
