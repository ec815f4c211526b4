//! Semaphores on Redis: the Lua script that grants, extends and releases
//! permits, and typed calls to it.
//!
//! A semaphore lives at the lock's own key (`lockkit:{jobs}`), as a sorted
//! set of its holders' owner tokens scored by their expiry in ms of server
//! time, beside the number of permits (`lockkit:{jobs}:permits`); both in
//! the key's hash slot, so Redis Cluster runs it as one script. Sharing the
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

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::{FencingToken, OwnerToken};
use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

/// The suffix of the key holding a semaphore's number of permits.
pub const PERMITS_SUFFIX: &str = ":permits";

/// `KEYS[1]` the lock (a sorted set), `KEYS[2]` its number of permits,
/// `KEYS[3]` the fencing counter. `ARGV[1]` the operation: `a` acquire
/// (`ARGV` owner token, TTL in ms, permits, `1` when the counter is the
/// key's own, kept only as long as needed), `e` extend (owner, TTL in ms),
/// `r` release (owner).
///
/// Acquire answers `{token, 0}` when granted, `{-1, ms until the first
/// permit expires}` when full, `{-2, permits}` when held with another
/// number of permits, `{-3, 0}` when the key holds an exclusive lock,
/// `{-4, 0}` when readers hold it.
/// Extend and release answer 1 when `owner` held a live permit, else 0.
pub const SEMAPHORE_LUA: &str = r#"
local lock, permits_key, counter = KEYS[1], KEYS[2], KEYS[3]
local op, owner = ARGV[1], ARGV[2]
local kind = redis.call('TYPE', lock)['ok']
if kind ~= 'zset' and kind ~= 'none' then
  if op ~= 'a' then return 0 end
  -- Readers of a read-write lock (see `crate::read_write`), or a writer.
  local value = kind == 'string' and redis.call('GET', lock)
  if value == 'r' or value == 'r+' then return {-4, 0} end
  return {-3, 0}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Expired holders give their permits back.
redis.call('ZREMRANGEBYSCORE', lock, '-inf', now_ms)
local holders = redis.call('ZCARD', lock)
-- Both keys live as long as the last permit.
local function keep_until_last()
  local last = redis.call('ZRANGE', lock, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', lock, last[2])
  redis.call('PEXPIREAT', permits_key, last[2])
end
if op == 'a' then
  local ttl, permits = tonumber(ARGV[3]), tonumber(ARGV[4])
  if holders > 0 then
    local limit = tonumber(redis.call('GET', permits_key))
    if limit and limit ~= permits then return {-2, limit} end
  end
  -- An earlier run of this very request is granted anew.
  if not redis.call('ZSCORE', lock, owner) and holders >= permits then
    local first = redis.call('ZRANGE', lock, 0, 0, 'WITHSCORES')
    return {-1, tonumber(first[2]) - now_ms}
  end
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = math.max(tonumber(redis.call('GET', counter) or '0') + 1, now_us)
  if ARGV[5] == '1' then
    -- The key's own counter: kept until the clock passes it, plus the TTL.
    local keep = math.max(0, math.floor((token - now_us) / 1000)) + ttl + 1000
    redis.call('SET', counter, string.format('%.0f', token), 'PX', keep)
  else
    redis.call('SET', counter, string.format('%.0f', token))
  end
  redis.call('ZADD', lock, now_ms + ttl, owner)
  redis.call('SET', permits_key, permits)
  keep_until_last()
  return {token, 0}
elseif op == 'e' then
  if not redis.call('ZSCORE', lock, owner) then return 0 end
  redis.call('ZADD', lock, 'XX', now_ms + tonumber(ARGV[3]), owner)
  keep_until_last()
  return 1
else
  if redis.call('ZREM', lock, owner) == 0 then return 0 end
  local limit = tonumber(redis.call('GET', permits_key))
  if holders == 1 then
    redis.call('DEL', permits_key)
  end
  if limit and holders >= limit then
    -- It was full: someone may wait. The message is no secret.
    redis.call('PUBLISH', lock .. ':released', 'permit ' .. now_ms)
  end
  return 1
end
"#;

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SEMAPHORE_LUA));

/// Where a permit's fencing token comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitCounter<'a> {
    /// The counter every lock on the server shares (single server).
    Shared(&'a str),
    /// The key's own counter, in its hash slot (Redis Cluster).
    OwnKey,
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

/// One attempt to take one of `permits` permits of `keys`' lock for `owner`.
pub async fn acquire_permit<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    counter: PermitCounter<'_>,
    owner: &OwnerToken,
    ttl: Duration,
    permits: u32,
) -> RedisResult<PermitReply> {
    let (counter_key, own) = match counter {
        PermitCounter::Shared(key) => (key, "0"),
        PermitCounter::OwnKey => (keys.counter.as_str(), "1"),
    };
    let (first, second): (i64, i64) = SCRIPT
        .key(&keys.lock)
        .key(permits_key(keys))
        .key(counter_key)
        .arg("a")
        .arg(owner.to_hex())
        .arg(millis(ttl))
        .arg(permits)
        .arg(own)
        .invoke_async(conn)
        .await?;
    Ok(match first {
        -1 => PermitReply::Full(Duration::from_millis(second.max(0) as u64)),
        -2 => PermitReply::OtherPermits(second.clamp(0, u32::MAX as i64) as u32),
        -3 => PermitReply::Exclusive,
        -4 => PermitReply::Shared,
        token => PermitReply::Granted(FencingToken::new(token.max(1) as u64)),
    })
}

/// Moves `owner`'s permit's expiry to `ttl` from now, if it still holds
/// one. Returns whether it did.
pub async fn extend_permit<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<bool> {
    let extended: i64 = SCRIPT
        .key(&keys.lock)
        .key(permits_key(keys))
        .key(&keys.counter)
        .arg("e")
        .arg(owner.to_hex())
        .arg(millis(ttl))
        .invoke_async(conn)
        .await?;
    Ok(extended == 1)
}

/// Gives `owner`'s permit back, if it still holds one. Returns whether it did.
pub async fn release_permit<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
) -> RedisResult<bool> {
    let released: i64 = SCRIPT
        .key(&keys.lock)
        .key(permits_key(keys))
        .key(&keys.counter)
        .arg("r")
        .arg(owner.to_hex())
        .invoke_async(conn)
        .await?;
    Ok(released == 1)
}

/// The key that holds the number of permits of `keys`' semaphore.
pub fn permits_key(keys: &crate::LockKeys) -> String {
    format!("{}{PERMITS_SUFFIX}", keys.lock)
}

fn millis(ttl: Duration) -> u64 {
    // TTLs are validated to whole milliseconds of at least the backend's minimum.
    ttl.as_millis().clamp(1, u64::MAX as u128) as u64
}
