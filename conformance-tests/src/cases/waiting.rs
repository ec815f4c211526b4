//! `acquire` with a wait: success after release, clean time-outs, cancellation.

use lock_core::Wait;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_core::{Backoff, Error, WakeUp};
use tokio::time::Instant;

use super::{LONG_TTL, SLACK, expiry_wait, short, within};
use crate::Fixture;
use crate::waiting_signal::waiting_signal;

/// A waiter on another client gets the lock soon after the holder
/// releases. Where the backend wakes waiters, the waiter's polling is set
/// to once a minute and its lease is renewed (which may re-check the
/// queue) only every 40 s, so a handoff within 5 s is the wake-up's doing.
/// The release comes once the waiter has said it waits (the backends'
/// waiting event).
pub async fn acquire_succeeds_soon_after_release(fx: &Fixture) {
    let key = fx.key("handoff");
    let holder = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("holder's grant");
    let mut options = *fx.other.options();
    if fx.other.capabilities().wake_up != WakeUp::Polling {
        options.backoff = Backoff {
            initial: Duration::from_secs(60),
            max: Duration::from_secs(60),
        };
    }
    let mut waiting = waiting_signal(&key);
    let waiter = {
        let (locker, key) = (fx.other.clone().with_options(options), key.clone());
        tokio::spawn(async move {
            let lease = locker
                .acquire(&key, LONG_TTL * 4, Wait::at_most(LONG_TTL * 2))
                .await;
            (lease, Instant::now())
        })
    };
    within(
        LONG_TTL,
        "the waiter starts to wait",
        waiting.wait_for(|&started| started),
    )
    .await
    .expect("the waiter's signal");
    assert!(!waiter.is_finished(), "the waiter did not wait");
    let released_at = Instant::now();
    fx.locker.release(holder).await.expect("release");
    let (lease, granted_at) = within(LONG_TTL, "the waiter's grant", waiter)
        .await
        .expect("waiter task");
    let lease = lease.expect("the waiter gets the lock");
    let handoff = granted_at - released_at;
    assert!(
        handoff < Duration::from_secs(5),
        "handoff took {handoff:?}: the waiter was not woken by the release"
    );
    fx.other.release(lease).await.expect("release");
}

/// A wait that runs out returns `TimedOut` after about the wait, leaves the
/// holder alone and leaves no grant of its own behind.
pub async fn acquire_times_out_cleanly(fx: &Fixture) {
    let key = fx.key("timeout");
    let holder = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("holder's grant");
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    match within(
        SLACK,
        "the wait gives up",
        fx.locker.acquire(&key, LONG_TTL, Wait::at_most(wait)),
    )
    .await
    {
        Err(Error::TimedOut { key: k, .. }) => assert_eq!(k, key),
        other => panic!("expected timed out, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= wait,
        "gave up after {waited:?}, before the {wait:?} wait"
    );
    fx.locker
        .release(holder)
        .await
        .expect("the holder still holds the lock");
    let next = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("the timed-out waiter left no grant");
    fx.locker.release(next).await.expect("release");
}

/// Dropping an `acquire` at various moments around a release never leaves a
/// grant behind longer than its TTL. The waiter may have been granted first
/// (its lease is then dropped unreleased) or not.
pub async fn cancelled_acquire_leaves_no_grant_beyond_its_ttl(fx: &Fixture) {
    let key = fx.key("cancelled");
    let ttl = short(fx);
    let mut holder = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("holder's grant");
    for delay_ms in [0u64, 1, 3, 10, 30] {
        let waiter = {
            let (locker, key) = (fx.locker.clone(), key.clone());
            tokio::spawn(async move { locker.acquire(&key, ttl, Wait::at_most(LONG_TTL)).await })
        };
        tokio::task::yield_now().await;
        fx.locker.release(holder).await.expect("release");
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        waiter.abort();
        match waiter.await {
            // Granted first: the lease is dropped unreleased. Or granted too
            // late for the short TTL, which the lease reports as lost.
            Ok(Ok(_) | Err(Error::Lost { .. })) => {}
            Ok(Err(e)) => panic!("the wait failed before its cancellation at {delay_ms} ms: {e}"),
            Err(cancelled) => assert!(cancelled.is_cancelled(), "{cancelled}"),
        }
        // Whatever the cancelled waiter got lapses within its TTL.
        holder = within(
            expiry_wait(ttl) + SLACK,
            "the key frees after a cancelled acquire",
            fx.locker
                .acquire(&key, LONG_TTL, Wait::at_most(expiry_wait(ttl))),
        )
        .await
        .unwrap_or_else(|e| panic!("after cancelling at {delay_ms} ms: {e}"));
    }
    fx.locker.release(holder).await.expect("release");
}

/// An attempt dropped while it is on its way (a `select!` or a time-out
/// around it) gives back at once whatever it was granted: another client
/// finds the key free long before the grant's TTL. The attempts are dropped
/// at moments spread from 0 to four times what an attempt takes here (eight
/// if that was not enough), so that some are dropped before they are sent
/// (at 0: before the task first runs), some while the server runs them,
/// some as their answer arrives, and some after they finished (an attempt
/// after a drop may take longer than the ones timed: PostgreSQL, say, opens
/// a connection in place of the dropped one's). Unless the backend answers
/// within an attempt's first poll (the in-memory one), the case checks that
/// some attempt was dropped after it started.
pub async fn dropped_attempt_gives_its_grant_back_at_once(fx: &Fixture) {
    // Far longer than the case waits for the key: a grant left behind fails it.
    let ttl = fx.short_ttl(Duration::from_secs(3600));
    let (takes, on_first_poll) = attempt_time(fx, ttl).await;
    let step = takes / 10;
    let (mut dropped_on_its_way, mut finished) = (0, 0);
    for round in 0..80u32 {
        let straddled = dropped_on_its_way > 0 && finished > 0;
        if round == 40 && (straddled || on_first_poll) {
            break;
        }
        let key = fx.key(&format!("dropped-{round}"));
        let started = Arc::new(AtomicBool::new(false));
        let attempt = {
            let (locker, key, started) = (fx.locker.clone(), key.clone(), started.clone());
            tokio::spawn(async move {
                started.store(true, Ordering::SeqCst);
                locker.try_acquire(&key, ttl).await
            })
        };
        // A busy wait, since a timer's granularity is 1 ms.
        let drop_at = Instant::now() + step * round;
        while Instant::now() < drop_at {
            tokio::task::yield_now().await;
        }
        attempt.abort();
        match attempt.await {
            // It finished first: its lease is the caller's to release.
            Ok(Ok(lease)) => {
                finished += 1;
                fx.locker.release(lease).await.expect("release");
            }
            // A slow server (a Redlock node past its timeout): whatever
            // that attempt left must be gone too.
            Ok(Err(Error::Unavailable { .. })) => finished += 1,
            Ok(Err(e)) => panic!("round {round}: the attempt failed: {e}"),
            Err(cancelled) => {
                assert!(cancelled.is_cancelled(), "round {round}: {cancelled}");
                if started.load(Ordering::SeqCst) {
                    dropped_on_its_way += 1;
                }
            }
        }
        let dropped_at = format!("dropped at {:?}", step * round);
        let lease = within(
            SLACK,
            &format!("the key is free long before the TTL of an attempt {dropped_at}"),
            fx.other.acquire(&key, LONG_TTL, Wait::at_most(SLACK)),
        )
        .await
        .unwrap_or_else(|e| panic!("an attempt {dropped_at}: {e}"));
        fx.other.release(lease).await.expect("release");
    }
    if !on_first_poll {
        assert!(
            dropped_on_its_way > 0,
            "no attempt was dropped on its way ({takes:?} each): {finished} finished first, the others were dropped before they started"
        );
    }
}

/// What one uncontended attempt takes here (the median of three, after one
/// to warm up), and whether the backend answers within an attempt's first
/// poll, so that it cannot be dropped on its way.
async fn attempt_time(fx: &Fixture, ttl: Duration) -> (Duration, bool) {
    let key = fx.key("dropped-timing");
    let lease = fx.locker.try_acquire(&key, ttl).await.expect("grant");
    fx.locker.release(lease).await.expect("release");
    let mut times = Vec::new();
    let mut on_first_poll = true;
    for _ in 0..3 {
        let started = Instant::now();
        let mut attempt = std::pin::pin!(fx.locker.try_acquire(&key, ttl));
        let mut polls = 0;
        let lease = std::future::poll_fn(|cx| {
            polls += 1;
            attempt.as_mut().poll(cx)
        })
        .await
        .expect("grant");
        times.push(started.elapsed());
        on_first_poll &= polls == 1;
        fx.locker.release(lease).await.expect("release");
    }
    times.sort();
    (times[1], on_first_poll)
}
