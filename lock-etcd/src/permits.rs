//! Semaphores: the permits of a key are entries of its queue (see
//! [`crate::queue`]), as the exclusive lock's holder and waiters are.
//!
//! A permit's entry carries the number of permits beside its owner token
//! (`{permits}:{owner token in hex}`), so that every holder says in which
//! mode the key is held, and a caller asking for another mode or number is
//! refused naming both. Every entry of a key held as a semaphore is a
//! holder: permit waiters put nothing in the queue, they ask again when an
//! entry is deleted. So a permit is granted when the queue holds fewer
//! entries than permits, all of that semaphore, in a transaction that fails
//! if any entry was put since they were counted
//! ([`Queue::take_permit`](crate::queue::Queue::take_permit)). Sharing the
//! queue is what makes the modes exclude each other: the exclusive lock's
//! requests see the permits as a held queue. A permit's fencing token is
//! its entry's create revision, as an exclusive grant's is.

use std::time::Duration;

use etcd_client::{KeyValue, TxnOpResponse};
use lock_core::raw::Grant;
use lock_core::{Error, LockKey, Mode, OwnerToken, Result};

use crate::leases::EtcdLease;
use crate::queue::Ahead;
use crate::{Entry, EtcdBackend, backend_error};

/// How many times one attempt counts the holders again after entries were
/// put between its count and its request. Each retry means another
/// contender's request went through, so the queue moved on; past this,
/// the semaphore is busy enough to answer `Contended`.
const RECOUNTS: u32 = 16;

/// The value of an entry granted to `owner` in `mode`.
pub(crate) fn value(owner: &OwnerToken, mode: Mode) -> String {
    match mode {
        Mode::Semaphore { permits } => format!("{permits}:{}", owner.to_hex()),
        _ => owner.to_hex(),
    }
}

/// The mode an entry's value says its key is held in. An owner token in hex
/// has no `:`, so a value without one is an exclusive grant's.
pub(crate) fn mode_of(value: &[u8]) -> Mode {
    let permits = value
        .iter()
        .position(|&b| b == b':')
        .and_then(|colon| std::str::from_utf8(&value[..colon]).ok()?.parse().ok());
    match permits {
        Some(permits) => Mode::semaphore(permits),
        None => Mode::Exclusive,
    }
}

/// The refusal of a caller asking for `asked` on a queue headed by `head`,
/// when `head` holds the key in another mode.
pub(crate) fn conflict(key: &LockKey, head: Option<&KeyValue>, asked: Mode) -> Option<Error> {
    let held = mode_of(head?.value());
    (held != asked).then(|| Error::ModeConflict {
        key: key.to_string(),
        held: Some(held),
        asked,
    })
}

impl EtcdBackend {
    /// One attempt at one of `permits` permits of `key`.
    pub(crate) async fn try_acquire_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        permits: u32,
    ) -> Result<Grant> {
        let asked = Mode::semaphore(permits);
        let value = value(owner, asked);
        let queue = self.queue(key);
        let mut lease = self.lease_for(key, ttl).await?;
        let ttl_secs = ttl.as_secs() as i64;
        // 0 at first: a free key is taken in one request, with no count.
        let mut seen = 0;
        let mut recounts = 0;
        let refused = loop {
            let (resp, entry, mut revoke) = self
                .put_entry(key, ttl, &mut lease, |entry, lease_id| {
                    queue.take_permit(entry, lease_id, &value, seen)
                })
                .await?;
            let revision = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| backend_error("permit: a reply without a revision"))?;
            if resp.succeeded() {
                let sent = lease.renewed;
                let entry = Entry {
                    entry,
                    lease_id: lease.id,
                    ttl_secs,
                    revision,
                    sent,
                    ahead: Ahead::default(),
                    revoke,
                };
                return Ok(entry.into_grant(sent));
            }
            // Nothing was put: the lease is bound to no entry.
            revoke.disarm();
            let Some(TxnOpResponse::Get(read)) = resp.op_responses().into_iter().next() else {
                break Err(backend_error("permit: a refusal without the queue's head"));
            };
            let head = read.kvs().first().cloned();
            if let Some(conflict) = conflict(key, head.as_ref(), asked) {
                break Err(conflict);
            }
            if read.count() >= i64::from(permits) || recounts == RECOUNTS {
                break Ok(head);
            }
            // Fewer holders than permits at `revision`: ask again, on the
            // condition that nothing was put since.
            seen = revision;
            recounts += 1;
        };
        let idle = EtcdLease {
            id: lease.id,
            ttl_secs,
            renewed: lease.renewed,
        };
        self.retire_lease(idle).await;
        let head = refused?;
        // The first permit by create revision: the first to expire when
        // the holders asked for the same TTL.
        let remaining = match head {
            Some(head) => self.remaining(head.lease()).await,
            None => None,
        };
        Err(Error::Contended {
            key: key.to_string(),
            remaining,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_says_its_mode() {
        let owner = OwnerToken::random();
        assert_eq!(
            mode_of(value(&owner, Mode::Exclusive).as_bytes()),
            Mode::Exclusive
        );
        let three = Mode::semaphore(3);
        assert_eq!(mode_of(value(&owner, three).as_bytes()), three);
        assert!(!value(&owner, three).starts_with(&owner.to_hex()));
    }
}
