//! Uncontended acquire/release pairs per second through `Locker`: each task
//! takes and releases its own key in a loop. Run with `--release`, locally:
//!
//! ```text
//! cargo run --release -p lock-postgres --example pg_pairs -- <tasks> <seconds> [url]
//! ```
//!
//! The URL defaults to `LOCKKIT_POSTGRES_URL`. Compare with the same
//! statements through pgbench: `lock-postgres/examples/pairs.pgbench.sql`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_core::Locker;
use lock_postgres::PostgresBackend;
use tokio::time::Instant;

#[tokio::main]
async fn main() -> lock_core::Result<()> {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let url = args
        .next()
        .or_else(|| std::env::var("LOCKKIT_POSTGRES_URL").ok())
        .expect("give a URL or set LOCKKIT_POSTGRES_URL");
    let sep = if url.contains('?') { '&' } else { '?' };
    let backend = PostgresBackend::connect(&format!("{url}{sep}max_held_locks={tasks}")).await?;
    let locker = Locker::new(backend);
    let run = format!("bench-{:016x}", getrandom::u64().expect("random"));
    let pairs = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let (locker, pairs, key) = (locker.clone(), pairs.clone(), format!("{run}/{t}"));
            tokio::spawn(async move {
                while Instant::now() < end {
                    let lease = locker.try_acquire(&key, Duration::from_secs(30)).await?;
                    locker.release(lease).await?;
                    pairs.fetch_add(1, Ordering::Relaxed);
                }
                lock_core::Result::Ok(())
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker panicked")?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = pairs.load(Ordering::Relaxed);
    println!(
        "tasks={tasks} seconds={elapsed:.1} pairs={n} pairs_per_sec={:.0}",
        n as f64 / elapsed
    );
    Ok(())
}
