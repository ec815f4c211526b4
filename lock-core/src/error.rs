//! The one error type of the lock contract.

use std::time::Duration;

/// A boxed error from a backend's own client library, kept as `source`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock, in kinds a caller can act on.
///
/// Backends map their client libraries' errors into these kinds; their own
/// error types never appear in the public API (they are kept as `source`).
/// No variant carries an owner token or a password.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use lock_core::{Error, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let _held = locker.try_acquire("report", Duration::from_secs(10)).await.unwrap();
/// match locker.try_acquire("report", Duration::from_secs(10)).await {
///     Ok(_) => unreachable!("held above"),
///     Err(Error::Contended { remaining, .. }) => println!("busy for {remaining:?} more"),
///     Err(Error::InvalidInput { field, problem }) => eprintln!("fix {field}: {problem}"),
///     Err(e) => eprintln!("backend trouble, try later: {e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another owner holds the lock. `remaining` is its remaining TTL when the
    /// backend can tell. Returned by `try_acquire`; retry later or use `acquire`.
    #[error("lock `{key}` is held by another owner{}", remaining_suffix(*.remaining))]
    Contended {
        /// The contended key.
        key: String,
        /// The holder's remaining TTL, when the backend reports it.
        remaining: Option<Duration>,
    },

    /// `acquire` waited as long as it was allowed to and the lock stayed held.
    #[error("gave up waiting for lock `{key}` after {}", crate::human::duration(*.waited))]
    TimedOut {
        /// The key waited for.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The caller does not hold the lock (any more): it expired, was removed,
    /// or belongs to someone else. Extend and release report this instead of
    /// re-creating or deleting anything.
    #[error("lock `{key}` is not held by this lease: {reason}")]
    Lost {
        /// The key of the lost lock.
        key: String,
        /// Why the lock is considered lost.
        reason: LostReason,
    },

    /// The caller passed something the contract or the backend refuses.
    /// `problem` names the value and the limit it broke.
    #[error("invalid {field}: {problem}")]
    InvalidInput {
        /// The offending input: "key", "ttl", "url", ...
        field: &'static str,
        /// What was wrong, with the limit.
        problem: String,
    },

    /// The backend could not be reached in time. Nothing was granted.
    #[error("{backend} backend at {endpoint} is unavailable: {reason}")]
    Unavailable {
        /// Backend name, as in [`Capabilities::backend`](crate::Capabilities).
        backend: &'static str,
        /// Where it was looked for, without credentials.
        endpoint: String,
        /// What happened (timeout, refused, closed).
        reason: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The server refused the credentials. The password is never included.
    #[error("{backend} backend at {endpoint} refused authentication: {reason}")]
    Auth {
        /// Backend name.
        backend: &'static str,
        /// Where it was looked for, without credentials.
        endpoint: String,
        /// The server's reason, without secrets.
        reason: String,
    },

    /// A configured limit of this client was reached (for example the number
    /// of locks one PostgreSQL backend may hold at once, each pinning a
    /// connection). Release something or raise the limit.
    #[error("{what}: limit of {limit} reached")]
    LimitReached {
        /// What ran out.
        what: String,
        /// The configured limit.
        limit: usize,
    },

    /// The backend does not offer this optional operation (for example the
    /// operator's listing of held locks).
    #[error("the {backend} backend does not support {operation}{}", reason_suffix(*.reason))]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// What was asked.
        operation: &'static str,
        /// Why, when the backend says (as its
        /// [`Capabilities::modes`](crate::Capabilities::modes) do for a mode).
        reason: Option<&'static str>,
    },

    /// The key is held in another mode than the one asked for (an
    /// exclusive lock on a semaphore's key, or a semaphore with another
    /// number of permits). A key's mode is set by its first holder and
    /// stays while it has holders.
    #[error("lock `{key}` is held as {}; asked for {asked}", held_text(*.held))]
    ModeConflict {
        /// The key.
        key: String,
        /// The mode it is held in, when the backend can tell.
        held: Option<crate::Mode>,
        /// The mode asked for.
        asked: crate::Mode,
    },

    /// The backend answered with an error that fits no other kind.
    #[error("{backend} backend error: {message}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What failed.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

fn reason_suffix(reason: Option<&'static str>) -> String {
    reason.map(|r| format!(" ({r})")).unwrap_or_default()
}

fn held_text(held: Option<crate::Mode>) -> String {
    held.map_or_else(|| "another mode".to_owned(), |m| m.to_string())
}

fn remaining_suffix(remaining: Option<Duration>) -> String {
    match remaining {
        Some(d) => format!(" (expires in {} unless renewed)", crate::human::duration(d)),
        None => String::new(),
    }
}

/// Why a lease no longer holds its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The backend has no grant for this owner: it expired, was deleted, or
    /// another owner holds the key now.
    NotHeld,
    /// The lease's deadline passed on the client's clock before a renewal
    /// succeeded, so the holder must assume another may hold it.
    DeadlinePassed,
    /// The connection that carried the grant died, and the backend frees
    /// such grants (PostgreSQL, or a scripted fault).
    ConnectionLost,
    /// The lease was released.
    Released,
    /// The grant's reply came after the lease's validity (its TTL less the
    /// drift margin, counted from when the request was sent) had run out:
    /// the request or its reply was delayed that long. The grant was given
    /// back; a wait with time left asks again.
    ReplyTooLate,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::NotHeld => {
                "the backend holds no grant for this owner (expired, removed, or taken over)"
            }
            LostReason::DeadlinePassed => "its deadline passed before a renewal succeeded",
            LostReason::ConnectionLost => "the connection holding the grant was lost",
            LostReason::Released => "it was released",
            LostReason::ReplyTooLate => {
                "the grant's reply came too late: its validity (the TTL less the drift margin, \
                 counted from the request) had run out on the way, so it was given back"
            }
        })
    }
}

impl Error {
    /// Builds an [`Error::InvalidInput`].
    pub fn invalid(field: &'static str, problem: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            problem: problem.into(),
        }
    }

    /// Builds an [`Error::Unsupported`].
    pub fn unsupported(backend: &'static str, operation: &'static str) -> Self {
        Error::Unsupported {
            backend,
            operation,
            reason: None,
        }
    }

    /// The [`Error::Unsupported`] of a backend asked for a mode it lacks,
    /// with the reason its capabilities give.
    pub fn unsupported_mode(capabilities: &crate::Capabilities, mode: &crate::Mode) -> Self {
        let reason = match capabilities.offer(mode) {
            crate::Offer::Refused { reason } => Some(reason),
            _ => None,
        };
        Error::Unsupported {
            backend: capabilities.backend,
            operation: mode.operation(),
            reason,
        }
    }

    /// True for [`Error::ModeConflict`].
    pub fn is_mode_conflict(&self) -> bool {
        matches!(self, Error::ModeConflict { .. })
    }

    /// Builds an [`Error::Lost`].
    pub fn lost(key: impl Into<String>, reason: LostReason) -> Self {
        Error::Lost {
            key: key.into(),
            reason,
        }
    }

    /// True for [`Error::Contended`].
    pub fn is_contended(&self) -> bool {
        matches!(self, Error::Contended { .. })
    }

    /// True for [`Error::TimedOut`].
    pub fn is_timed_out(&self) -> bool {
        matches!(self, Error::TimedOut { .. })
    }

    /// True for [`Error::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }

    /// True for [`Error::InvalidInput`].
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::InvalidInput { .. })
    }

    /// True for [`Error::Unsupported`].
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }

    /// True for [`Error::Unavailable`].
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// True when trying again later may succeed without any change by the
    /// caller: contention, a timeout while waiting, or an unreachable backend.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Contended { .. } | Error::TimedOut { .. } | Error::Unavailable { .. }
        )
    }
}
