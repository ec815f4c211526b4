//! Semaphores and read holds: their holders share a key, each with an
//! entry of its own in the key's queue (see [`crate::queue`]), as the
//! exclusive lock's holder and waiters are.
//!
//! Every entry says the mode its key is held in ([`crate::modes`]). An
//! attempt that does not wait puts its entry only while there is room: for
//! a semaphore of N, fewer than N entries, all of it; for a reader, no
//! writer's entry (held or waiting) anywhere in the queue. Room is judged
//! from a read, and the put is made in a transaction that fails if any
//! entry was put since that read
//! ([`Queue::take_unless_changed`](crate::queue::Queue::take_unless_changed)).
//! Sharing the queue is what makes the modes exclude each other: the
//! exclusive lock's requests see the permits and readers as a held queue.
//! A permit's or a read hold's fencing token is its entry's create
//! revision, as an exclusive grant's is.

use std::time::Duration;

use etcd_client::{KeyValue, TxnOp, TxnResponse};
use lock_core::raw::Grant;
use lock_core::{Error, LockKey, Mode, OwnerToken, Result};

use crate::leases::EtcdLease;
use crate::queue::{Ahead, Queue};
use crate::{Entry, EtcdBackend, backend_error, modes, reads};

/// How many times one attempt looks at the queue again after entries were
/// put between its look and its request. Each retry means another
/// contender's request went through, so the queue moved on; past this,
/// the key is busy enough to answer `Contended`.
const RECOUNTS: u32 = 16;

/// A mode whose holders share a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// One of this many permits of a semaphore.
    Permits(u32),
    /// A reader of a read-write lock.
    Readers,
}

impl Sharing {
    pub(crate) fn mode(self) -> Mode {
        match self {
            Sharing::Permits(permits) => Mode::semaphore(permits),
            Sharing::Readers => Mode::Shared,
        }
    }
}

/// What a refused attempt's look at the queue found.
pub(crate) enum Room {
    /// Room at the revision of the look: ask again, on the condition that
    /// nothing was put since.
    Free,
    /// No room; the entry whose lease says when there may be, if known.
    Full(Option<KeyValue>),
}

impl EtcdBackend {
    /// One attempt at `sharing` on `key`: granted while there is room,
    /// and otherwise writes nothing.
    pub(crate) async fn try_share(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        sharing: Sharing,
    ) -> Result<Grant> {
        let value = modes::value(owner, sharing.mode());
        let queue = self.queue(key);
        let mut lease = self.lease_for(key, ttl).await?;
        let ttl_secs = ttl.as_secs() as i64;
        // 0 at first: a free key is taken in one request, with no look.
        let mut seen = 0;
        let mut recounts = 0;
        let refused = loop {
            let (resp, entry, mut revoke) = self
                .put_entry(key, ttl, &mut lease, |entry, lease_id| {
                    queue.take_unless_changed(entry, lease_id, &value, seen, look(&queue, sharing))
                })
                .await?;
            let revision = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| backend_error("take: a reply without a revision"))?;
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
            let room = match sharing {
                Sharing::Permits(permits) => room_for_permit(key, &resp, permits),
                Sharing::Readers => self.room_for_reader(key, &resp, revision).await,
            };
            match room {
                Ok(Room::Free) if recounts < RECOUNTS => {
                    // Room at `revision`: ask again, on the condition that
                    // nothing was put since.
                    seen = revision;
                    recounts += 1;
                }
                Ok(Room::Free) => break Ok(None),
                Ok(Room::Full(blocking)) => break Ok(blocking),
                Err(e) => break Err(e),
            }
        };
        let idle = EtcdLease {
            id: lease.id,
            ttl_secs,
            renewed: lease.renewed,
        };
        self.retire_lease(idle).await;
        let remaining = match refused? {
            Some(blocking) => self.remaining(blocking.lease()).await,
            None => None,
        };
        Err(Error::Contended {
            key: key.to_string(),
            remaining,
        })
    }
}

/// What a refused attempt reads, in the same revision: the queue's head
/// (its mode) and, for a reader, the newest entries (a writer among them).
fn look(queue: &Queue, sharing: Sharing) -> Vec<TxnOp> {
    match sharing {
        Sharing::Permits(_) => vec![queue.head_read()],
        Sharing::Readers => vec![queue.head_read(), queue.newest_read(None)],
    }
}

/// Room for one of `permits` permits, from a refused attempt's read of the
/// head (which counts the whole queue).
fn room_for_permit(key: &LockKey, resp: &TxnResponse, permits: u32) -> Result<Room> {
    let Some(read) = reads(resp).next() else {
        return Err(backend_error("permit: a refusal without the queue's head"));
    };
    let head = read.kvs().first().cloned();
    if let Some(conflict) = modes::conflict(key, head.as_ref(), Mode::semaphore(permits)) {
        return Err(conflict);
    }
    // The first permit by create revision: the first to expire when the
    // holders asked for the same TTL.
    Ok(if read.count() >= i64::from(permits) {
        Room::Full(head)
    } else {
        Room::Free
    })
}
