//! Permits and read holds through the batcher, against a private Redis:
//! many callers' operations share calls, as the exclusive lock's do; a
//! call mixing them with exclusive operations answers each, with tokens
//! from the one counter; a flushed script is loaded again.

mod common;

use std::time::Duration;

use lock_core::OwnerToken;
use lock_redis_wire::holds::{self, HoldAnswer, HoldOperation};
use lock_redis_wire::scripts;
use lock_redis_wire::socket::Dial;
use lock_redis_wire::{AcquireReply, Batcher, Claim, Handout, KeyLayout, Timeouts, TokenRule};
use lock_testkit::RedisServer;

const TTL: Duration = Duration::from_secs(30);

fn shared_rule(layout: &KeyLayout) -> TokenRule {
    TokenRule::SharedClockFloor {
        counter: layout.shared_counter().into(),
    }
}

/// Operations per call of the holds script when `callers` tasks each take
/// and give back a permit (or, `read`, a read hold) of a key of their own
/// `pairs` times through one batcher, on a current-thread runtime.
async fn hold_operations_per_call(read: bool, callers: usize, pairs: usize) -> f64 {
    let server = RedisServer::start().expect("start redis");
    let layout = KeyLayout::default();
    let batcher = Batcher::start(
        common::connect(&server).await,
        shared_rule(&layout),
        Handout::AllAtOnce,
    );
    let (acquire, release) = match read {
        true => (HoldOperation::acquire_read(TTL), HoldOperation::ReleaseRead),
        false => (
            HoldOperation::acquire_permit(TTL, 2),
            HoldOperation::ReleasePermit { permits: 2 },
        ),
    };
    // Loads the script, so that the calls counted are the callers'.
    let warm_up = Claim::new(layout.keys("warm-up"), &OwnerToken::random());
    batcher.hold(warm_up, release).await.expect("warm-up");
    let before = server.command_calls("evalsha").expect("INFO");
    let texts_before = server.command_calls("eval").expect("INFO");
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (batcher, owner) = (batcher.clone(), OwnerToken::random());
            let claim = Claim::new(layout.keys(&format!("caller/{i}")), &owner);
            tokio::spawn(async move {
                for _ in 0..pairs {
                    let granted = batcher.hold(claim.clone(), acquire).await;
                    assert!(
                        matches!(granted, Ok(HoldAnswer::Granted(_))),
                        "a key of its own is granted: {granted:?}"
                    );
                    let released = batcher.hold(claim.clone(), release).await;
                    assert_eq!(released.expect("release"), HoldAnswer::Done(true));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("caller");
    }
    let calls = server.command_calls("evalsha").expect("INFO") - before;
    assert_eq!(
        server.command_calls("eval").expect("INFO"),
        texts_before,
        "no call fell back to the script's text"
    );
    (callers * pairs * 2) as f64 / calls as f64
}

/// 64 callers' permits and read holds go out together, as their exclusive
/// locks would: every call carries most of them, not one.
#[tokio::test(flavor = "current_thread")]
async fn many_callers_permits_and_read_holds_share_calls() {
    for read in [false, true] {
        let per_call = hold_operations_per_call(read, 64, 10).await;
        assert!(
            per_call > 32.0,
            "read={read}: {per_call:.1} operations per call, expected the 64 callers in step"
        );
    }
}

/// One call mixing exclusive acquires, permits and read holds (the batcher
/// splits it by script, in order) answers each, and the tokens, taken from
/// the one counter, increase in the order asked.
#[tokio::test(flavor = "current_thread")]
async fn exclusive_locks_permits_and_read_holds_asked_together_are_each_answered() {
    let server = RedisServer::start().expect("start redis");
    let layout = KeyLayout::default();
    let batcher = Batcher::start(
        common::connect(&server).await,
        shared_rule(&layout),
        Handout::AllAtOnce,
    );
    let claim = |name: &str| Claim::new(layout.keys(name), &OwnerToken::random());
    let (lock, permit, read, second_permit) = (
        claim("lock"),
        claim("permits"),
        claim("doc"),
        claim("permits"),
    );
    // Asked one after another, before the batcher runs.
    let first = batcher.acquire(lock.clone(), TTL, false);
    let second = batcher.hold(permit.clone(), HoldOperation::acquire_permit(TTL, 1));
    let third = batcher.hold(read.clone(), HoldOperation::acquire_read(TTL));
    let fourth = batcher.hold(second_permit, HoldOperation::acquire_permit(TTL, 1));
    let wrong_mode = batcher.hold(lock.clone(), HoldOperation::acquire_read(TTL));
    let (first, second, third, fourth, wrong_mode) =
        tokio::join!(first, second, third, fourth, wrong_mode);
    let AcquireReply::Granted(first) = first.expect("exclusive acquire") else {
        panic!("the exclusive lock was not granted");
    };
    let HoldAnswer::Granted(second) = second.expect("permit") else {
        panic!("the permit was not granted");
    };
    let HoldAnswer::Granted(third) = third.expect("read hold") else {
        panic!("the read hold was not granted");
    };
    assert!(
        first < second && second < third,
        "tokens {first:?} {second:?} {third:?}"
    );
    assert!(
        matches!(fourth.expect("second permit"), HoldAnswer::Busy(Some(_))),
        "the semaphore of one permit was full"
    );
    assert!(
        matches!(
            wrong_mode.expect("read of a writer's key"),
            HoldAnswer::Busy(_)
        ),
        "a read hold of a key a writer holds is refused"
    );
    let counter = common::shared_counter(&server, &layout);
    assert!(
        counter >= third.get() as i64,
        "the counter {counter} covers the highest token {third:?}"
    );
    for (claim, release) in [
        (permit, HoldOperation::ReleasePermit { permits: 1 }),
        (read, HoldOperation::ReleaseRead),
    ] {
        let released = batcher.hold(claim, release).await.expect("release");
        assert_eq!(released, HoldAnswer::Done(true));
    }
    assert!(batcher.release(lock, first.get()).await.expect("release"));
}

/// On the batcher's own socket, a server whose scripts were flushed is
/// sent the holds script's text and answers as before.
#[tokio::test]
async fn a_flushed_holds_script_is_loaded_again() {
    let server = RedisServer::start().expect("start redis");
    let layout = KeyLayout::default();
    let info = redis::IntoConnectionInfo::into_connection_info(server.url()).expect("url");
    let dial = Dial::plain_tcp(&info, Timeouts::default()).expect("plain TCP");
    let batcher = Batcher::connect(dial, shared_rule(&layout), Handout::InRounds)
        .await
        .expect("connect");
    let claim = Claim::new(layout.keys("flushed"), &OwnerToken::random());
    for round in 0..2 {
        server.cli(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
        let granted = batcher
            .hold(claim.clone(), HoldOperation::acquire_permit(TTL, 3))
            .await
            .expect("acquire");
        assert!(
            matches!(granted, HoldAnswer::Granted(_)),
            "round {round}: {granted:?}"
        );
        let extended = batcher
            .hold(claim.clone(), HoldOperation::extend_permit(TTL))
            .await
            .expect("extend");
        assert_eq!(extended, HoldAnswer::Done(true), "round {round}");
        let released = batcher
            .hold(claim.clone(), HoldOperation::ReleasePermit { permits: 3 })
            .await
            .expect("release");
        assert_eq!(released, HoldAnswer::Done(true), "round {round}");
    }
    assert!(
        server.command_calls("eval").expect("INFO") >= 2,
        "the text was sent"
    );
}

/// A read hold the operator removed stays lost when a new reader comes:
/// the readers go with the marker, so the new reader does not find the old
/// ones beside it.
#[tokio::test(flavor = "current_thread")]
async fn a_force_released_read_hold_stays_lost_after_the_next_reader() {
    let server = RedisServer::start().expect("start redis");
    let layout = KeyLayout::default();
    let rule = shared_rule(&layout);
    let mut conn = common::connect(&server).await;
    let keys = layout.keys("doc");
    let (old, new) = (OwnerToken::random(), OwnerToken::random());
    let take = HoldOperation::acquire_read(TTL);
    let run = |conn: &mut redis::aio::MultiplexedConnection, owner: &OwnerToken, op| {
        let (mut conn, keys, owner, rule) =
            (conn.clone(), keys.clone(), owner.clone(), rule.clone());
        async move { holds::run_hold(&mut conn, &rule, &keys, &owner, op).await }
    };
    let granted = run(&mut conn, &old, take).await.expect("first reader");
    assert!(matches!(granted, HoldAnswer::Granted(_)), "{granted:?}");
    assert!(
        scripts::force_release(&mut conn, &keys)
            .await
            .expect("force release"),
        "the marker was there"
    );
    let granted = run(&mut conn, &new, take).await.expect("next reader");
    assert!(matches!(granted, HoldAnswer::Granted(_)), "{granted:?}");
    let extended = run(&mut conn, &old, HoldOperation::extend_read(TTL)).await;
    assert_eq!(
        extended.expect("extend"),
        HoldAnswer::Done(false),
        "the removed reader was extended"
    );
    let released = run(&mut conn, &new, HoldOperation::ReleaseRead).await;
    assert_eq!(released.expect("release"), HoldAnswer::Done(true));
}

/// The operator's force release removes the marker and the readers in one
/// command: between two, a reader could set a new marker and join the set
/// the second deletes, its marker then blocking writers with no reader.
#[tokio::test(flavor = "current_thread")]
async fn a_force_release_removes_marker_and_readers_in_one_command() {
    let server = RedisServer::start().expect("start redis");
    let layout = KeyLayout::default();
    let mut conn = common::connect(&server).await;
    let keys = layout.keys("doc");
    let granted = holds::run_hold(
        &mut conn,
        &shared_rule(&layout),
        &keys,
        &OwnerToken::random(),
        HoldOperation::acquire_read(TTL),
    )
    .await
    .expect("reader");
    assert!(matches!(granted, HoldAnswer::Granted(_)), "{granted:?}");
    let before = server.command_calls("del").expect("INFO");
    assert!(
        scripts::force_release(&mut conn, &keys)
            .await
            .expect("force release")
    );
    assert_eq!(server.command_calls("del").expect("INFO") - before, 1);
    let left = server
        .cli(&["EXISTS", &keys.lock, &format!("{}:readers", keys.lock)])
        .expect("EXISTS");
    assert_eq!(left.trim(), "0", "the marker or the readers stayed");
}

/// A reader that finds a semaphore touches only the keys its call names
/// (a cluster's rule for scripts): a user allowed those keys alone is
/// answered the semaphore's number of permits.
#[tokio::test(flavor = "current_thread")]
async fn a_reader_at_a_semaphore_reads_only_the_keys_it_names() {
    let server = RedisServer::start().expect("start redis");
    let layout = KeyLayout::default();
    let rule = shared_rule(&layout);
    let mut conn = common::connect(&server).await;
    let keys = layout.keys("jobs");
    let permit = HoldOperation::acquire_permit(TTL, 3);
    let granted = holds::run_hold(&mut conn, &rule, &keys, &OwnerToken::random(), permit)
        .await
        .expect("permit");
    assert!(matches!(granted, HoldAnswer::Granted(_)), "{granted:?}");
    let lock = &keys.lock;
    let allowed = [
        lock.clone(),
        format!("{lock}:readers"),
        format!("{lock}:queue"),
        format!("{lock}:leases"),
        layout.shared_counter().to_string(),
    ];
    let mut acl = vec!["ACL", "SETUSER", "reader", "on", ">secret", "+@all"];
    let patterns: Vec<String> = allowed.iter().map(|key| format!("~{key}")).collect();
    acl.extend(patterns.iter().map(String::as_str));
    server.cli(&acl).expect("ACL SETUSER");
    let url = format!("redis://reader:secret@{}", server.host_port());
    let mut reader = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect as the reader");
    let answer = holds::run_hold(
        &mut reader,
        &rule,
        &keys,
        &OwnerToken::random(),
        HoldOperation::acquire_read(TTL),
    )
    .await
    .expect("the reader's call touches no key it does not name");
    assert_eq!(answer, HoldAnswer::Semaphore(3));
}

/// Under the counter-first rule (quorum fencing), a permit's token is the
/// lock's counter plus one, as an exclusive grant's is, not the clock.
#[tokio::test(flavor = "current_thread")]
async fn a_permit_under_the_counter_first_rule_counts_on_from_the_counter() {
    let server = RedisServer::start().expect("start redis");
    let layout = KeyLayout::default();
    let mut conn = common::connect(&server).await;
    let keys = layout.keys("jobs");
    server
        .cli(&["SET", &keys.counter, "41", "PX", "60000"])
        .expect("SET");
    for (owner, expected) in [(OwnerToken::random(), 42), (OwnerToken::random(), 43)] {
        let answer = holds::run_hold(
            &mut conn,
            &TokenRule::CounterFirst,
            &keys,
            &owner,
            HoldOperation::acquire_permit(TTL, 2),
        )
        .await
        .expect("permit");
        assert_eq!(
            answer,
            HoldAnswer::Granted(lock_core::FencingToken::new(expected))
        );
    }
}
