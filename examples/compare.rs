//! Compares the backends side by side on this machine: uncontended
//! throughput and acquire latency at several concurrencies, and handoff
//! latency under contention. `scripts/lab.sh` starts the servers and runs it.
//!
//! Backends come from the URLs in the environment (`scripts/servers.sh env`);
//! `memory://` always runs. `--quick` shortens every phase.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lockkit::Locker;
use tokio::time::Instant;

const BACKENDS: &[(&str, &str)] = &[
    ("memory", ""),
    ("redis", "LOCKKIT_REDIS_URL"),
    ("redis-cluster", "LOCKKIT_REDIS_CLUSTER_URL"),
    ("redlock (5)", "LOCKKIT_REDLOCK_URL"),
    ("etcd (3)", "LOCKKIT_ETCD_URL"),
    ("postgres", "LOCKKIT_POSTGRES_URL"),
];
const CONCURRENCY: &[usize] = &[1, 16, 64];
const WAITERS: usize = 8;
const TTL: Duration = Duration::from_secs(10);

struct Row {
    backend: String,
    pairs: Vec<f64>,
    p50: Duration,
    p99: Duration,
    handoffs: f64,
    handoff_p50: Duration,
    handoff_p99: Duration,
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let phase = if quick {
        Duration::from_millis(700)
    } else {
        Duration::from_secs(3)
    };
    let run = format!("{:08x}", std::process::id());
    let mut rows = Vec::new();
    for (name, var) in BACKENDS {
        let url = if var.is_empty() {
            "memory://".to_owned()
        } else {
            std::env::var(var).unwrap_or_default()
        };
        if url.is_empty() {
            eprintln!("{name}: skipped ({var} is not set; scripts/lab.sh sets it)");
            continue;
        }
        let locker = match lockkit::connect(&url).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{name}: skipped ({e})");
                continue;
            }
        };
        eprintln!("{name}: measuring ...");
        let prefix = format!("lab-{run}/{name}");
        let mut pairs = Vec::new();
        let (mut p50, mut p99) = (Duration::ZERO, Duration::ZERO);
        for &tasks in CONCURRENCY {
            let (rate, mut latencies) = uncontended(&locker, &prefix, tasks, phase).await;
            pairs.push(rate);
            if tasks == 16 {
                (p50, p99) = (
                    percentile(&mut latencies, 0.50),
                    percentile(&mut latencies, 0.99),
                );
            }
        }
        let (handoffs, mut gaps) = contended(&locker, &format!("{prefix}/hot"), phase).await;
        rows.push(Row {
            backend: name.to_string(),
            pairs,
            p50,
            p99,
            handoffs,
            handoff_p50: percentile(&mut gaps, 0.50),
            handoff_p99: percentile(&mut gaps, 0.99),
        });
    }
    print_table(&rows);
}

/// `tasks` tasks, each taking and releasing keys of its own for `phase`.
async fn uncontended(
    locker: &Locker,
    prefix: &str,
    tasks: usize,
    phase: Duration,
) -> (f64, Vec<Duration>) {
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (locker, key) = (locker.clone(), format!("{prefix}/u{tasks}-{t}"));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while started.elapsed() < phase {
                    let t0 = Instant::now();
                    let lease = locker
                        .try_acquire(&key, TTL)
                        .await
                        .expect("uncontended acquire");
                    latencies.push(t0.elapsed());
                    locker.release(lease).await.expect("release");
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    (all.len() as f64 / started.elapsed().as_secs_f64(), all)
}

/// WAITERS tasks on one key: grants per second, and the gap between a
/// release and the next grant.
async fn contended(locker: &Locker, key: &str, phase: Duration) -> (f64, Vec<Duration>) {
    let origin = Instant::now();
    let last_release = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, key, last_release) =
                (locker.clone(), key.to_owned(), last_release.clone());
            tokio::spawn(async move {
                let mut gaps = Vec::new();
                while origin.elapsed() < phase {
                    let lease = locker
                        .acquire(&key, TTL, Duration::from_secs(60))
                        .await
                        .expect("contended acquire");
                    let released = last_release.load(Ordering::SeqCst);
                    if released > 0 {
                        gaps.push(
                            origin
                                .elapsed()
                                .saturating_sub(Duration::from_nanos(released)),
                        );
                    }
                    last_release.store(origin.elapsed().as_nanos() as u64, Ordering::SeqCst);
                    locker.release(lease).await.expect("release");
                    last_release.store(origin.elapsed().as_nanos() as u64, Ordering::SeqCst);
                }
                gaps
            })
        })
        .collect();
    let mut gaps = Vec::new();
    for h in handles {
        gaps.extend(h.await.expect("task"));
    }
    (
        (gaps.len() + 1) as f64 / origin.elapsed().as_secs_f64(),
        gaps,
    )
}

fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

fn print_table(rows: &[Row]) {
    let redis = rows
        .iter()
        .find(|r| r.backend == "redis")
        .map(|r| r.pairs[CONCURRENCY.len() - 1]);
    let header: Vec<String> = CONCURRENCY
        .iter()
        .map(|t| format!("pairs/s @{t}"))
        .collect();
    println!(
        "| backend | {} | vs redis @64 | acquire p50 @16 | acquire p99 @16 | handoffs/s ({WAITERS} waiters) | handoff p50 | handoff p99 |",
        header.join(" | ")
    );
    println!(
        "|---|{}---|---|---|---|---|---|",
        "---|".repeat(CONCURRENCY.len())
    );
    for r in rows {
        let pairs: Vec<String> = r.pairs.iter().map(|p| format!("{p:.0}")).collect();
        let ratio = redis.map_or("n/a".to_owned(), |base| {
            format!("{:.2}x", r.pairs[CONCURRENCY.len() - 1] / base)
        });
        println!(
            "| {} | {} | {ratio} | {:.2?} | {:.2?} | {:.0} | {:.2?} | {:.2?} |",
            r.backend,
            pairs.join(" | "),
            r.p50,
            r.p99,
            r.handoffs,
            r.handoff_p50,
            r.handoff_p99
        );
    }
}
