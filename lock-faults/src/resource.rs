//! The protected resource, owned by the harness and served to the clients
//! over TCP loopback, one text line per request:
//!
//! | request | reply | meaning |
//! |---|---|---|
//! | `R` | `V <value>` | read the unfenced counter |
//! | `W <value>` | `OK` | overwrite the unfenced counter |
//! | `FR <client> <token>` | `V <value>` or `STALE <highest>` | read the fenced store |
//! | `FW <client> <token> <value>` | `OK` or `STALE <highest>` | write the fenced store |
//!
//! The fenced store admits a request only through [`lockkit::Fence`]: its
//! token must be at least the highest admitted so far (equal: the same
//! holder again). Reads are fenced too, so a read-modify-write by a stale
//! holder is refused at the read or at the write; with tokens that
//! increase per grant, its counter then loses no update.

use std::sync::{Arc, Mutex};

use lockkit::{Fence, FencingToken};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the resource saw. The counts are kept by the resource itself, not
/// by the clients, so they hold whatever the clients recorded.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Stats {
    /// The unfenced counter's final value.
    pub counter: u64,
    /// Writes applied to it.
    pub writes: u64,
    /// The fenced counter's final value.
    pub fenced_counter: u64,
    /// Fenced writes applied.
    pub fenced_writes: u64,
    /// Fenced reads refused: the token was below one already admitted.
    pub stale_reads_rejected: u64,
    /// Fenced writes refused: the token was below one already admitted.
    pub stale_writes_rejected: u64,
    /// Fenced writes applied although their token was below one already
    /// admitted: checked independently of `Fence` (a separate maximum of
    /// admitted tokens), so it stays zero only if the fence does its job.
    pub stale_writes_accepted: u64,
    /// The highest admitted token.
    pub highest_token: u64,
}

#[derive(Debug, Default)]
struct Store {
    stats: Stats,
    fence: Fence,
    /// Kept beside `fence` to check it.
    max_admitted: Option<u64>,
    /// The client between its fenced read and its fenced write.
    in_rmw: Option<u32>,
}

impl Store {
    fn admit(&mut self, token: u64) -> Result<(), u64> {
        self.fence
            .admit(FencingToken::new(token))
            .map_err(|stale| stale.highest.get())
    }

    fn handle(&mut self, line: &str) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
        match (words.first().copied(), num(1), num(2), num(3)) {
            (Some("R"), _, _, _) => format!("V {}", self.stats.counter),
            (Some("W"), Some(value), _, _) => {
                self.stats.counter = value;
                self.stats.writes += 1;
                "OK".into()
            }
            (Some("FR"), Some(client), Some(token), _) => match self.admit(token) {
                Ok(()) => {
                    self.in_rmw = Some(client as u32);
                    self.note_admitted(token);
                    format!("V {}", self.stats.fenced_counter)
                }
                Err(highest) => {
                    self.stats.stale_reads_rejected += 1;
                    format!("STALE {highest}")
                }
            },
            (Some("FW"), Some(client), Some(token), Some(value)) => {
                if self.in_rmw == Some(client as u32) {
                    self.in_rmw = None;
                }
                match self.admit(token) {
                    Ok(()) => {
                        if self.max_admitted.is_some_and(|max| token < max) {
                            self.stats.stale_writes_accepted += 1;
                        }
                        self.note_admitted(token);
                        self.stats.fenced_counter = value;
                        self.stats.fenced_writes += 1;
                        "OK".into()
                    }
                    Err(highest) => {
                        self.stats.stale_writes_rejected += 1;
                        format!("STALE {highest}")
                    }
                }
            }
            _ => format!("ERR malformed request {line:?}"),
        }
    }

    fn note_admitted(&mut self, token: u64) {
        self.max_admitted = Some(self.max_admitted.map_or(token, |m| m.max(token)));
        self.stats.highest_token = self.stats.highest_token.max(token);
    }
}

/// The resource server of one run.
#[derive(Debug)]
pub struct Resource {
    store: Arc<Mutex<Store>>,
    port: u16,
    task: JoinHandle<()>,
}

impl Resource {
    /// Listens on a free loopback port.
    pub async fn start() -> std::io::Result<Resource> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let store = Arc::new(Mutex::new(Store::default()));
        let shared = store.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Ok(Resource { store, port, task })
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The client in the middle of a fenced read-modify-write, if any.
    pub fn client_in_rmw(&self) -> Option<u32> {
        self.store.lock().unwrap_or_else(|p| p.into_inner()).in_rmw
    }

    /// The counts so far.
    pub fn stats(&self) -> Stats {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stats
            .clone()
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(stream: TcpStream, store: Arc<Mutex<Store>>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut reply = store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .handle(&line);
        reply.push('\n');
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Store;

    #[test]
    fn the_fenced_store_refuses_older_tokens_and_admits_equal_ones() {
        let mut s = Store::default();
        assert_eq!(s.handle("FR 1 10"), "V 0");
        assert_eq!(s.handle("FR 2 12"), "V 0");
        assert_eq!(s.handle("FW 1 10 1"), "STALE 12");
        assert_eq!(s.handle("FW 2 12 1"), "OK");
        assert_eq!(s.handle("FW 2 12 2"), "OK");
        assert_eq!(s.handle("FR 1 11"), "STALE 12");
        let st = &s.stats;
        assert_eq!((st.stale_writes_rejected, st.stale_reads_rejected), (1, 1));
        assert_eq!((st.fenced_writes, st.fenced_counter), (2, 2));
        assert_eq!(st.stale_writes_accepted, 0);
        assert_eq!(s.handle("W 5"), "OK");
        assert_eq!(s.handle("R"), "V 5");
        assert!(s.handle("FW x").starts_with("ERR"));
    }
}
