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
///
/// For a signed 64-bit column, `i64::try_from(token)`. With the `sqlx`
/// feature the token binds straight into a query, and decodes from a row,
/// as a `BIGINT` on any database sqlx speaks (a value a `BIGINT` cannot
/// hold is refused with an error, never wrapped):
///
/// ```ignore
/// sqlx::query("UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2")
///     .bind(balance)
///     .bind(guard.fencing_token())
///     .bind(id)
///     .execute(&pool)
///     .await?;
/// ```
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

impl From<u64> for FencingToken {
    fn from(value: u64) -> FencingToken {
        FencingToken(value)
    }
}

/// For a signed 64-bit column (PostgreSQL's `BIGINT`, MySQL's and SQLite's
/// `INTEGER`): fails only past `i64::MAX`, which no backend's counter
/// reaches at any real rate of grants.
///
/// ```
/// use lock_core::FencingToken;
/// let token = FencingToken::new(42);
/// assert_eq!(i64::try_from(token), Ok(42));
/// assert!(i64::try_from(FencingToken::new(u64::MAX)).is_err());
/// ```
impl TryFrom<FencingToken> for i64 {
    type Error = std::num::TryFromIntError;
    fn try_from(t: FencingToken) -> Result<i64, Self::Error> {
        i64::try_from(t.0)
    }
}

/// A token read back from a signed 64-bit column; fails when negative.
impl TryFrom<i64> for FencingToken {
    type Error = std::num::TryFromIntError;
    fn try_from(value: i64) -> Result<FencingToken, Self::Error> {
        u64::try_from(value).map(FencingToken)
    }
}

impl From<FencingToken> for i128 {
    fn from(t: FencingToken) -> i128 {
        i128::from(t.0)
    }
}

impl From<FencingToken> for u128 {
    fn from(t: FencingToken) -> u128 {
        u128::from(t.0)
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
