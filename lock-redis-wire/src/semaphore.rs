//! Semaphores on Redis: the key layout of permits, and typed calls to
//! the script that grants, extends and releases them
//! ([`HOLDS_LUA`](crate::holds::HOLDS_LUA), shared with read holds).
//!
//! A semaphore lives at the lock's own key (`lockkit:{jobs}`), as a sorted
//! set of its holders' owner tokens scored by their expiry in ms of server
//! time, with its number of permits N kept in the same set, as the member
//! `#` scored `-N` (below every expiry, so it is never taken for an expired
//! holder): one key, so a permit's acquire and release each write one key
//! (two commands each when uncontended), and a key of another N is found
//! in the same command that adds the holder. Sharing the
//! key with the exclusive mode makes the modes exclude each other with no
//! extra read: an exclusive acquire's `SET NX` finds the key taken (and the
//! wrong type), and a permit's script finds a string there.
//!
//! Each grant's fencing token is taken like an exclusive grant's
//! (`max(counter + 1, server time in µs)`) from the same counter: the one
//! every lock on a single server shares, or the key's own on a cluster
//! (see [`crate::scripts`]). So tokens increase per key across modes, on
//! the same assumption: the server's clock never steps back.
//!
//! Expired holders are dropped by the next call that looks: their permits
//! come back. A release that frees a permit of a full semaphore publishes
//! on the key's release channel, waking one waiter.

use std::time::Duration;

use lock_core::{FencingToken, OwnerToken};
use redis::RedisResult;
use redis::aio::ConnectionLike;

use crate::holds::{self, HoldAnswer, HoldOperation};
use crate::scripts::TokenRule;

/// The member of a semaphore's sorted set that keeps its number of
/// permits N, scored `-N`. No owner token (hex) is ever this member.
pub const PERMITS_MEMBER: &str = "#";

/// The number of permits a semaphore's `#` member's score says, if it
/// says one.
pub fn permits_of(score: f64) -> Option<u32> {
    let permits = -score;
    (permits >= 1.0 && permits <= u32::MAX as f64 && permits.fract() == 0.0)
        .then_some(permits as u32)
}

/// The answer to a permit's acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitReply {
    /// Granted, with this fencing token.
    Granted(FencingToken),
    /// Every permit is held; the first frees in this long unless renewed.
    Full(Duration),
    /// The key is a semaphore of this many permits.
    OtherPermits(u32),
    /// The key holds an exclusive lock.
    Exclusive,
    /// Readers of a read-write lock hold the key.
    Shared,
}

impl PermitReply {
    /// Reads the answer of [`HoldOperation::AcquirePermit`]; `None` for an
    /// answer that is no acquire's.
    pub fn from_answer(answer: HoldAnswer) -> Option<PermitReply> {
        Some(match answer {
            HoldAnswer::Granted(token) => PermitReply::Granted(token),
            HoldAnswer::Busy(first_free) => PermitReply::Full(first_free.unwrap_or_default()),
            HoldAnswer::Semaphore(permits) => PermitReply::OtherPermits(permits),
            HoldAnswer::Exclusive => PermitReply::Exclusive,
            HoldAnswer::Readers => PermitReply::Shared,
            HoldAnswer::Done(_) => return None,
        })
    }
}

/// One attempt to take one of `permits` permits of `keys`' lock for
/// `owner`, its token taken as `rule` says (as the exclusive mode's are, so
/// that tokens increase across modes).
pub async fn acquire_permit<C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
    permits: u32,
) -> RedisResult<PermitReply> {
    let operation = HoldOperation::acquire_permit(ttl, permits);
    let answer = holds::run_hold(conn, rule, keys, owner, operation).await?;
    PermitReply::from_answer(answer).ok_or_else(holds::unexpected_answer)
}

/// Moves `owner`'s permit's expiry to `ttl` from now, if it still holds
/// one. Returns whether it did.
pub async fn extend_permit<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<bool> {
    let operation = HoldOperation::extend_permit(ttl);
    holds::settle(conn, keys, owner, operation).await
}

/// Gives `owner`'s permit of a semaphore of `permits` back, if it still
/// holds one. Returns whether it did. (The script reads the number of
/// permits from the semaphore's own key; `permits` only names the call.)
pub async fn release_permit<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    permits: u32,
) -> RedisResult<bool> {
    holds::settle(conn, keys, owner, HoldOperation::ReleasePermit { permits }).await
}
