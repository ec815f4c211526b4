//! Uncontended acquire+release pairs per second of each lock mode on one
//! Redis backend, measured side by side: each round runs, in turn, the
//! exclusive lock, one of 4 permits of a semaphore, and a read hold, each
//! task on a key of its own, and the answer is each mode's median over the
//! rounds and its ratio to the exclusive lock's.
//!
//! ```text
//! cargo run --release -p lock-redis --example mode_pairs -- redis://127.0.0.1:6379 64 2 5
//! ```
//! Arguments: URL (`redis://`, `redis+cluster://`, `redis+sentinel://`),
//! tasks (default 64), seconds per mode and round (default 2), rounds
//! (default 5), and the modes (default `mutex,permit,read`; the ratio is
//! to the first).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_core::{Locker, Mode, Wait};
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("a redis:// URL")?;
    let number = |arg: Option<String>, default: u64, what: &str| match arg {
        None => Ok(default),
        Some(a) => a.parse().map_err(|_| format!("{what}: a number, not {a}")),
    };
    let tasks = number(args.next(), 64, "tasks")?;
    let seconds = number(args.next(), 2, "seconds")?;
    let rounds = number(args.next(), 5, "rounds")?;
    let locker = if url.contains("+sentinel") {
        Locker::new(
            lock_redis::SentinelBackend::connect(&url)
                .await
                .map_err(|e| e.to_string())?,
        )
    } else {
        Locker::new(
            lock_redis::RedisBackend::connect(&url)
                .await
                .map_err(|e| e.to_string())?,
        )
    };
    // A prefix of this run's own, so that runs side by side never share a key.
    let run_id = std::process::id();
    let modes = args
        .next()
        .unwrap_or_else(|| "mutex,permit,read".to_owned())
        .split(',')
        .map(|name| match name {
            "mutex" => Ok(("mutex", Mode::Exclusive)),
            "permit" => Ok(("permit", Mode::semaphore(4))),
            "read" => Ok(("read", Mode::Shared)),
            other => Err(format!("mode: mutex, permit or read, not {other}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    // The first round warms up connections and script caches, uncounted.
    for round in 0..=rounds {
        for (m, (name, mode)) in modes.iter().enumerate() {
            let length = match round {
                0 => Duration::from_millis(300),
                _ => Duration::from_secs(seconds),
            };
            let rate = pairs(
                &locker,
                *mode,
                &format!("pairs{run_id}/{name}"),
                tasks,
                length,
            )
            .await?;
            if round > 0 {
                rates[m].push(rate);
            }
        }
    }
    let median = |r: &mut Vec<f64>| {
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    let mutex = median(&mut rates[0].clone());
    for (m, (name, _)) in modes.iter().enumerate() {
        let all: Vec<String> = rates[m].iter().map(|r| format!("{r:.0}")).collect();
        let med = median(&mut rates[m]);
        println!(
            "{name:<7} tasks={tasks} median pairs/s={med:.0} ratio={:.2} rounds=[{}]",
            med / mutex,
            all.join(" ")
        );
    }
    Ok(())
}

/// Pairs per second of `tasks` tasks, each acquiring and releasing a key of
/// its own in `mode` for `length`.
async fn pairs(
    locker: &Locker,
    mode: Mode,
    prefix: &str,
    tasks: u64,
    length: Duration,
) -> Result<f64, String> {
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + length;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (locker, count, key) = (locker.clone(), count.clone(), format!("{prefix}/{task}"));
            tokio::spawn(async move {
                while Instant::now() < until {
                    let lease = locker
                        .acquire_in(&key, mode, Duration::from_secs(10), Wait::NONE)
                        .await?;
                    locker.release(lease).await?;
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, lock_core::Error>(())
            })
        })
        .collect();
    for handle in handles {
        handle
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}
