#![doc = include_str!("../README.md")]

mod connection;
mod eviction;
mod line;
mod permits;
mod readers;
mod replicas;
mod sentinel;
mod view;
mod wake;

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{
    DEFAULT_WAITER_LEASE, GiveBack, Grant, LeaveFuture, Place, WakeUpFuture, async_trait,
};
use lock_core::url::ServerUrl;
use lock_core::{
    Assumption, Capabilities, Error, FencingGuarantee, HeldLock, Lease, Limits, LockBackend,
    LockKey, LostReason, Mode, Offer, OwnerToken, Result, SafetyModel, Stall, WaitingOrder, WakeUp,
};
pub use lock_redis_wire::KeyLayout;
use lock_redis_wire::config::RESPONSE_TIMEOUT;
use lock_redis_wire::scripts::{self, AcquireReply};
use lock_redis_wire::{Batcher, Claim, LockKeys, RedisSettings, TokenRule, map_error};

use crate::connection::Conn;
use crate::line::Lines;
use crate::wake::Wakeups;
pub use lock_core::LockReport;

/// The URL schemes this backend serves.
///
/// `redis://` one server; `rediss://` one server over TLS (with the `tls`
/// cargo feature; refused, naming it, without); `redis+cluster://h1,h2,...`
/// a Redis Cluster by its seed nodes; `rediss+cluster://` one over TLS;
/// `redis+sentinel://s1,s2,s3/mymaster` the master that Redis Sentinel
/// names (see [`SentinelBackend`]); `rediss+sentinel://` over TLS.
pub const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
];

pub use crate::sentinel::SentinelBackend;

/// Settings of a [`RedisBackend`]: what the URL says, adjustable in code.
///
/// Read a URL with [`from_url`](Self::from_url), adjust it with the setters
/// (each named after its URL option), then hand it to
/// [`RedisBackend::connect_with`]. The setters only store their value; the
/// values are checked, before anything connects, by `connect_with` (or by
/// [`check`](Self::check), to validate a configuration without
/// connecting), whose error names the URL option:
///
/// ```
/// use std::time::Duration;
/// use lock_redis::RedisOptions;
///
/// let options = RedisOptions::from_url("redis://:secret@127.0.0.1:6379/0")?
///     .prefix("billing:")
///     .response_timeout(Duration::from_millis(500));
/// options.check()?;
/// assert_eq!(options.get_prefix(), "billing:");
/// assert!(!format!("{options:?}").contains("secret"));
///
/// let err = options.connect_timeout(Duration::ZERO).check().unwrap_err();
/// assert!(err.to_string().contains("connect_timeout_ms"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// What the URL says; its timeouts as the setters left them, unchecked.
    settings: RedisSettings,
    cluster: bool,
    /// Unchecked until connecting, as the setters store it.
    prefix: String,
    /// Unchecked until connecting, as the setters store it.
    waiter_lease: Duration,
    /// The master's name, for a Sentinel URL (its path).
    sentinel: Option<String>,
    min_replicas: u32,
}

/// The URL option for [`RedisOptions::waiter_lease`].
const WAITER_LEASE: &str = "waiter_lease_ms";
/// The URL option for [`RedisOptions::min_replicas`].
const MIN_REPLICAS: &str = "min_replicas";

impl RedisOptions {
    /// Reads a `redis://`, `rediss://`, `redis+cluster://`,
    /// `rediss+cluster://`, `redis+sentinel://` or `rediss+sentinel://` URL
    /// (see the crate docs for its options). A bad value in the URL is
    /// refused here, naming its option.
    pub fn from_url(url: &str) -> Result<Self> {
        lock_core::url::hide_if_ambiguous(url, Self::read_url(url))
    }

    fn read_url(url: &str) -> Result<Self> {
        let mut parsed = ServerUrl::parse(url)?;
        let (tls, cluster, sentinel) = match parsed.scheme.as_str() {
            "redis" => (false, false, false),
            "rediss" => (true, false, false),
            "redis+cluster" => (false, true, false),
            "rediss+cluster" => (true, true, false),
            "redis+sentinel" => (false, false, true),
            "rediss+sentinel" => (true, false, true),
            other => {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "{parsed}: scheme `{other}` is not served by the redis backend; use {}",
                        SCHEMES.join(", ")
                    ),
                ));
            }
        };
        // A Sentinel URL's path is the master's name, not a database.
        let sentinel = match sentinel {
            true => {
                let path = std::mem::take(&mut parsed.path);
                Some(sentinel::master_name(&parsed, path)?)
            }
            false => None,
        };
        let settings = RedisSettings::from_url(
            &parsed,
            tls,
            &[RESPONSE_TIMEOUT, WAITER_LEASE, MIN_REPLICAS],
        )?;
        let min_replicas = match parsed.param(MIN_REPLICAS) {
            Some(n) => replicas::parse_min(n)?,
            None => 0,
        };
        let waiter_lease = parsed
            .millis_param(WAITER_LEASE)?
            .unwrap_or(DEFAULT_WAITER_LEASE);
        if !cluster && sentinel.is_none() && settings.servers.len() > 1 {
            return Err(Error::invalid(
                "url",
                format!(
                    "{parsed}: names {} servers; use redis+cluster:// for a cluster, redlock:// for independent masters",
                    settings.servers.len()
                ),
            ));
        }
        if cluster && settings.db() != 0 {
            return Err(Error::invalid(
                "url",
                format!("{parsed}: Redis Cluster has only database 0"),
            ));
        }
        let options = RedisOptions {
            prefix: settings.layout.prefix().to_owned(),
            settings,
            cluster,
            waiter_lease,
            sentinel,
            min_replicas,
        };
        options.check()?;
        Ok(options)
    }

    /// Counts a grant (and an extension) only once `WAIT` says that at
    /// least `n` replicas have it (URL option `min_replicas`, default 0:
    /// no waiting). When fewer acknowledge it within half the response
    /// timeout, the grant is given back and the attempt fails with
    /// [`Error::Unavailable`] naming how many did. Not offered on a
    /// cluster (`connect_with` refuses it naming `min_replicas`). `WAIT` is not consensus: see the
    /// guide's operations page for what it still does not protect.
    pub fn min_replicas(mut self, n: u32) -> Self {
        self.min_replicas = n;
        self
    }

    /// How long a waiter's place in line lasts without a refresh (URL
    /// option `waiter_lease_ms`, default 400 ms): a waiter that dies at the
    /// head of the line holds the others up for at most this long, plus a
    /// third of it (see [`Stall`]). Waiters refresh every third of it.
    /// Whole milliseconds from 30 ms to 60 s, or `connect_with` refuses it
    /// naming `waiter_lease_ms`.
    pub fn waiter_lease(mut self, lease: Duration) -> Self {
        self.waiter_lease = lease;
        self
    }

    /// Puts locks under `prefix` instead of the URL's (URL option `prefix`,
    /// default `lockkit:`). `connect_with` refuses it, naming `prefix`,
    /// when it holds `{` or `}`, which Redis Cluster reads as a hash tag.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long opening a connection may take (URL option
    /// `connect_timeout_ms`, default 3 s). At least 1 ms, or `connect_with`
    /// refuses it naming `connect_timeout_ms`; `Duration::MAX` waits as
    /// long as it takes.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeouts.connect = timeout;
        self
    }

    /// How long each reply may take (URL option `response_timeout_ms`,
    /// default 3 s). At least 1 ms, or `connect_with` refuses it naming
    /// `response_timeout_ms`; `Duration::MAX` waits as long as it takes.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeouts.response = timeout;
        self
    }

    /// Checks every value as [`RedisBackend::connect_with`] does before it
    /// connects, without connecting: the error names the URL option
    /// (`connect_timeout_ms`, `prefix`, `waiter_lease_ms`, ...).
    pub fn check(&self) -> Result<()> {
        self.clone().checked().map(drop)
    }

    /// The options to connect with, once every value is checked.
    pub(crate) fn checked(mut self) -> Result<RedisOptions> {
        self.settings.timeouts.check()?;
        self.settings.layout = KeyLayout::new(self.prefix.clone())?;
        self.waiter_lease = lock_core::raw::waiter_lease(WAITER_LEASE, self.waiter_lease)?;
        if self.cluster && self.min_replicas > 0 {
            return Err(Error::invalid(
                MIN_REPLICAS,
                format!(
                    "{}: waiting for replicas is offered on redis:// and redis+sentinel://, not on a cluster",
                    self.settings.url
                ),
            ));
        }
        Ok(self)
    }

    /// The prefix locks live under.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// How long opening a connection may take.
    pub fn get_connect_timeout(&self) -> Duration {
        self.settings.timeouts.connect
    }

    /// How long each reply may take.
    pub fn get_response_timeout(&self) -> Duration {
        self.settings.timeouts.response
    }

    /// How long a waiter's place in line lasts without a refresh.
    pub fn get_waiter_lease(&self) -> Duration {
        self.waiter_lease
    }

    /// How many replicas must have a grant before it counts (0: none).
    pub fn get_min_replicas(&self) -> u32 {
        self.min_replicas
    }
}

/// Locks on one Redis server, or on a Redis Cluster.
///
/// Cheap to clone; clones share the connection and the wake-up subscription.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    /// Acquires and releases to a single server, coalesced, of every mode
    /// (exclusive locks, permits, read holds, and their extends); `None` on
    /// a cluster, whose keys of one call must share a hash slot, and when
    /// waiting for replicas (`WAIT` must follow each grant on its connection).
    batcher: Option<Batcher>,
    /// `min_replicas`: how many replicas must have a grant before it counts.
    wait: Option<replicas::Wait>,
    settings: RedisSettings,
    cluster: bool,
    /// This client's places in the locks' waiting lines, kept.
    lines: Lines,
    /// How the waiters' own attempts take tokens: as the batcher's do.
    rule: TokenRule,
    /// The endpoint named in errors: the server, or the cluster's seed list.
    endpoint: String,
    wakeups: Wakeups,
    capabilities: Capabilities,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.inner.endpoint)
            .field("prefix", &self.inner.settings.layout.prefix())
            .field("cluster", &self.inner.cluster)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Checks a URL as [`connect`](Self::connect) reads it, without
    /// connecting: a malformed URL or an unknown option is refused the same.
    pub fn check_url(url: &str) -> Result<()> {
        RedisOptions::from_url(url).map(drop)
    }

    /// Connects as the URL says. Fails with [`Error::Unavailable`] (naming the
    /// endpoint) when no server answers within the connect timeout, and with
    /// [`Error::Auth`] when the server refuses the credentials.
    ///
    /// ```no_run
    /// # async fn demo() -> lock_core::Result<()> {
    /// use lock_core::Locker;
    /// use lock_redis::RedisBackend;
    ///
    /// let locker = Locker::new(RedisBackend::connect("redis://127.0.0.1:6379/0?response_timeout_ms=500").await?);
    /// # let _ = locker; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<RedisBackend> {
        Self::connect_with(RedisOptions::from_url(url)?).await
    }

    /// Connects with explicit options. Their values are checked first, as
    /// [`RedisOptions::check`] does: a bad one is refused with
    /// [`Error::InvalidInput`] naming its URL option, before any connection
    /// is opened.
    pub async fn connect_with(options: RedisOptions) -> Result<RedisBackend> {
        if options.sentinel.is_some() {
            return Err(Error::invalid(
                "url",
                format!(
                    "{}: a Sentinel URL is served by SentinelBackend (or lockkit::connect), which follows failovers",
                    options.settings.url
                ),
            ));
        }
        let backend = if options.cluster {
            "redis-cluster"
        } else {
            "redis"
        };
        Self::connect_named(options, backend).await
    }

    /// Connects to the one server or cluster of `options`, naming the
    /// backend `backend` in errors and capabilities.
    pub(crate) async fn connect_named(
        options: RedisOptions,
        backend: &'static str,
    ) -> Result<RedisBackend> {
        let RedisOptions {
            settings,
            cluster,
            waiter_lease,
            min_replicas,
            ..
        } = options.checked()?;
        let conn = Conn::open(backend, &settings, cluster).await?;
        let endpoint = if cluster {
            settings.url.clone()
        } else {
            settings.endpoints[0].clone()
        };
        let wait = replicas::Wait::new(min_replicas, settings.timeouts.response);
        let batcher = match &conn {
            Conn::Single(_) if wait.is_some() => None,
            Conn::Single(c) => {
                Some(connection::open_batcher(backend, &endpoint, &settings, c).await?)
            }
            Conn::Cluster(_) => None,
        };
        let capabilities = capabilities(backend, cluster, waiter_lease);
        // Permits are granted by scripts of their own, which no `WAIT`
        // follows yet: refused rather than granted unconfirmed.
        let capabilities = match wait {
            Some(_) => capabilities
                .with_semaphore(Offer::Refused {
                    reason: "not with min_replicas: permits are not yet confirmed by WAIT",
                })
                .with_read_write(Offer::Refused {
                    reason: "not with min_replicas: read holds are not yet confirmed by WAIT",
                }),
            None => capabilities,
        };
        let capabilities = match eviction::lock_key_eviction(&conn, &settings, &endpoint).await {
            Some(servers) => capabilities.with_lock_key_eviction(servers),
            None => capabilities,
        };
        let rule = if cluster {
            TokenRule::ClockFloor
        } else {
            TokenRule::SharedClockFloor {
                counter: settings.layout.shared_counter().into(),
            }
        };
        let inner = Inner {
            lines: Lines::new(conn.clone(), waiter_lease, backend, &endpoint),
            batcher,
            wait,
            wakeups: Wakeups::new(&settings),
            capabilities,
            endpoint,
            conn,
            settings,
            cluster,
            rule,
        };
        Ok(RedisBackend {
            inner: Arc::new(inner),
        })
    }

    /// Where locks live.
    pub fn layout(&self) -> &KeyLayout {
        &self.inner.settings.layout
    }

    /// The locks whose names start with `key_prefix` (all when empty), with
    /// their remaining TTL and fencing token, and the Redis keys among them
    /// that have no TTL (leaks). Scans every master of a cluster with `SCAN`.
    pub async fn report(&self, key_prefix: &str) -> Result<LockReport> {
        let inner = &self.inner;
        let backend = inner.capabilities.backend;
        let mut report = LockReport::default();
        if inner.cluster {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut inner.conn.clone())
                .await
                .map_err(|e| self.error(e))?;
            let template = &inner.settings.servers[0];
            for (host, port) in view::cluster_masters(&nodes) {
                let scheme = if inner.settings.tls {
                    "rediss+cluster"
                } else {
                    "redis+cluster"
                };
                let endpoint = format!("{scheme}://{host}:{port}");
                let info = template
                    .clone()
                    .set_addr(inner.settings.addr_of(host, port));
                let client = inner
                    .settings
                    .client_for(info)
                    .map_err(|e| map_error(backend, &endpoint, e))?;
                let mut conn = tokio::time::timeout(
                    inner.settings.timeouts.connect,
                    client.get_multiplexed_async_connection(),
                )
                .await
                .map_err(|_| {
                    lock_redis_wire::errors::timed_out(
                        backend,
                        &endpoint,
                        "connection",
                        inner.settings.timeouts.connect,
                    )
                })?
                .map_err(|e| map_error(backend, &endpoint, e))?;
                view::scan_into(
                    &mut conn,
                    &inner.settings.layout,
                    true,
                    key_prefix,
                    &endpoint,
                    backend,
                    &mut report,
                )
                .await?;
            }
        } else {
            view::scan_into(
                &mut inner.conn.clone(),
                &inner.settings.layout,
                false,
                key_prefix,
                &inner.endpoint,
                backend,
                &mut report,
            )
            .await?;
        }
        report.held.sort_by(|a, b| a.key.cmp(&b.key));
        report.leaks.sort();
        Ok(report)
    }

    async fn send_acquire(
        &self,
        keys: LockKeys,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> redis::RedisResult<AcquireReply> {
        // A waiter of ours is registered (maybe the caller itself, between
        // rounds of its wait): the grant's release is to publish, so that
        // whoever still waits is woken.
        let others_wait = self.inner.wakeups.is_waited_for(&keys.channel);
        // Dropped before its answer is back, the acquire is given back (see
        // [`GiveBack`]). On one server the release is queued on the same
        // batcher, which sends a claim's operation only after the answer to
        // its earlier one, so it runs after the acquire, whatever became of
        // that.
        match &self.inner.batcher {
            Some(batcher) => {
                let claim = Claim::new(keys, owner);
                let give_back = GiveBack::armed(|| drop(batcher.release(claim.clone(), 0)));
                let reply = batcher.acquire(claim.clone(), ttl, others_wait).await;
                // Answered with an error, the acquire is given back too: after
                // a response timeout the server may still run it, and grant a
                // lock its caller never learns of. The release goes out behind
                // it. It cannot end a retry's grant, as the waiting loop asks
                // each retry with a fresh owner (see `poll_until_granted`).
                give_back.disarm_if_answered(&reply);
                reply
            }
            None => {
                let give_back = GiveBack::armed(|| self.give_back_by_conn(&keys, owner));
                let reply = self.acquire_by_conn(&keys, owner, ttl, others_wait).await;
                // As on one server: an error gives the acquire back too.
                give_back.disarm_if_answered(&reply);
                reply
            }
        }
    }

    /// One acquire on the shared connection, confirmed by `WAIT` when
    /// replicas are to have it.
    async fn acquire_by_conn(
        &self,
        keys: &LockKeys,
        owner: &OwnerToken,
        ttl: Duration,
        others_wait: bool,
    ) -> redis::RedisResult<AcquireReply> {
        let inner = &self.inner;
        let conn = inner.conn.clone();
        match inner.wait {
            Some(wait) => {
                let mut conn = replicas::Replicated::new(conn, wait);
                let reply = scripts::acquire_with_rule(
                    &mut conn,
                    &inner.rule,
                    keys,
                    owner,
                    ttl,
                    others_wait,
                )
                .await;
                conn.confirm(reply, |r| matches!(r, AcquireReply::Granted(_)))
            }
            None => {
                let mut conn = conn;
                scripts::acquire_with_rule(&mut conn, &inner.rule, keys, owner, ttl, others_wait)
                    .await
            }
        }
    }

    /// Releases, in a task of its own, what an acquire sent on the shared
    /// connection (on a cluster, or a waiter's attempt) may hold. There is
    /// no batcher to keep the order: the release is handed to the client
    /// after the acquire was, and the client sends both in that order
    /// unless it retries the acquire (after a lost connection or a
    /// redirect); a retried acquire may land after the release, and then
    /// its TTL bounds the grant.
    fn give_back_by_conn(&self, keys: &LockKeys, owner: &OwnerToken) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut conn, keys, owner) = (self.inner.conn.clone(), keys.clone(), owner.clone());
        let (backend, endpoint) = (self.inner.capabilities.backend, self.inner.endpoint.clone());
        runtime.spawn(async move {
            if let Err(e) = scripts::release(&mut conn, &keys, &owner, 0).await {
                let error = map_error(backend, &endpoint, e);
                tracing::debug!(%error, "could not give back an acquire that won no lease; its TTL bounds it");
            }
        });
    }

    async fn send_release(&self, keys: LockKeys, lease: &Lease) -> redis::RedisResult<bool> {
        let (owner, token) = (lease.owner(), lease.fencing_token().get());
        match &self.inner.batcher {
            Some(batcher) => batcher.release(Claim::new(keys, owner), token).await,
            None => scripts::release(&mut self.inner.conn.clone(), &keys, owner, token).await,
        }
    }

    /// An exclusive acquire's error: a lock key of the wrong type is a
    /// semaphore's (see `lock_redis_wire::semaphore`), which one more call,
    /// on this rare path only, tells apart from a broken counter.
    async fn acquire_error(&self, key: &LockKey, e: redis::RedisError) -> Error {
        if permits::is_wrong_type(&e)
            && let Some(held) = self.semaphore_on(key).await
        {
            return Error::ModeConflict {
                key: key.to_string(),
                held,
                asked: Mode::Exclusive,
            };
        }
        self.error(e)
    }

    /// An exclusive lease's extend or release error: a key of the wrong
    /// type is a semaphore's, taken after the lease's grant lapsed.
    fn settle_error(&self, lease: &Lease, e: redis::RedisError) -> Error {
        if permits::is_wrong_type(&e) {
            return Error::lost(lease.key().as_str(), LostReason::NotHeld);
        }
        self.error(e)
    }

    fn error(&self, e: redis::RedisError) -> Error {
        map_error(self.inner.capabilities.backend, &self.inner.endpoint, e)
    }

    /// What a script that extends or releases `lease`'s hold answered:
    /// done, or the hold was no longer there (lost), or the call failed.
    pub(crate) fn settled(&self, lease: &Lease, reply: redis::RedisResult<bool>) -> Result<()> {
        match reply {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::lost(lease.key().as_str(), LostReason::NotHeld)),
            Err(e) => Err(self.error(e)),
        }
    }
}

fn capabilities(backend: &'static str, cluster: bool, waiter_lease: Duration) -> Capabilities {
    // Tokens are max(counter + 1, server clock in µs): a lost counter
    // (restart without persistence, old snapshot, failover) falls back to the
    // clock, on a cluster to the clock of whichever node now serves the key.
    let fencing: &[Assumption] = if cluster {
        &[
            Assumption::ServerClockNeverStepsBack,
            Assumption::ReplicaClocksAgree,
        ]
    } else {
        &[Assumption::ServerClockNeverStepsBack]
    };
    Capabilities::new(backend, SafetyModel::SingleNode)
        .with_fencing(FencingGuarantee::Strict, fencing.iter().copied())
        .with_exclusion_resting_on([Assumption::ServerEvictsNoLockKeys])
        .with_wake_up(WakeUp::PubSub)
        .with_waiting_order(WaitingOrder::Fifo {
            stall: Stall::WaiterLease(waiter_lease),
        })
        .with_remaining_ttl(true)
        .with_lock_outlives_connection(true)
        .with_semaphore(Offer::Offered {
            waiting_order: WaitingOrder::Unordered,
        })
        .with_read_write(Offer::Offered {
            waiting_order: WaitingOrder::Unordered,
        })
        .with_tolerated_server_failures(0)
        .with_limits(Limits {
            min_ttl: Duration::from_millis(10),
            ttl_granularity: Duration::from_millis(1),
            ..Limits::default()
        })
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Grant> {
        let keys = self.inner.settings.layout.keys(key.as_str());
        let reply = match self.send_acquire(keys, owner, ttl).await {
            Ok(reply) => reply,
            Err(e) => return Err(self.acquire_error(key, e).await),
        };
        match reply {
            AcquireReply::Granted(token) => Ok(Grant::new(token)),
            AcquireReply::Contended(remaining) => Err(Error::Contended {
                key: key.to_string(),
                remaining,
            }),
        }
    }

    async fn try_acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
    ) -> Result<Grant> {
        match mode {
            Mode::Semaphore { permits } => self.try_acquire_permit(key, owner, ttl, permits).await,
            Mode::Shared => self.try_acquire_read(key, owner, ttl).await,
            Mode::Exclusive => self.try_acquire(key, owner, ttl).await,
            other => Err(Error::unsupported_mode(self.capabilities(), &other)),
        }
    }

    async fn try_acquire_queued(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        place: &Place,
    ) -> Result<Grant> {
        let inner = &self.inner;
        let keys = inner.settings.layout.keys(key.as_str());
        let entry = inner.lines.entry(place);
        // Sent on the shared connection, not the batcher: a dropped attempt
        // is given back behind it on that connection (see `give_back_by_conn`).
        let give_back = GiveBack::armed(|| self.give_back_by_conn(&keys, owner));
        let reply = match inner.wait {
            Some(wait) => {
                let mut conn = replicas::Replicated::new(inner.conn.clone(), wait);
                let reply = scripts::acquire_in_line(
                    &mut conn,
                    &inner.rule,
                    &keys,
                    owner,
                    &entry,
                    ttl,
                    inner.lines.lease(),
                )
                .await;
                conn.confirm(reply, |r| matches!(r, AcquireReply::Granted(_)))
            }
            None => {
                scripts::acquire_in_line(
                    &mut inner.conn.clone(),
                    &inner.rule,
                    &keys,
                    owner,
                    &entry,
                    ttl,
                    inner.lines.lease(),
                )
                .await
            }
        };
        give_back.disarm_if_answered(&reply);
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                // It may be in line: kept until the wait ends.
                inner.lines.hold(&keys, &entry);
                return Err(self.acquire_error(key, e).await);
            }
        };
        match reply {
            AcquireReply::Granted(token) => {
                inner.lines.let_go(&keys, &entry);
                Ok(Grant::new(token))
            }
            AcquireReply::Contended(remaining) => {
                inner.lines.hold(&keys, &entry);
                Err(Error::Contended {
                    key: key.to_string(),
                    remaining,
                })
            }
        }
    }

    async fn on_turn(&self, key: &LockKey, place: &Place) -> Option<WakeUpFuture> {
        let keys = self.inner.settings.layout.keys(key.as_str());
        Some(self.inner.wakeups.on_turn(
            keys.channel,
            keys.lock,
            self.inner.lines.entry(place),
            self.inner.conn.clone(),
        ))
    }

    fn keeps_places(&self) -> bool {
        true
    }

    fn leave_queue(&self, key: &LockKey, place: &Place) -> LeaveFuture {
        let inner = self.inner.clone();
        let (keys, entry) = (
            inner.settings.layout.keys(key.as_str()),
            inner.lines.entry(place),
        );
        inner.lines.let_go(&keys, &entry);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Box::pin(std::future::ready(()));
        };
        // Sent by a task of its own, so that it goes out even when the
        // caller does not wait for it (a dropped wait).
        let leaving = runtime.spawn(async move {
            if let Err(e) = scripts::leave_line(&mut inner.conn.clone(), &keys, &entry).await {
                let error = map_error(inner.capabilities.backend, &inner.endpoint, e);
                tracing::debug!(%error, "could not leave the waiting line; the place's lease bounds it");
            }
        });
        Box::pin(async move {
            let _ = leaving.await;
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        match lease.mode() {
            Mode::Semaphore { .. } => return self.extend_permit(lease, ttl).await,
            Mode::Shared => return self.extend_read(lease, ttl).await,
            _ => {}
        }
        let keys = self.inner.settings.layout.keys(lease.key().as_str());
        let extended = match self.inner.wait {
            Some(wait) => {
                let mut conn = replicas::Replicated::new(self.inner.conn.clone(), wait);
                let extended = scripts::extend(&mut conn, &keys, lease.owner(), ttl).await;
                conn.confirm(extended, |extended| *extended)
            }
            None => scripts::extend(&mut self.inner.conn.clone(), &keys, lease.owner(), ttl).await,
        }
        .map_err(|e| self.settle_error(lease, e))?;
        if extended {
            Ok(())
        } else {
            Err(Error::lost(lease.key().as_str(), LostReason::NotHeld))
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        match lease.mode() {
            Mode::Semaphore { permits } => return self.release_permit(lease, permits).await,
            Mode::Shared => return self.release_read(lease).await,
            _ => {}
        }
        let keys = self.inner.settings.layout.keys(lease.key().as_str());
        let released = self
            .send_release(keys, lease)
            .await
            .map_err(|e| self.settle_error(lease, e))?;
        if released {
            Ok(())
        } else {
            Err(Error::lost(lease.key().as_str(), LostReason::NotHeld))
        }
    }

    async fn inspect(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        Ok(self.report(prefix).await?.held)
    }

    async fn report(&self, prefix: &str) -> Result<LockReport> {
        RedisBackend::report(self, prefix).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        let keys = self.inner.settings.layout.keys(key.as_str());
        scripts::force_release(&mut self.inner.conn.clone(), &keys)
            .await
            .map_err(|e| self.error(e))
    }

    async fn on_release(&self, key: &LockKey) -> Option<WakeUpFuture> {
        let keys = self.inner.settings.layout.keys(key.as_str());
        Some(
            self.inner
                .wakeups
                .on_release(keys.channel, keys.lock, self.inner.conn.clone()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_tokens_also_rest_on_the_replicas_clocks() {
        let rests_on = |cluster| {
            capabilities("x", cluster, DEFAULT_WAITER_LEASE)
                .fencing
                .rests_on
        };
        assert_eq!(rests_on(false), [Assumption::ServerClockNeverStepsBack]);
        assert!(rests_on(true).contains(&Assumption::ReplicaClocksAgree));
    }

    #[test]
    fn zero_timeouts_are_refused_naming_which() {
        let options = || RedisOptions::from_url("redis://h:6379").unwrap();
        let named = |o: RedisOptions| match o.check() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected an input error, got {other:?}"),
        };
        let zero = Duration::ZERO;
        assert_eq!(
            named(options().response_timeout(zero)),
            "response_timeout_ms"
        );
        assert_eq!(named(options().connect_timeout(zero)), "connect_timeout_ms");
        let one = Duration::from_millis(1);
        assert!(options().connect_timeout(one).check().is_ok());
        assert!(options().response_timeout(Duration::MAX).check().is_ok());
    }

    #[test]
    fn a_cluster_over_tls_needs_the_tls_feature() {
        let options = RedisOptions::from_url("rediss+cluster://u:secret@h1:7000,h2:7001");
        if cfg!(feature = "tls") {
            let options = options.expect("a TLS cluster URL");
            assert!(options.cluster && options.settings.tls);
            assert_eq!(options.settings.servers.len(), 2);
        } else {
            let err = options
                .expect_err("refused without the feature")
                .to_string();
            assert!(err.contains("`tls` cargo feature"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
