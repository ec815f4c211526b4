//! Behaviour that needs a private Redis: restarts, pauses, passwords,
//! wake-ups measured against the poll interval, the operator view.

use lock_core::Wait;
use std::net::TcpListener;
use std::time::Duration;

use lock_core::{Backoff, Error, LockBackend, Locker, LockerOptions};
use lock_redis::{RedisBackend, RedisOptions};
use lock_testkit::RedisServer;
use tokio::time::{Instant, timeout};

const TTL: Duration = Duration::from_secs(30);

async fn connect(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(&server.url()).await.expect("connect")
}

/// Retries until the backend's connection is back after a restart.
async fn try_acquire_until_up(locker: &Locker, key: &str) -> lock_core::Lease {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        match locker.try_acquire(key, TTL).await {
            Ok(lease) => return lease,
            Err(e) if e.is_unavailable() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("no grant after the restart: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_a_restart_without_persistence() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(connect(&server).await);
    let mut last = 0;
    for _ in 0..3 {
        let lease = locker.try_acquire("restart/a", TTL).await.unwrap();
        assert!(lease.fencing_token().get() > last);
        last = lease.fencing_token().get();
        locker.release(lease).await.unwrap();
    }

    server.restart().expect("restart");
    assert_eq!(
        server.cli(&["DBSIZE"]).unwrap(),
        "0",
        "the restart kept the data: this test would prove nothing"
    );

    let lease = try_acquire_until_up(&locker, "restart/a").await;
    assert!(
        lease.fencing_token().get() > last,
        "token went backwards after the restart: {} after {last}",
        lease.fencing_token()
    );
    let next_token = lease.fencing_token().get();
    locker.release(lease).await.unwrap();
    let lease = locker.try_acquire("restart/a", TTL).await.unwrap();
    assert!(lease.fencing_token().get() > next_token);
}

/// A release publishes only when someone is known to wait: an uncontended
/// acquire and release cost the server no `PUBLISH`; an acquire refused on
/// a grant marks it, and its release then publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_someone_waits_for_is_published() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(connect(&server).await);
    for _ in 0..20 {
        let lease = locker.try_acquire("quiet", TTL).await.unwrap();
        locker.release(lease).await.unwrap();
    }
    assert_eq!(
        command_calls(&server, "publish"),
        0,
        "an uncontended release published"
    );

    let mut held = locker.try_acquire("wanted", TTL).await.unwrap();
    let refused = locker.try_acquire("wanted", TTL).await.unwrap_err();
    assert!(refused.is_contended(), "{refused}");
    // The mark leaves the grant its owner's: it still extends.
    locker
        .extend(&mut held, TTL)
        .await
        .expect("extend a marked grant");
    locker.release(held).await.unwrap();
    assert_eq!(
        command_calls(&server, "publish"),
        1,
        "the awaited release was not published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_message_not_by_polling() {
    let server = RedisServer::start().expect("start redis");
    // Places in line renewed every 20 s: no renewal within the test, so
    // every refused attempt counted is a waiter's own.
    let options = RedisOptions::from_url(&server.url())
        .unwrap()
        .waiter_lease(Duration::from_secs(60));
    let backend = RedisBackend::connect_with(options).await.unwrap();
    // Polls at most every 10 s (at least 5 s for the first): a handoff well
    // under that came from the release message.
    let poll = Backoff {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(10),
    };
    let locker = Locker::new(backend.clone()).with_options(LockerOptions::default().backoff(poll));
    let held = locker.try_acquire("handoff", TTL).await.unwrap();
    // Attempts share script calls (see the batcher), so they are counted
    // by what only a refused one runs: `PTTL`, for the holder's remaining
    // TTL; once, or twice for an attempt in line (which also reads the
    // line's own expiry).
    let refused_before = command_calls(&server, "pttl");
    let reads_before = command_calls(&server, "get");

    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let lease = locker
                    .acquire("handoff", TTL, Wait::at_most(Duration::from_secs(60)))
                    .await?;
                let woke = Instant::now();
                locker.release(lease).await?;
                Ok::<_, Error>(woke)
            })
        })
        .collect();
    // Every waiter has tried twice (before and after subscribing: the
    // second takes its place in line), lost, is subscribed, and has checked
    // the lock once subscribed: until the release, only those places and
    // that check read the lock with `GET`.
    timeout(Duration::from_secs(20), async {
        while subscribers(&server) != 1
            || command_calls(&server, "pttl") < refused_before + 9
            || command_calls(&server, "get") < reads_before + 6
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the waiters never subscribed");
    assert_eq!(
        pubsub_connections(&server),
        1,
        "waiters must share one subscription connection"
    );

    let released = Instant::now();
    locker.release(held).await.unwrap();
    for waiter in waiters {
        let woke = timeout(Duration::from_secs(60), waiter)
            .await
            .expect("waiter hung")
            .unwrap()
            .unwrap();
        assert!(
            woke - released < Duration::from_secs(2),
            "handoff took {:?}, as long as a poll: the release message did not wake the waiter",
            woke - released
        );
    }
    // Each release woke one waiter, the head of the line, which took the
    // lock: no attempt was refused after the release (a herd).
    assert_eq!(
        command_calls(&server, "pttl") - refused_before,
        9,
        "a release woke more than one waiter"
    );
    // The last waiter gone, the channel is unsubscribed.
    timeout(Duration::from_secs(20), async {
        while subscribers(&server) != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the release channel stayed subscribed after the waiters left");
}

/// A grant taken by a client that knew of no waiter is released without a
/// message. A waiter that finds such a grant once subscribed (taken while
/// it subscribed, after its refused attempt) marks it, so its release still
/// wakes the waiter. The wake-up future alone never polls: without the
/// message it would never complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_marks_the_grant_it_finds_once_subscribed_so_its_release_wakes_it() {
    let server = RedisServer::start().expect("start redis");
    let holder = Locker::new(connect(&server).await);
    let waiter = connect(&server).await;
    let held = holder.try_acquire("handoff", TTL).await.unwrap();
    assert!(
        !grant_value(&server).ends_with('+'),
        "marked before anyone waited"
    );

    let woken = woken_on_handoff(&waiter).await;
    until_subscribed_and_marked(
        &server,
        "the subscribed waiter did not mark the grant it found",
    )
    .await;

    holder.release(held).await.unwrap();
    timeout(Duration::from_secs(10), woken)
        .await
        .expect("the release of the grant found did not wake the waiter")
        .unwrap();
    assert_eq!(command_calls(&server, "publish"), 1);
}

/// An outage drops the subscription connection: the waiters are woken, and
/// later waiters subscribe again once the server is back, so release
/// messages still arrive, also for a lock whose waiters never all left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_messages_arrive_again_after_a_server_outage() {
    let server = RedisServer::start().expect("start redis");
    let holder = Locker::new(connect(&server).await);
    let waiter = connect(&server).await;
    let held = holder.try_acquire("handoff", TTL).await.unwrap();
    // Registered, never polled: the channel keeps a waiter throughout.
    let _stays = waiter
        .on_release(&handoff(&waiter))
        .await
        .expect("wake-ups");
    let first = woken_on_handoff(&waiter).await;
    until_subscribed_and_marked(&server, "the first waiter never subscribed").await;
    drop(held);

    server.kill().expect("kill");
    timeout(Duration::from_secs(10), first)
        .await
        .expect("the lost subscription did not wake the waiter")
        .unwrap();
    // The outage itself: longer than the client's reconnection attempts,
    // after which it reconnects only when asked to send something.
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().expect("restart");
    let held = try_acquire_until_up(&holder, "handoff").await;
    // As a waiting acquire does: an attempt, refused, then the wake-up.
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        match Locker::new(waiter.clone())
            .try_acquire("handoff", TTL)
            .await
        {
            Err(e) if e.is_contended() => break,
            Err(e) if e.is_unavailable() && Instant::now() < give_up => {}
            other => panic!("the waiter's attempt after the restart: {other:?}"),
        }
    }
    let second = woken_on_handoff(&waiter).await;
    until_subscribed_and_marked(
        &server,
        "the waiter did not subscribe again after the restart",
    )
    .await;
    holder.release(held).await.unwrap();
    timeout(Duration::from_secs(10), second)
        .await
        .expect("the release after the restart did not wake the waiter")
        .unwrap();
}

/// The lock `handoff`, as a backend names it.
fn handoff(backend: &RedisBackend) -> lock_core::LockKey {
    lock_core::raw::validate::key("handoff", &backend.capabilities().limits).unwrap()
}

/// `waiter`'s wake-up future for the lock `handoff`, running: it completes
/// when a release message (or a dropped subscription) wakes it.
async fn woken_on_handoff(waiter: &RedisBackend) -> tokio::task::JoinHandle<()> {
    tokio::spawn(waiter.on_release(&handoff(waiter)).await.expect("wake-ups"))
}

/// Waits until the lock `handoff` has a subscribed waiter whose check once
/// subscribed has run (the grant is marked as waited for); panics with
/// `what` after 10 s.
async fn until_subscribed_and_marked(server: &RedisServer, what: &str) {
    timeout(Duration::from_secs(10), async {
        while subscribers(server) != 1 || !grant_value(server).ends_with('+') {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

/// The value of the grant of the lock `handoff`: its owner token, with `+`
/// once marked as waited for.
fn grant_value(server: &RedisServer) -> String {
    server.cli(&["GET", "lockkit:{handoff}"]).unwrap()
}

/// How many of `waits` have ended (each timed out, as the key is held).
fn ended_waits(waits: &mut tokio::task::JoinSet<lock_core::Result<lock_core::Lease>>) -> usize {
    let mut ended = 0;
    while let Some(outcome) = waits.try_join_next() {
        match outcome.unwrap() {
            Err(Error::TimedOut { .. }) => ended += 1,
            other => panic!("a wait on a held key ended with {other:?}"),
        }
    }
    ended
}

/// A wait that ends while its SUBSCRIBE is still unanswered must not leave
/// the channel subscribed: the server would then push every later release of
/// that key to this client for nothing, one more channel per key ever waited on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_end_before_their_subscription_is_answered_leave_no_channel_subscribed() {
    const KEYS: usize = 200;
    let server = RedisServer::start().expect("start redis");
    let holder = Locker::new(connect(&server).await);
    let mut held = Vec::new();
    for i in 0..KEYS {
        held.push(
            holder
                .try_acquire(&format!("short/{i}"), TTL)
                .await
                .unwrap(),
        );
    }
    let backend = connect(&server).await;
    let locker =
        Locker::new(backend.clone()).with_options(LockerOptions::default().backoff(Backoff {
            initial: Duration::from_millis(2),
            max: Duration::from_millis(4),
        }));
    // A first wait opens the subscription connection while the server answers.
    let warm_up = locker
        .acquire("short/0", TTL, Wait::at_most(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(warm_up, Err(Error::TimedOut { .. })),
        "{warm_up:?}"
    );
    let subscribed_before = command_calls(&server, "subscribe");
    let mut waits = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let locker = locker.clone();
        waits.spawn(async move {
            locker
                .acquire(
                    &format!("short/{i}"),
                    TTL,
                    Wait::at_most(Duration::from_millis(30)),
                )
                .await
        });
    }
    // Stopping the server in bursts delays every reply past the waits' short
    // sleeps, so waits end with their SUBSCRIBE sent and unanswered.
    let mut ended = 0;
    while ended < KEYS {
        server.pause().unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        server.resume().unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        ended += ended_waits(&mut waits);
    }
    assert!(
        command_calls(&server, "subscribe") > subscribed_before,
        "none of the waits subscribed: this test would prove nothing"
    );

    // Every waiter is gone; the backend (and its subscription connection) lives on.
    let left = timeout(Duration::from_secs(20), async {
        loop {
            let channels = release_channels(&server);
            if channels == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        left.is_ok(),
        "{} release channels stay subscribed with no waiter left",
        release_channels(&server)
    );
    // Nor does a wait that ended early leave a place in any lock's line.
    let lines = || {
        server
            .cli(&["KEYS", "lockkit:*:queue"])
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .count()
    };
    let left = timeout(Duration::from_secs(20), async {
        while lines() != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        left.is_ok(),
        "{} waiting lines stay with no waiter left",
        lines()
    );
    drop(backend);
}

/// One acquire subscribes once, however many poll rounds its wait takes.
#[tokio::test]
async fn a_waiter_keeps_its_subscription_across_poll_rounds() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(connect(&server).await).with_options(
        LockerOptions::default().backoff(Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(2),
        }),
    );
    let _held = locker.try_acquire("rounds", TTL).await.unwrap();
    let polled = locker
        .acquire("rounds", TTL, Wait::at_most(Duration::from_millis(500)))
        .await;
    assert!(matches!(polled, Err(Error::TimedOut { .. })), "{polled:?}");
    // Each refused attempt asks the holder's remaining TTL (one in line
    // twice). In line, the waiter asks again every 40 × the backoff's
    // maximum (80 ms): some six rounds.
    let attempts = command_calls(&server, "pttl");
    assert!(
        attempts > 8,
        "only {attempts} attempts: too few rounds to tell"
    );
    assert_eq!(command_calls(&server, "subscribe"), 1);
    timeout(Duration::from_secs(20), async {
        while command_calls(&server, "unsubscribe") != 1 || release_channels(&server) != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the channel stayed subscribed after the wait");
}

fn release_channels(server: &RedisServer) -> usize {
    server
        .cli(&["PUBSUB", "CHANNELS", "lockkit:*"])
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .count()
}

/// How often the server ran `command`.
fn command_calls(server: &RedisServer, command: &str) -> u64 {
    server.command_calls(command).expect("INFO commandstats")
}

fn subscribers(server: &RedisServer) -> usize {
    server
        .cli(&["PUBSUB", "NUMSUB", "lockkit:{handoff}:released"])
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

fn pubsub_connections(server: &RedisServer) -> usize {
    server
        .cli(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .count()
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_within_the_connect_timeout() {
    // A port nobody listens on: refused at once.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let err = RedisBackend::connect(&format!("redis://:pw@127.0.0.1:{port}?timeout_ms=500"))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    assert!(err.is_unavailable(), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("redis://127.0.0.1:{port}")),
        "{err}"
    );

    // A server that accepts connections but never answers: the timeout decides.
    let server = RedisServer::start().expect("start redis");
    server.pause().unwrap();
    let started = Instant::now();
    let err = RedisBackend::connect(&format!("{}?timeout_ms=500", server.url()))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    server.resume().unwrap();
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains(&server.host_port()), "{err}");
    assert!(
        waited < Duration::from_millis(1500),
        "took {waited:?} with a 500 ms timeout"
    );
}

#[tokio::test]
async fn a_server_that_stops_answering_makes_operations_unavailable_within_the_response_timeout() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(
        RedisBackend::connect(&format!("{}?timeout_ms=500", server.url()))
            .await
            .unwrap(),
    );
    server.pause().unwrap();
    let started = Instant::now();
    let err = locker.try_acquire("paused", TTL).await.unwrap_err();
    let waited = started.elapsed();
    server.resume().unwrap();
    assert!(err.is_unavailable(), "{err}");
    assert!(
        waited < Duration::from_millis(1500),
        "took {waited:?} with a 500 ms timeout"
    );
}

#[tokio::test]
async fn an_acquire_the_server_runs_after_its_response_timeout_is_given_back() {
    let server = RedisServer::start().expect("start redis");
    let url = format!("{}?timeout_ms=500", server.url());
    let locker = Locker::new(RedisBackend::connect(&url).await.unwrap());
    // The script is loaded now, so the late acquire below finds it and grants.
    let warm_up = locker.try_acquire("warm-up", TTL).await.unwrap();
    locker.release(warm_up).await.unwrap();
    let scripts_run = server.command_calls("evalsha").unwrap();

    // Stopped, the server leaves the acquire unanswered past its timeout,
    // then runs it once it continues: a grant its caller never learns of,
    // for ten minutes unless the backend gives it back.
    server.pause().unwrap();
    let err = locker
        .try_acquire("late", Duration::from_secs(600))
        .await
        .unwrap_err();
    server.resume().unwrap();
    assert!(err.is_unavailable(), "{err}");
    timeout(Duration::from_secs(10), async {
        while server.command_calls("evalsha").unwrap() == scripts_run {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the server runs the acquire once it continues");

    let other = Locker::new(connect(&server).await);
    timeout(Duration::from_secs(10), async {
        loop {
            match other.try_acquire("late", TTL).await {
                Ok(lease) => return lease,
                Err(Error::Contended { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the late grant was given back, not left for its 10 minutes");
}

#[tokio::test]
async fn a_wrong_password_is_an_auth_error_without_the_password() {
    let server = RedisServer::start().expect("start redis");
    server
        .cli(&["CONFIG", "SET", "requirepass", "right-horse-battery"])
        .unwrap();
    let url = format!("redis://:wrong-staple-7f3a@{}", server.host_port());
    let err = RedisBackend::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(
            !shown.contains("wrong-staple-7f3a"),
            "password printed: {shown}"
        );
        assert!(
            shown.contains(&server.host_port()),
            "endpoint missing: {shown}"
        );
    }

    let backend = RedisBackend::connect(&format!(
        "redis://:right-horse-battery@{}",
        server.host_port()
    ))
    .await
    .unwrap();
    assert!(!format!("{backend:?}").contains("right-horse-battery"));
    Locker::new(backend).try_acquire("auth", TTL).await.unwrap();
}

#[tokio::test]
async fn the_operator_view_lists_held_locks_and_leaks() {
    let server = RedisServer::start().expect("start redis");
    let backend = RedisBackend::connect(&format!("{}/2?prefix=ops:", server.url()))
        .await
        .unwrap();
    let locker = Locker::new(backend.clone());
    let _a = locker.try_acquire("jobs/a", TTL).await.unwrap();
    let _b = locker
        .try_acquire("jobs/b}", Duration::from_secs(5))
        .await
        .unwrap();
    let _other = locker.try_acquire("other", TTL).await.unwrap();
    server
        .cli(&["-n", "2", "SET", "ops:{jobs/leak}", "x"])
        .unwrap();
    // A lock's own counter, as on a cluster (or left by an older version):
    // on one server it is not the holder's token.
    server
        .cli(&["-n", "2", "SET", "ops:{jobs/a}:fence", "7", "EX", "60"])
        .unwrap();

    let report = backend.report("jobs/").await.unwrap();
    let keys: Vec<&str> = report.held.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["jobs/a", "jobs/b}"]);
    assert!(report.held[0].remaining.unwrap() > Duration::from_secs(25));
    assert!(report.held[1].remaining.unwrap() <= Duration::from_secs(5));
    // One server's locks share one counter: no holder's token to show.
    assert_eq!(report.held[0].fencing_token, None);
    assert_eq!(report.held[1].fencing_token, None);
    assert_eq!(report.leaks, ["ops:{jobs/leak}"]);

    assert_eq!(locker.inspect("").await.unwrap().len(), 3);
    assert!(locker.force_release("jobs/a").await.unwrap());
    assert!(!locker.force_release("jobs/a").await.unwrap());
    assert_eq!(backend.inspect("jobs/").await.unwrap().len(), 1);
}

/// A counter ahead of the server's clock (restored from a backup taken on a
/// machine whose clock ran ahead, say) is respected: the next token is above
/// it, and the counter, one for all locks, is kept with no expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_ahead_of_the_clock_is_respected_and_kept() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(connect(&server).await);
    let lease = locker.try_acquire("ahead", TTL).await.unwrap();
    let ahead = lease.fencing_token().get() + 3_600_000_000; // an hour of microseconds
    locker.release(lease).await.unwrap();
    let counter = "lockkit:fence";
    server.cli(&["SET", counter, &ahead.to_string()]).unwrap();

    let lease = locker.try_acquire("ahead", TTL).await.unwrap();
    assert_eq!(lease.fencing_token().get(), ahead + 1);
    assert_eq!(
        server.cli(&["PTTL", counter]).unwrap(),
        "-1",
        "the counter expires"
    );
    locker.release(lease).await.unwrap();
    // Any lock's next token: the counter is shared.
    let lease = locker.try_acquire("another", TTL).await.unwrap();
    assert_eq!(lease.fencing_token().get(), ahead + 2);
    assert_eq!(
        server.cli(&["GET", counter]).unwrap(),
        (ahead + 2).to_string()
    );
}

/// Callers' acquires and releases that meet in the client's queue go out
/// together, one script call for many, and each still gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_share_script_calls_and_keep_their_own_answers() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(connect(&server).await);
    // Loads the script, so that no NOSCRIPT retry counts below.
    let lease = locker.try_acquire("batch/warm-up", TTL).await.unwrap();
    let ahead = lease.fencing_token().get() + 3_600_000_000;
    locker.release(lease).await.unwrap();
    // The shared counter an hour ahead of the clock: only the counter, not
    // the clock, then keeps each call's tokens above the last call's.
    server
        .cli(&["SET", "lockkit:fence", &ahead.to_string()])
        .unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();

    const TASKS: usize = 200;
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (locker, start) = (locker.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let key = format!("batch/{i}");
                let lease = locker.try_acquire(&key, TTL).await?;
                // Another owner's acquire in the same rush is refused.
                let rival = locker.try_acquire(&key, TTL).await.unwrap_err();
                assert!(rival.is_contended(), "{key}: {rival}");
                let first = lease.fencing_token();
                locker.release(lease).await?;
                let lease = locker.try_acquire(&key, TTL).await?;
                let last = lease.fencing_token();
                assert!(last > first, "{key}: token did not increase");
                locker.release(lease).await.map(|()| last.get())
            })
        })
        .collect();
    let mut highest = 0;
    for task in tasks {
        highest = highest.max(task.await.unwrap().expect("acquire and release"));
    }
    // A call granting many locks moves the shared counter past all its
    // tokens at its first grant.
    let counter: u64 = server
        .cli(&["GET", "lockkit:fence"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        counter >= highest,
        "the counter {counter} is below a token handed out, {highest}"
    );

    let operations = 5 * TASKS as u64;
    let calls = command_calls(&server, "evalsha");
    assert!(
        calls < operations / 2,
        "{calls} script calls for {operations} operations: they were not coalesced"
    );
    let left = server.cli(&["KEYS", "lockkit:{batch/*}"]).unwrap();
    assert!(
        left.trim().is_empty(),
        "grants or counters of locks left after every release succeeded: {left}"
    );
}

/// A shared counter of the wrong type fails the acquires with the server's
/// error and grants nothing, also when many share a script call. A refused
/// acquire and a release, which do not touch it, still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_shared_counter_fails_acquires_and_grants_nothing() {
    let server = RedisServer::start().expect("start redis");
    let locker = Locker::new(connect(&server).await);
    let held = locker.try_acquire("held", TTL).await.unwrap();
    server.cli(&["DEL", "lockkit:fence"]).unwrap();
    server
        .cli(&["RPUSH", "lockkit:fence", "not a counter"])
        .unwrap();

    let attempts: Vec<_> = (0..16)
        .map(|i| {
            let locker = locker.clone();
            tokio::spawn(async move { locker.try_acquire(&format!("broken/{i}"), TTL).await })
        })
        .collect();
    for attempt in attempts {
        let err = attempt
            .await
            .unwrap()
            .expect_err("granted on a broken counter");
        assert!(
            matches!(err, Error::Backend { .. }) && err.to_string().contains("WRONGTYPE"),
            "{err}"
        );
    }
    let left = server.cli(&["KEYS", "lockkit:{broken/*}"]).unwrap();
    assert!(
        left.trim().is_empty(),
        "failed acquires left grants behind: {left}"
    );
    let refused = locker.try_acquire("held", TTL).await.unwrap_err();
    assert!(refused.is_contended(), "{refused}");
    locker.release(held).await.expect("release");
    assert_eq!(server.cli(&["EXISTS", "lockkit:{held}"]).unwrap(), "0");
}
