//! One watch per lock queue, shared by all of this backend's waiters on
//! that lock: the queue's feed of deletions.
//!
//! Without it, every wait sets up watches of its own on the entry ahead
//! (each a gRPC stream the cluster sets up and tears down) and reads the
//! queue linearizably once they are in place, because a watch registered
//! while a write lands is served late. A feed is set up once, when a waiter
//! first finds the lock held, and lives while any waiter of this backend
//! uses it. A contender that enqueues while the feed is live needs neither:
//! the feed already covers every deletion after its entry was created, each
//! with the deleted entry's create revision, and the enqueue told it how
//! many entries are ahead; the feed counts their deletions for it
//! ([`crate::countdown`]) and wakes it when it heads the queue. Each release
//! then reaches this backend as one event, which wakes only the waiter whose
//! entry was just behind. Waiters that know only the nearest entries ahead
//! follow every deletion themselves.
//!
//! A feed that breaks (member lost, history compacted) or that a waiter
//! falls too far behind on sends its waiters back to watches of their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchStream, Watcher};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::{broadcast, oneshot};
use tokio::task::AbortHandle;

use crate::countdown::{Countdown, Step, Told};

/// Deletions a waiter may fall behind by before it is sent back to watches
/// of its own: far more than the waiters of one lock in one process. (The
/// channel keeps this many slots per feed.)
const BACKLOG: usize = 256;

/// What a feed reports.
#[derive(Debug, Clone)]
enum Fed {
    /// The entries deleted at one revision, in the order of the watch.
    Deleted(AtOnce),
    /// The watch ended; no deletion after this is reported.
    Broken,
}

/// The entries deleted from the queue at one revision: one, or several
/// deleted by one transaction (an operator's range delete, say). A watch
/// never splits a revision's events, and a waiter takes them together, so
/// that its own entry deleted alongside the last one ahead of it is never
/// mistaken for the lock passing to it.
pub(crate) type AtOnce = Arc<[Deletion]>;

/// An entry deleted from the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deletion {
    /// The entry's key.
    pub(crate) key: Vec<u8>,
    /// The revision it was deleted at.
    pub(crate) revision: i64,
    /// The revision it was created at (from the event's previous value), so
    /// a waiter can tell an entry ahead of its own from one behind; `None`
    /// if the member did not send it.
    pub(crate) created: Option<i64>,
}

/// The live feeds of one backend, by queue prefix.
#[derive(Default)]
pub(crate) struct Feeds {
    live: Mutex<HashMap<Vec<u8>, Weak<Feed>>>,
}

struct Feed {
    outlet: Arc<Outlet>,
    task: AbortHandle,
}

/// Where a feed's deletions go: to the waiters it counts down for, and to
/// every waiter following deletions itself. Both are served under one
/// lock, so a waiter handing its counting over to the feed misses no
/// deletion and counts none twice.
struct Outlet {
    counting: Mutex<Vec<Countdown>>,
    events: broadcast::Sender<Fed>,
    broken: AtomicBool,
}

impl Outlet {
    fn new() -> (Arc<Outlet>, broadcast::Receiver<Fed>) {
        let (events, first) = broadcast::channel(BACKLOG);
        let outlet = Outlet {
            counting: Mutex::default(),
            events,
            broken: AtomicBool::new(false),
        };
        (Arc::new(outlet), first)
    }

    fn counting(&self) -> std::sync::MutexGuard<'_, Vec<Countdown>> {
        self.counting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands one revision's deletions to the countdowns and to the waiters
    /// following deletions themselves.
    fn deliver(&self, gone: AtOnce) {
        let mut counting = self.counting();
        for mut countdown in std::mem::take(&mut *counting) {
            let step = countdown.step(&gone);
            settle(&mut counting, countdown, step);
        }
        // No receiver: every such waiter left while the feed winds down.
        let _ = self.events.send(Fed::Deleted(gone));
    }

    /// The feed ended: no deletion after this is reported.
    fn end(&self) {
        let mut counting = self.counting();
        counting.clear();
        // Marked before it is sent: a waiter joining later either sees the
        // mark or receives the message (see `Feeds::join`).
        self.broken.store(true, Ordering::Release);
        let _ = self.events.send(Fed::Broken);
    }
}

/// Keeps a countdown still waiting for a waiter still listening, tells one
/// that is done, and drops the others (unsure, or the waiter left), which
/// tells the waiter to read where it stands.
fn settle(counting: &mut Vec<Countdown>, countdown: Countdown, step: Step) {
    match step {
        Step::Wait if countdown.listening() => counting.push(countdown),
        Step::Tell(told) => countdown.tell(told),
        _ => {}
    }
}

impl Drop for Feed {
    /// The last waiter left: the watch ends with the task that holds it.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A waiter's place on a feed: every deletion reported after it was taken.
pub(crate) struct Subscription {
    _feed: Arc<Feed>,
    events: broadcast::Receiver<Fed>,
}

/// A waiter's countdown on a feed: what the feed will tell it. An error
/// (the feed dropped the countdown) means the feed broke, the waiter fell
/// behind, or the count became unsure: the waiter must read where it stands.
pub(crate) struct Counted {
    _feed: Arc<Feed>,
    told: oneshot::Receiver<Told>,
}

impl Counted {
    /// What the feed told, once it has; `None` if it can no longer count.
    pub(crate) async fn told(&mut self) -> Option<Told> {
        (&mut self.told).await.ok()
    }
}

impl Subscription {
    /// Hands the counting of the entries ahead of `own` (created at
    /// revision `created`, when `left` entries were ahead) to the feed. The
    /// deletions this subscription holds are counted first: it was taken
    /// before the entry was created, so together with the feed's they are
    /// every deletion since.
    pub(crate) fn count_down(mut self, own: &[u8], created: i64, left: usize) -> Counted {
        let (mut countdown, told) = Countdown::new(own, created, left);
        let outlet = self._feed.outlet.clone();
        // Held while draining: no deletion is delivered in between.
        let mut counting = outlet.counting();
        let step = loop {
            match self.events.try_recv() {
                Ok(Fed::Deleted(gone)) => match countdown.step(&gone) {
                    Step::Wait => {}
                    done => break done,
                },
                Err(TryRecvError::Empty) => break Step::Wait,
                // Broke, or fell behind.
                Ok(Fed::Broken) | Err(_) => break Step::Unsure,
            }
        };
        settle(&mut counting, countdown, step);
        drop(counting);
        Counted {
            _feed: self._feed,
            told,
        }
    }

    /// The next revision's deletions; `None` once the feed broke or this
    /// waiter fell behind (deletions were dropped), when the waiter must
    /// read the queue to learn where it stands.
    pub(crate) async fn next(&mut self) -> Option<AtOnce> {
        match self.events.recv().await {
            Ok(Fed::Deleted(deletion)) => Some(deletion),
            Ok(Fed::Broken) | Err(_) => None,
        }
    }
}

impl Feeds {
    /// A place on the live feed of the queue at `prefix`, if there is one:
    /// taken before enqueueing, it reports every deletion after the entry.
    pub(crate) fn join(&self, prefix: &[u8]) -> Option<Subscription> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let feed = live.get(prefix)?.upgrade()?;
        // Subscribed before looking: a feed that breaks after the look
        // reports it to this subscriber too.
        let events = feed.outlet.events.subscribe();
        if feed.outlet.broken.load(Ordering::Acquire) {
            return None;
        }
        Some(Subscription {
            _feed: feed,
            events,
        })
    }

    /// A place on the queue's feed, set up now if none is live: it reports
    /// the deletions after the revision the member had applied when it
    /// registered the watch, which it has when this returns. `None` if the
    /// watch could not be set up within `setup_timeout`.
    pub(crate) async fn join_or_start(
        &self,
        client: &Client,
        prefix: &[u8],
        setup_timeout: Duration,
    ) -> Option<Subscription> {
        if let Some(joined) = self.join(prefix) {
            return Some(joined);
        }
        // With each deleted entry's previous value: its create revision.
        let options = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_filters([WatchFilterType::NoPut]);
        let mut client = client.clone();
        // The client returns once the member has confirmed the watch, which
        // it does after registering it.
        let (watcher, stream) =
            tokio::time::timeout(setup_timeout, client.watch(prefix.to_vec(), Some(options)))
                .await
                .ok()?
                .ok()?;
        // Subscribed before the first event is forwarded: none is missed.
        let (outlet, events) = Outlet::new();
        let ends = Ends(outlet.clone());
        let task = tokio::spawn(forward(watcher, stream, ends));
        let feed = Arc::new(Feed {
            outlet,
            task: task.abort_handle(),
        });
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        // Another waiter may have set one up meanwhile: one feed per queue.
        if let Some(other) = live.get(prefix).and_then(Weak::upgrade) {
            let events = other.outlet.events.subscribe();
            if !other.outlet.broken.load(Ordering::Acquire) {
                return Some(Subscription {
                    _feed: other,
                    events,
                });
            }
        }
        live.retain(|_, f| f.strong_count() > 0);
        live.insert(prefix.to_vec(), Arc::downgrade(&feed));
        Some(Subscription {
            _feed: feed,
            events,
        })
    }
}

/// Forwards the watch's deletions to the feed's waiters until it ends.
async fn forward(_watcher: Watcher, mut stream: WatchStream, ends: Ends) {
    while let Ok(Some(response)) = stream.message().await {
        if response.canceled() || response.compact_revision() > 0 {
            break;
        }
        let deleted: Vec<Deletion> = response
            .events()
            .iter()
            .filter(|event| event.event_type() == EventType::Delete)
            .filter_map(|event| {
                let kv = event.kv()?;
                Some(Deletion {
                    key: kv.key().to_vec(),
                    revision: kv.mod_revision(),
                    created: event.prev_kv().map(|before| before.create_revision()),
                })
            })
            .collect();
        for at_once in by_revision(&deleted) {
            ends.0.deliver(at_once);
        }
    }
}

/// A watch response's deletions, one revision's at a time (a response may
/// carry several revisions, in order, and never part of one).
fn by_revision(deleted: &[Deletion]) -> impl Iterator<Item = AtOnce> + '_ {
    deleted
        .chunk_by(|a, b| a.revision == b.revision)
        .map(AtOnce::from)
}

/// Marks the feed broken and tells its waiters when the forwarding task
/// ends, however it ends: the watch ended, the task was aborted, panicked,
/// or its runtime shut down.
struct Ends(Arc<Outlet>);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A feed of `outlet` with no watch behind it.
    fn idle_feed(outlet: Arc<Outlet>) -> Arc<Feed> {
        Arc::new(Feed {
            outlet,
            task: tokio::spawn(std::future::pending::<()>()).abort_handle(),
        })
    }

    /// A waiter's place on `outlet`'s feed, receiving `events`.
    fn subscription(outlet: &Arc<Outlet>, events: broadcast::Receiver<Fed>) -> Subscription {
        Subscription {
            _feed: idle_feed(outlet.clone()),
            events,
        }
    }

    fn deleted(revision: i64) -> Fed {
        Fed::Deleted(gone("queue/entry", revision, 1))
    }

    /// One entry deleted alone at `revision`.
    fn gone(key: &str, revision: i64, created: i64) -> AtOnce {
        AtOnce::from([deletion(key, revision, created)])
    }

    fn deletion(key: &str, revision: i64, created: i64) -> Deletion {
        Deletion {
            key: key.as_bytes().to_vec(),
            revision,
            created: Some(created),
        }
    }

    #[test]
    fn a_responses_deletions_are_handed_out_one_revision_at_a_time() {
        let response = [
            deletion("queue/a", 7, 1),
            deletion("queue/b", 8, 2),
            deletion("queue/c", 8, 3),
            deletion("queue/d", 9, 4),
        ];
        let revisions: Vec<Vec<i64>> = by_revision(&response)
            .map(|at_once| at_once.iter().map(|d| d.created.unwrap()).collect())
            .collect();
        assert_eq!(revisions, [vec![1], vec![2, 3], vec![4]]);
    }

    /// A subscription taken before our entry (created at revision 100, with
    /// two entries ahead) handed its counting to the feed: the deletion it
    /// already held and the ones delivered after are each counted once, and
    /// only the last one ahead wakes it.
    #[tokio::test]
    async fn a_countdown_counts_what_the_subscription_held_and_what_came_after() {
        let (outlet, first) = Outlet::new();
        let waiter = subscription(&outlet, first);
        outlet.deliver(gone("queue/a", 101, 10));
        let mut counted = waiter.count_down(b"queue/own", 100, 2);
        assert_eq!(outlet.counting().len(), 1, "waiting for one more");
        outlet.deliver(gone("queue/behind", 102, 101));
        assert_eq!(outlet.counting().len(), 1, "an entry behind is not counted");
        outlet.deliver(gone("queue/b", 103, 20));
        assert_eq!(counted.told().await, Some(Told::Head));
        assert!(outlet.counting().is_empty());
    }

    /// The deletions the subscription held may finish the count, or hold
    /// the feed's end: either is told at once, and nothing is left counting.
    #[tokio::test]
    async fn a_countdown_can_finish_on_what_the_subscription_held() {
        let (outlet, first) = Outlet::new();
        let waiter = subscription(&outlet, first);
        outlet.deliver(gone("queue/a", 101, 10));
        let mut counted = waiter.count_down(b"queue/own", 100, 1);
        assert_eq!(counted.told().await, Some(Told::Head));

        let late = subscription(&outlet, outlet.events.subscribe());
        outlet.end();
        let mut counted = late.count_down(b"queue/own", 100, 1);
        assert_eq!(counted.told().await, None, "the feed had ended");
        assert!(outlet.counting().is_empty());
    }

    #[tokio::test]
    async fn a_countdown_ends_with_the_feed_or_its_waiter() {
        let (outlet, first) = Outlet::new();
        let mut stays = subscription(&outlet, first).count_down(b"queue/own", 100, 2);
        let leaves =
            subscription(&outlet, outlet.events.subscribe()).count_down(b"queue/other", 100, 2);
        drop(leaves);
        outlet.deliver(gone("queue/behind", 102, 101));
        assert_eq!(
            outlet.counting().len(),
            1,
            "the waiter that left is dropped"
        );
        outlet.end();
        assert_eq!(
            stays.told().await,
            None,
            "the feed ended: read where it stands"
        );
    }

    /// A waiter that falls more than [`BACKLOG`] deletions behind is told
    /// to read the queue (`None`), as when the feed breaks, rather than
    /// handed a later deletion as if it were the next one; one exactly
    /// [`BACKLOG`] behind still gets every deletion, in order.
    #[tokio::test]
    async fn a_waiter_too_far_behind_is_sent_back_to_the_queue() {
        let (outlet, first) = Outlet::new();
        let events = outlet.events.clone();
        let mut too_far = subscription(&outlet, first);
        events.send(deleted(1)).unwrap();
        let mut at_the_limit = subscription(&outlet, events.subscribe());
        for revision in 2..=BACKLOG as i64 + 1 {
            events.send(deleted(revision)).unwrap();
        }

        assert_eq!(too_far.next().await, None, "BACKLOG + 1 behind");
        for revision in 2..=BACKLOG as i64 + 1 {
            let seen = at_the_limit.next().await.map(|d| d[0].revision);
            assert_eq!(seen, Some(revision), "BACKLOG behind");
        }
    }
}
