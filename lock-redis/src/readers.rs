//! Read holds of read-write locks on Redis (see
//! `lock_redis_wire::read_write` for the script and the key layout). The
//! write hold is the exclusive lock.

use std::time::Duration;

use lock_core::raw::{GiveBack, Grant};
use lock_core::{Error, Lease, LockKey, Mode, OwnerToken, Result};
use lock_redis_wire::holds::{self, HoldAnswer, HoldOperation};
use lock_redis_wire::read_write::{self, ReadReply};
use lock_redis_wire::{Claim, LockKeys};

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
        // Dropped before its answer, or answered with an error after which
        // the server may still run it: the hold is given back, behind the
        // attempt (on the batcher, which sends a claim's operations in order).
        let reply = match &inner.batcher {
            Some(batcher) => {
                let claim = Claim::new(keys, owner);
                let give_back = GiveBack::armed(|| {
                    drop(batcher.hold(claim.clone(), HoldOperation::ReleaseRead))
                });
                let operation = HoldOperation::acquire_read(ttl);
                let reply = batcher.hold(claim.clone(), operation).await;
                give_back.disarm_if_answered(&reply);
                reply.and_then(|answer| {
                    ReadReply::from_answer(answer).ok_or_else(holds::unexpected_answer)
                })
            }
            None => {
                let give_back = GiveBack::armed(|| self.give_back_read(&keys, owner));
                // The exclusive mode's rule, so that tokens increase across modes.
                let reply = read_write::acquire_read(
                    &mut inner.conn.clone(),
                    &inner.rule,
                    &keys,
                    owner,
                    ttl,
                )
                .await;
                give_back.disarm_if_answered(&reply);
                reply
            }
        };
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
        let reply = self
            .settle_hold(lease, HoldOperation::extend_read(ttl))
            .await;
        self.settled(lease, reply)
    }

    pub(crate) async fn release_read(&self, lease: &Lease) -> Result<()> {
        let reply = self.settle_hold(lease, HoldOperation::ReleaseRead).await;
        self.settled(lease, reply)
    }

    /// Extends or releases `lease`'s permit or read hold: on the batcher
    /// when there is one, else on the shared connection. Whether it held.
    pub(crate) async fn settle_hold(
        &self,
        lease: &Lease,
        operation: HoldOperation,
    ) -> redis::RedisResult<bool> {
        let keys = self.inner.settings.layout.keys(lease.key().as_str());
        let answer = match &self.inner.batcher {
            Some(batcher) => {
                batcher
                    .hold(Claim::new(keys, lease.owner()), operation)
                    .await?
            }
            None => {
                let conn = &mut self.inner.conn.clone();
                // Extends and releases take no token: the rule names no counter.
                let rule = lock_redis_wire::TokenRule::ClockFloor;
                holds::run_hold(conn, &rule, &keys, lease.owner(), operation).await?
            }
        };
        Ok(answer == HoldAnswer::Done(true))
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
