//! The modes against the mutex on the same backend: a semaphore's permit
//! and a read hold, for every backend whose capabilities offer them.
//!
//! Throughput: uncontended acquire+release pairs at 64 tasks (a key of its
//! own per task), in paired rounds with the mutex over the same `Locker`
//! (the same connections), so that both see the same machine; the median
//! of the per-round ratios is what the goal checks. Handoffs: the crowd's
//! scene in each mode, with the mutex's at the same number of waiters over
//! the same clients in the same run, since the handoff goal holds a mode
//! only where the mutex meets it.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use lockkit::{Mode, Offer};
use serde::Serialize;

use crate::mode_handoff::{self, Scene};
use crate::progress::Progress;
use crate::report::{Goal, HANDOFF_P99_GOAL_US, paired_outcome};
use crate::subject::Client;
use crate::{Crowd, Metric, Paired};

/// Concurrent tasks in every throughput round.
pub const TASKS: usize = 64;

/// The semaphore measured: 4 permits.
pub const PERMITS: u32 = 4;

/// Each mode's pairs/s is held to at least this share of the mutex's.
pub const PAIRS_GOAL: f64 = 0.7;

/// One writer in this many waiters of the read-write scene; the rest read.
const WRITER_EVERY: usize = 4;

/// How long a handoff scene may run before it stops with what it has.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

/// How long and how much the modes' scenarios run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Paired rounds per mode, and each round's length.
    pub rounds: usize,
    pub phase: Duration,
    /// Waiters in every handoff scene (more than the semaphore's permits).
    pub waiters: usize,
    /// Handoffs counted in each.
    pub handoffs: u64,
}

/// The modes measured, as the report names them.
fn measured() -> [(Mode, &'static str); 2] {
    [
        (Mode::semaphore(PERMITS), "semaphore (4 permits)"),
        (Mode::Shared, "read hold"),
    ]
}

/// One mode on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct ModeRun {
    /// The mode, as the report names it.
    pub mode: String,
    /// Its pairs/s against the mutex's: subject the mode, against the mutex.
    pub pairs: Paired,
    /// Its handoff scene: a semaphore's waiters outnumber its permits; a
    /// read-write lock's are readers and, one in four, writers, whose
    /// grants behind readers are the ones counted.
    pub handoff: Option<Crowd>,
}

/// The modes on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct BackendModes {
    /// The backend, as the lab names it.
    pub backend: String,
    /// The mutex's handoff scene, at the same waiters over the same clients.
    pub mutex_handoff: Option<Crowd>,
    /// The modes it offers, measured.
    pub runs: Vec<ModeRun>,
    /// The modes it refuses, and its reason.
    pub refused: Vec<(String, String)>,
    /// What failed.
    pub errors: Vec<String>,
}

impl BackendModes {
    pub(crate) fn new(backend: &str) -> BackendModes {
        BackendModes {
            backend: backend.into(),
            mutex_handoff: None,
            runs: Vec::new(),
            refused: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// What produced no figures: a connection, a mode without a paired
    /// round, a handoff scene without a handoff.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        let no_handoff = |c: &Option<Crowd>| c.as_ref().is_none_or(|c| c.handoffs == 0);
        // The mutex's scene is the modes' reference: needed where one ran.
        let reference = !self.runs.is_empty() && no_handoff(&self.mutex_handoff);
        if self.runs.is_empty() && self.refused.is_empty() || reference {
            out.push(format!(
                "{} modes: no figures ({})",
                self.backend,
                self.errors.join("; ")
            ));
        }
        for r in &self.runs {
            if r.pairs.ratios.is_empty() || no_handoff(&r.handoff) {
                let why = r.pairs.errors.iter().chain(&self.errors);
                let why: Vec<&str> = why.map(String::as_str).collect();
                out.push(format!(
                    "{} {}: no figures ({})",
                    self.backend,
                    r.mode,
                    why.join("; ")
                ));
            }
        }
        out
    }
}

/// Steps the modes take on `backends` at most (a step per mode offered:
/// its paired rounds, its handoff scene; one for the mutex's).
pub fn planned(backends: usize) -> usize {
    backends * (1 + 2 * measured().len())
}

/// Measures the modes on each backend of `backends` (name, URL).
pub async fn all(
    backends: &[(&str, String)],
    plan: Plan,
    progress: &Arc<Progress>,
    prefix: &str,
) -> Vec<BackendModes> {
    let mut out = Vec::new();
    for (name, url) in backends {
        out.push(on(name, url, plan, progress, &format!("{prefix}/{name}")).await);
    }
    out
}

/// The modes on one backend.
async fn on(
    name: &str,
    url: &str,
    plan: Plan,
    progress: &Arc<Progress>,
    prefix: &str,
) -> BackendModes {
    let mut b = BackendModes::new(name);
    let locker = match crate::connect(name, url).await {
        Ok((locker, ..)) => locker,
        Err(e) => {
            b.errors.push(e);
            return b;
        }
    };
    let offered: Vec<(Mode, &str)> = measured()
        .into_iter()
        .filter(|(mode, label)| match locker.capabilities().offer(mode) {
            Offer::Offered { .. } => true,
            Offer::Refused { reason } => {
                b.refused.push(((*label).into(), reason.into()));
                false
            }
            // A kind of offer this lab does not know: not measured, said so.
            _ => {
                b.refused.push(((*label).into(), "not understood".into()));
                false
            }
        })
        .collect();
    if offered.is_empty() {
        return b;
    }
    // Throughput first: the handoff scenes leave leases that lapse by
    // their TTL, a write on some servers, during whatever runs next.
    let servers = match url.split("://").next() {
        Some(s) if s.starts_with("redis") => crate::counters::redis_nodes(url).await.ok(),
        _ => None,
    };
    let mutex = Client::Lockkit(locker.clone());
    let mutex_name = format!("{name} mutex");
    for &(mode, label) in &offered {
        let _step = progress.step(format!(
            "modes: {name} {label} and the mutex, {TASKS} tasks, paired rounds"
        ));
        let subject = format!("{name} {label}");
        let client = Client::LockkitIn(locker.clone(), mode);
        let mut pairs = crate::paired::run(
            ((&subject, &client), (&mutex_name, &mutex)),
            TASKS,
            Metric::PairsPerSecond,
            plan.rounds,
            plan.phase,
            servers.clone(),
            &format!("{prefix}/pairs-{}", slug(label)),
        )
        .await;
        pairs.client_workers = tokio::runtime::Handle::current().metrics().num_workers();
        b.runs.push(ModeRun {
            mode: label.into(),
            pairs,
            handoff: None,
        });
    }
    locker.close_idle().await;
    let clients = match crate::crowd_clients(name, url, &locker).await {
        Ok(c) => c,
        Err(e) => {
            b.errors.push(format!("handoff clients: {e}"));
            return b;
        }
    };
    let scenes = std::iter::once(("mutex", Scene::mutex(plan.waiters))).chain(offered.iter().map(
        |&(mode, label)| {
            let scene = match mode {
                Mode::Shared => Scene::writers_behind_readers(plan.waiters, WRITER_EVERY),
                _ => Scene::semaphore(PERMITS, plan.waiters),
            };
            (label, scene)
        },
    ));
    for (label, scene) in scenes {
        let _step = progress.step(format!(
            "modes: {name} {label} handoffs, {} waiters over {} clients",
            plan.waiters,
            clients.len()
        ));
        let key = format!("{prefix}/handoff-{}", slug(label));
        let crowd = mode_handoff::run(
            &clients,
            &key,
            &scene,
            plan.handoffs,
            crate::TTL,
            GIVE_UP_AFTER,
        )
        .await;
        if let Some(e) = &crowd.first_error {
            b.errors.push(format!(
                "{label} handoffs: {} errors, first: {e}",
                crowd.errors
            ));
        }
        match b.runs.iter_mut().find(|r| r.mode == label) {
            Some(run) => run.handoff = Some(crowd),
            None => b.mutex_handoff = Some(crowd),
        }
    }
    for client in &clients {
        client.close_idle().await;
    }
    b
}

/// A label as a key segment: "semaphore (4 permits)" is "semaphore-4-permits".
fn slug(label: &str) -> String {
    label
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// The goals: each mode's pairs/s at least [`PAIRS_GOAL`] of the mutex's
/// (paired median); its handoff p99 under 5 ms where the mutex's is.
pub fn goals(backends: &[BackendModes]) -> Vec<Goal> {
    let mut goals = Vec::new();
    for b in backends {
        let mutex_p99 = b
            .mutex_handoff
            .as_ref()
            .filter(|c| c.handoffs > 0)
            .map(|c| c.handoff.p99_us);
        for r in &b.runs {
            let p = &r.pairs;
            let sides = crate::paired::medians(&p.rounds).map_or(String::new(), |(a, m)| {
                format!("; median round {a:.0} vs {m:.0} pairs/s")
            });
            goals.push(Goal {
                goal: format!(
                    "{}: {} pairs/s >= {PAIRS_GOAL}x the mutex's ({TASKS} tasks, paired rounds)",
                    b.backend, r.mode
                ),
                measured: format!("{}{sides}", paired_outcome(p)),
                met: p.median().map(|m| m >= PAIRS_GOAL),
            });
            let p99 = r
                .handoff
                .as_ref()
                .filter(|c| c.handoffs > 0)
                .map(|c| (c.handoff.p99_us, c.waiters));
            let (measured, met) = handoff_verdict(p99.map(|p| p.0), mutex_p99);
            let waiters = p99.map_or(String::new(), |(_, w)| format!(", {w} waiters"));
            let what = match r.mode.as_str() {
                "read hold" => "writers behind readers: handoff",
                _ => "handoff",
            };
            goals.push(Goal {
                goal: format!(
                    "{}: {} {what} p99 < 5 ms where the mutex's is{waiters}",
                    b.backend, r.mode
                ),
                measured,
                met,
            });
        }
    }
    goals
}

/// A mode's handoff p99 against the goal, checked only where the mutex's
/// own p99 in the same run meets it.
fn handoff_verdict(mode_us: Option<f64>, mutex_us: Option<f64>) -> (String, Option<bool>) {
    let ms = |us: f64| format!("{:.2} ms", us / 1e3);
    match (mode_us, mutex_us) {
        (None, _) => ("not measured".into(), None),
        (Some(m), None) => (format!("{} (the mutex: not measured)", ms(m)), None),
        (Some(m), Some(x)) if x < HANDOFF_P99_GOAL_US => (
            format!("{} (the mutex: {})", ms(m), ms(x)),
            Some(m < HANDOFF_P99_GOAL_US),
        ),
        (Some(m), Some(x)) => (
            format!(
                "{} (the mutex: {}, over the goal itself: not checked)",
                ms(m),
                ms(x)
            ),
            None,
        ),
    }
}

/// The modes' table, in Markdown.
pub fn table(backends: &[BackendModes]) -> String {
    if backends.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## Modes: a semaphore's permit and a read hold against the mutex\n\n| backend | mode | pairs/s, median round (mode / mutex) | median ratio | lowest | highest | handoff waiters | handoff p50 | handoff p99 | the mutex's handoff p99 |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let ms = |c: &Crowd| {
        (c.handoffs > 0).then(|| {
            (
                format!("{:.2} ms", c.handoff.p50_us / 1e3),
                format!("{:.2} ms", c.handoff.p99_us / 1e3),
            )
        })
    };
    for b in backends {
        let mutex = b.mutex_handoff.as_ref().and_then(ms).map(|m| m.1);
        for r in &b.runs {
            let p = &r.pairs;
            let rounds = crate::paired::medians(&p.rounds)
                .map_or("—".into(), |(a, m)| format!("{a:.0} / {m:.0}"));
            let (lo, hi) = p.range().map_or(("—".into(), "—".into()), |(l, h)| {
                (format!("{l:.2}x"), format!("{h:.2}x"))
            });
            let (waiters, p50, p99) = match r.handoff.as_ref() {
                Some(c) => {
                    let (p50, p99) = ms(c).unwrap_or(("—".into(), "—".into()));
                    (c.waiters.to_string(), p50, p99)
                }
                None => ("—".into(), "—".into(), "—".into()),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {rounds} | {} | {lo} | {hi} | {waiters} | {p50} | {p99} | {} |",
                b.backend,
                r.mode,
                p.median().map_or("—".into(), |m| format!("{m:.2}x")),
                mutex.as_deref().unwrap_or("—"),
            );
        }
        for (mode, reason) in &b.refused {
            let _ = writeln!(
                md,
                "| {} | {mode} | not offered: {reason} | | | | | | | |",
                b.backend
            );
        }
    }
    md.push('\n');
    md
}

/// How the modes' figures are taken, for the report's notes.
pub const METHOD: &str = "**modes**: for every backend whose capabilities offer the mode, a semaphore of 4 permits and a read hold against the mutex over the same `Locker` (the same connections). Pairs/s: 64 tasks, each taking and releasing a key of its own, in paired rounds with the mutex (the order alternating), the median of the per-round ratios. Handoffs: W waiters on one key over 4 clients, each taking the key in its mode, releasing at once and queueing again, after gathering behind holds that fill the key (all 4 permits; a writer); for the mutex and a semaphore, the time from a release to the grant it let in (each grant paired with the earliest release not yet paired); for a read-write lock, one waiter in four a writer, the time from the release of the last reader to the grant of the writer behind it. The mutex's scene runs at the same waiters over the same clients in the same run; a mode's handoff goal is checked only where the mutex meets it.";

#[cfg(test)]
mod tests {
    use super::*;

    fn crowd(p99_ms: f64, handoffs: u64) -> Crowd {
        Crowd {
            waiters: 16,
            clients: 4,
            handoffs,
            took_s: 1.0,
            handoffs_per_s: handoffs as f64,
            handoff: crate::Latency {
                p99_us: p99_ms * 1e3,
                ..crate::Latency::default()
            },
            commands_per_handoff: None,
            errors: 0,
            first_error: None,
        }
    }

    fn run(mode: &str, ratios: &[f64], p99_ms: f64) -> ModeRun {
        let mut pairs = Paired::new(mode, "mutex", TASKS, Metric::PairsPerSecond);
        pairs.ratios = ratios.to_vec();
        ModeRun {
            mode: mode.into(),
            pairs,
            handoff: Some(crowd(p99_ms, 100)),
        }
    }

    fn met(goals: &[Goal], starting: &str) -> Option<bool> {
        let goal = goals.iter().find(|g| g.goal.starts_with(starting));
        goal.unwrap_or_else(|| panic!("no goal `{starting}` in {goals:?}"))
            .met
    }

    #[test]
    fn goals_check_the_median_ratio_and_the_handoff_where_the_mutex_meets_it() {
        let mut fast = BackendModes::new("redis");
        fast.mutex_handoff = Some(crowd(1.0, 100));
        fast.runs = vec![
            // Median 0.65x, though one round made 0.9x.
            run("semaphore (4 permits)", &[0.3, 0.65, 0.9], 4.9),
            run("read hold", &[0.7, 0.71, 0.72], 5.1),
        ];
        let mut slow = BackendModes::new("etcd");
        slow.mutex_handoff = Some(crowd(9.0, 100));
        slow.runs = vec![run("semaphore (4 permits)", &[0.8, 0.9], 12.0)];
        let goals = goals(&[fast, slow]);
        assert_eq!(
            met(&goals, "redis: semaphore (4 permits) pairs/s"),
            Some(false)
        );
        assert_eq!(
            met(&goals, "redis: semaphore (4 permits) handoff"),
            Some(true)
        );
        assert_eq!(met(&goals, "redis: read hold pairs/s"), Some(true));
        assert_eq!(met(&goals, "redis: read hold writers"), Some(false));
        assert_eq!(
            met(&goals, "etcd: semaphore (4 permits) pairs/s"),
            Some(true)
        );
        // The mutex misses 5 ms there: shown, not checked.
        assert_eq!(met(&goals, "etcd: semaphore (4 permits) handoff"), None);
        let etcd = goals
            .iter()
            .find(|g| g.goal.starts_with("etcd: semaphore (4 permits) handoff"));
        assert_eq!(
            etcd.map(|g| g.measured.as_str()),
            Some("12.00 ms (the mutex: 9.00 ms, over the goal itself: not checked)")
        );
        for g in &goals {
            assert_eq!(
                crate::report::goal_owner(&g.goal),
                g.goal.split(':').next().unwrap_or_default()
            );
        }
    }

    #[test]
    fn a_mode_without_rounds_or_handoffs_is_a_failure() {
        let mut b = BackendModes::new("memory");
        b.mutex_handoff = Some(crowd(0.1, 100));
        b.runs = vec![run("read hold", &[0.9], 0.1)];
        assert!(b.failures().is_empty(), "{:?}", b.failures());
        b.runs[0].handoff = Some(crowd(0.1, 0));
        assert_eq!(b.failures(), ["memory read hold: no figures ()"]);
        b.runs[0].handoff = Some(crowd(0.1, 10));
        b.runs[0].pairs.ratios.clear();
        b.runs[0].pairs.errors.push("subject: refused".into());
        assert_eq!(
            b.failures(),
            ["memory read hold: no figures (subject: refused)"]
        );
        // A backend that offers neither mode has nothing to measure.
        let mut none = BackendModes::new("redlock");
        none.refused.push(("read hold".into(), "not built".into()));
        assert!(none.failures().is_empty(), "{:?}", none.failures());
        none.refused.clear();
        none.errors.push("connect: refused".into());
        assert_eq!(
            none.failures(),
            ["redlock modes: no figures (connect: refused)"]
        );
    }

    #[test]
    fn labels_become_key_segments() {
        assert_eq!(slug("semaphore (4 permits)"), "semaphore-4-permits");
        assert_eq!(slug("read hold"), "read-hold");
    }

    /// The whole scenario on the in-process backend: every mode it offers
    /// gets paired rounds and handoffs, each counted grant a handoff.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_memory_backend_gets_figures_in_every_mode() {
        let plan = Plan {
            rounds: 2,
            phase: Duration::from_millis(100),
            waiters: 12,
            handoffs: 40,
        };
        let progress = Progress::new(planned(1));
        let b = on("memory", "memory://", plan, &progress, "modes-test").await;
        assert!(b.errors.is_empty(), "{:?}", b.errors);
        assert!(b.failures().is_empty(), "{:?}", b.failures());
        assert_eq!(
            b.runs.iter().map(|r| r.mode.as_str()).collect::<Vec<_>>(),
            ["semaphore (4 permits)", "read hold"]
        );
        for r in b.runs.iter() {
            assert_eq!(r.pairs.ratios.len(), 2, "{}: {:?}", r.mode, r.pairs.errors);
            assert!(r.pairs.rounds.iter().all(|&(a, m)| a > 0.0 && m > 0.0));
            let c = r.handoff.as_ref().expect("a handoff scene");
            assert_eq!(c.errors, 0, "{}: {:?}", r.mode, c.first_error);
            assert!(c.handoffs >= 40, "{}: {} handoffs", r.mode, c.handoffs);
            // One gap per counted grant (those after the count's end too).
            assert!(c.handoff.samples as u64 >= c.handoffs, "{}", r.mode);
            assert!(
                c.handoff.p99_us > 0.0 && c.handoff.p99_us < 1e6,
                "{}",
                r.mode
            );
        }
        let mutex = b.mutex_handoff.as_ref().expect("the mutex's scene");
        assert!(mutex.handoffs >= 40, "{:?}", mutex.first_error);
    }
}
