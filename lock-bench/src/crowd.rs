//! The crowd: W waiters on one key, spread over C clients (each a `Locker`
//! with connections of its own, as a process of its own would have; tasks
//! in this one process), every waiter taking the lock, releasing it at
//! once and queueing again. What it shows is how a handoff's cost grows
//! with the crowd: server commands per handoff (Redis-family servers count
//! them), the handoff latency, and the time the handoffs took.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit::{Locker, Wait};
use serde::Serialize;
use tokio::sync::{Mutex, Notify};

use std::fmt::Write as _;

use crate::counters::Counter;
use crate::report::{Goal, Subject};
use crate::stats::{Latency, nanos};

/// One crowd run.
#[derive(Debug, Clone, Serialize)]
pub struct Crowd {
    /// Waiting tasks.
    pub waiters: usize,
    /// Clients the waiters are spread over (round robin).
    pub clients: usize,
    /// Handoffs measured (grants after the gathering holder's release).
    pub handoffs: u64,
    /// Seconds from the gathering holder's release to the last counted grant.
    pub took_s: f64,
    /// Handoffs per second.
    pub handoffs_per_s: f64,
    /// Time from the start of a release to the next holder's grant.
    pub handoff: Latency,
    /// Server commands per handoff, where the server counts them (Redis,
    /// Redis Cluster, Redlock: `INFO commandstats`, summed over the nodes).
    pub commands_per_handoff: Option<f64>,
    /// Failed acquires and releases.
    pub errors: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
}

/// What the waiters share.
struct Shared {
    handoffs: u64,
    granted: AtomicU64,
    stop: AtomicBool,
    done: Notify,
    /// When the last release started, and the handoff gaps seen so far.
    last_release: Mutex<(Option<Instant>, Vec<u64>)>,
    errors: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl Shared {
    fn failed(&self, e: impl ToString) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| e.to_string());
    }
}

/// How long one crowd run may take before it stops with what it has: a
/// crowd that cannot finish (a backend that stalls) reports its figures
/// and an error rather than holding up the lab.
const GIVE_UP_AFTER: Duration = Duration::from_secs(180);

/// `waiters` tasks over `clients` (round robin) on one `key`, until
/// `handoffs` grants; server commands counted by `counter`
/// ([`Counter::None`] where the server counts none worth comparing).
pub async fn crowd(
    clients: &[Locker],
    key: &str,
    waiters: usize,
    handoffs: u64,
    ttl: Duration,
    counter: &Counter,
    ops: Arc<AtomicU64>,
) -> Crowd {
    let shared = Arc::new(Shared {
        handoffs,
        granted: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        done: Notify::new(),
        last_release: Mutex::default(),
        errors: AtomicU64::new(0),
        first_error: Default::default(),
    });
    let mut outcome = Crowd {
        waiters,
        clients: clients.len(),
        handoffs: 0,
        took_s: 0.0,
        handoffs_per_s: 0.0,
        handoff: Latency::default(),
        commands_per_handoff: None,
        errors: 0,
        first_error: None,
    };
    // A holder keeps the key while the crowd gathers, so that every waiter
    // is in line when the count starts. The key is new: a wait only rides
    // out servers still busy with an earlier run's crowd leaving.
    let holder = match clients[0]
        .acquire(key, ttl, Wait::at_most(GIVE_UP_AFTER))
        .await
    {
        Ok(lease) => lease,
        Err(e) => {
            outcome.errors = 1;
            outcome.first_error = Some(format!("the gathering holder: {e}"));
            return outcome;
        }
    };
    let tasks: Vec<_> = (0..waiters)
        .map(|i| {
            let locker = clients[i % clients.len()].clone();
            let (key, shared, ops) = (key.to_owned(), shared.clone(), ops.clone());
            tokio::spawn(async move { wait_in_turn(&locker, &key, ttl, &shared, &ops).await })
        })
        .collect();
    // Every waiter has made its first attempts (and joined the line where
    // there is one) by then: measured as the crowd's own start-up cost on a
    // loaded 2-CPU machine, with room to spare.
    tokio::time::sleep(Duration::from_millis(500 + waiters as u64 * 2)).await;
    let before = counter.snapshot().await;
    let started = Instant::now();
    shared.last_release.lock().await.0 = Some(started);
    if let Err(e) = clients[0].release(holder).await {
        // A node set under load may answer the release too late for a
        // quorum; the operator's release frees the key rather than its TTL,
        // which would stall the count.
        shared.failed(format!("the gathering holder's release: {e}"));
        if let Err(e) = clients[0].force_release(key).await {
            shared.failed(format!("force-releasing the gathering holder: {e}"));
        }
    }
    let finished = shared.done.notified();
    if shared.granted.load(Ordering::Relaxed) < handoffs
        && tokio::time::timeout(GIVE_UP_AFTER, finished).await.is_err()
    {
        shared.failed(format!(
            "{} of {handoffs} handoffs in {GIVE_UP_AFTER:?}; stopped there",
            shared.granted.load(Ordering::Relaxed)
        ));
    }
    let took = started.elapsed();
    let in_time = shared.granted.load(Ordering::Relaxed);
    let after = counter.snapshot().await;
    // The handoffs while the counters were read count too: their commands do.
    let counted = shared.granted.load(Ordering::Relaxed);
    shared.stop.store(true, Ordering::Relaxed);
    // The waiters still in line are dropped: each leaves the line (in the
    // background), and a lease held now lapses by its TTL on a key no other
    // run uses.
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    let gaps = std::mem::take(&mut shared.last_release.lock().await.1);
    let total: u64 = Counter::delta(&before, &after).values().sum();
    outcome.handoffs = in_time;
    outcome.took_s = took.as_secs_f64();
    outcome.handoffs_per_s = in_time as f64 / took.as_secs_f64().max(1e-9);
    outcome.handoff = Latency::of(&gaps).0;
    outcome.commands_per_handoff =
        (counter.counts() && counted > 0 && total > 0).then(|| total as f64 / counted as f64);
    outcome.errors = shared.errors.load(Ordering::Relaxed);
    outcome.first_error = shared
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    outcome
}

/// One waiter: take the lock, note the handoff, release, queue again.
async fn wait_in_turn(locker: &Locker, key: &str, ttl: Duration, shared: &Shared, ops: &AtomicU64) {
    while !shared.stop.load(Ordering::Relaxed) {
        let lease = match locker.acquire(key, ttl, Wait::at_most(GIVE_UP_AFTER)).await {
            Ok(lease) => lease,
            Err(e) => {
                shared.failed(e);
                continue;
            }
        };
        let granted_at = Instant::now();
        ops.fetch_add(1, Ordering::Relaxed);
        let mut last = shared.last_release.lock().await;
        // A grant before the gathering holder's release is the holder's own
        // retry path, not a handoff; none is expected.
        if let Some(released) = last.0.take() {
            last.1.push(nanos(granted_at - released));
            let granted = shared.granted.fetch_add(1, Ordering::Relaxed) + 1;
            if granted == shared.handoffs {
                shared.done.notify_one();
            }
        }
        last.0 = Some(Instant::now());
        drop(last);
        if let Err(e) = locker.release(lease).await {
            shared.failed(e);
        }
    }
}

/// The crowd goals: commands per handoff at the most waiters at most this
/// many times those at the fewest (Redis, Redis Cluster, Redlock).
pub(crate) const COMMANDS_GROWTH_GOAL: f64 = 1.5;

/// Redlock's handoffs over several clients take at most this many times
/// those over one.
pub(crate) const REDLOCK_CLIENTS_GOAL: f64 = 2.0;

/// The crowd's goals, checked, for the subjects that ran it.
pub fn goals(subjects: &[Subject]) -> Vec<Goal> {
    let mut goals = Vec::new();
    for name in ["redis", "redis-cluster", "redlock"] {
        let Some(s) = subjects.iter().find(|s| s.name == name) else {
            continue;
        };
        let over = |c: &&Crowd| c.clients == crate::CROWD_CLIENTS;
        let fewest = s.crowds.iter().filter(over).min_by_key(|c| c.waiters);
        let most = s.crowds.iter().filter(over).max_by_key(|c| c.waiters);
        let (Some(fewest), Some(most)) = (fewest, most) else {
            continue;
        };
        let clients = crate::CROWD_CLIENTS;
        let growth = match (most.commands_per_handoff, fewest.commands_per_handoff) {
            (Some(m), Some(f)) if f > 0.0 && most.waiters > fewest.waiters => Some((m, f)),
            _ => None,
        };
        goals.push(Goal {
            goal: format!(
                "{name}: crowd commands per handoff at {} waiters <= {COMMANDS_GROWTH_GOAL}x at {} ({clients} clients)",
                most.waiters, fewest.waiters
            ),
            measured: growth.map_or("not measured".into(), |(m, f)| {
                format!("{:.2}x ({m:.1} vs {f:.1} commands)", m / f)
            }),
            met: growth.map(|(m, f)| m / f <= COMMANDS_GROWTH_GOAL),
        });
        if name != "redlock" {
            let p99 = (most.handoffs > 0).then_some(most.handoff.p99_us);
            goals.push(Goal {
                goal: format!(
                    "{name}: crowd handoff p99 at {} waiters < 5 ms ({clients} clients)",
                    most.waiters
                ),
                measured: p99.map_or("not measured".into(), |p| format!("{:.2} ms", p / 1e3)),
                met: p99.map(|p| p < crate::report::HANDOFF_P99_GOAL_US),
            });
        } else {
            let alone = s
                .crowds
                .iter()
                .find(|c| c.clients == 1 && c.waiters == most.waiters);
            let times = alone.and_then(|one| {
                (one.handoffs_per_s > 0.0 && most.handoffs_per_s > 0.0)
                    .then(|| (1.0 / most.handoffs_per_s, 1.0 / one.handoffs_per_s))
            });
            goals.push(Goal {
                goal: format!(
                    "Redlock (5 nodes): crowd of {} waiters, time per handoff over {clients} clients <= {REDLOCK_CLIENTS_GOAL}x over 1",
                    most.waiters
                ),
                measured: times.map_or("not measured".into(), |(many, one)| {
                    format!(
                        "{:.2}x ({:.2} ms vs {:.2} ms per handoff)",
                        many / one,
                        many * 1e3,
                        one * 1e3
                    )
                }),
                met: times.map(|(many, one)| many / one <= REDLOCK_CLIENTS_GOAL),
            });
        }
    }
    goals
}

/// The crowd table, in Markdown.
pub fn table(subjects: &[Subject]) -> String {
    let mut md = String::from(
        "## Crowd: W waiters on one key over C clients\n\n| backend | waiters | clients | handoffs | took | handoffs/s | handoff p50 | handoff p99 | commands per handoff |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut any = false;
    for s in subjects {
        for c in &s.crowds {
            any = true;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.2} s | {:.0} | {:.2} ms | {:.2} ms | {} |",
                s.name,
                c.waiters,
                c.clients,
                c.handoffs,
                c.took_s,
                c.handoffs_per_s,
                c.handoff.p50_us / 1e3,
                c.handoff.p99_us / 1e3,
                c.commands_per_handoff
                    .map_or("—".into(), |n| format!("{n:.1}")),
            );
        }
    }
    md.push('\n');
    if any { md } else { String::new() }
}

/// How the crowd's figures are taken, for the report's notes.
pub const METHOD: &str = "**crowd**: W tasks on one key, spread round robin over C clients (each a `Locker` with connections of its own, as a process of its own would have; the tasks run in the lab's one process), each taking the lock, releasing it at once and queueing again. A holder keeps the key while the crowd gathers (0.5 s + 2 ms per waiter); the count starts at its release and ends at the H-th grant. Took: that time; handoff: from the start of a release to the next grant; commands per handoff: `INFO commandstats` deltas summed over the nodes (commands inside scripts count), divided by the grants, on Redis-family servers only (the in-process backend, etcd and PostgreSQL count none comparable). The memory backend's clients are one `Locker` (its lock table is in the process).";

#[cfg(test)]
mod tests {
    use super::*;

    fn run(waiters: usize, clients: usize, per_s: f64, p99_ms: f64, commands: f64) -> Crowd {
        Crowd {
            waiters,
            clients,
            handoffs: 1000,
            took_s: 1000.0 / per_s,
            handoffs_per_s: per_s,
            handoff: Latency {
                p99_us: p99_ms * 1e3,
                ..Latency::default()
            },
            commands_per_handoff: Some(commands),
            errors: 0,
            first_error: None,
        }
    }

    fn subject(name: &str, crowds: Vec<Crowd>) -> Subject {
        Subject {
            crowds,
            ..Subject::new(name, "backend", "")
        }
    }

    fn met(goals: &[Goal], starting: &str) -> Option<bool> {
        let goal = goals.iter().find(|g| g.goal.starts_with(starting));
        goal.unwrap_or_else(|| panic!("no goal `{starting}` in {goals:?}"))
            .met
    }

    #[test]
    fn goals_compare_the_most_waiters_with_the_fewest_and_redlock_with_one_client() {
        let goals = goals(&[
            subject(
                "redis",
                vec![run(4, 4, 900.0, 1.0, 30.0), run(1000, 4, 900.0, 6.0, 44.0)],
            ),
            subject(
                "redis-cluster",
                vec![run(1000, 4, 900.0, 4.0, 46.0), run(4, 4, 900.0, 1.0, 30.0)],
            ),
            subject(
                "redlock",
                vec![
                    run(4, 4, 500.0, 2.0, 100.0),
                    run(1000, 4, 100.0, 9.0, 400.0),
                    // Over one client: not the count the growth compares.
                    run(1000, 1, 250.0, 9.0, 100.0),
                ],
            ),
        ]);
        assert_eq!(met(&goals, "redis: crowd commands"), Some(true)); // 1.47x
        assert_eq!(met(&goals, "redis: crowd handoff p99"), Some(false)); // 6 ms
        assert_eq!(met(&goals, "redis-cluster: crowd commands"), Some(false)); // 1.53x
        assert_eq!(met(&goals, "redis-cluster: crowd handoff p99"), Some(true));
        assert_eq!(met(&goals, "redlock: crowd commands"), Some(false)); // 4x
        // 10 ms per handoff over 4 clients against 4 ms over 1: 2.5x.
        let redlock = goals
            .iter()
            .find(|g| g.goal.starts_with("Redlock"))
            .unwrap();
        assert_eq!(redlock.met, Some(false));
        assert!(
            redlock.measured.starts_with("2.50x"),
            "{}",
            redlock.measured
        );
        assert_eq!(goal_of(&redlock.goal), "redlock");
    }

    #[test]
    fn a_backend_that_ran_no_crowd_has_no_crowd_goal() {
        assert!(goals(&[subject("redis", Vec::new())]).is_empty());
    }

    fn goal_of(goal: &str) -> String {
        crate::report::goal_owner(goal)
    }
}
