//! The etcd leases that keep queue entries: granted, renewed, kept idle for
//! the next acquire (see [`crate::lease_pool`]) and ended.

use std::time::Duration;

use lock_core::{Error, LockKey, Result};
use tokio::time::Instant;

use crate::EtcdBackend;

/// An etcd lease of ours.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EtcdLease {
    pub(crate) id: i64,
    pub(crate) ttl_secs: i64,
    /// When its last successful grant or renewal was sent: the server keeps
    /// it for its TTL from no earlier than then.
    pub(crate) renewed: Instant,
}

/// The etcd lease a new entry goes on.
pub(crate) struct NewLease {
    pub(crate) id: i64,
    /// When its last successful grant or renewal was sent.
    pub(crate) renewed: Instant,
    /// An idle lease from the pool: it may have been revoked since it was
    /// kept (or renewed), so the enqueue may find it gone.
    pub(crate) from_pool: bool,
}

impl NewLease {
    /// A lease just granted by a request sent at the given time.
    pub(crate) fn granted((id, renewed): (i64, Instant)) -> NewLease {
        NewLease {
            id,
            renewed,
            from_pool: false,
        }
    }
}

/// Revokes a lease when dropped (a cancelled or failed acquire), so that its
/// entry leaves the queue at once rather than after the TTL. Without a
/// runtime, or when the cluster cannot be reached, the TTL still bounds it.
pub(crate) struct RevokeOnDrop {
    pub(crate) backend: Option<EtcdBackend>,
    pub(crate) lease_id: i64,
}

impl RevokeOnDrop {
    pub(crate) fn disarm(&mut self) {
        self.backend = None;
    }

    pub(crate) async fn now(mut self) {
        if let Some(backend) = self.backend.take() {
            backend.revoke_quietly(self.lease_id).await;
        }
    }
}

impl Drop for RevokeOnDrop {
    fn drop(&mut self) {
        if let (Some(backend), Ok(runtime)) =
            (self.backend.take(), tokio::runtime::Handle::try_current())
        {
            let lease_id = self.lease_id;
            runtime.spawn(async move { backend.revoke_quietly(lease_id).await });
        }
    }
}

impl EtcdBackend {
    /// Grants a lease of exactly `ttl`; returns its id and when the grant was sent.
    pub(crate) async fn grant_lease(&self, ttl: Duration) -> Result<(i64, Instant)> {
        let secs = ttl.as_secs() as i64;
        let sent = Instant::now();
        let resp = self
            .call("lease grant", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        if resp.ttl() != secs {
            // etcd raises a TTL below its minimum (1.5 × election timeout) silently.
            self.revoke_quietly(resp.id()).await;
            return Err(Error::invalid(
                "ttl",
                format!(
                    "ttl is {ttl:?}, but the etcd cluster grants leases of at least {}s (1.5 × its election timeout, \
                     rounded up); use a longer TTL, or set `min_ttl_s={}` in the URL so that shorter ones are refused up front",
                    resp.ttl(),
                    resp.ttl()
                ),
            ));
        }
        Ok((resp.id(), sent))
    }

    /// A lease of exactly `ttl` for a new entry: an idle one, else a new
    /// grant.
    ///
    /// An idle lease is renewed first (one leader round, no Raft write),
    /// unless its last renewal was sent less than a tenth of the TTL ago (a
    /// lock released and taken again at once, say): its TTL then surely runs
    /// until that renewal's time plus the TTL (a new leader only extends
    /// leases), unless it was revoked (by an operator, say, or by a
    /// `revoke_lease` acting on a holder read before the release): the
    /// enqueue then finds it gone and takes a new lease. The
    /// grant's deadline counts from that renewal. A renewal now would move
    /// the deadline by less than a tenth of the TTL, the same trade
    /// `grant_head` makes, for one round trip and one stream opened on the
    /// leader per acquire.
    pub(crate) async fn lease_for(&self, key: &LockKey, ttl: Duration) -> Result<NewLease> {
        if let Some((idle, renewed)) = self.inner.idle_leases.take(ttl.as_secs() as i64) {
            if Instant::now() < renewed + ttl / 10 {
                return Ok(NewLease {
                    id: idle,
                    renewed,
                    from_pool: true,
                });
            }
            let sent = Instant::now();
            match self.keep_alive(key, idle).await {
                Ok(()) => {
                    return Ok(NewLease {
                        id: idle,
                        renewed: sent,
                        from_pool: true,
                    });
                }
                // Expired while idle: a new grant below.
                Err(Error::Lost { .. }) => {}
                // Unreachable: a grant would only wait for the same timeout
                // again. The idle lease is left to lapse.
                Err(e) => return Err(e),
            }
        }
        self.grant_lease(ttl).await.map(NewLease::granted)
    }

    /// Ends an etcd lease of our own whose entry is gone: kept for the next
    /// acquire while the pool has room, else revoked.
    pub(crate) async fn retire_lease(&self, lease: EtcdLease) {
        if let Err(lease_id) = self
            .inner
            .idle_leases
            .put(lease.id, lease.ttl_secs, lease.renewed)
        {
            self.revoke_quietly(lease_id).await;
        }
    }

    pub(crate) async fn revoke_quietly(&self, lease_id: i64) {
        let revoked = self.call("lease revoke", |mut c| async move {
            c.lease_revoke(lease_id).await
        });
        if let Err(e) = revoked.await {
            tracing::debug!(backend = "etcd", error = %e, "lease revoke failed; its TTL ends it");
        }
    }

    /// Revokes every idle lease of the pool, all at once: each a Raft write
    /// now, when the caller chose, rather than an expiry the leader commits
    /// a TTL later, in the middle of whatever runs then. No entry is bound
    /// to an idle lease, so no lock is touched.
    pub(crate) async fn revoke_idle_leases(&self) {
        let mut revokes = tokio::task::JoinSet::new();
        for id in self.inner.idle_leases.drain() {
            let backend = self.clone();
            revokes.spawn(async move { backend.revoke_quietly(id).await });
        }
        revokes.join_all().await;
    }

    pub(crate) async fn keep_alive(&self, key: &LockKey, lease_id: i64) -> Result<()> {
        self.call_lease(key, "lease keep-alive", |mut c| async move {
            c.lease_keep_alive(lease_id).await.map(|_| ())
        })
        .await
    }

    /// The holder's remaining TTL, in whole seconds rounded down (all etcd tells).
    pub(crate) async fn remaining(&self, lease_id: i64) -> Option<Duration> {
        let resp = self
            .call("lease time-to-live", |mut c| async move {
                c.lease_time_to_live(lease_id, None).await
            })
            .await
            .ok()?;
        (resp.ttl() > 0).then(|| Duration::from_secs(resp.ttl() as u64))
    }
}
