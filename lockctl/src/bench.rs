//! `lockctl bench`: the lab (lock-bench) over the servers named by the
//! `LOCKKIT_*_URL` variables.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::exit;

/// Arguments of `lockctl bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
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
    /// Paired rounds per comparison (default: 3 quick, 9 full).
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Length of each paired round, in milliseconds (default: 400 quick, 1000 full).
    #[arg(long, value_name = "MS")]
    round_ms: Option<u64>,
}

/// Runs the lab; exits 69 if a backend or bound produced no figures.
pub async fn run(args: &BenchArgs) -> ExitCode {
    let options = lock_bench::Options {
        mode: if args.quick {
            lock_bench::Mode::Quick
        } else {
            lock_bench::Mode::Full
        },
        out: args.out.clone(),
        only: args.backends.clone(),
        paired_only: args.paired_only,
        rounds: args.rounds,
        round: args.round_ms.map(std::time::Duration::from_millis),
    };
    let report = match lock_bench::run(&options).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lockctl: bench: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    println!("{}", report.summary());
    println!(
        "report: {} (report.md, report.json, throughput.svg, acquire-latency.svg, handoff.svg)",
        args.out.display()
    );
    let failures = report.failures();
    for f in &failures {
        eprintln!("lockctl: bench: {f}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::UNAVAILABLE)
    }
}
