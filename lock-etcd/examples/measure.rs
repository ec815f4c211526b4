//! Measures the etcd backend on a real cluster: uncontended acquire+release
//! pairs per second at 1 and 64 tasks, and handoff latency (release to the
//! next waiter's grant) with 10 waiters on one key.
//!
//! ```text
//! scripts/servers.sh up
//! set -a; . target/lockkit-servers/urls.env; set +a
//! cargo run --release -p lock-etcd --example measure [-- SECONDS]
//! ```
//!
//! Local measurements only: never run in CI.

use lock_core::Wait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lock_core::Locker;
use lock_etcd::EtcdBackend;
use tokio::sync::Mutex;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> lock_core::Result<()> {
    let url =
        std::env::var("LOCKKIT_ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:2379".to_owned());
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let run = Duration::from_secs(seconds);
    let locker = Locker::new(EtcdBackend::connect(&url).await?);
    let prefix = format!(
        "measure-{}/",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    );
    println!(
        "etcd at {} (run {run:?} per figure)",
        lock_core::url::redact(&url)
    );

    for tasks in [1, 64] {
        let pairs = uncontended(&locker, &prefix, tasks, run).await?;
        println!(
            "uncontended, {tasks:>2} tasks: {:>8.0} acquire+release pairs/s",
            pairs as f64 / run.as_secs_f64()
        );
    }

    let mut handoffs = handoff(&locker, &format!("{prefix}handoff"), 10, run).await?;
    handoffs.sort();
    let pct = |p: f64| handoffs[((handoffs.len() as f64 * p) as usize).min(handoffs.len() - 1)];
    println!(
        "handoff, 10 waiters: p50 {:?}, p99 {:?} ({} handoffs)",
        pct(0.50),
        pct(0.99),
        handoffs.len()
    );
    Ok(())
}

/// Each task takes and releases its own key in a loop.
async fn uncontended(
    locker: &Locker,
    prefix: &str,
    tasks: usize,
    run: Duration,
) -> lock_core::Result<u64> {
    let pairs = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + run;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (locker, pairs, key) = (
            locker.clone(),
            pairs.clone(),
            format!("{prefix}uncontended-{tasks}-{t}"),
        );
        handles.push(tokio::spawn(async move {
            while Instant::now() < until {
                let lease = locker.try_acquire(&key, TTL).await?;
                locker.release(lease).await?;
                pairs.fetch_add(1, Ordering::Relaxed);
            }
            lock_core::Result::Ok(())
        }));
    }
    for h in handles {
        h.await.expect("task panicked")?;
    }
    Ok(pairs.load(Ordering::Relaxed))
}

/// `waiters` tasks contend for one key; each holder releases at once and
/// queues again. Returns, per handoff, the time from the start of a release
/// to the next holder's grant.
async fn handoff(
    locker: &Locker,
    key: &str,
    waiters: usize,
    run: Duration,
) -> lock_core::Result<Vec<Duration>> {
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..waiters {
        let (locker, key) = (locker.clone(), key.to_owned());
        let (released_at, samples, stop) = (released_at.clone(), samples.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let lease = locker
                    .acquire(&key, TTL, Wait::at_most(Duration::from_secs(60)))
                    .await?;
                let granted = Instant::now();
                if let Some(released) = released_at.lock().await.take() {
                    samples.lock().await.push(granted - released);
                }
                *released_at.lock().await = Some(Instant::now());
                locker.release(lease).await?;
            }
            lock_core::Result::Ok(())
        }));
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("task panicked")?;
    }
    let samples = samples.lock().await.clone();
    Ok(samples)
}
