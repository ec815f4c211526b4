//! What a backend promises, readable from code.
//!
//! The decision matrix, configuration checks and the conformance suite all
//! read these values instead of asking for a backend by name.

use std::fmt;
use std::time::Duration;

use crate::{Mode, Modes, Offer};

/// A backend's promises and limits. Built with [`Capabilities::new`] and the
/// `with_*` methods, so that new fields do not break backends.
///
/// ```
/// use lock_core::{Locker, MemoryBackend, SafetyModel};
///
/// let caps = Locker::new(MemoryBackend::new()).capabilities().clone();
/// assert_eq!(caps.safety, SafetyModel::InProcess);
/// assert!(caps.waiting_order.is_fifo());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Short backend name used in errors and traces: "redis", "etcd", ...
    pub backend: &'static str,
    /// What mutual exclusion rests on.
    pub safety: SafetyModel,
    /// What the fencing token guarantees, and on what.
    pub fencing: Fencing,
    /// How waiters learn that a lock was released.
    pub wake_up: WakeUp,
    /// In what order waiters are granted, and how long a dead waiter can
    /// hold up the ones behind it.
    pub waiting_order: WaitingOrder,
    /// A grant outlives the connection that made it (until its TTL). When
    /// false, a dropped connection frees the lock at once (PostgreSQL).
    pub lock_outlives_connection: bool,
    /// How many servers may fail while locks keep working.
    pub tolerated_server_failures: usize,
    /// `try_acquire` reports the holder's remaining TTL on contention.
    pub reports_remaining_ttl: bool,
    /// Input limits.
    pub limits: Limits,
    /// What mutual exclusion rests on beyond its [`SafetyModel`]: how the
    /// servers must be set up for a grant to stay held until its deadline
    /// (for Redis, that they evict no lock keys). Empty when nothing beyond
    /// the model.
    pub exclusion_rests_on: Vec<Assumption>,
    /// Where the backend found a server set up against
    /// [`exclusion_rests_on`](Self::exclusion_rests_on) when it connected:
    /// for Redis, the eviction policy that may delete a held lock's key and
    /// the server(s) that run it, as "`allkeys-lru` (maxmemory 2097152
    /// bytes) on node #2 (10.0.0.2:6379)". `None` when it found none (or
    /// could not tell, which it logs).
    pub lock_key_eviction: Option<String>,
    /// The modes offered beyond the exclusive lock, and why one is not.
    pub modes: Modes,
}

impl Capabilities {
    /// Capabilities with conservative defaults: no fencing guarantee, polling
    /// only, not fair, no tolerated failures, default limits.
    pub fn new(backend: &'static str, safety: SafetyModel) -> Self {
        Capabilities {
            backend,
            safety,
            fencing: Fencing {
                guarantee: FencingGuarantee::None,
                rests_on: Vec::new(),
            },
            wake_up: WakeUp::Polling,
            waiting_order: WaitingOrder::Unordered,
            lock_outlives_connection: true,
            tolerated_server_failures: 0,
            reports_remaining_ttl: false,
            limits: Limits {
                backend,
                ..Limits::default()
            },
            exclusion_rests_on: Vec::new(),
            lock_key_eviction: None,
            modes: Modes::default(),
        }
    }

    /// Declares whether the backend offers semaphores
    /// ([`Mode::Semaphore`]), and in what order their waiters are granted.
    pub fn with_semaphore(mut self, offer: Offer) -> Self {
        self.modes.semaphore = offer;
        self
    }

    /// Declares whether the backend offers read-write locks
    /// ([`Mode::Shared`] holds beside the exclusive one), and in what order
    /// their readers are granted.
    pub fn with_read_write(mut self, offer: Offer) -> Self {
        self.modes.read_write = offer;
        self
    }

    /// What the backend says about `mode`. The exclusive lock is offered
    /// everywhere, its waiters granted in [`waiting_order`](Self::waiting_order).
    ///
    /// ```
    /// use lock_core::{Locker, MemoryBackend, Mode};
    ///
    /// let caps = Locker::new(MemoryBackend::new()).capabilities().clone();
    /// assert!(caps.offer(&Mode::semaphore(3)).is_offered());
    /// ```
    pub fn offer(&self, mode: &Mode) -> Offer {
        match mode {
            Mode::Exclusive => Offer::Offered {
                waiting_order: self.waiting_order,
            },
            Mode::Semaphore { .. } => self.modes.semaphore,
            Mode::Shared => self.modes.read_write,
        }
    }

    /// Sets the fencing guarantee and the assumptions it rests on.
    pub fn with_fencing(
        mut self,
        guarantee: FencingGuarantee,
        rests_on: impl IntoIterator<Item = Assumption>,
    ) -> Self {
        self.fencing = Fencing {
            guarantee,
            rests_on: rests_on.into_iter().collect(),
        };
        self
    }

    /// Sets the wake-up method.
    pub fn with_wake_up(mut self, wake_up: WakeUp) -> Self {
        self.wake_up = wake_up;
        self
    }

    /// Declares the order in which waiters are granted.
    pub fn with_waiting_order(mut self, order: WaitingOrder) -> Self {
        self.waiting_order = order;
        self
    }

    /// Declares whether grants outlive the client's connection.
    pub fn with_lock_outlives_connection(mut self, outlives: bool) -> Self {
        self.lock_outlives_connection = outlives;
        self
    }

    /// Declares how many servers may fail while locks keep working.
    pub fn with_tolerated_server_failures(mut self, n: usize) -> Self {
        self.tolerated_server_failures = n;
        self
    }

    /// Declares that contention reports the holder's remaining TTL.
    pub fn with_remaining_ttl(mut self, reports: bool) -> Self {
        self.reports_remaining_ttl = reports;
        self
    }

    /// Sets what mutual exclusion rests on beyond the safety model.
    pub fn with_exclusion_resting_on(
        mut self,
        rests_on: impl IntoIterator<Item = Assumption>,
    ) -> Self {
        self.exclusion_rests_on = rests_on.into_iter().collect();
        self
    }

    /// Records that a server may evict lock keys: `policy_and_where`
    /// names the policy and the server(s), as
    /// [`lock_key_eviction`](Self::lock_key_eviction) shows it.
    pub fn with_lock_key_eviction(mut self, policy_and_where: impl Into<String>) -> Self {
        self.lock_key_eviction = Some(policy_and_where.into());
        self
    }

    /// Sets the limits (the backend name is kept).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = Limits {
            backend: self.backend,
            ..limits
        };
        self
    }
}

/// What mutual exclusion rests on, from weakest to strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum SafetyModel {
    /// One process's memory: exact within the process, nothing across processes.
    InProcess,
    /// One server: a lock is lost or doubly granted if that server restarts
    /// without its data or fails over to a replica that lagged.
    SingleNode,
    /// A majority of independent servers, under bounded clock drift, network
    /// delay and process pauses (Redlock).
    QuorumWithTimingAssumptions,
    /// A consensus protocol (Raft): a majority of members agree on each grant.
    Consensus,
    /// A row lock inside an open database transaction: the holder's writes in
    /// that transaction commit only while it holds the lock.
    AcidTransaction,
}

impl fmt::Display for SafetyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SafetyModel::InProcess => "in-process",
            SafetyModel::SingleNode => "single node",
            SafetyModel::QuorumWithTimingAssumptions => "quorum under timing assumptions",
            SafetyModel::Consensus => "consensus",
            SafetyModel::AcidTransaction => "ACID transaction",
        })
    }
}

/// The fencing promise: how far tokens can be trusted and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fencing {
    /// The promise itself.
    pub guarantee: FencingGuarantee,
    /// What must hold for the promise to hold.
    pub rests_on: Vec<Assumption>,
}

impl Fencing {
    /// True when the promise rests on any clock or timing assumption.
    pub fn rests_on_clocks(&self) -> bool {
        self.rests_on.iter().any(|a| a.is_about_time())
    }
}

/// How far fencing tokens can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FencingGuarantee {
    /// For one key, every grant's token is strictly greater than every
    /// earlier grant's, as long as the listed assumptions hold.
    Strict,
    /// Tokens are handed out but may repeat or go backwards.
    None,
}

/// An assumption a promise rests on. Each has a plain-words description.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Assumption {
    /// The state lives in this process only; a restart starts over.
    ProcessMemory,
    /// The server's wall clock never steps backwards (tokens seeded from it
    /// after a restart without persistence).
    ServerClockNeverStepsBack,
    /// Clocks of the servers advance at about the same rate as the client's
    /// (bounded drift), so TTLs expire when both sides think they do.
    BoundedClockDrift,
    /// Network delays and process pauses are short compared to the TTL.
    BoundedDelaysAndPauses,
    /// A replica promoted by a failover has a clock no earlier than its
    /// old master's (tokens lost with unreplicated counters are seeded from
    /// the new master's clock).
    ReplicaClocksAgree,
    /// A majority of the nodes keeps its data (counters) across restarts.
    MajorityKeepsState,
    /// A majority of the cluster's members is up and keeps its log.
    ConsensusMajority,
    /// The database keeps committed data across crashes: fsync on, and a
    /// synchronous commit flushes the WAL before it returns. Tokens drawn
    /// from a sequence are flushed by such a commit before they are handed out.
    DurableDatabase,
    /// The server evicts no lock keys: `maxmemory-policy noeviction`, or no
    /// `maxmemory`. Under any other policy (every `volatile-*` one too, as
    /// lock keys carry a TTL) a full server may delete a held lock's key,
    /// and the next contender is granted while its holder still holds it.
    ServerEvictsNoLockKeys,
    /// A failover promotes only a replica that had received every grant.
    /// Redis replicates asynchronously: a grant the promoted replica never
    /// got is gone, and the key is granted to a second client while its
    /// first holder still holds it. Waiting for replicas (`WAIT`) narrows
    /// the window but is not consensus.
    ReplicationCaughtUp,
}

impl Assumption {
    /// True when the assumption is about clocks or timing.
    pub fn is_about_time(&self) -> bool {
        matches!(
            self,
            Assumption::ServerClockNeverStepsBack
                | Assumption::BoundedClockDrift
                | Assumption::BoundedDelaysAndPauses
                | Assumption::ReplicaClocksAgree
        )
    }
}

impl fmt::Display for Assumption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Assumption::ProcessMemory => {
                "state lives in one process and starts over when it restarts"
            }
            Assumption::ServerClockNeverStepsBack => "the server's clock never steps backwards",
            Assumption::BoundedClockDrift => {
                "server and client clocks drift apart by less than the drift margin"
            }
            Assumption::BoundedDelaysAndPauses => {
                "network delays and process pauses are short against the TTL"
            }
            Assumption::ReplicaClocksAgree => {
                "a replica promoted by a failover has a clock no earlier than its old master's"
            }
            Assumption::MajorityKeepsState => {
                "a majority of the nodes keeps its data across restarts"
            }
            Assumption::ConsensusMajority => {
                "a majority of the cluster's members is up and keeps its log"
            }
            Assumption::DurableDatabase => {
                "the database keeps committed data across crashes (fsync on, synchronous commit for the token's flush)"
            }
            Assumption::ServerEvictsNoLockKeys => {
                "the server evicts no lock keys (maxmemory-policy noeviction, or no maxmemory)"
            }
            Assumption::ReplicationCaughtUp => {
                "a failover promotes only a replica that had received every grant (Redis replication is asynchronous)"
            }
        })
    }
}

/// How waiters learn that a lock was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WakeUp {
    /// No wake-up: waiters poll with jittered backoff.
    Polling,
    /// Within one process, by a notification.
    InProcess,
    /// A release message on a pub/sub channel (Redis), polling as backstop.
    PubSub,
    /// A watch of the lock's queue (etcd): one per lock and client, waking
    /// only the waiter a release puts at the head.
    Watch,
    /// The server blocks the waiter until the lock is free (PostgreSQL).
    ServerBlocking,
}

impl fmt::Display for WakeUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WakeUp::Polling => "polling",
            WakeUp::InProcess => "in-process notification",
            WakeUp::PubSub => "pub/sub release message",
            WakeUp::Watch => "watch of the lock's queue",
            WakeUp::ServerBlocking => "blocking in the server",
        })
    }
}

/// Input limits of a backend. The contract's own maximums
/// ([`MAX_KEY_BYTES`](crate::validate::MAX_KEY_BYTES),
/// [`MAX_TTL`](crate::validate::MAX_TTL)) apply on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Backend name, for error messages.
    pub backend: &'static str,
    /// Shortest TTL the backend honours.
    pub min_ttl: Duration,
    /// Longest TTL the backend accepts.
    pub max_ttl: Duration,
    /// TTLs must be whole multiples of this (1 ms, or 1 s for etcd).
    pub ttl_granularity: Duration,
    /// Longest key, in bytes of UTF-8.
    pub max_key_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            backend: "unnamed",
            min_ttl: Duration::from_millis(10),
            max_ttl: crate::validate::MAX_TTL,
            ttl_granularity: Duration::from_millis(1),
            max_key_bytes: crate::validate::MAX_KEY_BYTES,
        }
    }
}

/// In what order a backend grants the waiters of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitingOrder {
    /// Whoever asks first after a release wins; a waiter may in principle
    /// wait forever while newcomers win.
    Unordered,
    /// First come, first served: waiters are granted in the order they
    /// joined the key's waiting line, and newcomers do not pass them.
    Fifo {
        /// How long a waiter that died in line can hold up the others.
        stall: Stall,
    },
    /// First come, first served as far as the servers agree on the order:
    /// a waiter may be passed only by one that joined less than `within`
    /// after it (independent servers see arrivals in their own order).
    Within {
        /// How far apart two arrivals may be and still be granted in either order.
        within: Duration,
        /// How long a waiter that died in line can hold up the others.
        stall: Stall,
    },
}

impl WaitingOrder {
    /// Whether waiters are served strictly in order of arrival.
    pub fn is_fifo(&self) -> bool {
        matches!(self, WaitingOrder::Fifo { .. })
    }

    /// How long a dead waiter may hold up the line, when there is a line.
    pub fn stall(&self) -> Option<Stall> {
        match *self {
            WaitingOrder::Unordered => None,
            WaitingOrder::Fifo { stall } | WaitingOrder::Within { stall, .. } => Some(stall),
        }
    }

    /// The lease of a place in line that the waiting loop must refresh,
    /// when places have one.
    pub fn waiter_lease(&self) -> Option<Duration> {
        match self.stall()? {
            Stall::WaiterLease(lease) => Some(lease),
            Stall::WaiterTtl => None,
        }
    }
}

impl fmt::Display for WaitingOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitingOrder::Unordered => f.write_str("unordered"),
            WaitingOrder::Fifo { stall } => write!(f, "FIFO ({stall})"),
            WaitingOrder::Within { within, stall } => {
                write!(f, "FIFO within {within:?} ({stall})")
            }
        }
    }
}

/// What bounds the wait a dead waiter imposes on those behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stall {
    /// Each place in line has a lease of this length, refreshed while its
    /// waiter waits (every third of it); a head whose lease ran out is
    /// skipped. The next waiter's grant comes at most
    /// [`bound`](Stall::bound) after the death.
    WaiterLease(Duration),
    /// A place lasts as long as the TTL its waiter asked for (etcd: the
    /// waiter's lease).
    WaiterTtl,
}

impl Stall {
    /// The longest a dead waiter can hold up the next grant, when it does
    /// not depend on the waiter's TTL: its lease, plus the third of a
    /// lease after which the next waiter looks again.
    pub fn bound(&self) -> Option<Duration> {
        match *self {
            Stall::WaiterLease(lease) => Some(lease + lease / 3),
            Stall::WaiterTtl => None,
        }
    }
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stall::WaiterLease(lease) => {
                write!(
                    f,
                    "a dead waiter stalls the line for at most {:?}",
                    *lease + *lease / 3
                )
            }
            Stall::WaiterTtl => f.write_str("a dead waiter stalls the line until its TTL runs out"),
        }
    }
}
