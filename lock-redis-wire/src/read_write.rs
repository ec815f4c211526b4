//! Read-write locks on Redis: the Lua script that grants, extends and
//! releases read holds, and typed calls to it. The write hold is the
//! exclusive lock of [`crate::scripts`], unchanged.
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

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::{FencingToken, OwnerToken};
use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use crate::semaphore::PermitCounter;

/// The suffix of the key holding a read-write lock's readers.
pub const READERS_SUFFIX: &str = ":readers";

/// The marker a lock's key holds while readers hold it (`r+` once someone
/// is known to wait). No owner token (hex) is ever this value.
pub const READ_MARKER: &str = "r";

/// `KEYS[1]` the lock, `KEYS[2]` its readers, `KEYS[3]` the fencing
/// counter, `KEYS[4]` and `KEYS[5]` the lock's waiting line and its
/// clients' leases (see [`crate::scripts::BATCH_LUA`]). `ARGV[1]` the
/// operation: `a` acquire (`ARGV` owner token, TTL in ms, `1` when the
/// counter is the key's own), `e` extend (owner, TTL in ms), `r` release
/// (owner).
///
/// Acquire answers `{token, 0}` when granted, `{-1, ms}` when a writer
/// holds or waits (ms until the key's grant expires, `-1` when unknown),
/// `{-2, permits}` when the key is a semaphore's. Extend and release
/// answer 1 when `owner` held a live read hold, else 0.
pub const READ_WRITE_LUA: &str = r#"
local lock, readers, counter, queue, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op, owner = ARGV[1], ARGV[2]
local kind = redis.call('TYPE', lock)['ok']
if kind ~= 'string' and kind ~= 'none' then
  -- A semaphore's key.
  if op == 'a' then return {-2, tonumber(redis.call('GET', lock .. ':permits') or '0')} end
  return 0
end
local current = false
if kind == 'string' then current = redis.call('GET', lock) end
local read_held = current == 'r' or current == 'r+'
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if read_held then
  -- Expired readers are gone.
  redis.call('ZREMRANGEBYSCORE', readers, '-inf', now_ms)
elseif op == 'a' then
  -- Readers left from a marker that lapsed or was removed: none hold.
  redis.call('DEL', readers)
else
  return 0
end
-- The marker and the readers live as long as the last reader.
local function keep_until_last()
  local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', lock, last[2])
  redis.call('PEXPIREAT', readers, last[2])
end
-- The line's live head (a waiting writer), once heads whose client's
-- lease ran out (dead in line) are dropped.
local function live_head()
  local head = redis.call('LINDEX', queue, 0)
  while head do
    local expiry = tonumber(redis.call('HGET', leases, string.sub(head, 1, 32)))
    if expiry and expiry > now_ms then return head, expiry end
    redis.call('LPOP', queue)
    head = redis.call('LINDEX', queue, 0)
  end
  return nil
end
if op == 'a' then
  local ttl = tonumber(ARGV[3])
  if current and not read_held then
    -- A writer holds (its release is to publish: someone waits), or the
    -- key is reserved for the waiting writer whose turn it is (`~`).
    if string.byte(current, 1) ~= 126 and string.byte(current, -1) ~= 43 then
      redis.call('SET', lock, current .. '+', 'XX', 'KEEPTTL')
    end
    return {-1, redis.call('PTTL', lock)}
  end
  -- A waiting writer comes before new readers.
  if live_head() then return {-1, -1} end
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = math.max(tonumber(redis.call('GET', counter) or '0') + 1, now_us)
  if ARGV[4] == '1' then
    -- The key's own counter: kept until the clock passes it, plus the TTL.
    local keep = math.max(0, math.floor((token - now_us) / 1000)) + ttl + 1000
    redis.call('SET', counter, string.format('%.0f', token), 'PX', keep)
  else
    redis.call('SET', counter, string.format('%.0f', token))
  end
  redis.call('ZADD', readers, now_ms + ttl, owner)
  if not read_held then redis.call('SET', lock, 'r', 'PX', ttl) end
  keep_until_last()
  return {token, 0}
elseif op == 'e' then
  if not redis.call('ZSCORE', readers, owner) then return 0 end
  redis.call('ZADD', readers, 'XX', now_ms + tonumber(ARGV[3]), owner)
  keep_until_last()
  return 1
else
  if redis.call('ZREM', readers, owner) == 0 then return 0 end
  if redis.call('ZCARD', readers) > 0 then
    keep_until_last()
    return 1
  end
  redis.call('DEL', lock, readers)
  -- The last reader left: the turn goes to the waiting writer at the
  -- line's head, reserved for it until its client's lease runs out, and
  -- it alone is woken, by its place.
  local head, expiry = live_head()
  if head then
    redis.call('SET', lock, '~' .. head, 'PX', expiry - now_ms)
    redis.call('PUBLISH', lock .. ':released', head)
  elseif current == 'r+' then
    redis.call('PUBLISH', lock .. ':released', 'read ' .. now_ms)
  end
  return 1
end
"#;

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(READ_WRITE_LUA));

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

fn invocation<'a>(
    keys: &crate::LockKeys,
    counter: &str,
    op: &str,
    owner: &OwnerToken,
) -> redis::ScriptInvocation<'a> {
    let mut call = SCRIPT.prepare_invoke();
    call.key(&keys.lock)
        .key(readers_key(keys))
        .key(counter)
        .key(format!("{}:queue", keys.lock))
        .key(format!("{}:leases", keys.lock))
        .arg(op)
        .arg(owner.to_hex());
    call
}

/// One attempt at a read hold of `keys`' lock for `owner`.
pub async fn acquire_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    counter: PermitCounter<'_>,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<ReadReply> {
    let (counter_key, own) = match counter {
        PermitCounter::Shared(key) => (key, "0"),
        PermitCounter::OwnKey => (keys.counter.as_str(), "1"),
    };
    let (first, second): (i64, i64) = invocation(keys, counter_key, "a", owner)
        .arg(millis(ttl))
        .arg(own)
        .invoke_async(conn)
        .await?;
    Ok(match first {
        -1 => ReadReply::Contended((second >= 0).then(|| Duration::from_millis(second as u64))),
        -2 => ReadReply::Semaphore(second.clamp(0, u32::MAX as i64) as u32),
        token => ReadReply::Granted(FencingToken::new(token.max(1) as u64)),
    })
}

/// Moves `owner`'s read hold's expiry to `ttl` from now, if it still holds
/// one. Returns whether it did.
pub async fn extend_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<bool> {
    let extended: i64 = invocation(keys, &keys.counter, "e", owner)
        .arg(millis(ttl))
        .invoke_async(conn)
        .await?;
    Ok(extended == 1)
}

/// Gives `owner`'s read hold back, if it still has one. Returns whether it did.
pub async fn release_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
) -> RedisResult<bool> {
    let released: i64 = invocation(keys, &keys.counter, "r", owner)
        .invoke_async(conn)
        .await?;
    Ok(released == 1)
}

/// The key that holds the readers of `keys`' lock.
pub fn readers_key(keys: &crate::LockKeys) -> String {
    format!("{}{READERS_SUFFIX}", keys.lock)
}

fn millis(ttl: Duration) -> u64 {
    // TTLs are validated to whole milliseconds of at least the backend's minimum.
    ttl.as_millis().clamp(1, u64::MAX as u128) as u64
}
