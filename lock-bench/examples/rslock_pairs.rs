//! rslock's uncontended acquire+release pairs per second, the peer's side of
//! lockkit's `pairs` example: each task locks and releases its own key in
//! a loop, over one shared `LockManager` on the nodes given.
//!
//! ```text
//! cargo run --release -p lock-bench --example rslock_pairs -- redis://127.0.0.1:6379 64 5
//! cargo run --release -p lock-bench --example rslock_pairs -- \
//!     redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 64 5
//! ```
//! Arguments: URL (several, comma-separated, for as many nodes), tasks (default 1), seconds (default 5). The Tokio runtime
//! has one worker thread per CPU unless `TOKIO_WORKER_THREADS` says otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let number = |arg: Option<String>, default, what: &str| match arg {
        None => Ok(default),
        Some(a) => a.parse().map_err(|_| format!("{what}: a number, not {a}")),
    };
    let tasks: u64 = number(args.next(), 1, "tasks")?;
    let seconds: u64 = number(args.next(), 5, "seconds")?;

    let manager = Arc::new(rslock::LockManager::new(
        url.split(',').map(str::to_owned).collect::<Vec<_>>(),
    ));
    let pairs = Arc::new(AtomicU64::new(0));
    let run = |until: Instant, count: bool| {
        (0..tasks)
            .map(|task| {
                let (manager, pairs) = (manager.clone(), pairs.clone());
                tokio::spawn(async move {
                    let key = format!("rslock-pairs/{task}");
                    while Instant::now() < until {
                        let lock = manager
                            .lock(key.as_bytes(), Duration::from_secs(10))
                            .await
                            .map_err(|e| format!("lock {key}: {e}"))?;
                        manager.unlock(&lock).await;
                        if count {
                            pairs.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok::<_, String>(())
                })
            })
            .collect::<Vec<_>>()
    };
    // Warm up: connections, script cache.
    for t in run(Instant::now() + Duration::from_millis(500), false) {
        t.await.map_err(|e| e.to_string())??;
    }
    let started = Instant::now();
    for t in run(started + Duration::from_secs(seconds), true) {
        t.await.map_err(|e| e.to_string())??;
    }
    let rate = pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    println!("rslock tasks={tasks} pairs/s={rate:.0}");
    Ok(())
}
