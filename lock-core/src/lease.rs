//! `Lease`: proof of a grant, and `Grant`: what a backend returns.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::observe::Held;
use crate::{FencingToken, LockKey, Mode, OwnerToken};

/// Backend-private state that travels with a lease (an etcd lease id, the
/// PostgreSQL connection that holds the row lock, ...).
pub type LeaseState = Arc<dyn Any + Send + Sync>;

/// What a backend returns for a successful grant. The contract layer turns
/// it into a [`Lease`], computing the deadline.
///
/// Built with [`Grant::new`] and its builder methods, never field by field:
/// fields may be added, as [`owner`](Grant::owner) was.
#[derive(Clone)]
#[non_exhaustive]
pub struct Grant {
    /// The grant's fencing token.
    pub token: FencingToken,
    /// When the request that won the grant was sent, if the backend measured
    /// it (backends that wait on the server do). Otherwise the instant just
    /// before the backend was called is used, which is earlier, so safe.
    pub sent_at: Option<Instant>,
    /// How much of the TTL the backend already knows to be spent beyond the
    /// send time (Redlock's clock drift allowance per node, for example).
    pub extra_margin: Duration,
    /// Backend-private state kept in the lease.
    pub state: Option<LeaseState>,
    /// The owner the grant was made for, when it is not the one the backend
    /// was asked with: the default wait asks each retry with a fresh owner
    /// (see [`poll_until_granted`](crate::wait::poll_until_granted)). The
    /// lease takes it.
    pub owner: Option<OwnerToken>,
}

impl Grant {
    /// A grant with only a token.
    pub fn new(token: FencingToken) -> Self {
        Grant {
            token,
            sent_at: None,
            extra_margin: Duration::ZERO,
            state: None,
            owner: None,
        }
    }

    /// Records that the grant was made for `owner`, not for the owner the
    /// backend was asked with.
    pub fn for_owner(mut self, owner: OwnerToken) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Records when the winning request was sent.
    pub fn sent_at(mut self, at: Instant) -> Self {
        self.sent_at = Some(at);
        self
    }

    /// Attaches backend-private state.
    pub fn with_state(mut self, state: LeaseState) -> Self {
        self.state = Some(state);
        self
    }

    /// Subtracts a further margin from the validity.
    pub fn with_extra_margin(mut self, margin: Duration) -> Self {
        self.extra_margin = margin;
        self
    }
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("token", &self.token)
            .field("sent_at", &self.sent_at)
            .finish_non_exhaustive()
    }
}

/// A held lock: its key, the secret owner token, the fencing token and the
/// deadline after which the holder must assume it no longer holds it.
///
/// The deadline is on the client's monotonic clock: the instant the acquire
/// (or the latest extend) request was sent, plus the TTL, minus the drift
/// margin. A backend may count from an earlier instant, never a later one:
/// etcd counts from the last renewal of the lease it grants on, which may be
/// a lease renewed moments before for an earlier lock. Check it before
/// acting on the protected resource, and pass the fencing token along so the
/// resource can refuse a stale holder.
pub struct Lease {
    key: LockKey,
    owner: OwnerToken,
    token: FencingToken,
    ttl: Duration,
    deadline: Instant,
    state: Option<LeaseState>,
    mode: Mode,
    /// Its standing in this process's count of held locks.
    pub(crate) held: Held,
}

impl Lease {
    /// Assembles a lease from its parts. Backends never need this (the
    /// contract layer builds leases); tools that keep a lease across
    /// processes do. A lease with a wrong owner token can do nothing.
    pub fn from_parts(
        key: LockKey,
        owner: OwnerToken,
        token: FencingToken,
        ttl: Duration,
        deadline: Instant,
    ) -> Self {
        Lease {
            key,
            owner,
            token,
            ttl,
            deadline,
            state: None,
            mode: Mode::Exclusive,
            held: Held::rebuilt(),
        }
    }

    pub(crate) fn from_grant(
        key: LockKey,
        owner: OwnerToken,
        ttl: Duration,
        deadline: Instant,
        grant: Grant,
        mode: Mode,
    ) -> Self {
        Lease {
            mode,
            key,
            owner,
            token: grant.token,
            ttl,
            deadline,
            state: grant.state,
            held: Held::granted(),
        }
    }

    /// A rebuilt lease for a grant in `mode` (a semaphore's permit);
    /// [`from_parts`](Self::from_parts) makes an exclusive one.
    pub fn in_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The mode the grant was made in: backends that offer several extend
    /// and release each in its own way.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The secret that proves ownership to the backend.
    pub fn owner(&self) -> &OwnerToken {
        &self.owner
    }

    /// The grant's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The TTL of the latest acquire or extend.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// After this instant the holder must assume it no longer holds the lock.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// True while the deadline has not passed.
    pub fn is_within_deadline(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// Backend-private state, if the backend attached some.
    pub fn state(&self) -> Option<&LeaseState> {
        self.state.as_ref()
    }

    pub(crate) fn renewed(&mut self, ttl: Duration, deadline: Instant) {
        self.ttl = ttl;
        self.deadline = deadline;
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fencing_token", &self.token)
            .field("mode", &self.mode)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish()
    }
}
