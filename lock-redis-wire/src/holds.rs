//! Holds kept in a sorted set: a semaphore's permits ([`crate::semaphore`])
//! and a read-write lock's read holds ([`crate::read_write`]), granted,
//! extended and released by one script, any number of them in one call.
//!
//! Both modes keep their holders as a sorted set of owner tokens scored by
//! their expiry in ms of server time, drop the expired ones before they
//! look, keep the set (and the key beside it) as long as the last hold, and
//! take each grant's fencing token from the exclusive mode's counter. So
//! the two share that code, and a busy client's permits and read holds go
//! out together, as one call, the way its exclusive acquires and releases
//! do (see [`crate::batch`]): the server's cost of a call (finding the
//! script, setting up Lua, parsing, replying) is shared by all of them.

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::FencingToken;
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value};

use crate::LockKeys;
use crate::scripts::TokenRule;

/// Permits and read holds, any number of them, in order, in one call.
///
/// `ARGV[1]` says how tokens are taken (see [`TokenRule`]): `clock-floor`,
/// `counter-first` or `shared-clock-floor`; with `shared-clock-floor`,
/// `KEYS[1]` is the counter every lock shares. `ARGV[2]` names the
/// operations, one letter each. Then each operation's keys and arguments,
/// in order:
/// - a permit: `KEYS` the lock (a sorted set that also keeps the number of
///   permits, see [`crate::semaphore`]); acquire `p` (`ARGV` TTL in ms,
///   owner token, permits), extend `x` (TTL in ms, owner), release `v`
///   (owner, the semaphore's permits);
/// - a read hold: `KEYS` the lock (the marker `r`), its readers, its
///   waiting line and its clients' leases (see
///   [`BATCH_LUA`](crate::scripts::BATCH_LUA)); acquire `s` (`ARGV` TTL in
///   ms, owner), extend `t` (TTL in ms, owner), release `u` (owner);
/// - an acquire's `KEYS` end with the lock's own counter, unless the
///   counter is shared.
///
/// Each operation answers one integer (see [`HoldAnswer`]), or its error
/// text, which spoils no other operation; a call of one operation answers
/// the integer or the error alone.
///
/// The server pays about a microsecond for each command a script calls,
/// about as much as for the rest of an operation, so the uncontended path
/// of each operation is written inline and calls as few as it can: a
/// permit's acquire two (`ZADD NX`, `PEXPIRE`) and its release two
/// (`ZRANGE`, `DEL`); a read hold's acquire four (`SET NX GET`, `LINDEX`,
/// `ZADD`, `PEXPIRE`) and its release three (`GET`, `ZRANGE`, `DEL`). The
/// clock and a shared counter are read once per call, and the other paths'
/// functions are made only in a call that needs them.
pub const HOLDS_LUA: &str = r#"
local rule, ops = ARGV[1], ARGV[2]
local shared = rule == 'shared-clock-floor'
local counter_first = rule == 'counter-first'
local n = #ops
-- Checked before any operation runs, so that a malformed call writes nothing.
if not shared and not counter_first and rule ~= 'clock-floor' then
  return redis.error_reply('ERR unknown token rule ' .. rule)
end
if string.find(ops, '[^pxvstu]') then
  return redis.error_reply('ERR unknown hold operation in ' .. ops)
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local now_us = t[1] * 1000000 + t[2]
-- Mode conflicts, below any `-1 - ms` a wait can take (see `HoldAnswer`).
local EXCLUSIVE, READERS, SEMAPHORE = -2^50, -2^50 - 1, -2^51
-- The member of a semaphore's set that keeps its number of permits N, as
-- its score -N: below every holder's expiry, so that dropping the expired
-- holders (scores 0 to now) never drops it, and first in the set. No owner
-- token (hex) is ever this member.
local PERMITS = '#'

-- The shared counter's last token, once read; written back once, at the end.
local last
-- A grant's fencing token, from the exclusive mode's counter, so tokens
-- increase per key across modes: max(counter + 1, server time in µs), or,
-- counter-first (quorum fencing), counter + 1 with a missing counter
-- seeded from the clock.
local function take_token(counter, ttl)
  if shared then
    if not last then last = tonumber(redis.call('GET', KEYS[1]) or '0') end
    last = math.max(last + 1, now_us)
    return last
  end
  if counter_first then
    local token = redis.call('INCR', counter)
    if token == 1 then
      token = now_us
      redis.call('SET', counter, string.format('%.0f', token), 'PX', ttl + 1000)
    end
    return token
  end
  local token = math.max(tonumber(redis.call('GET', counter) or '0') + 1, now_us)
  -- The key's own counter: kept until the clock passes it, plus the TTL.
  local keep = math.max(0, math.floor((token - now_us) / 1000)) + ttl + 1000
  redis.call('SET', counter, string.format('%.0f', token), 'PX', keep)
  return token
end

-- take_token under pcall, with the shared counter's next token (once
-- read) taken inline: most grants of a busy call.
local function next_token(counter, ttl)
  if last then
    last = last + 1
    if last < now_us then last = now_us end
    return true, last
  end
  return pcall(take_token, counter, ttl)
end

-- The paths other than the uncontended ones, made at the first call that
-- needs them: making functions costs every call that does not.
local function other_paths()
  -- The holders `set` (and the key `beside` it, if any) live as long as the
  -- last hold.
  local function keep_until_last(set, beside)
    local hold = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', set, hold[2])
    if beside then redis.call('PEXPIREAT', beside, hold[2]) end
  end

  -- Whether a pcall answered WRONGTYPE (a mode's key taken by another
  -- mode); other errors are raised.
  local function wrong_type(answer)
    if type(answer) == 'table' and answer.err then
      if string.sub(answer.err, 1, 9) == 'WRONGTYPE' then return true end
      error(answer)
    end
    return false
  end

  -- The line's live head (a waiting writer), once heads whose client's
  -- lease ran out (dead in line) are dropped.
  local function live_head(queue, leases)
    local head = redis.call('LINDEX', queue, 0)
    while head do
      local expiry = tonumber(redis.call('HGET', leases, string.sub(head, 1, 32)))
      if expiry and expiry > now_ms then return head, expiry end
      redis.call('LPOP', queue)
      head = redis.call('LINDEX', queue, 0)
    end
    return nil
  end

  -- The marker of read holds at `lock`: its value (false when free), whether
  -- readers hold it; nil when the key is a semaphore's.
  local function read_marker(lock)
    local value = redis.pcall('GET', lock)
    if wrong_type(value) then return nil end
    return value, value == 'r' or value == 'r+'
  end

  -- A grant's token; when none can be taken, `undo` takes the grant back
  -- and the error is raised: no token, no grant.
  local function token_or_undo(counter, ttl, undo)
    local ok, token = pcall(take_token, counter, ttl)
    if ok then return token end
    undo()
    error(token)
  end

  -- A permit's acquire, once `ZADD NX` of the number of permits and the
  -- holder answered `added` (see the operations below, which handle a free
  -- key inline).
  local function take_permit(lock, counter, ttl, owner, permits, expiry, added)
    if wrong_type(added) then
      -- Readers of a read-write lock, or a writer.
      local value = redis.call('GET', lock)
      if value == 'r' or value == 'r+' then return READERS end
      return EXCLUSIVE
    end
    -- The semaphore was there: its number of permits is part of its identity.
    local function undo()
      if added == 1 then redis.call('ZREM', lock, owner) end
    end
    local limit = -tonumber(redis.call('ZSCORE', lock, PERMITS))
    if limit ~= permits then
      undo()
      return SEMAPHORE - limit
    end
    redis.call('ZREMRANGEBYSCORE', lock, 0, now_ms)
    -- Live after the drop: this owner's hold (just added, or an earlier run
    -- of this very request, which is granted anew) or none.
    local mine = redis.call('ZSCORE', lock, owner)
    local others = redis.call('ZCARD', lock) - 1
    if mine then others = others - 1 end
    if others >= permits then
      undo()
      local first = redis.call('ZRANGE', lock, 1, 1, 'WITHSCORES')
      return -1 - math.max(0, first[2] - now_ms)
    end
    redis.call('ZADD', lock, expiry, owner)
    redis.call('PEXPIREAT', lock, expiry, 'GT')
    return token_or_undo(counter, ttl, function() redis.call('ZREM', lock, owner) end)
  end

  local function extend_permit(lock, ttl, owner)
    local expiry = redis.pcall('ZSCORE', lock, owner)
    if wrong_type(expiry) or not expiry or tonumber(expiry) <= now_ms then return 0 end
    redis.call('ZADD', lock, 'XX', now_ms + ttl, owner)
    keep_until_last(lock)
    return 1
  end

  -- A permit's release, once `ZRANGE` of the number of permits and the
  -- first two holders answered `first` (see the operations below, which
  -- handle this owner as the only holder inline).
  local function release_permit(lock, owner, first)
    if wrong_type(first) or first[1] ~= PERMITS then return 0 end
    local permits, holders = -tonumber(first[2]), 1
    if #first == 4 then
      if first[3] ~= owner or tonumber(first[4]) <= now_ms then return 0 end
      redis.call('DEL', lock)
    else
      holders = redis.call('ZCARD', lock) - 1 - redis.call('ZREMRANGEBYSCORE', lock, 0, now_ms)
      if redis.call('ZREM', lock, owner) == 0 then return 0 end
      if holders == 1 then redis.call('DEL', lock) else keep_until_last(lock) end
    end
    if holders >= permits then
      -- It was full: someone may wait. The message is no secret.
      redis.call('PUBLISH', lock .. ':released', 'permit ' .. now_ms)
    end
    return 1
  end

  -- A reader's answer at a semaphore's key: its number of permits.
  local function semaphore_at(lock)
    return SEMAPHORE + tonumber(redis.call('ZSCORE', lock, PERMITS) or '0')
  end

  -- A read hold's acquire, once `SET NX GET` of the marker answered
  -- `current` (false: the key was free, and is marked now; see the
  -- operations below, which handle a free key with no line inline).
  local function take_read(lock, readers, queue, leases, counter, ttl, owner, expiry, current)
    if wrong_type(current) then return semaphore_at(lock) end
    local read_held = current == 'r' or current == 'r+'
    if current and not read_held then
      -- A writer holds (its release is to publish: someone waits), or the
      -- key is reserved for the waiting writer whose turn it is (`~`).
      if string.byte(current, 1) ~= 126 and string.byte(current, -1) ~= 43 then
        redis.call('SET', lock, current .. '+', 'XX', 'KEEPTTL')
      end
      local left = redis.call('PTTL', lock)
      if left < 0 then return 0 end
      return -1 - left
    end
    -- Without a marker there are no readers: they expire with it, and go
    -- with it when the last leaves or an operator removes it.
    if read_held then redis.call('ZREMRANGEBYSCORE', readers, '-inf', now_ms) end
    -- A waiting writer comes before new readers.
    if live_head(queue, leases) then
      if not current then redis.call('DEL', lock) end
      return 0
    end
    local function undo()
      if current then redis.call('ZREM', readers, owner) else redis.call('DEL', lock, readers) end
    end
    redis.call('ZADD', readers, expiry, owner)
    if read_held then
      -- The set and the marker live as long as the last reader: a new hold
      -- only ever moves that later.
      redis.call('PEXPIREAT', readers, expiry, 'GT')
      redis.call('PEXPIREAT', lock, expiry, 'GT')
    else
      -- The first reader: the marker was set with its expiry.
      redis.call('PEXPIREAT', readers, expiry)
    end
    return token_or_undo(counter, ttl, undo)
  end

  local function extend_read(lock, readers, ttl, owner)
    local _, read_held = read_marker(lock)
    if not read_held then return 0 end
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', now_ms)
    if not redis.call('ZSCORE', readers, owner) then return 0 end
    redis.call('ZADD', readers, 'XX', now_ms + ttl, owner)
    keep_until_last(readers, lock)
    return 1
  end

  -- A read hold's release, once `GET` of the marker answered `current`
  -- (see the operations below, which handle this owner as the only reader
  -- inline).
  local function release_read(lock, readers, queue, leases, owner, current)
    if wrong_type(current) or (current ~= 'r' and current ~= 'r+') then return 0 end
    -- The first two readers: enough to see the uncontended case, this owner
    -- the only reader.
    local first = redis.call('ZRANGE', readers, 0, 1, 'WITHSCORES')
    if #first == 2 then
      if first[1] ~= owner or tonumber(first[2]) <= now_ms then return 0 end
    else
      redis.call('ZREMRANGEBYSCORE', readers, '-inf', now_ms)
      if redis.call('ZREM', readers, owner) == 0 then return 0 end
      if redis.call('ZCARD', readers) > 0 then
        keep_until_last(readers, lock)
        return 1
      end
    end
    redis.call('DEL', lock, readers)
    -- Unmarked, nobody has waited since the first reader came (a writer in
    -- line marks it), and a new reader found no live head: no line to serve.
    if current == 'r' then return 1 end
    -- The last reader left: the turn goes to the waiting writer at the
    -- line's head, reserved for it until its client's lease runs out, and
    -- it alone is woken, by its place.
    local head, expiry = live_head(queue, leases)
    if head then
      redis.call('SET', lock, '~' .. head, 'PX', expiry - now_ms)
      redis.call('PUBLISH', lock .. ':released', head)
    elseif current == 'r+' then
      redis.call('PUBLISH', lock .. ':released', 'read ' .. now_ms)
    end
    return 1
  end

  return {
    take_permit = take_permit, extend_permit = extend_permit, release_permit = release_permit,
    take_read = take_read, extend_read = extend_read, release_read = release_read,
  }
end
local paths
local function slow()
  if not paths then paths = other_paths() end
  return paths
end

local out = {}
local k, a = 1, 3
if shared then k = 2 end
for i = 1, n do
  local op = string.sub(ops, i, i)
  local ok, answer
  if op == 'p' or op == 's' then
    local counter
    local kept = op == 'p' and 1 or 4
    if not shared then counter = KEYS[k + kept] end
    local ttl = tonumber(ARGV[a])
    if op == 'p' then
      -- The uncontended path, inline (a call into a function costs the
      -- server about as much as a command): a free key gets its number of
      -- permits and its first holder in one command, which answers both
      -- added.
      local lock, owner, permits = KEYS[k], ARGV[a + 1], tonumber(ARGV[a + 2])
      local expiry = now_ms + ttl
      -- Arguments as the text they arrived in where they can: a number is
      -- formatted anew for each command.
      local added = redis.pcall('ZADD', lock, 'NX', '-' .. ARGV[a + 2], PERMITS, expiry, owner)
      if added == 2 then
        -- From about now_ms (the server's clock moves on a little within a
        -- call): the key lives at least as long as the hold.
        redis.call('PEXPIRE', lock, ARGV[a])
        ok, answer = next_token(counter, ttl)
        -- No token, no grant.
        if not ok then redis.call('DEL', lock) end
      else
        ok, answer = pcall(slow().take_permit, lock, counter, ttl, owner, permits, expiry, added)
      end
      a = a + 3
    else
      -- The uncontended path, inline: a free key gets the marker in the
      -- command that looks at it, and a reader the key's line does not
      -- hold back its place in the readers.
      local lock, readers, owner = KEYS[k], KEYS[k + 1], ARGV[a + 1]
      local expiry = now_ms + ttl
      local current = redis.pcall('SET', lock, 'r', 'NX', 'PX', ARGV[a], 'GET')
      if current == false and not redis.call('LINDEX', KEYS[k + 2], 0) then
        redis.call('ZADD', readers, expiry, owner)
        redis.call('PEXPIRE', readers, ARGV[a])
        ok, answer = next_token(counter, ttl)
        if not ok then redis.call('DEL', lock, readers) end
      else
        ok, answer = pcall(slow().take_read, lock, readers, KEYS[k + 2], KEYS[k + 3], counter, ttl,
          owner, expiry, current)
      end
      a = a + 2
    end
    k = k + kept
    if not shared then k = k + 1 end
  elseif op == 'x' then
    ok, answer = pcall(slow().extend_permit, KEYS[k], tonumber(ARGV[a]), ARGV[a + 1])
    k, a = k + 1, a + 2
  elseif op == 'v' then
    -- This owner the only holder, inline: the number of permits and the
    -- first two holders show it.
    local lock, owner = KEYS[k], ARGV[a]
    local first = redis.pcall('ZRANGE', lock, 0, 2, 'WITHSCORES')
    if first[4] and not first[5] and first[3] == owner and first[1] == PERMITS
        and tonumber(first[4]) > now_ms then
      redis.call('DEL', lock)
      if first[2] == '-1' then
        -- It was full: someone may wait. The message is no secret.
        redis.call('PUBLISH', lock .. ':released', 'permit ' .. now_ms)
      end
      ok, answer = true, 1
    else
      ok, answer = pcall(slow().release_permit, lock, owner, first)
    end
    k, a = k + 1, a + 2
  elseif op == 't' then
    ok, answer = pcall(slow().extend_read, KEYS[k], KEYS[k + 1], tonumber(ARGV[a]), ARGV[a + 1])
    k, a = k + 4, a + 2
  else
    -- This owner the only reader of an unmarked key, inline (nobody waits).
    local lock, readers, owner = KEYS[k], KEYS[k + 1], ARGV[a]
    local current = redis.pcall('GET', lock)
    local first = current == 'r' and redis.pcall('ZRANGE', readers, 0, 1, 'WITHSCORES')
    if first and first[2] and not first[3] and first[1] == owner
        and tonumber(first[2]) > now_ms then
      redis.call('DEL', lock, readers)
      ok, answer = true, 1
    else
      ok, answer = pcall(slow().release_read, lock, readers, KEYS[k + 2], KEYS[k + 3], owner, current)
    end
    k, a = k + 4, a + 1
  end
  if ok then
    out[i] = answer
  else
    out[i] = type(answer) == 'table' and answer.err or tostring(answer)
  end
end
if last then redis.call('SET', KEYS[1], string.format('%.0f', last)) end
if n == 1 then
  if type(out[1]) == 'string' then return redis.error_reply(out[1]) end
  return out[1]
end
return out
"#;

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(HOLDS_LUA));

/// What one operation on a permit or a read hold asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOperation {
    /// One of `permits` permits, for `ttl_ms`.
    AcquirePermit {
        /// The TTL in milliseconds.
        ttl_ms: u64,
        /// The semaphore's number of permits.
        permits: u32,
    },
    /// Moves a permit's expiry to `ttl_ms` from now.
    ExtendPermit {
        /// The TTL in milliseconds.
        ttl_ms: u64,
    },
    /// Gives a permit back.
    ReleasePermit {
        /// The semaphore's number of permits: a release that frees a
        /// permit of a full semaphore wakes a waiter.
        permits: u32,
    },
    /// A read hold, for `ttl_ms`.
    AcquireRead {
        /// The TTL in milliseconds.
        ttl_ms: u64,
    },
    /// Moves a read hold's expiry to `ttl_ms` from now.
    ExtendRead {
        /// The TTL in milliseconds.
        ttl_ms: u64,
    },
    /// Gives a read hold back.
    ReleaseRead,
}

impl HoldOperation {
    /// One of `permits` permits, for `ttl`.
    pub fn acquire_permit(ttl: Duration, permits: u32) -> HoldOperation {
        HoldOperation::AcquirePermit {
            ttl_ms: millis(ttl),
            permits,
        }
    }

    /// Extends a permit to `ttl` from now.
    pub fn extend_permit(ttl: Duration) -> HoldOperation {
        HoldOperation::ExtendPermit {
            ttl_ms: millis(ttl),
        }
    }

    /// A read hold, for `ttl`.
    pub fn acquire_read(ttl: Duration) -> HoldOperation {
        HoldOperation::AcquireRead {
            ttl_ms: millis(ttl),
        }
    }

    /// Extends a read hold to `ttl` from now.
    pub fn extend_read(ttl: Duration) -> HoldOperation {
        HoldOperation::ExtendRead {
            ttl_ms: millis(ttl),
        }
    }

    /// Whether it grants a hold (which a caller that has gone need not get).
    pub fn is_acquire(&self) -> bool {
        matches!(
            self,
            HoldOperation::AcquirePermit { .. } | HoldOperation::AcquireRead { .. }
        )
    }

    fn letter(&self) -> char {
        match self {
            HoldOperation::AcquirePermit { .. } => 'p',
            HoldOperation::ExtendPermit { .. } => 'x',
            HoldOperation::ReleasePermit { .. } => 'v',
            HoldOperation::AcquireRead { .. } => 's',
            HoldOperation::ExtendRead { .. } => 't',
            HoldOperation::ReleaseRead => 'u',
        }
    }

    fn is_read(&self) -> bool {
        matches!(
            self,
            HoldOperation::AcquireRead { .. }
                | HoldOperation::ExtendRead { .. }
                | HoldOperation::ReleaseRead
        )
    }
}

/// One operation's integer answer, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldAnswer {
    /// An acquire was granted, with this fencing token (the integer, at least 1).
    Granted(FencingToken),
    /// An acquire was refused: every permit is held, or a writer holds or
    /// waits. `-1 - ms` until the first hold frees unless renewed, or `0`
    /// when unknown.
    Busy(Option<Duration>),
    /// An acquire found the key a semaphore of this many permits
    /// (`-2^51 - permits`).
    Semaphore(u32),
    /// A permit's acquire found an exclusive lock (`-2^50`).
    Exclusive,
    /// A permit's acquire found readers (`-2^50 - 1`).
    Readers,
    /// An extend or release: whether the owner held a live hold (`1` or `0`).
    Done(bool),
}

/// Below every `-1 - ms`: a mode conflict.
const EXCLUSIVE: i64 = -(1 << 50);
const SEMAPHORE: i64 = -(1 << 51);

impl HoldAnswer {
    /// Reads the integer [`HOLDS_LUA`] answered to `operation`.
    pub fn read(operation: &HoldOperation, answer: i64) -> HoldAnswer {
        if !operation.is_acquire() {
            return HoldAnswer::Done(answer == 1);
        }
        match answer {
            token @ 1.. => HoldAnswer::Granted(FencingToken::new(token as u64)),
            0 => HoldAnswer::Busy(None),
            EXCLUSIVE => HoldAnswer::Exclusive,
            n if n == EXCLUSIVE - 1 => HoldAnswer::Readers,
            n if n <= SEMAPHORE => {
                HoldAnswer::Semaphore((SEMAPHORE - n).clamp(0, u32::MAX as i64) as u32)
            }
            ms => HoldAnswer::Busy(Some(Duration::from_millis(ms.unsigned_abs() - 1))),
        }
    }
}

/// The `EVALSHA` of [`HOLDS_LUA`] (or, `with_text`, the `EVAL` that also
/// loads it, for a server that answered `NOSCRIPT`) that runs `operations`
/// (lock keys, owner token in hex, what to do) in order, with tokens
/// taken as `rule` says.
pub fn holds_command(
    rule: &TokenRule,
    operations: &[(&LockKeys, &str, HoldOperation)],
    with_text: bool,
) -> redis::Cmd {
    let (command, script) = match with_text {
        true => ("EVAL", HOLDS_LUA),
        false => ("EVALSHA", SCRIPT.get_hash()),
    };
    // Every rule named: each takes tokens its own way (see `HOLDS_LUA`).
    let shared = match rule {
        TokenRule::SharedClockFloor { counter } => Some(counter),
        TokenRule::ClockFloor | TokenRule::CounterFirst => None,
    };
    let own_counters = shared.is_none();
    let keys_of = |operation: &HoldOperation| {
        usize::from(operation.is_acquire() && own_counters)
            + if operation.is_read() { 4 } else { 1 }
    };
    let keys = usize::from(!own_counters)
        + operations
            .iter()
            .map(|(_, _, operation)| keys_of(operation))
            .sum::<usize>();
    let letters: String = operations.iter().map(|(_, _, o)| o.letter()).collect();
    let mut cmd = redis::Cmd::with_capacity(
        8 + 8 * operations.len(),
        128 + script.len() + 160 * operations.len(),
    );
    cmd.arg(command).arg(script).arg(keys);
    if let Some(counter) = shared {
        cmd.arg(&**counter);
    }
    for (keys, _, operation) in operations {
        let lock = &keys.lock;
        if operation.is_read() {
            cmd.arg(lock)
                .arg(crate::read_write::readers_key(keys))
                .arg(format!("{lock}:queue"))
                .arg(format!("{lock}:leases"));
        } else {
            cmd.arg(lock);
        }
        if operation.is_acquire() && own_counters {
            cmd.arg(&keys.counter);
        }
    }
    cmd.arg(rule.as_arg()).arg(letters);
    for (_, owner, operation) in operations {
        match *operation {
            HoldOperation::AcquirePermit { ttl_ms, permits } => {
                cmd.arg(ttl_ms).arg(*owner).arg(permits)
            }
            HoldOperation::ExtendPermit { ttl_ms }
            | HoldOperation::AcquireRead { ttl_ms }
            | HoldOperation::ExtendRead { ttl_ms } => cmd.arg(ttl_ms).arg(*owner),
            HoldOperation::ReleasePermit { permits } => cmd.arg(*owner).arg(permits),
            HoldOperation::ReleaseRead => cmd.arg(*owner),
        };
    }
    cmd
}

/// Runs `operations` in order in one call of [`HOLDS_LUA`] on `conn`,
/// loading the script on `NOSCRIPT`. Returns one answer per operation (see
/// [`HoldAnswer::read`]): an integer, or the error of that operation alone.
pub async fn run_holds<C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    operations: &[(&LockKeys, &str, HoldOperation)],
) -> RedisResult<Vec<RedisResult<i64>>> {
    let reply: Value = match holds_command(rule, operations, false)
        .query_async(conn)
        .await
    {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            holds_command(rule, operations, true)
                .query_async(conn)
                .await?
        }
        other => other?,
    };
    crate::scripts::answers_of(reply, operations.len())
}

/// One operation, in a call of its own.
pub async fn run_hold<C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    keys: &LockKeys,
    owner: &lock_core::OwnerToken,
    operation: HoldOperation,
) -> RedisResult<HoldAnswer> {
    let owner = owner.to_hex();
    let mut answers = run_holds(conn, rule, &[(keys, &owner, operation)]).await?;
    let answer = answers.pop().ok_or_else(|| {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "no answer from the holds script",
        ))
    })??;
    Ok(HoldAnswer::read(&operation, answer))
}

/// An extend or release, in a call of its own: whether `owner` held a live
/// hold. It takes no token, so no counter is named.
pub(crate) async fn settle<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    owner: &lock_core::OwnerToken,
    operation: HoldOperation,
) -> RedisResult<bool> {
    let answer = run_hold(conn, &TokenRule::ClockFloor, keys, owner, operation).await?;
    Ok(answer == HoldAnswer::Done(true))
}

/// An acquire answered as something else.
pub fn unexpected_answer() -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "the holds script answered an acquire as something else",
    ))
}

fn millis(ttl: Duration) -> u64 {
    // TTLs are validated to whole milliseconds of at least the backend's minimum.
    ttl.as_millis().clamp(1, u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_by_their_operation() {
        let take = HoldOperation::acquire_permit(Duration::from_secs(1), 3);
        let read = |n| HoldAnswer::read(&take, n);
        assert_eq!(read(7), HoldAnswer::Granted(FencingToken::new(7)));
        assert_eq!(read(0), HoldAnswer::Busy(None));
        assert_eq!(read(-1), HoldAnswer::Busy(Some(Duration::ZERO)));
        assert_eq!(
            read(-251),
            HoldAnswer::Busy(Some(Duration::from_millis(250)))
        );
        assert_eq!(read(EXCLUSIVE), HoldAnswer::Exclusive);
        assert_eq!(read(EXCLUSIVE - 1), HoldAnswer::Readers);
        assert_eq!(read(SEMAPHORE - 5), HoldAnswer::Semaphore(5));
        let release = HoldOperation::ReleaseRead;
        assert_eq!(HoldAnswer::read(&release, 1), HoldAnswer::Done(true));
        assert_eq!(HoldAnswer::read(&release, 0), HoldAnswer::Done(false));
    }
}
