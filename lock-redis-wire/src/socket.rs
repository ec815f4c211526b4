//! A batcher's own connection to one server: a plain TCP socket that the
//! batching task writes its calls to and reads their replies from itself
//! (see [`crate::batch`]).
//!
//! Why not the redis crate's multiplexed connection: that one runs a task
//! of its own between the batcher and the socket, so every call and every
//! reply passes one more task, and on a runtime of several worker threads
//! that hand-off often wakes a parked thread. With many calls on the wire,
//! the server then waited for the client; with the batching task on the
//! socket itself it did not (the lab's paired rounds against rslock, on two
//! worker threads, measure it).
//!
//! TLS and Unix sockets are not spoken here: their batchers keep the redis
//! crate's connection ([`Dial::plain_tcp`] says which).

use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::Timeouts;
use crate::reply::{self, Reply};

/// The name the connection gives itself (`CLIENT SETNAME`).
pub const CONNECTION_NAME: &str = "lockkit-batcher";

/// How to open the connection: address, credentials, database.
#[derive(Clone)]
pub struct Dial {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    timeouts: Timeouts,
}

/// Without the password.
impl std::fmt::Debug for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dial")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

impl Dial {
    /// For a server reached over plain TCP; `None` for TLS and Unix
    /// sockets, which keep the redis crate's connection.
    pub fn plain_tcp(server: &ConnectionInfo, timeouts: Timeouts) -> Option<Dial> {
        let ConnectionAddr::Tcp(host, port) = server.addr() else {
            return None;
        };
        let settings = server.redis_settings();
        Some(Dial {
            host: host.clone(),
            port: *port,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
            timeouts,
        })
    }

    /// How long a caller waits for each answer on this connection.
    pub fn response_timeout(&self) -> Duration {
        self.timeouts.response
    }

    /// Connects and logs in (`AUTH`, `SELECT`, `CLIENT SETNAME`), within the
    /// connect timeout.
    pub(crate) async fn open(&self) -> RedisResult<Socket> {
        let limit = self.timeouts.connect;
        tokio::time::timeout(limit, self.open_untimed())
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {limit:?}"),
                )))
            })
    }

    async fn open_untimed(&self) -> RedisResult<Socket> {
        let stream = TcpStream::connect((self.host.as_str(), self.port)).await?;
        // Calls are written whole; waiting to fill a segment only delays them.
        stream.set_nodelay(true)?;
        let mut socket = Socket::new(stream, self.timeouts.response);
        let mut handshake = 0;
        if let Some(password) = &self.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.username {
                auth.arg(user);
            }
            auth.arg(password).write_packed_command(&mut socket.out);
            handshake += 1;
        }
        if self.db != 0 {
            redis::cmd("SELECT")
                .arg(self.db)
                .write_packed_command(&mut socket.out);
            handshake += 1;
        }
        // Named, so that an operator finds it in `CLIENT LIST`; and a server
        // that refuses the connection (`maxclients`) is told apart here.
        redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(CONNECTION_NAME)
            .write_packed_command(&mut socket.out);
        socket.flush().await?;
        for _ in 0..handshake {
            match socket.next_reply().await? {
                Reply::Status => {}
                reply => return Err(refused(reply)),
            }
        }
        match socket.next_reply().await? {
            Reply::Status => {}
            // The name is a convenience: a user whose ACL leaves out
            // `CLIENT SETNAME`, or a server without it, may still lock.
            Reply::Error(e) if is_not_allowed(&e) => {
                tracing::debug!(error = %e, "the batcher's connection keeps no name");
            }
            reply => return Err(refused(reply)),
        }
        Ok(socket)
    }
}

/// Whether a command was refused for want of a permission or of the
/// command itself, rather than for the connection's sake.
fn is_not_allowed(e: &RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().to_ascii_lowercase().contains("unknown")
}

/// A handshake reply other than `+OK`, as an error.
fn refused(reply: Reply) -> RedisError {
    match reply {
        Reply::Error(e) => e,
        _ => RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "unexpected reply to the connection's AUTH, SELECT or CLIENT SETNAME",
        )),
    }
}

/// An open connection: calls queue in a buffer and leave on
/// [`flush`](Socket::flush); replies are read as they come.
pub(crate) struct Socket {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    /// Calls not written yet.
    pub(crate) out: Vec<u8>,
    /// Bytes read and not yet taken as replies.
    read: Vec<u8>,
    /// How long a write may wait for the server to take its bytes.
    write_timeout: Duration,
}

impl Socket {
    fn new(stream: TcpStream, write_timeout: Duration) -> Socket {
        let (reader, writer) = stream.into_split();
        Socket {
            reader,
            writer,
            out: Vec::with_capacity(16 * 1024),
            read: Vec::with_capacity(16 * 1024),
            write_timeout,
        }
    }

    /// Writes the queued calls. A server that takes none of them for the
    /// response timeout (its buffers full, the network gone) is an error,
    /// after which the connection is no good: part of a call may be written.
    pub(crate) async fn flush(&mut self) -> RedisResult<()> {
        match tokio::time::timeout(self.write_timeout, self.writer.write_all(&self.out)).await {
            Ok(written) => written?,
            Err(_) => {
                return Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the server took no calls within {:?}", self.write_timeout),
                )));
            }
        }
        self.out.clear();
        Ok(())
    }

    /// Waits for more bytes from the server. Cancel-safe: cancelled, it
    /// has read nothing. A closed connection is an error.
    pub(crate) async fn read_more(&mut self) -> RedisResult<()> {
        if self.reader.read_buf(&mut self.read).await? == 0 {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )));
        }
        Ok(())
    }

    /// The next complete reply among the bytes read so far, if there is one.
    pub(crate) fn take_reply(&mut self) -> RedisResult<Option<Reply>> {
        let Some((reply, used)) = reply::parse(&self.read)? else {
            return Ok(None);
        };
        self.read.drain(..used);
        Ok(Some(reply))
    }

    /// The next reply, reading until it is complete.
    async fn next_reply(&mut self) -> RedisResult<Reply> {
        loop {
            if let Some(reply) = self.take_reply()? {
                return Ok(reply);
            }
            self.read_more().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;

    const TIMEOUTS: Timeouts = Timeouts {
        connect: Duration::from_secs(1),
        response: Duration::from_secs(1),
    };

    #[test]
    fn a_dials_debug_output_hides_the_password() {
        let info = "redis://locker:pw-9e1b@127.0.0.1:6379/2"
            .into_connection_info()
            .unwrap();
        let dial = Dial::plain_tcp(&info, TIMEOUTS).expect("plain TCP");
        let shown = format!("{dial:?}");
        assert!(
            shown.contains("127.0.0.1") && shown.contains("locker"),
            "{shown}"
        );
        assert!(!shown.contains("pw-9e1b"), "password printed: {shown}");
    }

    #[test]
    fn only_plain_tcp_gets_a_connection_of_its_own() {
        let unix = "redis+unix:///tmp/redis.sock"
            .into_connection_info()
            .unwrap();
        assert!(Dial::plain_tcp(&unix, TIMEOUTS).is_none());
    }
}
