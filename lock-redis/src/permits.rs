//! Semaphore permits on Redis (see `lock_redis_wire::semaphore` for the
//! script and the key layout).

use std::time::Duration;

use lock_core::raw::{GiveBack, Grant};
use lock_core::{Error, Lease, LockKey, Mode, OwnerToken, Result};
use lock_redis_wire::holds::HoldOperation;
use lock_redis_wire::semaphore::{self, PermitReply};
use lock_redis_wire::{Claim, LockKeys};

use crate::RedisBackend;

impl RedisBackend {
    /// One attempt at one of `permits` permits of `key`.
    pub(crate) async fn try_acquire_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        permits: u32,
    ) -> Result<Grant> {
        let inner = &self.inner;
        let keys = inner.settings.layout.keys(key.as_str());
        // Dropped before its answer, or answered with an error after which
        // the server may still run it: the permit is given back, behind the
        // attempt (on the batcher, which sends a claim's operations in order).
        let reply = match &inner.batcher {
            Some(batcher) => {
                let claim = Claim::new(keys, owner);
                let give_back = GiveBack::armed(|| {
                    drop(batcher.hold(claim.clone(), HoldOperation::ReleasePermit { permits }))
                });
                let operation = HoldOperation::acquire_permit(ttl, permits);
                let reply = batcher.hold(claim.clone(), operation).await;
                give_back.disarm_if_answered(&reply);
                reply.and_then(|answer| {
                    PermitReply::from_answer(answer)
                        .ok_or_else(lock_redis_wire::holds::unexpected_answer)
                })
            }
            None => {
                let give_back = GiveBack::armed(|| self.give_back_permit(&keys, owner, permits));
                // The exclusive mode's rule, so that tokens increase across modes.
                let reply = semaphore::acquire_permit(
                    &mut inner.conn.clone(),
                    &inner.rule,
                    &keys,
                    owner,
                    ttl,
                    permits,
                )
                .await;
                give_back.disarm_if_answered(&reply);
                reply
            }
        };
        let asked = Mode::semaphore(permits);
        match reply.map_err(|e| self.error(e))? {
            PermitReply::Granted(token) => Ok(Grant::new(token)),
            PermitReply::Full(first_free) => Err(Error::Contended {
                key: key.to_string(),
                remaining: Some(first_free),
            }),
            PermitReply::OtherPermits(held) => Err(Error::ModeConflict {
                key: key.to_string(),
                held: Some(Mode::semaphore(held)),
                asked,
            }),
            PermitReply::Exclusive => Err(Error::ModeConflict {
                key: key.to_string(),
                held: Some(Mode::Exclusive),
                asked,
            }),
            PermitReply::Shared => Err(Error::ModeConflict {
                key: key.to_string(),
                held: Some(Mode::Shared),
                asked,
            }),
        }
    }

    pub(crate) async fn extend_permit(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let operation = HoldOperation::extend_permit(ttl);
        let reply = self.settle_hold(lease, operation).await;
        self.settled(lease, reply)
    }

    pub(crate) async fn release_permit(&self, lease: &Lease, permits: u32) -> Result<()> {
        let operation = HoldOperation::ReleasePermit { permits };
        let reply = self.settle_hold(lease, operation).await;
        self.settled(lease, reply)
    }

    /// `Some` when `key`'s lock key holds a semaphore, with its mode when
    /// its number of permits is known.
    pub(crate) async fn semaphore_on(&self, key: &LockKey) -> Option<Option<Mode>> {
        let keys = self.inner.settings.layout.keys(key.as_str());
        let (kind, permits): (String, Option<f64>) = redis::pipe()
            .cmd("TYPE")
            .arg(&keys.lock)
            .cmd("ZSCORE")
            .arg(&keys.lock)
            .arg(semaphore::PERMITS_MEMBER)
            .query_async(&mut self.inner.conn.clone())
            .await
            .ok()?;
        (kind == "zset").then(|| permits.and_then(semaphore::permits_of).map(Mode::semaphore))
    }

    /// Gives back, in a task of its own, the permit an attempt may hold.
    /// Sent on the same connection after the attempt, so it runs after it.
    fn give_back_permit(&self, keys: &LockKeys, owner: &OwnerToken, permits: u32) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, keys, owner) = (self.clone(), keys.clone(), owner.clone());
        runtime.spawn(async move {
            let conn = &mut backend.inner.conn.clone();
            if let Err(e) = semaphore::release_permit(conn, &keys, &owner, permits).await {
                let error = backend.error(e);
                tracing::debug!(%error, "could not give back a permit that won no lease; its TTL bounds it");
            }
        });
    }
}

/// Whether a Redis error says that a key holds another type: an exclusive
/// lock's command on a semaphore's key.
pub(crate) fn is_wrong_type(e: &redis::RedisError) -> bool {
    e.code() == Some("WRONGTYPE") || e.to_string().contains("WRONGTYPE")
}
