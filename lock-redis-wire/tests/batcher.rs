//! The batcher against a private, paused Redis: an acquire whose caller left
//! while it was held back is never sent, so it grants nothing; an operation
//! held back behind its own claim runs after it. And against a private
//! Redis: one operation's failure stays its own.

mod common;

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
    let acquire = tokio::spawn(batcher.acquire(held.clone(), TTL, false));
    let_the_batcher_run().await;
    // Held back behind its own claim's acquire, and everything after it too.
    let release = tokio::spawn(batcher.release(held.clone(), 0));
    let gone = batcher.acquire(abandoned.clone(), TTL, false);
    let waited_for = tokio::spawn(batcher.acquire(kept.clone(), TTL, false));
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

/// A batcher over a multiplexed connection to `server`.
async fn batcher_on(server: &RedisServer, rule: TokenRule, handout: Handout) -> Batcher {
    Batcher::start(common::connect(server).await, rule, handout)
}

/// Operations per `EVALSHA` when `callers` tasks each acquire and release a
/// key of their own `pairs` times through one batcher, on a current-thread
/// runtime (so the order tasks run in is the scheduler's, not the host's).
async fn operations_per_call(handout: Handout, callers: usize, pairs: usize) -> f64 {
    let server = RedisServer::start().expect("start redis");
    let batcher = batcher_on(&server, TokenRule::ClockFloor, handout).await;
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
                    let granted = batcher
                        .acquire(claim.clone(), TTL, false)
                        .await
                        .expect("acquire");
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

/// With a counter per lock (as Redlock's nodes batch), a lock whose counter
/// holds the wrong type fails its own acquire, leaves no grant behind, and
/// spoils nothing for the operations sharing its call.
#[tokio::test(flavor = "current_thread")]
async fn a_broken_counter_fails_its_own_acquire_only() {
    a_broken_counter_spoils_nothing_else(TokenRule::CounterFirst, ["RPUSH", "x"], "WRONGTYPE")
        .await;
}

/// A counter so far ahead that its expiry cannot be set (its token step
/// fails after the grant was written) also fails its own acquire only, and
/// the grant is taken back.
#[tokio::test(flavor = "current_thread")]
async fn a_counter_beyond_any_expiry_fails_its_own_acquire_only() {
    a_broken_counter_spoils_nothing_else(TokenRule::ClockFloor, ["SET", "1e30"], "out of range")
        .await;
}

async fn a_broken_counter_spoils_nothing_else(
    rule: TokenRule,
    // A command and the value it writes to the lock's counter.
    [command, value]: [&str; 2],
    error: &str,
) {
    let server = RedisServer::start().expect("start redis");
    let batcher = batcher_on(&server, rule, Handout::AllAtOnce).await;
    let layout = KeyLayout::default();
    let broken = Claim::new(layout.keys("broken"), &OwnerToken::random());
    server
        .cli(&[command, &broken.keys().counter, value])
        .expect("break the counter");
    // Loads the script, so that the operations below share one call.
    batcher
        .release(broken.clone(), 0)
        .await
        .expect("warm-up release");

    let fine: Vec<_> = (0..10)
        .map(|i| {
            let claim = Claim::new(layout.keys(&format!("fine/{i}")), &OwnerToken::random());
            tokio::spawn(batcher.acquire(claim, TTL, false))
        })
        .collect();
    let failed = tokio::spawn(batcher.acquire(broken.clone(), TTL, false));
    let before = server.command_calls("evalsha").expect("INFO");
    let err = failed
        .await
        .unwrap()
        .expect_err("granted on a broken counter");
    assert!(err.to_string().contains(error), "{err}");
    for acquire in fine {
        assert!(
            matches!(
                acquire
                    .await
                    .unwrap()
                    .expect("an acquire sharing the call failed"),
                AcquireReply::Granted(_)
            ),
            "a fine lock was not granted"
        );
    }
    assert_eq!(
        server.command_calls("evalsha").expect("INFO") - before,
        1,
        "the operations did not share one call"
    );
    assert_eq!(
        server
            .cli(&["EXISTS", &broken.keys().lock])
            .expect("EXISTS")
            .trim(),
        "0",
        "the failed acquire left its grant behind"
    );
}

/// With the counter all locks share, an operation that fails (its lock's
/// key holds the wrong type) answers its error alone: the others in its
/// call are granted, and the counter still covers the highest token.
#[tokio::test(flavor = "current_thread")]
async fn with_a_shared_counter_a_failed_operation_spoils_nothing_else() {
    let server = RedisServer::start().expect("start redis");
    let layout = KeyLayout::default();
    let rule = TokenRule::SharedClockFloor {
        counter: layout.shared_counter().into(),
    };
    let batcher = batcher_on(&server, rule, Handout::AllAtOnce).await;
    let broken = Claim::new(layout.keys("broken"), &OwnerToken::random());
    server
        .cli(&["RPUSH", &broken.keys().lock, "not a grant"])
        .expect("RPUSH");
    // Loads the script, so that the operations below share one call.
    let warm_up = Claim::new(layout.keys("warm-up"), &OwnerToken::random());
    batcher.release(warm_up, 0).await.expect("warm-up release");

    let before = server.command_calls("evalsha").expect("INFO");
    let mut asked: Vec<_> = (0..5)
        .map(|i| {
            let claim = Claim::new(layout.keys(&format!("fine/{i}")), &OwnerToken::random());
            tokio::spawn(batcher.acquire(claim, TTL, false))
        })
        .collect();
    let failed = tokio::spawn(batcher.acquire(broken.clone(), TTL, false));
    asked.extend((5..10).map(|i| {
        let claim = Claim::new(layout.keys(&format!("fine/{i}")), &OwnerToken::random());
        tokio::spawn(batcher.acquire(claim, TTL, false))
    }));
    let err = failed.await.unwrap().expect_err("granted on a list");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let mut highest = 0;
    for acquire in asked {
        match acquire
            .await
            .unwrap()
            .expect("an acquire sharing the call failed")
        {
            AcquireReply::Granted(token) => highest = highest.max(token.get()),
            other => panic!("a fine lock was not granted: {other:?}"),
        }
    }
    assert_eq!(
        server.command_calls("evalsha").expect("INFO") - before,
        1,
        "the operations did not share one call"
    );
    let counter = common::shared_counter(&server, &layout);
    assert!(
        counter >= highest as i64,
        "counter {counter} below token {highest}"
    );
}

/// Acquires that say others wait (letter `w`), plain acquires
/// and releases, mixed in one call, under each way of taking tokens: every
/// operation reads its own arguments, so each answer is its own; only the
/// release of the grant acquired as waited for is published, and a refused
/// acquire marks the grant it found.
#[tokio::test(flavor = "current_thread")]
async fn a_call_mixing_waited_for_acquires_plain_acquires_and_releases_answers_each() {
    use lock_redis_wire::scripts::Operation;
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let layout = KeyLayout::default();
    let rules = common::every_rule(&layout);
    for (n, rule) in rules.iter().enumerate() {
        let [a, b, c] = ["a", "b", "c"].map(|k| layout.keys(&format!("mixed/{n}/{k}")));
        let (mine, theirs) = (OwnerToken::random().to_hex(), OwnerToken::random().to_hex());
        let waited = Operation::acquire(TTL, true);
        let plain = Operation::acquire(TTL, false);
        let release = Operation::Release { token: 0 };
        let published = server.command_calls("publish").expect("INFO");
        let answers = common::answers(
            &mut conn,
            rule,
            &[
                (&a, &mine, waited),
                (&b, &mine, plain),
                (&c, &mine, plain),
                (&c, &theirs, plain),
                (&b, &mine, release),
                (&a, &mine, release),
                (&c, &theirs, release),
            ],
        )
        .await;
        let [ta, tb, tc, refused, b_released, a_released, c_not_theirs] = answers[..] else {
            panic!("{rule:?}: seven answers expected, got {answers:?}");
        };
        assert!(
            ta >= 1 && tb >= 1 && tc >= 1,
            "{rule:?}: tokens {ta}, {tb}, {tc}"
        );
        // With one counter for all locks, tokens increase across locks too.
        if matches!(rule, TokenRule::SharedClockFloor { .. }) {
            assert!(
                tb > ta && tc > tb,
                "{rule:?}: {ta}, {tb}, {tc} do not increase"
            );
        }
        assert!(refused < -1, "{rule:?}: a held lock answered {refused}");
        assert_eq!(
            (b_released, a_released, c_not_theirs),
            (1, 1, 0),
            "{rule:?}: releases"
        );
        assert_eq!(
            server.command_calls("publish").expect("INFO") - published,
            1,
            "{rule:?}: only the release of the grant others wait for publishes"
        );
        // The refused acquire marked the grant it found.
        let c_value = server.cli(&["GET", &c.lock]).expect("GET");
        assert_eq!(c_value.trim(), format!("{mine}+"), "{rule:?}: C's grant");
    }
}
