//! Waiting in a lock's queue until the entry heads it (etcd's own mutex
//! recipe, herd-free): the waiter waits for the deletion of the entry just
//! ahead of it, then looks at where it stands.
//!
//! Deletions come from the lock's shared feed ([`crate::feed`]) when one is
//! live, else from watches of the waiter's own ([`crate::wake`]).

use etcd_client::TxnOpResponse;
use lock_core::raw::{Grant, Waiting};
use lock_core::{Error, LockKey, Result};
use tokio::time::{Instant, sleep, sleep_until};

use crate::countdown::Told;
use crate::feed::{Counted, Subscription};
use crate::queue::{Ahead, Queue};
use crate::wake::{self, Watched};
use crate::{Entry, EtcdBackend, backend_error};

/// Where a queued entry stands.
enum Place {
    /// First in line: the lock is its own.
    Head,
    /// Behind these entries, as read at this revision.
    Behind(Ahead, i64),
    /// Gone from the queue: its lease ended.
    Gone,
}

/// What wakes the waiter when an entry ahead goes.
enum Wake {
    /// The lock's feed, counting down the entries ahead for the waiter.
    Counted(Counted),
    /// The lock's feed, and the entries ahead with the revision they were
    /// read at, once known: the feed reports every deletion after that.
    Feed(Subscription, Option<(Ahead, i64)>),
    /// Watches of the waiter's own, on the entry believed to be just ahead.
    Own(Option<Vec<u8>>),
}

/// What the waiter learned while it waited.
enum Learned {
    /// The entry waited for was deleted at this revision: read where we stand.
    Deleted(i64),
    /// Every entry ahead is gone, and our own is not: the lock is ours.
    Head,
    /// Our own entry was deleted (its lease revoked).
    Gone,
    /// The wake-up source broke.
    Broken,
    /// Time for a keep-alive.
    Renew,
}

impl EtcdBackend {
    /// Waits in the queue until `entry` heads it. `joined`: a place on the
    /// lock's feed taken before the entry was enqueued. `Ok(None)`: the entry
    /// vanished (its lease expired while the cluster was unreachable), so
    /// the caller enqueues again.
    pub(crate) async fn wait_in_queue(
        &self,
        key: &LockKey,
        mut entry: Entry,
        joined: Option<Subscription>,
        ttl: std::time::Duration,
        wait: &Waiting,
        last_error: &mut Option<Error>,
    ) -> Result<Option<Grant>> {
        // Queued: a release from here on passes the lock along the queue.
        tracing::debug!(target: lock_core::WAITING_EVENT_TARGET, key = %key, "waiting");
        let queue = self.queue(key);
        // Keep-alives while waiting, so a wait longer than the TTL keeps its place.
        let every = ttl / 3;
        let mut refreshed = entry.sent;
        let mut tries = 0u32;
        let ahead = std::mem::take(&mut entry.ahead);
        let mut wake = match joined {
            // Joined before the entry was created: the enqueue's read of the
            // entries ahead is covered.
            Some(feed) if !ahead.keys.is_empty() => match ahead.count {
                Some(left) => Wake::Counted(feed.count_down(&entry.entry, entry.revision, left)),
                None => Wake::Feed(feed, Some((ahead, entry.revision))),
            },
            other => {
                drop(other);
                let client = self.client();
                let timeout = self.inner.response_timeout;
                match self
                    .inner
                    .feeds
                    .join_or_start(&client, queue.prefix(), timeout)
                    .await
                {
                    // Joined after the entry was created: a check follows.
                    Some(feed) => Wake::Feed(feed, None),
                    None => Wake::Own(ahead.nearest().map(<[u8]>::to_vec)),
                }
            }
        };
        // The revision at which the entry waited for was deleted, once it was.
        let mut deleted_at = None;
        loop {
            if let Some(at) = deleted_at.take() {
                match self.local_check(&queue, &entry, at).await {
                    Some(Place::Head) => return self.grant_head(key, entry, refreshed, ttl).await,
                    Some(Place::Gone) => return Ok(None),
                    Some(Place::Behind(ahead, seen_at)) => match &mut wake {
                        Wake::Feed(_, known) => *known = Some((ahead, seen_at)),
                        Wake::Own(watching) => *watching = ahead.nearest().map(<[u8]>::to_vec),
                        // A countdown reports no single deletion to read after.
                        Wake::Counted(_) => {}
                    },
                    None => {
                        if let Wake::Feed(_, known) = &mut wake {
                            *known = None;
                        }
                    }
                }
            }
            let mut own_watch = None;
            let needs_check = match &wake {
                Wake::Counted(_) => false,
                Wake::Feed(_, known) => known.is_none(),
                Wake::Own(watching) => {
                    // The watch is set up before the check (not from the
                    // check's revision after it, which etcd would serve
                    // through its catch-up loop, up to 100 ms late). The check
                    // is a linearizable read, so it sees every revision the
                    // watch started after: if it still finds the watched
                    // entry, that entry's deletion will be reported.
                    if let Some(ahead) = watching {
                        own_watch = wake::Deletion::from_now(
                            self.client(),
                            ahead.clone(),
                            self.inner.response_timeout,
                        )
                        .await;
                    }
                    true
                }
            };
            if needs_check {
                let checked = self
                    .txn("queue check", queue.check(&entry.entry, entry.revision))
                    .await;
                let (ahead, revision) = match checked {
                    Ok(resp) => {
                        // The revision the entries ahead are known at: a
                        // reply without one must not pass for revision 0.
                        let Some(revision) = resp.header().map(|h| h.revision()) else {
                            return Err(backend_error("queue check: a reply without a revision"));
                        };
                        let mut reads = resp.op_responses().into_iter().map(|r| match r {
                            TxnOpResponse::Get(read) => Some(read),
                            _ => None,
                        });
                        let ahead = reads.next().flatten().map(|r| Ahead::of(&r));
                        let mine = reads.next().flatten().is_some_and(|r| !r.kvs().is_empty());
                        if !mine {
                            return Ok(None);
                        }
                        (ahead.unwrap_or_default(), revision)
                    }
                    Err(e @ Error::Unavailable { .. }) => {
                        // Keep our place while the lease may still live; retry.
                        if Instant::now() >= refreshed + ttl {
                            return Err(e);
                        }
                        *last_error = Some(e);
                        sleep(wait.backoff.delay(tries)).await;
                        tries = tries.saturating_add(1);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                tries = 0;
                let Some(nearest) = ahead.nearest() else {
                    return self.grant_head(key, entry, refreshed, ttl).await;
                };
                match &mut wake {
                    Wake::Counted(_) => {}
                    // The feed was registered before the check: it reports
                    // every deletion after the check's revision.
                    Wake::Feed(_, known) => *known = Some((ahead, revision)),
                    Wake::Own(watching) => {
                        if watching.as_deref() != Some(nearest) {
                            // Not yet watching the entry just ahead (another
                            // one is ahead now): watch it, then check again.
                            *watching = Some(nearest.to_vec());
                            continue;
                        }
                    }
                }
            }
            let renew_at = refreshed + every;
            let learned = {
                let own = entry.entry.as_slice();
                let news = async {
                    match &mut wake {
                        Wake::Counted(counted) => match counted.told().await {
                            Some(Told::Head) => Learned::Head,
                            Some(Told::Gone) => Learned::Gone,
                            None => Learned::Broken,
                        },
                        Wake::Feed(feed, Some((ahead, seen_at))) => {
                            wait_on_feed(feed, ahead, *seen_at, own, entry.revision).await
                        }
                        Wake::Feed(_, None) => Learned::Broken,
                        Wake::Own(_) => match own_watch {
                            Some(watch) => match watch.wait().await {
                                Watched::Deleted(at) => Learned::Deleted(at),
                                Watched::Broken => Learned::Broken,
                            },
                            None => Learned::Broken,
                        },
                    }
                };
                tokio::select! {
                    learned = news => learned,
                    () = sleep_until(renew_at) => Learned::Renew,
                }
            };
            match learned {
                Learned::Head => return self.grant_head(key, entry, refreshed, ttl).await,
                Learned::Gone => return Ok(None),
                // Gone: check at once, without watching it again first.
                Learned::Deleted(at) => {
                    if let Wake::Own(watching) = &mut wake {
                        *watching = None;
                    }
                    deleted_at = Some(at);
                }
                // The feed broke, fell behind or could not count: watches of
                // our own, after a check.
                Learned::Broken if matches!(wake, Wake::Feed(..) | Wake::Counted(_)) => {
                    wake = Wake::Own(None);
                }
                // Read again after a pause; a broken watch must not spin.
                Learned::Broken => sleep(wait.backoff.delay(0)).await,
                Learned::Renew => {
                    let sent = Instant::now();
                    match self.keep_alive(key, entry.lease_id).await {
                        Ok(()) => refreshed = sent,
                        Err(Error::Lost { .. }) => return Ok(None),
                        Err(e) => {
                            *last_error = Some(e);
                            if Instant::now() >= refreshed + ttl {
                                return Ok(None);
                            }
                            sleep(wait.backoff.delay(tries)).await;
                            tries = tries.saturating_add(1);
                        }
                    }
                }
            }
        }
    }

    /// Grants the lock to `entry`, found heading its queue (`refreshed`: when
    /// its last successful lease renewal was sent).
    pub(crate) async fn grant_head(
        &self,
        key: &LockKey,
        entry: Entry,
        refreshed: Instant,
        ttl: std::time::Duration,
    ) -> Result<Option<Grant>> {
        // The entry found heading the queue may belong to a lease that has
        // expired since, its revoke not yet committed (the gap Jepsen found
        // in etcd 3.4.3's lock), so the grant counts from a renewal known to
        // have succeeded.
        //
        // Why a recent renewal needs no new keep-alive: the lease grant or
        // keep-alive sent at `refreshed` succeeded, so the server runs the
        // lease's full TTL from no earlier than `refreshed` (the assumption
        // every deadline here rests on; a new leader only extends leases).
        // Until then only a revoke or a delete removes the entry, and a read
        // found nothing ahead of it, or the feed reported the deletion of
        // every entry a read had found ahead (and not of the entry itself):
        // entries queued later are behind it, and an entry gone from the
        // queue never comes back. So the lock is
        // ours until `refreshed` + TTL, and the Locker's deadline
        // (`refreshed` + TTL − drift margin, refused if already past) holds,
        // as for a grant at enqueue. A keep-alive now would only move the
        // deadline later: worth its round trip only once more than a tenth
        // of the TTL would be given up.
        let sent = if Instant::now() < refreshed + ttl / 10 {
            refreshed
        } else {
            let sent = Instant::now();
            match self.keep_alive(key, entry.lease_id).await {
                Ok(()) => sent,
                Err(Error::Lost { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        };
        Ok(Some(entry.into_grant(sent)))
    }

    /// After the entry ahead was deleted at revision `at`: where `entry`
    /// stands, read from the member's own copy at revision `at` or later,
    /// without the round to the leader a linearizable read costs. Safe
    /// because the answer at any one revision after our entry's creation
    /// stays true: entries join behind (a higher create revision), and an
    /// entry, once deleted, never comes back with its create revision.
    /// `None` if the deletion predates our entry, the member has not yet
    /// applied `at`, or it could not be read: the caller reads
    /// linearizably.
    async fn local_check(&self, queue: &Queue, entry: &Entry, at: i64) -> Option<Place> {
        // A deletion before our own entry was created is of an earlier entry
        // under the same key (leases are reused, and the key names the
        // lease): it says nothing about the entry ahead of ours now.
        if at <= entry.revision {
            return None;
        }
        let mut client = self.client();
        let options = queue.local_check(entry.revision);
        // Only a shortcut: a member slow to answer is passed over quickly.
        let read = client.get(queue.prefix(), Some(options));
        let resp = tokio::time::timeout(self.inner.response_timeout / 4, read)
            .await
            .ok()?
            .ok()?;
        let revision = resp.header().map_or(0, |h| h.revision());
        if revision < at {
            return None;
        }
        match Ahead::behind_own(&resp, &entry.entry) {
            Some(ahead) if ahead.keys.is_empty() => Some(Place::Head),
            Some(ahead) => Some(Place::Behind(ahead, revision)),
            None => Some(Place::Gone),
        }
    }
}

/// Follows the feed until it tells something: every entry in `ahead` (read
/// at revision `seen_at`) deleted after that revision makes the waiter the
/// head when they were all the entries ahead; when they were only the
/// nearest ones, the last deletion is reported so the waiter reads where it
/// stands. Our `own` entry (created at `created`) deleted means it is gone,
/// also when the same transaction deleted the last entry ahead.
///
/// A deletion under one of these keys at or before `seen_at` is of an
/// earlier entry under the same key (leases, and so keys, are reused), and
/// entries only join behind, so nothing else can come ahead.
async fn wait_on_feed(
    feed: &mut Subscription,
    ahead: &mut Ahead,
    seen_at: i64,
    own: &[u8],
    created: i64,
) -> Learned {
    loop {
        let Some(at_once) = feed.next().await else {
            return Learned::Broken;
        };
        let Some(revision) = at_once.first().map(|gone| gone.revision) else {
            continue;
        };
        if revision > created && at_once.iter().any(|gone| gone.key == own) {
            return Learned::Gone;
        }
        if revision <= seen_at {
            continue;
        }
        ahead
            .keys
            .retain(|key| !at_once.iter().any(|gone| gone.key == *key));
        if ahead.keys.is_empty() {
            return if ahead.all {
                Learned::Head
            } else {
                Learned::Deleted(revision)
            };
        }
    }
}
