//! Redis Sentinel: locks on the master that the sentinels name, followed
//! across failovers.
//!
//! The sentinels are asked with one command (`SENTINEL
//! get-master-addr-by-name`) rather than through the redis crate's
//! sentinel client: that client hands out connections of its own, while
//! the backend needs only the master's address, to connect to it as to
//! any single server (batcher, waiting lines and wake-ups included).

mod switches;

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use lock_core::raw::{Grant, LeaveFuture, Place, WakeUpFuture, async_trait};
use lock_core::url::ServerUrl;
use lock_core::{
    Assumption, Capabilities, Error, FencingGuarantee, HeldLock, Lease, LockBackend, LockKey,
    LockReport, Mode, OwnerToken, Result,
};
use redis::{ConnectionInfo, IntoConnectionInfo, Value};

use crate::{RedisBackend, RedisOptions};

/// The backend's name in errors, traces and capabilities.
const BACKEND: &str = "redis-sentinel";

/// How long to wait before asking the sentinels again while a failover is
/// under way (they name a master that is not one yet, or none answers).
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The master's name from a Sentinel URL's path: one non-empty segment.
pub(crate) fn master_name(url: &ServerUrl, path: String) -> Result<String> {
    if path.is_empty() || path.contains('/') {
        return Err(Error::invalid(
            "url",
            format!(
                "{url}: name the master after the sentinels, as in redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster"
            ),
        ));
    }
    Ok(path)
}

/// Locks on the master of a Redis Sentinel deployment
/// (`redis+sentinel://[user:pass@]s1:26379,s2:26379,s3:26379/mymaster`).
///
/// It asks the sentinels, in URL order, which server is the master, checks
/// with `ROLE` that the server it reaches is one, and asks again when the
/// sentinels announce a new master (`+switch-master`) or that server stops
/// serving writes (a broken connection, a timeout, a `READONLY` or
/// `MASTERDOWN` reply). User and password are the master's;
/// the sentinels are asked without credentials.
///
/// A failover can lose a grant: Redis replicates asynchronously, so a
/// grant that the promoted replica had not received is gone, and the key
/// can be granted to a second client while its first holder still holds
/// it. [`capabilities`](LockBackend::capabilities) says so
/// ([`Assumption::ReplicationCaughtUp`]); `min_replicas` narrows the window
/// (see [`RedisOptions::min_replicas`]).
///
/// ```no_run
/// # async fn demo() -> lock_core::Result<()> {
/// use lock_core::Locker;
/// use lock_redis::SentinelBackend;
///
/// let url = "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster";
/// let locker = Locker::new(SentinelBackend::connect(url).await?);
/// # let _ = locker; Ok(()) }
/// ```
///
/// Cheap to clone; clones share the connection to the master.
#[derive(Clone)]
pub struct SentinelBackend {
    shared: Arc<Shared>,
}

struct Shared {
    /// The URL's options; its servers are the sentinels.
    options: RedisOptions,
    master: String,
    current: RwLock<Current>,
    /// One caller at a time asks the sentinels after a failure.
    following: tokio::sync::Mutex<()>,
    capabilities: Capabilities,
    /// Dropped with the backend: stops listening to the sentinels.
    _stop_watching: tokio::sync::oneshot::Sender<()>,
}

/// The master this backend talks to now.
#[derive(Clone)]
struct Current {
    backend: RedisBackend,
    /// `host:port`, as the sentinels named it.
    address: String,
}

impl std::fmt::Debug for SentinelBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelBackend")
            .field("sentinels", &self.shared.options.settings.url)
            .field("master", &self.shared.master)
            .field("address", &self.current().address)
            .finish_non_exhaustive()
    }
}

impl SentinelBackend {
    /// Asks the sentinels for the master and connects to it. Fails with
    /// [`Error::Unavailable`] when no sentinel names a server that says it
    /// is the master within the connect timeout.
    pub async fn connect(url: &str) -> Result<SentinelBackend> {
        Self::connect_with(RedisOptions::from_url(url)?).await
    }

    /// Connects with explicit options, read from a `redis+sentinel://` or
    /// `rediss+sentinel://` URL.
    pub async fn connect_with(options: RedisOptions) -> Result<SentinelBackend> {
        let options = options.checked()?;
        let Some(master) = options.sentinel.clone() else {
            return Err(Error::invalid(
                "url",
                format!(
                    "{}: not a Sentinel URL; use redis+sentinel://s1,s2,s3/mymaster",
                    options.settings.url
                ),
            ));
        };
        let started = Instant::now();
        let current = loop {
            match find_master(&options, &master, None).await {
                Ok(current) => break current,
                // A failover under way: the sentinels soon agree again.
                Err(e)
                    if e.is_unavailable()
                        && started.elapsed() < options.settings.timeouts.connect =>
                {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(e),
            }
        };
        let capabilities = capabilities(current.backend.capabilities());
        let (stop_watching, stop) = tokio::sync::oneshot::channel();
        let shared = Arc::new(Shared {
            options,
            master,
            current: RwLock::new(current),
            following: tokio::sync::Mutex::new(()),
            capabilities,
            _stop_watching: stop_watching,
        });
        tokio::spawn(switches::watch(Arc::downgrade(&shared), stop));
        Ok(SentinelBackend { shared })
    }

    /// `host:port` of the master this backend talks to now.
    pub fn master_address(&self) -> String {
        self.current().address
    }

    fn current(&self) -> Current {
        self.shared
            .current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// After `reply` from `seen`: when the master did not serve it, asks the
    /// sentinels again and moves to the master they name. The caller still
    /// gets its error (nothing was granted); its next call goes to the new
    /// master.
    async fn after<T>(&self, seen: &RedisBackend, reply: &Result<T>) {
        if matches!(reply, Err(e) if e.is_unavailable()) {
            self.follow(seen).await;
        }
    }

    async fn follow(&self, seen: &RedisBackend) {
        let _one = self.shared.following.lock().await;
        let current = self.current();
        if !Arc::ptr_eq(&current.backend.inner, &seen.inner) {
            // Another caller followed it already.
            return;
        }
        let options = &self.shared.options;
        match find_master(options, &self.shared.master, Some(&current)).await {
            Ok(found) if found.address == current.address => {}
            Ok(found) => {
                tracing::info!(
                    backend = BACKEND,
                    master = %self.shared.master,
                    from = %current.address,
                    to = %found.address,
                    "following a failover to the new master"
                );
                *self
                    .shared
                    .current
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = found;
            }
            Err(error) => {
                tracing::debug!(%error, "asked the sentinels for the master after a failure; asking again on the next one");
            }
        }
    }
}

/// The master the sentinels name, connected and confirmed by `ROLE`;
/// `current` itself when they name it and it still is the master.
async fn find_master(
    options: &RedisOptions,
    master: &str,
    current: Option<&Current>,
) -> Result<Current> {
    let (host, port) = ask_sentinels(options, master).await?;
    let address = format!("{host}:{port}");
    if let Some(current) = current
        && current.address == address
        && is_master(&current.backend).await?
    {
        return Ok(current.clone());
    }
    let mut at = options.clone();
    at.sentinel = None;
    let settings = &mut at.settings;
    let addr = settings.addr_of(host, port);
    settings.servers = vec![settings.servers[0].clone().set_addr(addr)];
    let scheme = if settings.tls { "rediss" } else { "redis" };
    settings.endpoints = vec![format!("{scheme}://{address}")];
    settings.addresses = vec![address.clone()];
    let backend = RedisBackend::connect_named(at, BACKEND).await?;
    if !is_master(&backend).await? {
        return Err(Error::Unavailable {
            backend: BACKEND,
            endpoint: format!("{scheme}://{address}"),
            reason: format!(
                "the sentinels name it the master of `{master}`, but ROLE says it is not (a failover is under way)"
            ),
            source: None,
        });
    }
    Ok(Current { backend, address })
}

/// Asks each sentinel in URL order for the master's address; the first
/// that knows it answers.
async fn ask_sentinels(options: &RedisOptions, master: &str) -> Result<(String, u16)> {
    let settings = &options.settings;
    let mut failures = Vec::new();
    for (server, shown) in settings.servers.iter().zip(&settings.addresses) {
        // Sentinels keep no data: asked without the master's credentials.
        let info = match server.addr().clone().into_connection_info() {
            Ok(info) => info,
            Err(e) => {
                failures.push(format!("{shown}: {e}"));
                continue;
            }
        };
        match ask_one(options, info, master).await {
            Ok(Some(address)) => return Ok(address),
            Ok(None) => failures.push(format!("{shown}: knows no master `{master}`")),
            Err(e) => failures.push(format!("{shown}: {e}")),
        }
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        endpoint: settings.url.clone(),
        reason: format!("no sentinel named the master: {}", failures.join("; ")),
        source: None,
    })
}

async fn ask_one(
    options: &RedisOptions,
    info: ConnectionInfo,
    master: &str,
) -> redis::RedisResult<Option<(String, u16)>> {
    let settings = &options.settings;
    let client = settings.client_for(info)?;
    let timeouts = settings.timeouts;
    let asking = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await
    };
    match tokio::time::timeout(timeouts.connect + timeouts.response, asking).await {
        Ok(answer) => answer,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "no answer within {:?}",
                timeouts.connect + timeouts.response
            ),
        ))),
    }
}

/// Whether the server behind `backend` says (`ROLE`) that it is a master.
async fn is_master(backend: &RedisBackend) -> Result<bool> {
    let role: Value = redis::cmd("ROLE")
        .query_async(&mut backend.inner.conn.clone())
        .await
        .map_err(|e| backend.error(e))?;
    let first = match &role {
        Value::Array(items) => items.first(),
        _ => None,
    };
    Ok(match first {
        Some(Value::BulkString(role)) => role == b"master",
        Some(Value::SimpleString(role)) => role == "master",
        _ => false,
    })
}

/// The single server's promises, less what a failover takes away.
fn capabilities(master: &Capabilities) -> Capabilities {
    // After a failover the counter may be one the replica never got; the
    // tokens then fall back to the new master's clock.
    let fencing = [
        Assumption::ServerClockNeverStepsBack,
        Assumption::ReplicaClocksAgree,
    ];
    let exclusion = [
        Assumption::ServerEvictsNoLockKeys,
        Assumption::ReplicationCaughtUp,
    ];
    // The sentinels replace a failed master, and locking goes on; but the
    // locks it held may be granted again (above), so no server failure
    // counts as one that locks survive, with `min_replicas` or without.
    master
        .clone()
        .with_fencing(FencingGuarantee::Strict, fencing)
        .with_exclusion_resting_on(exclusion)
        .with_tolerated_server_failures(0)
}

#[async_trait]
impl LockBackend for SentinelBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Grant> {
        let master = self.current().backend;
        let reply = master.try_acquire(key, owner, ttl).await;
        self.after(&master, &reply).await;
        reply
    }

    async fn try_acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
    ) -> Result<Grant> {
        let master = self.current().backend;
        let reply = master.try_acquire_in(key, owner, ttl, mode).await;
        self.after(&master, &reply).await;
        reply
    }

    async fn try_acquire_queued(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        place: &Place,
    ) -> Result<Grant> {
        let master = self.current().backend;
        let reply = master.try_acquire_queued(key, owner, ttl, place).await;
        self.after(&master, &reply).await;
        reply
    }

    async fn on_turn(&self, key: &LockKey, place: &Place) -> Option<WakeUpFuture> {
        self.current().backend.on_turn(key, place).await
    }

    fn keeps_places(&self) -> bool {
        true
    }

    fn leave_queue(&self, key: &LockKey, place: &Place) -> LeaveFuture {
        self.current().backend.leave_queue(key, place)
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let master = self.current().backend;
        let reply = master.extend(lease, ttl).await;
        self.after(&master, &reply).await;
        reply
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let master = self.current().backend;
        let reply = master.release(lease).await;
        self.after(&master, &reply).await;
        reply
    }

    async fn inspect(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        Ok(self.report(prefix).await?.held)
    }

    async fn report(&self, prefix: &str) -> Result<LockReport> {
        let master = self.current().backend;
        let reply = master.report(prefix).await;
        self.after(&master, &reply).await;
        reply
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        let master = self.current().backend;
        let reply = master.force_release(key).await;
        self.after(&master, &reply).await;
        reply
    }

    async fn on_release(&self, key: &LockKey) -> Option<WakeUpFuture> {
        self.current().backend.on_release(key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_names_its_sentinels_and_master() {
        let options = RedisOptions::from_url(
            "redis+sentinel://u:hunter2@s1:26379,s2:26380/mymaster?min_replicas=1",
        )
        .unwrap();
        assert_eq!(options.sentinel.as_deref(), Some("mymaster"));
        assert_eq!(options.settings.addresses, ["s1:26379", "s2:26380"]);
        assert_eq!(options.min_replicas, 1);
        assert!(!format!("{options:?}").contains("hunter2"));
        for (url, expect) in [
            ("redis+sentinel://u:hunter2@s1,s2", "name the master"),
            ("redis+sentinel://u:hunter2@s1/a/b", "name the master"),
            (
                "redis+sentinel://u:hunter2@s1/m?min_replicas=x",
                "min_replicas",
            ),
        ] {
            let err = RedisOptions::from_url(url).unwrap_err();
            let text = err.to_string();
            assert!(err.is_invalid_input() && text.contains(expect), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn a_cluster_does_not_wait_for_replicas() {
        let err = RedisOptions::from_url("redis+cluster://a,b?min_replicas=1").unwrap_err();
        assert!(err.to_string().contains("not on a cluster"), "{err}");
    }

    #[test]
    fn a_failover_can_lose_a_grant_and_capabilities_say_so() {
        let single = crate::capabilities(BACKEND, false, lock_core::raw::DEFAULT_WAITER_LEASE);
        let caps = capabilities(&single);
        assert!(
            caps.exclusion_rests_on
                .contains(&Assumption::ReplicationCaughtUp)
        );
        assert!(
            caps.fencing
                .rests_on
                .contains(&Assumption::ReplicaClocksAgree)
        );
        assert_eq!(caps.tolerated_server_failures, 0);
    }
}
