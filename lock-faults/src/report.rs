//! The fault matrix (Markdown and JSON) and the decision-matrix section
//! generated from it.

use std::fmt::Write as _;
use std::process::Command;

use serde::Serialize;

use crate::check::Findings;
use crate::faults::{Backend, FAULTS, verdict};
use crate::harness::Outcome;
use crate::workload::Workload;

/// Where a partial run puts its mode section in a fault matrix page.
const MODES_BEGIN: &str = "<!-- modes:begin -->";
const MODES_END: &str = "<!-- modes:end -->";

/// Where and how a run was made.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    /// Run id (also the report folder's name).
    pub run: String,
    /// `smoke` or `full`.
    pub schedule: String,
    /// The schedule's seed.
    pub seed: u64,
    /// Lock TTL, ms.
    pub ttl_ms: u64,
    /// Client processes per cell.
    pub clients: u32,
    /// Host name, kernel, CPU model and count.
    pub machine: String,
    /// `git describe` of the tree the run was built from.
    pub commit: String,
    /// The command that reproduces it.
    pub command: String,
    /// The cells' filter, when the run took only some.
    pub only: Option<String>,
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

impl Provenance {
    /// Reads the machine and the commit.
    pub fn collect(
        run: String,
        schedule: &str,
        seed: u64,
        ttl_ms: u64,
        clients: u32,
        only: Option<String>,
    ) -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let machine = format!(
            "{} (Linux {}, {} × {cpu})",
            sh("hostname", &[]),
            sh("uname", &["-r"]),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        Provenance {
            command: format!(
                "scripts/faults.sh --{schedule} --seed {seed}{}",
                only.as_ref()
                    .map_or(String::new(), |o| format!(" --only {o}"))
            ),
            only,
            run,
            schedule: schedule.into(),
            seed,
            ttl_ms,
            clients,
            machine,
            commit: sh("git", &["describe", "--always", "--dirty"]),
        }
    }
}

/// The observed verdict of a cell, in the literature's words.
pub fn observed(o: &Outcome) -> &'static str {
    let Some(f) = &o.findings else {
        return if o.skipped.is_some() {
            "not run"
        } else {
            "harness error"
        };
    };
    let fence_clean =
        f.stale_writes_accepted == 0 && f.token_regressions == 0 && f.fenced_lost_updates == 0;
    verdict(o.workload, limit_held(o.workload, f), fence_clean)
}

/// No overlap the mode forbids, in the lock's history or at the resource,
/// and no lost update.
fn limit_held(workload: Workload, f: &Findings) -> bool {
    let crowded = workload
        .holders_allowed()
        .is_some_and(|n| f.resource_most_inside > n);
    f.overlaps == 0 && f.lost_updates == 0 && !crowded && f.resource_writer_overlaps == 0
}

fn mark(o: &Outcome) -> &'static str {
    if o.error.is_some() {
        "⚠ harness error"
    } else if o.skipped.is_some() {
        "– not run"
    } else if !o.violations().is_empty() {
        "✗ VIOLATION"
    } else if observed(o) == o.prediction.label(o.workload) {
        "✓ as predicted"
    } else {
        "✓ no violation (the predicted failure did not occur in this run)"
    }
}

fn figures(o: &Outcome) -> String {
    match &o.findings {
        None => o
            .skipped
            .clone()
            .or_else(|| o.error.clone())
            .unwrap_or_default(),
        Some(f) => format!(
            "overlaps {} (max {:.0} ms) · lost {} · stale refused {} / accepted {} · regressions {} · unavailable {:.1} s",
            f.overlaps,
            f.longest_overlap_ms,
            f.lost_updates,
            f.stale_writes_rejected + f.stale_reads_rejected,
            f.stale_writes_accepted,
            f.token_regressions,
            f.unavailable_ms / 1e3
        ),
    }
}

fn short(o: &Outcome) -> String {
    let sym = mark(o).split(' ').next().unwrap_or("");
    match &o.findings {
        None => format!(
            "{sym} {}",
            if o.skipped.is_some() {
                "not run"
            } else {
                "error"
            }
        ),
        Some(f) => format!(
            "{sym} {} — ovl {}, lost {}, stale {}/{}, regr {}, unavail {:.1} s",
            o.prediction.label(o.workload),
            f.overlaps,
            f.lost_updates,
            f.stale_writes_rejected + f.stale_reads_rejected,
            f.stale_writes_accepted,
            f.token_regressions,
            f.unavailable_ms / 1e3
        ),
    }
}

/// The fault matrix as Markdown.
pub fn matrix_markdown(p: &Provenance, outcomes: &[Outcome]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Fault matrix — run {}\n", p.run);
    let _ = writeln!(
        md,
        "Machine: {}. Tree: `{}`. Schedule: {} (seed {}), TTL {} ms, {} client processes per cell, each cell on private servers behind the harness's TCP proxies. Reproduce: `{}`.\n",
        p.machine, p.commit, p.schedule, p.seed, p.ttl_ms, p.clients, p.command
    );
    let _ = writeln!(
        md,
        "Each cell: the prediction from the literature, then what the checker measured — overlapping \"definitely held\" intervals (ovl), lost updates on the unfenced counter (lost), stale requests refused / stale writes accepted by the fenced store (stale R/A), fencing-token regressions (regr), and the longest time without a grant after the fault (unavail). ✓: no violation of the prediction; ✗: a safety violation in a cell predicted safe.\n"
    );
    let _ = write!(md, "| fault |");
    for b in Backend::ALL {
        let _ = write!(md, " {b} |");
    }
    let _ = writeln!(md, "\n|---|{}", "---|".repeat(Backend::ALL.len()));
    for fault in FAULTS {
        let row: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.fault == fault.id && o.workload == Workload::Mutex)
            .collect();
        if row.is_empty() {
            continue;
        }
        let _ = write!(md, "| `{}` |", fault.id);
        for b in Backend::ALL {
            match row.iter().find(|o| o.backend == b) {
                Some(o) => {
                    let _ = write!(md, " {} |", short(o));
                }
                None => {
                    let _ = write!(md, " |");
                }
            }
        }
        let _ = writeln!(md);
    }
    if outcomes.iter().any(|o| o.workload != Workload::Mutex) {
        let _ = writeln!(
            md,
            "\n{MODES_BEGIN}\n{}{MODES_END}",
            modes_markdown(p, outcomes)
        );
    }
    let _ = writeln!(md, "\n## Cells in detail\n");
    for o in outcomes {
        let _ = writeln!(
            md,
            "### {} × `{}`{} — {}\n",
            o.backend,
            o.fault,
            match o.workload {
                Workload::Mutex => String::new(),
                w => format!(" × {w}"),
            },
            mark(o)
        );
        let _ = writeln!(md, "- fault: {}", o.what);
        let _ = writeln!(
            md,
            "- predicted: **{}** ({}{})",
            o.prediction.label(o.workload),
            if o.workload == Workload::Mutex {
                ""
            } else {
                "as the exclusive lock's on this backend and fault: "
            },
            o.prediction.why
        );
        let _ = writeln!(md, "- observed: **{}**: {}", observed(o), figures(o));
        if let Some(f) = &o.findings {
            let _ = writeln!(
                md,
                "- grants {}, failed acquires {}, indeterminate ops {}, writes after the holder's deadline {}, fenced-counter lost updates {}; unavailability bound (fault + TTL) {:.1} s",
                f.grants,
                f.failed_acquires,
                f.indeterminate,
                f.late_writes,
                f.fenced_lost_updates,
                o.bound_ms / 1e3
            );
            if o.workload != Workload::Mutex {
                let _ = writeln!(
                    md,
                    "- held at once: at most {} by the lock's history, {} inside the resource; entries putting a writer beside another client: {}",
                    f.max_holders, f.resource_most_inside, f.resource_writer_overlaps
                );
            }
            if let Some(ex) = &f.overlap_example {
                let _ = writeln!(md, "- first overlap: {ex}");
            }
            if let Some(ex) = &f.regression_example {
                let _ = writeln!(md, "- first token regression: {ex}");
            }
        }
        for v in o.violations() {
            let _ = writeln!(md, "- **violation**: {v}");
        }
        for r in o.remarks() {
            let _ = writeln!(md, "- remark: {r}");
        }
        for n in &o.notes {
            let _ = writeln!(md, "- harness: {n}");
        }
        if let Some(e) = &o.error {
            let _ = writeln!(md, "- **harness error**: {e}");
        }
        let _ = writeln!(md);
    }
    md
}

/// The decision-matrix section for the guide (docs/guide/measurements.md), built from a run.
pub fn decision_markdown(p: &Provenance, outcomes: &[Outcome]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## Measured under faults\n");
    let _ = writeln!(
        md,
        "Generated by `{}` (run {}, tree `{}`) on {}. TTL {} ms, {} client processes contending for one key; every fault on private servers. The full matrix with every figure: [fault-matrix.md](fault-matrix.md) (and `target/lockkit-faults/{}/`).\n",
        p.command, p.run, p.commit, p.machine, p.ttl_ms, p.clients, p.run
    );
    let _ = writeln!(
        md,
        "| backend | faults run | mutual exclusion broke under (overlapping holders) | unfenced writes lost under | fenced store: stale refused / stale accepted / token regressions | worst unavailability | violations of the prediction |\n|---|---|---|---|---|---|---|"
    );
    for b in Backend::ALL {
        let cells: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.backend == b && o.findings.is_some() && o.workload == Workload::Mutex)
            .collect();
        if cells.is_empty() {
            continue;
        }
        let list = |pred: &dyn Fn(&crate::check::Findings) -> bool| {
            let v: Vec<String> = cells
                .iter()
                .filter(|o| o.findings.as_ref().is_some_and(pred))
                .map(|o| format!("`{}`", o.fault))
                .collect();
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        let sum = |f: &dyn Fn(&crate::check::Findings) -> u64| -> u64 {
            cells
                .iter()
                .filter_map(|o| o.findings.as_ref())
                .map(f)
                .sum()
        };
        let worst = cells
            .iter()
            .max_by(|x, y| {
                let (a, b) = (
                    x.findings.as_ref().map_or(0.0, |f| f.unavailable_ms),
                    y.findings.as_ref().map_or(0.0, |f| f.unavailable_ms),
                );
                a.total_cmp(&b)
            })
            .map(|o| {
                format!(
                    "{:.1} s (`{}`)",
                    o.findings.as_ref().map_or(0.0, |f| f.unavailable_ms) / 1e3,
                    o.fault
                )
            })
            .unwrap_or_default();
        let violations: usize = cells.iter().map(|o| o.violations().len()).sum();
        let _ = writeln!(
            md,
            "| {b} | {} | {} | {} | {} / {} / {} | {worst} | {} |",
            cells.len(),
            list(&|f| f.overlaps > 0),
            list(&|f| f.lost_updates > 0),
            sum(&|f| f.stale_writes_rejected + f.stale_reads_rejected),
            sum(&|f| f.stale_writes_accepted),
            sum(&|f| f.token_regressions),
            if violations == 0 {
                "none".to_string()
            } else {
                format!("**{violations}**")
            },
        );
    }
    let _ = writeln!(
        md,
        "\nRead it with the table above: a lock alone protected the unfenced resource only where the \"broke under\" and \"lost under\" columns say none; a resource that checks fencing tokens refused every stale writer wherever \"stale accepted\" and \"token regressions\" are 0."
    );
    md
}

/// The mode cells' section: one row per backend, mode and fault.
pub fn modes_markdown(p: &Provenance, outcomes: &[Outcome]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## Semaphores and read-write locks\n");
    let _ = writeln!(
        md,
        "Run {} (`{}`, tree `{}`) on {}. The same faults under the other modes, where the backend offers them (`capabilities().offer(..)`): a semaphore of {} permits taken by each of {} clients, or a read-write lock whose first client of three writes (the exclusive lock, with the fenced read-modify-write) while the others read (a read of the fenced store, then TTL/5 inside). \"Held at once\" counts the \"definitely held\" intervals by overlap depth; the resource counts who is inside it, whatever the lock says (a paused holder stays inside). A mode is predicted what the exclusive lock is on that backend and fault. A fence protects a writer's store; no single highest token can refuse a stale permit among N current ones.\n",
        p.run,
        p.command,
        p.commit,
        p.machine,
        crate::workload::PERMITS,
        p.clients
    );
    let _ = writeln!(
        md,
        "| backend | mode | fault | held at once: lock / resource (allowed) | writer overlaps: lock / resource | stale refused / accepted, regressions | unavailable | predicted | result |\n|---|---|---|---|---|---|---|---|---|"
    );
    for o in outcomes.iter().filter(|o| o.workload != Workload::Mutex) {
        let allowed = o
            .workload
            .holders_allowed()
            .map_or("readers: any".to_string(), |n| n.to_string());
        match &o.findings {
            Some(f) => {
                let writers = match o.workload {
                    Workload::Semaphore { .. } => "–".to_string(),
                    _ => format!("{} / {}", f.overlaps, f.resource_writer_overlaps),
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | `{}` | {} / {} ({allowed}) | {writers} | {} / {}, {} | {:.1} s | {} | {} |",
                    o.backend,
                    o.workload,
                    o.fault,
                    f.max_holders,
                    f.resource_most_inside,
                    f.stale_writes_rejected + f.stale_reads_rejected,
                    f.stale_writes_accepted,
                    f.token_regressions,
                    f.unavailable_ms / 1e3,
                    o.prediction.label(o.workload),
                    mark(o)
                );
            }
            None => {
                let _ = writeln!(
                    md,
                    "| {} | {} | `{}` | | | | | {} | {} |",
                    o.backend,
                    o.workload,
                    o.fault,
                    o.prediction.label(o.workload),
                    o.skipped
                        .as_deref()
                        .map_or_else(|| mark(o).to_string(), |s| format!("– {s}"))
                );
            }
        }
    }
    md
}

/// Puts this run's mode section into a fault matrix page, in place of the
/// one between its markers, or at its end.
pub fn replace_modes(page: &str, p: &Provenance, outcomes: &[Outcome]) -> String {
    let section = format!("{MODES_BEGIN}\n{}{MODES_END}", modes_markdown(p, outcomes));
    match (page.find(MODES_BEGIN), page.find(MODES_END)) {
        (Some(begin), Some(end)) if begin < end => format!(
            "{}{section}{}",
            &page[..begin],
            &page[end + MODES_END.len()..]
        ),
        // Before the cells in detail, where a full run puts it.
        _ => match page.find("\n## Cells in detail") {
            Some(at) => format!("{}\n{section}\n{}", &page[..at], &page[at..]),
            None => format!("{}\n\n{section}\n", page.trim_end()),
        },
    }
}
