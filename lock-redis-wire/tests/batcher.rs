//! The batcher against a private, paused Redis: an acquire whose caller left
//! while it was held back is never sent, so it grants nothing; an operation
//! held back behind its own claim runs after it.

use std::time::Duration;

use lock_core::OwnerToken;
use lock_redis_wire::{AcquireReply, Batcher, Claim, Handout, KeyLayout, TokenRule};
use lock_testkit::RedisServer;
use redis::AsyncConnectionConfig;

const TTL: Duration = Duration::from_secs(30);

/// Yields until the batcher has taken what was asked and sent what it can:
/// it lets the other ready tasks go once before it takes a batch.
async fn let_the_batcher_run() {
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
}

/// Current-thread runtime: the batcher runs only when the test yields, so
/// the test knows what it has taken off its queue.
#[tokio::test(flavor = "current_thread")]
async fn an_acquire_abandoned_while_held_back_is_never_sent() {
    let server = RedisServer::start().expect("start redis");
    let client = redis::Client::open(server.url()).expect("url");
    // No response timeout: the calls stuck at the paused server wait for it.
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect");
    let batcher = Batcher::start(conn, TokenRule::ClockFloor, Handout::AllAtOnce);
    let layout = KeyLayout::default();
    let owner = OwnerToken::random();
    let (held, abandoned, kept) = (
        Claim::new(layout.keys("held"), &owner),
        Claim::new(layout.keys("abandoned"), &owner),
        Claim::new(layout.keys("kept"), &owner),
    );
    // Loads the script, so that the calls below are the only ones.
    batcher
        .release(held.clone(), 0)
        .await
        .expect("warm-up release");

    server.pause().expect("pause");
    // On the wire, alone, stuck at the paused server.
    let acquire = tokio::spawn(batcher.acquire(held.clone(), TTL));
    let_the_batcher_run().await;
    // Held back behind its own claim's acquire, and everything after it too.
    let release = tokio::spawn(batcher.release(held.clone(), 0));
    let gone = batcher.acquire(abandoned.clone(), TTL);
    let waited_for = tokio::spawn(batcher.acquire(kept.clone(), TTL));
    let_the_batcher_run().await;
    drop(gone);
    let_the_batcher_run().await;
    server.resume().expect("resume");

    assert!(
        matches!(
            acquire.await.unwrap().expect("acquire"),
            AcquireReply::Granted(_)
        ),
        "the acquire on the wire is granted"
    );
    assert!(
        release.await.unwrap().expect("release"),
        "the release held back ran after the acquire it follows"
    );
    assert!(
        matches!(
            waited_for.await.unwrap().expect("acquire"),
            AcquireReply::Granted(_)
        ),
        "an acquire whose caller still waits is sent"
    );
    let exists = |key: &str| server.cli(&["EXISTS", key]).expect("EXISTS");
    assert_eq!(exists(&held.keys().lock).trim(), "0");
    assert_eq!(exists(&kept.keys().lock).trim(), "1");
    assert_eq!(
        exists(&abandoned.keys().lock).trim(),
        "0",
        "the abandoned acquire was sent and granted a lock to no one"
    );
}

/// Operations per `EVALSHA` when `callers` tasks each acquire and release a
/// key of their own `pairs` times through one batcher, on a current-thread
/// runtime (so the order tasks run in is the scheduler's, not the host's).
async fn operations_per_call(handout: Handout, callers: usize, pairs: usize) -> f64 {
    let server = RedisServer::start().expect("start redis");
    let client = redis::Client::open(server.url()).expect("url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let batcher = Batcher::start(conn, TokenRule::ClockFloor, handout);
    let layout = KeyLayout::default();
    // Loads the script, so that the calls counted are the callers'.
    let warm_up = Claim::new(layout.keys("warm-up"), &OwnerToken::random());
    batcher.release(warm_up, 0).await.expect("warm-up release");
    let before = server.command_calls("evalsha").expect("INFO");
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (batcher, owner) = (batcher.clone(), OwnerToken::random());
            let claim = Claim::new(layout.keys(&format!("caller/{i}")), &owner);
            tokio::spawn(async move {
                for _ in 0..pairs {
                    let granted = batcher.acquire(claim.clone(), TTL).await.expect("acquire");
                    let AcquireReply::Granted(token) = granted else {
                        panic!("a key of its own is granted: {granted:?}");
                    };
                    let released = batcher.release(claim.clone(), token.get()).await;
                    assert!(released.expect("release"), "released");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("caller");
    }
    let calls = server.command_calls("evalsha").expect("INFO") - before;
    (callers * pairs * 2) as f64 / calls as f64
}

/// Handed out all at once, a busy batch's answers wake all its callers
/// together, and they ask again together: every call carries all 64
/// callers' operations, the client and the server taking turns. Handed out
/// in rounds, the first callers answered ask again while the others are
/// still being answered, and their operations leave in calls of their own.
#[tokio::test(flavor = "current_thread")]
async fn answers_handed_out_in_rounds_let_the_first_callers_ask_again_first() {
    let all_at_once = operations_per_call(Handout::AllAtOnce, 64, 20).await;
    let in_rounds = operations_per_call(Handout::InRounds, 64, 20).await;
    assert!(
        all_at_once > 48.0,
        "all at once: {all_at_once:.1} operations per call, expected the 64 callers in step"
    );
    assert!(
        in_rounds < all_at_once / 2.0,
        "in rounds: {in_rounds:.1} operations per call against {all_at_once:.1} all at once"
    );
}
