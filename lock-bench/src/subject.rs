//! What is measured: a lockkit `Locker`, or the peer library (`rslock`).

use lockkit::Wait;
use std::time::Duration;

use lockkit::{Lease, Locker, Mode};

/// A lock client under measurement.
#[derive(Clone)]
pub enum Client {
    /// A lockkit backend behind `Locker`.
    Lockkit(Locker),
    /// A lockkit backend whose every hold is taken in this mode (a
    /// semaphore's permit, a read hold), released as any lease.
    LockkitIn(Locker, Mode),
    /// The `rslock` crate over one or more Redis servers.
    Rslock(rslock::LockManager),
    /// What etcd and PostgreSQL users pick instead (see [`crate::peers`]).
    Peer(std::sync::Arc<crate::peers::Peer>),
}

/// A held lock of either kind.
pub enum Held {
    /// lockkit's.
    Lease(Lease),
    /// rslock's.
    Rslock(rslock::Lock),
    /// A peer's.
    Peer(crate::peers::PeerHeld),
}

impl Client {
    /// rslock over the given `redis://` URLs (quorum N/2+1).
    pub fn rslock(urls: &[String]) -> Client {
        Client::Rslock(rslock::LockManager::new(urls.to_vec()))
    }

    /// One attempt, no waiting.
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Held, String> {
        match self {
            Client::Lockkit(l) => l
                .try_acquire(key, ttl)
                .await
                .map(Held::Lease)
                .map_err(|e| e.to_string()),
            Client::LockkitIn(l, mode) => l
                .acquire_in(key, *mode, ttl, Wait::NONE)
                .await
                .map(Held::Lease)
                .map_err(|e| e.to_string()),
            Client::Rslock(m) => m
                .lock(key, ttl)
                .await
                .map(Held::Rslock)
                .map_err(|e| e.to_string()),
            Client::Peer(p) => p.acquire(key, ttl, None).await.map(Held::Peer),
        }
    }

    /// Waits up to `wait` for the lock, the way each library waits.
    pub async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Held, String> {
        match self {
            Client::Lockkit(l) => l
                .acquire(key, ttl, Wait::at_most(wait))
                .await
                .map(Held::Lease)
                .map_err(|e| e.to_string()),
            Client::LockkitIn(l, mode) => l
                .acquire_in(key, *mode, ttl, Wait::at_most(wait))
                .await
                .map(Held::Lease)
                .map_err(|e| e.to_string()),
            // rslock retries with random delays (up to 200 ms) until it gets the lock.
            Client::Rslock(m) => {
                match tokio::time::timeout(wait, m.acquire_no_guard(key, ttl)).await {
                    Ok(r) => r.map(Held::Rslock).map_err(|e| e.to_string()),
                    Err(_) => Err(format!("not acquired within {wait:?}")),
                }
            }
            Client::Peer(p) => p.acquire(key, ttl, Some(wait)).await.map(Held::Peer),
        }
    }

    /// Releases a lock this client holds.
    pub async fn release(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Client::Lockkit(l) | Client::LockkitIn(l, _), Held::Lease(lease)) => {
                l.release(lease).await.map_err(|e| e.to_string())
            }
            (Client::Rslock(m), Held::Rslock(lock)) => {
                m.unlock(&lock).await;
                Ok(())
            }
            (Client::Peer(p), Held::Peer(held)) => p.release(held).await,
            _ => Err("a lock released through another client".into()),
        }
    }
}
