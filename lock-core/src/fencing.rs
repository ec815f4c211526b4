//! Fencing tokens, and the check a protected resource makes with them.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A number handed out with every grant. For one key, a later grant's token
/// is greater than every earlier grant's (within the assumptions listed in
/// the backend's [`Fencing`](crate::Fencing) capability).
///
/// Pass it along with every write to the resource the lock protects, and
/// have the resource refuse writes carrying a token lower than one it has
/// already seen: that turns a holder that lost its lock without knowing it
/// (a long pause, a slow network) into a refused write instead of a
/// corrupted one. See [`Fence`] and the PostgreSQL example there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value, to store next to the protected data.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

/// The check a fenced resource makes, in memory: it admits a write only
/// when its token is strictly greater than the highest token seen so far...
/// or equal, for further writes by the same holder.
///
/// In a database the same check is one statement, which is atomic:
///
/// ```sql
/// UPDATE accounts SET balance = $1, fence = $2
///  WHERE id = $3 AND fence <= $2;   -- 0 rows updated: a newer holder wrote first
/// ```
///
/// ```
/// use lock_core::{Fence, FencingToken};
/// let fence = Fence::new();
/// assert!(fence.admit(FencingToken::new(7)).is_ok());
/// assert!(fence.admit(FencingToken::new(7)).is_ok()); // same holder, next write
/// assert!(fence.admit(FencingToken::new(5)).is_err()); // a stale holder
/// ```
#[derive(Debug, Default)]
pub struct Fence {
    highest: AtomicU64,
}

/// A write refused by a [`Fence`]: its token is older than one already seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {offered}: the resource has already seen {highest}")]
pub struct StaleToken {
    /// The token the write carried.
    pub offered: FencingToken,
    /// The highest token the resource had seen.
    pub highest: FencingToken,
}

impl Fence {
    /// A fence that has seen no token yet.
    pub fn new() -> Self {
        Fence::default()
    }

    /// Admits `token` if no greater token was seen, and remembers it.
    pub fn admit(&self, token: FencingToken) -> Result<(), StaleToken> {
        let previous = self.highest.fetch_max(token.get(), Ordering::AcqRel);
        if token.get() < previous {
            return Err(StaleToken {
                offered: token,
                highest: FencingToken(previous),
            });
        }
        Ok(())
    }

    /// The highest token admitted so far (0 when none).
    pub fn highest(&self) -> FencingToken {
        FencingToken(self.highest.load(Ordering::Acquire))
    }
}
