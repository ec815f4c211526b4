//! Keeping this client's places in the waiting lines of the locks it waits
//! for: one renewal per lock every third of the waiter lease, for all its
//! waiters of that lock at once, so that a crowd of waiters costs the
//! server what a few do. The renewal also hands a free key to the line's
//! head (a grant that lapsed, a head whose client died) and re-sends a
//! wake-up that this client's head may have missed (see the `k` operation
//! of [`BATCH_LUA`](lock_redis_wire::scripts::BATCH_LUA)).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::OwnerToken;
use lock_core::raw::Place;
use lock_redis_wire::{LockKeys, map_error, scripts};

use crate::connection::Conn;

/// The places of this client's waiters, by lock. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Lines {
    shared: Arc<Shared>,
}

struct Shared {
    /// This client's name in the lines' leases: 128 random bits, in hex.
    session: String,
    lease: Duration,
    conn: Conn,
    backend: &'static str,
    endpoint: String,
    /// Per lock key with waiters of ours in line: its names and their places.
    kept: Mutex<HashMap<String, Kept>>,
}

struct Kept {
    keys: LockKeys,
    places: HashSet<String>,
}

impl Lines {
    pub(crate) fn new(conn: Conn, lease: Duration, backend: &'static str, endpoint: &str) -> Self {
        let shared = Shared {
            session: OwnerToken::random().to_hex(),
            lease,
            conn,
            backend,
            endpoint: endpoint.to_owned(),
            kept: Mutex::default(),
        };
        Lines {
            shared: Arc::new(shared),
        }
    }

    /// The waiter's place as the line holds it: this client's session,
    /// then the place's own id (64 hex digits).
    pub(crate) fn entry(&self, place: &Place) -> String {
        let mut entry = String::with_capacity(64);
        entry.push_str(&self.shared.session);
        entry.push_str(place.id());
        entry
    }

    /// The lease of every place of this client.
    pub(crate) fn lease(&self) -> Duration {
        self.shared.lease
    }

    /// `entry` is in the line of `keys.lock`: kept from now on.
    pub(crate) fn hold(&self, keys: &LockKeys, entry: &str) {
        let mut kept = lock(&self.shared.kept);
        let first = !kept.contains_key(&keys.lock);
        kept.entry(keys.lock.clone())
            .or_insert_with(|| Kept {
                keys: keys.clone(),
                places: HashSet::new(),
            })
            .places
            .insert(entry.to_owned());
        if first && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(keep(Arc::downgrade(&self.shared), keys.lock.clone()));
        }
    }

    /// `entry` left the line (granted, or given up): no longer kept.
    pub(crate) fn let_go(&self, keys: &LockKeys, entry: &str) {
        if let Some(kept) = lock(&self.shared.kept).get_mut(&keys.lock) {
            kept.places.remove(entry);
        }
    }
}

/// Renews this client's places in the line of `lock` every third of the
/// lease, until it has none there (or the backend is gone).
async fn keep(shared: Weak<Shared>, lock_key: String) {
    loop {
        let Some(every) = shared.upgrade().map(|s| s.lease / 3) else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let keys = {
            let mut kept = lock(&shared.kept);
            match kept.get(&lock_key) {
                Some(k) if !k.places.is_empty() => k.keys.clone(),
                _ => {
                    kept.remove(&lock_key);
                    return;
                }
            }
        };
        let mut conn = shared.conn.clone();
        if let Err(e) = scripts::keep_line(&mut conn, &keys, &shared.session, shared.lease).await {
            let error = map_error(shared.backend, &shared.endpoint, e);
            tracing::debug!(%error, "renewing this client's places in line failed; trying again");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
