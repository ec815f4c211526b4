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
//!   Tokens track the clock: a counter per lock moves to the clock at each
//!   grant (a script runs for well over a microsecond, so no key is granted
//!   more than once per microsecond), and a shared counter runs ahead of
//!   the clock by at most the acquires of one call (128 µs at most in a
//!   batcher's call; each runs on the server for over a microsecond), far
//!   less than any restart takes.
//!
//! Where the counter lives is the [`TokenRule`]'s choice:
//! - a single server keeps **one counter for all its locks**
//!   ([`TokenRule::SharedClockFloor`]): however many locks a call grants,
//!   it reads the counter with one `SET ... GET` at its first grant (a
//!   refused acquire leaves it alone), which also moves it past every
//!   token the call may still hand out (the clock reading plus one per
//!   acquire left); a second write follows only when the counter was
//!   already ahead of the clock. The counter has no TTL: it is one key,
//!   and while it lives it also covers a clock that steps back. A holder's
//!   token is then known to the holder only (the operator's view shows none);
//! - a lock on Redis Cluster keeps **a counter of its own** in its hash slot
//!   ([`TokenRule::ClockFloor`]), since one call may only touch one slot. It
//!   only has to live until the server's clock passes its value, and is
//!   kept for that long plus the lock's TTL plus one second, so it never
//!   leaks.
//!
//! The batch script may call `TIME` after earlier operations wrote, which
//! needs effect replication of scripts (the default since Redis 5), and
//! reads the old counter with `SET ... GET` (Redis 6.2), and a refused
//! acquire's holder with `SET ... NX ... GET` (Redis 7.0): the scripts need
//! Redis 7.0 or newer. Counter values are below 2^53 (Lua numbers are
//! doubles) until the year 2255.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use lock_core::{FencingToken, OwnerToken};
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value};

/// Acquires and releases, any number of them, in order, in one call: how
/// the backends send them (see [`crate::batch`]); a single acquire or
/// release is a batch of one.
///
/// `ARGV[1]` says how tokens are taken (see [`TokenRule`]): `clock-floor`,
/// `counter-first` or `shared-clock-floor`; with `shared-clock-floor`,
/// `KEYS[1]` is the shared counter. `ARGV[2]` names the operations, one
/// letter each, and `ARGV[3]` is the TTL in ms of the acquires that name
/// none. Then each operation's arguments and keys, in order:
/// - acquire, `a` (or `w` when others are known to wait for the lock):
///   `ARGV` owner token; `A` (or `W`): `ARGV` TTL in ms, owner token;
///   `KEYS` lock, then its own counter unless the counter is shared;
/// - release, `r`: `ARGV` owner token, the grant's fencing token (`0` when
///   unknown); `KEYS` lock;
/// - a waiter's attempt, `q`: `ARGV` TTL in ms, owner token, the waiter's
///   place (its client's session, then its own id), the client's lease in
///   ms; `KEYS` as an acquire's;
/// - a waiter giving up, `g`: `ARGV` its place; `KEYS` lock;
/// - a client keeping its places, `k`: `ARGV` its session, the lease in ms;
///   `KEYS` lock;
/// - a Redlock waiter giving back a grant that made no majority, `y`:
///   `ARGV` owner token, its place, its session's lease in ms; `KEYS` lock.
///
/// # The waiting line
///
/// A lock's waiters stand in a line beside it, in its hash slot: the list
/// `{key}:queue` of places, head first, and the hash `{key}:leases` of
/// the lease expiry, in ms of server time, of each client with places in
/// it (a place is its client's session, 32 characters, then its own id).
/// A client renews its lease for all its waiters of the lock at once
/// (`k`), so the cost of keeping the line does not grow with the waiters.
/// Only waiters and releases of a grant marked as waited for touch the
/// line, so an uncontended acquire and release cost what they did. A
/// refused `q` joins the line. A release whose line is not empty reserves
/// the key for the live head (value `~` and its place, until its client's
/// lease would run out) and publishes the place, which wakes that waiter
/// alone; heads whose client's lease ran out (a client that died) are
/// dropped on the way. The head's `q` takes the reservation; a plain
/// acquire is refused by it, so newcomers do not pass the line. A grant
/// that lapses by its TTL instead frees the key for whoever asks first;
/// the next `k` hands it to the line's head if nobody did.
///
/// [`batch_command`] writes them.
///
/// A release is published only when someone waits for the lock: a grant's
/// value is its owner token, followed by `+` once an acquire was refused on
/// it (the refused acquire adds it) or when the acquire said others wait.
/// An uncontended acquire and release then publish nothing. A marked
/// release is published on the lock's channel, its key followed by
/// `:released`, with the fencing token as the message: the same release
/// published by several Redlock nodes is then told apart from the next one,
/// so it wakes one waiter, not one per node. A fencing token is no secret
/// (resources are given it); the owner token is never published.
///
/// An acquire that finds its own owner's grant grants it anew, for the TTL
/// asked now and with a fresh token. That grant is an earlier run of the
/// same request: the cluster client sends an acquire again after a lost
/// connection or a redirect, or a caller of the backend retries with the
/// same owner after a timeout. Without this, such a caller would wait for
/// its own grant to expire.
///
/// Returns one integer per operation, in an array (a batch of one: the
/// integer alone, which is cheaper for the server to send). Acquire: the
/// fencing token (at least 1) when granted; when held, `-1 - remaining TTL
/// in ms`, or `0` when the key has no TTL. Release: 1 when the owner's grant
/// was deleted (and, when marked, the release published), 0 when the owner
/// did not hold it.
/// An operation that fails (a key of the wrong type, say) answers its error
/// text instead (a batch of one: the error itself), leaves no grant behind,
/// and does not stop the others.
///
/// A granted acquire makes, on the common path, with a shared counter:
/// `SET NX PX GET` (whose answer, when refused, is the holder's value), and
/// once per batch `TIME` and `SET ... GET` on the counter, which reads the
/// old value and moves the counter past every token the batch may still
/// hand out in the same call. With a counter per lock: `SET NX PX GET`,
/// `TIME` (once per batch) and `SET ... GET` on the lock's counter (Redis
/// Cluster), or `INCR` (Redlock). One clock reading serves a batch: batches
/// run one after another for well over a microsecond, and a key granted
/// twice in one batch finds its counter at the clock reading, so its
/// second token is above the first.
///
/// The script is written for the server's cost per operation, which the
/// lab counts (`lockkit-lab`): operations share one letter string and
/// one TTL, the common paths are inline, and functions are made only where
/// they are used. Counted with callgrind, the server makes a script's
/// functions anew at every call, each at about the cost of two of an
/// operation's arguments (about 500 instructions each), and a call into
/// one costs about half an argument.
pub const BATCH_LUA: &str = r#"
-- The operations, in order: ARGV[2] names them, one letter each, and their
-- arguments follow ARGV[3] (see the Rust docs). The server makes this
-- script's functions anew at every call and pays for every call into one
-- (the Rust docs give the counts): the common path of each operation is
-- written inline, and a function is made only where it is used. An
-- operation that fails (a key of the wrong type, a write the server
-- refuses) answers its error and spoils no other: calls that can fail go
-- through redis.pcall or pcall.
local rule, ops, batch_ttl = ARGV[1], ARGV[2], ARGV[3]
local shared = rule == 'shared-clock-floor'
local counter_first = rule == 'counter-first'
local n = #ops
-- Checked before any operation runs, so that a malformed call writes nothing.
if string.find(ops, '[^awAWrqgky]') then
  return redis.error_reply('ERR unknown lock operation in ' .. ops)
end

-- The clock, read once per batch where a token needs it: in µs, and as
-- decimal text.
local now, now_text
local function read_clock()
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
    now_text = t[1] .. string.sub('00000' .. t[2], -6)
  end
end

-- The first token of a grant that `last` does not follow (see below).
local first_token
if shared then
  -- One counter for every lock (KEYS[1]), read at the batch's first grant
  -- (operation `from`) and moved, in one write, past every token the batch
  -- may still hand out: one per acquire from there on. Its later grants
  -- follow on.
  first_token = function(_, _, from)
    local left = 1
    if from < n then
      local _, acquires = string.gsub(string.sub(ops, from), '[awAWq]', '')
      left = acquires
    end
    read_clock()
    local top = now_text
    -- string.format only when needed: it costs the server about ten
    -- times an argument.
    if left > 1 then top = string.format('%.0f', now + left - 1) end
    local old = tonumber(redis.call('SET', KEYS[1], top, 'GET'))
    if old and old >= now then
      -- Ahead of the clock (a batch less than `left` µs ago, a clock that
      -- stepped back): stay above it.
      redis.call('SET', KEYS[1], string.format('%.0f', old + left))
      return old + 1
    end
    return now
  end
else
  -- A counter of the lock's own (Redis Cluster, Redlock), kept while it
  -- tracks the clock, plus the TTL and a second. Under counter-first, this
  -- seeds a counter that an INCR found missing (see the grant below): the
  -- old value it reads is then that INCR's 1, below any clock.
  first_token = function(counter, ttl)
    read_clock()
    local keep = ttl + 1000
    local old = tonumber(redis.call('SET', counter, now_text, 'PX', keep, 'GET'))
    if old and old >= now then
      -- The counter is ahead of the clock (a write-back, or a grant in the
      -- same microsecond): stay above it, and keep it until the clock has
      -- passed it.
      local token = old + 1
      redis.call('SET', counter, string.format('%.0f', token), 'PX',
        keep + math.floor((token - now) / 1000))
      return token
    end
    return now
  end
end
-- The shared counter's last token handed out, once read.
local last

-- An error, as an operation's answer.
local function error_text(e)
  return type(e) == 'table' and e.err or tostring(e)
end

-- Puts a place in a line (made below, where a place may join one).
local join_line

local out = {}
local k, a = 1, 4
if shared then k = 2 end
for i = 1, n do
  local op = string.byte(ops, i)
  local lock = KEYS[k]
  if (op == 113 or op == 121) and not join_line then
    -- Puts `place` in the line `queue`: at the tail, or, for a stamped
    -- place (Redlock's: longer than a session and an id, with its arrival
    -- stamp after the session), in order of its stamp and id, so that
    -- independent nodes put the same waiters in the same order whatever
    -- order their places reached them in.
    join_line = function(queue, place)
      if #place <= 64 then
        redis.call('RPUSH', queue, place)
        return
      end
      -- Places mostly come in order: the tail is looked at first; a place
      -- that came late is put in by halving (a crowd's places come in
      -- shuffled, and a walk from the tail would cost a command a step).
      local rank = string.sub(place, 33)
      local last = redis.call('LINDEX', queue, -1)
      if not last or string.sub(last, 33) < rank then
        redis.call('RPUSH', queue, place)
        return
      end
      -- The first place ranked after this one is in [low, high].
      local low, high = 0, redis.call('LLEN', queue) - 1
      while low < high do
        local middle = math.floor((low + high) / 2)
        if string.sub(redis.call('LINDEX', queue, middle), 33) < rank then
          low = middle + 1
        else
          high = middle
        end
      end
      redis.call('LINSERT', queue, 'BEFORE', redis.call('LINDEX', queue, low), place)
    end
  end
  -- Set to a lock whose turn is to be handed to its line's next waiter,
  -- and to a place not to wake if the turn is its own (it knows).
  local hand, quiet
  if op == 114 then
    -- r: release. A grant's value is the owner token, followed by '+' once
    -- someone is known to wait; only then is the release published, with
    -- the grant's fencing token.
    local owner = ARGV[a]
    local value = redis.pcall('GET', lock)
    if value == owner then
      -- A write the server refuses (a replica after a failover, say)
      -- answers its error, as any failed operation does.
      local deleted = redis.pcall('DEL', lock)
      out[i] = deleted == 1 and 1 or error_text(deleted)
    elseif type(value) == 'table' then
      out[i] = value.err
    elseif value and value == owner .. '+' then
      local deleted = redis.pcall('DEL', lock)
      out[i] = deleted == 1 and 1 or error_text(deleted)
      if deleted == 1 and redis.pcall('EXISTS', lock .. ':queue') == 1 then
        -- Waiters in line: the turn goes to the next, who alone is woken.
        hand = lock
      else
        -- Released even when the message fails: waiters poll as a backstop.
        redis.pcall('PUBLISH', lock .. ':released', ARGV[a + 1])
      end
    else
      out[i] = 0
    end
    k, a = k + 1, a + 2
  elseif op == 103 then
    -- g: the waiter at ARGV place gives up its place in the lock's line,
    -- and the turn, if it was its own.
    local place = ARGV[a]
    local ok, turn = pcall(function()
      redis.call('LREM', lock .. ':queue', 0, place)
      if redis.call('GET', lock) == '~' .. place then
        redis.call('DEL', lock)
        return true
      end
      return false
    end)
    if not ok then
      out[i] = error_text(turn)
    else
      out[i] = 1
      if turn then hand = lock end
    end
    k, a = k + 1, a + 1
  elseif op == 121 then
    -- y: a Redlock waiter gives back a grant that made no majority and
    -- keeps its place: ARGV its owner token, its place, its session's
    -- lease in ms. The place goes back in order of its stamp, and the turn
    -- to the line's head: another waiter ahead of it (a split between
    -- nodes is settled by the stamps), which is woken, or itself again,
    -- which is not (the other nodes wake it as they hand it the turn).
    local owner, place, lease = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
    local ok, e = pcall(function()
      local value = redis.call('GET', lock)
      if value ~= owner and value ~= owner .. '+' then return false end
      redis.call('DEL', lock)
      local queue, leases = lock .. ':queue', lock .. ':leases'
      read_clock()
      redis.call('HSET', leases, string.sub(place, 1, 32), math.floor(now / 1000) + lease)
      if not redis.call('LPOS', queue, place) then
        join_line(queue, place)
      end
      local keep = lease * 3
      if redis.call('PTTL', queue) < keep then
        redis.call('PEXPIRE', queue, keep)
        redis.call('PEXPIRE', leases, keep)
      end
      return true
    end)
    if not ok then
      out[i] = error_text(e)
    else
      out[i] = e and 1 or 0
      if e then hand, quiet = lock, place end
    end
    k, a = k + 1, a + 3
  elseif op == 107 then
    -- k: a client keeps its places in the lock's line: ARGV its session,
    -- the lease in ms. Renews the session's lease; hands the turn on when
    -- the key is free (a grant that lapsed, a head that died in line);
    -- wakes the client's own waiter again when the key is reserved for it
    -- (a wake-up message it may have missed).
    local session, lease = ARGV[a], tonumber(ARGV[a + 1])
    local ok, e = pcall(function()
      local queue, leases = lock .. ':queue', lock .. ':leases'
      read_clock()
      redis.call('HSET', leases, session, math.floor(now / 1000) + lease)
      local keep = lease * 3
      if redis.call('PTTL', queue) < keep then
        redis.call('PEXPIRE', queue, keep)
        redis.call('PEXPIRE', leases, keep)
      end
      local current = redis.call('GET', lock)
      if not current then
        if redis.call('EXISTS', queue) == 1 then return true end
      elseif string.sub(current, 1, 33) == '~' .. session then
        redis.call('PUBLISH', lock .. ':released', string.sub(current, 2))
      end
      return false
    end)
    if not ok then
      out[i] = error_text(e)
    else
      out[i] = 1
      if e then hand = lock end
    end
    k, a = k + 1, a + 2
  else
    -- a, w: acquire with the batch's TTL, w when others are known to wait;
    -- A, W: the same with a TTL of their own, before the owner.
    local ttl, owner = batch_ttl, ARGV[a]
    local value = owner
    local place, lease
    if op == 97 then
    elseif op == 119 then
      value = owner .. '+'
    elseif op == 113 then
      -- q: a waiter's attempt; TTL, owner, place (its client's session,
      -- 32 characters, then its own), the session's lease in ms.
      ttl, owner, place, lease = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
      value = owner
      a = a + 3
    else
      -- A or W.
      a = a + 1
      ttl, owner = owner, ARGV[a]
      value = owner
      if op == 87 then value = owner .. '+' end
    end
    local counter
    if not shared then counter = KEYS[k + 1] end
    local holder, granted
    if place then
      -- In line: granted when the key is free and this place the live head
      -- (or the line empty), or the key reserved for it by a release;
      -- refused, the place joins the line or has its lease renewed.
      local ok, answer = pcall(function()
        local queue, leases = lock .. ':queue', lock .. ':leases'
        read_clock()
        local now_ms = math.floor(now / 1000)
        local current = redis.call('GET', lock)
        local mine = current == '~' .. place or current == owner or current == owner .. '+'
        if not current then
          local head
          repeat
            head = redis.call('LINDEX', queue, 0)
            if not head then break end
            local expiry = tonumber(redis.call('HGET', leases, string.sub(head, 1, 32)))
            if expiry and expiry > now_ms then break end
            -- A head whose client's lease ran out died in line: skipped.
            redis.call('LPOP', queue)
            head = nil
          until false
          if not head or head == place then
            mine = true
          else
            -- Free, and another's turn (a grant that lapsed rather than
            -- being released): wake that waiter.
            redis.call('PUBLISH', lock .. ':released', head)
          end
        end
        if mine then
          redis.call('LREM', queue, 0, place)
          if redis.call('LLEN', queue) > 0 then value = owner .. '+' end
          redis.call('SET', lock, value, 'PX', ttl)
          return true
        end
        redis.call('HSET', leases, string.sub(place, 1, 32), now_ms + lease)
        if not redis.call('LPOS', queue, place) then
          join_line(queue, place)
        end
        -- The line outlives its waiters' leases by a little, never for ever.
        local keep = lease * 3
        if redis.call('PTTL', queue) < keep then
          redis.call('PEXPIRE', queue, keep)
          redis.call('PEXPIRE', leases, keep)
        end
        -- The holder's release is to hand the turn on (a reservation,
        -- `~` and a place, is handed on by its waiter or its expiry).
        if current and string.byte(current, 1) ~= 126 and string.byte(current, -1) ~= 43 then
          redis.call('SET', lock, current .. '+', 'XX', 'KEEPTTL')
        end
        local left = redis.call('PTTL', lock)
        if left < 0 then return 0 end
        return -1 - left
      end)
      if not ok then
        out[i] = error_text(answer)
      elseif answer == true then
        granted = true
      else
        out[i] = answer
      end
    else
      holder = redis.pcall('SET', lock, value, 'NX', 'PX', ttl, 'GET')
      granted = not holder
    end
    if granted or place then
    elseif type(holder) == 'table' then
      out[i] = holder.err
    else
      local ok, answer = pcall(function()
        if holder == owner or holder == owner .. '+' then
          -- The owner asking again (its earlier acquire ran, but the
          -- caller saw an error): granted anew, for the TTL asked now,
          -- marked if the grant or this acquire was, with a fresh token.
          if string.byte(holder, -1) == 43 then value = holder end
          redis.call('SET', lock, value, 'XX', 'PX', ttl)
          return true
        end
        -- Refused: the holder's grant learns that someone waits; the
        -- answer is the remaining TTL. A turn reserved for a waiter in line
        -- (`~` and its place) is left as it is.
        if string.byte(holder, -1) ~= 43 and string.byte(holder, 1) ~= 126 then
          redis.call('SET', lock, holder .. '+', 'XX', 'KEEPTTL')
        end
        return -1 - redis.call('PTTL', lock)
      end)
      if not ok then
        out[i] = error_text(answer)
      elseif answer == true then
        granted = true
      else
        out[i] = answer
      end
    end
    if granted then
      -- The grant's token. No token, no grant.
      local ok, token = true, nil
      if last then
        last = last + 1
        token = last
      elseif counter_first then
        -- Inline, the common path: the lock's counter exists already.
        token = redis.pcall('INCR', counter)
        if token == 1 then
          -- There was no counter: seeded from the clock. A seed that fails
          -- leaves no counter behind (one at 1, with no TTL, would count
          -- on from there rather than from the clock).
          ok, token = pcall(first_token, counter, ttl, i)
          if not ok then redis.pcall('DEL', counter) end
        elseif type(token) == 'table' then
          ok = false
        end
      else
        ok, token = pcall(first_token, counter, ttl, i)
        if ok and shared then last = token end
      end
      if ok then
        out[i] = token
      else
        redis.pcall('DEL', lock)
        out[i] = error_text(token)
      end
    end
    if shared then k = k + 1 else k = k + 2 end
    a = a + 1
  end
  if hand then
    -- The turn goes to the line's live head (heads whose lease ran out
    -- are dropped): the key is reserved for it, `~` and its place, until
    -- its lease would run out, and it alone is woken, by its place. A
    -- handoff that fails leaves the turn to the waiters' polls.
    pcall(function()
      local queue, leases = hand .. ':queue', hand .. ':leases'
      read_clock()
      local now_ms = math.floor(now / 1000)
      repeat
        local head = redis.call('LINDEX', queue, 0)
        if not head then return end
        local expiry = tonumber(redis.call('HGET', leases, string.sub(head, 1, 32)))
        if expiry and expiry > now_ms then
          redis.call('SET', hand, '~' .. head, 'PX', expiry - now_ms)
          if head ~= quiet then
            redis.call('PUBLISH', hand .. ':released', head)
          end
          return
        end
        redis.call('LPOP', queue)
      until false
    end)
  end
end
if n == 1 then
  if type(out[1]) == 'string' then return redis.error_reply(out[1]) end
  return out[1]
end
return out
"#;

/// `KEYS[1]` lock; `ARGV[1]` owner token, `ARGV[2]` TTL in ms.
/// Moves the expiry only if `ARGV[1]` holds the grant (its value is the
/// owner token, followed by `+` when someone waits). Returns 1 or 0.
pub const EXTEND_LUA: &str = r#"
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] or (value and value == ARGV[1] .. '+') then
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

/// `KEYS[1]` lock; `ARGV[1]`, optional, the waiter's place in line. A
/// waiter that has just subscribed to the lock's release
/// channel marks the grant it finds as waited for, as a refused acquire
/// does, so that its release publishes: a grant taken meanwhile by a client
/// that knew of no waiter would otherwise be released without a message.
/// Returns 1 when the lock is held, 0 when it is free, 2 when a release
/// reserved it for the waiter's place (its turn came before it subscribed).
pub const MARK_WAITED_FOR_LUA: &str = r#"
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
if string.byte(value, 1) == 126 then
  if ARGV[1] and value == '~' .. ARGV[1] then return 2 end
  return 1
end
if string.byte(value, -1) ~= 43 then
  redis.call('SET', KEYS[1], value .. '+', 'XX', 'KEEPTTL')
end
return 1
"#;

/// The largest counter value the scripts handle exactly (Lua numbers are doubles).
pub const MAX_COUNTER: u64 = (1 << 53) - 1;

/// The scripts, hashed once.
#[derive(Debug)]
pub struct Scripts {
    /// [`BATCH_LUA`]: acquires and releases.
    pub batch: Script,
    /// [`EXTEND_LUA`].
    pub extend: Script,
    /// [`WRITE_BACK_LUA`].
    pub write_back: Script,
    /// [`MARK_WAITED_FOR_LUA`].
    pub mark_waited_for: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    batch: Script::new(BATCH_LUA),
    extend: Script::new(EXTEND_LUA),
    write_back: Script::new(WRITE_BACK_LUA),
    mark_waited_for: Script::new(MARK_WAITED_FOR_LUA),
});

impl Scripts {
    /// The scripts, with their SHA1 hashes (`get_hash()`) for `EVALSHA`.
    pub fn get() -> &'static Scripts {
        &SCRIPTS
    }
}

/// How a grant takes its fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRule {
    /// `max(counter + 1, server clock in µs)` with a counter per lock, in
    /// the lock's hash slot: survives a lost or stale counter on one server
    /// (see the module docs). For Redis Cluster.
    ClockFloor,
    /// `counter + 1`, seeding a missing counter from the clock: for quorum
    /// fencing (see [`acquire_for_quorum`]).
    CounterFirst,
    /// `max(counter + 1, server clock in µs)` with one counter, this key
    /// ([`KeyLayout::shared_counter`](crate::KeyLayout::shared_counter)),
    /// for every lock on the server: one `SET ... GET` per call that
    /// grants, however many locks it grants (and a second `SET` when the
    /// counter was ahead of the clock). For a single server.
    SharedClockFloor {
        /// The shared counter's key.
        counter: Arc<str>,
    },
}

impl TokenRule {
    /// The script's `ARGV[1]`.
    pub fn as_arg(&self) -> &'static str {
        match self {
            TokenRule::ClockFloor => "clock-floor",
            TokenRule::CounterFirst => "counter-first",
            TokenRule::SharedClockFloor { .. } => "shared-clock-floor",
        }
    }

    /// The counter every lock shares, if there is one.
    fn shared_counter(&self) -> Option<&str> {
        match self {
            TokenRule::SharedClockFloor { counter } => Some(counter),
            _ => None,
        }
    }
}

/// What one operation of a batch asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `SET NX PX` for this many milliseconds and, when granted, a token.
    Acquire {
        /// The TTL in milliseconds.
        ttl_ms: u64,
        /// Others are known to wait for the lock: the grant's release is to
        /// publish (see [`BATCH_LUA`]).
        others_wait: bool,
    },
    /// Compare-and-delete, then, when the grant is marked as waited for,
    /// publish the release with the grant's
    /// fencing token (0 when unknown).
    Release {
        /// The grant's fencing token, the release message.
        token: u64,
    },
}

impl Operation {
    /// An acquire for `ttl`; `others_wait`: others are known to wait for
    /// the lock, so the grant's release is to publish.
    pub fn acquire(ttl: Duration, others_wait: bool) -> Operation {
        Operation::Acquire {
            ttl_ms: millis(ttl),
            others_wait,
        }
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

impl AcquireReply {
    /// Reads the acquire's integer in a [`BATCH_LUA`] reply.
    pub fn from_reply(reply: i64) -> AcquireReply {
        match reply {
            token @ 1.. => AcquireReply::Granted(FencingToken::new(token as u64)),
            0 => AcquireReply::Contended(None),
            held => AcquireReply::Contended(Some(Duration::from_millis(held.unsigned_abs() - 1))),
        }
    }
}

fn millis(ttl: Duration) -> u64 {
    // TTLs are validated to whole milliseconds of at least the backend's minimum.
    ttl.as_millis().clamp(1, u64::MAX as u128) as u64
}

/// The `EVALSHA` of [`BATCH_LUA`] that runs `operations` (lock keys, owner
/// token in hex, what to do) in order, with its arguments as the script
/// reads them. One command buffer, not `ScriptInvocation`'s vector per
/// argument: a batch carries up to hundreds of arguments.
pub fn batch_command(
    rule: &TokenRule,
    operations: &[(&crate::LockKeys, &str, Operation)],
) -> redis::Cmd {
    batch_call("EVALSHA", SCRIPTS.batch.get_hash(), rule, operations)
}

/// [`batch_command`] as an `EVAL` with the script's text, which also loads
/// the script: for a call the server answered `NOSCRIPT`.
pub fn batch_command_with_text(
    rule: &TokenRule,
    operations: &[(&crate::LockKeys, &str, Operation)],
) -> redis::Cmd {
    batch_call("EVAL", BATCH_LUA, rule, operations)
}

/// `command` with `script` (its hash or its text), followed by the
/// arguments of `operations`.
fn batch_call(
    command: &str,
    script: &str,
    rule: &TokenRule,
    operations: &[(&crate::LockKeys, &str, Operation)],
) -> redis::Cmd {
    let shared = rule.shared_counter();
    // Each lock, and each acquire's own counter unless one is shared.
    let own_counters = shared.is_none();
    let keys = usize::from(!own_counters)
        + operations
            .iter()
            .map(|(_, _, operation)| match operation {
                Operation::Acquire { .. } if own_counters => 2,
                _ => 1,
            })
            .sum::<usize>();
    // The TTL of the batch's first acquire serves every acquire that asks
    // for the same: callers of one client mostly do.
    let batch_ttl = operations
        .iter()
        .find_map(|(_, _, operation)| match operation {
            Operation::Acquire { ttl_ms, .. } => Some(*ttl_ms),
            Operation::Release { .. } => None,
        })
        .unwrap_or(0);
    let letters: String = operations
        .iter()
        .map(|(_, _, operation)| match *operation {
            Operation::Acquire {
                ttl_ms,
                others_wait,
            } => match (ttl_ms == batch_ttl, others_wait) {
                (true, false) => 'a',
                (true, true) => 'w',
                (false, false) => 'A',
                (false, true) => 'W',
            },
            Operation::Release { .. } => 'r',
        })
        .collect();
    // Sized once, generously: a batch of dozens of operations would
    // otherwise grow the command's buffer many times over, copying it each
    // time (4% of a Redlock client's CPU samples at 64 tasks, in a profile).
    let per_operation: usize = operations
        .iter()
        .map(|(keys, owner, _)| keys.lock.len() + keys.counter.len() + owner.len() + 2 * 20)
        .sum();
    let mut cmd = redis::Cmd::with_capacity(
        8 + 4 * operations.len(),
        128 + script.len() + letters.len() + per_operation,
    );
    cmd.arg(command).arg(script).arg(keys);
    if let Some(counter) = shared {
        cmd.arg(counter);
    }
    for (keys, _, operation) in operations {
        cmd.arg(&keys.lock);
        if let (Operation::Acquire { .. }, true) = (operation, own_counters) {
            cmd.arg(&keys.counter);
        }
    }
    cmd.arg(rule.as_arg()).arg(letters).arg(batch_ttl);
    for (_, owner, operation) in operations {
        match *operation {
            Operation::Acquire { ttl_ms, .. } => {
                if ttl_ms != batch_ttl {
                    cmd.arg(ttl_ms);
                }
                cmd.arg(*owner)
            }
            Operation::Release { token } => cmd.arg(*owner).arg(token),
        };
    }
    cmd
}

/// Runs `operations` (lock keys, owner token in hex, what to do) in order
/// in one `EVALSHA` of [`BATCH_LUA`], loading the script on `NOSCRIPT`.
/// Returns one answer per operation (see [`BATCH_LUA`]): an integer, or the
/// error of that operation alone.
pub async fn run_batch<'a, C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    operations: &[(&'a crate::LockKeys, &'a str, Operation)],
) -> RedisResult<Vec<RedisResult<i64>>> {
    let script = &SCRIPTS.batch;
    let cmd = batch_command(rule, operations);
    let reply: Value = match cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await?
        }
        other => other?,
    };
    answers_of(reply, operations.len())
}

/// The answers of a batch script's call of `count` operations: an integer
/// alone (a call of one), or an array of integers and error texts.
pub(crate) fn answers_of(reply: Value, count: usize) -> RedisResult<Vec<RedisResult<i64>>> {
    let replies: Vec<RedisResult<i64>> = match reply {
        Value::Int(one) => vec![Ok(one)],
        Value::Array(many) => many.into_iter().map(operation_answer).collect(),
        other => return Err(unexpected(&other)),
    };
    if replies.len() != count {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "the batch script answered a different number of operations than it was sent",
        )));
    }
    Ok(replies)
}

/// One operation's answer in a batch's array: its integer, or its error.
fn operation_answer(answer: Value) -> RedisResult<i64> {
    match answer {
        Value::Int(n) => Ok(n),
        Value::BulkString(text) => Err(RedisError::from((
            ErrorKind::Extension,
            "a lock operation failed in the batch script",
            String::from_utf8_lossy(&text).into_owned(),
        ))),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(answer: &Value) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected answer from the batch script",
        format!("{answer:?}"),
    ))
}

async fn run_one<C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    operation: Operation,
) -> RedisResult<i64> {
    let owner = owner.to_hex();
    let mut replies = run_batch(conn, rule, &[(keys, &owner, operation)]).await?;
    replies.remove(0)
}

/// One attempt: `SET NX PX` and, when granted, the next fencing token.
/// `others_wait`: others are known to wait for the lock, so the grant's
/// release is to publish.
pub async fn acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
    others_wait: bool,
) -> RedisResult<AcquireReply> {
    let operation = Operation::acquire(ttl, others_wait);
    acquire_by(conn, &TokenRule::ClockFloor, keys, owner, operation).await
}

/// Like [`acquire`], with the tokens taken by `rule` (as a batcher with
/// that rule takes them, so that grants sent either way share one order).
pub async fn acquire_with_rule<C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
    others_wait: bool,
) -> RedisResult<AcquireReply> {
    acquire_by(
        conn,
        rule,
        keys,
        owner,
        Operation::acquire(ttl, others_wait),
    )
    .await
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
    others_wait: bool,
) -> RedisResult<AcquireReply> {
    let operation = Operation::acquire(ttl, others_wait);
    acquire_by(conn, &TokenRule::CounterFirst, keys, owner, operation).await
}

async fn acquire_by<C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    operation: Operation,
) -> RedisResult<AcquireReply> {
    let reply = run_one(conn, rule, keys, owner, operation).await?;
    Ok(AcquireReply::from_reply(reply))
}

/// Deletes the grant if `owner` holds it and, when someone waits for the
/// lock, publishes the release, with the grant's fencing `token` (0 when
/// unknown) as the message. Returns false when `owner` did not hold it
/// (nothing was deleted).
pub async fn release<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    token: u64,
) -> RedisResult<bool> {
    let reply = run_one(
        conn,
        &TokenRule::ClockFloor,
        keys,
        owner,
        Operation::Release { token },
    )
    .await?;
    Ok(reply == 1)
}

/// The operator's force release: deletes the grant whoever holds it (with
/// a read-write lock's readers, which live beside it) and publishes the
/// release so waiters need not wait for their next poll. Returns whether
/// there was a grant.
pub async fn force_release<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
) -> RedisResult<bool> {
    // One DEL for the marker and the readers (one hash slot): between two,
    // a reader could set a new marker and join the set the second deletes,
    // leaving a marker with no reader that blocks writers until it expires.
    let (deleted, _receivers): (i64, i64) = redis::pipe()
        .cmd("DEL")
        .arg(&keys.lock)
        .arg(crate::read_write::readers_key(keys))
        .cmd("PUBLISH")
        .arg(&keys.channel)
        .arg("released")
        .query_async(conn)
        .await?;
    Ok(deleted > 0)
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

/// Marks the grant of `lock` (a lock key), if there is one, as waited for
/// (see [`MARK_WAITED_FOR_LUA`]). Returns whether the lock is held.
pub async fn mark_waited_for<C: ConnectionLike>(conn: &mut C, lock: &str) -> RedisResult<bool> {
    let held: i64 = SCRIPTS.mark_waited_for.key(lock).invoke_async(conn).await?;
    Ok(held == 1)
}

/// [`mark_waited_for`] for the waiter at `place` in the lock's line.
/// Returns whether it must wait on: the lock is held, and not reserved for
/// `place`.
pub async fn mark_waited_for_place<C: ConnectionLike>(
    conn: &mut C,
    lock: &str,
    place: &str,
) -> RedisResult<bool> {
    let held: i64 = SCRIPTS
        .mark_waited_for
        .key(lock)
        .arg(place)
        .invoke_async(conn)
        .await?;
    Ok(held == 1)
}

/// One attempt by the waiter at `place` in the lock's line (operation `q`
/// of [`BATCH_LUA`]), in a call of its own: granted only when the key is
/// free and `place` at the head of the line (or the line empty), or the
/// key reserved for `place` by a release; otherwise `place` joins the line
/// (if it is not in it) and its client's lease is renewed, for `lease`.
/// `place` is the client's session (32 characters), then the waiter's id. Waiters are the contended path, so
/// this does not go through a batcher.
pub async fn acquire_in_line<C: ConnectionLike>(
    conn: &mut C,
    rule: &TokenRule,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    place: &str,
    ttl: Duration,
    lease: Duration,
) -> RedisResult<AcquireReply> {
    let build = |command: &str, script: &str| {
        let mut cmd = redis::cmd(command);
        cmd.arg(script);
        match rule.shared_counter() {
            Some(counter) => cmd.arg(2).arg(counter).arg(&keys.lock),
            None => cmd.arg(2).arg(&keys.lock).arg(&keys.counter),
        };
        let ttl = millis(ttl);
        cmd.arg(rule.as_arg()).arg("q").arg(ttl);
        cmd.arg(ttl)
            .arg(owner.to_hex())
            .arg(place)
            .arg(millis(lease));
        cmd
    };
    let reply = run_single(conn, build).await?;
    Ok(AcquireReply::from_reply(reply))
}

/// Gives back `owner`'s grant of the lock, which made no majority of
/// Redlock's nodes, keeping the waiter's `place` in line (operation `y` of
/// [`BATCH_LUA`]): the place goes back in order of its stamp and the turn
/// to the line's head. Returns false when `owner` held no grant there.
pub async fn give_back_turn<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    place: &str,
    lease: Duration,
) -> RedisResult<bool> {
    let build = |command: &str, script: &str| {
        let mut cmd = redis::cmd(command);
        cmd.arg(script).arg(1).arg(&keys.lock);
        cmd.arg(TokenRule::ClockFloor.as_arg()).arg("y").arg(0);
        cmd.arg(owner.to_hex()).arg(place).arg(millis(lease));
        cmd
    };
    run_single(conn, build).await.map(|given| given == 1)
}

/// Renews the lease of a client's places in the lock's line and hands a
/// free key to the line's head (operation `k` of [`BATCH_LUA`]).
pub async fn keep_line<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    session: &str,
    lease: Duration,
) -> RedisResult<()> {
    let build = |command: &str, script: &str| {
        let mut cmd = redis::cmd(command);
        cmd.arg(script).arg(1).arg(&keys.lock);
        cmd.arg(TokenRule::ClockFloor.as_arg()).arg("k").arg(0);
        cmd.arg(session).arg(millis(lease));
        cmd
    };
    run_single(conn, build).await.map(drop)
}

/// Takes `place` out of the lock's line (operation `g` of [`BATCH_LUA`]),
/// handing the turn on if the key was reserved for it.
pub async fn leave_line<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    place: &str,
) -> RedisResult<()> {
    let build = |command: &str, script: &str| {
        let mut cmd = redis::cmd(command);
        cmd.arg(script).arg(1).arg(&keys.lock);
        cmd.arg(TokenRule::ClockFloor.as_arg())
            .arg("g")
            .arg(0)
            .arg(place);
        cmd
    };
    run_single(conn, build).await.map(drop)
}

/// Runs a call of [`BATCH_LUA`] with one operation, built by `build` from
/// the command and the script (its hash, or its text after `NOSCRIPT`).
async fn run_single<C: ConnectionLike>(
    conn: &mut C,
    build: impl Fn(&str, &str) -> redis::Cmd,
) -> RedisResult<i64> {
    let script = &SCRIPTS.batch;
    match build("EVALSHA", script.get_hash()).query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            build("EVAL", BATCH_LUA).query_async(conn).await
        }
        other => other,
    }
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
