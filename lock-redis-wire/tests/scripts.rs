//! The scripts against a private Redis, where their effect on the server is
//! the point.

mod common;

use std::time::Duration;

use lock_core::OwnerToken;
use lock_redis_wire::KeyLayout;
use lock_redis_wire::scripts::{Operation, TokenRule, mark_waited_for, run_batch};
use lock_testkit::RedisServer;

const TTL: Duration = Duration::from_secs(30);

/// Marking a grant as waited for keeps its owner (it still releases) and
/// its expiry (a mark never makes a grant outlive its TTL), marks once, and
/// makes its release publish; a free lock stays free.
#[tokio::test(flavor = "current_thread")]
async fn marking_a_grant_waited_for_keeps_its_owner_and_expiry() {
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let layout = KeyLayout::default();
    let keys = layout.keys("marked");
    let rule = TokenRule::SharedClockFloor {
        counter: layout.shared_counter().into(),
    };
    let owner = OwnerToken::random().to_hex();

    let free = mark_waited_for(&mut conn, &keys.lock).await.expect("mark");
    assert!(!free, "a free lock was reported held");
    assert_eq!(server.cli(&["EXISTS", &keys.lock]).unwrap(), "0");

    let acquire = Operation::acquire(TTL, false);
    let granted = run_batch(&mut conn, &rule, &[(&keys, &owner, acquire)])
        .await
        .expect("acquire");
    assert!(*granted[0].as_ref().expect("granted") >= 1);
    for _ in 0..2 {
        let held = mark_waited_for(&mut conn, &keys.lock).await.expect("mark");
        assert!(held, "a held lock was reported free");
        let value = server.cli(&["GET", &keys.lock]).unwrap();
        assert_eq!(value, format!("{owner}+"), "marked once, owner kept");
    }
    let pttl: i64 = server.cli(&["PTTL", &keys.lock]).unwrap().parse().unwrap();
    assert!(
        pttl > 0 && pttl <= TTL.as_millis() as i64,
        "the mark changed the expiry: PTTL {pttl}"
    );

    let release = Operation::Release { token: 7 };
    let released = run_batch(&mut conn, &rule, &[(&keys, &owner, release)])
        .await
        .expect("release");
    assert_eq!(*released[0].as_ref().expect("released"), 1);
    assert_eq!(server.command_calls("publish").expect("INFO"), 1);
}

/// An owner whose earlier acquire ran although it saw an error (a timeout,
/// a dropped connection) and asks again is granted anew, with a fresh,
/// higher token and the TTL asked now, keeping the grant's mark; another
/// owner is still refused. Under every token rule.
#[tokio::test(flavor = "current_thread")]
async fn an_owner_asking_again_is_granted_anew_with_a_higher_token() {
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let layout = KeyLayout::default();
    let rules = common::every_rule(&layout);
    for (n, rule) in rules.iter().enumerate() {
        let keys = layout.keys(&format!("again/{n}"));
        let (owner, other) = (OwnerToken::random().to_hex(), OwnerToken::random().to_hex());
        let short = Operation::acquire(Duration::from_secs(5), false);
        let marked = Operation::acquire(TTL, true);
        let answers = common::answers(
            &mut conn,
            rule,
            &[
                (&keys, &owner, short),
                (&keys, &other, short),
                (&keys, &owner, marked),
                (&keys, &owner, short),
            ],
        )
        .await;
        let [first, refused, again, once_more] = answers[..] else {
            panic!("{rule:?}: four answers expected, got {answers:?}");
        };
        assert!(first >= 1, "{rule:?}: first grant {first}");
        assert!(refused < -1, "{rule:?}: another owner answered {refused}");
        assert!(
            again > first && once_more > again,
            "{rule:?}: tokens {first}, {again}, {once_more} do not increase"
        );
        let value = server.cli(&["GET", &keys.lock]).unwrap();
        assert_eq!(value, format!("{owner}+"), "{rule:?}: the mark was lost");
        let pttl: i64 = server.cli(&["PTTL", &keys.lock]).unwrap().parse().unwrap();
        assert!(
            pttl > 0 && pttl <= 5000,
            "{rule:?}: the last acquire's TTL was not applied: PTTL {pttl}"
        );
    }
}

/// Acquires of different TTLs in one call, plain and waited for, under each
/// way of taking tokens: the call names one TTL for all and gives the
/// others their own, and each grant expires after its own.
#[tokio::test(flavor = "current_thread")]
async fn acquires_of_different_ttls_in_one_call_each_keep_their_own() {
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let layout = KeyLayout::default();
    let (short, long) = (Duration::from_secs(20), Duration::from_secs(600));
    for (n, rule) in common::every_rule(&layout).iter().enumerate() {
        let [a, b, c, d] = ["a", "b", "c", "d"].map(|k| layout.keys(&format!("ttls/{n}/{k}")));
        let owner = OwnerToken::random().to_hex();
        let asked = [
            (&a, short, false),
            (&b, long, false),
            (&c, long, true),
            (&d, short, true),
        ];
        let operations: Vec<_> = asked
            .iter()
            .map(|(keys, ttl, waited)| (*keys, &owner, Operation::acquire(*ttl, *waited)))
            .collect();
        let tokens = common::answers(&mut conn, rule, &operations).await;
        assert!(
            tokens.iter().all(|t| *t >= 1),
            "{rule:?}: not all granted: {tokens:?}"
        );
        for (keys, ttl, waited) in asked {
            let pttl: u64 = server
                .cli(&["PTTL", &keys.lock])
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let ttl = ttl.as_millis() as u64;
            assert!(
                pttl <= ttl && pttl > ttl - 10_000,
                "{rule:?}: {} asked {ttl} ms and has {pttl} ms left",
                keys.lock
            );
            let value = server.cli(&["GET", &keys.lock]).unwrap();
            let marked = if waited { "+" } else { "" };
            assert_eq!(
                value.trim(),
                format!("{owner}{marked}"),
                "{rule:?}: {}",
                keys.lock
            );
        }
    }
}

/// A shared counter found ahead of the server's clock (written back, or
/// left by a batch moments ago) is continued above: the call's tokens pass
/// it and increase, and the counter covers the highest of them.
#[tokio::test(flavor = "current_thread")]
async fn a_shared_counter_ahead_of_the_clock_is_continued_above() {
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let layout = KeyLayout::default();
    let rule = TokenRule::SharedClockFloor {
        counter: layout.shared_counter().into(),
    };
    // An hour ahead of the clock, in µs.
    let time = server.cli(&["TIME"]).expect("TIME");
    let seconds: u64 = time.lines().next().unwrap().trim().parse().unwrap();
    let ahead = (seconds + 3600) * 1_000_000;
    server
        .cli(&["SET", &layout.shared_counter(), &ahead.to_string()])
        .expect("SET");
    let owner = OwnerToken::random().to_hex();
    let keys: Vec<_> = (0..3).map(|i| layout.keys(&format!("ahead/{i}"))).collect();
    let operations: Vec<_> = keys
        .iter()
        .map(|k| (k, &owner, Operation::acquire(TTL, false)))
        .collect();
    let tokens = common::answers(&mut conn, &rule, &operations).await;
    let ahead = ahead as i64;
    assert_eq!(
        tokens,
        [ahead + 1, ahead + 2, ahead + 3],
        "the tokens do not continue the counter"
    );
    let counter = common::shared_counter(&server, &layout);
    assert!(
        counter >= ahead + 3,
        "counter {counter} below the last token"
    );
}

/// An owner asking again, now saying that others wait, marks the grant it
/// is granted anew, so that its release will publish.
#[tokio::test(flavor = "current_thread")]
async fn an_owner_asking_again_as_waited_for_marks_its_grant() {
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let layout = KeyLayout::default();
    for (n, rule) in common::every_rule(&layout).iter().enumerate() {
        let keys = layout.keys(&format!("again-marked/{n}"));
        let owner = OwnerToken::random().to_hex();
        let answers = common::answers(
            &mut conn,
            rule,
            &[
                (&keys, &owner, Operation::acquire(TTL, false)),
                (&keys, &owner, Operation::acquire(TTL, true)),
            ],
        )
        .await;
        assert!(
            answers[1] > answers[0] && answers[0] >= 1,
            "{rule:?}: {answers:?}"
        );
        let value = server.cli(&["GET", &keys.lock]).unwrap();
        assert_eq!(value, format!("{owner}+"), "{rule:?}: not marked");
    }
}

/// The shared counter runs ahead of a call's tokens by the acquires the
/// call did not grant, never by its other operations: a call of two
/// granted acquires among releases leaves it at its highest token.
#[tokio::test(flavor = "current_thread")]
async fn the_shared_counter_is_moved_by_acquires_not_by_releases() {
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let layout = KeyLayout::default();
    let rule = TokenRule::SharedClockFloor {
        counter: layout.shared_counter().into(),
    };
    let owner = OwnerToken::random().to_hex();
    let keys: Vec<_> = (0..7).map(|i| layout.keys(&format!("drift/{i}"))).collect();
    let acquire = Operation::acquire(TTL, false);
    let release = Operation::Release { token: 0 };
    let mut operations = vec![(&keys[0], &owner, acquire)];
    operations.extend(keys[1..6].iter().map(|k| (k, &owner, release)));
    operations.push((&keys[6], &owner, acquire));
    let answers = common::answers(&mut conn, &rule, &operations).await;
    let (first, last) = (answers[0], answers[6]);
    assert_eq!(last, first + 1, "tokens {answers:?}");
    let counter = common::shared_counter(&server, &layout);
    assert_eq!(counter, last, "the counter ran ahead of the call's tokens");

    // A refused acquire before the call's first grant moves nothing either.
    let theirs = OwnerToken::random().to_hex();
    let taken = layout.keys("drift/taken");
    common::answers(&mut conn, &rule, &[(&taken, &theirs, acquire)]).await;
    let fresh: Vec<_> = (0..2)
        .map(|i| layout.keys(&format!("drift/fresh/{i}")))
        .collect();
    let answers = common::answers(
        &mut conn,
        &rule,
        &[
            (&taken, &owner, acquire),
            (&fresh[0], &owner, acquire),
            (&fresh[1], &owner, acquire),
        ],
    )
    .await;
    assert!(answers[0] < 0, "a held lock was granted: {answers:?}");
    assert_eq!(answers[2], answers[1] + 1, "tokens {answers:?}");
    let counter = common::shared_counter(&server, &layout);
    assert_eq!(counter, answers[2], "the refused acquire moved the counter");
}

/// A call naming an operation the script does not know is refused before
/// any operation runs: nothing is granted.
#[tokio::test(flavor = "current_thread")]
async fn a_call_with_an_unknown_operation_writes_nothing() {
    use lock_redis_wire::scripts::Scripts;
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let layout = KeyLayout::default();
    let keys = layout.keys("unknown/a");
    let owner = OwnerToken::random().to_hex();
    // Loads the script.
    common::answers(
        &mut conn,
        &TokenRule::ClockFloor,
        &[(&keys, &owner, Operation::Release { token: 0 })],
    )
    .await;
    let refused: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
        .arg(Scripts::get().batch.get_hash())
        .arg(3)
        .arg(&keys.lock)
        .arg(&keys.counter)
        .arg(&keys.lock)
        .arg("clock-floor")
        .arg("ax")
        .arg(10_000)
        .arg(&owner)
        .arg(&owner)
        .query_async(&mut conn)
        .await;
    let err = refused.expect_err("an unknown operation was run");
    assert!(err.to_string().contains("unknown lock operation"), "{err}");
    let value = server.cli(&["EXISTS", &keys.lock]).unwrap();
    assert_eq!(value.trim(), "0", "the acquire before it was granted");
}

/// Stamped places (Redlock's) stand in order of their stamps whatever
/// order they joined in, so that independent nodes agree on the order; a
/// grant given back (`y`) puts its place back in that order and hands the
/// turn to the line's head, which may be another waiter (a split between
/// nodes settles on the earliest) or the giver itself.
#[tokio::test(flavor = "current_thread")]
async fn stamped_places_stand_in_stamp_order_and_a_given_back_grant_keeps_its_place() {
    use lock_redis_wire::scripts::{AcquireReply, acquire_in_line, give_back_turn};
    let server = RedisServer::start().expect("start redis");
    let mut conn = common::connect(&server).await;
    let keys = KeyLayout::default().keys("stamped");
    let rule = TokenRule::CounterFirst;
    let lease = Duration::from_secs(10);
    let session = "a".repeat(32);
    let place =
        |stamp: u64, id: char| format!("{session}{stamp:016x}{}", id.to_string().repeat(32));
    let (early, middle, late) = (place(1, 'e'), place(2, 'm'), place(3, 'l'));
    let holder = OwnerToken::random();
    let acquire = Operation::acquire(TTL, false);
    run_batch(&mut conn, &rule, &[(&keys, &holder.to_hex(), acquire)])
        .await
        .expect("the holder's grant");
    // They reach this node out of order: late, early, middle.
    for p in [&late, &early, &middle] {
        let owner = OwnerToken::random();
        let reply = acquire_in_line(&mut conn, &rule, &keys, &owner, p, TTL, lease)
            .await
            .expect("join");
        assert!(matches!(reply, AcquireReply::Contended(_)), "{reply:?}");
    }
    let queue = format!("{}:queue", keys.lock);
    let line = || server.cli(&["LRANGE", &queue, "0", "-1"]).unwrap();
    assert_eq!(line(), [early.as_str(), &middle, &late].join("\n"));

    // As if `early` had not reached this node yet: the key frees, and
    // `middle`, at the head, is granted here (its place leaves the line).
    server.cli(&["LREM", &queue, "0", &early]).unwrap();
    server.cli(&["DEL", &keys.lock]).unwrap();
    let owner = OwnerToken::random();
    let granted = acquire_in_line(&mut conn, &rule, &keys, &owner, &middle, TTL, lease)
        .await
        .expect("middle's attempt");
    assert!(matches!(granted, AcquireReply::Granted(_)), "{granted:?}");
    assert_eq!(line(), late);
    // `early` arrives; `middle` made no majority elsewhere and gives back.
    let reply = acquire_in_line(
        &mut conn,
        &rule,
        &keys,
        &OwnerToken::random(),
        &early,
        TTL,
        lease,
    )
    .await
    .expect("early joins");
    assert!(matches!(reply, AcquireReply::Contended(_)), "{reply:?}");
    assert!(
        give_back_turn(&mut conn, &keys, &owner, &middle, lease)
            .await
            .expect("give back")
    );
    assert_eq!(line(), [early.as_str(), &middle, &late].join("\n"));
    assert_eq!(
        server.cli(&["GET", &keys.lock]).unwrap(),
        format!("~{early}"),
        "the turn went to the head, the earliest stamp"
    );
    // A grant it does not hold is not given back.
    assert!(
        !give_back_turn(&mut conn, &keys, &owner, &middle, lease)
            .await
            .expect("give back")
    );
}
