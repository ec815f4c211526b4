//! `lockkit-lab`: the lab (lock-bench) over the servers named by the
//! `LOCKKIT_*_URL` variables. Not published: it measures this repository's
//! backends on this repository's servers.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// The command line is malformed (`EX_USAGE`).
const USAGE: u8 = 64;
/// A backend or bound produced no figures, or a checked goal failed (`EX_UNAVAILABLE`).
const UNAVAILABLE: u8 = 69;

/// Measure every lockkit backend beside its server's own bound and the
/// libraries users pick instead (rslock, etcd's lock service, PostgreSQL's
/// advisory locks), on the servers named by the LOCKKIT_*_URL variables
/// (`scripts/servers.sh env`). `scripts/lab.sh` starts the servers and runs
/// this with a release build.
#[derive(clap::Parser)]
#[command(name = "lockkit-lab", version)]
struct Args {
    /// Short run (under 2 minutes for every backend; a smoke test, rough figures).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Full run (the default): every concurrency, 100,000 keys held at once.
    #[arg(long)]
    full: bool,
    /// Report folder.
    #[arg(long, value_name = "DIR", default_value = "target/lab-report")]
    out: PathBuf,
    /// Only these, comma-separated: memory, redis, redis-cluster, redlock, etcd, postgres, rslock,
    /// etcd-v3lock, pg-advisory-session, pg-advisory-xact.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    backends: Option<Vec<String>>,
    /// Only the paired rounds behind the goals that compare two clients (a couple of minutes).
    #[arg(long)]
    paired_only: bool,
    /// Only the crowd scenario (many waiters on one key over several clients), for each backend.
    #[arg(long, conflicts_with = "paired_only")]
    crowd_only: bool,
    /// Only the modes against the mutex on each backend that offers them (a semaphore's
    /// permit and a read hold: pairs/s at 64 tasks in paired rounds, handoff p99).
    #[arg(long, conflicts_with_all = ["paired_only", "crowd_only"])]
    modes_only: bool,
    /// Paired rounds per comparison (default: 3 quick, 9 full).
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Length of each paired round, in milliseconds (default: 400 quick, 1000 full).
    #[arg(long, value_name = "MS")]
    round_ms: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockkit-lab: cannot start the async runtime: {e}");
            return ExitCode::from(UNAVAILABLE);
        }
    };
    runtime.block_on(run(&args))
}

/// Runs the lab; exits 69 if a backend or bound produced no figures.
async fn run(args: &Args) -> ExitCode {
    let options = lock_bench::Options {
        mode: if args.quick {
            lock_bench::Mode::Quick
        } else {
            lock_bench::Mode::Full
        },
        out: args.out.clone(),
        only: args.backends.clone(),
        paired_only: args.paired_only,
        crowd_only: args.crowd_only,
        modes_only: args.modes_only,
        rounds: args.rounds,
        round: args.round_ms.map(std::time::Duration::from_millis),
    };
    let report = match lock_bench::run(&options).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lockkit-lab: {e}");
            return ExitCode::from(USAGE);
        }
    };
    println!("{}", report.summary());
    println!(
        "report: {} (report.md, report.json, throughput.svg, acquire-latency.svg, handoff.svg)",
        args.out.display()
    );
    let failures = report.failures();
    for f in &failures {
        eprintln!("lockkit-lab: {f}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(UNAVAILABLE)
    }
}
