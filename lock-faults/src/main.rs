//! `lock-faults`: injects real faults under a lock workload on private
//! servers and checks the recorded history. See the README.

mod check;
mod client;
mod clock;
mod deploy;
mod faults;
mod harness;
mod history;
mod report;
mod resource;
mod rng;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(about = "lockkit's fault lab: real faults, a recorded history, a checker")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run a schedule and write the fault matrix.
    Run {
        /// The short schedule (under 3 minutes), as CI runs it.
        #[arg(long, conflicts_with = "full")]
        smoke: bool,
        /// Every applicable fault on every backend (the default).
        #[arg(long)]
        full: bool,
        /// The schedule's seed: client think times, fault timing, nodes hit.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Only cells whose "backend/fault/workload" contains one of these
        /// (comma-separated), e.g. `redis/holder` or `semaphore,read-write`.
        #[arg(long)]
        only: Option<String>,
        /// Report folder (default `target/lockkit-faults/<run id>`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the decision-matrix section here (docs/faults/decision-matrix.md).
        #[arg(long)]
        decision: Option<PathBuf>,
        /// Put this run's semaphore and read-write section into this fault
        /// matrix page (docs/faults/fault-matrix.md), in place of the one
        /// there, leaving the rest of the page as it is.
        #[arg(long)]
        modes_into: Option<PathBuf>,
    },
    /// One workload client (started by `run`).
    Client(client::ClientArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Client(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            match rt.block_on(client::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("lock-faults client: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Cmd::Run {
            smoke,
            full: _,
            seed,
            only,
            out,
            decision,
            modes_into,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(run(smoke, seed, only, out, decision, modes_into))
        }
    }
}

async fn run(
    smoke: bool,
    seed: u64,
    only: Option<String>,
    out: Option<PathBuf>,
    decision: Option<PathBuf>,
    modes_into: Option<PathBuf>,
) -> ExitCode {
    let schedule = if smoke { "smoke" } else { "full" };
    let run_id = format!(
        "{}-{schedule}-seed{seed}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );
    let dir = out.unwrap_or_else(|| PathBuf::from("target/lockkit-faults").join(&run_id));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("lock-faults: cannot create {}: {e}", dir.display());
        return ExitCode::from(2);
    }
    let settings = harness::Settings {
        seed,
        clients: 3,
        ttl: Duration::from_secs(2),
        dir: dir.clone(),
    };
    let cells: Vec<_> = faults::schedule(smoke)
        .into_iter()
        .filter(|c| {
            only.as_ref()
                .is_none_or(|o| o.split(',').any(|part| c.name().contains(part)))
        })
        .collect();
    eprintln!(
        "lock-faults: {} cells ({schedule}, seed {seed}) -> {}",
        cells.len(),
        dir.display()
    );
    // Taken before the cells run: the tree may change while they do.
    let provenance = report::Provenance::collect(
        run_id,
        schedule,
        seed,
        settings.ttl.as_millis() as u64,
        settings.clients,
        only,
    );
    let mut outcomes = Vec::new();
    for (i, cell) in cells.into_iter().enumerate() {
        let started = std::time::Instant::now();
        let outcome = harness::run_cell(i, cell, &settings).await;
        eprintln!(
            "  [{:>2}] {:<12} {:<24} {:<12} {:<38} {:>5.1} s{}",
            i,
            cell.backend.name(),
            cell.fault.id,
            cell.workload.name(),
            report::observed(&outcome),
            started.elapsed().as_secs_f64(),
            match (outcome.violations().len(), &outcome.error, &outcome.skipped) {
                (0, None, None) => String::new(),
                (_, Some(e), _) => format!("  HARNESS ERROR: {e}"),
                (_, _, Some(s)) => format!("  skipped: {s}"),
                (n, _, _) => format!("  {n} VIOLATION(S)"),
            }
        );
        outcomes.push(outcome);
    }
    let md = report::matrix_markdown(&provenance, &outcomes);
    let json = serde_json::json!({ "provenance": provenance, "cells": outcomes });
    let written = std::fs::write(dir.join("matrix.md"), &md)
        .and_then(|()| {
            std::fs::write(
                dir.join("matrix.json"),
                serde_json::to_vec_pretty(&json).unwrap_or_default(),
            )
        })
        .and_then(|()| {
            std::fs::write(
                dir.join("decision-matrix.md"),
                report::decision_markdown(&provenance, &outcomes),
            )
        });
    if let Some(path) = decision {
        let text = format!(
            "<!-- Generated by lock-faults from run {}; do not edit by hand. -->\n{}",
            provenance.run,
            report::decision_markdown(&provenance, &outcomes)
        );
        if let Err(e) = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text))
            .and_then(|()| std::fs::write(path.with_file_name("fault-matrix.md"), &md))
        {
            eprintln!("lock-faults: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if let Some(path) = modes_into {
        let page = std::fs::read_to_string(&path).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, report::replace_modes(&page, &provenance, &outcomes))
        {
            eprintln!("lock-faults: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if let Err(e) = written {
        eprintln!("lock-faults: cannot write the report: {e}");
        return ExitCode::from(2);
    }
    println!("{md}");
    let violations: usize = outcomes.iter().map(|o| o.violations().len()).sum();
    let errors = outcomes.iter().filter(|o| o.error.is_some()).count();
    eprintln!(
        "lock-faults: {} cells, {violations} safety violations in cells predicted safe, {errors} harness errors; report in {}",
        outcomes.len(),
        dir.display()
    );
    if errors > 0 {
        ExitCode::from(2)
    } else if violations > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
