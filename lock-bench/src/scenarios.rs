//! The scenarios: uncontended pairs, contended handoffs, many keys held at
//! once, and loss detection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit::{GuardOptions, Locker};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::counters::Counter;
use crate::stats::{Latency, nanos};
use crate::subject::{Client, Held};

/// T tasks, each taking and releasing keys of its own.
#[derive(Debug, Clone, Serialize)]
pub struct Uncontended {
    /// Concurrent tasks.
    pub tasks: usize,
    /// Acquire+release pairs completed.
    pub pairs: u64,
    /// Pairs per second.
    pub pairs_per_s: f64,
    /// Latency of the acquire alone.
    pub acquire: Latency,
    /// The acquire latency distribution at the percentiles of `stats::CURVE`, µs.
    pub acquire_curve_us: Vec<f64>,
    /// Failed operations (and the first error).
    pub errors: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
}

/// W waiters on one key; each holder releases at once and queues again.
#[derive(Debug, Clone, Serialize)]
pub struct Contended {
    /// Waiting tasks.
    pub waiters: usize,
    /// Grants.
    pub grants: u64,
    /// Grants per second.
    pub grants_per_s: f64,
    /// Time from the start of a release to the next holder's grant.
    pub handoff: Latency,
    /// The handoff distribution at the percentiles of `stats::CURVE`, µs.
    pub handoff_curve_us: Vec<f64>,
    /// How long the releases themselves took, from the call to its return:
    /// a handoff cannot be shorter than the server's part of a release
    /// (for etcd and PostgreSQL, a commit).
    pub release: Latency,
    /// Server-side operations per grant (see `counted`).
    pub server_ops_per_handoff: Option<f64>,
    /// What `server_ops_per_handoff` counts.
    pub counted: String,
    /// The counter deltas behind it, by operation.
    pub server_ops: std::collections::BTreeMap<String, u64>,
    /// Failed acquires.
    pub errors: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
}

/// Many distinct keys held at once.
#[derive(Debug, Clone, Serialize)]
pub struct ManyKeys {
    /// Locks held at once.
    pub held: usize,
    /// Seconds taken to acquire them all (64 tasks).
    pub acquire_s: f64,
    /// Heap bytes allocated per held lock (counting allocator, live bytes).
    pub client_heap_bytes_per_lock: f64,
    /// Resident set growth per held lock (/proc/self/statm).
    pub client_rss_bytes_per_lock: f64,
    /// Server memory growth per held lock (see `server_counted`).
    pub server_bytes_per_lock: Option<f64>,
    /// How the server memory is read.
    pub server_counted: String,
    /// Acquires that failed.
    pub errors: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
}

/// Time from removing a grant behind its holder's back to `lost()` firing.
#[derive(Debug, Clone, Serialize)]
pub struct Loss {
    /// The guard's TTL (it renews every TTL/3).
    pub ttl_ms: u64,
    /// One figure per sample, ms, from the start of `force_release` on a second `Locker`.
    pub samples_ms: Vec<f64>,
    /// Median, ms.
    pub p50_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
    /// Samples where `lost()` did not fire within 10 s, or the removal failed.
    pub errors: Vec<String>,
}

/// `tasks` tasks, each locking and releasing its own key for `phase`.
pub async fn uncontended(
    client: &Client,
    prefix: &str,
    tasks: usize,
    phase: Duration,
    ttl: Duration,
    ops: Arc<AtomicU64>,
) -> Uncontended {
    let started = Instant::now();
    let until = started + phase;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (client, key, ops) = (
                client.clone(),
                format!("{prefix}/u{tasks}-{t}"),
                ops.clone(),
            );
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(4096);
                let (mut done, mut errors, mut first) = (0u64, 0u64, None);
                while Instant::now() < until {
                    let t0 = Instant::now();
                    let r = match client.try_acquire(&key, ttl).await {
                        Ok(held) => {
                            lat.push(nanos(t0.elapsed()));
                            client.release(held).await
                        }
                        Err(e) => Err(e),
                    };
                    match r {
                        Ok(()) => {
                            done += 1;
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors += 1;
                            first.get_or_insert(e);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                (lat, done, errors, first)
            })
        })
        .collect();
    let (all, pairs, errors, first_error) = gather(handles).await;
    let seconds = started.elapsed().as_secs_f64();
    let (acquire, acquire_curve_us) = Latency::of(&all);
    Uncontended {
        tasks,
        pairs,
        pairs_per_s: pairs as f64 / seconds,
        acquire,
        acquire_curve_us,
        errors,
        first_error,
    }
}

/// What one measuring task returns: its samples, its successes, its errors
/// and the first of them.
type TaskOutcome<S> = (Vec<S>, u64, u64, Option<String>);

/// Joins the measuring tasks and adds up what they return; a task that
/// panicked counts as one error.
async fn gather<S>(handles: Vec<tokio::task::JoinHandle<TaskOutcome<S>>>) -> TaskOutcome<S> {
    let (mut samples, mut done, mut errors, mut first_error) = (Vec::new(), 0, 0, None);
    for h in handles {
        match h.await {
            Ok((s, n, e, f)) => {
                samples.extend(s);
                done += n;
                errors += e;
                if first_error.is_none() {
                    first_error = f;
                }
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(format!("task failed: {e}"));
            }
        }
    }
    (samples, done, errors, first_error)
}

/// `waiters` tasks on one key for `phase`; server operations counted by `counter`.
pub async fn contended(
    client: &Client,
    key: &str,
    waiters: usize,
    phase: Duration,
    ttl: Duration,
    counter: &Counter,
    ops: Arc<AtomicU64>,
) -> Contended {
    let before = counter.snapshot().await;
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = (0..waiters)
        .map(|_| {
            let (client, key, ops) = (client.clone(), key.to_owned(), ops.clone());
            let (released_at, stop) = (released_at.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut gaps, mut grants, mut errors, mut first) = (Vec::new(), 0u64, 0u64, None);
                let mut releases = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let held: Held = match client.acquire(&key, ttl, Duration::from_secs(30)).await
                    {
                        Ok(h) => h,
                        Err(e) => {
                            errors += 1;
                            first.get_or_insert(e);
                            continue;
                        }
                    };
                    let granted = Instant::now();
                    grants += 1;
                    ops.fetch_add(1, Ordering::Relaxed);
                    let mut last = released_at.lock().await;
                    if let Some(r) = last.take() {
                        gaps.push(nanos(granted - r));
                    }
                    let release_started = Instant::now();
                    *last = Some(release_started);
                    drop(last);
                    if let Err(e) = client.release(held).await {
                        errors += 1;
                        first.get_or_insert(e);
                    }
                    releases.push(nanos(release_started.elapsed()));
                }
                (vec![(gaps, releases)], grants, errors, first)
            })
        })
        .collect();
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    let (samples, grants, errors, first_error) = gather(handles).await;
    let (mut gaps, mut releases): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
    for (g, r) in samples {
        gaps.extend(g);
        releases.extend(r);
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = counter.snapshot().await;
    let server_ops = Counter::delta(&before, &after);
    let total: u64 = server_ops.values().sum();
    let (handoff, handoff_curve_us) = Latency::of(&gaps);
    let (release, _) = Latency::of(&releases);
    Contended {
        waiters,
        grants,
        grants_per_s: grants as f64 / seconds,
        handoff,
        handoff_curve_us,
        release,
        // None counted: the server has not published them yet (PostgreSQL
        // flushes a busy connection's statistics about once a second, so a
        // short phase may show none), not a handoff that cost nothing.
        server_ops_per_handoff: (counter.counts() && grants > 0 && total > 0)
            .then(|| total as f64 / grants as f64),
        counted: counter.how().to_owned(),
        server_ops,
        errors,
        first_error,
    }
}

/// Resident set size of this process, bytes.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Holds `n` distinct keys at once (acquired by 64 tasks), measures, then releases them.
pub async fn many_keys(
    locker: &Locker,
    prefix: &str,
    n: usize,
    counter: &Counter,
    ops: Arc<AtomicU64>,
) -> ManyKeys {
    const TASKS: usize = 64;
    let ttl = Duration::from_secs(600);
    counter.settle().await;
    let server_before = counter.memory().await;
    let (heap_before, rss_before) = (crate::allocated(), rss_bytes());
    let started = Instant::now();
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let (locker, prefix, ops) = (locker.clone(), prefix.to_owned(), ops.clone());
            tokio::spawn(async move {
                let mut held = Vec::with_capacity(n / TASKS + 1);
                let (mut errors, mut first) = (0u64, None);
                for i in (t..n).step_by(TASKS) {
                    match locker.try_acquire(&format!("{prefix}/k{i}"), ttl).await {
                        Ok(lease) => {
                            held.push(lease);
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors += 1;
                            first.get_or_insert(e.to_string());
                        }
                    }
                }
                (held, errors, first)
            })
        })
        .collect();
    let (mut leases, mut errors, mut first_error) = (Vec::with_capacity(n), 0, None);
    for h in handles {
        if let Ok((held, e, f)) = h.await {
            leases.extend(held);
            errors += e;
            if first_error.is_none() {
                first_error = f;
            }
        }
    }
    let acquire_s = started.elapsed().as_secs_f64();
    let (heap_after, rss_after) = (crate::allocated(), rss_bytes());
    let server_after = counter.memory().await;
    let held = leases.len();
    let per = |a: f64, b: f64| if held > 0 { (a - b) / held as f64 } else { 0.0 };
    let result = ManyKeys {
        held,
        acquire_s,
        client_heap_bytes_per_lock: per(heap_after as f64, heap_before as f64),
        client_rss_bytes_per_lock: per(rss_after as f64, rss_before as f64),
        server_bytes_per_lock: match (server_before, server_after) {
            (Some(b), Some(a)) if held > 0 => Some(per(a as f64, b as f64)),
            _ => None,
        },
        server_counted: counter.memory_how().to_owned(),
        errors,
        first_error,
    };
    // Release them all, 64 at a time.
    let leases = Arc::new(std::sync::Mutex::new(leases));
    let releasers: Vec<_> = (0..TASKS)
        .map(|_| {
            let (locker, leases) = (locker.clone(), leases.clone());
            tokio::spawn(async move {
                loop {
                    let next = leases.lock().map(|mut l| l.pop()).unwrap_or(None);
                    let Some(lease) = next else { break };
                    let _ = locker.release(lease).await;
                }
            })
        })
        .collect();
    for r in releasers {
        let _ = r.await;
    }
    result
}

/// Holds a guard, removes its grant behind its back, and times `lost()`.
pub async fn loss(
    locker: &Locker,
    operator: &Locker,
    prefix: &str,
    samples: usize,
    ttl: Duration,
    ops: Arc<AtomicU64>,
) -> Loss {
    let (mut times, mut errors) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let key = format!("{prefix}/loss{i}");
        let guard = match locker.guard(&key, GuardOptions::new(ttl)).await {
            Ok(g) => g,
            Err(e) => {
                errors.push(format!("guard: {e}"));
                continue;
            }
        };
        let lost = guard.lost();
        let t0 = Instant::now();
        match operator
            .force_release(&key)
            .await
            .map_err(|e| e.to_string())
        {
            Ok(true) => {}
            Ok(false) => {
                errors.push("force_release found nothing to remove".into());
                continue;
            }
            Err(e) => {
                errors.push(format!("removing the grant: {e}"));
                continue;
            }
        }
        match tokio::time::timeout(Duration::from_secs(10), lost).await {
            Ok(_) => times.push(t0.elapsed().as_secs_f64() * 1e3),
            Err(_) => errors.push("lost() did not fire within 10 s".into()),
        }
        ops.fetch_add(1, Ordering::Relaxed);
        drop(guard);
    }
    // Kept as a sort: 2 to 5 samples (`loss_samples`), all kept in the
    // report, whose median a sort reads exactly where a histogram would round.
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    Loss {
        ttl_ms: ttl.as_millis() as u64,
        p50_ms: sorted
            .get(sorted.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(0.0),
        max_ms: sorted.last().copied().unwrap_or(0.0),
        samples_ms: times,
        errors,
    }
}
