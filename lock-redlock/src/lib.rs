#![doc = include_str!("../README.md")]

mod config;
mod line;
mod nodes;
mod quorum;
mod readers;
mod wake;

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{
    DEFAULT_WAITER_LEASE, GiveBack, Grant, LeaveFuture, Place, WakeUpFuture, async_trait,
};
use lock_core::{
    Assumption, Capabilities, DriftMargin, Error, FencingGuarantee, FencingToken, Lease,
    LockBackend, LockKey, LostReason, Mode, Offer, OwnerToken, Result, SafetyModel, Stall,
    WaitingOrder, WakeUp,
};
pub use lock_redis_wire::LockKeys;
use lock_redis_wire::scripts::{self, AcquireReply};
use lock_redis_wire::socket::Dial;
use lock_redis_wire::{Batcher, Claim, Handout, KeyLayout, RedisSettings, Timeouts, TokenRule};

use line::Lines;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

pub use config::RedlockOptions;
pub use quorum::{QuorumError, quorum, tolerated_failures, validity};

use nodes::{Node, NodeResult, Nodes, Probe};
use quorum::{Reply, Tally};
use wake::Wakeups;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["redlock"];

const BACKEND: &str = "redlock";

/// Redlock over N independent Redis masters: a lock is held while a
/// majority of the nodes holds it. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Nodes,
    endpoints: Vec<String>,
    /// All nodes, without passwords: the endpoint of errors about the set.
    url: String,
    layout: KeyLayout,
    capabilities: Capabilities,
    wakeups: Wakeups,
    /// This client's places in the locks' waiting lines, kept.
    lines: Lines,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("url", &self.inner.url)
            .field("quorum", &quorum(self.inner.nodes.len()))
            .field("node_timeout", &self.inner.nodes.timeout())
            .finish()
    }
}

impl RedlockBackend {
    /// Checks a URL as [`connect`](Self::connect) reads it, without
    /// connecting: a malformed URL or an unknown option is refused the same.
    pub fn check_url(url: &str) -> Result<()> {
        RedlockOptions::from_url(url).map(drop)
    }

    /// Connects to the nodes of a `redlock://host1:port1,host2:port2,...` URL,
    /// with the options in its query (see [`RedlockOptions`]).
    ///
    /// ```no_run
    /// # async fn demo() -> lock_core::Result<()> {
    /// use lock_core::Locker;
    /// use lock_redlock::RedlockBackend;
    ///
    /// let locker = Locker::new(RedlockBackend::connect("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?);
    /// # let _ = locker; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<RedlockBackend> {
        Self::connect_with(RedlockOptions::from_url(url)?).await
    }

    /// Connects with explicit options, read from a URL by
    /// [`RedlockOptions::from_url`] and adjusted in code.
    ///
    /// Succeeds when a majority of the nodes answers within the connect
    /// timeout; the others are retried in the background (a warning names them).
    /// The options' values are checked first, as [`RedlockOptions::check`]
    /// does: a bad one is refused with [`Error::InvalidInput`] naming its
    /// URL option, before any node is dialled.
    pub async fn connect_with(options: RedlockOptions) -> Result<RedlockBackend> {
        let (settings, node_timeout) = options.checked()?;
        let n = settings.servers.len();
        if n % 2 == 0 {
            tracing::warn!(
                url = %settings.url,
                "{n} Redlock nodes need {} to agree and so survive {} failures, no more than {} nodes would; use an odd number",
                quorum(n),
                tolerated_failures(n),
                n - 1
            );
        }
        let nodes = Nodes::new(connections(&settings, node_timeout)?, node_timeout);
        // Connect to all at once; a minority may be down now and come back later.
        let connect_timeout = settings.timeouts.connect;
        let reachable = Nodes::new(nodes.nodes().to_vec(), connect_timeout);
        let answers = reachable.ask_all(Node::probe).await;
        let tally = Tally::new(
            (answers.iter())
                .map(|a| match a {
                    Ok(_) => Reply::Done(()),
                    Err(why) => Reply::Failed(why.clone()),
                })
                .collect(),
        );
        let probes: Vec<Option<Probe>> = answers.into_iter().map(Result::ok).collect();
        refuse_one_server_twice(&settings, &probes)?;
        if !tally.has_quorum() {
            let err = tally.to_error("connect", &settings.endpoints);
            return Err(unavailable(&settings.url, err));
        }
        for (endpoint, why) in tally.to_error("connect", &settings.endpoints).failed {
            tracing::warn!(%endpoint, reason = %why, "Redlock node unreachable; continuing with a majority");
        }
        let eviction = evicting_nodes(&settings, &probes);
        let clients = (0..n)
            .map(|i| settings.client(i))
            .collect::<Result<Vec<_>>>()?;
        // One node is no quorum: it is a single server, whose restart or
        // failover breaks the lock (two already ask both to agree).
        let safety = if n == 1 {
            SafetyModel::SingleNode
        } else {
            SafetyModel::QuorumWithTimingAssumptions
        };
        let capabilities = Capabilities::new(BACKEND, safety)
            .with_read_write(Offer::Offered {
                // Readers are let in by their polls and wake-ups, in no
                // order; writers wait in the exclusive lock's line.
                waiting_order: WaitingOrder::Unordered,
            })
            .with_fencing(
                FencingGuarantee::Strict,
                [
                    Assumption::MajorityKeepsState,
                    Assumption::ServerClockNeverStepsBack,
                    Assumption::BoundedClockDrift,
                    Assumption::BoundedDelaysAndPauses,
                ],
            )
            .with_exclusion_resting_on([Assumption::ServerEvictsNoLockKeys])
            .with_wake_up(WakeUp::PubSub)
            .with_waiting_order(WaitingOrder::Within {
                within: arrival_window(node_timeout),
                stall: Stall::WaiterLease(DEFAULT_WAITER_LEASE),
            })
            .with_tolerated_server_failures(tolerated_failures(n))
            .with_remaining_ttl(true)
            .with_semaphore(Offer::Refused {
                reason: "not built yet: a permit over independent masters must be counted on a majority, \
                         and no sound count of holders across them is built",
            });
        let capabilities = match eviction {
            Some(nodes) => capabilities.with_lock_key_eviction(nodes),
            None => capabilities,
        };
        Ok(RedlockBackend {
            inner: Arc::new(Inner {
                endpoints: settings.endpoints.clone(),
                url: settings.url.clone(),
                layout: settings.layout.clone(),
                wakeups: Wakeups::start(clients, node_timeout, connect_timeout),
                nodes,
                capabilities,
                lines: Lines::new(DEFAULT_WAITER_LEASE),
            }),
        })
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
    }

    /// The number of nodes that must agree.
    pub fn quorum(&self) -> usize {
        quorum(self.inner.nodes.len())
    }

    /// The Redis names of the lock `key` on every node: its grant, its
    /// fencing counter and its release channel.
    pub fn redis_keys(&self, key: &str) -> LockKeys {
        self.inner.layout.keys(key)
    }

    /// Not part of the API, for tests: how many channels the wake-ups keep
    /// an entry for, and how many subscription changes wait for the nodes'
    /// tasks (summed over the nodes).
    #[doc(hidden)]
    pub fn wake_up_backlog(&self) -> (usize, usize) {
        self.inner.wakeups.backlog()
    }

    fn keys(&self, key: &LockKey) -> LockKeys {
        self.inner.layout.keys(key.as_str())
    }

    /// Releases the claim's grant on the nodes picked by `which`, all at
    /// once; `token` (0 when the grant has none yet) is the release message.
    async fn release_on(&self, claim: &Arc<Claim>, token: u64, which: impl Fn(usize) -> bool) {
        self.inner
            .nodes
            .ask(which, |node| node.batcher.release(claim.clone(), token))
            .await;
    }

    /// Takes `entry` out of the lock's line on the nodes picked by `which`,
    /// handing the turn on where the key was reserved for it.
    async fn leave_on(&self, keys: &LockKeys, entry: &str, which: impl Fn(usize) -> bool) {
        let answers = self
            .inner
            .nodes
            .ask(which, |node| {
                let mut c = node.connection.clone();
                async move { scripts::leave_line(&mut c, keys, entry).await }
            })
            .await;
        if answers.iter().any(|a| matches!(a, Some(Err(_)))) {
            tracing::debug!(
                "could not leave the waiting line on every node; the place's lease bounds it"
            );
        }
    }

    /// Gives back `owner`'s grants on the nodes picked by `which`, keeping
    /// the waiter's place there (see [`scripts::give_back_turn`]).
    async fn give_back_on(
        &self,
        keys: &LockKeys,
        owner: &OwnerToken,
        entry: &str,
        which: impl Fn(usize) -> bool,
    ) {
        let lease = self.inner.lines.lease();
        self.inner
            .nodes
            .ask(which, |node| {
                let mut c = node.connection.clone();
                async move { scripts::give_back_turn(&mut c, keys, owner, entry, lease).await }
            })
            .await;
    }

    /// Makes `top`, the highest token of the granting majority, visible to
    /// any later majority: once a majority of the GRANTING nodes holds a
    /// counter of at least `top`, every later grant goes through one of
    /// them, and only after this grant is gone there, so after this write.
    /// (A node that did not grant may be granted to a later owner before a
    /// write reaches it, so it does not count.)
    async fn fence(
        &self,
        keys: &LockKeys,
        granted: &Tally<FencingToken>,
        ttl: Duration,
    ) -> Result<FencingToken> {
        let top = granted
            .done()
            .map(|(_, t)| *t)
            .max()
            .unwrap_or(FencingToken::new(0));
        let at_top: Vec<bool> = granted
            .replies()
            .iter()
            .map(|r| *r == Reply::Done(top))
            .collect();
        let needs_raise: Vec<bool> = granted
            .replies()
            .iter()
            .map(|r| matches!(r, Reply::Done(t) if *t < top))
            .collect();
        let q = quorum(self.inner.nodes.len());
        if at_top.iter().filter(|x| **x).count() >= q {
            return Ok(top);
        }
        let raised = self
            .inner
            .nodes
            .ask(
                |i| needs_raise[i],
                |node| {
                    let mut c = node.connection.clone();
                    async move { scripts::write_back(&mut c, keys, top, ttl).await }
                },
            )
            .await;
        let replies: Vec<Reply<FencingToken>> = granted
            .replies()
            .iter()
            .zip(raised)
            .map(|(acquired, raised)| match raised {
                Some(Ok(counter)) if counter >= top => Reply::Done(counter),
                Some(Ok(counter)) => Reply::Failed(format!("counter stayed at {}", counter.get())),
                Some(Err(why)) => Reply::Failed(why),
                None => acquired.clone(),
            })
            .collect();
        let written = Tally::new(replies);
        if written.has_quorum() {
            return Ok(top);
        }
        Err(unavailable(
            &self.inner.url,
            written.to_error("fencing write-back", &self.inner.endpoints),
        ))
    }

    /// Writes `top` back, best effort, to the nodes that granted after the
    /// attempt had returned at a majority, if their counter is below it, as
    /// [`fence`] did for the majority. The majority alone already makes the
    /// token safe; this makes more nodes carry it (so it survives more
    /// restarts without help from the clock), and spares the next grant a
    /// write-back to them. `behind`: the nodes whose late grant is in
    /// already, below `top`.
    ///
    /// [`fence`]: Self::fence
    async fn raise_late_grants<T, F>(
        self,
        keys: LockKeys,
        behind: Vec<usize>,
        mut late: nodes::Pending<F>,
        top: FencingToken,
        ttl: Duration,
    ) where
        T: Granted,
        F: Future<Output = redis::RedisResult<T>>,
    {
        for i in behind {
            self.write_back_late(i, &keys, top, ttl).await;
        }
        while let Some((i, answer)) = late.next().await {
            if is_grant_below(&answer, top) {
                self.write_back_late(i, &keys, top, ttl).await;
            }
        }
    }

    /// After a grant fenced at `top`: the late answers already in are looked
    /// at now, and a task is spawned only for a grant below the token or an
    /// answer still to come (at 64 tasks, in a profile, the task spawned for
    /// every acquire had 8.5% of the client's CPU samples; with this, the
    /// tasks still spawned have 6%).
    fn follow_late_grants<T, F>(
        &self,
        keys: &LockKeys,
        mut late: nodes::Pending<F>,
        top: FencingToken,
        ttl: Duration,
    ) where
        T: Granted + Send + 'static,
        F: Future<Output = redis::RedisResult<T>> + Send + 'static,
    {
        let behind: Vec<usize> = late
            .ready()
            .into_iter()
            .filter(|(_, answer)| is_grant_below(answer, top))
            .map(|(i, _)| i)
            .collect();
        if !behind.is_empty() || !late.is_empty() {
            tokio::spawn(
                self.clone()
                    .raise_late_grants(keys.clone(), behind, late, top, ttl),
            );
        }
    }

    /// Raises node `i`'s counter of the lock to `top`, best effort.
    async fn write_back_late(&self, i: usize, keys: &LockKeys, top: FencingToken, ttl: Duration) {
        let node = &self.inner.nodes.nodes()[i];
        let mut c = node.connection.clone();
        if let Err(e) = scripts::write_back(&mut c, keys, top, ttl).await {
            tracing::debug!(endpoint = %node.endpoint, error = %lock_redis_wire::errors::describe(&e), "late grant's token not written back");
        }
    }
}

/// Refuses two entries of the URL that reached one server under two names
/// (the same `run_id`), naming both: that server would count twice towards
/// a quorum. (Entries spelt alike are refused when the URL is read; a node
/// that did not answer cannot be compared.)
fn refuse_one_server_twice(settings: &RedisSettings, probes: &[Option<Probe>]) -> Result<()> {
    let run_ids: Vec<Option<&str>> = probes
        .iter()
        .map(|p| p.as_ref().and_then(|p| p.run_id.as_deref()))
        .collect();
    for (j, id) in run_ids.iter().enumerate() {
        let Some(id) = id else { continue };
        if let Some(i) = run_ids[..j].iter().position(|other| *other == Some(id)) {
            let entry = |i: usize| format!("node #{} ({})", i + 1, settings.addresses[i]);
            return Err(Error::invalid(
                "url",
                format!(
                    "{}: {} and {} are one server under two names (the same `run_id`); it would count twice towards a quorum, so list each node once",
                    settings.url,
                    entry(i),
                    entry(j)
                ),
            ));
        }
    }
    Ok(())
}

/// The nodes that may evict lock keys, with their policy, for the
/// capabilities, each warned of; `None` when there are none.
fn evicting_nodes(settings: &RedisSettings, probes: &[Option<Probe>]) -> Option<String> {
    let mut evicting = Vec::new();
    for (i, probe) in probes.iter().enumerate() {
        let node = format!("node #{} ({})", i + 1, settings.addresses[i]);
        match probe.as_ref().map(|p| &p.eviction) {
            Some(Ok(eviction)) if eviction.warn_if_evicting(&node) => {
                evicting.push(eviction.on(&node));
            }
            Some(Err(why)) => {
                tracing::warn!(
                    %node,
                    reason = %why,
                    "could not read whether the node may evict lock keys (neither `CONFIG GET maxmemory*` nor `INFO memory` answered)"
                );
                // Unknown counts as may-evict: a requirement that no server
                // evicts is not met by a server nobody could ask.
                evicting.push(format!(
                    "{}, {node}",
                    lock_redis_wire::server::UNREADABLE_POLICY
                ));
            }
            _ => {}
        }
    }
    (!evicting.is_empty()).then(|| evicting.join("; "))
}

/// Per node, one lazily connected, multiplexed connection, and the batcher
/// of acquires and releases.
fn connections(settings: &RedisSettings, node_timeout: Duration) -> Result<Vec<Node>> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.timeouts.connect))
        // The per-node timeout bounds every request for its caller; on the
        // connection it also ends a batch stuck on a paused or unreachable
        // node (over TLS or a Unix socket, where the batcher shares it), so
        // that the node's queue moves on rather than grow.
        .set_response_timeout(Some(node_timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    let timeouts = Timeouts {
        connect: settings.timeouts.connect,
        response: node_timeout,
    };
    (0..settings.servers.len())
        .map(|i| {
            let client = settings.client(i)?;
            let connection = ConnectionManager::new_lazy_with_config(client, config.clone())
                .map_err(|e| lock_redis_wire::map_error(BACKEND, &settings.endpoints[i], e))?;
            // Over plain TCP, acquires and releases take a connection of
            // their own, opened in the background: a node down now is
            // dialled again later, and one that stalls fails new requests
            // at once (see `Batcher::connect_in_background`).
            let batcher = match Dial::plain_tcp(&settings.servers[i], timeouts) {
                // Each fan-out bounds its nodes' answers itself.
                Some(dial) => Batcher::connect_in_background(
                    dial,
                    TokenRule::CounterFirst,
                    Handout::AllAtOnce,
                )
                .bounded_by_callers(),
                None => Batcher::start(
                    connection.clone(),
                    TokenRule::CounterFirst,
                    Handout::AllAtOnce,
                ),
            };
            Ok(Node {
                endpoint: settings.endpoints[i].clone(),
                batcher,
                connection,
            })
        })
        .collect()
}

/// How far apart two waiters' arrivals may be and still be granted in
/// either order: a wait's place reaches the nodes after its first attempt,
/// its subscription and its attempt in line, each bounded by the node
/// timeout on nodes that answer in time. (Places are ordered by their
/// clients' clocks: on several hosts, their disagreement adds to it.)
fn arrival_window(node_timeout: Duration) -> Duration {
    node_timeout.saturating_mul(3)
}

/// A node's answer to an acquire, in any mode: its token when granted.
trait Granted {
    fn token(&self) -> Option<FencingToken>;
}

impl Granted for AcquireReply {
    fn token(&self) -> Option<FencingToken> {
        match self {
            AcquireReply::Granted(token) => Some(*token),
            _ => None,
        }
    }
}

/// Whether a node's answer is a grant whose token is below `top`.
fn is_grant_below<T: Granted>(answer: &NodeResult<T>, top: FencingToken) -> bool {
    matches!(answer.as_ref().map(Granted::token), Ok(Some(token)) if token < top)
}

/// A quorum granted, but too late for the grant to be valid for any time.
fn granted_too_late(url: &str, ttl: Duration, elapsed: Duration) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        endpoint: url.to_owned(),
        reason: format!(
            "a quorum granted, but only after {elapsed:?}, which leaves no validity of a {ttl:?} TTL"
        ),
        source: None,
    }
}

fn reply_of<T>(answer: NodeResult<T>) -> Reply<T> {
    match answer {
        Ok(t) => Reply::Done(t),
        Err(why) => Reply::Failed(why),
    }
}

fn unavailable(url: &str, err: QuorumError) -> Error {
    tracing::debug!(error = %err, "no quorum");
    Error::Unavailable {
        backend: BACKEND,
        endpoint: url.to_owned(),
        reason: err.to_string(),
        source: Some(Box::new(err)),
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// Deletes the grant on every node; reports whether it was a lock: held
    /// by a majority, or by some and possibly by enough of the nodes that
    /// did not answer to make one. A grant on a minority only (a release
    /// that returned once a majority had deleted it, its deletes on the
    /// others still on their way, say) is deleted too, and reported as no
    /// lock. Needs a majority of the nodes to answer, or the grant may
    /// survive.
    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        let keys = &self.keys(key);
        let answers = self
            .inner
            .nodes
            .ask_all(|node| {
                let mut c = node.connection.clone();
                async move { scripts::force_release(&mut c, keys).await }
            })
            .await;
        let tally = Tally::new(answers.into_iter().map(reply_of).collect());
        if !tally.has_quorum() {
            return Err(unavailable(
                &self.inner.url,
                tally.to_error("force release", &self.inner.endpoints),
            ));
        }
        let q = quorum(tally.nodes());
        let had = tally.done().filter(|(_, deleted)| **deleted).count();
        let silent = tally.nodes() - tally.done_count();
        Ok(had >= q || (had > 0 && had + silent >= q))
    }

    async fn try_acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
    ) -> Result<Grant> {
        match mode {
            Mode::Exclusive => self.try_acquire(key, owner, ttl).await,
            Mode::Shared => self.try_acquire_read(key, owner, ttl).await,
            other => Err(Error::unsupported_mode(self.capabilities(), &other)),
        }
    }

    async fn try_acquire(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Grant> {
        let claim = &Claim::new(self.keys(key), owner);
        let keys = claim.keys();
        let sent = Instant::now();
        // The attempt returns once a majority has granted: the others'
        // answers (each bounded by the per-node timeout) are only needed to
        // raise a late grant's counter to the token, which a task does after
        // the lease is handed out (see `raise_late_grants`).
        // A waiter of ours is registered (maybe the caller itself, between
        // rounds of its wait): the grant's release is to publish, so that
        // whoever still waits is woken.
        let others_wait = self.inner.wakeups.is_waited_for(&keys.channel);
        // Dropped before it returns, the attempt gives back whatever the
        // nodes granted it, behind its acquires on each node's batcher:
        // those grants would block the key for their whole TTL (see
        // [`GiveBack`]). Every way out below either returns the grant or
        // releases it itself.
        let give_back = GiveBack::armed(|| {
            for node in self.inner.nodes.nodes() {
                drop(node.batcher.release(claim.clone(), 0));
            }
        });
        let q = quorum(self.inner.nodes.len());
        let (answers, late) = self
            .inner
            .nodes
            .ask_all_until(
                |node| node.batcher.acquire(claim.clone(), ttl, others_wait),
                |answers| {
                    let granted = answers
                        .iter()
                        .filter(|a| matches!(a, Some(Ok(AcquireReply::Granted(_)))))
                        .count();
                    granted >= q
                },
            )
            .await;
        let tally = Tally::new(
            answers
                .into_iter()
                .map(|a| match a {
                    Some(Ok(AcquireReply::Granted(token))) => Reply::Done(token),
                    Some(Ok(AcquireReply::Contended(remaining))) => Reply::Refused { remaining },
                    Some(Err(why)) => Reply::Failed(why),
                    // Not awaited, as a majority granted: it may grant yet.
                    None => Reply::Failed("no answer yet".into()),
                })
                .collect(),
        );
        // Any node that did not refuse may hold our grant, even one that
        // seemed to fail (its reply may be what got lost).
        let ours = |i: usize| !matches!(tally.replies()[i], Reply::Refused { .. });
        // From here the attempt releases what it does not return itself; its
        // releases are queued when first polled, in the same poll as the
        // give-back is disarmed.
        if tally.has_quorum() {
            let elapsed = sent.elapsed();
            if validity(ttl, elapsed, DriftMargin::default().for_ttl(ttl)).is_none() {
                give_back.disarm();
                self.release_on(claim, 0, ours).await;
                return Err(granted_too_late(&self.inner.url, ttl, elapsed));
            }
            let fenced = self.fence(keys, &tally, ttl).await;
            give_back.disarm();
            return match fenced {
                Ok(token) => {
                    self.follow_late_grants(keys, late, token, ttl);
                    Ok(Grant::new(token).sent_at(sent))
                }
                Err(e) => {
                    self.release_on(claim, 0, ours).await;
                    Err(e)
                }
            };
        }
        give_back.disarm();
        if (0..tally.nodes()).any(ours) {
            self.release_on(claim, 0, ours).await;
        }
        if tally.refused_by_majority_of_possible() {
            tracing::debug!(error = %tally.to_error("acquire", &self.inner.endpoints), "contended");
            return Err(Error::Contended {
                key: key.to_string(),
                remaining: tally.free_in(),
            });
        }
        Err(unavailable(
            &self.inner.url,
            tally.to_error("acquire", &self.inner.endpoints),
        ))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let keys = &self.keys(lease.key());
        let owner = lease.owner();
        let answers = match lease.mode() {
            Mode::Shared => {
                self.extend_read(&Claim::new(keys.clone(), owner), ttl)
                    .await
            }
            _ => {
                self.inner
                    .nodes
                    .ask_all(|node| {
                        let mut c = node.connection.clone();
                        async move { scripts::extend(&mut c, keys, owner, ttl).await }
                    })
                    .await
            }
        };
        let tally = Tally::new(
            answers
                .into_iter()
                .map(|a| match a {
                    Ok(true) => Reply::Done(()),
                    Ok(false) => Reply::Refused { remaining: None },
                    Err(why) => Reply::Failed(why),
                })
                .collect(),
        );
        let key = lease.key().as_str();
        let lost = if tally.has_quorum() {
            // The majority must have answered while the lease still held:
            // after its deadline another owner may have taken the key.
            if lease.is_within_deadline() {
                return Ok(());
            }
            LostReason::DeadlinePassed
        } else if tally.refused_by_majority_of_possible() {
            LostReason::NotHeld
        } else {
            // Not known to be lost: the earlier grant stands until its
            // deadline, so the caller may retry until then.
            return Err(unavailable(
                &self.inner.url,
                tally.to_error("extend", &self.inner.endpoints),
            ));
        };
        // The nodes that did extend would block others for a whole TTL; so
        // would one whose answer was lost (its extend may run yet: the
        // release goes after it on the node's connection).
        let extended: Vec<bool> = tally
            .replies()
            .iter()
            .map(|r| !matches!(r, Reply::Refused { .. }))
            .collect();
        let claim = &Claim::new(keys.clone(), owner);
        let which = |i: usize| extended[i];
        match lease.mode() {
            Mode::Shared => self.release_reads_on(claim, which).await,
            _ => {
                self.release_on(claim, lease.fencing_token().get(), which)
                    .await
            }
        }
        Err(Error::lost(key, lost))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let claim = &Claim::new(self.keys(lease.key()), lease.owner());
        let q = quorum(self.inner.nodes.len());
        let deleted_by = |answers: &[Option<NodeResult<bool>>]| {
            answers
                .iter()
                .filter(|a| matches!(a, Some(Ok(true))))
                .count()
        };
        // Returns once a majority has deleted the grant: the lock is gone
        // then, and the other nodes' answers would only make the caller wait
        // for the slowest node. Their deletes are queued already and still
        // go out (a batcher sends a queued release whether or not its answer
        // is awaited), ahead of this client's later acquires and releases on
        // that node. A node that fails its delete keeps a minority grant
        // until its TTL, as it would had its answer been awaited.
        // (The answers still to come are dropped: their deletes are sent.)
        let enough = |answers: &[Option<NodeResult<bool>>]| deleted_by(answers) >= q;
        let answers = match lease.mode() {
            Mode::Shared => {
                let release = |node: &Node| readers::release(node, claim.clone());
                self.inner.nodes.ask_all_until(release, enough).await.0
            }
            _ => {
                let token = lease.fencing_token().get();
                let release = |node: &Node| node.batcher.release(claim.clone(), token);
                self.inner.nodes.ask_all_until(release, enough).await.0
            }
        };
        // Held means held by a majority: a grant left on a minority (after a
        // lost extend, say) is not a lock, and releasing it reports that.
        let deleted = deleted_by(&answers);
        if deleted >= q {
            return Ok(());
        }
        // Short of a majority, every node is accounted for (`None` would be
        // a node not heard from all the same).
        let unknown = answers.iter().filter(|a| !matches!(a, Some(Ok(_)))).count();
        if deleted + unknown < q {
            return Err(Error::lost(lease.key().as_str(), LostReason::NotHeld));
        }
        // Not enough answers to tell: it may still be held where none came.
        let tally: Tally<()> = Tally::new(
            answers
                .into_iter()
                .map(|a| match a {
                    Some(Ok(_)) => Reply::Refused { remaining: None },
                    Some(Err(why)) => Reply::Failed(why),
                    None => Reply::Failed("no answer".into()),
                })
                .collect(),
        );
        Err(unavailable(
            &self.inner.url,
            tally.to_error("release", &self.inner.endpoints),
        ))
    }

    async fn on_release(&self, key: &LockKey) -> Option<WakeUpFuture> {
        self.inner.wakeups.on_release(self.keys(key).channel).await
    }

    /// One attempt in line, on every node at once (see the crate docs,
    /// "Waiting order"): a node grants when its line's head is `place` (or
    /// the key is reserved for it), and the grant needs a majority. A
    /// grant on fewer is given back keeping the place, which hands each of
    /// those nodes to its line's head: in order of arrival stamps, the same
    /// on every node, so a split between nodes settles on one waiter.
    async fn try_acquire_queued(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        place: &Place,
    ) -> Result<Grant> {
        let keys = &self.keys(key);
        let lines = &self.inner.lines;
        let entry = &lines.entry(place);
        let lease = lines.lease();
        if lines.hold(keys, entry) {
            tokio::spawn(line::keep(Arc::downgrade(&self.inner), keys.lock.clone()));
        }
        let sent = Instant::now();
        // Dropped on its way, the attempt releases what it was granted,
        // which hands the turn on (its wait is being dropped, and leaves
        // the line: its place is not to come back). On the connection its
        // attempts went by, so that the release comes after them.
        let give_back = GiveBack::armed(|| {
            for node in self.inner.nodes.nodes() {
                let (mut c, keys, owner) = (node.connection.clone(), keys.clone(), owner.clone());
                tokio::spawn(async move { scripts::release(&mut c, &keys, &owner, 0).await });
            }
        });
        let answers = self
            .inner
            .nodes
            .ask_all(|node| {
                let mut c = node.connection.clone();
                async move {
                    let rule = TokenRule::CounterFirst;
                    scripts::acquire_in_line(&mut c, &rule, keys, owner, entry, ttl, lease).await
                }
            })
            .await;
        let tally = Tally::new(
            answers
                .into_iter()
                .map(|a| match a {
                    Ok(AcquireReply::Granted(token)) => Reply::Done(token),
                    Ok(AcquireReply::Contended(remaining)) => Reply::Refused { remaining },
                    Err(why) => Reply::Failed(why),
                })
                .collect(),
        );
        let granted = |i: usize| matches!(tally.replies()[i], Reply::Done(_));
        // Any node that did not refuse may hold our grant, even one that
        // seemed to fail: its attempt may run after its answer timed out.
        let ours = |i: usize| !matches!(tally.replies()[i], Reply::Refused { .. });
        if tally.has_quorum() {
            let elapsed = sent.elapsed();
            let fenced = match validity(ttl, elapsed, DriftMargin::default().for_ttl(ttl)) {
                Some(_) => self.fence(keys, &tally, ttl).await,
                None => Err(granted_too_late(&self.inner.url, ttl, elapsed)),
            };
            give_back.disarm();
            return match fenced {
                Ok(token) => {
                    // Granted: the place leaves the lines of the nodes that
                    // did not grant (a grant takes it out of the others').
                    lines.let_go(keys, entry);
                    self.leave_on(keys, entry, |i| !granted(i)).await;
                    Ok(Grant::new(token).sent_at(sent))
                }
                Err(e) => {
                    self.give_back_on(keys, owner, entry, ours).await;
                    Err(e)
                }
            };
        }
        give_back.disarm();
        if (0..tally.nodes()).any(ours) {
            self.give_back_on(keys, owner, entry, ours).await;
        }
        // No majority, refused or not heard from in time: the waiter waits
        // for its turn in line, as under contention (woken by a node handing
        // it the turn, or by its client's renewal of its places), rather
        // than asking again at once. Under a crowd, answers that come late
        // would otherwise bring every waiter back at once, which makes the
        // answers later still.
        tracing::debug!(error = %tally.to_error("acquire in line", &self.inner.endpoints), "waiting in line");
        Err(Error::Contended {
            key: key.to_string(),
            remaining: tally.free_in(),
        })
    }

    async fn on_turn(&self, key: &LockKey, place: &Place) -> Option<WakeUpFuture> {
        let entry = self.inner.lines.entry(place);
        self.inner
            .wakeups
            .on_turn(self.keys(key).channel, entry)
            .await
    }

    fn keeps_places(&self) -> bool {
        true
    }

    fn leave_queue(&self, key: &LockKey, place: &Place) -> LeaveFuture {
        let keys = self.keys(key);
        let entry = self.inner.lines.entry(place);
        self.inner.lines.let_go(&keys, &entry);
        let backend = self.clone();
        // Sent at once, whether or not the future is polled.
        let left = tokio::spawn(async move {
            backend.leave_on(&keys, &entry, |_| true).await;
        });
        Box::pin(async move {
            let _ = left.await;
        })
    }
}
