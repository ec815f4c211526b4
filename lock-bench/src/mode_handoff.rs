//! Handoffs in the modes: waiters on one key, each taking it in its own
//! mode, releasing at once and queueing again, spread over several clients
//! as the crowd's are; the time from a release to the grant it let in.
//!
//! Which release lets a grant in depends on the mode. A mutex, or a
//! semaphore whose permits are all taken, admits one holder per release:
//! each grant is paired with the earliest release not yet paired. A writer
//! behind readers is let in by the release that left the key with no
//! holder: its grant is paired with that release, when a reader made it
//! while the writer was asking.
//!
//! Writers wait in line and a waiting writer blocks new readers, so writers
//! that queue again at once would keep readers out for good. A writer here
//! queues again only once a reader has been granted since its own grant:
//! each writer's turn comes behind readers.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit::{Locker, Mode, Wait};
use tokio::sync::Notify;

use crate::Crowd;
use crate::stats::{Latency, nanos};

/// Which grants are counted, and from which release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Every grant, from the earliest release not yet paired with one.
    EveryGrant,
    /// A writer's grant, from the reader's release that left the key free
    /// while the writer was asking.
    WritersBehindReaders,
}

/// Pairs grants with the releases that let them in.
#[derive(Debug)]
pub(crate) struct Ledger {
    counted: Counted,
    /// Holds granted and not yet released.
    holders: usize,
    /// Releases not yet paired with a grant (`EveryGrant`).
    freed: VecDeque<Instant>,
    /// The release that last left the key free, and whether a reader made it.
    emptied: Option<(Instant, bool)>,
    /// Nanoseconds from each counted grant's release to the grant.
    pub(crate) gaps: Vec<u64>,
}

impl Ledger {
    /// A ledger of a key that `holders` hold now.
    pub(crate) fn new(counted: Counted, holders: usize) -> Ledger {
        Ledger {
            counted,
            holders,
            freed: VecDeque::new(),
            emptied: None,
            gaps: Vec::new(),
        }
    }

    /// The release of a hold in `mode` starts at `at`.
    pub(crate) fn released(&mut self, mode: Mode, at: Instant) {
        self.holders = self.holders.saturating_sub(1);
        match self.counted {
            Counted::EveryGrant => self.freed.push_back(at),
            Counted::WritersBehindReaders if self.holders == 0 => {
                self.emptied = Some((at, mode == Mode::Shared));
            }
            Counted::WritersBehindReaders => {}
        }
    }

    /// A hold in `mode`, asked for at `asked`, was granted at `at`; true
    /// when the grant counts.
    pub(crate) fn granted(&mut self, mode: Mode, asked: Instant, at: Instant) -> bool {
        self.holders += 1;
        let from = match self.counted {
            Counted::EveryGrant => self.freed.pop_front(),
            // Any grant means the key is no longer free.
            Counted::WritersBehindReaders => match self.emptied.take() {
                Some((released, true)) if mode == Mode::Exclusive && released >= asked => {
                    Some(released)
                }
                _ => None,
            },
        };
        from.map(|released| {
            self.gaps
                .push(nanos(at.saturating_duration_since(released)))
        })
        .is_some()
    }
}

/// Who waits on the key, what holds it while they gather, and which
/// grants count.
#[derive(Debug, Clone)]
pub struct Scene {
    /// Each waiter's mode.
    pub waiters: Vec<Mode>,
    /// The holds kept while the waiters gather, released when the count starts.
    pub gathering: Vec<Mode>,
    /// Which grants count.
    pub counted: Counted,
}

impl Scene {
    /// `waiters` tasks on a plain lock: the reference the modes are held to.
    pub fn mutex(waiters: usize) -> Scene {
        Scene {
            waiters: vec![Mode::Exclusive; waiters],
            gathering: vec![Mode::Exclusive],
            counted: Counted::EveryGrant,
        }
    }

    /// `waiters` tasks on a semaphore of `permits`, all of them taken
    /// while the waiters gather.
    pub fn semaphore(permits: u32, waiters: usize) -> Scene {
        let mode = Mode::semaphore(permits);
        Scene {
            waiters: vec![mode; waiters],
            gathering: vec![mode; permits as usize],
            counted: Counted::EveryGrant,
        }
    }

    /// `waiters` tasks on a read-write lock, one in `every` a writer, the
    /// rest readers; a writer holds the key while they gather.
    pub fn writers_behind_readers(waiters: usize, every: usize) -> Scene {
        let every = every.max(1);
        Scene {
            waiters: (0..waiters)
                .map(|i| {
                    if i % every == every - 1 {
                        Mode::Exclusive
                    } else {
                        Mode::Shared
                    }
                })
                .collect(),
            gathering: vec![Mode::Exclusive],
            counted: Counted::WritersBehindReaders,
        }
    }
}

/// What the waiters share.
struct Shared {
    handoffs: u64,
    counted: AtomicU64,
    stop: AtomicBool,
    done: Notify,
    ledger: tokio::sync::Mutex<Ledger>,
    /// Readers granted so far: a writer queues again once this has moved.
    readers: tokio::sync::watch::Sender<u64>,
    errors: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl Shared {
    fn failed(&self, e: impl ToString) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| e.to_string());
    }
}

/// Runs `scene` on `key` over `clients` (round robin) until `handoffs`
/// grants have counted, or `give_up` has passed since the count started.
pub async fn run(
    clients: &[Locker],
    key: &str,
    scene: &Scene,
    handoffs: u64,
    ttl: Duration,
    give_up: Duration,
) -> Crowd {
    let shared = Arc::new(Shared {
        handoffs,
        counted: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        done: Notify::new(),
        ledger: tokio::sync::Mutex::new(Ledger::new(scene.counted, scene.gathering.len())),
        readers: tokio::sync::watch::Sender::new(0),
        errors: AtomicU64::new(0),
        first_error: Default::default(),
    });
    let mut outcome = Crowd {
        waiters: scene.waiters.len(),
        clients: clients.len(),
        handoffs: 0,
        took_s: 0.0,
        handoffs_per_s: 0.0,
        handoff: Latency::default(),
        commands_per_handoff: None,
        errors: 0,
        first_error: None,
    };
    let mut gathering = Vec::new();
    for &mode in &scene.gathering {
        match clients[0]
            .acquire_in(key, mode, ttl, Wait::at_most(give_up))
            .await
        {
            Ok(lease) => gathering.push(lease),
            Err(e) => {
                outcome.errors = 1;
                outcome.first_error = Some(format!("the gathering holds: {e}"));
                for lease in gathering {
                    let _ = clients[0].release(lease).await;
                }
                return outcome;
            }
        }
    }
    let tasks: Vec<_> = scene
        .waiters
        .iter()
        .enumerate()
        .map(|(i, &mode)| {
            let locker = clients[i % clients.len()].clone();
            let (key, shared) = (key.to_owned(), shared.clone());
            tokio::spawn(
                async move { wait_in_turn(&locker, &key, mode, ttl, give_up, &shared).await },
            )
        })
        .collect();
    // Every waiter has made its first attempt (and joined the line where
    // there is one) by then, as in the crowd.
    tokio::time::sleep(Duration::from_millis(300 + scene.waiters.len() as u64 * 2)).await;
    let started = Instant::now();
    for lease in gathering {
        let mode = lease.mode();
        shared.ledger.lock().await.released(mode, Instant::now());
        if let Err(e) = clients[0].release(lease).await {
            shared.failed(format!("a gathering hold's release: {e}"));
        }
    }
    let finished = shared.done.notified();
    if shared.counted.load(Ordering::Relaxed) < handoffs
        && tokio::time::timeout(give_up, finished).await.is_err()
    {
        shared.failed(format!(
            "{} of {handoffs} handoffs in {give_up:?}; stopped there",
            shared.counted.load(Ordering::Relaxed)
        ));
    }
    let took = started.elapsed();
    let counted = shared.counted.load(Ordering::Relaxed);
    shared.stop.store(true, Ordering::Relaxed);
    // The waiters still in line are dropped: each leaves the line (in the
    // background), and a lease held now lapses by its TTL on a key no other
    // run uses.
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    let gaps = std::mem::take(&mut shared.ledger.lock().await.gaps);
    outcome.handoffs = counted;
    outcome.took_s = took.as_secs_f64();
    outcome.handoffs_per_s = counted as f64 / took.as_secs_f64().max(1e-9);
    outcome.handoff = Latency::of(&gaps).0;
    outcome.errors = shared.errors.load(Ordering::Relaxed);
    outcome.first_error = shared
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    outcome
}

/// One waiter: take the key in `mode`, note the grant, release, queue again.
async fn wait_in_turn(
    locker: &Locker,
    key: &str,
    mode: Mode,
    ttl: Duration,
    give_up: Duration,
    shared: &Shared,
) {
    let behind_readers = shared.ledger.lock().await.counted == Counted::WritersBehindReaders;
    let mut readers = shared.readers.subscribe();
    while !shared.stop.load(Ordering::Relaxed) {
        let asked = Instant::now();
        let lease = match locker
            .acquire_in(key, mode, ttl, Wait::at_most(give_up))
            .await
        {
            Ok(lease) => lease,
            Err(e) => {
                shared.failed(e);
                continue;
            }
        };
        let granted_at = Instant::now();
        let mut ledger = shared.ledger.lock().await;
        if mode == Mode::Shared {
            shared.readers.send_modify(|n| *n += 1);
        }
        // Read while the ledger is held, so no reader's grant is missed.
        let readers_seen = *readers.borrow_and_update();
        if ledger.granted(mode, asked, granted_at) {
            let counted = shared.counted.fetch_add(1, Ordering::Relaxed) + 1;
            if counted == shared.handoffs {
                shared.done.notify_one();
            }
        }
        ledger.released(mode, Instant::now());
        drop(ledger);
        if let Err(e) = locker.release(lease).await {
            shared.failed(e);
        }
        if behind_readers && mode == Mode::Exclusive {
            // Dropped with the task when the count ends.
            let _ = readers.wait_for(|&n| n > readers_seen).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(base: Instant, n: u64) -> Instant {
        base + Duration::from_millis(n)
    }

    #[test]
    fn every_grant_counts_from_the_earliest_release_not_yet_paired() {
        let t = Instant::now();
        let permits = Mode::semaphore(2);
        let mut ledger = Ledger::new(Counted::EveryGrant, 2);
        ledger.released(permits, ms(t, 0));
        ledger.released(permits, ms(t, 1));
        assert!(ledger.granted(permits, t, ms(t, 3))); // from 0
        assert!(ledger.granted(permits, t, ms(t, 7))); // from 1
        // No release left to pair with: not a handoff.
        assert!(!ledger.granted(permits, t, ms(t, 8)));
        ledger.released(permits, ms(t, 10));
        assert!(ledger.granted(permits, ms(t, 11), ms(t, 12)));
        assert_eq!(ledger.gaps, [3_000_000, 6_000_000, 2_000_000]);
    }

    #[test]
    fn a_writer_counts_from_the_last_readers_release_only() {
        let t = Instant::now();
        let (read, write) = (Mode::Shared, Mode::Exclusive);
        // A writer gathered; it leaves, two readers come in.
        let mut ledger = Ledger::new(Counted::WritersBehindReaders, 1);
        ledger.released(write, ms(t, 0));
        assert!(!ledger.granted(read, t, ms(t, 1)));
        assert!(!ledger.granted(read, t, ms(t, 2)));
        ledger.released(read, ms(t, 3)); // one reader still holds
        ledger.released(read, ms(t, 5)); // the last reader leaves
        assert!(ledger.granted(write, ms(t, 4), ms(t, 9))); // 4 ms behind it
        // A writer behind a writer is the mutex's handoff, not this one.
        ledger.released(write, ms(t, 10));
        assert!(!ledger.granted(write, ms(t, 10), ms(t, 11)));
        ledger.released(write, ms(t, 12));
        // A reader came first: the writer after it waited on that reader.
        assert!(!ledger.granted(read, ms(t, 12), ms(t, 13)));
        ledger.released(read, ms(t, 14));
        assert!(ledger.granted(write, ms(t, 13), ms(t, 20)));
        // A writer that asked after the key was free did not wait behind readers.
        ledger.released(write, ms(t, 21));
        assert!(!ledger.granted(read, ms(t, 21), ms(t, 22)));
        ledger.released(read, ms(t, 23));
        assert!(!ledger.granted(write, ms(t, 24), ms(t, 25)));
        assert_eq!(ledger.gaps, [4_000_000, 6_000_000]);
    }

    #[test]
    fn scenes_have_their_waiters_and_gathering_holds() {
        let s = Scene::semaphore(4, 16);
        assert_eq!((s.waiters.len(), s.gathering.len()), (16, 4));
        let rw = Scene::writers_behind_readers(16, 4);
        let writers = rw.waiters.iter().filter(|m| **m == Mode::Exclusive);
        assert_eq!(writers.count(), 4);
        assert_eq!(rw.gathering, [Mode::Exclusive]);
    }
}
