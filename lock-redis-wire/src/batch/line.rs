//! The batcher's own connection, open or not, and when to dial again.
//!
//! A server that is down (a Redlock node, say, while the others lock on)
//! refuses a connection at once, or lets a dial hang until the connect
//! timeout. Dialled for every call, it would cost each call that time and
//! the server a stream of connection attempts. So after a failed dial, the
//! calls asked during a pause fail at once with that dial's error, and the
//! pause grows with each failure ([`REDIAL`]: lock-core's backoff, with its
//! jitter, so that the clients of a server back up do not all dial at once).

use std::time::Duration;

use lock_core::Backoff;
use redis::{RedisError, RedisResult};
use tokio::time::Instant;

use crate::socket::{Dial, Socket};

/// The pause after a failed dial: 25 to 50 ms after the first, doubling
/// with each failure up to 0.5 to 1 s, so a server back up is used within
/// a second.
const REDIAL: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(1),
};

/// The connection: open, or closed since it broke or could not be opened.
pub(super) struct Line {
    dial: Dial,
    socket: Option<Socket>,
    /// Set after a failed dial, cleared by a successful one.
    down: Option<Down>,
}

/// The last failed dial.
struct Down {
    error: RedisError,
    /// No dial before this.
    retry_at: Instant,
    /// Dials failed in a row, before this one.
    failed_before: u32,
}

impl Line {
    /// Not open yet: the first call dials.
    pub(super) fn closed(dial: Dial) -> Line {
        Line {
            dial,
            socket: None,
            down: None,
        }
    }

    /// Open with `socket`, opened by `dial`.
    pub(super) fn open(dial: Dial, socket: Socket) -> Line {
        Line {
            dial,
            socket: Some(socket),
            down: None,
        }
    }

    /// The open socket, if any.
    pub(super) fn socket(&mut self) -> Option<&mut Socket> {
        self.socket.as_mut()
    }

    /// The open socket, dialling first if it is closed and no pause is
    /// running; during a pause, the error of the dial that failed.
    pub(super) async fn connected(&mut self) -> RedisResult<&mut Socket> {
        if self.socket.is_none() {
            if let Some(down) = &self.down
                && Instant::now() < down.retry_at
            {
                return Err(down.error.clone());
            }
            match self.dial.open().await {
                Ok(socket) => {
                    self.down = None;
                    self.socket = Some(socket);
                }
                Err(error) => {
                    let failed_before = self.down.as_ref().map_or(0, |d| d.failed_before + 1);
                    let pause = REDIAL.delay(failed_before);
                    tracing::debug!(
                        error = %crate::errors::describe(&error),
                        ?pause,
                        "the batcher's connection could not be opened"
                    );
                    self.down = Some(Down {
                        error: error.clone(),
                        retry_at: Instant::now() + pause,
                        failed_before,
                    });
                    return Err(error);
                }
            }
        }
        self.socket
            .as_mut()
            .ok_or_else(|| RedisError::from((redis::ErrorKind::Io, "no connection")))
    }

    /// The connection broke: closed, to be dialled again by the next call.
    pub(super) fn close(&mut self) {
        self.socket = None;
    }

    /// How long a caller waits for an answer on this connection.
    pub(super) fn response_timeout(&self) -> Duration {
        self.dial.response_timeout()
    }
}
