//! A crowd on one key: W waiters spread over G groups, each group a client
//! of its own (its own connections, as a process of its own would have),
//! every waiter taking the lock, releasing it at once and queueing again.
//! Counts server commands per handoff (`INFO commandstats` deltas, summed
//! over the URL's nodes, commands inside scripts included), the handoff
//! latency (a release's start to the next grant) and the time the handoffs
//! took.
//!
//! ```text
//! cargo run --release -p lock-bench --example crowd -- redis://127.0.0.1:16379 1000 4 1000
//! ```
//! Arguments: URL (a Redis, Redis Cluster or Redlock URL whose nodes are
//! all listed), waiters, groups, handoffs to measure.

use lockkit::Wait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: crowd URL WAITERS GROUPS HANDOFFS")?;
    let number = |arg: Option<String>, default: u64| {
        arg.map_or(Ok(default), |a| {
            a.parse().map_err(|_| format!("not a number: {a}"))
        })
    };
    let waiters = number(args.next(), 1000)? as usize;
    let groups = number(args.next(), 4)?.max(1) as usize;
    let handoffs = number(args.next(), 1000)?;

    let mut lockers = Vec::new();
    for _ in 0..groups {
        lockers.push(lockkit::connect(&url).await.map_err(|e| e.to_string())?);
    }
    let nodes = nodes(&url).await?;
    let key = format!(
        "crowd/{:016x}",
        getrandom::u64().map_err(|e| e.to_string())?
    );
    let ttl = Duration::from_secs(10);

    // A holder keeps the key while the crowd gathers, so that every
    // waiter is in line when the count starts.
    let holder = lockers[0]
        .try_acquire(&key, ttl)
        .await
        .map_err(|e| e.to_string())?;
    let granted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let tasks: Vec<_> = (0..waiters)
        .map(|i| {
            let locker = lockers[i % groups].clone();
            let (key, granted, stop, released_at) = (
                key.clone(),
                granted.clone(),
                stop.clone(),
                released_at.clone(),
            );
            tokio::spawn(async move {
                let mut gaps = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let Ok(lease) = locker
                        .acquire(&key, ttl, Wait::at_most(Duration::from_secs(120)))
                        .await
                    else {
                        continue;
                    };
                    let now = Instant::now();
                    if granted.fetch_add(1, Ordering::Relaxed) + 1 >= handoffs {
                        stop.store(true, Ordering::Relaxed);
                    }
                    let mut last = released_at.lock().await;
                    if let Some(r) = last.take() {
                        gaps.push((now - r).as_secs_f64() * 1e3);
                    }
                    *last = Some(Instant::now());
                    drop(last);
                    let _ = locker.release(lease).await;
                }
                gaps
            })
        })
        .collect();
    // Gathering: every waiter has made its first attempts by then.
    tokio::time::sleep(Duration::from_millis(500 + waiters as u64 * 2)).await;
    let before = lock_bench::redis_command_calls(&nodes).await;
    let started = Instant::now();
    *released_at.lock().await = Some(Instant::now());
    if let Err(e) = lockers[0].release(holder).await {
        // A node set under load may answer the release too late for a
        // quorum; the operator's release then frees the key rather than
        // its TTL, which would stall the count.
        eprintln!("the holder's release: {e}; force-releasing");
        lockers[0]
            .force_release(&key)
            .await
            .map_err(|e| e.to_string())?;
    }
    while granted.load(Ordering::Relaxed) < handoffs {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = started.elapsed();
    let after = lock_bench::redis_command_calls(&nodes).await;
    let grants = granted.load(Ordering::Relaxed);
    let mut gaps = Vec::new();
    for task in tasks {
        gaps.extend(task.await.map_err(|e| e.to_string())?);
    }
    gaps.sort_by(f64::total_cmp);
    let pct = |p: f64| gaps[((gaps.len() as f64 * p) as usize).min(gaps.len() - 1)];
    let total: u64 = after
        .iter()
        .map(|(name, n)| n - before.get(name).copied().unwrap_or(0))
        .sum();
    println!(
        "url={} waiters={waiters} groups={groups} handoffs={grants} took_s={:.3} cmds_per_handoff={:.2} handoff_p50_ms={:.3} handoff_p99_ms={:.3}",
        url.split('?').next().unwrap_or_default(),
        took.as_secs_f64(),
        total as f64 / grants as f64,
        pct(0.5),
        pct(0.99),
    );
    let mut by_name: Vec<_> = after
        .iter()
        .map(|(name, n)| (n - before.get(name).copied().unwrap_or(0), name))
        .filter(|(n, _)| *n > 0)
        .collect();
    by_name.sort_by(|a, b| b.cmp(a));
    println!(
        "  per handoff: {}",
        by_name
            .iter()
            .take(8)
            .map(|(n, name)| format!("{name} {:.2}", *n as f64 / grants as f64))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// A connection to each node the URL lists.
async fn nodes(url: &str) -> Result<Vec<redis::aio::MultiplexedConnection>, String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hosts = rest.split(['/', '?']).next().unwrap_or_default();
    let mut out = Vec::new();
    for host in hosts.split(',').filter(|h| !h.is_empty()) {
        let client = redis::Client::open(format!("redis://{host}")).map_err(|e| e.to_string())?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("{host}: {e}"))?;
        out.push(conn);
    }
    Ok(out)
}
