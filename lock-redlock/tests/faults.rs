//! Redlock with real, private Redis nodes that are paused, pre-loaded with
//! foreign grants, or restarted empty.

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Error, LockBackend, Locker, SafetyModel};
use lock_redlock::{QuorumError, RedlockBackend, RedlockOptions};
use lock_testkit::RedisNodes;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
/// Larger than the default so a loaded test machine does not fail the live
/// nodes, still far below what a paused node would cost without it (forever).
const NODE_TIMEOUT: Duration = Duration::from_millis(200);

async fn connect(nodes: &RedisNodes) -> (RedlockBackend, Locker) {
    let options = RedlockOptions::from_url(&nodes.url())
        .expect("options")
        .node_timeout(NODE_TIMEOUT);
    let backend = RedlockBackend::connect_with(options)
        .await
        .expect("connect");
    (backend.clone(), Locker::new(backend))
}

/// Whether node `i` holds the grant of `key` (anyone's).
fn holds(nodes: &RedisNodes, backend: &RedlockBackend, i: usize, key: &str) -> bool {
    nodes
        .node(i)
        .cli(&["EXISTS", &backend.redis_keys(key).lock])
        .expect("redis-cli")
        == "1"
}

/// Waits until node `i` no longer holds `key`'s grant: its delete was sent
/// along with a release that returned once a majority had deleted it. Two
/// seconds, far below the grant's TTL, so that a grant that merely expired
/// does not pass.
async fn await_deleted(nodes: &RedisNodes, backend: &RedlockBackend, i: usize, key: &str) {
    let give_up = Instant::now() + Duration::from_secs(2);
    while holds(nodes, backend, i, key) {
        assert!(
            Instant::now() < give_up,
            "node {i} kept the grant of {key} after the release: its delete never ran"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A backend whose node timeout is far beyond any test: a call that waited
/// for a paused node would show.
async fn connect_patient(nodes: &RedisNodes) -> (RedlockBackend, Locker) {
    let options = RedlockOptions::from_url(&nodes.url())
        .expect("options")
        .node_timeout(Duration::from_secs(60));
    let backend = RedlockBackend::connect_with(options)
        .await
        .expect("connect");
    let locker = Locker::new(backend.clone());
    (backend, locker)
}

/// Resumes paused nodes even when an assertion fails, so that dropping the
/// node set can reap them.
struct Paused<'a>(&'a RedisNodes, Vec<usize>);

impl<'a> Paused<'a> {
    fn pause(nodes: &'a RedisNodes, which: &[usize]) -> Self {
        for &i in which {
            nodes.node(i).pause().expect("SIGSTOP");
        }
        Paused(nodes, which.to_vec())
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        for &i in &self.1 {
            let _ = self.0.node(i).resume();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_paused_still_lock_extend_and_release_within_the_node_timeout() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    let _paused = Paused::pause(&nodes, &[0, 3]);

    let started = Instant::now();
    let mut lease = locker
        .try_acquire("two-paused", TTL)
        .await
        .expect("a majority is up");
    let took = started.elapsed();
    // All nodes are asked at once, so the paused ones cost one node timeout, not more.
    assert!(
        took < NODE_TIMEOUT + Duration::from_millis(800),
        "acquire took {took:?}"
    );
    for i in [1, 2, 4] {
        assert!(
            holds(&nodes, &backend, i, "two-paused"),
            "live node {i} lacks the grant"
        );
    }
    assert!(
        locker
            .try_acquire("two-paused", TTL)
            .await
            .unwrap_err()
            .is_contended()
    );

    let started = Instant::now();
    locker
        .extend(&mut lease, TTL)
        .await
        .expect("extend on a majority");
    assert!(
        started.elapsed() < NODE_TIMEOUT + Duration::from_millis(800),
        "extend took {:?}",
        started.elapsed()
    );
    locker.release(lease).await.expect("release on a majority");
    for i in [1, 2, 4] {
        assert!(
            !holds(&nodes, &backend, i, "two-paused"),
            "live node {i} still holds the grant"
        );
    }
    locker
        .try_acquire("two-paused", TTL)
        .await
        .expect("free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_paused_fail_with_the_quorum_error_and_leave_nothing_held() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    let paused = Paused::pause(&nodes, &[0, 2, 4]);

    let err = locker.try_acquire("three-paused", TTL).await.unwrap_err();
    let Error::Unavailable { ref source, .. } = err else {
        panic!("expected unavailable, got {err}")
    };
    let quorum = source
        .as_ref()
        .and_then(|s| s.downcast_ref::<QuorumError>())
        .expect("a QuorumError source");
    assert_eq!(
        (
            quorum.done.len(),
            quorum.refused.len(),
            quorum.failed.len(),
            quorum.needed
        ),
        (2, 0, 3, 3),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("2 of 5 nodes agreed (3 needed)") && text.contains("3 failed or timed out"),
        "{text}"
    );
    for port in [0, 2, 4].map(|i| nodes.node(i).port()) {
        assert!(
            text.contains(&format!(":{port}")),
            "{text} does not name the paused node on port {port}"
        );
    }
    for i in [1, 3] {
        assert!(
            !holds(&nodes, &backend, i, "three-paused"),
            "live node {i} kept a grant of a failed acquire"
        );
    }

    drop(paused);
    // A resumed node answers its stuck calls first; a request that reaches
    // it before those answers are read is refused unsent (the node still
    // looks stalled), so the first attempts may fail.
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        match locker.try_acquire("three-paused", TTL).await {
            Ok(_) => break,
            Err(e) if e.is_unavailable() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("a majority is back, yet: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_on_a_minority_never_counts() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    let lock = backend.redis_keys("minority").lock;
    // Another owner holds the key on three nodes: we can win at most two.
    for i in [0, 1, 2] {
        nodes
            .node(i)
            .cli(&["SET", &lock, "someone-else", "PX", "60000"])
            .expect("SET");
    }
    let err = locker.try_acquire("minority", TTL).await.unwrap_err();
    assert!(err.is_contended(), "{err}");
    for i in [3, 4] {
        assert!(
            !holds(&nodes, &backend, i, "minority"),
            "node {i} kept the minority grant"
        );
    }
    // The other owner's grant stays its own, with its TTL; the refused
    // acquire only marked it as waited for (`+`), so that its release
    // publishes.
    for i in [0, 1, 2] {
        let node = nodes.node(i);
        assert_eq!(
            node.cli(&["GET", &lock]).unwrap(),
            "someone-else+",
            "the other owner's grant was touched"
        );
        let ttl: i64 = node.cli(&["PTTL", &lock]).unwrap().parse().unwrap();
        assert!(ttl > 50_000, "the other owner's TTL was touched: {ttl} ms");
    }
    // With the other owner on two nodes only, the other three are a majority.
    nodes.node(0).cli(&["DEL", &lock]).expect("DEL");
    let lease = locker
        .try_acquire("minority", TTL)
        .await
        .expect("three of five is a majority");
    locker.release(lease).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_two_nodes_restart_empty() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    let keys = backend.redis_keys("restarts");
    let counter = keys.counter;
    // Node 0's counter far ahead of every clock (as if its clock ran fast),
    // and nodes 3 and 4 held by someone else, so that the granting majority
    // is nodes 0, 1 and 2: the token comes from node 0, and only the
    // write-back to the others keeps it once node 0 forgets it.
    for i in [3, 4] {
        nodes
            .node(i)
            .cli(&["SET", &keys.lock, "someone-else", "PX", "60000"])
            .expect("SET");
    }
    let ahead: u64 = nodes
        .node(0)
        .cli(&["TIME"])
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1_000_000
        + 1_000_000_000_000;
    nodes
        .node(0)
        .cli(&["SET", &counter, &ahead.to_string()])
        .expect("SET");

    let lease = locker.try_acquire("restarts", TTL).await.expect("acquire");
    let before = lease.fencing_token();
    assert!(
        before.get() > ahead,
        "the token {before:?} ignores node 0's counter {ahead}"
    );
    locker.release(lease).await.expect("release");

    for i in [0, 1] {
        nodes.node(i).restart().expect("restart");
        assert_eq!(
            nodes.node(i).cli(&["EXISTS", &counter]).unwrap(),
            "0",
            "node {i} kept its data"
        );
    }
    // The first request to a restarted node may find its old connection dead.
    let lease = loop {
        match locker.try_acquire("restarts", TTL).await {
            Ok(lease) => break lease,
            Err(e) if e.is_unavailable() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
    };
    assert!(
        lease.fencing_token() > before,
        "{:?} after restarts is not above {before:?}",
        lease.fencing_token()
    );
}

/// An acquire returns once a majority has granted, without waiting for a
/// paused node; when that node answers later, its grant gets the token
/// written back, as the majority's lagging nodes do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_returns_at_a_majority_and_a_late_grant_gets_the_token() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect_patient(&nodes).await;
    let counter = backend.redis_keys("late").counter;
    // Node 4's counter far behind the others' (which start at their clock).
    nodes.node(4).cli(&["SET", &counter, "1"]).expect("SET");
    let paused = Paused::pause(&nodes, &[4]);

    let started = Instant::now();
    let lease = locker
        .try_acquire("late", TTL)
        .await
        .expect("four nodes grant");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the acquire waited {took:?} for the paused node"
    );
    let token = lease.fencing_token().get();
    assert!(token > 2, "the token {token} came from the lagging node");

    drop(paused);
    let read = || -> u64 {
        let value = nodes.node(4).cli(&["GET", &counter]).expect("GET");
        value.trim().parse().unwrap_or(0)
    };
    let give_up = Instant::now() + TTL;
    while read() < token {
        assert!(
            Instant::now() < give_up,
            "node 4's counter stayed at {} below the token {token}",
            read()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    locker.release(lease).await.expect("release");
    await_deleted(&nodes, &backend, 4, "late").await;
}

/// A release returns once a majority has deleted the grant, without waiting
/// for a paused node; the paused node's delete, already sent, runs when it
/// resumes, so it keeps no grant for the rest of the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_returns_at_a_majority_and_a_paused_node_deletes_later() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect_patient(&nodes).await;
    let lease = locker
        .try_acquire("slow-release", TTL)
        .await
        .expect("grant");
    assert!(
        holds(&nodes, &backend, 4, "slow-release"),
        "node 4 lacks the grant"
    );
    let paused = Paused::pause(&nodes, &[4]);

    let started = Instant::now();
    locker.release(lease).await.expect("release on four nodes");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the release waited {took:?} for the paused node"
    );
    let cleared = (0..4)
        .filter(|&i| !holds(&nodes, &backend, i, "slow-release"))
        .count();
    assert!(
        cleared >= 3,
        "only {cleared} live nodes had deleted the grant"
    );

    drop(paused);
    await_deleted(&nodes, &backend, 4, "slow-release").await;
}

/// A grant that survives on a minority only (the majority lost it) is not a
/// lock: extend reports it lost and clears the minority so it blocks nobody
/// for a TTL, release reports it lost too, and force release finds no lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_left_on_a_minority_is_lost_and_cleared() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    let key = "minority-left";
    let lock = backend.redis_keys(key).lock;

    let mut lease = locker.try_acquire(key, TTL).await.expect("grant");
    for i in 0..3 {
        nodes.node(i).cli(&["DEL", &lock]).expect("DEL");
    }
    match locker.extend(&mut lease, TTL).await {
        Err(Error::Lost { .. }) => {}
        other => panic!("extend with the grant on 2 of 5 nodes: expected lost, got {other:?}"),
    }
    assert!(
        (0..5).all(|i| !holds(&nodes, &backend, i, key)),
        "the extended minority was not cleared"
    );

    let lease = locker.try_acquire(key, TTL).await.expect("grant again");
    for i in 0..3 {
        nodes.node(i).cli(&["DEL", &lock]).expect("DEL");
    }
    match locker.release(lease).await {
        Err(Error::Lost { .. }) => {}
        other => panic!("release with the grant on 2 of 5 nodes: expected lost, got {other:?}"),
    }

    // The operator's force release deletes a minority's grant too, and
    // reports it as no lock; a majority's, as a lock.
    for (on, was_a_lock) in [(2, false), (3, true)] {
        let lease = locker.try_acquire(key, TTL).await.expect("grant");
        for i in on..5 {
            nodes.node(i).cli(&["DEL", &lock]).expect("DEL");
        }
        let found = locker.force_release(key).await.expect("force release");
        assert_eq!(
            found, was_a_lock,
            "force release of a grant on {on} of 5 nodes"
        );
        assert!(
            (0..5).all(|i| !holds(&nodes, &backend, i, key)),
            "force release left the grant on a node"
        );
        drop(lease);
    }
}

/// A node that is paused while a lock is taken and released gets both
/// requests when it resumes, the release after the acquire: it keeps no
/// grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_runs_a_release_after_the_acquire_it_follows() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    let (backend, locker) = connect(&nodes).await;
    // Loads the scripts everywhere, so that the calls counted below are ours.
    let lease = locker.try_acquire("warm-up", TTL).await.unwrap();
    locker.release(lease).await.unwrap();
    nodes.node(4).cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let paused = Paused::pause(&nodes, &[4]);

    let lease = locker
        .try_acquire("paused-then-released", TTL)
        .await
        .expect("four nodes grant");
    locker.release(lease).await.expect("release on a majority");

    drop(paused);
    // The resumed node runs the two calls; out of order, the grant would
    // stay for its whole TTL.
    let give_up = Instant::now() + TTL / 2;
    while nodes.node(4).command_calls("evalsha").unwrap() < 2 {
        assert!(
            Instant::now() < give_up,
            "the resumed node never ran the calls"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !holds(&nodes, &backend, 4, "paused-then-released"),
        "the resumed node kept the grant: the release ran before the acquire"
    );
    locker
        .try_acquire("paused-then-released", TTL)
        .await
        .expect("free on every node");
}

/// One node is reported as the single server it is, so that a profile
/// asking for a quorum refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_is_a_single_node_not_a_quorum() {
    let nodes = RedisNodes::start(3).expect("3 redis nodes");
    let one = RedlockBackend::connect(&format!("redlock://{}", nodes.node(0).host_port()))
        .await
        .expect("connect");
    let (three, _) = connect(&nodes).await;
    assert_eq!(one.capabilities().safety, SafetyModel::SingleNode);
    assert_eq!(
        three.capabilities().safety,
        SafetyModel::QuorumWithTimingAssumptions
    );
}

/// A node down when the backend connects is dialled again in the
/// background, and takes part once it is up; while it is down, a lock
/// needs only the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_at_connect_takes_part_once_it_is_up() {
    let nodes = RedisNodes::start(5).expect("5 redis nodes");
    nodes.node(4).kill().expect("kill");
    let (backend, locker) = connect(&nodes).await;
    let lease = locker
        .try_acquire("late-node", TTL)
        .await
        .expect("four of five grant");
    locker.release(lease).await.expect("release on four");

    nodes.node(4).restart().expect("start node 4 again");
    // The dial that failed is retried after a pause of at most a second.
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let lease = locker.try_acquire("late-node", TTL).await.expect("acquire");
        let joined = holds(&nodes, &backend, 4, "late-node");
        locker.release(lease).await.expect("release");
        if joined {
            break;
        }
        assert!(Instant::now() < give_up, "node 4 never took part again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A paused node never confirms a subscription: a waiter's wake-up is in
/// place once a majority has confirmed, and the release, told by the other
/// nodes, wakes it. Waiting for the paused node's confirmation would take
/// the node timeout, three times this test's patience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_does_not_hold_back_a_waiters_wake_up() {
    let nodes = RedisNodes::start(3).expect("3 redis nodes");
    // Patient everywhere: no timeout ends a wait within the test's
    // patience, so only the release can wake the waiter.
    let options = RedlockOptions::from_url(&nodes.url())
        .expect("options")
        .node_timeout(Duration::from_secs(60))
        .connect_timeout(Duration::from_secs(60));
    let backend = RedlockBackend::connect_with(options)
        .await
        .expect("connect");
    let locker = Locker::new(backend.clone());
    let patience = Duration::from_secs(20);
    let key = |name| lock_core::raw::validate::key(name, &backend.capabilities().limits).unwrap();
    // An earlier wait opened the subscription connections, which stay:
    // the paused node's takes the next SUBSCRIBE and never answers it.
    drop(
        backend
            .on_release(&key("earlier"))
            .await
            .expect("a wake-up"),
    );
    let _paused = Paused::pause(&nodes, &[2]);
    let key = key("woken");

    let woken = tokio::time::timeout(patience, backend.on_release(&key))
        .await
        .expect("the wake-up waited for the paused node's subscription")
        .expect("a wake-up");
    // Taken while a waiter is registered: its release is published.
    let lease = locker.try_acquire("woken", TTL).await.expect("two grant");
    locker.release(lease).await.expect("release on two");
    tokio::time::timeout(patience, woken)
        .await
        .expect("the release told by two nodes did not wake the waiter");
}

/// Waits on many keys while a node is paused each end, and once they are
/// over this process keeps nothing of them: no channel entry, no
/// subscription change queued for the paused node. The connect timeout is
/// unbounded, so only the wake-ups' own bound ends a SUBSCRIBE the paused
/// node never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_during_a_pause_leave_no_wake_up_state_behind() {
    const KEYS: usize = 40;
    let nodes = RedisNodes::start(3).expect("3 redis nodes");
    let options = RedlockOptions::from_url(&nodes.url())
        .expect("options")
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(Duration::MAX);
    let backend = RedlockBackend::connect_with(options)
        .await
        .expect("connect");
    let locker = Locker::new(backend.clone());
    let patience = Duration::from_secs(60);
    let emptied = |backend: RedlockBackend| async move {
        while backend.wake_up_backlog() != (0, 0) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // An earlier wait opened the subscription connections, which stay:
    // the paused node's takes the next SUBSCRIBE and never answers it.
    let earlier = lock_core::raw::validate::key("earlier", &backend.capabilities().limits).unwrap();
    drop(backend.on_release(&earlier).await.expect("a wake-up"));
    tokio::time::timeout(patience, emptied(backend.clone()))
        .await
        .expect("the earlier wait left its entry behind with every node up");
    let _paused = Paused::pause(&nodes, &[2]);

    let names: Vec<String> = (0..KEYS).map(|i| format!("paused-wait-{i}")).collect();
    let mut held = Vec::new();
    for name in &names {
        held.push(locker.try_acquire(name, TTL).await.expect("two grant"));
    }
    let waiters: Vec<_> = (names.iter().cloned())
        .map(|name| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let lease = locker.acquire(&name, TTL, Wait::at_most(patience)).await?;
                locker.release(lease).await
            })
        })
        .collect();
    // Released once every waiter is registered, so that each wait takes a wake-up.
    tokio::time::timeout(patience, async {
        while backend.wake_up_backlog().0 < KEYS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the waiters never all registered");
    for lease in held {
        locker.release(lease).await.expect("release on two");
    }
    for waiter in waiters {
        tokio::time::timeout(patience, waiter)
            .await
            .expect("a wait did not end")
            .expect("the waiter panicked")
            .expect("acquired and released on two");
    }
    tokio::time::timeout(patience, emptied(backend.clone()))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the waits are over, yet (entries, queued changes) are {:?}",
                backend.wake_up_backlog()
            )
        });
}
