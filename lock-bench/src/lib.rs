#![doc = include_str!("../README.md")]

mod baseline;
mod counters;
mod crowd;
mod etcd_handoff;
mod fan_out;
mod instructions;
mod metrics_overhead;
mod mode_handoff;
mod modes;
mod paired;
mod peers;
mod plot;
mod progress;
mod report;
mod scenarios;
mod stats;
mod subject;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit::{Locker, WakeUp};
use serde::Serialize;

pub use baseline::{Bound, BoundPoint};
pub use counters::redis_command_calls;
pub use crowd::Crowd;
pub use instructions::{InstructionPoint, ServerInstructions};
pub use modes::{BackendModes, ModeRun};
pub use paired::{ClientRuntime, Metric, Paired};
pub use report::{Goal, Machine, Report, Subject};
pub use scenarios::{Contended, Loss, ManyKeys, Uncontended};
pub use stats::Latency;

use counters::Counter;
use progress::Progress;
use subject::Client;

/// Counts live heap bytes, for client memory per held lock.
#[global_allocator]
static ALLOC: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

pub(crate) fn allocated() -> usize {
    ALLOC.allocated()
}

/// How long and how much each scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Under 2 minutes for every backend: a smoke test, figures are rough.
    Quick,
    /// Every concurrency, longer phases, 100,000 keys held at once.
    Full,
}

/// What to run and where to write the report.
#[derive(Debug, Clone)]
pub struct Options {
    /// Quick or full.
    pub mode: Mode,
    /// The report folder (created).
    pub out: PathBuf,
    /// Subjects to run ([`SUBJECTS`] names); all when `None`.
    pub only: Option<Vec<String>>,
    /// Only the paired rounds (the comparisons the goals make between two
    /// clients), none of the sweeps, floors or bounds: a couple of minutes.
    pub paired_only: bool,
    /// Paired rounds per comparison, instead of the mode's.
    pub rounds: Option<usize>,
    /// Each paired round's length, instead of the mode's.
    pub round: Option<Duration>,
    /// Only the crowd scenario (many waiters on one key over several
    /// clients), for each backend chosen: a minute or two.
    pub crowd_only: bool,
    /// Only the modes against the mutex (a semaphore's permit, a read
    /// hold: paired rounds and handoffs), for each backend chosen that
    /// offers them: a few minutes.
    pub modes_only: bool,
}

/// Everything the lab can measure: name and the environment variable with
/// its server URL (`scripts/servers.sh` writes them to
/// `target/lockkit-servers/urls.env`). `rslock` is the peer library, over
/// the single Redis (1 node) and over the Redlock nodes (5 nodes).
/// `etcd-v3lock`, `pg-advisory-session` and `pg-advisory-xact` are what etcd
/// and PostgreSQL users pick instead (see `peers.rs`).
pub const SUBJECTS: &[(&str, &str)] = &[
    ("memory", ""),
    ("redis", "LOCKKIT_REDIS_URL"),
    ("redis-cluster", "LOCKKIT_REDIS_CLUSTER_URL"),
    ("redlock", "LOCKKIT_REDLOCK_URL"),
    ("etcd", "LOCKKIT_ETCD_URL"),
    ("postgres", "LOCKKIT_POSTGRES_URL"),
    ("rslock", "LOCKKIT_REDLOCK_URL"),
    ("etcd-v3lock", "LOCKKIT_ETCD_URL"),
    ("pg-advisory-session", "LOCKKIT_POSTGRES_URL"),
    ("pg-advisory-xact", "LOCKKIT_POSTGRES_URL"),
];

/// The PostgreSQL database the lab uses, so its counters see only the lab.
pub const PG_DATABASE: &str = "lockkit_lab";

struct Plan {
    tasks: &'static [usize],
    phase: Duration,
    waiters: &'static [usize],
    contended_phase: Duration,
    /// Rounds of the raw fan-out floor (each: one node, then all).
    fan_out_rounds: usize,
    many_keys: usize,
    pg_many_keys: usize,
    loss_samples: usize,
    redis_requests: u64,
    pgbench_secs: u64,
    /// Paired rounds per comparison of two clients, and each round's length.
    paired_rounds: usize,
    paired_phase: Duration,
    /// Pairs per client and point of the server's instruction count, and
    /// the operations per round trip it is counted at.
    instruction_pairs: usize,
    instruction_depths: &'static [usize],
    /// Waiters in the crowd scenario (the first and the last are compared),
    /// and the handoffs measured at each.
    crowd_waiters: &'static [usize],
    crowd_handoffs: u64,
    /// The modes against the mutex.
    modes: modes::Plan,
}

impl Plan {
    fn of(mode: Mode) -> Plan {
        match mode {
            Mode::Quick => Plan {
                tasks: &[1, 16, 64],
                phase: Duration::from_millis(600),
                waiters: &[8],
                contended_phase: Duration::from_secs(1),
                many_keys: 2_000,
                pg_many_keys: 16,
                loss_samples: 2,
                redis_requests: 5_000,
                pgbench_secs: 1,
                fan_out_rounds: 1_000,
                paired_rounds: 3,
                paired_phase: Duration::from_millis(400),
                instruction_pairs: 256,
                instruction_depths: &[16],
                crowd_waiters: &[4, 100],
                crowd_handoffs: 100,
                modes: modes::Plan {
                    rounds: 3,
                    phase: Duration::from_millis(150),
                    waiters: 12,
                    handoffs: 40,
                },
            },
            Mode::Full => Plan {
                tasks: &[1, 4, 16, 64, 256],
                phase: Duration::from_secs(3),
                waiters: &[4, 32],
                contended_phase: Duration::from_secs(3),
                many_keys: 100_000,
                pg_many_keys: 64,
                loss_samples: 5,
                redis_requests: 50_000,
                pgbench_secs: 3,
                fan_out_rounds: 5_000,
                paired_rounds: 9,
                paired_phase: Duration::from_secs(1),
                instruction_pairs: 4_096,
                instruction_depths: &[1, 16, 64],
                crowd_waiters: &[4, 1000],
                crowd_handoffs: 1000,
                modes: modes::Plan {
                    rounds: 9,
                    phase: Duration::from_secs(1),
                    waiters: 32,
                    handoffs: 1000,
                },
            },
        }
    }
}

/// The lab's own backends (the rest of [`SUBJECTS`] are peers).
const BACKENDS: &[&str] = &[
    "memory",
    "redis",
    "redis-cluster",
    "redlock",
    "etcd",
    "postgres",
];

/// The clients a crowd's waiters are spread over: each a `Locker` of its
/// own, with its own connections, as a process of its own would have.
const CROWD_CLIENTS: usize = 4;

/// PostgreSQL holds one connection per lock: concurrency above this is not run.
const PG_MAX_TASKS: usize = 64;
const TTL: Duration = Duration::from_secs(10);
const LOSS_TTL: Duration = Duration::from_secs(3);

/// Runs the lab and writes the report folder. Per-subject failures are
/// recorded in the report (see [`Report::failures`]), not returned.
pub async fn run(options: &Options) -> Result<Report, String> {
    let mut plan = Plan::of(options.mode);
    plan.paired_rounds = options.rounds.unwrap_or(plan.paired_rounds).max(1);
    plan.paired_phase = options.round.unwrap_or(plan.paired_phase);
    plan.modes.rounds = options.rounds.unwrap_or(plan.modes.rounds).max(1);
    plan.modes.phase = options.round.unwrap_or(plan.modes.phase);
    let wanted = |name: &str| {
        options
            .only
            .as_ref()
            .is_none_or(|o| o.iter().any(|w| w == name))
    };
    if let Some(only) = &options.only
        && let Some(bad) = only.iter().find(|w| !SUBJECTS.iter().any(|(n, _)| n == *w))
    {
        return Err(format!(
            "unknown backend `{bad}`; choose among {}",
            SUBJECTS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    std::fs::create_dir_all(&options.out).map_err(|e| format!("{}: {e}", options.out.display()))?;
    let chosen: Vec<_> = SUBJECTS
        .iter()
        .filter(|(n, _)| wanted(n) && !options.paired_only && !options.modes_only)
        .filter(|(n, _)| !options.crowd_only || BACKENDS.contains(n))
        .collect();
    let crowds = |name: &str| plan.crowd_waiters.len() + usize::from(name == "redlock");
    let per_subject = |name: &str| {
        if options.crowd_only {
            1 + crowds(name)
        } else {
            plan.tasks.len() * 2 + plan.waiters.len() + 2 + crowds(name)
        }
    };
    let others = !options.crowd_only && !options.modes_only;
    // The modes run in a full or quick run, and alone with `modes_only`.
    let with_modes = !options.crowd_only && !options.paired_only;
    let mode_backends: Vec<&str> = BACKENDS
        .iter()
        .copied()
        .filter(|n| with_modes && wanted(n))
        .collect();
    // Two watch rings per waiter count: plain writes, the lock's transactions.
    let floors = if wanted("etcd") && !options.paired_only && others {
        plan.waiters.len() * 2
    } else {
        0
    };
    let count_instructions = wanted("redis") && !options.paired_only && others;
    let (paired_steps, overhead_steps) = if others {
        (paired::planned(&wanted), metrics_overhead::planned(&wanted))
    } else {
        (0, 0)
    };
    let progress = Progress::new(
        chosen.iter().map(|(n, _)| per_subject(n)).sum::<usize>()
            + floors
            + paired_steps
            + overhead_steps
            + usize::from(count_instructions)
            + modes::planned(mode_backends.len())
            + 2,
    );
    let started = Instant::now();
    let run_id = format!("{:08x}", getrandom::u32().unwrap_or(0));
    let mut report = Report::new(options.mode, report::machine().await);
    report.crowd_only = options.crowd_only;
    report.modes_only = options.modes_only;
    let ticks_before = report::cpu_ticks();
    let mut redis_bound: Option<Bound> = None;

    for (name, var) in chosen {
        let url = if var.is_empty() {
            "memory://".to_owned()
        } else {
            match std::env::var(var) {
                Ok(u) if !u.is_empty() => u,
                _ => {
                    report.subjects.push(Subject::failed(
                        name,
                        format!("{var} is not set (scripts/lab.sh sets it from target/lockkit-servers/urls.env)"),
                    ));
                    continue;
                }
            }
        };
        let prefix = format!("lab-{run_id}/{name}");
        if *name == "rslock" {
            let single = std::env::var("LOCKKIT_REDIS_URL").unwrap_or_default();
            let peers = [
                ("rslock (1 node)", counters::hosts(&single)),
                ("rslock (5 nodes)", counters::hosts(&url)),
            ];
            for (peer, hosts) in peers {
                if hosts.is_empty() {
                    report
                        .subjects
                        .push(Subject::failed(peer, "no Redis URL for it".into()));
                    continue;
                }
                let urls: Vec<String> = hosts.iter().map(|h| format!("redis://{h}")).collect();
                let mut s = Subject::new(peer, "peer", &urls.join(","));
                s.baseline = Some("redis-benchmark".into());
                let client = Client::rslock(&urls);
                measure_clients(
                    &plan,
                    &progress,
                    &client,
                    &prefix,
                    &mut s,
                    &Counter::None,
                    None,
                )
                .await;
                report.subjects.push(s);
            }
            continue;
        }
        if peers::NAMES.contains(name) {
            let url = if name.starts_with("pg-") {
                match pg_lab_database(&url).await {
                    Ok(lab) => lab,
                    Err(e) => {
                        report.subjects.push(Subject::failed(name, e));
                        continue;
                    }
                }
            } else {
                url
            };
            let mut s = Subject::new(name, "peer", &lockkit::url::redact(&url));
            s.notes.push(peers::gives_up(name).into());
            match peers::Peer::connect(name, &url).await {
                Ok(peer) => {
                    let client = Client::Peer(Arc::new(peer));
                    let max_tasks = name.starts_with("pg-").then_some(PG_MAX_TASKS);
                    measure_clients(
                        &plan,
                        &progress,
                        &client,
                        &prefix,
                        &mut s,
                        &Counter::None,
                        max_tasks,
                    )
                    .await;
                    close_idle(&client).await;
                }
                Err(e) => s.errors.push(e),
            }
            report.subjects.push(s);
            continue;
        }
        // pgbench first: the backend's pool keeps its connections open afterwards,
        // and the server's max_connections is shared.
        let mut pg_bound_first = None;
        if *name == "postgres" {
            let tasks: Vec<usize> = plan
                .tasks
                .iter()
                .copied()
                .filter(|&t| t <= PG_MAX_TASKS)
                .collect();
            match pg_lab_database(&url).await {
                Ok(lab) => {
                    pg_bound_first =
                        Some(pg_bound(&lab, &tasks, &plan, &progress, &options.out).await)
                }
                Err(e) => {
                    report.subjects.push(Subject::failed(name, e));
                    continue;
                }
            }
        }
        let step = progress.step(format!("{name}: connecting"));
        let connected = connect(name, &url).await;
        drop(step);
        let (locker, counter, backend_url) = match connected {
            Ok(c) => c,
            Err(e) => {
                report.subjects.push(Subject::failed(name, e));
                continue;
            }
        };
        let mut s = Subject::new(name, "backend", &backend_url);
        s.wake_up = Some(locker.capabilities().wake_up.to_string());
        s.has_wake_up = locker.capabilities().wake_up != WakeUp::Polling;
        if options.crowd_only {
            measure_crowds(
                &plan, &progress, name, &url, &locker, &counter, &prefix, &mut s,
            )
            .await;
            locker.close_idle().await;
            report.subjects.push(s);
            continue;
        }
        let client = Client::Lockkit(locker.clone());
        let max_tasks = (*name == "postgres").then_some(PG_MAX_TASKS);
        measure_clients(
            &plan, &progress, &client, &prefix, &mut s, &counter, max_tasks,
        )
        .await;

        // Baselines, at the same concurrencies.
        let tasks: Vec<usize> = plan
            .tasks
            .iter()
            .copied()
            .filter(|&t| max_tasks.is_none_or(|m| t <= m))
            .collect();
        match *name {
            "redis" | "redis-cluster" | "redlock" => {
                if redis_bound.is_none() {
                    let single = std::env::var("LOCKKIT_REDIS_URL").unwrap_or_default();
                    redis_bound = Some(redis_bound_of(&single, &tasks, &plan, &progress).await);
                }
                s.baseline = redis_bound.as_ref().map(|b| b.name.clone());
                if *name != "redis" {
                    s.notes.push(format!(
                        "bound: the single Redis server's ({} sends the same scripts to each of its nodes)",
                        name
                    ));
                }
                if *name == "redlock" {
                    let single = std::env::var("LOCKKIT_REDIS_URL").unwrap_or_default();
                    let _step =
                        progress.step("raw fan-out floor: PING and acquire, 1 node vs all".into());
                    match (counters::hosts(&single).first(), counters::hosts(&url)) {
                        (Some(one), nodes) if nodes.len() > 1 => {
                            match fan_out::floor(one, &nodes, plan.fan_out_rounds).await {
                                Ok(f) => report.fan_out_floor = Some(f),
                                Err(e) => s.errors.push(format!("fan-out floor: {e}")),
                            }
                        }
                        _ => s.errors.push(
                            "fan-out floor: needs LOCKKIT_REDIS_URL and several nodes".into(),
                        ),
                    }
                }
                s.peer = Some(
                    if *name == "redlock" {
                        "rslock (5 nodes)"
                    } else {
                        "rslock (1 node)"
                    }
                    .into(),
                );
            }
            "etcd" => {
                report
                    .bounds
                    .push(etcd_bound(&url, &prefix, &tasks, &plan, &progress).await);
                s.baseline = report.bounds.last().map(|b| b.name.clone());
                s.peer = Some("etcd-v3lock".into());
            }
            "postgres" => {
                report.bounds.extend(pg_bound_first.take());
                s.baseline = report.bounds.last().map(|b| b.name.clone());
                s.peer = Some("pg-advisory-xact".into());
                if plan.tasks.iter().any(|&t| t > PG_MAX_TASKS) {
                    s.notes.push(format!(
                        "uncontended runs up to {PG_MAX_TASKS} tasks: each held lock pins a connection (server max_connections)"
                    ));
                }
            }
            _ => s.peer = Some("rslock (1 node)".into()),
        }

        measure_crowds(
            &plan, &progress, name, &url, &locker, &counter, &prefix, &mut s,
        )
        .await;

        // Many keys held at once.
        let n = if *name == "postgres" {
            plan.pg_many_keys
        } else {
            plan.many_keys
        };
        let step = progress.step(format!("{name}: holding {n} keys at once"));
        s.many_keys = Some(
            scenarios::many_keys(
                &locker,
                &format!("{prefix}/many"),
                n,
                &counter,
                step.ops.clone(),
            )
            .await,
        );
        drop(step);

        // Loss detection, from a second Locker.
        let step = progress.step(format!("{name}: loss detection"));
        let operator = match *name {
            "memory" => Ok(locker.clone()),
            _ => connect(name, &url).await.map(|(l, _, _)| l),
        };
        match operator {
            Ok(op) => {
                s.loss = Some(
                    scenarios::loss(
                        &locker,
                        &op,
                        &prefix,
                        plan.loss_samples,
                        LOSS_TTL,
                        step.ops.clone(),
                    )
                    .await,
                );
            }
            Err(e) => s.errors.push(format!("loss: second locker: {e}")),
        }
        drop(step);
        locker.close_idle().await;
        report.subjects.push(s);
    }
    if others {
        report.paired = paired::all(
            &wanted,
            plan.paired_rounds,
            plan.paired_phase,
            &progress,
            &format!("lab-{run_id}/paired"),
        )
        .await;
        report.paired.extend(
            metrics_overhead::all(
                &wanted,
                plan.paired_rounds,
                plan.paired_phase,
                &progress,
                &format!("lab-{run_id}/paired"),
            )
            .await,
        );
    }
    if !mode_backends.is_empty() {
        let mut backends = Vec::new();
        for name in mode_backends {
            match url_of(name) {
                Ok(url) => backends.push((name, url)),
                Err(e) => {
                    let mut failed = BackendModes::new(name);
                    failed.errors.push(e);
                    report.modes.push(failed);
                }
            }
        }
        report.modes.extend(
            modes::all(
                &backends,
                plan.modes,
                &progress,
                &format!("lab-{run_id}/modes"),
            )
            .await,
        );
    }
    if count_instructions {
        let _step = progress.step("Redis server instructions per pair (callgrind)".into());
        report.server_instructions =
            Some(instructions::measure(plan.instruction_pairs, plan.instruction_depths).await);
    }
    if let Some(b) = redis_bound {
        report.bounds.insert(0, b);
    }
    progress.finish();
    report.wall_s = started.elapsed().as_secs_f64();
    report.machine.steal_pct = ticks_before
        .zip(report::cpu_ticks())
        .and_then(|(before, after)| report::steal_pct(before, after));
    report.finish();
    report.write(&options.out)?;
    Ok(report)
}

/// Uncontended at every concurrency, then contended, for one client.
async fn measure_clients(
    plan: &Plan,
    progress: &Arc<Progress>,
    client: &Client,
    prefix: &str,
    s: &mut Subject,
    counter: &Counter,
    max_tasks: Option<usize>,
) {
    // Warm-up: connections, script caches.
    let step = progress.step(format!("{}: warm-up", s.name));
    let warm = scenarios::uncontended(
        client,
        &format!("{prefix}/warm"),
        16.min(max_tasks.unwrap_or(16)),
        Duration::from_millis(300),
        TTL,
        step.ops.clone(),
    )
    .await;
    drop(step);
    if warm.pairs == 0 {
        s.errors.push(format!(
            "warm-up produced no pair: {}",
            warm.first_error.unwrap_or_else(|| "no error".into())
        ));
        return;
    }
    for &tasks in plan.tasks {
        if max_tasks.is_some_and(|m| tasks > m) {
            continue;
        }
        let step = progress.step(format!("{}: uncontended, {tasks} tasks", s.name));
        let u =
            scenarios::uncontended(client, prefix, tasks, plan.phase, TTL, step.ops.clone()).await;
        if let Some(e) = &u.first_error {
            s.errors.push(format!(
                "uncontended {tasks} tasks: {} errors, first: {e}",
                u.errors
            ));
        }
        s.uncontended.push(u);
    }
    close_idle(client).await;
    for &waiters in plan.waiters {
        let step = progress.step(format!(
            "{}: contended, {waiters} waiters on one key",
            s.name
        ));
        let c = scenarios::contended(
            client,
            &format!("{prefix}/hot{waiters}"),
            waiters,
            plan.contended_phase,
            TTL,
            counter,
            step.ops.clone(),
        )
        .await;
        if let Some(e) = &c.first_error {
            s.errors.push(format!(
                "contended {waiters} waiters: {} errors, first: {e}",
                c.errors
            ));
        }
        s.contended.push(c);
    }
    close_idle(client).await;
}

/// The crowd scenario for one backend: at each of the plan's waiter counts
/// over [`CROWD_CLIENTS`] clients, and for Redlock also over one client at
/// the most waiters (a goal compares the two). Commands per handoff are
/// counted on Redis-family servers only: etcd's and PostgreSQL's counters
/// count other things (messages, transactions) and PostgreSQL's need a
/// second to be read.
#[allow(clippy::too_many_arguments)]
async fn measure_crowds(
    plan: &Plan,
    progress: &Arc<Progress>,
    name: &str,
    url: &str,
    first: &Locker,
    counter: &Counter,
    prefix: &str,
    s: &mut Subject,
) {
    let clients = match crowd_clients(name, url, first).await {
        Ok(clients) => clients,
        Err(e) => {
            s.errors.push(format!("crowd: {e}"));
            return;
        }
    };
    let counter = match counter {
        Counter::Redis(_) => counter,
        _ => &Counter::None,
    };
    let most = plan.crowd_waiters.iter().copied().max().unwrap_or(0);
    let mut runs: Vec<(usize, usize)> = plan
        .crowd_waiters
        .iter()
        .map(|&w| (w, CROWD_CLIENTS))
        .collect();
    if name == "redlock" {
        runs.push((most, 1));
    }
    for (waiters, over) in runs {
        let step = progress.step(format!(
            "{name}: crowd, {waiters} waiters over {over} client(s), {} handoffs",
            plan.crowd_handoffs
        ));
        let c = crowd::crowd(
            &clients[..over],
            &format!("{prefix}/crowd{waiters}x{over}"),
            waiters,
            plan.crowd_handoffs,
            TTL,
            counter,
            step.ops.clone(),
        )
        .await;
        if let Some(e) = &c.first_error {
            s.errors.push(format!(
                "crowd {waiters} waiters over {over} clients: {} errors, first: {e}",
                c.errors
            ));
        }
        s.crowds.push(c);
    }
    for client in &clients[1..] {
        client.close_idle().await;
    }
}

/// [`CROWD_CLIENTS`] clients of a backend, `first` among them: each
/// another `Locker` with connections of its own, as a process of its own
/// would have.
pub(crate) async fn crowd_clients(
    name: &str,
    url: &str,
    first: &Locker,
) -> Result<Vec<Locker>, String> {
    let mut clients = vec![first.clone()];
    while clients.len() < CROWD_CLIENTS {
        // The in-process backend is one lock table: its "clients" share it.
        let next = match name {
            "memory" => Ok(first.clone()),
            _ => connect(name, url).await.map(|(l, _, _)| l),
        };
        match next {
            Ok(l) => clients.push(l),
            Err(e) => return Err(format!("client {}: {e}", clients.len() + 1)),
        }
    }
    Ok(clients)
}

/// The server URL of a lab subject, from its environment variable
/// (`memory://` for the in-process backend).
fn url_of(name: &str) -> Result<String, String> {
    let var = SUBJECTS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, v)| *v);
    if var.is_empty() {
        return Ok("memory://".to_owned());
    }
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => Ok(u),
        _ => Err(format!(
            "{var} is not set (scripts/lab.sh sets it from target/lockkit-servers/urls.env)"
        )),
    }
}

/// Gives back what the client keeps idle, so that none of it expires on
/// the server in the middle of a later measurement: etcd's idle leases
/// (up to 256 after a sweep) would each expire a TTL after their last
/// renewal, a write the leader commits, during whatever runs then.
async fn close_idle(client: &Client) {
    match client {
        Client::Lockkit(locker) | Client::LockkitIn(locker, _) => locker.close_idle().await,
        Client::Peer(peer) => peer.close_idle().await,
        Client::Rslock(_) => {}
    }
}

/// Connects a backend, with its server counter; returns the URL used (redacted).
async fn connect(name: &str, url: &str) -> Result<(Locker, Counter, String), String> {
    let (url, counter) = match name {
        "memory" => (url.to_owned(), Counter::None),
        "redis" | "redis-cluster" | "redlock" => (
            url.to_owned(),
            Counter::Redis(counters::redis_nodes(url).await?),
        ),
        "etcd" => (url.to_owned(), Counter::Etcd(counters::hosts(url))),
        "postgres" => {
            let lab = pg_lab_database(url).await?;
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .connect(&lab)
                .await
                .map_err(|e| format!("{}: {e}", lockkit::url::redact(&lab)))?;
            let sep = if lab.contains('?') { '&' } else { '?' };
            (
                format!("{lab}{sep}max_held_locks=80"),
                Counter::Postgres(pool),
            )
        }
        other => return Err(format!("unknown backend {other}")),
    };
    let locker = lockkit::connect(&url).await.map_err(|e| e.to_string())?;
    Ok((locker, counter, lockkit::url::redact(&url)))
}

/// Creates the lab's own database next to the URL's, and returns its URL.
async fn pg_lab_database(url: &str) -> Result<String, String> {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let lab = format!(
        "{}/{PG_DATABASE}{}",
        &base[..host_end],
        query.map(|q| format!("?{q}")).unwrap_or_default()
    );
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .map_err(|e| format!("{}: {e}", lockkit::url::redact(url)))?;
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(PG_DATABASE)
        .fetch_optional(&pool)
        .await
        .map_err(|e| e.to_string())?;
    if exists.is_none() {
        sqlx::query(&format!("CREATE DATABASE {PG_DATABASE}"))
            .execute(&pool)
            .await
            .map_err(|e| format!("CREATE DATABASE {PG_DATABASE}: {e}"))?;
    }
    pool.close().await;
    // The backend creates its schema at connect; pgbench, which runs first,
    // needs it too.
    let schema = lockkit::connect(&lab)
        .await
        .map_err(|e| format!("creating the lock schema in {PG_DATABASE}: {e}"))?;
    drop(schema);
    Ok(lab)
}

async fn redis_bound_of(
    url: &str,
    tasks: &[usize],
    plan: &Plan,
    progress: &Arc<Progress>,
) -> Bound {
    let mut bound = Bound {
        name: "redis-benchmark".into(),
        method: baseline::redis_method(),
        points: Vec::new(),
        handoffs: Vec::new(),
        errors: Vec::new(),
    };
    let Some(host) = counters::hosts(url).into_iter().next() else {
        bound.errors.push("LOCKKIT_REDIS_URL is not set".into());
        return bound;
    };
    match counters::redis_nodes(url).await {
        Ok(mut nodes) => {
            let loaded = match baseline::load_scripts(&mut nodes[0]).await {
                Ok(()) => baseline::check_acquire_args(&mut nodes[0]).await,
                Err(e) => Err(e),
            };
            if let Err(e) = loaded {
                bound.errors.push(e);
                return bound;
            }
        }
        Err(e) => {
            bound.errors.push(e);
            return bound;
        }
    }
    for &t in tasks {
        let _step = progress.step(format!(
            "redis-benchmark: {t} clients, acquire and release scripts, with and without -P 16"
        ));
        match baseline::redis_point(&host, t, plan.redis_requests).await {
            Ok(p) => bound.points.push(p),
            Err(e) => bound.errors.push(format!("{t} clients: {e}")),
        }
    }
    bound
}

async fn etcd_bound(
    url: &str,
    prefix: &str,
    tasks: &[usize],
    plan: &Plan,
    progress: &Arc<Progress>,
) -> Bound {
    let mut bound = Bound {
        name: "bare etcd RPCs".into(),
        method: baseline::etcd_method(),
        points: Vec::new(),
        handoffs: Vec::new(),
        errors: Vec::new(),
    };
    let endpoints: Vec<String> = counters::hosts(url)
        .iter()
        .map(|h| format!("http://{h}"))
        .collect();
    let client = match etcd_client::Client::connect(&endpoints, None).await {
        Ok(c) => c,
        Err(e) => {
            bound.errors.push(format!("connect: {e}"));
            return bound;
        }
    };
    for &t in tasks {
        let step = progress.step(format!("etcd bare-RPC loop: {t} tasks"));
        match baseline::etcd_point(
            &client,
            &format!("{prefix}/bare"),
            t,
            plan.phase,
            step.ops.clone(),
        )
        .await
        {
            Ok(p) => bound.points.push(p),
            Err(e) => bound.errors.push(format!("{t} tasks: {e}")),
        }
    }
    use etcd_handoff::Writes;
    let floor_prefix = format!("{prefix}/floor");
    for &waiters in plan.waiters {
        for writes in [Writes::Plain, Writes::LockTransactions] {
            let _step = progress.step(format!(
                "etcd {} (handoff floor): {waiters} waiters",
                writes.label()
            ));
            let ring = etcd_handoff::floor(
                &client,
                &floor_prefix,
                waiters,
                plan.contended_phase,
                writes,
            );
            match ring.await {
                Ok((handoff, handoff_curve_us, handoffs_per_s)) => {
                    bound.handoffs.push(baseline::HandoffFloor {
                        waiters,
                        writes,
                        handoffs_per_s,
                        handoff,
                        handoff_curve_us,
                        method: etcd_handoff::method(),
                    })
                }
                Err(e) => bound
                    .errors
                    .push(format!("{}, {waiters} waiters: {e}", writes.label())),
            }
        }
    }
    bound
}

async fn pg_bound(
    url: &str,
    tasks: &[usize],
    plan: &Plan,
    progress: &Arc<Progress>,
    out: &std::path::Path,
) -> Bound {
    let mut bound = Bound {
        name: "pgbench".into(),
        method: baseline::pgbench_method(),
        points: Vec::new(),
        handoffs: Vec::new(),
        errors: Vec::new(),
    };
    let script = out.join("pairs.pgbench.sql");
    if let Err(e) = std::fs::write(&script, baseline::PGBENCH_SQL) {
        bound.errors.push(format!("{}: {e}", script.display()));
        return bound;
    }
    // pgbench takes a libpq URL: without lockkit's own query options.
    let base = url.split('?').next().unwrap_or(url);
    // The script locks rows that exist, as lock-postgres does after a lock's
    // first grant (which inserts its row).
    let clients = tasks.iter().copied().max().unwrap_or(1);
    if let Err(e) = baseline::pgbench_rows(base, clients).await {
        bound.errors.push(e);
        return bound;
    }
    for &t in tasks {
        let _step = progress.step(format!("pgbench: {t} clients"));
        match baseline::pgbench_point(base, &script, t, plan.pgbench_secs).await {
            Ok(p) => bound.points.push(p),
            Err(e) => bound.errors.push(format!("{t} clients: {e}")),
        }
    }
    let _ = std::fs::remove_file(&script);
    bound
}
