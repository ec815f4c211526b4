//! Read-write locks on Redis: the key layout of read holds, and typed
//! calls to the script that grants, extends and releases them
//! ([`HOLDS_LUA`](crate::holds::HOLDS_LUA), shared with permits). The
//! write hold is the exclusive lock of [`crate::scripts`], unchanged.
//!
//! While readers hold, the lock's own key (`lockkit:{doc}`) holds the
//! marker `r` (`r+` once a writer was refused: someone waits), expiring
//! with the last reader; the readers are a sorted set beside it
//! (`lockkit:{doc}:readers`) of their owner tokens scored by their expiry
//! in ms of server time, in the key's hash slot, so Redis Cluster runs the
//! script as one. The marker makes a writer's `SET NX` (or its attempt in
//! line) find the key taken, with no extra read on the exclusive path: the
//! writer is refused as contended, with the time until the last reader's
//! hold expires, and a waiting writer stands in the key's waiting line.
//!
//! **A waiting writer blocks new readers**: a reader is refused while the
//! line's head is a live waiter (its client's lease not run out), so a
//! writer dead in line blocks readers no longer than the waiter lease. The
//! last reader to leave hands the turn to that head and wakes it alone,
//! as an exclusive release does; readers whose holds lapse leave the key
//! free, and the head's client hands itself the turn at its next renewal
//! of its place (every third of the waiter lease).
//!
//! Each read hold's fencing token is taken as a permit's is
//! ([`crate::semaphore`]): from the exclusive mode's counter, so tokens
//! increase per key across readers and writers on the same assumption
//! (the server's clock never steps back).

use std::time::Duration;

use lock_core::{FencingToken, OwnerToken};
use redis::RedisResult;
use redis::aio::ConnectionLike;

use crate::holds::{self, HoldAnswer, HoldOperation};
use crate::scripts::TokenRule;

/// The suffix of the key holding a read-write lock's readers.
pub const READERS_SUFFIX: &str = ":readers";

/// The marker a lock's key holds while readers hold it (`r+` once someone
/// is known to wait). No owner token (hex) is ever this value.
pub const READ_MARKER: &str = "r";

/// The answer to a read hold's acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadReply {
    /// Granted, with this fencing token.
    Granted(FencingToken),
    /// A writer holds the key (for this long, when known) or waits for it.
    Contended(Option<Duration>),
    /// The key is a semaphore of this many permits.
    Semaphore(u32),
}

impl ReadReply {
    /// Reads the answer of [`HoldOperation::AcquireRead`]; `None` for an
    /// answer that is no read acquire's.
    pub fn from_answer(answer: HoldAnswer) -> Option<ReadReply> {
        Some(match answer {
            HoldAnswer::Granted(token) => ReadReply::Granted(token),
            HoldAnswer::Busy(remaining) => ReadReply::Contended(remaining),
            HoldAnswer::Semaphore(permits) => ReadReply::Semaphore(permits),
            _ => return None,
        })
    }
}

/// One attempt at a read hold of `keys`' lock for `owner`, its token taken
/// as `rule` says (as the exclusive mode's are, so that tokens increase
/// across readers and writers).
pub async fn acquire_read<C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<ReadReply> {
    let operation = HoldOperation::acquire_read(ttl);
    let answer = holds::run_hold(conn, rule, keys, owner, operation).await?;
    ReadReply::from_answer(answer).ok_or_else(holds::unexpected_answer)
}

/// Moves `owner`'s read hold's expiry to `ttl` from now, if it still holds
/// one. Returns whether it did.
pub async fn extend_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<bool> {
    holds::settle(conn, keys, owner, HoldOperation::extend_read(ttl)).await
}

/// Gives `owner`'s read hold back, if it still has one. Returns whether it did.
pub async fn release_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
) -> RedisResult<bool> {
    holds::settle(conn, keys, owner, HoldOperation::ReleaseRead).await
}

/// The key that holds the readers of `keys`' lock.
pub fn readers_key(keys: &crate::LockKeys) -> String {
    format!("{}{READERS_SUFFIX}", keys.lock)
}
