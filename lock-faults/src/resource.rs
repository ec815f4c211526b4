//! The protected resource, owned by the harness and served to the clients
//! over TCP loopback, one text line per request:
//!
//! | request | reply | meaning |
//! |---|---|---|
//! | `R` | `V <value>` | read the unfenced counter |
//! | `W <value>` | `OK` | overwrite the unfenced counter |
//! | `FR <client> <token>` | `V <value>` or `STALE <highest>` | an exclusive holder (or writer) reads the fenced store, and is inside |
//! | `FW <client> <token> <value>` | `OK` or `STALE <highest>` | it writes the fenced store, and leaves |
//! | `IN <client> <token> p` | `OK` | a permit holder enters (no fence: see below) |
//! | `IN <client> <token> r` | `V <value>` or `STALE <highest write>` | a reader enters and reads the fenced store |
//! | `OUT <client>` | `OK` | a permit holder or reader leaves |
//!
//! The fenced store admits a request only through [`lockkit::Fence`]: its
//! token must be at least the highest admitted so far (equal: the same
//! holder again). Reads are fenced too, so a read-modify-write by a stale
//! holder is refused at the read or at the write; with tokens that
//! increase per grant, its counter then loses no update. A reader is
//! refused only below the highest **writer** admitted (readers hold at once,
//! so a lower reader token is not stale), and raises the fence for writers:
//! a writer whose token is below a reader's was granted before that reader,
//! so it is stale. A permit holder is not fenced: of N current permits all
//! but the newest have lower tokens, so one highest token cannot tell a
//! stale permit from a current one.
//!
//! Apart from the fence, the resource counts who is inside at once (from
//! entering to leaving, whatever the lock says), with each one's hold: the
//! most at once, and entries that put a writer beside anyone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use lockkit::{Fence, FencingToken};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::workload::Hold;

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
    /// Entries into the resource (fenced reads admitted, `IN`s admitted).
    pub entries: u64,
    /// The most clients inside at once.
    pub most_inside: u64,
    /// Entries that put an exclusive holder (a writer) inside beside
    /// another client.
    pub writer_overlaps: u64,
}

#[derive(Debug, Default)]
struct Store {
    stats: Stats,
    fence: Fence,
    /// Writers' (exclusive holders') tokens only: readers are checked against it.
    writer_fence: Fence,
    /// Kept beside `fence` to check it.
    max_admitted: Option<u64>,
    /// Who is inside, and how each holds the key.
    inside: BTreeMap<u32, Hold>,
    /// The last client to enter, if it is still inside.
    last_in: Option<u32>,
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
                    let _ = self.writer_fence.admit(FencingToken::new(token));
                    self.enter(client as u32, Hold::Exclusive);
                    self.note_admitted(token);
                    format!("V {}", self.stats.fenced_counter)
                }
                Err(highest) => {
                    self.stats.stale_reads_rejected += 1;
                    format!("STALE {highest}")
                }
            },
            (Some("FW"), Some(client), Some(token), Some(value)) => {
                self.leave(client as u32);
                match self.admit(token) {
                    Ok(()) => {
                        let _ = self.writer_fence.admit(FencingToken::new(token));
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
            (Some("IN"), Some(client), Some(token), _) => {
                match words.get(3).and_then(|w| Hold::from_letter(w)) {
                    Some(Hold::Permit) => {
                        self.enter(client as u32, Hold::Permit);
                        "OK".into()
                    }
                    Some(Hold::Shared) => {
                        let highest_write = self.writer_fence.highest().get();
                        if token < highest_write {
                            self.stats.stale_reads_rejected += 1;
                            return format!("STALE {highest_write}");
                        }
                        // Raises the fence for writers; a lower reader is no news.
                        let _ = self.fence.admit(FencingToken::new(token));
                        self.note_admitted(token);
                        self.enter(client as u32, Hold::Shared);
                        format!("V {}", self.stats.fenced_counter)
                    }
                    _ => format!("ERR malformed request {line:?}"),
                }
            }
            (Some("OUT"), Some(client), _, _) => {
                self.leave(client as u32);
                "OK".into()
            }
            _ => format!("ERR malformed request {line:?}"),
        }
    }

    fn enter(&mut self, client: u32, hold: Hold) {
        self.inside.insert(client, hold);
        self.last_in = Some(client);
        self.stats.entries += 1;
        self.stats.most_inside = self.stats.most_inside.max(self.inside.len() as u64);
        if self.inside.len() > 1 && self.inside.values().any(|h| *h == Hold::Exclusive) {
            self.stats.writer_overlaps += 1;
        }
    }

    fn leave(&mut self, client: u32) {
        self.inside.remove(&client);
        if self.last_in == Some(client) {
            self.last_in = None;
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

    /// The last client to enter the resource, while it is inside (for an
    /// exclusive holder: between its fenced read and its write).
    pub fn client_inside(&self) -> Option<u32> {
        self.store.lock().unwrap_or_else(|p| p.into_inner()).last_in
    }

    /// A client inside the resource holding `hold`, if any.
    pub fn client_inside_as(&self, hold: Hold) -> Option<u32> {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        store
            .inside
            .iter()
            .find_map(|(c, h)| (*h == hold).then_some(*c))
    }

    /// How a client inside the resource holds the key.
    pub fn hold_of(&self, client: u32) -> Option<Hold> {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        store.inside.get(&client).copied()
    }

    /// Entries so far, and the last client to enter.
    pub fn entries(&self) -> (u64, Option<u32>) {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        (store.stats.entries, store.last_in)
    }

    /// A client the harness killed is inside no more.
    pub fn died(&self, client: u32) {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .leave(client);
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
        assert_eq!(s.stats.most_inside, 2); // 1 and 2 between their reads and writes
    }

    #[test]
    fn readers_share_but_a_reader_below_a_writer_and_a_writer_below_a_reader_are_stale() {
        let mut s = Store::default();
        assert_eq!(s.handle("IN 2 11 r"), "V 0");
        assert_eq!(s.handle("IN 3 10 r"), "V 0"); // readers hold at once
        assert_eq!(s.handle("FR 1 9"), "STALE 11"); // granted before the readers
        assert_eq!(s.handle("OUT 2"), "OK");
        assert_eq!(s.handle("OUT 3"), "OK");
        assert_eq!(s.handle("FR 1 12"), "V 0");
        assert_eq!(s.handle("FW 1 12 1"), "OK");
        assert_eq!(s.handle("IN 3 10 r"), "STALE 12"); // a reader from before the writer
        let st = &s.stats;
        assert_eq!((st.stale_reads_rejected, st.writer_overlaps), (2, 0));
        assert_eq!((st.most_inside, st.entries), (2, 3));
        assert!(s.handle("IN 3 13 q").starts_with("ERR"));
    }

    #[test]
    fn the_resource_counts_who_is_inside_whatever_the_lock_says() {
        let mut s = Store::default();
        for c in 1..=3 {
            assert_eq!(s.handle(&format!("IN {c} {c} p")), "OK");
        }
        assert_eq!(s.stats.most_inside, 3);
        assert_eq!(s.last_in, Some(3));
        s.handle("OUT 3");
        assert_eq!(s.last_in, None);
        s.handle("OUT 1");
        s.handle("OUT 2");
        assert_eq!(s.handle("IN 4 20 r"), "V 0");
        assert_eq!(s.handle("FR 5 21"), "V 0"); // a writer beside a reader
        assert_eq!(s.stats.writer_overlaps, 1);
    }
}
