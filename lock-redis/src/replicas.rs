//! Waiting for replicas (`min_replicas`): a grant or an extension counts
//! only once `WAIT` says that enough replicas have it.
//!
//! `WAIT` waits for the writes of the connection it is sent on, so it goes
//! out right behind the lock's script, in one pipeline on the same
//! connection (the shared one: the batcher's own socket is not used then).

use std::time::Duration;

use lock_core::{Error, Result};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::connection::Conn;

/// Refuses a `min_replicas` that is not a small whole number.
pub(crate) fn parse_min(text: &str) -> Result<u32> {
    text.parse::<u32>()
        .ok()
        .filter(|n| *n <= MAX_REPLICAS)
        .ok_or_else(|| {
            Error::invalid(
                "min_replicas",
                format!("`{text}` is not a number of replicas from 0 to {MAX_REPLICAS}"),
            )
        })
}

/// More replicas than any deployment has; a typo, not a wish.
const MAX_REPLICAS: u32 = 100;

/// How many replicas must acknowledge, and for how long to wait for them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl Wait {
    /// `None` when no replicas are asked for. `WAIT` gets half the response
    /// timeout, so that its own reply still comes within the whole of it.
    pub(crate) fn new(replicas: u32, response_timeout: Duration) -> Option<Wait> {
        (replicas > 0).then(|| Wait {
            replicas,
            timeout: (response_timeout / 2).max(Duration::from_millis(1)),
        })
    }
}

/// The shared connection with `WAIT` sent behind each command; it keeps
/// how many replicas acknowledged the last one.
pub(crate) struct Replicated {
    conn: Conn,
    wait: Wait,
    acked: Option<i64>,
}

impl Replicated {
    pub(crate) fn new(conn: Conn, wait: Wait) -> Replicated {
        Replicated {
            conn,
            wait,
            acked: None,
        }
    }

    /// `reply` if it changed nothing, or if enough replicas acknowledged
    /// it; otherwise an error saying how many did.
    pub(crate) fn confirm<T>(
        &self,
        reply: RedisResult<T>,
        changed: impl Fn(&T) -> bool,
    ) -> RedisResult<T> {
        let reply = reply?;
        let acked = self.acked.unwrap_or(0);
        if !changed(&reply) || acked >= i64::from(self.wait.replicas) {
            return Ok(reply);
        }
        Err(RedisError::from((
            ErrorKind::Io,
            "fewer replicas than min_replicas acknowledged the write",
            format!(
                "WAIT {} {}: {acked} acknowledged",
                self.wait.replicas,
                self.wait.timeout.as_millis()
            ),
        )))
    }
}

impl ConnectionLike for Replicated {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut pipe = Pipeline::new();
            pipe.add_command(cmd.clone())
                .cmd("WAIT")
                .arg(self.wait.replicas)
                .arg(self.wait.timeout.as_millis() as u64);
            let mut replies = self.conn.req_packed_commands(&pipe, 0, 2).await?;
            let acked = replies.pop();
            let reply = replies.pop().ok_or_else(|| {
                RedisError::from((ErrorKind::UnexpectedReturnType, "no reply to a lock script"))
            })?;
            self.acked = match acked {
                Some(Value::Int(n)) => Some(n),
                _ => None,
            };
            reply.extract_error()
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // The lock's scripts are single commands; a pipeline is passed on as is.
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}
