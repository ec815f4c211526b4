//! What an application requires of a backend, the ready-made sets of the
//! decision matrix, and the check of both against a backend's capabilities.

use std::fmt;

use crate::{Capabilities, FencingGuarantee, Mode, Offer, SafetyModel};

/// What an application requires of a backend. Each field left at its
/// default requires nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requirements {
    /// `fencing = "strict"`: every grant's token is strictly greater than
    /// every earlier grant's on the same key.
    pub strict_fencing: bool,
    /// `no_clock_assumptions = true`: the fencing promise rests on no clock
    /// or timing assumption (implies strict fencing).
    pub no_clock_assumptions: bool,
    /// `survives_server_loss = n`: locks keep working with `n` servers down.
    pub survives_server_loss: usize,
    /// `min_safety = "..."`: the safety model is at least this one, in
    /// [`SafetyModel`]'s order (in-process < single-node < quorum <
    /// consensus < acid-transaction).
    pub min_safety: Option<SafetyModel>,
    /// `fifo_fair = true`: waiters are granted in the order they started waiting.
    pub fifo_fair: bool,
    /// `lock_outlives_connection = true|false`: whether a grant must outlive
    /// (true) or die with (false) the client's connection.
    pub lock_outlives_connection: Option<bool>,
    /// `no_eviction = true`: no server was found, when connecting, that may
    /// evict a held lock's key to free memory (a Redis with a `maxmemory`
    /// and a policy other than `noeviction`; see
    /// [`Capabilities::lock_key_eviction`]).
    pub no_eviction: bool,
    /// `semaphores = true`: the backend offers N-permit semaphores
    /// ([`Mode::Semaphore`]).
    pub semaphores: bool,
    /// `read_write = true`: the backend offers read-write locks
    /// ([`Mode::Shared`] holds beside the exclusive one).
    pub read_write: bool,
}

/// A requirement the backend does not meet, and what it offers instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// What is required, in words ("fencing that rests on no clock assumption").
    pub requires: String,
    /// What the backend offers instead, in words.
    pub offers: String,
}

impl Requirements {
    /// Every requirement `capabilities` falls short of; empty when all are met.
    pub fn shortfalls(&self, caps: &Capabilities) -> Vec<Shortfall> {
        let mut out = Vec::new();
        let mut miss = |requires: String, offers: String| out.push(Shortfall { requires, offers });
        if let Some(min) = self.min_safety
            && caps.safety < min
        {
            miss(
                format!("safety of at least `{}` ({min})", safety_name(min)),
                format!("`{}` ({})", safety_name(caps.safety), caps.safety),
            );
        }
        let strict = caps.fencing.guarantee == FencingGuarantee::Strict;
        if (self.strict_fencing || self.no_clock_assumptions) && !strict {
            miss(
                "strict fencing".into(),
                "fencing tokens that may repeat or go backwards".into(),
            );
        } else if self.no_clock_assumptions && caps.fencing.rests_on_clocks() {
            miss(
                "fencing that rests on no clock assumption".into(),
                format!(
                    "a counter that rests on: {}",
                    caps.fencing
                        .rests_on
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        if caps.tolerated_server_failures < self.survives_server_loss {
            miss(
                format!(
                    "locks that survive the loss of {} server(s)",
                    self.survives_server_loss
                ),
                format!(
                    "locks that survive the loss of {}",
                    caps.tolerated_server_failures
                ),
            );
        }
        if self.no_eviction
            && let Some(eviction) = &caps.lock_key_eviction
        {
            miss(
                "servers that evict no lock keys (`maxmemory-policy noeviction`, or no `maxmemory`)"
                    .into(),
                format!(
                    "{eviction}, which may evict a held lock's key and grant the lock again; set `maxmemory-policy noeviction` there"
                ),
            );
        }
        if self.fifo_fair && !caps.waiting_order.is_fifo() {
            miss(
                "waiters served in FIFO order".into(),
                // Within a bound is not FIFO: say which the backend offers.
                format!("waiting order: {}", caps.waiting_order),
            );
        }
        if self.semaphores
            && let Offer::Refused { reason } = caps.offer(&Mode::semaphore(1))
        {
            miss(
                "semaphores (N permits per key)".into(),
                format!("no semaphores: {reason}"),
            );
        }
        if self.read_write
            && let Offer::Refused { reason } = caps.offer(&Mode::Shared)
        {
            miss(
                "read-write locks (shared holds)".into(),
                format!("no read-write locks: {reason}"),
            );
        }
        match self.lock_outlives_connection {
            Some(true) if !caps.lock_outlives_connection => miss(
                "locks that outlive the client's connection (until their TTL)".into(),
                "locks freed as soon as the holding connection drops".into(),
            ),
            Some(false) if caps.lock_outlives_connection => miss(
                "locks freed as soon as the holding connection drops".into(),
                "locks that outlive the connection until their TTL".into(),
            ),
            _ => {}
        }
        out
    }

    /// Adds `other`'s requirements to these (the stricter of each wins; an
    /// explicit `lock_outlives_connection` in `other` replaces this one).
    pub fn and(self, other: Requirements) -> Requirements {
        Requirements {
            strict_fencing: self.strict_fencing || other.strict_fencing,
            no_clock_assumptions: self.no_clock_assumptions || other.no_clock_assumptions,
            survives_server_loss: self.survives_server_loss.max(other.survives_server_loss),
            min_safety: self.min_safety.max(other.min_safety),
            fifo_fair: self.fifo_fair || other.fifo_fair,
            lock_outlives_connection: other
                .lock_outlives_connection
                .or(self.lock_outlives_connection),
            no_eviction: self.no_eviction || other.no_eviction,
            semaphores: self.semaphores || other.semaphores,
            read_write: self.read_write || other.read_write,
        }
    }
}

/// Ready-made requirement sets, one per row of the README's decision matrix.
/// A profile names one with `use = "..."`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequirementSet {
    /// `idempotent-deduplication` (alias `deduplication`): a real lock
    /// service shared by processes (at least `single-node`), nothing more.
    /// A rare double grant only repeats work that is idempotent anyway, so
    /// the cheapest, fastest backend is the right one.
    IdempotentDeduplication,
    /// `general-mutex` (alias `mutex`): `single-node` or better, with strict
    /// fencing so a resource that can check tokens refuses a stale holder;
    /// fencing may rest on clocks. No server may evict lock keys (this and
    /// every set after it): an evicted lock is granted again while held.
    GeneralMutex,
    /// `financial-inventory` (aliases `financial`, `inventory`): strict
    /// fencing that rests on no clock assumption. Money and stock must not
    /// be written twice: a holder paused past its deadline must be refused
    /// by the resource whatever the clocks did, so the token's promise may
    /// not depend on them.
    FinancialInventory,
    /// `strong-consistency` (alias `strong`): `consensus` or better, strict
    /// fencing on no clock assumption, and locks that survive the loss of
    /// one server. Correctness and availability through a server failure
    /// both matter more than latency.
    StrongConsistency,
    /// `banking-core` (alias `banking`): an `acid-transaction` lock with
    /// strict, clock-free fencing, freed the moment the holder's connection
    /// drops. The lock lives in the same database transaction as the ledger
    /// writes, so a holder that loses the lock loses its uncommitted writes
    /// with it.
    BankingCore,
}

impl RequirementSet {
    /// Every set, in the decision matrix's order.
    pub const ALL: [RequirementSet; 5] = [
        RequirementSet::IdempotentDeduplication,
        RequirementSet::GeneralMutex,
        RequirementSet::FinancialInventory,
        RequirementSet::StrongConsistency,
        RequirementSet::BankingCore,
    ];

    /// The set's name in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            RequirementSet::IdempotentDeduplication => "idempotent-deduplication",
            RequirementSet::GeneralMutex => "general-mutex",
            RequirementSet::FinancialInventory => "financial-inventory",
            RequirementSet::StrongConsistency => "strong-consistency",
            RequirementSet::BankingCore => "banking-core",
        }
    }

    /// The set named `name` (or one of its aliases).
    pub fn from_name(name: &str) -> Option<RequirementSet> {
        Some(match name {
            "idempotent-deduplication" | "deduplication" => RequirementSet::IdempotentDeduplication,
            "general-mutex" | "mutex" => RequirementSet::GeneralMutex,
            "financial-inventory" | "financial" | "inventory" => RequirementSet::FinancialInventory,
            "strong-consistency" | "strong" => RequirementSet::StrongConsistency,
            "banking-core" | "banking" => RequirementSet::BankingCore,
            _ => return None,
        })
    }

    /// What the set requires.
    pub fn requirements(self) -> Requirements {
        let deduplication = Requirements {
            min_safety: Some(SafetyModel::SingleNode),
            ..Requirements::default()
        };
        // Above deduplication, a lock granted twice is a fault, not repeated work.
        let shared = Requirements {
            no_eviction: true,
            ..deduplication
        };
        match self {
            RequirementSet::IdempotentDeduplication => deduplication,
            RequirementSet::GeneralMutex => Requirements {
                strict_fencing: true,
                ..shared
            },
            RequirementSet::FinancialInventory => Requirements {
                strict_fencing: true,
                no_clock_assumptions: true,
                ..shared
            },
            RequirementSet::StrongConsistency => Requirements {
                strict_fencing: true,
                no_clock_assumptions: true,
                survives_server_loss: 1,
                min_safety: Some(SafetyModel::Consensus),
                ..shared
            },
            RequirementSet::BankingCore => Requirements {
                strict_fencing: true,
                no_clock_assumptions: true,
                min_safety: Some(SafetyModel::AcidTransaction),
                lock_outlives_connection: Some(false),
                ..shared
            },
        }
    }
}

impl fmt::Display for RequirementSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The configuration file's name for a safety model.
pub fn safety_name(model: SafetyModel) -> &'static str {
    match model {
        SafetyModel::InProcess => "in-process",
        SafetyModel::SingleNode => "single-node",
        SafetyModel::QuorumWithTimingAssumptions => "quorum",
        SafetyModel::Consensus => "consensus",
        SafetyModel::AcidTransaction => "acid-transaction",
        _ => "unknown",
    }
}

pub(crate) const SAFETY_NAMES: &[(&str, SafetyModel)] = &[
    ("in-process", SafetyModel::InProcess),
    ("single-node", SafetyModel::SingleNode),
    ("quorum", SafetyModel::QuorumWithTimingAssumptions),
    ("consensus", SafetyModel::Consensus),
    ("acid-transaction", SafetyModel::AcidTransaction),
];
