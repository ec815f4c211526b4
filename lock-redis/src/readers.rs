//! Read holds of read-write locks on Redis (see
//! `lock_redis_wire::read_write` for the script and the key layout). The
//! write hold is the exclusive lock.

use std::time::Duration;

use lock_core::raw::{GiveBack, Grant};
use lock_core::{Error, Lease, LockKey, Mode, OwnerToken, Result};
use lock_redis_wire::LockKeys;
use lock_redis_wire::read_write::{self, ReadReply};
use lock_redis_wire::semaphore::PermitCounter;

use crate::RedisBackend;

impl RedisBackend {
    /// One attempt at a read hold of `key`.
    pub(crate) async fn try_acquire_read(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Grant> {
        let inner = &self.inner;
        let keys = inner.settings.layout.keys(key.as_str());
        let shared = inner.settings.layout.shared_counter();
        // The exclusive mode's counter, so that tokens increase across modes.
        let counter = match inner.cluster {
            true => PermitCounter::OwnKey,
            false => PermitCounter::Shared(&shared),
        };
        // Dropped before its answer, or answered with an error after which
        // the server may still run it: the hold is given back.
        let give_back = GiveBack::armed(|| self.give_back_read(&keys, owner));
        let reply =
            read_write::acquire_read(&mut inner.conn.clone(), &keys, counter, owner, ttl).await;
        give_back.disarm_if_answered(&reply);
        match reply.map_err(|e| self.error(e))? {
            ReadReply::Granted(token) => Ok(Grant::new(token)),
            ReadReply::Contended(remaining) => Err(Error::Contended {
                key: key.to_string(),
                remaining,
            }),
            ReadReply::Semaphore(permits) => Err(Error::ModeConflict {
                key: key.to_string(),
                held: Some(Mode::semaphore(permits)),
                asked: Mode::Shared,
            }),
        }
    }

    pub(crate) async fn extend_read(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let keys = self.inner.settings.layout.keys(lease.key().as_str());
        let conn = &mut self.inner.conn.clone();
        let reply = read_write::extend_read(conn, &keys, lease.owner(), ttl).await;
        self.settled(lease, reply)
    }

    pub(crate) async fn release_read(&self, lease: &Lease) -> Result<()> {
        let keys = self.inner.settings.layout.keys(lease.key().as_str());
        let conn = &mut self.inner.conn.clone();
        let reply = read_write::release_read(conn, &keys, lease.owner()).await;
        self.settled(lease, reply)
    }

    /// Gives back, in a task of its own, the read hold an attempt may hold.
    /// Sent on the same connection after the attempt, so it runs after it.
    fn give_back_read(&self, keys: &LockKeys, owner: &OwnerToken) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, keys, owner) = (self.clone(), keys.clone(), owner.clone());
        runtime.spawn(async move {
            let conn = &mut backend.inner.conn.clone();
            if let Err(e) = read_write::release_read(conn, &keys, &owner).await {
                let error = backend.error(e);
                tracing::debug!(%error, "could not give back a read hold that won no lease; its TTL bounds it");
            }
        });
    }
}
