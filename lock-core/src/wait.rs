//! Waiting for a lock: jittered exponential backoff, woken early by the
//! backend's release messages where it has them.

use std::time::Duration;

use tokio::time::Instant;

use crate::raw::{GiveBack, Grant, Place};
use crate::{Error, LockBackend, LockKey, Mode, OwnerToken, Result};

/// The target of the `DEBUG` event (message `waiting`, field `key`) an
/// acquire emits when it starts to wait, so that a release from then on is
/// one its wake-up is there for:
/// - the default strategy: refused once more after asking for release
///   messages (on a backend with a waiting line, that attempt takes the
///   wait's place in it), before its first sleep (or, while the server is
///   unreachable, before its first retry). Its wake-up catches a release
///   from then on, by the message or, on Redis, by the check it makes once
///   subscribed.
/// - etcd: its entry queued behind another. The queue's watch, or the check
///   that follows setting it up, sees the release.
/// - PostgreSQL: as its blocking `SELECT ... FOR UPDATE` goes out, which
///   the server queues while the row is held. So it comes for an
///   uncontended acquire too.
///
/// Tests await it rather than guess how long a waiter takes to get there.
pub const WAITING_EVENT_TARGET: &str = "lockkit::waiting";

/// How long to sleep between attempts while waiting: exponential from
/// `initial` to `max`, each delay drawn at random from its upper half so
/// that waiters do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The largest delay. With wake-ups this is only the backstop for a
    /// missed message, so it may be long.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(250),
        }
    }
}

impl Backoff {
    /// The delay before attempt number `attempt + 1`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self
            .initial
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        let half = ceiling / 2;
        // Random in [half, ceiling]: "equal jitter".
        let spread = half.as_nanos().min(u64::MAX as u128) as u64;
        let jitter = if spread == 0 {
            0
        } else {
            let draw = getrandom::u64().unwrap_or(0);
            // `spread + 1` overflows only for the whole of u64, where any draw is in range.
            spread.checked_add(1).map_or(draw, |range| draw % range)
        };
        half + Duration::from_nanos(jitter)
    }
}

/// A wait in progress: when it started, when it must give up, how to back off.
#[derive(Debug, Clone, Copy)]
pub struct Waiting {
    /// When the caller started waiting.
    pub started: Instant,
    /// When to give up with [`Error::TimedOut`].
    pub until: Instant,
    /// Delays between polls.
    pub backoff: Backoff,
}

impl Waiting {
    /// The error for a wait that ran out.
    pub fn timed_out(&self, key: &LockKey) -> Error {
        Error::TimedOut {
            key: key.to_string(),
            waited: self.started.elapsed(),
        }
    }
}

/// One attempt in `mode`, stamped with the instant before it was sent.
pub(crate) async fn attempt<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    owner: &OwnerToken,
    ttl: Duration,
    mode: Mode,
) -> Result<Grant> {
    let sent = Instant::now();
    let mut grant = match mode {
        Mode::Exclusive => backend.try_acquire(key, owner, ttl).await?,
        other => backend.try_acquire_in(key, owner, ttl, other).await?,
    };
    grant.sent_at.get_or_insert(sent);
    Ok(grant)
}

/// One attempt by the waiter at `place`, stamped like [`attempt`].
async fn attempt_in_line<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    owner: &OwnerToken,
    ttl: Duration,
    place: &Place,
) -> Result<Grant> {
    let sent = Instant::now();
    let mut grant = backend.try_acquire_queued(key, owner, ttl, place).await?;
    grant.sent_at.get_or_insert(sent);
    Ok(grant)
}

/// A wait that ends without a grant leaves the line (if it joined it) and
/// waits until the backend has its place back: a release right after the
/// wait's end then finds the waiter gone, rather than reserving the key for
/// it, and a newcomer's attempt is not refused for a waiter that gave up.
async fn leave_line<B: LockBackend + ?Sized, F: FnOnce()>(
    backend: &B,
    key: &LockKey,
    place: &Option<Place>,
    in_line: Option<GiveBack<F>>,
) {
    if let (Some(in_line), Some(place)) = (in_line, place) {
        in_line.disarm();
        backend.leave_queue(key, place).await;
    }
}

/// How many times [`Backoff::max`] a waiter in a line its backend keeps
/// (see [`LockBackend::keeps_places`]) waits before asking again on its
/// own (10 s by default): only as a last resort, since the backend wakes it
/// on its turn and covers a missed wake-up and a dead head itself. Each
/// waiter's own asking is what would make a crowd cost more per handoff
/// than a few waiters.
const KEPT_PLACE_BACKSTOP: u32 = 40;

/// The default waiting strategy: attempt; on contention subscribe to
/// release messages, attempt again, and sleep until a message, the backoff delay, the holder's
/// reported expiry or the end of the wait, whichever comes first.
///
/// An unreachable backend is retried like contention until the wait ends;
/// the last such error is returned then, since it says more than "timed out".
///
/// Each retry asks with a fresh owner token, and a grant won by one says so
/// ([`Grant::owner`]). An attempt that fails may leave grants that are
/// released after it: Redlock's minority grants, an acquire that the server
/// runs after its response timeout. Such a release is queued before the
/// retry, but a connection that fails and reconnects in between can deliver
/// it after the retry's grant. Under the same owner it would end that
/// grant; under another it finds nothing of its own.
///
/// On a backend that keeps a waiting line (its
/// [`WaitingOrder`](crate::WaitingOrder) has a waiter lease), the attempts
/// after the first take one [`Place`] in line, the same for the whole
/// wait, and wait for its turn ([`LockBackend::on_turn`]). They come at
/// least every third of the waiter lease, which keeps the place, unless
/// the backend keeps it ([`LockBackend::keeps_places`]); and a wait that
/// ends without a grant (it ran out, failed or was dropped) leaves the
/// line at once ([`LockBackend::leave_queue`]).
pub async fn poll_until_granted<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    owner: &OwnerToken,
    ttl: Duration,
    wait: &Waiting,
) -> Result<Grant> {
    poll_in_mode(backend, key, owner, ttl, Mode::Exclusive, wait).await
}

/// The default waiting strategy for a mode other than the exclusive one (a
/// semaphore's permit, a read hold): [`poll_until_granted`]'s attempts,
/// wake-ups and polling backstop, without a place in the waiting line,
/// which is the exclusive mode's. Such waiters are granted in no particular
/// order: whoever asks first once the key lets them in.
pub async fn poll_mode_until_granted<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    owner: &OwnerToken,
    ttl: Duration,
    mode: Mode,
    wait: &Waiting,
) -> Result<Grant> {
    poll_in_mode(backend, key, owner, ttl, mode, wait).await
}

/// The one waiting loop behind both; only the exclusive mode stands in line.
async fn poll_in_mode<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    owner: &OwnerToken,
    ttl: Duration,
    mode: Mode,
    wait: &Waiting,
) -> Result<Grant> {
    let mut tries: u32 = 0;
    let mut subscribed = false;
    // The owner of a retry, fresh for each; the first attempt asks with the
    // caller's.
    let mut fresh: Option<OwnerToken> = None;
    let waiter_lease = match mode {
        Mode::Exclusive => backend.capabilities().waiting_order.waiter_lease(),
        _ => None,
    };
    let place = waiter_lease.map(|_| Place::new());
    let kept = place.is_some() && backend.keeps_places();
    // Armed once the place may be in line: the first uncontended attempt
    // takes none, so it has nothing to leave.
    let mut in_line = None;
    loop {
        // The first attempt goes out unsubscribed, so an uncontended acquire
        // pays for no subscription. After a refusal, subscribe and attempt
        // again at once: a release between an attempt and the sleep then
        // still wakes us.
        let wake_up = match (subscribed, &place) {
            (false, _) => None,
            (true, None) => backend.on_release(key).await,
            (true, Some(place)) => backend.on_turn(key, place).await,
        };
        let asking = fresh.as_ref().unwrap_or(owner);
        let outcome = match (subscribed, &place) {
            (true, Some(place)) => {
                if in_line.is_none() {
                    in_line = Some(GiveBack::armed(|| drop(backend.leave_queue(key, place))));
                }
                attempt_in_line(backend, key, asking, ttl, place).await
            }
            _ => attempt(backend, key, asking, ttl, mode).await,
        };
        let (hint, last_error) = match outcome {
            Ok(grant) => {
                // Granted from the head of the line, the place left it.
                if let Some(in_line) = in_line.take() {
                    in_line.disarm();
                }
                return Ok(match fresh {
                    Some(won) => grant.for_owner(won),
                    None => grant,
                });
            }
            Err(Error::Contended { remaining, .. }) => (remaining, None),
            Err(e @ Error::Unavailable { .. }) => (None, Some(e)),
            Err(e) => {
                leave_line(backend, key, &place, in_line.take()).await;
                return Err(e);
            }
        };
        fresh = Some(OwnerToken::random());
        let now = Instant::now();
        if now >= wait.until {
            leave_line(backend, key, &place, in_line.take()).await;
            return Err(last_error.unwrap_or_else(|| wait.timed_out(key)));
        }
        if !subscribed && last_error.is_none() {
            subscribed = true;
            continue;
        }
        if tries == 0 {
            tracing::debug!(target: WAITING_EVENT_TARGET, key = %key, "waiting");
        }
        let mut delay = wait.backoff.delay(tries).min(wait.until - now);
        match waiter_lease {
            // In a kept line, waiting for the turn; an unreachable server is
            // retried as before.
            Some(_) if kept && in_line.is_some() && last_error.is_none() => {
                delay = wait
                    .backoff
                    .max
                    .saturating_mul(KEPT_PLACE_BACKSTOP)
                    .min(wait.until - now);
            }
            // Keeps the place, and looks past a head that died in line.
            Some(lease) => delay = delay.min(lease / 3),
            None => {}
        }
        if let Some(remaining) = hint {
            // The holder's grant ends by then unless renewed; 1 ms covers rounding.
            delay = delay.min(remaining + Duration::from_millis(1));
        }
        match wake_up {
            Some(woken) => {
                let _ = tokio::time::timeout(delay, woken).await;
            }
            None => tokio::time::sleep(delay).await,
        }
        subscribed = true;
        tries = tries.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_stays_in_bounds_and_jitters() {
        let b = Backoff {
            initial: Duration::from_millis(4),
            max: Duration::from_millis(100),
        };
        for attempt in 0..40 {
            let ceiling = Duration::from_millis(4)
                .saturating_mul(1 << attempt.min(16))
                .min(b.max);
            let d = b.delay(attempt);
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "attempt {attempt}: {d:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        let distinct: std::collections::HashSet<_> = (0..20).map(|_| b.delay(10)).collect();
        assert!(distinct.len() > 1, "no jitter");
    }
}
