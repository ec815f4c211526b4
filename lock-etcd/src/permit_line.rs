//! Waiting for a permit or a read hold in line: first come, first served,
//! herd-free. (How a reader waits for the writers ahead of it is in
//! [`crate::readers`].)
//!
//! A waiter puts its entry in the key's queue, as a permit does (see
//! [`crate::permits`]); it holds a permit once fewer than N entries are
//! ahead of it, by create revision. Entries only join behind and, once
//! deleted, never come back, so a waiter's place only moves forward, and
//! one that holds a permit keeps it. The lock's shared feed counts the
//! deletions of the entries ahead for the waiter ([`crate::countdown`]),
//! so a release wakes the one waiter it lets in, with no read; should the
//! feed break or lose count, the waiter reads where it stands after each
//! deletion, with the polling backstop.

use std::time::Duration;

use lock_core::raw::{Grant, Waiting};
use lock_core::{Error, LockKey, OwnerToken, Result};
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use crate::countdown::Told;
use crate::feed::{Counted, Subscription};
use crate::permits::Sharing;
use crate::queue::Ahead;
use crate::{Entry, EtcdBackend, backend_error, modes, reads};

impl EtcdBackend {
    /// Waits in line for `sharing` on `key` (one of N permits, or a read
    /// hold) until `wait.until`.
    pub(crate) async fn acquire_shared(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        sharing: Sharing,
        wait: &Waiting,
    ) -> Result<Grant> {
        let asked = sharing.mode();
        let value = modes::value(owner, asked);
        let queue = self.queue(key);
        let mut tries = 0u32;
        loop {
            // Joined before the entry is put, a live feed reports every
            // deletion after it.
            let joined = self.inner.feeds.join(queue.prefix());
            let enqueued = self.enqueue_permit(key, ttl, &value).await;
            let (entry, head, ahead) = match enqueued {
                Ok(enqueued) => enqueued,
                Err(e @ Error::Unavailable { .. }) => {
                    self.back_off(wait, &mut tries, e).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(conflict) = modes::conflict(key, head.as_ref(), asked) {
                entry.revoke.now().await;
                return Err(conflict);
            }
            // Nothing ahead: nothing to wait for, in either mode.
            let admitted = match sharing {
                Sharing::Permits(permits) => ahead < permits as usize,
                Sharing::Readers => ahead == 0,
            };
            if admitted {
                let sent = entry.sent;
                return Ok(entry.into_grant(sent));
            }
            let lease_id = entry.lease_id;
            // Queued: a release from here on lets the waiters in, in order.
            tracing::debug!(target: lock_core::WAITING_EVENT_TARGET, key = %key, "waiting");
            let waited = async {
                match sharing {
                    Sharing::Permits(permits) => {
                        let left = ahead + 1 - permits as usize;
                        self.wait_in_line(key, entry, joined, left, permits, ttl, wait)
                            .await
                    }
                    // Readers wait on a watch of their own.
                    Sharing::Readers => {
                        drop(joined);
                        self.wait_behind_writers(key, entry, ttl, wait).await
                    }
                }
            };
            match timeout_at(wait.until, waited).await {
                Ok(Ok(Some(grant))) => return Ok(grant),
                // The entry is gone (its lease ended): in line again.
                Ok(Ok(None)) => {}
                Ok(Err(e @ Error::Unavailable { .. })) => {
                    self.back_off(wait, &mut tries, e).await?;
                }
                Ok(Err(e)) => return Err(e),
                Err(_elapsed) => {
                    // Out of the line before reporting, so that the next
                    // contender does not find this entry ahead of it.
                    self.revoke_quietly(lease_id).await;
                    return Err(wait.timed_out(key));
                }
            }
        }
    }

    /// Sleeps the backoff delay after an unreachable cluster, or gives its
    /// error back once the wait is over.
    async fn back_off(&self, wait: &Waiting, tries: &mut u32, error: Error) -> Result<()> {
        let now = Instant::now();
        if now >= wait.until {
            return Err(error);
        }
        sleep(wait.backoff.delay(*tries).min(wait.until - now)).await;
        *tries = tries.saturating_add(1);
        Ok(())
    }

    /// Renews a waiting entry's lease, so that a wait longer than the TTL
    /// keeps its place; `refreshed` becomes when the renewal was sent.
    /// False when the lease is gone, and the entry with it.
    pub(crate) async fn renew_waiter(
        &self,
        key: &LockKey,
        lease_id: i64,
        refreshed: &mut Instant,
    ) -> Result<bool> {
        let sent = Instant::now();
        match self.keep_alive(key, lease_id).await {
            Ok(()) => {
                *refreshed = sent;
                Ok(true)
            }
            Err(Error::Lost { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Puts a waiter's entry; returns it, the queue's head, and how many
    /// entries are ahead of it.
    async fn enqueue_permit(
        &self,
        key: &LockKey,
        ttl: Duration,
        value: &str,
    ) -> Result<(Entry, Option<etcd_client::KeyValue>, usize)> {
        let queue = self.queue(key);
        let mut lease = self.lease_for(key, ttl).await?;
        let (resp, entry, revoke) = self
            .put_entry(key, ttl, &mut lease, |entry, lease_id| {
                queue.enqueue_permit(entry, lease_id, value)
            })
            .await?;
        if !resp.succeeded() {
            return Err(backend_error(
                "enqueue: an entry for a freshly granted lease already exists",
            ));
        }
        let revision = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| backend_error("enqueue: a reply without a revision"))?;
        let mut reads = reads(&resp);
        let (Some(head), Some(count)) = (reads.next(), reads.next()) else {
            return Err(backend_error("enqueue: a reply without the queue's count"));
        };
        let entry = Entry {
            entry,
            lease_id: lease.id,
            ttl_secs: ttl.as_secs() as i64,
            revision,
            sent: lease.renewed,
            ahead: Ahead::default(),
            revoke,
        };
        // The count includes the new entry, created after every other one.
        let ahead = usize::try_from(count.count() - 1).unwrap_or(0);
        Ok((entry, head.kvs().first().cloned(), ahead))
    }

    /// Waits until fewer than `permits` entries are ahead of `entry`, when
    /// `left` more deletions of entries ahead let it in. `Ok(None)`: the
    /// entry is gone (its lease ended), and the caller queues again.
    #[allow(clippy::too_many_arguments)]
    async fn wait_in_line(
        &self,
        key: &LockKey,
        entry: Entry,
        joined: Option<Subscription>,
        left: usize,
        permits: u32,
        ttl: Duration,
        wait: &Waiting,
    ) -> Result<Option<Grant>> {
        // Keep-alives while waiting, so a wait longer than the TTL keeps its place.
        let every = ttl / 3;
        let mut refreshed = entry.sent;
        let mut counted: Option<Counted> =
            joined.map(|feed| feed.count_down(&entry.entry, entry.revision, left));
        let mut tries = 0u32;
        loop {
            if let Some(countdown) = &mut counted {
                tokio::select! {
                    told = countdown.told() => match told {
                        Some(Told::Head) => {
                            return self.grant_head(key, entry, refreshed, ttl).await;
                        }
                        Some(Told::Gone) => return Ok(None),
                        // The feed lost count: read where we stand from now on.
                        None => counted = None,
                    },
                    _ = sleep_until(refreshed + every) => {
                        if !self.renew_waiter(key, entry.lease_id, &mut refreshed).await? {
                            return Ok(None);
                        }
                    }
                }
                continue;
            }
            // Subscribed before the read: a deletion after it wakes us.
            let feed = self
                .inner
                .feeds
                .join_or_start(
                    &self.client(),
                    self.queue(key).prefix(),
                    self.inner.response_timeout,
                )
                .await;
            let check = self
                .queue(key)
                .permits_ahead(&entry.entry, entry.revision, permits);
            let resp = self.txn("count the entries ahead", check).await?;
            let mut reads = reads(&resp);
            let (Some(ahead), Some(own)) = (reads.next(), reads.next()) else {
                return Err(backend_error("a reply without the entries ahead"));
            };
            if own.kvs().is_empty() {
                return Ok(None);
            }
            if ahead.kvs().len() < permits as usize {
                return self.grant_head(key, entry, refreshed, ttl).await;
            }
            let delay = wait.backoff.delay(tries);
            tries = tries.saturating_add(1);
            let woken = async {
                let woke = match feed {
                    Some(mut feed) => feed.next().await.is_some(),
                    None => false,
                };
                // A broken feed wakes no one: the backoff does.
                if !woke {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = woken => {}
                _ = sleep(delay) => {}
                _ = sleep_until(refreshed + every) => {
                    if !self.renew_waiter(key, entry.lease_id, &mut refreshed).await? {
                        return Ok(None);
                    }
                }
            }
        }
    }
}
