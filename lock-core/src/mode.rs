//! The lock family: in which mode a key is held, and which modes a backend
//! offers.
//!
//! One key, one mode, chosen when it is first held: a key held as a
//! semaphore of 3 permits refuses an exclusive lock and a semaphore of 5
//! ([`Error::ModeConflict`](crate::Error::ModeConflict)) until its last
//! holder lets go.

use std::fmt;

use crate::WaitingOrder;

/// The most permits a semaphore may have: a limit that stays far above any
/// real use (a pool of workers, calls to a partner API) while keeping each
/// backend's bookkeeping of holders small.
pub const MAX_PERMITS: u32 = 10_000;

/// How a key is held.
///
/// Every grant in every mode has a fencing token of its own, strictly
/// greater than every earlier grant's on the same key, whatever its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// One holder at a time: the plain lock.
    Exclusive,
    /// At most `permits` holders at a time, each with a lease, renewal,
    /// loss signal and fencing token of its own. The number is part of the
    /// key's identity while it is held.
    Semaphore {
        /// How many holders the key admits at once (1 to [`MAX_PERMITS`]).
        permits: u32,
    },
    /// One of any number of shared (read) holders of a read-write lock.
    /// The write hold is [`Mode::Exclusive`]: a plain lock and a writer are
    /// one thing, so readers exclude plain locks and plain locks exclude
    /// readers. A writer waiting for the readers to leave blocks new
    /// readers, so that writers do not starve.
    Shared,
}

impl Mode {
    /// A semaphore of `permits` permits.
    pub fn semaphore(permits: u32) -> Mode {
        Mode::Semaphore { permits }
    }

    /// The name of the operation a backend that lacks this mode refuses.
    pub(crate) fn operation(&self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive locks",
            Mode::Semaphore { .. } => "semaphores",
            Mode::Shared => "read-write locks",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("an exclusive lock"),
            Mode::Semaphore { permits: 1 } => f.write_str("a semaphore of 1 permit"),
            Mode::Semaphore { permits } => write!(f, "a semaphore of {permits} permits"),
            Mode::Shared => f.write_str("a shared (read) hold"),
        }
    }
}

/// Whether a backend offers a mode, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Offer {
    /// Offered; its waiters are granted in this order.
    Offered {
        /// The order in which waiters for this mode are granted.
        waiting_order: WaitingOrder,
    },
    /// Refused with [`Error::Unsupported`](crate::Error::Unsupported),
    /// which carries this reason.
    Refused {
        /// Why the backend does not offer the mode.
        reason: &'static str,
    },
}

impl Offer {
    /// True when the mode is offered.
    pub fn is_offered(&self) -> bool {
        matches!(self, Offer::Offered { .. })
    }
}

impl fmt::Display for Offer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Offer::Offered { waiting_order } => write!(f, "offered, waiters {waiting_order}"),
            Offer::Refused { reason } => write!(f, "refused: {reason}"),
        }
    }
}

/// The modes a backend offers beyond the exclusive lock, which every
/// backend offers. Reentrant holds need nothing of a backend (they are
/// counted in this process, see [`Holder`](crate::Holder)), so they are
/// offered everywhere and not listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Modes {
    /// N-permit semaphores ([`Mode::Semaphore`]).
    pub semaphore: Offer,
    /// Read-write locks: shared holds ([`Mode::Shared`]) beside the
    /// exclusive one, with waiting writers blocking new readers.
    pub read_write: Offer,
}

impl Default for Modes {
    fn default() -> Self {
        Modes {
            semaphore: Offer::Refused {
                reason: "this backend has no semaphore implementation",
            },
            read_write: Offer::Refused {
                reason: "this backend has no read-write lock implementation",
            },
        }
    }
}
