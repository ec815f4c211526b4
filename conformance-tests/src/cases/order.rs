//! Waiting order, on backends that claim one: first come, first served,
//! and a waiter that gives up leaves the line at once.

use lock_core::Wait;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{Stall, WaitingOrder};
use tokio::time::Instant;

use super::{LONG_TTL, within};
use crate::Fixture;
use crate::waiting_signal::waiting_signal;

/// How far apart arrivals must be for the backend to owe them their
/// order; `None` when it owes none.
fn arrival_gap(fx: &Fixture) -> Option<Duration> {
    match fx.locker.capabilities().waiting_order {
        WaitingOrder::Fifo { .. } => Some(Duration::ZERO),
        WaitingOrder::Within { within, .. } => Some(within),
        _ => None,
    }
}

/// Starts a waiter for `key` on `locker` and returns once it waits (the
/// backends' waiting event, emitted once it has its place in line). On its
/// grant it writes `name` to `granted`, then releases.
async fn start_waiter(
    locker: &lock_core::Locker,
    key: &str,
    name: usize,
    granted: &Arc<Mutex<Vec<usize>>>,
) -> tokio::task::JoinHandle<()> {
    let mut waiting = waiting_signal(key);
    let (locker, key, granted) = (locker.clone(), key.to_owned(), granted.clone());
    let waiter = tokio::spawn(async move {
        let lease = locker
            .acquire(&key, LONG_TTL, Wait::at_most(LONG_TTL * 2))
            .await
            .expect("the waiter's grant");
        granted.lock().expect("the grant order").push(name);
        locker.release(lease).await.expect("the waiter's release");
    });
    within(
        LONG_TTL,
        "the waiter starts to wait",
        waiting.wait_for(|&w| w),
    )
    .await
    .expect("the waiter's signal");
    waiter
}

/// Waiters that start to wait one after another, on two clients, are
/// granted in that order once the holder lets go.
pub async fn waiters_are_granted_in_order_of_arrival(fx: &Fixture) {
    let Some(gap) = arrival_gap(fx) else { return };
    let key = fx.key("arrival-order");
    let holder = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("holder's grant");
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for name in 0..4 {
        let locker = if name % 2 == 0 { &fx.locker } else { &fx.other };
        waiters.push(start_waiter(locker, &key, name, &granted).await);
        if !gap.is_zero() {
            // The bound the backend states: arrivals closer than this may swap.
            tokio::time::sleep(gap).await;
        }
    }
    fx.locker.release(holder).await.expect("release");
    for waiter in waiters {
        within(LONG_TTL, "every waiter's grant", waiter)
            .await
            .expect("waiter task");
    }
    assert_eq!(
        *granted.lock().unwrap(),
        [0, 1, 2, 3],
        "waiters were not granted in order of arrival"
    );
}

/// A waiter whose wait is dropped leaves the line at once: the waiter
/// behind it is granted on the release, without waiting out the dropped
/// one's place (half its lease, where places have one).
pub async fn a_cancelled_waiter_leaves_the_line(fx: &Fixture) {
    let Some(stall) = fx.locker.capabilities().waiting_order.stall() else {
        return;
    };
    let limit = match stall {
        Stall::WaiterLease(lease) => lease / 2,
        // The dropped waiter asks for LONG_TTL: a place kept until then
        // would show.
        _ => Duration::from_secs(5),
    };
    let key = fx.key("cancelled-leaves");
    let holder = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("holder's grant");
    let granted = Arc::new(Mutex::new(Vec::new()));
    let cancelled = start_waiter(&fx.other, &key, 0, &granted).await;
    let next = start_waiter(&fx.locker, &key, 1, &granted).await;
    cancelled.abort();
    assert!(
        cancelled.await.unwrap_err().is_cancelled(),
        "the first waiter was granted before it was cancelled"
    );
    let released_at = Instant::now();
    fx.locker.release(holder).await.expect("release");
    within(LONG_TTL, "the next waiter's grant", next)
        .await
        .expect("waiter task");
    let handoff = released_at.elapsed();
    assert_eq!(*granted.lock().unwrap(), [1]);
    assert!(
        handoff < limit,
        "the next waiter was granted {handoff:?} after the release: the cancelled waiter kept its place"
    );
}

/// How much later than the stated bound the next grant may come on a slow
/// machine: a few round trips and a scheduler's delay.
const KILL_SLACK: Duration = Duration::from_millis(500);

/// A waiter killed (SIGKILL, a process of its own) at the head of the line
/// holds up the next waiter's grant for no longer than the backend's
/// stated bound ([`Stall::bound`]), plus `KILL_SLACK`. Runs where the
/// fixture has a URL and places in line have a lease.
pub async fn a_waiter_killed_in_line_stalls_the_next_no_longer_than_the_bound(fx: &Fixture) {
    let Some(bound) = fx
        .locker
        .capabilities()
        .waiting_order
        .stall()
        .and_then(|s| s.bound())
    else {
        return;
    };
    let key = fx.key("killed-in-line");
    let Some(mut command) = fx.waiter_process(&key) else {
        return;
    };
    let holder = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("holder's grant");
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the waiter process");
    let stdout = child.stdout.take().expect("the waiter's output");
    let said = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
    });
    let said = within(LONG_TTL, "the waiter process waits", said)
        .await
        .expect("reading the waiter's output")
        .expect("the waiter's output");
    assert_eq!(said.trim(), "waiting", "the waiter process did not wait");
    let granted = Arc::new(Mutex::new(Vec::new()));
    let next = start_waiter(&fx.other, &key, 1, &granted).await;
    child.kill().expect("kill the waiter process");
    child.wait().expect("reap the waiter process");
    let released_at = Instant::now();
    fx.locker.release(holder).await.expect("release");
    within(LONG_TTL, "the next waiter's grant", next)
        .await
        .expect("waiter task");
    let stalled = released_at.elapsed();
    assert!(
        stalled <= bound + KILL_SLACK,
        "a waiter killed in line held the next one up for {stalled:?}; the stated bound is {bound:?}"
    );
}
