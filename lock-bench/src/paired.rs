//! Paired rounds: two clients measured in turns, many short rounds each, at
//! the same concurrency, so that both see the same machine.
//!
//! On a shared host (CPU taken by the hypervisor, busy neighbours) one
//! client's figure and another's taken minutes apart can differ by half for
//! no reason of their own. Within a pair of rounds a second apart they share
//! the machine's state, so the ratio of each pair is steadier; the median of
//! those ratios is what the goals comparing two clients check, and the
//! spread of them is printed beside it. The order alternates from one round
//! to the next, so neither client always runs first.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde::Serialize;

use crate::progress::Progress;
use crate::scenarios;
use crate::subject::Client;

/// The comparisons the goals make between two clients: (subject, against,
/// tasks, metric, client runtime). Names are the report's; `rslock` stands
/// for the peer over one node or five.
const COMPARISONS: &[(&str, &str, usize, Metric, ClientRuntime)] = &[
    (
        "redis",
        "rslock (1 node)",
        64,
        Metric::PairsPerSecond,
        ClientRuntime::Lab,
    ),
    // The same pair, with the clients' runtime on one worker thread. On a
    // machine whose few CPUs also run the servers, a second worker mostly
    // wakes up to steal a task and parks again; this row shows what each
    // client does without that (see the report's notes).
    (
        "redis",
        "rslock (1 node)",
        64,
        Metric::PairsPerSecond,
        ClientRuntime::OneWorker,
    ),
    (
        "redlock",
        "rslock (5 nodes)",
        64,
        Metric::PairsPerSecond,
        ClientRuntime::Lab,
    ),
    (
        "redlock",
        "redis",
        1,
        Metric::AcquireP50,
        ClientRuntime::Lab,
    ),
    // What etcd and PostgreSQL users pick instead (see `peers.rs`).
    (
        "etcd",
        "etcd-v3lock",
        1,
        Metric::PairsPerSecond,
        ClientRuntime::Lab,
    ),
    (
        "etcd",
        "etcd-v3lock",
        64,
        Metric::PairsPerSecond,
        ClientRuntime::Lab,
    ),
    (
        "postgres",
        "pg-advisory-xact",
        64,
        Metric::PairsPerSecond,
        ClientRuntime::Lab,
    ),
    (
        "postgres",
        "pg-advisory-xact",
        1,
        Metric::AcquireP50,
        ClientRuntime::Lab,
    ),
    (
        "postgres",
        "pg-advisory-session",
        64,
        Metric::PairsPerSecond,
        ClientRuntime::Lab,
    ),
];

/// Where a comparison's clients run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ClientRuntime {
    /// The lab's own Tokio runtime, the one every other figure is taken on.
    Lab,
    /// A Tokio runtime of the comparison's own, with one worker thread.
    OneWorker,
}

impl ClientRuntime {
    /// How the report names it, with its worker threads: "the lab's
    /// runtime (2 worker threads)".
    pub fn describe(self, workers: usize) -> String {
        let s = if workers == 1 { "" } else { "s" };
        let threads = format!("{workers} worker thread{s}");
        match self {
            ClientRuntime::Lab => format!("the lab's runtime ({threads})"),
            ClientRuntime::OneWorker => format!("a runtime of its own ({threads})"),
        }
    }
}

/// The backend or peer a report name stands for: its lab subject.
fn lab_subject(name: &str) -> &str {
    if name.starts_with("rslock") {
        "rslock"
    } else {
        name
    }
}

/// How many comparisons run when only the subjects `wanted` says yes to do.
pub fn planned(wanted: &impl Fn(&str) -> bool) -> usize {
    COMPARISONS
        .iter()
        .filter(|(a, b, ..)| wanted(lab_subject(a)) && wanted(lab_subject(b)))
        .count()
}

/// Runs every comparison whose two clients were wanted, with clients of its
/// own (connected afresh, warmed up).
pub async fn all(
    wanted: &impl Fn(&str) -> bool,
    rounds: usize,
    phase: Duration,
    progress: &Arc<Progress>,
    prefix: &str,
) -> Vec<Paired> {
    let mut out = Vec::new();
    for &(a, b, tasks, metric, runtime) in COMPARISONS {
        if !(wanted(lab_subject(a)) && wanted(lab_subject(b))) {
            continue;
        }
        let (workers, label) = match runtime {
            ClientRuntime::Lab => (
                tokio::runtime::Handle::current().metrics().num_workers(),
                "lab",
            ),
            ClientRuntime::OneWorker => (1, "own1"),
        };
        let on = runtime.describe(workers);
        let _step = progress.step(format!(
            "paired rounds: {a} and {b}, {tasks} tasks, on {on}"
        ));
        let prefix = format!("{prefix}/{a}-{b}-{tasks}-{label}").replace([' ', '(', ')'], "");
        let job = move || async move { compare(a, b, tasks, metric, rounds, phase, &prefix).await };
        let ran = match runtime {
            ClientRuntime::Lab => Ok(job().await),
            ClientRuntime::OneWorker => on_one_worker(job).await,
        };
        let mut paired = ran.unwrap_or_else(|e| Paired::failed(a, b, tasks, metric, [e]));
        paired.runtime = runtime;
        paired.client_workers = workers;
        out.push(paired);
    }
    out
}

/// Runs `job` on a Tokio runtime of its own with one worker thread, from
/// a blocking thread of the lab's runtime, so that everything it spawns
/// (connections' tasks included) runs there and ends with it. Errs when
/// that runtime cannot run it.
async fn on_one_worker<F>(job: impl FnOnce() -> F + Send + 'static) -> Result<Paired, String>
where
    F: Future<Output = Paired>,
{
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a one-worker runtime: {e}"))?;
        let paired = runtime.block_on(job());
        // Its tasks (connections' drivers) are cancelled; a blocking call
        // one of them left running is not waited for without end.
        runtime.shutdown_timeout(Duration::from_secs(5));
        Ok(paired)
    })
    .await
    .unwrap_or_else(|e| Err(format!("the one-worker runtime's thread failed: {e}")))
}

/// One comparison, with clients of its own, on the runtime it is called on.
async fn compare(
    a: &str,
    b: &str,
    tasks: usize,
    metric: Metric,
    rounds: usize,
    phase: Duration,
    prefix: &str,
) -> Paired {
    let clients = match (client(a).await, client(b).await) {
        (Ok(x), Ok(y)) => (x, y),
        (x, y) => {
            let errors = [x.err(), y.err()].into_iter().flatten();
            return Paired::failed(a, b, tasks, metric, errors);
        }
    };
    // Both clients of a throughput comparison use the same servers.
    let servers = match (metric, servers_of(a)) {
        (Metric::PairsPerSecond, Some(url)) => crate::counters::redis_nodes(&url).await.ok(),
        _ => None,
    };
    let sides = ((a, &clients.0), (b, &clients.1));
    run(sides, tasks, metric, rounds, phase, servers, prefix).await
}

/// The URL of the Redis servers a client of this report name talks to.
fn servers_of(name: &str) -> Option<String> {
    match name {
        "redis" => std::env::var("LOCKKIT_REDIS_URL").ok(),
        "redlock" => std::env::var("LOCKKIT_REDLOCK_URL").ok(),
        _ => None,
    }
}

/// CPU seconds the Redis servers have used (user + system), summed.
async fn server_cpu_s(nodes: &[MultiplexedConnection]) -> Option<f64> {
    let mut total = 0.0;
    for node in nodes {
        let text: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut node.clone())
            .await
            .ok()?;
        total += text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("used_cpu_sys:")
                    .or_else(|| l.strip_prefix("used_cpu_user:"))
            })
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum::<f64>();
    }
    Some(total)
}

/// CPU seconds this process has used (user + system), from /proc/self/stat:
/// whichever client is measuring, and the lab's own timing of each call.
fn own_cpu_s() -> Option<f64> {
    // USER_HZ: the unit of these fields, 100 on every Linux ABI.
    const TICKS_PER_S: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name (in parentheses, and free to hold spaces) come
    // fields 3 onwards; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / TICKS_PER_S)
}

/// A client for a report name, from the servers' URLs in the environment.
async fn client(name: &str) -> Result<Client, String> {
    let var = |v: &str| std::env::var(v).map_err(|_| format!("{v} is not set"));
    let hosts = |url: String| -> Vec<String> {
        crate::counters::hosts(&url)
            .iter()
            .map(|h| format!("redis://{h}"))
            .collect()
    };
    match name {
        "rslock (1 node)" => Ok(Client::rslock(&hosts(var("LOCKKIT_REDIS_URL")?))),
        "rslock (5 nodes)" => Ok(Client::rslock(&hosts(var("LOCKKIT_REDLOCK_URL")?))),
        "redis" => crate::connect(name, &var("LOCKKIT_REDIS_URL")?)
            .await
            .map(|(l, ..)| Client::Lockkit(l)),
        "redlock" => crate::connect(name, &var("LOCKKIT_REDLOCK_URL")?)
            .await
            .map(|(l, ..)| Client::Lockkit(l)),
        "etcd" => crate::connect(name, &var("LOCKKIT_ETCD_URL")?)
            .await
            .map(|(l, ..)| Client::Lockkit(l)),
        "postgres" => crate::connect(name, &var("LOCKKIT_POSTGRES_URL")?)
            .await
            .map(|(l, ..)| Client::Lockkit(l)),
        "etcd-v3lock" => crate::peers::Peer::connect(name, &var("LOCKKIT_ETCD_URL")?)
            .await
            .map(|p| Client::Peer(Arc::new(p))),
        "pg-advisory-session" | "pg-advisory-xact" => {
            let lab = crate::pg_lab_database(&var("LOCKKIT_POSTGRES_URL")?).await?;
            crate::peers::Peer::connect(name, &lab)
                .await
                .map(|p| Client::Peer(Arc::new(p)))
        }
        other => Err(format!("no paired client for {other}")),
    }
}

/// What a pair of rounds compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Metric {
    /// Uncontended acquire+release pairs per second (higher is better).
    PairsPerSecond,
    /// Median latency of an uncontended acquire (lower is better).
    AcquireP50,
}

/// The outcome of paired rounds of a client (the subject) and its comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    /// The client measured, as in the report's tables.
    pub subject: String,
    /// What it is compared with.
    pub against: String,
    /// Concurrent tasks in every round.
    pub tasks: usize,
    /// The Tokio runtime both clients ran on.
    pub runtime: ClientRuntime,
    /// Its worker threads.
    pub client_workers: usize,
    /// What is compared.
    pub metric: Metric,
    /// Each round's figures: (subject, against).
    pub rounds: Vec<(f64, f64)>,
    /// Subject / against, per round, sorted.
    pub ratios: Vec<f64>,
    /// Errors seen in the rounds (a round with errors is left out).
    pub errors: Vec<String>,
    /// Redis server CPU time per pair, µs, summed over the nodes both
    /// clients use: the median over the rounds of (subject, against). Only
    /// where both talk to the same Redis servers.
    pub server_us_per_pair: Option<(f64, f64)>,
    /// This process's CPU time per pair, µs (the client's work and the
    /// lab's own timing of each call, the same for both): the median over
    /// the rounds of (subject, against).
    pub client_us_per_pair: Option<(f64, f64)>,
}

impl Paired {
    pub(crate) fn new(subject: &str, against: &str, tasks: usize, metric: Metric) -> Paired {
        Paired {
            subject: subject.into(),
            against: against.into(),
            tasks,
            runtime: ClientRuntime::Lab,
            client_workers: 0,
            metric,
            rounds: Vec::new(),
            ratios: Vec::new(),
            errors: Vec::new(),
            server_us_per_pair: None,
            client_us_per_pair: None,
        }
    }

    /// A comparison that could not run, and why.
    fn failed(
        subject: &str,
        against: &str,
        tasks: usize,
        metric: Metric,
        errors: impl IntoIterator<Item = String>,
    ) -> Paired {
        let mut failed = Paired::new(subject, against, tasks, metric);
        failed.errors.extend(errors);
        failed
    }

    /// The median of the per-round ratios.
    pub fn median(&self) -> Option<f64> {
        let n = self.ratios.len();
        (n > 0).then(|| {
            if n % 2 == 1 {
                self.ratios[n / 2]
            } else {
                (self.ratios[n / 2 - 1] + self.ratios[n / 2]) / 2.0
            }
        })
    }

    /// The lowest and highest per-round ratio.
    pub fn range(&self) -> Option<(f64, f64)> {
        Some((*self.ratios.first()?, *self.ratios.last()?))
    }
}

/// Runs `rounds` pairs of rounds of `phase` each, at `tasks` tasks, of the
/// two `sides` (name, client): subject, then the one it is compared with.
/// `servers`: the Redis nodes both use, to count their CPU time per pair.
pub async fn run(
    sides: ((&str, &Client), (&str, &Client)),
    tasks: usize,
    metric: Metric,
    rounds: usize,
    phase: Duration,
    servers: Option<Vec<MultiplexedConnection>>,
    prefix: &str,
) -> Paired {
    let ((subject, a), (against, b)) = sides;
    let mut out = Paired::new(subject, against, tasks, metric);
    let ttl = Duration::from_secs(10);
    // One round of one client: its figure, and the servers' and this
    // process's CPU µs per pair.
    let once = async |client: &Client, side: &str| {
        let ops = Arc::new(AtomicU64::new(0));
        let cpu_before = match &servers {
            Some(nodes) => server_cpu_s(nodes).await,
            None => None,
        };
        let own_before = own_cpu_s();
        let u = scenarios::uncontended(client, &format!("{prefix}/{side}"), tasks, phase, ttl, ops)
            .await;
        let own_after = own_cpu_s();
        let cpu_after = match &servers {
            Some(nodes) => server_cpu_s(nodes).await,
            None => None,
        };
        let figure = match metric {
            Metric::PairsPerSecond => u.pairs_per_s,
            Metric::AcquireP50 => u.acquire.p50_us,
        };
        let per_pair = |before: Option<f64>, after: Option<f64>| {
            before
                .zip(after)
                .filter(|_| u.pairs > 0)
                .map(|(b, a)| (a - b) * 1e6 / u.pairs as f64)
        };
        let cpu = (
            per_pair(cpu_before, cpu_after),
            per_pair(own_before, own_after),
        );
        match u.first_error {
            Some(e) => Err(format!("{side}: {} errors, first: {e}", u.errors)),
            None if u.pairs == 0 => Err(format!("{side}: no pair completed")),
            None => Ok((figure, cpu)),
        }
    };
    // Warm-up, not counted: connections, script caches.
    let _ = once(a, "subject").await;
    let _ = once(b, "against").await;
    let (mut cpu, mut own) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (x, y) = if round % 2 == 0 {
            let x = once(a, "subject").await;
            (x, once(b, "against").await)
        } else {
            let y = once(b, "against").await;
            (once(a, "subject").await, y)
        };
        match (x, y) {
            (Ok((x, x_cpu)), Ok((y, y_cpu))) if y > 0.0 => {
                out.rounds.push((x, y));
                out.ratios.push(x / y);
                cpu.extend(x_cpu.0.zip(y_cpu.0));
                own.extend(x_cpu.1.zip(y_cpu.1));
            }
            (x, y) => out.errors.extend([x.err(), y.err()].into_iter().flatten()),
        }
    }
    out.ratios.sort_by(f64::total_cmp);
    out.server_us_per_pair = medians(&cpu);
    if metric == Metric::PairsPerSecond {
        out.client_us_per_pair = medians(&own);
    }
    out
}

/// The median of each side of `pairs`, if there are any.
pub(crate) fn medians(pairs: &[(f64, f64)]) -> Option<(f64, f64)> {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (!pairs.is_empty()).then(|| {
        (
            median(pairs.iter().map(|c| c.0).collect()),
            median(pairs.iter().map(|c| c.1).collect()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paired(ratios: &[f64]) -> Paired {
        Paired {
            ratios: ratios.to_vec(),
            ..Paired::new("a", "b", 1, Metric::PairsPerSecond)
        }
    }

    #[test]
    fn median_and_range_of_sorted_ratios() {
        assert_eq!(paired(&[1.0, 2.0, 4.0]).median(), Some(2.0));
        assert_eq!(paired(&[1.0, 2.0, 4.0, 5.0]).median(), Some(3.0));
        assert_eq!(paired(&[1.0, 2.0, 4.0]).range(), Some((1.0, 4.0)));
        assert_eq!(paired(&[]).median(), None);
    }
}
