//! Uncontended acquire+release pairs per second over Redlock: each task
//! locks and releases its own key in a loop, over one shared backend (the
//! peer's side is `lock-bench`'s `rslock_pairs` example, given the same nodes).
//!
//! ```text
//! cargo run --release -p lock-redlock --example redlock_pairs -- \
//!     redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005 64 5
//! ```
//! Arguments: URL, tasks (default 1), seconds (default 5).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_core::Locker;
use lock_redlock::RedlockBackend;
use tokio::time::Instant;

#[tokio::main]
async fn main() -> lock_core::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003".to_owned());
    let tasks: usize = args
        .next()
        .map_or(1, |a| a.parse().expect("tasks: a number"));
    let seconds: u64 = args
        .next()
        .map_or(5, |a| a.parse().expect("seconds: a number"));

    let locker = Locker::new(RedlockBackend::connect(&url).await?);
    let pairs = Arc::new(AtomicU64::new(0));
    let run = |until: Instant, count: bool| {
        (0..tasks)
            .map(|task| {
                let (locker, pairs) = (locker.clone(), pairs.clone());
                tokio::spawn(async move {
                    let key = format!("pairs/{task}");
                    while Instant::now() < until {
                        let lease = locker.try_acquire(&key, Duration::from_secs(10)).await?;
                        locker.release(lease).await?;
                        if count {
                            pairs.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok::<_, lock_core::Error>(())
                })
            })
            .collect::<Vec<_>>()
    };
    // Warm up: connections, script cache.
    for t in run(Instant::now() + Duration::from_millis(500), false) {
        t.await.expect("task panicked")?;
    }
    let started = Instant::now();
    for t in run(started + Duration::from_secs(seconds), true) {
        t.await.expect("task panicked")?;
    }
    let rate = pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    println!("lock-redlock tasks={tasks} pairs/s={rate:.0}");
    Ok(())
}
