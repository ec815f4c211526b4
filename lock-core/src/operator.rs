//! The operator's view of a backend: which locks are held, and removing one
//! by force. Optional: backends that cannot tell answer
//! [`Error::Unsupported`](crate::Error::Unsupported).

use std::time::Duration;

use crate::{FencingToken, Mode};

/// A lock held right now, as an operator sees it (no owner token: that stays
/// secret to the holder).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The lock's key, as the user named it.
    pub key: String,
    /// How long until it expires unless renewed, when the backend can tell.
    pub remaining: Option<Duration>,
    /// The holder's fencing token, when the backend can tell.
    pub fencing_token: Option<FencingToken>,
    /// The mode of the grant: a semaphore lists one entry per holder, each
    /// naming the number of permits.
    pub mode: Mode,
}

impl HeldLock {
    /// A held lock with only its key known.
    pub fn new(key: impl Into<String>) -> Self {
        HeldLock {
            key: key.into(),
            remaining: None,
            fencing_token: None,
            mode: Mode::Exclusive,
        }
    }

    /// Records the remaining TTL.
    pub fn with_remaining(mut self, remaining: Duration) -> Self {
        self.remaining = Some(remaining);
        self
    }

    /// Records the grant's mode.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Records the holder's fencing token.
    pub fn with_fencing_token(mut self, token: FencingToken) -> Self {
        self.fencing_token = Some(token);
        self
    }
}

/// The operator's view of the locks under a prefix: those held, and the
/// keys that would block their lock for ever (a leak scan).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockReport {
    /// The locks held now, sorted by key.
    pub held: Vec<HeldLock>,
    /// The server's own names of keys under the prefix that will never
    /// expire (Redis: a lock's key with no TTL, written by something else
    /// or with its TTL removed), sorted. Each blocks its lock until an
    /// operator deletes it. Empty where the backend's locks cannot outlive
    /// their lease (etcd, PostgreSQL, memory).
    pub leaks: Vec<String>,
}
