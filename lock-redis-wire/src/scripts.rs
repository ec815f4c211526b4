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
//! The batch script may call `TIME` after earlier operations wrote, which
//! needs effect replication of scripts (the default since Redis 5), and
//! reads the old counter with `SET ... GET` (Redis 6.2): the scripts need
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
use redis::{ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value};

/// Acquires and releases, any number of them, in order, in one call: how
/// the backends send them (see [`crate::batch`]); a single acquire or
/// release is a batch of one.
///
/// `ARGV[1]` says how tokens are taken: `clock-floor` or `counter-first`
/// (see [`acquire_for_quorum`]). Then each operation, in order:
/// - acquire: `ARGV` TTL in ms, owner token; `KEYS` lock, counter;
/// - release: `ARGV` `R`, owner token, the grant's fencing token (`0` when
///   unknown); `KEYS` lock. The release is published on the lock's channel,
///   its key followed by `:released`, with the fencing token as the message:
///   the same release published by several Redlock nodes is then told apart
///   from the next one, so it wakes one waiter, not one per node. A fencing
///   token is no secret (resources are given it); the owner token is never
///   published.
///
/// Returns one integer per operation, in an array (a batch of one: the
/// integer alone, which is cheaper for the server to send). Acquire: the
/// fencing token (at least 1) when granted; when held, `-1 - remaining TTL
/// in ms`, or `0` when the key has no TTL. Release: 1 when the owner's grant
/// was deleted (and the release published), 0 when the owner did not hold it.
/// An operation that fails (a key of the wrong type, say) answers its error
/// text instead (a batch of one: the error itself), leaves no grant behind,
/// and does not stop the others.
///
/// A granted acquire makes three calls on the common path: `SET NX PX`,
/// `TIME` (once per batch) and `SET ... GET` on the counter, which reads the
/// old value in the same call. One clock reading serves a batch: batches
/// run one after another for well over a microsecond, and a key granted
/// twice in one batch finds its counter at the clock reading, so its second
/// token is above the first.
pub const BATCH_LUA: &str = r#"
local counter_first = ARGV[1] == 'counter-first'
local now, now_text

local function release(lock, owner, message)
  if redis.call('GET', lock) == owner then
    redis.call('DEL', lock)
    redis.call('PUBLISH', lock .. ':released', message)
    return 1
  end
  return 0
end

local function next_token(counter, ttl)
  local token = 1
  if counter_first then
    -- 1: there was no counter; seed it from the clock below.
    token = redis.call('INCR', counter)
  end
  if token ~= 1 then return token end
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
    now_text = t[1] .. string.sub('00000' .. t[2], -6)
  end
  -- Keep a counter that tracks the clock for the TTL plus one second.
  local keep = ttl + 1000
  local old = tonumber(redis.call('SET', counter, now_text, 'PX', keep, 'GET'))
  if old and old >= now then
    -- The counter is ahead of the clock (a write-back, or a grant in the same
    -- microsecond): stay above it, and keep it until the clock has passed it.
    token = old + 1
    redis.call('SET', counter, string.format('%.0f', token), 'PX', keep + math.floor((token - now) / 1000))
    return token
  end
  return now
end

local function acquire(lock, counter, owner, ttl)
  if not redis.call('SET', lock, owner, 'NX', 'PX', ttl) then
    return -1 - redis.call('PTTL', lock)
  end
  local ok, token = pcall(next_token, counter, ttl)
  if not ok then
    -- No token, no grant.
    redis.call('DEL', lock)
    error(token)
  end
  return token
end

local out, n, k, a = {}, 0, 1, 2
while a <= #ARGV do
  local ok, answer
  if ARGV[a] == 'R' then
    ok, answer = pcall(release, KEYS[k], ARGV[a + 1], ARGV[a + 2])
    k, a = k + 1, a + 3
  else
    ok, answer = pcall(acquire, KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a])
    k, a = k + 2, a + 2
  end
  if not ok then
    answer = type(answer) == 'table' and answer.err or tostring(answer)
  end
  n = n + 1
  out[n] = answer
end
if n == 1 then
  if type(out[1]) == 'string' then return redis.error_reply(out[1]) end
  return out[1]
end
return out
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

/// The largest counter value the scripts handle exactly (Lua numbers are doubles).
pub const MAX_COUNTER: u64 = (1 << 53) - 1;

/// The three scripts, hashed once.
#[derive(Debug)]
pub struct Scripts {
    /// [`BATCH_LUA`]: acquires and releases.
    pub batch: Script,
    /// [`EXTEND_LUA`].
    pub extend: Script,
    /// [`WRITE_BACK_LUA`].
    pub write_back: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    batch: Script::new(BATCH_LUA),
    extend: Script::new(EXTEND_LUA),
    write_back: Script::new(WRITE_BACK_LUA),
});

impl Scripts {
    /// The scripts, with their SHA1 hashes (`get_hash()`) for `EVALSHA`.
    pub fn get() -> &'static Scripts {
        &SCRIPTS
    }
}

/// How a grant takes its fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRule {
    /// `max(counter + 1, server clock in µs)`: survives a lost or stale
    /// counter on one server (see the module docs).
    ClockFloor,
    /// `counter + 1`, seeding a missing counter from the clock: for quorum
    /// fencing (see [`acquire_for_quorum`]).
    CounterFirst,
}

impl TokenRule {
    /// The script's `ARGV[1]`.
    pub fn as_arg(self) -> &'static str {
        match self {
            TokenRule::ClockFloor => "clock-floor",
            TokenRule::CounterFirst => "counter-first",
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
    },
    /// Compare-and-delete, then publish the release with the grant's
    /// fencing token (0 when unknown).
    Release {
        /// The grant's fencing token, the release message.
        token: u64,
    },
}

impl Operation {
    /// An acquire for `ttl`.
    pub fn acquire(ttl: Duration) -> Operation {
        Operation::Acquire {
            ttl_ms: millis(ttl),
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

/// Runs `operations` (lock keys, owner token in hex, what to do) in order
/// in one `EVALSHA` of [`BATCH_LUA`], loading the script on `NOSCRIPT`.
/// Returns one answer per operation (see [`BATCH_LUA`]): an integer, or the
/// error of that operation alone.
pub async fn run_batch<'a, C: ConnectionLike>(
    conn: &mut C,
    rule: TokenRule,
    operations: &[(&'a crate::LockKeys, &'a str, Operation)],
) -> RedisResult<Vec<RedisResult<i64>>> {
    // One command buffer, not ScriptInvocation's vector per argument: a
    // batch carries up to hundreds of arguments.
    let script = &SCRIPTS.batch;
    let keys = operations
        .iter()
        .map(|(_, _, operation)| match operation {
            Operation::Acquire { .. } => 2,
            Operation::Release { .. } => 1,
        })
        .sum::<usize>();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    for (keys, _, operation) in operations {
        cmd.arg(&keys.lock);
        if let Operation::Acquire { .. } = operation {
            cmd.arg(&keys.counter);
        }
    }
    cmd.arg(rule.as_arg());
    for (_, owner, operation) in operations {
        match operation {
            Operation::Acquire { ttl_ms } => cmd.arg(*ttl_ms),
            Operation::Release { .. } => cmd.arg("R"),
        };
        cmd.arg(*owner);
        if let Operation::Release { token } = operation {
            cmd.arg(*token);
        }
    }
    let reply: Value = match cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await?
        }
        other => other?,
    };
    let replies: Vec<RedisResult<i64>> = match reply {
        Value::Int(one) => vec![Ok(one)],
        Value::Array(many) => many.into_iter().map(operation_answer).collect(),
        other => return Err(unexpected(&other)),
    };
    if replies.len() != operations.len() {
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
    rule: TokenRule,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    operation: Operation,
) -> RedisResult<i64> {
    let owner = owner.to_hex();
    let mut replies = run_batch(conn, rule, &[(keys, &owner, operation)]).await?;
    replies.remove(0)
}

/// One attempt: `SET NX PX` and, when granted, the next fencing token.
pub async fn acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<AcquireReply> {
    acquire_by(conn, TokenRule::ClockFloor, keys, owner, ttl).await
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
    acquire_by(conn, TokenRule::CounterFirst, keys, owner, ttl).await
}

async fn acquire_by<C: ConnectionLike>(
    conn: &mut C,
    rule: TokenRule,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    ttl: Duration,
) -> RedisResult<AcquireReply> {
    let reply = run_one(conn, rule, keys, owner, Operation::acquire(ttl)).await?;
    Ok(AcquireReply::from_reply(reply))
}

/// Deletes the grant if `owner` holds it and publishes the release, with
/// the grant's fencing `token` (0 when unknown) as the message. Returns
/// false when `owner` did not hold it (nothing was deleted).
pub async fn release<C: ConnectionLike>(
    conn: &mut C,
    keys: &crate::LockKeys,
    owner: &OwnerToken,
    token: u64,
) -> RedisResult<bool> {
    let reply = run_one(
        conn,
        TokenRule::ClockFloor,
        keys,
        owner,
        Operation::Release { token },
    )
    .await?;
    Ok(reply == 1)
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
