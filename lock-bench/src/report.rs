//! The report: raw figures (JSON), Markdown tables, goals, and the plots.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::baseline::{Bound, BoundPoint};
use crate::scenarios::{Contended, Loss, ManyKeys, Uncontended};
use crate::{ClientRuntime, Mode};

/// The machine the lab ran on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// Operating system.
    pub os: String,
    /// Kernel release.
    pub kernel: String,
    /// Server versions, as reported by the tools.
    pub servers: String,
    /// Share of CPU time the hypervisor gave to other guests during the run
    /// (`steal` in /proc/stat), percent: high values mean a noisy neighbour
    /// slowed this run, and its figures spread more than usual.
    pub steal_pct: Option<f64>,
}

/// CPU time counters since boot, from /proc/stat: (steal, total) in ticks.
pub fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice,
    // already counted in user and nice].
    let steal = *fields.get(7)?;
    Some((steal, fields.iter().take(8).sum()))
}

/// Steal between two `cpu_ticks` readings, percent of all CPU time.
pub fn steal_pct(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let total = after.1.checked_sub(before.1).filter(|&t| t > 0)?;
    Some(after.0.saturating_sub(before.0) as f64 * 100.0 / total as f64)
}

/// Reads the machine's description from /proc and the tools.
pub async fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let memory_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|l| l.trim_matches('"').to_owned())
        .unwrap_or_default();
    let mut servers = Vec::new();
    for (tool, arg) in [
        ("redis-server", "--version"),
        ("etcd", "--version"),
        ("pgbench", "--version"),
    ] {
        if let Ok(out) = tokio::process::Command::new(tool).arg(arg).output().await {
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(line) = text.lines().next() {
                servers.push(line.trim().to_owned());
            }
        }
    }
    Machine {
        cpu,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib,
        os,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
        servers: servers.join("; "),
        steal_pct: None,
    }
}

/// The goal on handoffs: p99 under 5 ms, in µs (the plot draws it too).
pub(crate) const HANDOFF_P99_GOAL_US: f64 = 5000.0;

/// The goal on Redis: at least this share of the pipelined redis-benchmark
/// bound at 64 tasks (the plot draws it too).
pub(crate) const REDIS_SHARE_OF_PIPELINED_BOUND: f64 = 0.8;

/// One measured library: a lockkit backend or the peer.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Subject {
    /// Its name in tables.
    pub name: String,
    /// `backend` or `peer`.
    pub kind: String,
    /// Where it ran (passwords and queries removed).
    pub url: String,
    /// How waiters are woken.
    pub wake_up: Option<String>,
    /// Whether it has wake-ups (not only polling).
    pub has_wake_up: bool,
    /// The bound its throughput is compared with.
    pub baseline: Option<String>,
    /// The peer it is compared with.
    pub peer: Option<String>,
    /// Uncontended pairs, per concurrency.
    pub uncontended: Vec<Uncontended>,
    /// Contended handoffs, per waiter count.
    pub contended: Vec<Contended>,
    /// Many keys held at once.
    pub many_keys: Option<ManyKeys>,
    /// Loss detection.
    pub loss: Option<Loss>,
    /// Many waiters on one key over several clients.
    pub crowds: Vec<crate::Crowd>,
    /// Remarks on how its figures were taken.
    pub notes: Vec<String>,
    /// What failed.
    pub errors: Vec<String>,
}

impl Subject {
    /// An empty subject.
    pub fn new(name: &str, kind: &str, url: &str) -> Subject {
        Subject {
            name: name.into(),
            kind: kind.into(),
            url: url.into(),
            ..Subject::default()
        }
    }

    /// A subject that could not be measured.
    pub fn failed(name: &str, error: String) -> Subject {
        Subject {
            name: name.into(),
            errors: vec![error],
            ..Subject::default()
        }
    }

    fn at(&self, tasks: usize) -> Option<&Uncontended> {
        self.uncontended.iter().find(|u| u.tasks == tasks)
    }
}

/// One goal and where the run stands.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// The goal.
    pub goal: String,
    /// What was measured.
    pub measured: String,
    /// Met, missed, or not measured (`None`).
    pub met: Option<bool>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Quick or full.
    pub mode: Mode,
    /// Where it ran.
    pub machine: Machine,
    /// Start, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Backends and peers.
    pub subjects: Vec<Subject>,
    /// The servers' bounds.
    pub bounds: Vec<Bound>,
    /// Redlock's latency floor: one round to all its nodes against one round
    /// to the single server, with no client library.
    pub fan_out_floor: Option<crate::fan_out::FanOutFloor>,
    /// Two clients measured in turns, for the goals that compare them.
    pub paired: Vec<crate::Paired>,
    /// The Redis server's instructions per pair, by client.
    pub server_instructions: Option<crate::ServerInstructions>,
    /// The goals, checked.
    pub goals: Vec<Goal>,
    /// Only the crowd scenario ran (`--crowd-only`).
    pub crowd_only: bool,
    /// The modes against the mutex, per backend.
    pub modes: Vec<crate::BackendModes>,
    /// Only the modes ran (`--modes-only`).
    pub modes_only: bool,
}

fn rate(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn us(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.0} ms", x / 1000.0)
    } else if x >= 1000.0 {
        format!("{:.2} ms", x / 1000.0)
    } else {
        format!("{x:.0} µs")
    }
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 && a > 0.0 => format!("{:.2}x", a / b),
        _ => "—".into(),
    }
}

fn bytes(x: f64) -> String {
    // A growth measured as a difference can come out below zero when other
    // memory was freed meanwhile: nothing measurable, not a saving.
    if x < 0.0 {
        return "≈ 0 B".into();
    }
    if x >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", x / 1024.0 / 1024.0)
    } else if x >= 1024.0 {
        format!("{:.1} KiB", x / 1024.0)
    } else {
        format!("{x:.0} B")
    }
}

impl Report {
    /// An empty report.
    pub fn new(mode: Mode, machine: Machine) -> Report {
        Report {
            mode,
            machine,
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            wall_s: 0.0,
            subjects: Vec::new(),
            bounds: Vec::new(),
            fan_out_floor: None,
            paired: Vec::new(),
            server_instructions: None,
            goals: Vec::new(),
            crowd_only: false,
            modes: Vec::new(),
            modes_only: false,
        }
    }

    /// What produced no figures, or not all of its own, with why: a
    /// subject without figures, and a baseline without points or missing
    /// any of its points or handoff floors.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.subjects {
            let no_crowd = !s.crowds.is_empty() && s.crowds.iter().any(|c| c.handoffs == 0);
            let missing = if self.crowd_only {
                s.crowds.is_empty() || no_crowd
            } else if s.kind == "peer" {
                s.uncontended.is_empty() || s.contended.is_empty()
            } else {
                s.uncontended.is_empty()
                    || s.contended.iter().all(|c| c.grants == 0)
                    || s.many_keys.as_ref().is_none_or(|m| m.held == 0)
                    || s.loss.as_ref().is_none_or(|l| l.samples_ms.is_empty())
                    || no_crowd
            };
            if missing {
                out.push(format!("{}: no figures ({})", s.name, s.errors.join("; ")));
            }
        }
        for b in &self.bounds {
            if b.points.is_empty() {
                out.push(format!("{}: no figures ({})", b.name, b.errors.join("; ")));
            } else if !b.errors.is_empty() {
                // A missing point or handoff floor is a missing figure too.
                out.push(format!("{}: {}", b.name, b.errors.join("; ")));
            }
        }
        out.extend(self.modes.iter().flat_map(|m| m.failures()));
        if let Some(i) = &self.server_instructions
            && i.points.is_empty()
        {
            let why = i.error.as_deref().unwrap_or("no point counted");
            out.push(format!("server instructions: no figures ({why})"));
        }
        out
    }

    fn subject(&self, name: &str) -> Option<&Subject> {
        self.subjects.iter().find(|s| s.name == name)
    }

    fn bound_at(&self, name: Option<&str>, tasks: usize) -> Option<&BoundPoint> {
        let b = self.bounds.iter().find(|b| Some(b.name.as_str()) == name)?;
        b.points.iter().find(|p| p.tasks == tasks)
    }

    /// The handoff floors of `s`'s server, measured with no library.
    fn handoff_floors(&self, s: &Subject) -> &[crate::baseline::HandoffFloor] {
        s.baseline
            .as_deref()
            .and_then(|name| self.bounds.iter().find(|b| b.name == name))
            .map_or(&[], |b| b.handoffs.as_slice())
    }

    fn peer_at(&self, s: &Subject, tasks: usize) -> Option<&Uncontended> {
        self.subject(s.peer.as_deref()?)?.at(tasks)
    }

    /// Checks the goals.
    pub fn finish(&mut self) {
        let mut goals = Vec::new();
        let pairs = |s: Option<&Subject>, t: usize| s.and_then(|s| s.at(t)).map(|u| u.pairs_per_s);
        let redis = self.subject("redis");
        let r64 = pairs(redis, 64);
        let bound64 = self
            .bound_at(Some("redis-benchmark"), 64)
            .and_then(|b| b.pipelined_pairs_per_s);
        let check = |goal: &str, value: Option<f64>, min: f64, what: String| Goal {
            goal: goal.into(),
            measured: value.map_or("not measured".into(), |v| format!("{v:.2}x ({what})")),
            met: value.map(|v| v >= min),
        };
        let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        // A goal comparing two clients checks their paired rounds when
        // there are some, and shows the sweep's figures beside them.
        let paired_of = |goal: Goal,
                         subject: &str,
                         against: &str,
                         tasks: Option<usize>,
                         metric: Option<crate::paired::Metric>,
                         met: &dyn Fn(f64) -> bool| {
            let of_pair = |p: &&crate::Paired| {
                p.subject == subject
                    && p.against == against
                    && tasks.is_none_or(|t| p.tasks == t)
                    && metric.is_none_or(|m| p.metric == m)
            };
            let Some(checked) = self
                .paired
                .iter()
                .filter(of_pair)
                .find(|p| p.runtime == ClientRuntime::Lab)
            else {
                return goal;
            };
            // The same pair on a runtime of its own, if it ran: shown, not
            // checked (the goal holds on the lab's runtime, like every
            // other figure).
            let elsewhere: String = self
                .paired
                .iter()
                .filter(of_pair)
                .filter(|p| p.runtime != ClientRuntime::Lab)
                .map(|p| {
                    let on = p.runtime.describe(p.client_workers);
                    format!("; on {on}, not checked: {}", paired_outcome(p))
                })
                .collect();
            let on = checked.runtime.describe(checked.client_workers);
            let (checks, met) = match checked.median() {
                Some(median) => ("checked", Some(met(median))),
                None => ("so the sweep's figure is checked", goal.met),
            };
            Goal {
                measured: format!(
                    "{} on {on}, {checks}{elsewhere}; one after the other in the sweep: {}",
                    paired_outcome(checked),
                    goal.measured
                ),
                met,
                goal: goal.goal,
            }
        };
        let paired = |goal: Goal, subject: &str, against: &str, met: &dyn Fn(f64) -> bool| {
            paired_of(goal, subject, against, None, None, met)
        };
        let paired_at =
            |goal: Goal, subject: &str, against: &str, tasks: usize, met: &dyn Fn(f64) -> bool| {
                let metric = Some(crate::paired::Metric::PairsPerSecond);
                paired_of(goal, subject, against, Some(tasks), metric, met)
            };
        // Pairs per second at `tasks` tasks, at least `min` times the peer's.
        let versus_peer_at = |goal: &str, subject: &str, peer: &str, tasks: usize, min: f64| {
            let (a, b) = (
                pairs(self.subject(subject), tasks),
                pairs(self.subject(peer), tasks),
            );
            let what = format!(
                "{} vs {} pairs/s",
                rate(a.unwrap_or(0.0)),
                rate(b.unwrap_or(0.0))
            );
            let goal = check(goal, div(a, b), min, what);
            paired_at(goal, subject, peer, tasks, &|m| m >= min)
        };
        let versus_peer = |goal: &str, subject: &str, peer: &str, min: f64| {
            versus_peer_at(goal, subject, peer, 64, min)
        };
        goals.push(check(
            "Redis: >= 0.8 of the pipelined redis-benchmark bound at 64 tasks",
            div(r64, bound64),
            REDIS_SHARE_OF_PIPELINED_BOUND,
            format!(
                "{} vs {} pairs/s",
                rate(r64.unwrap_or(0.0)),
                rate(bound64.unwrap_or(0.0))
            ),
        ));
        goals.push(versus_peer(
            "Redis: >= 1.3x rslock (1 node) at 64 tasks",
            "redis",
            "rslock (1 node)",
            1.3,
        ));
        let redlock = self.subject("redlock");
        let p50 = |s: Option<&Subject>, t: usize| s.and_then(|s| s.at(t)).map(|u| u.acquire.p50_us);
        let (rl, rd) = (p50(redlock, 1), p50(redis, 1));
        let lat = div(rl, rd);
        let latency_goal = Goal {
            goal: "Redlock (5 nodes): p50 acquire latency <= 1.5x single Redis (1 task)".into(),
            measured: lat.map_or("not measured".into(), |v| {
                let floor = self.fan_out_floor.as_ref().map_or(String::new(), |f| {
                    format!(
                        "; the servers alone, raw sockets, until a majority answered and until all {n} did: {:.2}x and {:.2}x for this acquire ({} and {} vs {}), {:.2}x and {:.2}x for PING ({} and {} vs {})",
                        f.script_majority_ratio(),
                        f.script_ratio(),
                        us(f.script_majority_p50_us),
                        us(f.script_fan_out_p50_us),
                        us(f.script_single_p50_us),
                        f.majority_ratio(),
                        f.ratio(),
                        us(f.majority_p50_us),
                        us(f.fan_out_p50_us),
                        us(f.single_p50_us),
                        n = f.nodes,
                    )
                });
                format!(
                    "{v:.2}x ({} vs {}{floor})",
                    us(rl.unwrap_or(0.0)),
                    us(rd.unwrap_or(0.0))
                )
            }),
            met: lat.map(|v| v <= 1.5),
        };
        goals.push(paired(latency_goal, "redlock", "redis", &|m| m <= 1.5));
        goals.push(versus_peer(
            "Redlock (5 nodes): >= 1.5x rslock (5 nodes) pairs/s at 64 tasks",
            "redlock",
            "rslock (5 nodes)",
            1.5,
        ));
        for tasks in [1, 64] {
            goals.push(versus_peer_at(
                &format!(
                    "etcd: >= 1.0x etcd's lock service (v3lock) pairs/s at {tasks} task{}",
                    if tasks == 1 { "" } else { "s" }
                ),
                "etcd",
                "etcd-v3lock",
                tasks,
                1.0,
            ));
        }
        if let (Some(etcd), Some(v3lock)) = (self.subject("etcd"), self.subject("etcd-v3lock")) {
            let lead: Vec<(usize, f64, f64)> = etcd
                .contended
                .iter()
                .filter_map(|c| {
                    let peer = v3lock.contended.iter().find(|p| p.waiters == c.waiters)?;
                    Some((c.waiters, c.grants_per_s, peer.grants_per_s))
                })
                .collect();
            let worst = lead
                .iter()
                .filter(|(_, _, b)| *b > 0.0)
                .map(|(w, a, b)| (a / b, *w))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            goals.push(Goal {
                goal: "etcd: handoff grants/s >= 2x etcd's lock service (v3lock) at every waiter count".into(),
                measured: if lead.is_empty() {
                    "not measured".into()
                } else {
                    lead.iter()
                        .map(|(w, a, b)| {
                            format!("{w} waiters: {:.2}x ({} vs {} grants/s)", a / b.max(f64::MIN_POSITIVE), rate(*a), rate(*b))
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                },
                met: worst.map(|(r, _)| r >= 2.0),
            });
        }
        goals.push(versus_peer(
            "PostgreSQL: >= 0.6x pg_advisory_xact_lock pairs/s at 64 tasks",
            "postgres",
            "pg-advisory-xact",
            0.6,
        ));
        {
            let (pg, xact) = (
                p50(self.subject("postgres"), 1),
                p50(self.subject("pg-advisory-xact"), 1),
            );
            let ratio = div(pg, xact);
            let goal = Goal {
                goal: "PostgreSQL: p50 acquire latency <= 2x pg_advisory_xact_lock's (1 task)"
                    .into(),
                measured: ratio.map_or("not measured".into(), |v| {
                    format!(
                        "{v:.2}x ({} vs {})",
                        us(pg.unwrap_or(0.0)),
                        us(xact.unwrap_or(0.0))
                    )
                }),
                met: ratio.map(|v| v <= 2.0),
            };
            goals.push(paired_of(
                goal,
                "postgres",
                "pg-advisory-xact",
                Some(1),
                Some(crate::paired::Metric::AcquireP50),
                &|m| m <= 2.0,
            ));
        }
        if let Some(pg) = self.subject("postgres") {
            // Not a goal any more: the pgbench script sends what the backend
            // sends (BEGIN, the lock statement, ROLLBACK, a flush in 32), so
            // the ratio is the client library's overhead over pgbench's C
            // loop, and says nothing of what users compare lockkit with; the
            // goals against pg_advisory_xact_lock above do.
            let worst = pg
                .uncontended
                .iter()
                .filter_map(|u| {
                    let b = self.bound_at(Some("pgbench"), u.tasks)?;
                    Some((u.pairs_per_s / b.pairs_per_s, u.tasks))
                })
                .min_by(|a, b| a.0.total_cmp(&b.0));
            goals.push(Goal {
                goal: "PostgreSQL: share of the pgbench bound at the same client count (shown, not checked: replaced by the goals against pg_advisory_xact_lock)".into(),
                measured: worst.map_or("not measured".into(), |(r, t)| {
                    format!("lowest {r:.2}x (at {t} tasks)")
                }),
                met: None,
            });
        }
        for s in self
            .subjects
            .iter()
            .filter(|s| s.kind == "backend" && s.has_wake_up)
        {
            let worst = s
                .contended
                .iter()
                .map(|c| (c.handoff.p99_us, c.waiters))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            goals.push(Goal {
                goal: format!(
                    "{}: handoff p99 < 5 ms ({})",
                    s.name,
                    s.wake_up.as_deref().unwrap_or("")
                ),
                measured: worst.map_or("not measured".into(), |(p, w)| {
                    let release = s
                        .contended
                        .iter()
                        .find(|c| c.waiters == w)
                        .map_or(String::new(), |c| {
                            format!("; the release call itself: {}", us(c.release.p99_us))
                        });
                    let floor: String = self
                        .handoff_floors(s)
                        .iter()
                        .filter(|f| f.waiters == w)
                        .map(|f| {
                            format!(
                                "; the server alone ({}): {}",
                                f.writes.label(),
                                us(f.handoff.p99_us)
                            )
                        })
                        .collect();
                    format!("{} ({w} waiters{release}{floor})", us(p))
                }),
                met: worst.map(|(p, _)| p < HANDOFF_P99_GOAL_US),
            });
        }
        for s in self.subjects.iter().filter(|s| s.kind == "backend") {
            let Some(m) = &s.many_keys else { continue };
            let pg = s.name == "postgres";
            goals.push(Goal {
                goal: if pg {
                    "postgres: client memory per held lock (excepted: pins a connection)".into()
                } else {
                    format!("{}: client memory per held lock < 2 KiB", s.name)
                },
                measured: format!(
                    "{} heap, {} RSS ({} held)",
                    bytes(m.client_heap_bytes_per_lock),
                    bytes(m.client_rss_bytes_per_lock),
                    m.held
                ),
                met: (!pg && m.held > 0).then_some(m.client_heap_bytes_per_lock < 2048.0),
            });
        }
        goals.extend(crate::metrics_overhead::goals(&self.paired));
        goals.extend(crate::crowd::goals(&self.subjects));
        if self.crowd_only {
            // The other goals' figures were not taken.
            goals.retain(|g| g.goal.contains("crowd"));
        }
        if self.modes_only {
            goals.clear();
        }
        goals.extend(crate::modes::goals(&self.modes));
        self.goals = goals;
    }

    /// The Markdown report.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.machine;
        let _ = writeln!(md, "# lockkit lab report ({:?} mode)\n", self.mode);
        let steal = m.steal_pct.map_or(String::new(), |p| {
            format!(" CPU time stolen by the hypervisor during the run: {p:.1} %.")
        });
        let _ = writeln!(
            md,
            "Machine: {} ({} CPUs), {:.0} GiB, {}, Linux {}. Servers on loopback: {}. Run took {:.0} s.{steal}\n",
            m.cpu, m.cpus, m.memory_gib, m.os, m.kernel, m.servers, self.wall_s
        );
        md.push_str(&self.verdicts());
        let sweeps = !self.crowd_only && !self.modes_only;
        if sweeps {
            md.push_str(&self.uncontended_table(None));
            md.push_str(&self.contended_table());
        }
        md.push_str(&crate::crowd::table(&self.subjects));
        if sweeps {
            md.push_str(&self.memory_table());
            md.push_str(&self.paired_table());
        }
        md.push_str(&crate::modes::table(&self.modes));
        if sweeps {
            md.push_str(&self.instructions_table());
        }
        md.push_str(&self.goals_table());
        md.push_str("## Bounds\n\n| bound | tasks | pairs/s | pipelined pairs/s | acquire/s, release/s |\n|---|---|---|---|---|\n");
        for b in &self.bounds {
            for p in &b.points {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} |",
                    b.name,
                    p.tasks,
                    rate(p.pairs_per_s),
                    p.pipelined_pairs_per_s.map_or("—".into(), rate),
                    p.detail
                );
            }
        }
        md.push_str("\n## How each figure is taken\n\n");
        md.push_str("- **pairs/s**: T tasks, each locking and releasing a key of its own (`try_acquire` + `release`) for the phase; acquire latency is the `try_acquire` call alone.\n");
        md.push_str("- **paired rounds**: the two clients a goal compares, measured in turns (the order alternating) in short uncontended rounds at the same concurrency, each client connected afresh; the ratio of each pair of rounds, and their median, which the goal checks. Figures taken minutes apart on a shared host differ for reasons of the host's own; a pair of rounds a second apart shares them. CPU per pair: the Redis servers' (`INFO cpu`, summed over the nodes both clients use) and this process's (user + system, /proc/self/stat; the client's work and the lab's own timing of each call, the same for both), over each round, divided by its pairs; the median over the rounds. Client runtime: the Tokio runtime both clients run on, the lab's own (the one every other figure is taken on) unless the row says otherwise; Redis against rslock runs a second time on a runtime of one worker thread, since on a machine whose few CPUs the servers share, an idle second worker is woken to steal each burst of woken tasks and parks again, and what that costs a client depends on how its work comes in bursts.\n");
        md.push_str("- **handoff**: W tasks on one key, each releasing at once after its grant and queueing again (`acquire` with a wait); the time from the start of a release to the next grant. Beside it, how long the release calls themselves took, from the call to its return: where a release waits for a commit (etcd, PostgreSQL), a handoff is no shorter than the server's part of it. Before the first and after the last, the backend gives back what it keeps idle (`Locker::close_idle`: etcd's idle leases, PostgreSQL's idle connections), as it does after each backend's runs, so that no idle etcd lease expires on the server during a later measurement.\n");
        if self.subjects.iter().any(|s| !s.crowds.is_empty()) {
            let _ = writeln!(md, "- {}", crate::crowd::METHOD);
        }
        if !self.modes.is_empty() {
            let _ = writeln!(md, "- {}", crate::modes::METHOD);
        }
        md.push_str("- **client memory**: live heap bytes (a counting global allocator) and resident set growth (/proc/self/statm) while the keys are held, divided by the number held; the `Lease` values themselves are included.\n");
        md.push_str("- **loss detection**: a guard holds a key; a second `Locker` removes the grant (`force_release`); the time from the start of that call to the guard's `lost()`.\n");
        if let Some(f) = &self.fan_out_floor {
            let _ = writeln!(md, "- **raw fan-out floor**: {}", f.method);
        }
        if self.server_instructions.is_some() {
            let _ = writeln!(
                md,
                "- **server instructions**: {}",
                crate::instructions::method()
            );
        }
        for b in &self.bounds {
            let _ = writeln!(md, "- **{}**: {}", b.name, b.method);
            if let Some(f) = b.handoffs.first() {
                let _ = writeln!(md, "- **server floor (watch ring)**: {}", f.method);
            }
        }
        let mut counted: Vec<&str> = self
            .subjects
            .iter()
            .flat_map(|s| s.contended.iter().map(|c| c.counted.as_str()))
            .chain(
                self.subjects
                    .iter()
                    .filter_map(|s| s.many_keys.as_ref().map(|m| m.server_counted.as_str())),
            )
            .collect();
        counted.sort();
        counted.dedup();
        for c in counted {
            let _ = writeln!(md, "- {c}");
        }
        for s in &self.subjects {
            for n in &s.notes {
                let _ = writeln!(md, "- {}: {n}", s.name);
            }
        }
        let failures: Vec<_> = self
            .subjects
            .iter()
            .flat_map(|s| s.errors.iter().map(move |e| format!("{}: {e}", s.name)))
            .chain(
                self.bounds
                    .iter()
                    .flat_map(|b| b.errors.iter().map(move |e| format!("{}: {e}", b.name))),
            )
            .chain(self.modes.iter().flat_map(|m| {
                let rounds = m.runs.iter().flat_map(|r| r.pairs.errors.iter());
                m.errors
                    .iter()
                    .chain(rounds)
                    .map(move |e| format!("{} modes: {e}", m.backend))
            }))
            .collect();
        if !failures.is_empty() {
            md.push_str("\n## Errors\n\n");
            for f in failures {
                let _ = writeln!(md, "- {f}");
            }
        }
        md
    }

    /// One line per backend, before the tables: its throughput against its
    /// server's bound and its peer at the highest concurrency both ran, and
    /// its goals met and missed.
    fn verdicts(&self) -> String {
        // A run of the modes alone measures no backend's own figures.
        if self.subjects.iter().all(|s| s.kind == "peer") {
            return String::new();
        }
        let mut md = String::from("## Verdict\n\n");
        for s in self.subjects.iter().filter(|s| s.kind != "peer") {
            let mut line = format!("- **{}**: ", s.name);
            match s.uncontended.iter().max_by_key(|u| u.tasks) {
                None if self.crowd_only => line.push_str("crowd only"),
                None => {
                    let why = s.errors.first().map_or("none", String::as_str);
                    let why: String = why.replace('\n', " ").chars().take(160).collect();
                    let _ = write!(line, "no figures ({why})");
                }
                Some(u) => {
                    let _ = write!(
                        line,
                        "{} pairs/s at {} task{}",
                        rate(u.pairs_per_s),
                        u.tasks,
                        if u.tasks == 1 { "" } else { "s" }
                    );
                    let mut against = Vec::new();
                    if let Some(b) = self.bound_at(s.baseline.as_deref(), u.tasks) {
                        let name = s.baseline.as_deref().unwrap_or_default();
                        against.push(format!(
                            "{} {name}",
                            ratio(u.pairs_per_s, Some(b.pairs_per_s))
                        ));
                        if let Some(p) = b.pipelined_pairs_per_s {
                            against.push(format!("{} {name} -P16", ratio(u.pairs_per_s, Some(p))));
                        }
                    }
                    if let (Some(peer), Some(p)) = (s.peer.as_deref(), self.peer_at(s, u.tasks)) {
                        against.push(format!(
                            "{} {peer}",
                            ratio(u.pairs_per_s, Some(p.pairs_per_s))
                        ));
                    }
                    if !against.is_empty() {
                        let _ = write!(line, " ({})", against.join(", "));
                    }
                }
            }
            let own: Vec<&Goal> = self
                .goals
                .iter()
                .filter(|g| goal_owner(&g.goal) == s.name)
                .collect();
            let met = own.iter().filter(|g| g.met == Some(true)).count();
            let missed: Vec<&str> = own
                .iter()
                .filter(|g| g.met == Some(false))
                .map(|g| {
                    g.goal
                        .split_once(": ")
                        .map_or(g.goal.as_str(), |(_, what)| what)
                })
                .collect();
            let checked = met + missed.len();
            if checked > 0 {
                let _ = write!(line, "; goals: {met} of {checked} met");
                if !missed.is_empty() {
                    let _ = write!(line, ", missed: {}", missed.join("; "));
                }
            }
            line.push('.');
            let _ = writeln!(md, "{line}");
        }
        md.push('\n');
        md
    }

    /// The uncontended table, at one concurrency or all.
    fn uncontended_table(&self, only: Option<usize>) -> String {
        let mut md = String::from(
            "## Uncontended: acquire+release pairs\n\n| backend | tasks | pairs/s | vs bound | vs bound -P16 | vs peer | acquire p50 | p99 | p99.9 |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        for s in &self.subjects {
            for u in &s.uncontended {
                if only.is_some_and(|t| t != u.tasks) {
                    continue;
                }
                let b = self.bound_at(s.baseline.as_deref(), u.tasks);
                let peer = self.peer_at(s, u.tasks).map(|p| p.pairs_per_s);
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    s.name,
                    u.tasks,
                    rate(u.pairs_per_s),
                    ratio(u.pairs_per_s, b.map(|b| b.pairs_per_s)),
                    ratio(u.pairs_per_s, b.and_then(|b| b.pipelined_pairs_per_s)),
                    ratio(u.pairs_per_s, peer),
                    us(u.acquire.p50_us),
                    us(u.acquire.p99_us),
                    us(u.acquire.p999_us),
                );
            }
        }
        md.push('\n');
        md
    }

    fn contended_table(&self) -> String {
        let mut md = String::from(
            "## Contended: one key, W waiters\n\n| backend | waiters | grants/s | handoff p50 | handoff p99 | vs peer p99 | server ops per handoff | release call p50 / p99 |\n|---|---|---|---|---|---|---|---|\n",
        );
        for s in &self.subjects {
            for c in &s.contended {
                let peer = s
                    .peer
                    .as_deref()
                    .and_then(|p| self.subject(p))
                    .and_then(|p| p.contended.iter().find(|x| x.waiters == c.waiters))
                    .map(|p| p.handoff.p99_us);
                let ops = c.server_ops_per_handoff.map_or("—".into(), |o| {
                    let unit = if c.counted.starts_with("Redis") {
                        "commands"
                    } else if c.counted.starts_with("PostgreSQL") {
                        "transactions"
                    } else {
                        "gRPC messages"
                    };
                    format!("{o:.1} {unit}")
                });
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} / {} |",
                    s.name,
                    c.waiters,
                    rate(c.grants_per_s),
                    us(c.handoff.p50_us),
                    us(c.handoff.p99_us),
                    ratio(c.handoff.p99_us, peer),
                    ops,
                    us(c.release.p50_us),
                    us(c.release.p99_us),
                );
            }
            for f in self.handoff_floors(s) {
                let _ = writeln!(
                    md,
                    "| {} server floor ({}) | {} | {} | {} | {} | — | 2 writes, 1 event | — |",
                    s.name,
                    f.writes.label(),
                    f.waiters,
                    rate(f.handoffs_per_s),
                    us(f.handoff.p50_us),
                    us(f.handoff.p99_us),
                );
            }
        }
        md.push('\n');
        md
    }

    fn memory_table(&self) -> String {
        let mut md = String::from(
            "## Many keys held at once, and loss detection\n\n| backend | held | client heap per lock | client RSS per lock | server per lock | lost() after removal p50 | max |\n|---|---|---|---|---|---|---|\n",
        );
        for s in self.subjects.iter().filter(|s| s.kind == "backend") {
            let (held, heap, rss, server) = s.many_keys.as_ref().map_or(
                ("—".into(), "—".into(), "—".into(), "—".into()),
                |m| {
                    (
                        rate(m.held as f64),
                        bytes(m.client_heap_bytes_per_lock),
                        bytes(m.client_rss_bytes_per_lock),
                        m.server_bytes_per_lock.map_or("—".into(), bytes),
                    )
                },
            );
            let (p50, max) = s
                .loss
                .as_ref()
                .filter(|l| !l.samples_ms.is_empty())
                .map_or(("—".into(), "—".into()), |l| {
                    (format!("{:.1} ms", l.p50_ms), format!("{:.1} ms", l.max_ms))
                });
            let _ = writeln!(
                md,
                "| {} | {held} | {heap} | {rss} | {server} | {p50} | {max} |",
                s.name
            );
        }
        md.push('\n');
        md
    }

    fn paired_table(&self) -> String {
        if self.paired.is_empty() {
            return String::new();
        }
        let mut md = String::from(
            "## Paired rounds: two clients in turns\n\n| client | against | tasks | client runtime | compared | rounds | median ratio | lowest | highest | Redis CPU per pair, client / against | lab process CPU per pair, client / against |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for p in &self.paired {
            let compared = match p.metric {
                crate::Metric::PairsPerSecond => "pairs/s",
                crate::Metric::AcquireP50 => "acquire p50",
            };
            let (lo, hi) = p.range().map_or(("—".into(), "—".into()), |(l, h)| {
                (format!("{l:.2}x"), format!("{h:.2}x"))
            });
            let both = |v: Option<(f64, f64)>| {
                v.map_or("—".into(), |(a, b)| format!("{a:.1} µs / {b:.1} µs"))
            };
            let (cpu, own) = (both(p.server_us_per_pair), both(p.client_us_per_pair));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {compared} | {} | {} | {lo} | {hi} | {cpu} | {own} |",
                p.subject,
                p.against,
                p.tasks,
                p.runtime.describe(p.client_workers),
                p.ratios.len(),
                p.median().map_or("—".into(), |m| format!("{m:.2}x")),
            );
        }
        md.push('\n');
        md
    }

    fn instructions_table(&self) -> String {
        let Some(count) = &self.server_instructions else {
            return String::new();
        };
        let mut md = String::from(
            "## Redis server instructions per acquire and release (callgrind)\n\nUser-space instructions of the server, which move far less with the host's load than CPU time (only its timer work grows with elapsed time); the clients take turns at the same number of operations per round trip.\n\n| operations per round trip |",
        );
        for client in crate::instructions::CLIENTS {
            let _ = write!(md, " {client} |");
        }
        md.push_str(" redis / rslock |\n|---|---|---|---|---|\n");
        if let Some(e) = &count.error {
            // One line, and no column break: the error may quote a server log.
            let e = e.replace('|', "\\|").replace('\n', " ");
            let _ = writeln!(md, "| {e} | | | | |");
        }
        for p in &count.points {
            let _ = write!(md, "| {} |", p.per_round_trip);
            for n in &p.per_pair {
                let _ = write!(md, " {} |", rate(*n));
            }
            let ratio = match p.per_pair.as_slice() {
                [redis, _, rslock] if *rslock > 0.0 => format!("{:.2}x", redis / rslock),
                _ => "—".into(),
            };
            let _ = writeln!(md, " {ratio} |");
        }
        md.push('\n');
        md
    }

    fn goals_table(&self) -> String {
        let mut md = String::from("## Goals\n\n| goal | measured | met |\n|---|---|---|\n");
        for g in &self.goals {
            let met = match g.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            };
            let _ = writeln!(md, "| {} | {} | {met} |", g.goal, g.measured);
        }
        md.push('\n');
        md
    }

    /// The terminal summary: the 64-task row (or the largest run), contention, memory, goals.
    pub fn summary(&self) -> String {
        let t = if self.subjects.iter().any(|s| s.at(64).is_some()) {
            64
        } else {
            1
        };
        let mut out = String::new();
        let sweeps = !self.crowd_only && !self.modes_only;
        if sweeps {
            out.push_str(&self.uncontended_table(Some(t)));
            out.push_str(&self.contended_table());
        }
        out.push_str(&crate::crowd::table(&self.subjects));
        if sweeps {
            out.push_str(&self.memory_table());
            out.push_str(&self.paired_table());
        }
        out.push_str(&crate::modes::table(&self.modes));
        out.push_str(&self.goals_table());
        out
    }

    /// Writes report.json, report.md and the SVG plots into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        let put = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text)
                .map_err(|e| format!("{}: {e}", dir.join(name).display()))
        };
        put(
            "report.json",
            &serde_json::to_string_pretty(self).map_err(|e| e.to_string())?,
        )?;
        put("report.md", &self.markdown())?;
        crate::plot::all(self, dir)
    }
}

/// The backend a goal is about, from the words before its colon:
/// "Redlock (5 nodes): ..." is redlock's, "PostgreSQL: ..." postgres's,
/// "Metrics: redis pairs/s ..." redis's.
pub(crate) fn goal_owner(goal: &str) -> String {
    let Some((head, rest)) = goal.split_once(':') else {
        return String::new();
    };
    let head = head
        .split(" (")
        .next()
        .unwrap_or(head)
        .trim()
        .to_lowercase();
    match head.as_str() {
        "postgresql" => "postgres".into(),
        "metrics" => rest
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned(),
        _ => head,
    }
}

/// A pair's median ratio and its spread, or why it has none.
pub(crate) fn paired_outcome(p: &crate::Paired) -> String {
    match (p.median(), p.range()) {
        (Some(median), Some((lo, hi))) => format!(
            "{median:.2}x, median of {} paired rounds ({lo:.2}x to {hi:.2}x)",
            p.ratios.len()
        ),
        _ => {
            let why = p.errors.first().map_or("none completed", String::as_str);
            // One line of a Markdown table cell.
            let why: String = why.replace(['|', '\n'], " ").chars().take(160).collect();
            format!("no paired rounds ({why})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
        assert_eq!(rate(1234567.4), "1,234,567");
        assert_eq!(rate(999.0), "999");
        assert_eq!(us(1500.0), "1.50 ms");
        assert_eq!(us(80.0), "80 µs");
        assert_eq!(ratio(2.0, Some(4.0)), "0.50x");
        assert_eq!(ratio(2.0, None), "—");
        assert_eq!(bytes(2048.0), "2.0 KiB");
        assert_eq!(bytes(-29.0), "≈ 0 B");
    }

    #[test]
    fn a_baseline_missing_a_figure_is_a_failure() {
        let mut report = Report::new(Mode::Quick, Machine::default());
        let point = BoundPoint {
            tasks: 1,
            pairs_per_s: 400.0,
            pipelined_pairs_per_s: None,
            acquire_p50_us: None,
            detail: String::new(),
        };
        report.bounds.push(Bound {
            name: "bare etcd RPCs".into(),
            method: String::new(),
            points: vec![point],
            handoffs: Vec::new(),
            errors: Vec::new(),
        });
        assert!(report.failures().is_empty(), "{:?}", report.failures());
        let ring = "watch ring, the lock's transactions, 8 waiters: etcd: timed out";
        report.bounds[0].errors.push(ring.into());
        assert_eq!(report.failures(), [format!("bare etcd RPCs: {ring}")]);
        report.bounds[0].points.clear();
        assert_eq!(
            report.failures(),
            [format!("bare etcd RPCs: no figures ({ring})")]
        );
    }

    #[test]
    fn the_goal_against_rslock_checks_the_labs_runtime_and_shows_the_other() {
        let redis_goal = |paired: Vec<crate::Paired>| {
            let mut report = Report::new(Mode::Quick, Machine::default());
            report.paired = paired;
            report.finish();
            let goal = report
                .goals
                .into_iter()
                .find(|g| g.goal.contains("1.3x rslock"));
            goal.expect("the goal against rslock")
        };
        let row = |runtime, workers, ratios: &[f64], error: Option<&str>| {
            let mut p = crate::Paired::new(
                "redis",
                "rslock (1 node)",
                64,
                crate::Metric::PairsPerSecond,
            );
            (p.runtime, p.client_workers) = (runtime, workers);
            p.ratios = ratios.to_vec();
            p.errors.extend(error.map(str::to_owned));
            p
        };
        let goal = redis_goal(vec![
            row(ClientRuntime::Lab, 2, &[1.0, 1.1, 1.2], None),
            row(ClientRuntime::OneWorker, 1, &[], Some("refused | twice")),
        ]);
        assert_eq!(goal.met, Some(false), "{}", goal.measured);
        assert!(
            goal.measured.starts_with(
                "1.10x, median of 3 paired rounds (1.00x to 1.20x) on the lab's runtime (2 worker threads), checked; on a runtime of its own (1 worker thread), not checked: no paired rounds (refused   twice)"
            ),
            "{}",
            goal.measured
        );
        // The checked row without rounds: the sweep decides, and says so.
        let goal = redis_goal(vec![
            row(ClientRuntime::OneWorker, 1, &[1.4], None),
            row(ClientRuntime::Lab, 2, &[], None),
        ]);
        assert_eq!(goal.met, None, "no sweep figures: not measured");
        assert!(
            goal.measured.starts_with(
                "no paired rounds (none completed) on the lab's runtime (2 worker threads), so the sweep's figure is checked; on a runtime of its own (1 worker thread), not checked: 1.40x"
            ),
            "{}",
            goal.measured
        );
    }

    #[test]
    fn each_goal_belongs_to_the_backend_it_names() {
        assert_eq!(
            goal_owner("Redis: >= 1.3x rslock (1 node) at 64 tasks"),
            "redis"
        );
        assert_eq!(
            goal_owner("Redlock (5 nodes): p50 acquire latency"),
            "redlock"
        );
        assert_eq!(
            goal_owner("PostgreSQL: >= 0.6x pg_advisory_xact_lock"),
            "postgres"
        );
        assert_eq!(
            goal_owner("redis-cluster: handoff p99 < 5 ms (x)"),
            "redis-cluster"
        );
        assert_eq!(goal_owner("Metrics: etcd pairs/s with a recorder"), "etcd");
    }

    #[test]
    fn the_report_opens_with_a_verdict_per_backend() {
        let uncontended = |tasks, pairs_per_s| Uncontended {
            tasks,
            pairs: 1,
            pairs_per_s,
            acquire: crate::stats::Latency::default(),
            acquire_curve_us: Vec::new(),
            errors: 0,
            first_error: None,
        };
        let mut report = Report::new(Mode::Quick, Machine::default());
        let mut redis = Subject::new("redis", "backend", "redis://x");
        redis.baseline = Some("redis-benchmark".into());
        redis.peer = Some("rslock (1 node)".into());
        redis.uncontended = vec![uncontended(1, 9_000.0), uncontended(64, 80_000.0)];
        let mut rslock = Subject::new("rslock (1 node)", "peer", "redis://x");
        rslock.uncontended = vec![uncontended(64, 50_000.0)];
        report.subjects = vec![
            redis,
            rslock,
            Subject::failed("etcd", "LOCKKIT_ETCD_URL is not set".into()),
        ];
        report.bounds.push(Bound {
            name: "redis-benchmark".into(),
            method: String::new(),
            points: vec![BoundPoint {
                tasks: 64,
                pairs_per_s: 40_000.0,
                pipelined_pairs_per_s: Some(100_000.0),
                acquire_p50_us: None,
                detail: String::new(),
            }],
            handoffs: Vec::new(),
            errors: Vec::new(),
        });
        report.finish();
        let md = report.markdown();
        let verdict = md
            .split("## Verdict\n\n")
            .nth(1)
            .expect("a verdict section");
        assert!(
            verdict.starts_with(
                "- **redis**: 80,000 pairs/s at 64 tasks (2.00x redis-benchmark, 0.80x redis-benchmark -P16, 1.60x rslock (1 node)); goals: 2 of 2 met.\n- **etcd**: no figures (LOCKKIT_ETCD_URL is not set).\n\n## Uncontended"
            ),
            "{verdict}"
        );
        assert!(md.find("## Verdict") < md.find("## Uncontended"));
    }

    #[test]
    fn steal_is_a_share_of_all_cpu_time() {
        assert_eq!(steal_pct((10, 1000), (60, 2000)), Some(5.0));
        assert_eq!(steal_pct((10, 1000), (10, 1000)), None);
        let (steal, total) = cpu_ticks().expect("/proc/stat");
        assert!(steal <= total);
    }
}
