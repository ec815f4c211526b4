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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions};
use tokio::sync::Mutex;

use crate::stats::{Latency, nanos};

/// How the floor is measured, for the report.
pub fn method() -> String {
    "W tasks in a ring over one etcd-client connection, each owning a key and watching its predecessor's for deletions (no leases, no reads): the holder deletes its key, whose watch event grants the next task, then puts it back; handoff = start of the delete to the event's arrival".into()
}

/// One ring of `waiters` tasks for `phase`: the handoff gaps, and handoffs per second.
pub async fn floor(
    client: &Client,
    prefix: &str,
    waiters: usize,
    phase: Duration,
) -> Result<(Latency, Vec<f64>, f64), String> {
    let waiters = waiters.max(2);
    let key = |i: usize| format!("{prefix}/ring{waiters}-{}", i % waiters);
    let mut c = client.clone();
    for i in 0..waiters {
        c.put(key(i), "", None).await.map_err(|e| e.to_string())?;
    }
    // Every watch is set up before the first turn passes, so none misses it.
    let mut watches = Vec::with_capacity(waiters);
    for i in 0..waiters {
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let predecessor = key(i + waiters - 1);
        watches.push(
            c.watch(predecessor, Some(options))
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = watches
        .into_iter()
        .enumerate()
        .map(|(i, (watcher, mut events))| {
            let (mut c, mine) = (client.clone(), key(i));
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
                            .await?
                            .ok_or_else(|| etcd_client::Error::WatchError("watch ended".into()))?;
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
                    c.delete(mine.as_str(), None).await?;
                    if stop.load(Ordering::Relaxed) {
                        return Ok::<_, etcd_client::Error>(gaps);
                    }
                    c.put(mine.as_str(), "", None).await?;
                }
            })
        })
        .collect();
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    let mut gaps = Vec::new();
    for h in handles {
        let task = tokio::time::timeout(Duration::from_secs(10), h)
            .await
            .map_err(|_| "a ring task did not end".to_string())?;
        gaps.extend(
            task.map_err(|e| e.to_string())?
                .map_err(|e| format!("etcd: {e}"))?,
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    let per_s = gaps.len() as f64 / seconds;
    let (latency, curve) = Latency::of(&mut gaps);
    Ok((latency, curve, per_s))
}
