#![doc = include_str!("../README.md")]

mod config;
mod countdown;
mod errors;
mod feed;
mod holders;
mod lease_pool;
mod leases;
mod modes;
mod permit_line;
mod permits;
mod queue;
mod readers;
pub mod transactions;
mod waiting;
mod wake;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, KeyValue, TxnOp, TxnOpResponse, TxnResponse,
};
use lock_core::raw::{Grant, LossFuture, Waiting, async_trait};
use lock_core::{
    Assumption, Capabilities, Error, FencingGuarantee, FencingToken, HeldLock, Lease, LockBackend,
    LockKey, LostReason, Mode, Offer, OwnerToken, Result, SafetyModel, Stall, WaitingOrder, WakeUp,
};
use tokio::time::{Instant, sleep, timeout_at};

pub use config::{DEFAULT_PORT, EtcdOptions, OPTIONS};
use errors::{Endpoint, is_lease_gone};
use feed::Feeds;
use holders::Listed;
use lease_pool::LeasePool;
use leases::{EtcdLease, NewLease, RevokeOnDrop};
use permits::Sharing;
use queue::{Ahead, Queue};
use wake::Watched;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["etcd"];

/// Locks in an etcd cluster: each grant is a lease plus a queue entry bound
/// to it, created in one transaction; the entry's create revision is the
/// fencing token. Cheap to clone; clones share one client.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    endpoint: Endpoint,
    prefix: String,
    response_timeout: Duration,
    capabilities: Capabilities,
    /// Released locks' leases, kept for the next acquire.
    idle_leases: LeasePool,
    /// The shared watches of the queues this backend's waiters wait in.
    feeds: Feeds,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoint", &self.inner.endpoint.0)
            .field("prefix", &self.inner.prefix)
            .field("response_timeout", &self.inner.response_timeout)
            .finish_non_exhaustive()
    }
}

/// The holder of a lock as etcd sees it, for operators and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The etcd lease the holder's entry is bound to.
    pub lease_id: i64,
    /// The holder's fencing token (its entry's create revision).
    pub fencing_token: FencingToken,
}

/// What a lease of this backend carries: its entry and its etcd lease.
#[derive(Debug)]
struct Held {
    entry: Vec<u8>,
    /// The etcd lease keeping the entry. It changes when an extend asks for
    /// another TTL, since an etcd lease keeps the TTL it was granted with.
    lease: Mutex<EtcdLease>,
    /// Set while a release runs and once it succeeded: the etcd lease may
    /// then serve another lock, so this grant must never touch it again.
    released: AtomicBool,
}

impl Held {
    fn lease(&self) -> EtcdLease {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_lease(&self, lease: EtcdLease) {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = lease;
    }

    /// Records a successful renewal of lease `id`, sent at `sent`, unless
    /// the grant has moved to another lease since.
    fn renewed(&self, id: i64, sent: Instant) {
        let mut lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        if lease.id == id {
            lease.renewed = sent;
        }
    }
}

/// Where a lease's entry is and which etcd lease keeps it.
struct Located<'a> {
    entry: Vec<u8>,
    lease_id: i64,
    ttl_secs: i64,
    /// Present when the lease came from this backend (not rebuilt): only
    /// then is the etcd lease known to be the caller's own.
    held: Option<&'a Held>,
}

/// What a join request asks for.
#[derive(Clone, Copy)]
enum Join {
    /// A place in the queue, whatever is ahead.
    Queue,
    /// The lock now, or nothing written.
    Try,
}

/// What a join request did.
enum Joined {
    /// The entry was put; true when it heads the queue.
    Entry(Entry, bool),
    /// A try found the queue not empty; its head then.
    Held { head: Option<KeyValue> },
}

/// A fresh queue entry, revoked on drop unless it became a grant.
struct Entry {
    entry: Vec<u8>,
    lease_id: i64,
    ttl_secs: i64,
    revision: i64,
    /// When the lease's last grant or renewal was sent: its TTL runs from
    /// later.
    sent: Instant,
    /// The entries ahead of this one when it was created.
    ahead: Ahead,
    revoke: RevokeOnDrop,
}

impl Entry {
    fn into_grant(mut self, sent: Instant) -> Grant {
        self.revoke.disarm();
        let held = Held {
            entry: self.entry,
            lease: Mutex::new(EtcdLease {
                id: self.lease_id,
                ttl_secs: self.ttl_secs,
                renewed: sent,
            }),
            released: AtomicBool::new(false),
        };
        Grant::new(FencingToken::new(self.revision as u64))
            .sent_at(sent)
            .with_state(Arc::new(held))
    }
}

impl EtcdBackend {
    /// Checks a URL as [`connect`](Self::connect) reads it, without
    /// connecting: a malformed URL, an unknown option or a TLS file that
    /// cannot be read is refused the same.
    pub fn check_url(url: &str) -> Result<()> {
        EtcdOptions::from_url(url)?.check()
    }

    /// Connects to the cluster named by an `etcd://host1:port1,host2:port2`
    /// URL, with the options in its query (see [`EtcdOptions`]).
    ///
    /// ```no_run
    /// # async fn demo() -> lock_core::Result<()> {
    /// use lock_core::Locker;
    /// use lock_etcd::EtcdBackend;
    ///
    /// let locker = Locker::new(EtcdBackend::connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379").await?);
    /// # let _ = locker; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<EtcdBackend> {
        EtcdBackend::connect_with(EtcdOptions::from_url(url)?).await
    }

    /// Connects with explicit options, read from a URL by
    /// [`EtcdOptions::from_url`] and adjusted in code.
    ///
    /// The options' values are checked and their TLS files read first, as
    /// [`EtcdOptions::check`] does: a bad value or a file that cannot be
    /// read is refused with [`Error::InvalidInput`] naming its URL option,
    /// before any member is dialled. Then reads the member list, so an
    /// unreachable cluster or one without a quorum is reported here as
    /// [`Error::Unavailable`].
    pub async fn connect_with(options: EtcdOptions) -> Result<EtcdBackend> {
        let connect = connect_options(&options)?;
        let endpoint = Endpoint(options.url.to_string());
        let endpoints = config::endpoints(&options.url, options.ca_file.is_some());
        let client = endpoint
            .bounded(
                "connect",
                options.connect_timeout,
                || Client::connect(endpoints.clone(), Some(connect.clone())),
                |_| None,
            )
            .await?;
        let members = endpoint
            .bounded(
                "member list",
                options.response_timeout,
                || {
                    let mut c = client.clone();
                    async move { c.member_list().await }
                },
                |_| None,
            )
            .await?;
        let voters = members
            .members()
            .iter()
            .filter(|m| !m.is_learner())
            .count()
            .max(1);
        let limits = lock_core::Limits {
            min_ttl: options.min_ttl,
            ttl_granularity: Duration::from_secs(1),
            ..lock_core::Limits::default()
        };
        let capabilities = Capabilities::new("etcd", SafetyModel::Consensus)
            .with_read_write(Offer::Offered {
                waiting_order: WaitingOrder::Fifo {
                    stall: Stall::WaiterTtl,
                },
            })
            .with_fencing(FencingGuarantee::Strict, [Assumption::ConsensusMajority])
            .with_wake_up(WakeUp::Watch)
            .with_waiting_order(WaitingOrder::Fifo {
                stall: Stall::WaiterTtl,
            })
            .with_lock_outlives_connection(true)
            .with_tolerated_server_failures((voters - 1) / 2)
            .with_remaining_ttl(true)
            .with_limits(limits)
            .with_semaphore(Offer::Offered {
                waiting_order: WaitingOrder::Fifo {
                    stall: Stall::WaiterTtl,
                },
            });
        let inner = Inner {
            client,
            endpoint,
            prefix: options.prefix,
            response_timeout: options.response_timeout,
            capabilities,
            idle_leases: LeasePool::default(),
            feeds: Feeds::default(),
        };
        Ok(EtcdBackend {
            inner: Arc::new(inner),
        })
    }

    // ---- inspection and operator tools ----------------------------------

    /// The current holder of `key`, if any: the entry with the lowest create
    /// revision in the lock's queue.
    pub async fn holder(&self, key: &str) -> Result<Option<Holder>> {
        let head = self.head_entry(&self.validate(key)?).await?;
        Ok(head.map(|kv| Holder {
            lease_id: kv.lease(),
            fencing_token: FencingToken::new(kv.create_revision() as u64),
        }))
    }

    /// The entry heading the queue of `key`: its holder's.
    async fn head_entry(&self, key: &LockKey) -> Result<Option<KeyValue>> {
        let queue = self.queue(key);
        let resp = self
            .call("get holder", |mut c| {
                let queue = queue.clone();
                async move { c.get(queue.prefix(), Some(queue.head())).await }
            })
            .await?;
        Ok(resp.kvs().first().cloned())
    }

    /// How many entries the queue of `key` holds: the holder plus waiters.
    pub async fn queue_len(&self, key: &str) -> Result<usize> {
        let queue = self.queue(&self.validate(key)?);
        let resp = self
            .call("count queue", |mut c| {
                let prefix = queue.prefix().to_vec();
                async move {
                    let options = GetOptions::new().with_prefix().with_count_only();
                    c.get(prefix, Some(options)).await
                }
            })
            .await?;
        Ok(resp.count() as usize)
    }

    /// Revokes an etcd lease, deleting every entry bound to it. To take a
    /// lock away, prefer `Locker::force_release`: a lease read from
    /// [`holder`](Self::holder) may, by the time it is revoked, serve
    /// another lock (its holder released, and the lease went on to its next
    /// acquire).
    pub async fn revoke_lease(&self, lease_id: i64) -> Result<()> {
        self.call("lease revoke", |mut c| async move {
            c.lease_revoke(lease_id).await
        })
        .await
        .map(|_| ())
    }

    // ---- requests -------------------------------------------------------

    fn client(&self) -> Client {
        self.inner.client.clone()
    }

    fn validate(&self, key: &str) -> Result<LockKey> {
        lock_core::raw::validate::key(key, &self.inner.capabilities.limits)
    }

    fn queue(&self, key: &LockKey) -> Queue {
        Queue::new(&self.inner.prefix, key)
    }

    async fn call<T, F: Future<Output = std::result::Result<T, etcd_client::Error>>>(
        &self,
        what: &str,
        mut request: impl FnMut(Client) -> F,
    ) -> Result<T> {
        self.inner
            .endpoint
            .bounded(
                what,
                self.inner.response_timeout,
                || request(self.client()),
                |_| None,
            )
            .await
    }

    /// A request on a lease: "lease not found" means the lock is lost.
    async fn call_lease<T, F: Future<Output = std::result::Result<T, etcd_client::Error>>>(
        &self,
        key: &LockKey,
        what: &str,
        mut request: impl FnMut(Client) -> F,
    ) -> Result<T> {
        let lost = |e: &etcd_client::Error| {
            is_lease_gone(e).then(|| Error::lost(key.as_str(), LostReason::NotHeld))
        };
        self.inner
            .endpoint
            .bounded(
                what,
                self.inner.response_timeout,
                || request(self.client()),
                lost,
            )
            .await
    }

    async fn txn(&self, what: &str, txn: etcd_client::Txn) -> Result<TxnResponse> {
        self.call(what, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Grants a lease and puts this contender's entry in the queue, all in
    /// one request when the queue is empty. Returns the entry and whether it
    /// heads the queue.
    async fn enqueue(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<(Entry, bool)> {
        match self.join(key, owner, ttl, Join::Queue).await? {
            Joined::Entry(entry, heads) => Ok((entry, heads)),
            Joined::Held { .. } => Err(backend_error("enqueue: no entry was put")),
        }
    }

    /// Sends `request`, built for the entry of `lease` and that lease, which
    /// may put the entry. Returns the reply, the entry, and a revoke of the
    /// lease armed for it: a dropped or failed acquire gives the entry back.
    async fn put_entry(
        &self,
        key: &LockKey,
        ttl: Duration,
        lease: &mut NewLease,
        request: impl Fn(&[u8], i64) -> etcd_client::Txn,
    ) -> Result<(TxnResponse, Vec<u8>, RevokeOnDrop)> {
        let queue = self.queue(key);
        loop {
            let revoke = RevokeOnDrop {
                backend: Some(self.clone()),
                lease_id: lease.id,
            };
            let entry = queue.entry(lease.id);
            let txn = request(&entry, lease.id);
            let put = self.call_lease(key, "enqueue", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            });
            match put.await {
                Ok(resp) => return Ok((resp, entry, revoke)),
                // An idle lease was revoked since it was kept or renewed: a
                // new lease, once.
                Err(Error::Lost { .. }) if lease.from_pool => {
                    let mut gone = revoke;
                    gone.disarm();
                    *lease = NewLease::granted(self.grant_lease(ttl).await?);
                }
                Err(Error::Lost { .. }) => {
                    return Err(backend_error(
                        "enqueue: the lease just granted or renewed is gone (revoked by someone else?)",
                    ));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes a lease and sends the queue's join request: [`Join::Queue`]
    /// always puts the entry, [`Join::Try`] only into an empty queue.
    async fn join(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        how: Join,
    ) -> Result<Joined> {
        let queue = self.queue(key);
        let mut lease = self.lease_for(key, ttl).await?;
        let owner_hex = owner.to_hex();
        let (resp, entry, revoke) = self
            .put_entry(key, ttl, &mut lease, |entry, lease_id| match how {
                Join::Queue => queue.enqueue(entry, lease_id, &owner_hex),
                Join::Try => queue.try_take(entry, lease_id, &owner_hex),
            })
            .await?;
        let (lease_id, sent) = (lease.id, lease.renewed);
        let heads = match Queue::joined(&resp) {
            Ok(Some(heads)) => heads,
            Ok(None) => {
                // Nothing was put, so no entry is bound to the lease: kept
                // for the next acquire, and nothing was written.
                let mut unused = revoke;
                unused.disarm();
                let idle = EtcdLease {
                    id: lease_id,
                    ttl_secs: ttl.as_secs() as i64,
                    renewed: sent,
                };
                self.retire_lease(idle).await;
                let head = gets(&resp).into_iter().next().flatten();
                if let Some(conflict) = modes::conflict(key, head.as_ref(), Mode::Exclusive) {
                    return Err(conflict);
                }
                return Ok(Joined::Held { head });
            }
            Err(()) => {
                return Err(backend_error(
                    "enqueue: an entry for a freshly granted lease already exists",
                ));
            }
        };
        // Held as a semaphore: refused, rather than waiting behind permits
        // that may be renewed for ever.
        if !heads {
            let head = gets(&resp).into_iter().next().flatten();
            if let Some(conflict) = modes::conflict(key, head.as_ref(), Mode::Exclusive) {
                revoke.now().await;
                return Err(conflict);
            }
        }
        // The entry's create revision: its fencing token, and the revision
        // the entries ahead were read at.
        let revision = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| backend_error("enqueue: a reply without a revision"))?;
        // Read only when the queue was not empty: an entry that heads an
        // empty queue has nothing ahead.
        let ahead = match resp.op_responses().into_iter().nth(2) {
            Some(TxnOpResponse::Get(newest)) => Ahead::at_enqueue(&newest, &entry),
            _ if heads => Some(Ahead {
                all: true,
                count: Some(0),
                ..Ahead::default()
            }),
            _ => None,
        }
        .unwrap_or_default();
        let entry = Entry {
            entry,
            lease_id,
            ttl_secs: ttl.as_secs() as i64,
            revision,
            sent,
            ahead,
            revoke,
        };
        Ok(Joined::Entry(entry, heads))
    }

    /// Finds the entry and etcd lease of `lease`: from its state, or, for a
    /// lease rebuilt elsewhere, by its fencing token (its create revision).
    async fn locate<'a>(&self, lease: &'a Lease) -> Result<Located<'a>> {
        if let Some(held) = lease.state().and_then(|s| s.downcast_ref::<Held>()) {
            if held.released.load(Ordering::Acquire) {
                return Err(Error::lost(lease.key().as_str(), LostReason::NotHeld));
            }
            let EtcdLease { id, ttl_secs, .. } = held.lease();
            return Ok(Located {
                entry: held.entry.clone(),
                lease_id: id,
                ttl_secs,
                held: Some(held),
            });
        }
        let not_held = || Error::lost(lease.key().as_str(), LostReason::NotHeld);
        let revision = i64::try_from(lease.fencing_token().get()).map_err(|_| not_held())?;
        let queue = self.queue(lease.key());
        let resp = self
            .call("find entry", |mut c| {
                let queue = queue.clone();
                async move {
                    c.get(queue.prefix(), Some(queue.created_at(revision)))
                        .await
                }
            })
            .await?;
        let kv = resp.kvs().first().ok_or_else(not_held)?;
        if kv.value() != modes::value(lease.owner(), lease.mode()).as_bytes() {
            return Err(not_held());
        }
        let lease_id = kv.lease();
        let ttl = self
            .call_lease(lease.key(), "lease time-to-live", |mut c| async move {
                c.lease_time_to_live(lease_id, None).await
            })
            .await?;
        Ok(Located {
            entry: kv.key().to_vec(),
            lease_id: kv.lease(),
            ttl_secs: ttl.granted_ttl(),
            held: None,
        })
    }
}

/// The client's settings for `options`: their values checked and the TLS
/// files read, before anything connects.
fn connect_options(options: &EtcdOptions) -> Result<ConnectOptions> {
    let tls = options.tls_files()?;
    let mut connect = ConnectOptions::new()
        .with_connect_timeout(options.connect_timeout)
        // A member without a leader answers at once with "no leader"
        // instead of waiting for one.
        .with_require_leader(true)
        // Finds dead connections (a paused member) on idle watch streams too.
        // The HTTP/2 client adds these to the clock unchecked, so "no limit" is 30 years.
        .with_keep_alive(
            options
                .response_timeout
                .clamp(Duration::from_secs(1), errors::FAR_FUTURE),
            options.response_timeout.min(errors::FAR_FUTURE),
        );
    if let Some(user) = &options.user {
        let password = options.password.as_ref().map(|p| p.expose()).unwrap_or("");
        connect = connect.with_user(user.as_str(), password);
    }
    Ok(match tls {
        Some(files) => with_tls(connect, files),
        None => connect,
    })
}

#[cfg(feature = "tls")]
fn with_tls(connect: ConnectOptions, files: config::TlsFiles) -> ConnectOptions {
    let mut tls =
        etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(files.ca));
    if let Some((cert, key)) = files.client {
        tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
    }
    connect.with_tls(tls)
}

/// Never reached: without the `tls` feature, TLS options are refused by
/// the check that reads their files.
#[cfg(not(feature = "tls"))]
fn with_tls(connect: ConnectOptions, _files: config::TlsFiles) -> ConnectOptions {
    connect
}

fn backend_error(message: &str) -> Error {
    Error::Backend {
        backend: "etcd",
        message: message.to_owned(),
        source: None,
    }
}

/// The reads of a transaction's reply, in order.
pub(crate) fn reads(resp: &TxnResponse) -> impl Iterator<Item = etcd_client::GetResponse> {
    resp.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(read) => Some(read),
        _ => None,
    })
}

/// The first key of each get in a transaction's responses, in order.
fn gets(resp: &TxnResponse) -> Vec<Option<KeyValue>> {
    reads(resp)
        .map(|read| read.kvs().first().cloned())
        .collect()
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = "etcd", key = %key))]
    async fn try_acquire(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Grant> {
        // The same queue as `acquire`, so that a try never jumps the queue: an
        // entry that does not head it leaves at once.
        // A try puts its entry only into an empty queue, and otherwise writes
        // nothing.
        match self.join(key, owner, ttl, Join::Try).await? {
            Joined::Entry(entry, true) => {
                let sent = entry.sent;
                Ok(entry.into_grant(sent))
            }
            Joined::Entry(entry, false) => {
                entry.revoke.now().await;
                Err(Error::Contended {
                    key: key.to_string(),
                    remaining: None,
                })
            }
            Joined::Held { head } => {
                let remaining = match head {
                    Some(h) => self.remaining(h.lease()).await,
                    None => None,
                };
                Err(Error::Contended {
                    key: key.to_string(),
                    remaining,
                })
            }
        }
    }

    /// Permits of a semaphore and read holds (entries of the lock's queue,
    /// see the crate docs); the exclusive lock, which is also the writer,
    /// as `try_acquire`.
    async fn try_acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
    ) -> Result<Grant> {
        match mode {
            Mode::Exclusive => self.try_acquire(key, owner, ttl).await,
            Mode::Semaphore { permits } => {
                self.try_share(key, owner, ttl, Sharing::Permits(permits))
                    .await
            }
            Mode::Shared => self.try_share(key, owner, ttl, Sharing::Readers).await,
            other => Err(Error::unsupported_mode(self.capabilities(), &other)),
        }
    }

    /// Permit and read waiters wait in line (see the crate docs), as the
    /// exclusive lock's do.
    async fn acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
        wait: &Waiting,
    ) -> Result<Grant> {
        match mode {
            Mode::Exclusive => self.acquire(key, owner, ttl, wait).await,
            Mode::Semaphore { permits } => {
                self.acquire_shared(key, owner, ttl, Sharing::Permits(permits), wait)
                    .await
            }
            Mode::Shared => {
                self.acquire_shared(key, owner, ttl, Sharing::Readers, wait)
                    .await
            }
            other => Err(Error::unsupported_mode(self.capabilities(), &other)),
        }
    }

    /// Fair, herd-free waiting (etcd's own mutex recipe): the entry waits
    /// for the deletion of the one just ahead of it, and is granted when it
    /// heads the queue and its lease is renewed.
    #[tracing::instrument(level = "debug", skip_all, fields(backend = "etcd", key = %key))]
    async fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        wait: &Waiting,
    ) -> Result<Grant> {
        let mut last_error = None;
        let mut tries = 0u32;
        loop {
            // Joined before enqueueing, a live feed of the queue's deletions
            // covers every one after the entry is created.
            let joined = self.inner.feeds.join(self.queue(key).prefix());
            // Enqueueing is not cut short by the end of the wait, so that even
            // a zero wait makes one attempt.
            let (entry, heads) = match self.enqueue(key, owner, ttl).await {
                Ok(enqueued) => enqueued,
                Err(e @ Error::Unavailable { .. }) => {
                    let now = Instant::now();
                    if now >= wait.until {
                        return Err(e);
                    }
                    sleep(wait.backoff.delay(tries).min(wait.until - now)).await;
                    tries = tries.saturating_add(1);
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if heads {
                let sent = entry.sent;
                return Ok(entry.into_grant(sent));
            }
            let lease_id = entry.lease_id;
            if Instant::now() >= wait.until {
                entry.revoke.now().await;
                return Err(last_error.unwrap_or_else(|| wait.timed_out(key)));
            }
            last_error = None;
            match timeout_at(
                wait.until,
                self.wait_in_queue(key, entry, joined, ttl, wait, &mut last_error),
            )
            .await
            {
                Ok(Ok(Some(grant))) => return Ok(grant),
                Ok(Ok(None)) => {}
                Ok(Err(e @ Error::Unavailable { .. })) => {
                    let now = Instant::now();
                    if now >= wait.until {
                        return Err(e);
                    }
                    sleep(wait.backoff.delay(tries).min(wait.until - now)).await;
                    tries = tries.saturating_add(1);
                    last_error = Some(e);
                }
                Ok(Err(e)) => return Err(e),
                Err(_elapsed) => {
                    // Leave the queue before reporting, so that the next
                    // contender does not find this entry ahead of it.
                    self.revoke_quietly(lease_id).await;
                    return Err(last_error.unwrap_or_else(|| wait.timed_out(key)));
                }
            }
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = "etcd", key = %lease.key()))]
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let key = lease.key();
        let not_held = || Error::lost(key.as_str(), LostReason::NotHeld);
        let located = self.locate(lease).await?;
        let revision = lease.fencing_token().get() as i64;
        let value = modes::value(lease.owner(), lease.mode());
        let secs = ttl.as_secs() as i64;
        // A keep-alive restores the lease's own TTL. For a TTL no longer than
        // that, this is enough: the server then keeps the grant at least as
        // long as the holder's new deadline says.
        if secs <= located.ttl_secs {
            let sent = Instant::now();
            let (alive, mine) = tokio::join!(
                self.keep_alive(key, located.lease_id),
                self.call("get entry", |mut c| {
                    let entry = located.entry.clone();
                    async move { c.get(entry, None).await }
                })
            );
            alive?;
            if let Some(held) = located.held {
                held.renewed(located.lease_id, sent);
            }
            let mine = mine?;
            let ours = mine.kvs().first().is_some_and(|kv| {
                kv.create_revision() == revision
                    && kv.value() == value.as_bytes()
                    && kv.lease() == located.lease_id
            });
            return if ours { Ok(()) } else { Err(not_held()) };
        }
        // A longer TTL: an etcd lease keeps the TTL it was granted with, so
        // move the entry to a new, longer lease (same create revision, so
        // same token and place). The new lease is revoked only when the move
        // is known to have failed. If the outcome is unknown (an error, or
        // this future dropped), the entry may already be bound to it, and
        // revoking it would free the lock while the holder still counts on
        // its old deadline; left alone, an unused lease lapses after its TTL.
        let (new_lease, granted) = self.grant_lease(ttl).await?;
        let moved = Queue::move_to_lease(
            &located.entry,
            revision,
            &value,
            located.lease_id,
            new_lease,
        );
        if !self
            .txn("move entry to a new lease", moved)
            .await?
            .succeeded()
        {
            self.revoke_quietly(new_lease).await;
            return Err(not_held());
        }
        if let Some(held) = located.held {
            held.set_lease(EtcdLease {
                id: new_lease,
                ttl_secs: secs,
                renewed: granted,
            });
            // A release that ran meanwhile (both called on the backend
            // directly) may have put the old lease in the idle pool, where
            // a revoke would take it from its next lock: left to lapse.
            if !held.released.load(Ordering::Acquire) {
                self.revoke_quietly(located.lease_id).await;
            }
        }
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = "etcd", key = %lease.key()))]
    async fn release(&self, lease: &Lease) -> Result<()> {
        let located = self.locate(lease).await?;
        let not_held = || Error::lost(lease.key().as_str(), LostReason::NotHeld);
        // One release per grant: once one succeeded, the etcd lease may serve
        // another lock, and a second release must not revoke it.
        if let Some(held) = located.held
            && held.released.swap(true, Ordering::AcqRel)
        {
            return Err(not_held());
        }
        let revision = lease.fencing_token().get() as i64;
        let deleted = match located.held {
            // Our own grant: the entry's key names its etcd lease, which is
            // bound to this entry only until this release (the `released`
            // flag above), so no one else can have created that key since
            // the grant, and a plain delete cannot take another holder's
            // entry. It deletes nothing if the entry is gone (expired,
            // revoked, forced).
            Some(_) => self
                .call("release", |mut c| {
                    let entry = located.entry.clone();
                    async move { c.delete(entry, None).await }
                })
                .await
                .map(|resp| resp.deleted() > 0),
            // A rebuilt lease: its entry is found by revision and owner.
            None => self
                .txn(
                    "release",
                    Queue::release(
                        &located.entry,
                        revision,
                        &modes::value(lease.owner(), lease.mode()),
                    ),
                )
                .await
                .map(|resp| resp.succeeded()),
        };
        let deleted = match deleted {
            Ok(deleted) => deleted,
            Err(e) => {
                if let Some(held) = located.held {
                    // No reply: the delete may or may not have run. Ending
                    // the lease deletes the entry either way, so the lock
                    // does not stay held until the TTL; the lease is not
                    // reused, so a retry (allowed again) cannot touch a
                    // later grant.
                    self.revoke_quietly(held.lease().id).await;
                    held.released.store(false, Ordering::Release);
                }
                return Err(e);
            }
        };
        // Only a lease of our own is ended: a rebuilt lease's etcd lease id
        // was read from the entry, which may have changed hands since. Kept
        // for reuse only when the delete is known to have unbound it.
        if let Some(held) = located.held {
            if deleted {
                self.retire_lease(held.lease()).await;
            } else {
                self.revoke_quietly(located.lease_id).await;
            }
        }
        if deleted { Ok(()) } else { Err(not_held()) }
    }

    /// Revokes the idle leases kept for the next acquires.
    async fn close_idle(&self) {
        self.revoke_idle_leases().await
    }

    async fn inspect(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let namespace = self.inner.prefix.clone();
        // Read in pages: one response for a whole busy namespace can exceed
        // gRPC's message limit.
        const PAGE: i64 = 1000;
        let end = prefix_end(namespace.as_bytes());
        let mut from = namespace.clone().into_bytes();
        let mut kvs = Vec::new();
        loop {
            let resp = self
                .call("list locks", |mut c| {
                    let (from, end) = (from.clone(), end.clone());
                    async move {
                        // With values: they say each entry's mode.
                        let options = GetOptions::new().with_range(end).with_limit(PAGE);
                        c.get(from, Some(options)).await
                    }
                })
                .await?;
            let page: Vec<Listed> = resp.kvs().iter().map(Listed::of).collect();
            let Some(last) = page.last() else {
                break;
            };
            from = last.entry.iter().copied().chain([0]).collect();
            kvs.extend(page);
            if !resp.more() {
                break;
            }
        }
        // Each queue's entries, and its holders among them.
        let mut queues: std::collections::BTreeMap<String, Vec<Listed>> = Default::default();
        for listed in kvs {
            let Some(key) = queue::lock_key(&listed.entry[namespace.len()..]) else {
                continue;
            };
            if !key.starts_with(prefix) {
                continue;
            }
            queues.entry(key).or_default().push(listed);
        }
        let mut held = Vec::with_capacity(queues.len());
        for (key, mut entries) in queues {
            entries.sort_by_key(|e| e.revision);
            for listed in holders::holders(&entries) {
                let lock = HeldLock::new(key.clone())
                    .with_fencing_token(FencingToken::new(listed.revision as u64))
                    .with_mode(listed.mode);
                held.push(match self.remaining(listed.lease).await {
                    Some(remaining) => lock.with_remaining(remaining),
                    None => lock,
                });
            }
        }
        Ok(held)
    }

    /// Deletes the holders' entries (a read-held key's every reader, a
    /// semaphore's every permit), and only those entries (each by its
    /// create revision). Revoking their leases instead could take another
    /// lock away: had a holder released meanwhile, its lease may already be
    /// back in use, bound to an entry of another lock. A holder learns of
    /// the loss from its loss signal or its next renewal.
    ///
    /// The holders are those of one read of the queue, deleted in one
    /// transaction (one per 128 holders, etcd's default `--max-txn-ops`),
    /// so an error leaves them all in place. A waiter granted after the read (as a
    /// holder released, or by this very release) keeps its hold.
    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        let queue = self.queue(key);
        let resp = self
            .call("read the queue", |mut c| {
                let queue = queue.clone();
                async move { c.get(queue.prefix(), Some(queue.in_order())).await }
            })
            .await?;
        let entries: Vec<Listed> = resp.kvs().iter().map(Listed::of).collect();
        // Each holder's own release, as if made by it: the entry goes only
        // if it is still the one read, with the same owner. Not deleted:
        // released or expired meanwhile.
        let deletes: Vec<TxnOp> = holders::holders(&entries)
            .map(|holder| {
                let value = String::from_utf8_lossy(&holder.value);
                TxnOp::txn(Queue::release(&holder.entry, holder.revision, &value))
            })
            .collect();
        let mut freed = false;
        for batch in deletes.chunks(FORCED_AT_ONCE) {
            let resp = self
                .txn(
                    "force release",
                    etcd_client::Txn::new().and_then(batch.to_vec()),
                )
                .await?;
            freed |= resp
                .op_responses()
                .iter()
                .any(|r| matches!(r, TxnOpResponse::Txn(delete) if delete.succeeded()));
        }
        Ok(freed)
    }

    /// Fires when the holder's entry is deleted: its lease revoked or
    /// expired, or the key deleted by hand.
    fn loss_signal(&self, lease: &Lease) -> Option<LossFuture> {
        let held = lease.state()?.downcast_ref::<Held>()?;
        let entry = held.entry.clone();
        let revision = lease.fencing_token().get() as i64;
        let backend = self.clone();
        Some(Box::pin(async move {
            let mut from = revision + 1;
            let mut tries = 0u32;
            loop {
                let timeout = backend.inner.response_timeout;
                if let Watched::Deleted(_) =
                    wake::deletion(backend.client(), entry.clone(), from, timeout).await
                {
                    return LostReason::NotHeld;
                }
                sleep(lock_core::Backoff::default().delay(tries)).await;
                tries = tries.saturating_add(1);
                let read = backend.call("get entry", |mut c| {
                    let entry = entry.clone();
                    async move { c.get(entry, None).await }
                });
                if let Ok(resp) = read.await {
                    match resp.kvs().first() {
                        Some(kv) if kv.create_revision() == revision => {
                            from = resp.header().map(|h| h.revision() + 1).unwrap_or(from);
                        }
                        _ => return LostReason::NotHeld,
                    }
                }
            }
        }))
    }
}

/// How many holders one forced release deletes in one transaction: etcd
/// refuses a transaction of more operations than its `--max-txn-ops`
/// (128 by default).
const FORCED_AT_ONCE: usize = 128;

/// The end of the key range holding every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the keyspace.
    vec![0]
}
