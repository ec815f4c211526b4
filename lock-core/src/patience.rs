//! `Wait`: how long `acquire` waits for a held lock, as a type of its own,
//! so that `acquire(key, ttl, wait)` cannot be written with the two
//! durations swapped (Redisson's `tryLock(waitTime, leaseTime)` puts them
//! the other way round).

use std::time::Duration;

/// How long [`Locker::acquire`](crate::Locker::acquire) waits for a held
/// lock.
///
/// ```
/// use std::time::Duration;
/// use lock_core::Wait;
///
/// let patient = Wait::at_most(Duration::from_secs(5));
/// assert_eq!(patient.limit(), Duration::from_secs(5));
/// assert_eq!(Wait::NONE.limit(), Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Wait(Duration);

impl Wait {
    /// One attempt: a held key answers [`Error::Contended`](crate::Error::Contended) at once.
    pub const NONE: Wait = Wait(Duration::ZERO);
    /// Until the lock is free, however long that takes.
    pub const FOREVER: Wait = Wait(Duration::MAX);

    /// Up to `limit`, then [`Error::TimedOut`](crate::Error::TimedOut).
    pub const fn at_most(limit: Duration) -> Wait {
        Wait(limit)
    }

    /// The longest the wait may last.
    pub const fn limit(self) -> Duration {
        self.0
    }
}
