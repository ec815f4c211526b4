//! The batcher against a private, paused Redis: an acquire whose caller left
//! while it was held back is never sent, so it grants nothing; an operation
//! held back behind its own claim runs after it.

use std::time::Duration;

use lock_core::OwnerToken;
use lock_redis_wire::{AcquireReply, Batcher, Claim, KeyLayout, TokenRule};
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
    let batcher = Batcher::start(conn, TokenRule::ClockFloor);
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
