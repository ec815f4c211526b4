//! Uncontended acquire+release pairs per second over any backend: each task
//! locks and releases its own key in a loop, over one shared `Locker`. The
//! peer's side is `lock-bench`'s `rslock_pairs` example, given the same
//! Redis nodes.
//!
//! ```text
//! cargo run --release --features redis --example pairs -- redis://127.0.0.1:6379 64 5
//! cargo run --release --features redis --example pairs -- redis://127.0.0.1:6379 64 5 shared
//! cargo run --release --features redlock --example pairs -- \
//!     redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005 64 5
//! ```
//! Arguments: URL (any scheme this build has the feature of; `memory://`
//! always), tasks (default 1), seconds (default 5), and the mode: `exclusive`
//! (the default), `shared` (a read hold) or `permits=N` (one of N permits,
//! at most 10,000). The Tokio runtime has
//! one worker thread per CPU unless `TOKIO_WORKER_THREADS` says otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://".to_owned());
    let number = |arg: Option<String>, default, what: &str| match arg {
        None => Ok(default),
        Some(a) => a.parse().map_err(|_| format!("{what}: a number, not {a}")),
    };
    let tasks: u64 = number(args.next(), 1, "tasks")?;
    let seconds: u64 = number(args.next(), 5, "seconds")?;
    let mode = match args.next().as_deref() {
        None | Some("exclusive") => lockkit::Mode::Exclusive,
        Some("shared") => lockkit::Mode::Shared,
        Some(other) => match other.strip_prefix("permits=") {
            Some(n) => lockkit::Mode::semaphore(
                n.parse()
                    .map_err(|_| format!("permits: a number, not {n}"))?,
            ),
            None => return Err(format!("mode: exclusive, shared or permits=N, not {other}")),
        },
    };

    let locker = lockkit::connect(&url).await.map_err(|e| e.to_string())?;
    let pairs = Arc::new(AtomicU64::new(0));
    let run = |until: Instant, count: bool| {
        (0..tasks)
            .map(|task| {
                let (locker, pairs) = (locker.clone(), pairs.clone());
                tokio::spawn(async move {
                    let key = format!("pairs/{task}");
                    while Instant::now() < until {
                        let lease = locker
                            .acquire_in(&key, mode, Duration::from_secs(10), lockkit::Wait::NONE)
                            .await?;
                        locker.release(lease).await?;
                        if count {
                            pairs.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok::<_, lockkit::Error>(())
                })
            })
            .collect::<Vec<_>>()
    };
    // Warm up: connections, script caches.
    for t in run(Instant::now() + Duration::from_millis(500), false) {
        t.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let started = Instant::now();
    for t in run(started + Duration::from_secs(seconds), true) {
        t.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let rate = pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    // Redacted: a URL may carry a password.
    let url = lockkit::url::redact(&url);
    println!("lockkit {url} tasks={tasks} mode={mode} pairs/s={rate:.0}");
    Ok(())
}
