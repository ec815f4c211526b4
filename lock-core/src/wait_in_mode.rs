//! Waiting for a grant in a mode other than the exclusive one (a
//! semaphore's permit): the polling loop with wake-ups of
//! [`poll_until_granted`](crate::wait::poll_until_granted), without a
//! waiting line. Waiters are granted in no particular order: whoever asks
//! first once a permit frees.

use std::time::Duration;

use tokio::time::Instant;

use crate::raw::{Grant, Waiting};
use crate::wait::WAITING_EVENT_TARGET;
use crate::{Error, LockBackend, LockKey, Mode, OwnerToken, Result};

/// Asks for `key` in `mode` until granted or `wait.until`: attempt; on
/// contention subscribe to release messages, attempt again, and sleep until
/// a message, the backoff delay, the earliest holder's reported expiry or
/// the end of the wait. Each retry asks with a fresh owner, as the
/// exclusive wait does (a failed attempt's give-back must not end a
/// retry's grant); a grant won by one says so in [`Grant::owner`].
pub async fn poll_mode_until_granted<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    owner: &OwnerToken,
    ttl: Duration,
    mode: Mode,
    wait: &Waiting,
) -> Result<Grant> {
    let mut tries: u32 = 0;
    let mut subscribed = false;
    let mut fresh: Option<OwnerToken> = None;
    loop {
        // Subscribed before the attempt, so that a release between a
        // refusal and the sleep still wakes us.
        let wake_up = match subscribed {
            true => backend.on_release(key).await,
            false => None,
        };
        let asking = fresh.as_ref().unwrap_or(owner);
        let sent = Instant::now();
        let (hint, last_error) = match backend.try_acquire_in(key, asking, ttl, mode).await {
            Ok(mut grant) => {
                grant.sent_at.get_or_insert(sent);
                return Ok(match fresh {
                    Some(won) => grant.for_owner(won),
                    None => grant,
                });
            }
            Err(Error::Contended { remaining, .. }) => (remaining, None),
            Err(e @ Error::Unavailable { .. }) => (None, Some(e)),
            Err(e) => return Err(e),
        };
        fresh = Some(OwnerToken::random());
        let now = Instant::now();
        if now >= wait.until {
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
        if let Some(remaining) = hint {
            // The first permit to expire frees by then unless renewed.
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
