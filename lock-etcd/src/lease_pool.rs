//! Idle etcd leases, kept for the next acquire with the same TTL.
//!
//! Granting and revoking a lease are Raft writes (each committed on a
//! majority of members); renewing one is answered by the leader alone. So a
//! released lock's lease, still alive and now bound to nothing, is kept and
//! renewed for the next entry instead of being revoked: an uncontended
//! acquire and release then cost two writes (put the entry, delete it)
//! instead of four.
//!
//! A lease is in the pool only while no entry is bound to it: it goes in
//! after its entry was deleted and comes out for exactly one new entry,
//! with the time its last successful renewal (or grant) was sent. It may
//! expire while idle (nothing renews it); the caller renews it before use,
//! which fails for an expired one, and then grants a new lease, unless it
//! was renewed moments ago (see `EtcdBackend::lease_for`). Leases with less
//! than half their TTL left are not handed out: the renewal of a lease
//! about to expire can wait for the server's revoke.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// At most this many idle leases per backend; beyond, a released lease is
/// revoked as before.
const CAPACITY: usize = 256;

#[derive(Default)]
pub(crate) struct LeasePool {
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    id: i64,
    ttl_secs: i64,
    /// When its last successful renewal or grant was sent: the server keeps
    /// the lease for its TTL from no earlier than then.
    renewed: Instant,
}

impl Idle {
    /// Whether more than half its TTL is surely left at `now`.
    fn fresh(&self, now: Instant) -> bool {
        now < self.renewed + Duration::from_secs(self.ttl_secs as u64) / 2
    }
}

impl LeasePool {
    /// Keeps `id`, a lease of `ttl_secs` with no entry bound to it, last
    /// renewed by a request sent at `renewed`, for reuse. `Err(id)` when the
    /// pool is full: the caller revokes it.
    pub(crate) fn put(&self, id: i64, ttl_secs: i64, renewed: Instant) -> Result<(), i64> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|l| l.fresh(now));
        if idle.len() >= CAPACITY {
            return Err(id);
        }
        idle.push(Idle {
            id,
            ttl_secs,
            renewed,
        });
        Ok(())
    }

    /// Empties the pool: the ids of every lease it kept, fresh or not.
    pub(crate) fn drain(&self) -> Vec<i64> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.drain(..).map(|l| l.id).collect()
    }

    /// The most recently kept idle lease of `ttl_secs` with more than half
    /// its TTL left, if any, and when it was last renewed. The others that
    /// are not are dropped on the way: the server removes them by itself.
    pub(crate) fn take(&self, ttl_secs: i64) -> Option<(i64, Instant)> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|l| l.fresh(now));
        let at = idle.iter().rposition(|l| l.ttl_secs == ttl_secs)?;
        let lease = idle.remove(at);
        Some((lease.id, lease.renewed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renewed `s` seconds ago.
    fn secs_ago(s: u64) -> Instant {
        Instant::now() - Duration::from_secs(s)
    }

    #[test]
    fn a_lease_comes_back_once_and_only_for_its_ttl() {
        let pool = LeasePool::default();
        let renewed = Instant::now();
        pool.put(1, 10, renewed).unwrap();
        pool.put(2, 30, renewed).unwrap();
        pool.put(3, 10, renewed).unwrap();
        assert_eq!(pool.take(20), None);
        assert_eq!(
            pool.take(10),
            Some((3, renewed)),
            "the most recently kept first"
        );
        assert_eq!(pool.take(10), Some((1, renewed)));
        assert_eq!(pool.take(10), None);
        assert_eq!(pool.take(30), Some((2, renewed)));
    }

    #[test]
    fn a_drained_pool_hands_out_nothing() {
        let pool = LeasePool::default();
        pool.put(1, 10, Instant::now()).unwrap();
        pool.put(2, 30, secs_ago(20)).unwrap();
        assert_eq!(pool.drain(), [1, 2], "fresh or not");
        assert_eq!(pool.take(10), None);
    }

    #[test]
    fn a_full_pool_hands_the_lease_back() {
        let pool = LeasePool::default();
        for id in 0..CAPACITY as i64 {
            pool.put(id, 10, Instant::now()).unwrap();
        }
        assert_eq!(pool.put(999, 10, Instant::now()), Err(999));
    }

    #[test]
    fn a_lease_with_half_its_ttl_or_less_left_is_not_handed_out() {
        let pool = LeasePool::default();
        pool.put(1, 10, secs_ago(6)).unwrap();
        assert_eq!(pool.take(10), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_idle_until_half_its_ttl_is_left_is_dropped() {
        let pool = LeasePool::default();
        pool.put(1, 10, Instant::now()).unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(pool.take(10), None);
    }
}
