//! The etcd cluster's own handoff floor: what passing a turn between W
//! waiters by watch costs with no lock library at all, measured the way the
//! contended scenario measures a backend (start of a release to the next
//! grant).
//!
//! W tasks form a ring, each owning one key and watching its predecessor's
//! key for deletions. The holder deletes its key (one Raft write): that
//! deletion's watch event is its successor's grant. The old holder then puts
//! its key back (one more write) so that its next turn can pass on, and waits
//! for its own turn. So each handoff costs the least any watch-based etcd
//! lock needs: a committed delete, a watch event, and a put to queue again;
//! no leases, no reads.
//!
//! The ring runs twice: with plain deletes and puts, and with the lock's
//! own requests in their place (a plain delete, as the backend releases
//! its own grants, and a put only if the key is new, with the reads of the
//! queue that come with it when the queue is not empty). etcd 3.4 applies
//! a transaction more slowly than a plain write (it copies its not yet
//! flushed writes for the transaction's read view), so on etcd 3.4 the
//! second ring is the floor for what the backend sends. Its keys
//! and transactions are built by the backend's own code
//! (`lockkit::etcd::transactions`), so the floor follows any change to them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, DeleteOptions, EventType, WatchFilterType, WatchOptions};
use lockkit::etcd::transactions;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::stats::{Latency, nanos};

/// What the ring's tasks write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Writes {
    /// A plain delete, and a plain put.
    Plain,
    /// The etcd backend's release and enqueue transactions.
    LockTransactions,
}

impl Writes {
    /// How the report names the ring.
    pub fn label(self) -> &'static str {
        match self {
            Writes::Plain => "watch ring, plain writes",
            Writes::LockTransactions => "watch ring, the lock's transactions",
        }
    }
}

/// How the floor is measured, for the report.
pub fn method() -> String {
    "W tasks in a ring over one etcd-client connection, each owning a key and watching its predecessor's for deletions (no leases): the holder deletes its key, whose watch event grants the next task, then puts it back; handoff = start of the delete to the event's arrival. Plain: Delete(key) and Put(key). With the lock's requests: Delete(key), and Txn(if create_revision(ring)=0 then Put(key) else (Txn(if create_revision(key)=0 then Put(key)), Get(ring, first created), Get(ring, keys only, 17 last created)))".into()
}

/// One ring of `waiters` tasks for `phase`: the handoff gaps, and handoffs per second.
pub async fn floor(
    client: &Client,
    prefix: &str,
    waiters: usize,
    phase: Duration,
    writes: Writes,
) -> Result<(Latency, Vec<f64>, f64), String> {
    let waiters = waiters.max(2);
    // The ring's keys are the entries of one lock's queue, laid out as the
    // etcd backend lays them out, a slot per task (no leases).
    let ring = format!("{prefix}/ring{waiters}-{writes:?}/");
    let lock = lockkit::raw::validate::key("ring", &lockkit::Limits::default())
        .map_err(|e| e.to_string())?;
    let key = |i: usize| transactions::entry(&ring, &lock, (i % waiters) as i64);
    let mut c = client.clone();
    // A key left by an earlier ring would not be created anew below.
    c.delete(ring.as_str(), Some(DeleteOptions::new().with_prefix()))
        .await
        .map_err(etcd)?;
    for i in 0..waiters {
        c.put(key(i), OWNER, None).await.map_err(etcd)?;
    }
    // Every watch is set up before the first turn passes, so none misses it.
    let mut watches = Vec::with_capacity(waiters);
    for i in 0..waiters {
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let predecessor = key(i + waiters - 1);
        watches.push(c.watch(predecessor, Some(options)).await.map_err(etcd)?);
    }
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = watches
        .into_iter()
        .enumerate()
        .map(|(i, (watcher, mut events))| {
            let (mut c, mine, ring, lock) = (client.clone(), key(i), ring.clone(), lock.clone());
            let named = String::from_utf8_lossy(&mine).into_owned();
            let (released_at, stop) = (released_at.clone(), stop.clone());
            tokio::spawn(async move {
                let _watcher = watcher;
                let mut gaps = Vec::new();
                // Task 0 holds first; every other task waits for its turn.
                let mut holding = i == 0;
                loop {
                    if !holding {
                        let turn = events
                            .message()
                            .await
                            .map_err(etcd)?
                            .ok_or("etcd: the watch ended")?;
                        if !turn
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                        {
                            continue;
                        }
                        let granted = Instant::now();
                        if let Some(r) = released_at.lock().await.take() {
                            gaps.push(nanos(granted - r));
                        }
                    }
                    holding = false;
                    // Pass the turn on even when stopping, so every task wakes and ends.
                    *released_at.lock().await = Some(Instant::now());
                    match writes {
                        Writes::Plain => drop(c.delete(mine.clone(), None).await.map_err(etcd)?),
                        // The backend releases its own grants with a plain
                        // delete too (see `transactions::release`).
                        Writes::LockTransactions => {
                            let done = c.delete(mine.clone(), None).await.map_err(etcd)?;
                            // Not deleted: the successor would never wake.
                            if done.deleted() == 0 {
                                return Err(format!("{named}: the release deleted nothing"));
                            }
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        return Ok(gaps);
                    }
                    match writes {
                        Writes::Plain => {
                            drop(c.put(mine.clone(), OWNER, None).await.map_err(etcd)?)
                        }
                        Writes::LockTransactions => {
                            let enqueue = transactions::enqueue(&ring, &lock, &mine, 0, OWNER);
                            let done = c.txn(enqueue).await.map_err(etcd)?;
                            if !transactions::created(&done) {
                                return Err(format!("{named}: the enqueue's compare failed"));
                            }
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    let mut handles = handles;
    let ended = async {
        let mut gaps = Vec::new();
        for h in &mut handles {
            let task = tokio::time::timeout(Duration::from_secs(10), h)
                .await
                .map_err(|_| "a ring task did not end".to_string())?;
            gaps.extend(task.map_err(|e| e.to_string())??);
        }
        Ok::<_, String>(gaps)
    };
    let ended = ended.await;
    // After a failure, the tasks still waiting for a turn that will not
    // come (each holding a watch) end here.
    for h in &handles {
        h.abort();
    }
    let gaps = ended?;
    let seconds = started.elapsed().as_secs_f64();
    let per_s = gaps.len() as f64 / seconds;
    let (latency, curve) = Latency::of(&gaps);
    Ok((latency, curve, per_s))
}

/// The value every ring key holds: an owner token's length.
const OWNER: &str = "0123456789abcdef0123456789abcdef";

fn etcd(e: etcd_client::Error) -> String {
    format!("etcd: {e}")
}
