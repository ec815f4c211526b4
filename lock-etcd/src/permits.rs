//! Semaphores and read holds: their holders share a key, each with an
//! entry of its own in the key's queue (see [`crate::queue`]), as the
//! exclusive lock's holder and waiters are.
//!
//! Every entry says the mode its key is held in ([`crate::modes`]). An
//! attempt that does not wait takes a free key in one put, with no look.
//! Otherwise it looks at the queue and writes nothing if there is no room:
//! for a semaphore of N, N entries or more; for a reader, a writer's entry
//! (held or waiting) anywhere in the queue. If there was room, it puts its
//! entry and reads, in the put's revision, the entries ahead of it (every
//! other one: all were created before it); should they leave no room
//! (another contender took the last permit, or a writer queued, since the
//! look), it deletes its entry and is refused. So other holders coming and
//! going never refuse an attempt on a key with room, and a refusal writes
//! nothing unless the key filled up between the look and the put.
//!
//! Sharing the queue is what makes the modes exclude each other: the
//! exclusive lock's requests see the permits and readers as a held queue.
//! A permit's or a read hold's fencing token is its entry's create
//! revision, as an exclusive grant's is.

use std::time::Duration;

use etcd_client::{KeyValue, TxnOp, TxnResponse};
use lock_core::raw::Grant;
use lock_core::{Error, LockKey, Mode, OwnerToken, Result};

use crate::leases::{EtcdLease, NewLease};
use crate::queue::{Ahead, Queue};
use crate::{Entry, EtcdBackend, backend_error, modes, reads};

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

/// What a look at the queue found.
pub(crate) enum Room {
    /// Room at the revision of the look.
    Free,
    /// No room; the entry whose lease says when there may be, if known.
    Full(Option<KeyValue>),
}

impl EtcdBackend {
    /// One attempt at `sharing` on `key`: granted while there is room.
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
        let (resp, entry, revoke) = self
            .put_entry(key, ttl, &mut lease, |entry, lease_id| {
                queue.take_if_empty(entry, lease_id, &value, look(&queue, sharing))
            })
            .await?;
        let entry = Entry {
            entry,
            lease_id: lease.id,
            ttl_secs: ttl.as_secs() as i64,
            revision: revision_of(&resp)?,
            sent: lease.renewed,
            ahead: Ahead::default(),
            revoke,
        };
        if resp.succeeded() {
            let sent = entry.sent;
            return Ok(entry.into_grant(sent));
        }
        // Nothing was put: the lease is bound to no entry.
        let Entry {
            mut revoke,
            revision,
            ..
        } = entry;
        revoke.disarm();
        let blocking = match self.room(key, &resp, revision, sharing, 0).await {
            Ok(Room::Free) => return self.put_and_look(key, ttl, lease, &value, sharing).await,
            Ok(Room::Full(blocking)) => Ok(blocking),
            Err(e) => Err(e),
        };
        let idle = EtcdLease {
            id: lease.id,
            ttl_secs: ttl.as_secs() as i64,
            renewed: lease.renewed,
        };
        self.retire_lease(idle).await;
        self.refuse(key, blocking?).await
    }

    /// Puts the entry of an attempt that found room, and reads in the same
    /// revision what is ahead of it: granted if there is still room;
    /// otherwise the entry is deleted again, and the attempt refused. No
    /// compare on what changed since the look: holders coming and going
    /// then cannot refuse an attempt on a key with room.
    async fn put_and_look(
        &self,
        key: &LockKey,
        ttl: Duration,
        mut lease: NewLease,
        value: &str,
        sharing: Sharing,
    ) -> Result<Grant> {
        let queue = self.queue(key);
        let (resp, entry, revoke) = self
            .put_entry(key, ttl, &mut lease, |entry, lease_id| {
                queue.put_and_look(entry, lease_id, value, look(&queue, sharing))
            })
            .await?;
        if !resp.succeeded() {
            return Err(backend_error(
                "try: an entry for a freshly granted lease already exists",
            ));
        }
        let entry = Entry {
            entry,
            lease_id: lease.id,
            ttl_secs: ttl.as_secs() as i64,
            revision: revision_of(&resp)?,
            sent: lease.renewed,
            ahead: Ahead::default(),
            revoke,
        };
        // The look counts the new entry: one of its own.
        match self.room(key, &resp, entry.revision, sharing, 1).await {
            Ok(Room::Free) => {
                let sent = entry.sent;
                Ok(entry.into_grant(sent))
            }
            Ok(Room::Full(blocking)) => {
                self.withdraw(entry, value).await;
                self.refuse(key, blocking).await
            }
            Err(e) => {
                self.withdraw(entry, value).await;
                Err(e)
            }
        }
    }

    /// Room for `sharing`, from a look at the queue (made at `revision`)
    /// that counted `own` entries of the caller's.
    async fn room(
        &self,
        key: &LockKey,
        resp: &TxnResponse,
        revision: i64,
        sharing: Sharing,
        own: i64,
    ) -> Result<Room> {
        match sharing {
            Sharing::Permits(permits) => room_for_permit(key, resp, permits, own),
            Sharing::Readers => self.room_for_reader(key, resp, revision).await,
        }
    }

    /// Deletes the entry of a refused attempt, its lease kept for the next
    /// acquire; if the delete fails, the lease is revoked, and the entry
    /// goes with it.
    async fn withdraw(&self, entry: Entry, value: &str) {
        let Entry {
            entry,
            lease_id,
            ttl_secs,
            revision,
            sent,
            mut revoke,
            ..
        } = entry;
        let delete = Queue::release(&entry, revision, value);
        match self.txn("withdraw a refused attempt", delete).await {
            Ok(resp) if resp.succeeded() => {
                revoke.disarm();
                let idle = EtcdLease {
                    id: lease_id,
                    ttl_secs,
                    renewed: sent,
                };
                self.retire_lease(idle).await;
            }
            _ => revoke.now().await,
        }
    }

    /// The refusal of an attempt, with the time left of the `blocking`
    /// entry's lease when there is one.
    async fn refuse(&self, key: &LockKey, blocking: Option<KeyValue>) -> Result<Grant> {
        let remaining = match blocking {
            Some(blocking) => self.remaining(blocking.lease()).await,
            None => None,
        };
        Err(Error::Contended {
            key: key.to_string(),
            remaining,
        })
    }
}

/// The revision of a reply: its entry's create revision when it put one.
fn revision_of(resp: &TxnResponse) -> Result<i64> {
    resp.header()
        .map(|h| h.revision())
        .ok_or_else(|| backend_error("take: a reply without a revision"))
}

/// What an attempt reads, in the same revision: the queue's head
/// (its mode) and, for a reader, the newest entries (a writer among them).
fn look(queue: &Queue, sharing: Sharing) -> Vec<TxnOp> {
    match sharing {
        Sharing::Permits(_) => vec![queue.head_read()],
        Sharing::Readers => vec![queue.head_read(), queue.newest_read(None)],
    }
}

/// Room for one of `permits` permits, from a look's read of the head
/// (which counts the whole queue, `own` entries of the caller's included).
fn room_for_permit(key: &LockKey, resp: &TxnResponse, permits: u32, own: i64) -> Result<Room> {
    let Some(read) = reads(resp).next() else {
        return Err(backend_error("permit: a look without the queue's head"));
    };
    let head = read.kvs().first().cloned();
    if let Some(conflict) = modes::conflict(key, head.as_ref(), Mode::semaphore(permits)) {
        return Err(conflict);
    }
    // The first permit by create revision: the first to expire when the
    // holders asked for the same TTL.
    Ok(if read.count() - own >= i64::from(permits) {
        Room::Full(head)
    } else {
        Room::Free
    })
}
