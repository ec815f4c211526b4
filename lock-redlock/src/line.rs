//! This client's places in the waiting lines of the locks it waits for, on
//! every node: how a place is spelt there, and the renewal that keeps all
//! of this client's places of a lock, on every node, every third of the
//! waiter lease, whatever the number of its waiters (operation `k` of
//! lock-redis-wire's batch script, which also hands a free key to a node's
//! head and re-sends a wake-up this client's head may have missed).
//!
//! A place carries its wait's arrival stamp ([`Place::arrived_us`], this
//! client's clock), after the session: every node keeps its line in order
//! of the stamps, so that the nodes agree on the order of the waiters they
//! all have, whatever order the places reached them in.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use lock_core::OwnerToken;
use lock_core::raw::Place;
use lock_redis_wire::{LockKeys, scripts};

use crate::Inner;

/// A place as the nodes hold it: the session (32 hex digits), the arrival
/// stamp (16) and the wait's own id (32).
pub(crate) const PLACE_LEN: usize = 80;

/// The places of this client's waiters, by lock.
pub(crate) struct Lines {
    /// This client's name in the lines' leases: 128 random bits, in hex.
    session: String,
    lease: Duration,
    /// Per lock key with waiters of ours in line: its names and their places.
    kept: Mutex<HashMap<String, Kept>>,
}

struct Kept {
    keys: LockKeys,
    places: HashSet<String>,
}

impl Lines {
    pub(crate) fn new(lease: Duration) -> Self {
        Lines {
            session: OwnerToken::random().to_hex(),
            lease,
            kept: Mutex::default(),
        }
    }

    /// The waiter's place as the nodes hold it (see [`PLACE_LEN`]).
    pub(crate) fn entry(&self, place: &Place) -> String {
        format!("{}{:016x}{}", self.session, place.arrived_us(), place.id())
    }

    /// The lease of every place of this client.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// `entry` is in the line of `keys.lock`: kept from now on, by a task
    /// of this lock's while this client has places there. Returns whether
    /// that task is to be started.
    pub(crate) fn hold(&self, keys: &LockKeys, entry: &str) -> bool {
        let mut kept = lock(&self.kept);
        let first = !kept.contains_key(&keys.lock);
        kept.entry(keys.lock.clone())
            .or_insert_with(|| Kept {
                keys: keys.clone(),
                places: HashSet::new(),
            })
            .places
            .insert(entry.to_owned());
        first
    }

    /// `entry` left the line (granted, or given up): no longer kept.
    pub(crate) fn let_go(&self, keys: &LockKeys, entry: &str) {
        if let Some(kept) = lock(&self.kept).get_mut(&keys.lock) {
            kept.places.remove(entry);
        }
    }

    /// The names of `lock_key` while this client has places in its line;
    /// `None` (and forgotten) once it has none.
    fn still_kept(&self, lock_key: &str) -> Option<LockKeys> {
        let mut kept = lock(&self.kept);
        match kept.get(lock_key) {
            Some(k) if !k.places.is_empty() => Some(k.keys.clone()),
            _ => {
                kept.remove(lock_key);
                None
            }
        }
    }
}

/// Renews this client's places in the line of `lock_key` on every node,
/// every third of the lease, until it has none there (or the backend is
/// gone). A node that does not answer is asked again at the next round.
pub(crate) async fn keep(inner: Weak<Inner>, lock_key: String) {
    loop {
        let Some(every) = inner.upgrade().map(|i| i.lines.lease() / 3) else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let Some(keys) = inner.lines.still_kept(&lock_key) else {
            return;
        };
        let (session, lease) = (&inner.lines.session, inner.lines.lease);
        let answers = inner
            .nodes
            .ask_all(|node| {
                let (mut c, keys) = (node.connection.clone(), &keys);
                async move { scripts::keep_line(&mut c, keys, session, lease).await }
            })
            .await;
        for (node, answer) in inner.nodes.nodes().iter().zip(answers) {
            if let Err(error) = answer {
                tracing::debug!(endpoint = %node.endpoint, %error, "renewing this client's places in line failed; trying again");
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
