//! Release wake-ups on private nodes: one subscription per key on each
//! node across the rounds of a wait.

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Backoff, Error, Locker, LockerOptions};
use lock_redlock::RedlockBackend;
use lock_testkit::RedisNodes;
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(30);

/// One acquire subscribes once on each node, however many poll rounds its
/// wait takes, and unsubscribes once it is over, in the server and in this
/// process (no entry is left for its key). (Current-thread runtime:
/// the wait's next round registers before anything else runs, as it does
/// on a busy runtime almost always.)
#[tokio::test]
async fn a_waiter_keeps_its_subscriptions_across_poll_rounds() {
    let nodes = RedisNodes::start(3).expect("3 redis nodes");
    let backend = RedlockBackend::connect(&nodes.url())
        .await
        .expect("connect");
    let locker =
        Locker::new(backend.clone()).with_options(LockerOptions::default().backoff(Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(10),
        }));
    let _held = locker.try_acquire("rounds", TTL).await.unwrap();
    // In line, a wait asks again every 40 × `Backoff::max` (400 ms here)
    // unless woken: two seconds make several rounds.
    let polled = locker
        .acquire("rounds", TTL, Wait::at_most(Duration::from_secs(2)))
        .await;
    assert!(matches!(polled, Err(Error::TimedOut { .. })), "{polled:?}");
    for (i, node) in nodes.nodes().iter().enumerate() {
        // Each refused attempt in line looks for its place (`LPOS`).
        let attempts = node.command_calls("lpos").unwrap();
        assert!(
            attempts >= 3,
            "node {i}: only {attempts} attempts in line, too few rounds to tell"
        );
        assert_eq!(
            node.command_calls("subscribe").unwrap(),
            1,
            "node {i}: subscribed again in later rounds of one wait ({attempts} attempts)"
        );
    }
    timeout(Duration::from_secs(20), async {
        loop {
            let done = backend.wake_up_backlog() == (0, 0)
                && nodes.nodes().iter().all(|node| {
                    node.command_calls("unsubscribe").unwrap() == 1
                        && node.cli(&["PUBSUB", "CHANNELS", "*"]).unwrap().is_empty()
                });
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "a channel stayed subscribed after the wait (entries, queued changes: {:?})",
            backend.wake_up_backlog()
        )
    });
}
