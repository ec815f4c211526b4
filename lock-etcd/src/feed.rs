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
//! many entries are ahead; once that many created before its own are
//! deleted, it heads the queue. Each release then reaches this backend as one event,
//! which only the waiter whose entry was just behind acts on.
//!
//! A feed that breaks (member lost, history compacted) or that a waiter
//! falls too far behind on sends its waiters back to watches of their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchStream, Watcher};
use tokio::sync::broadcast;
use tokio::task::AbortHandle;

/// Deletions a waiter may fall behind by before it is sent back to watches
/// of its own: far more than the waiters of one lock in one process. (The
/// channel keeps this many slots per feed.)
const BACKLOG: usize = 256;

/// What a feed reports.
#[derive(Debug, Clone)]
enum Fed {
    Deleted(Deletion),
    /// The watch ended; no deletion after this is reported.
    Broken,
}

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
    events: broadcast::Sender<Fed>,
    broken: Arc<AtomicBool>,
    task: AbortHandle,
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

impl Subscription {
    /// The next deletion; `None` once the feed broke or this waiter fell
    /// behind (deletions were dropped), when the waiter must read the queue
    /// to learn where it stands.
    pub(crate) async fn next(&mut self) -> Option<Deletion> {
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
        let events = feed.events.subscribe();
        if feed.broken.load(Ordering::Acquire) {
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
        let (sender, events) = broadcast::channel(BACKLOG);
        let broken = Arc::new(AtomicBool::new(false));
        let ends = Ends {
            events: sender.clone(),
            broken: broken.clone(),
        };
        let task = tokio::spawn(forward(watcher, stream, ends));
        let feed = Arc::new(Feed {
            events: sender,
            broken,
            task: task.abort_handle(),
        });
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        // Another waiter may have set one up meanwhile: one feed per queue.
        if let Some(other) = live.get(prefix).and_then(Weak::upgrade) {
            let events = other.events.subscribe();
            if !other.broken.load(Ordering::Acquire) {
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
        for event in response.events() {
            if let (EventType::Delete, Some(kv)) = (event.event_type(), event.kv()) {
                // No receiver: every waiter left while the feed winds down.
                let _ = ends.events.send(Fed::Deleted(Deletion {
                    key: kv.key().to_vec(),
                    revision: kv.mod_revision(),
                    created: event.prev_kv().map(|before| before.create_revision()),
                }));
            }
        }
    }
}

/// Marks the feed broken and tells its waiters when the forwarding task
/// ends, however it ends: the watch ended, the task was aborted, panicked,
/// or its runtime shut down.
struct Ends {
    events: broadcast::Sender<Fed>,
    broken: Arc<AtomicBool>,
}

impl Drop for Ends {
    fn drop(&mut self) {
        // Marked before it is sent: a waiter joining later either sees the
        // mark or receives the message (see `Feeds::join`).
        self.broken.store(true, Ordering::Release);
        let _ = self.events.send(Fed::Broken);
    }
}

/// A subscription that reports `deletions`, then that the feed broke.
#[cfg(test)]
pub(crate) fn replay(deletions: Vec<Deletion>) -> Subscription {
    let (events, receiver) = broadcast::channel(BACKLOG);
    let feed = Arc::new(Feed {
        events: events.clone(),
        broken: Arc::new(AtomicBool::new(false)),
        task: tokio::spawn(std::future::pending::<()>()).abort_handle(),
    });
    for deletion in deletions {
        events.send(Fed::Deleted(deletion)).unwrap();
    }
    events.send(Fed::Broken).unwrap();
    Subscription {
        _feed: feed,
        events: receiver,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deleted(revision: i64) -> Fed {
        Fed::Deleted(Deletion {
            key: b"queue/entry".to_vec(),
            revision,
            created: Some(1),
        })
    }

    /// A waiter that falls more than [`BACKLOG`] deletions behind is told
    /// to read the queue (`None`), as when the feed breaks, rather than
    /// handed a later deletion as if it were the next one; one exactly
    /// [`BACKLOG`] behind still gets every deletion, in order.
    #[tokio::test]
    async fn a_waiter_too_far_behind_is_sent_back_to_the_queue() {
        let (events, first) = broadcast::channel(BACKLOG);
        let feed = Arc::new(Feed {
            events: events.clone(),
            broken: Arc::new(AtomicBool::new(false)),
            task: tokio::spawn(std::future::pending::<()>()).abort_handle(),
        });
        let mut too_far = Subscription {
            _feed: feed.clone(),
            events: first,
        };
        events.send(deleted(1)).unwrap();
        let mut at_the_limit = Subscription {
            _feed: feed,
            events: events.subscribe(),
        };
        for revision in 2..=BACKLOG as i64 + 1 {
            events.send(deleted(revision)).unwrap();
        }

        assert_eq!(too_far.next().await, None, "BACKLOG + 1 behind");
        for revision in 2..=BACKLOG as i64 + 1 {
            let seen = at_the_limit.next().await.map(|d| d.revision);
            assert_eq!(seen, Some(revision), "BACKLOG behind");
        }
    }
}
