//! What users of etcd and PostgreSQL pick instead of a lock library: etcd's
//! own lock service and PostgreSQL's advisory locks, driven as plainly as
//! their documentation shows, so the lab measures them beside the backends.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::LockOptions;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Executor, Postgres};

/// The peers, by the lab's names.
pub const NAMES: &[&str] = &["etcd-v3lock", "pg-advisory-session", "pg-advisory-xact"];

/// What each peer gives up against a lockkit backend, for the report.
pub fn gives_up(name: &str) -> &'static str {
    match name {
        "etcd-v3lock" => {
            "gives up: a fencing token (the lock key's create revision is one, but Lock does not return it), a TTL per lock (the lease is the session's, kept alive by the client), a loss signal (nothing tells the holder its lease expired) and a guarded release (Unlock deletes whatever key it is given); keeps: release on crash (the lease expires), FIFO waiting"
        }
        "pg-advisory-session" => {
            "gives up: a fencing token, a TTL (held until unlocked or the session ends: a stalled client holds it forever), a loss signal, a guarded release (pg_advisory_unlock only warns when not held), and keys are 64-bit hashes that can collide; keeps: release on crash (the session ends with the connection), waiting in the server"
        }
        "pg-advisory-xact" => {
            "gives up: a fencing token, a TTL (held until the transaction ends: a stalled client holds it until the server's own timeouts, if any), a loss signal, and keys are 64-bit hashes that can collide; keeps: release on crash, waiting in the server, writes in the lock's transaction"
        }
        _ => "",
    }
}

/// A peer client.
pub enum Peer {
    /// etcd's v3lock service (`Lock`/`Unlock`, behind `etcdctl lock`).
    EtcdV3Lock(Box<EtcdV3Lock>),
    /// `pg_try_advisory_lock` / `pg_advisory_lock`, then `pg_advisory_unlock`.
    PgSession(PgPool),
    /// `pg_try_advisory_xact_lock` / `pg_advisory_xact_lock` in a
    /// transaction, released by its COMMIT.
    PgXact(PgPool),
}

/// A lock a peer holds.
pub enum PeerHeld {
    /// The lock service's key, and the lease it is bound to.
    Etcd { key: Vec<u8>, lease: IdleLease },
    /// The connection holding the advisory lock, and its key.
    Pg(PoolConnection<Postgres>, i64),
}

impl Peer {
    /// The peer named `name` on the servers at `url` (an `etcd://` or a
    /// `postgres://` URL, without lockkit's query options).
    pub async fn connect(name: &str, url: &str) -> Result<Peer, String> {
        match name {
            "etcd-v3lock" => {
                let endpoints: Vec<String> = crate::counters::hosts(url);
                let client = etcd_client::Client::connect(endpoints, None)
                    .await
                    .map_err(|e| format!("etcd: {e}"))?;
                Ok(Peer::EtcdV3Lock(Box::new(EtcdV3Lock {
                    client,
                    idle: Mutex::default(),
                })))
            }
            "pg-advisory-session" | "pg-advisory-xact" => {
                let base = url.split('?').next().unwrap_or(url);
                // As many connections as the lab's PostgreSQL backend may hold locks.
                // No ping before each use (sqlx's default): lockkit's own
                // connections are not pinged either.
                let pool = PgPoolOptions::new()
                    .max_connections(80)
                    .test_before_acquire(false)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect(base)
                    .await
                    .map_err(|e| format!("{}: {e}", lockkit::url::redact(base)))?;
                Ok(if name == "pg-advisory-session" {
                    Peer::PgSession(pool)
                } else {
                    Peer::PgXact(pool)
                })
            }
            other => Err(format!("no peer named {other}")),
        }
    }

    /// One attempt (`wait` None) or a wait of up to `wait`.
    pub async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<PeerHeld, String> {
        match self {
            Peer::EtcdV3Lock(etcd) => etcd.lock(key, ttl, wait).await,
            Peer::PgSession(pool) => {
                let (try_sql, wait_sql) = (
                    "SELECT pg_try_advisory_lock($1)",
                    "SELECT pg_advisory_lock($1)::text IS NOT NULL",
                );
                pg_lock(pool, key, wait, None, try_sql, wait_sql).await
            }
            Peer::PgXact(pool) => {
                let (try_sql, wait_sql) = (
                    "SELECT pg_try_advisory_xact_lock($1)",
                    "SELECT pg_advisory_xact_lock($1)::text IS NOT NULL",
                );
                pg_lock(pool, key, wait, Some("BEGIN"), try_sql, wait_sql).await
            }
        }
    }

    /// Releases `held`.
    pub async fn release(&self, held: PeerHeld) -> Result<(), String> {
        match (self, held) {
            (Peer::EtcdV3Lock(etcd), PeerHeld::Etcd { key, lease }) => {
                etcd.unlock(key, lease).await
            }
            (Peer::PgSession(_), PeerHeld::Pg(mut conn, k)) => {
                let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                    .bind(k)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(|e| format!("unlock: {e}"))?;
                unlocked
                    .then_some(())
                    .ok_or_else(|| "unlock: not held".to_string())
            }
            (Peer::PgXact(_), PeerHeld::Pg(mut conn, _)) => conn
                .execute("COMMIT")
                .await
                .map(drop)
                .map_err(|e| format!("commit: {e}")),
            _ => Err("a lock released through another peer".into()),
        }
    }

    /// Gives back what the peer keeps idle (the lock service's leases).
    pub async fn close_idle(&self) {
        if let Peer::EtcdV3Lock(etcd) = self {
            etcd.close_idle().await;
        }
    }
}

/// The advisory lock's key: a 64-bit hash of the lock's name, computed by
/// the server (`hashtextextended`), as users of advisory locks often do.
async fn pg_lock(
    pool: &PgPool,
    key: &str,
    wait: Option<Duration>,
    begin: Option<&str>,
    try_sql: &str,
    wait_sql: &str,
) -> Result<PeerHeld, String> {
    let mut conn = pool.acquire().await.map_err(|e| format!("pool: {e}"))?;
    let k = hash(key);
    if let Some(begin) = begin {
        conn.execute(begin)
            .await
            .map_err(|e| format!("begin: {e}"))?;
    }
    let sql = if wait.is_some() { wait_sql } else { try_sql };
    let locked = sqlx::query_scalar::<_, bool>(sql)
        .bind(k)
        .fetch_one(&mut *conn);
    let locked = match wait {
        // A wait cut short drops the connection mid-statement: closed, not reused.
        Some(wait) => match tokio::time::timeout(wait, locked).await {
            Ok(r) => r,
            Err(_) => {
                conn.detach();
                return Err(format!("not acquired within {wait:?}"));
            }
        },
        None => locked.await,
    }
    .map_err(|e| format!("lock: {e}"))?;
    if locked {
        Ok(PeerHeld::Pg(conn, k))
    } else {
        if begin.is_some() {
            conn.execute("ROLLBACK")
                .await
                .map_err(|e| format!("rollback: {e}"))?;
        }
        Err("contended".into())
    }
}

/// FNV-1a, 64 bits: a stable hash of the name on the client, so that the
/// lock statement is the whole round trip.
fn hash(key: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// etcd's lock service, each held lock on a lease of its own (the service
/// names a lock's key after its lease: two holders on one lease would share
/// a key). Leases are kept for the next lock once released, and renewed
/// before reuse once a tenth of their TTL old, as the etcd backend does.
pub struct EtcdV3Lock {
    client: etcd_client::Client,
    idle: Mutex<Vec<IdleLease>>,
}

/// A lease of the lock service's peer: id, TTL in seconds, last renewal sent.
#[derive(Clone, Copy)]
pub struct IdleLease(i64, i64, Instant);

impl EtcdV3Lock {
    async fn lease(&self, ttl: Duration) -> Result<IdleLease, String> {
        let secs = ttl.as_secs().max(1) as i64;
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let at = idle.iter().rposition(|l| l.1 == secs);
            at.map(|at| idle.remove(at))
        };
        let mut c = self.client.clone();
        if let Some(lease @ IdleLease(id, _, renewed)) = idle {
            if renewed.elapsed() < ttl / 10 {
                return Ok(lease);
            }
            let sent = Instant::now();
            if c.lease_keep_alive(id).await.is_ok() {
                return Ok(IdleLease(id, secs, sent));
            }
        }
        let sent = Instant::now();
        c.lease_grant(secs, None)
            .await
            .map(|r| IdleLease(r.id(), secs, sent))
            .map_err(|e| format!("lease grant: {e}"))
    }

    async fn lock(
        &self,
        key: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<PeerHeld, String> {
        let lease = self.lease(ttl).await?;
        let mut c = self.client.clone();
        let name = format!("v3lock/{key}");
        let options = LockOptions::new().with_lease(lease.0);
        // The service has no try: it only waits. The lab's uncontended
        // scenario tries free keys, so a try waits as long as a request may.
        let wait = wait.unwrap_or(Duration::from_secs(10));
        let reply = tokio::time::timeout(wait, c.lock(name, Some(options))).await;
        match reply {
            Ok(Ok(r)) => Ok(PeerHeld::Etcd {
                key: r.key().to_vec(),
                lease,
            }),
            Ok(Err(e)) => Err(format!("lock: {e}")),
            Err(_) => {
                // The lease may still hold the waiter's key: ended with it.
                let _ = c.lease_revoke(lease.0).await;
                Err(format!("not acquired within {wait:?}"))
            }
        }
    }

    async fn unlock(&self, key: Vec<u8>, lease: IdleLease) -> Result<(), String> {
        let mut c = self.client.clone();
        c.unlock(key).await.map_err(|e| format!("unlock: {e}"))?;
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(lease);
        Ok(())
    }

    async fn close_idle(&self) {
        let idle: Vec<_> =
            std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        let mut c = self.client.clone();
        for IdleLease(id, ..) in idle {
            let _ = c.lease_revoke(id).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer's servers, or None when they are not set (a failure where
    /// `LOCKKIT_REQUIRE_SERVERS` says they must be).
    fn url(var: &str) -> Option<String> {
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => Some(url),
            _ => {
                assert!(
                    std::env::var_os("LOCKKIT_REQUIRE_SERVERS").is_none(),
                    "{var} is not set"
                );
                None
            }
        }
    }

    /// Each peer is a lock: a second try on a held key is refused, and
    /// succeeds once the first holder released.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_peer_excludes_a_second_holder() {
        let run = format!("peers-{:08x}", getrandom::u32().expect("random"));
        let ttl = Duration::from_secs(10);
        for name in NAMES {
            let var = if name.starts_with("pg-") {
                "LOCKKIT_POSTGRES_URL"
            } else {
                "LOCKKIT_ETCD_URL"
            };
            let Some(url) = url(var) else { continue };
            let peer = Peer::connect(name, &url).await.expect("connect");
            let key = format!("{run}/{name}");
            let first = peer.acquire(&key, ttl, None).await.expect("first");
            let wait = Some(Duration::from_millis(300));
            assert!(
                peer.acquire(&key, ttl, wait).await.is_err(),
                "{name}: a second holder while the first holds it"
            );
            peer.release(first).await.expect("release");
            let again = peer.acquire(&key, ttl, wait).await.expect("again");
            peer.release(again).await.expect("release again");
            peer.close_idle().await;
        }
    }
}
