//! The Lua scripts both Redis backends run, and typed calls to them.
//!
//! Each call is one `EVALSHA`; on `NOSCRIPT` (a restarted or flushed server)
//! the script is loaded and the call repeated, by [`redis::Script`].
//!
//! # Fencing tokens
//!
//! A grant's token is `max(counter + 1, server time in µs)`, taken in the
//! same script as the grant, so:
//! - tokens of one key strictly increase while the counter lives;
//! - when the counter is gone (a restart without persistence, a stale
//!   snapshot, an expiry) the next token is the server's clock, which is
//!   beyond every earlier token as long as **the server's clock never steps
//!   backwards** — that is the one assumption left
//!   ([`Assumption::ServerClockNeverStepsBack`](lock_core::Assumption)).
//!   Tokens track the clock because a script runs for well over a
//!   microsecond, so no key is granted more than once per microsecond.
//!
//! Scripts call `TIME` before writing (effect replication of scripts, Redis
//! 5) and read the old counter with `SET ... GET` (Redis 6.2): they need
//! Redis 6.2 or newer.
//!
//! The counter therefore only has to live until the server's clock passes
//! its value; it is kept for that long plus the lock's TTL plus one second,
//! and never leaks. Values are below 2^53 (Lua numbers are doubles) until
//! the year 2255.

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::{FencingToken, OwnerToken};
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, Script};

/// `KEYS[1]` lock, `KEYS[2]` counter; `ARGV[1]` owner token, `ARGV[2]` TTL in ms,
/// `ARGV[3]` how long to keep a counter that tracks the clock, in ms,
/// `ARGV[4]` = `clock-floor` or `counter-first` (see [`acquire_for_quorum`]).
/// Returns one integer, cheaper to parse than an array: the fencing token
/// (at least 1) when granted; when held, `-1 - remaining TTL in ms`, or `0`
/// when the key has no TTL.
///
/// On the common path the counter is written once, with `SET ... GET`, which
/// reads the old value in the same call: the script makes three calls in all.
pub const ACQUIRE_LUA: &str = r#"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1 - redis.call('PTTL', KEYS[1])
end
if ARGV[4] == 'counter-first' then
  local token = redis.call('INCR', KEYS[2])
  -- 1: there was no counter; seed it from the clock below.
  if token > 1 then return token end
end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local old = tonumber(redis.call('SET', KEYS[2], t[1] .. string.sub('00000' .. t[2], -6), 'PX', ARGV[3], 'GET'))
if old and old >= now then
  -- The counter is ahead of the clock (a write-back, or a grant in the same microsecond): stay above it,
  -- and keep it until the clock has passed it.
  local token = old + 1
  redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[3] + math.floor((token - now) / 1000))
  return token
end
return now
"#;

/// `KEYS[1]` lock; `ARGV[1]` owner token, `ARGV[2]` release channel.
/// Deletes the grant only if `ARGV[1]` holds it, then publishes on the channel.
/// Returns 1 when deleted, 0 when the owner did not hold it.
pub const RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
"#;

/// `KEYS[1]` lock; `ARGV[1]` owner token, `ARGV[2]` TTL in ms.
/// Moves the expiry only if `ARGV[1]` holds the grant. Returns 1 or 0.
pub const EXTEND_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// `KEYS[1]` counter; `ARGV[1]` value, `ARGV[2]` TTL in ms.
/// Sets the counter to `max(counter, value)` and returns the counter.
pub const WRITE_BACK_LUA: &str = r#"
local value = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if value <= current then return current end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local keep = math.max(0, math.floor((value - now) / 1000)) + tonumber(ARGV[2]) + 1000
redis.call('SET', KEYS[1], string.format('%.0f', value), 'PX', keep)
return value
"#;

/// A counter that tracks the clock is kept this long beyond the lock's TTL.
const COUNTER_SLACK_MS: u64 = 1000;

/// The largest counter value the scripts handle exactly (Lua numbers are doubles).
pub const MAX_COUNTER: u64 = (1 << 53) - 1;

/// The four scripts, hashed once.
#[derive(Debug)]
pub struct Scripts {
    /// [`ACQUIRE_LUA`].
    pub acquire: Script,
    /// [`RELEASE_LUA`].
    pub release: Script,
    /// [`EXTEND_LUA`].
    pub extend: Script,
    /// [`WRITE_BACK_LUA`].
    pub write_back: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(ACQUIRE_LUA),
    release: Script::new(RELEASE_LUA),
    extend: Script::new(EXTEND_LUA),
    write_back: Script::new(WRITE_BACK_LUA),
});

impl Scripts {
    /// The scripts, with their SHA1 hashes (`get_hash()`) for `EVALSHA`.
    pub fn get() -> &'static Scripts {
        &SCRIPTS
    }
}

/// The outcome of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Granted, with the fencing token.
    Granted(FencingToken),
    /// Held by another owner; its remaining TTL, `None` if the key has no TTL.
    Contended(Option<Duration>),
}

fn millis(ttl: Duration) -> u64 {
    // TTLs are validated to whole milliseconds of at least the backend's minimum.
    ttl.as_millis().clamp(1, u64::MAX as u128) as u64
}

/// One attempt: `SET NX PX` and, when granted, the next fencing token.
pub async fn acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<AcquireReply> {
    invoke_acquire(conn, keys, owner, ttl, "clock-floor").await
}

async fn invoke_acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
    mode: &str,
) -> RedisResult<AcquireReply> {
    let ttl_ms = millis(ttl);
    let reply: i64 = SCRIPTS
        .acquire
        .key(&keys.lock)
        .key(&keys.counter)
        .arg(owner.to_hex())
        .arg(ttl_ms)
        .arg(ttl_ms.saturating_add(COUNTER_SLACK_MS))
        .arg(mode)
        .invoke_async(conn)
        .await?;
    Ok(match reply {
        token @ 1.. => AcquireReply::Granted(FencingToken::new(token as u64)),
        0 => AcquireReply::Contended(None),
        held => AcquireReply::Contended(Some(Duration::from_millis(held.unsigned_abs() - 1))),
    })
}

/// Like [`acquire`], except that a counter that exists is only incremented,
/// never moved up to the server's clock (a missing one is still seeded from
/// it). For quorum fencing: nodes whose counters were written back to the
/// same value then hand out the same next token, so a majority agrees on it
/// and no write-back is needed. A node restored from a stale snapshot hands
/// out a low token then; the majority's highest still wins.
pub async fn acquire_for_quorum<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<AcquireReply> {
    invoke_acquire(conn, keys, owner, ttl, "counter-first").await
}

/// Deletes the grant if `owner` holds it and publishes the release.
/// Returns false when `owner` did not hold it (nothing was deleted).
pub async fn release<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
) -> RedisResult<bool> {
    let deleted: i64 = SCRIPTS
        .release
        .key(&keys.lock)
        .arg(owner.to_hex())
        .arg(&keys.channel)
        .invoke_async(conn)
        .await?;
    Ok(deleted == 1)
}

/// The operator's force release: deletes the grant whoever holds it and
/// publishes the release so waiters need not wait for their next poll.
/// Returns whether there was a grant.
pub async fn force_release<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
) -> RedisResult<bool> {
    let (deleted, _receivers): (i64, i64) = redis::pipe()
        .cmd("DEL")
        .arg(&keys.lock)
        .cmd("PUBLISH")
        .arg(&keys.channel)
        .arg("released")
        .query_async(conn)
        .await?;
    Ok(deleted == 1)
}

/// Moves the grant's expiry to `ttl` from now if `owner` holds it.
/// Returns false when it did not (nothing changed).
pub async fn extend<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<bool> {
    let extended: i64 = SCRIPTS
        .extend
        .key(&keys.lock)
        .arg(owner.to_hex())
        .arg(millis(ttl))
        .invoke_async(conn)
        .await?;
    Ok(extended == 1)
}

/// Raises the key's counter to at least `value` (keeping it at least `ttl`
/// beyond the moment the server's clock passes it) and returns the counter.
/// For quorum fencing: after taking the highest token of a majority, write
/// it back to a majority so that any later majority sees it.
pub async fn write_back<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    value: FencingToken,
    ttl: Duration,
) -> RedisResult<FencingToken> {
    if value.get() > MAX_COUNTER {
        return Err(RedisError::from((
            ErrorKind::Client,
            "fencing counter value above 2^53 - 1",
        )));
    }
    let counter: u64 = SCRIPTS
        .write_back
        .key(&keys.counter)
        .arg(value.get())
        .arg(millis(ttl))
        .invoke_async(conn)
        .await?;
    Ok(FencingToken::new(counter))
}
