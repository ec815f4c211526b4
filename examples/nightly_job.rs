//! A job that runs at most once at a time across machines: every instance
//! tries the lock, one runs the job, the others find it busy and skip.
//!
//! ```sh
//! cargo run --example nightly_job                                  # memory://
//! LOCK_URL=redis://127.0.0.1:6379 cargo run --example nightly_job -F redis
//! ```

use std::time::Duration;

use lockkit::GuardOptions;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".into());
    let locker = lockkit::connect(&url).await?;

    // No wait: if another instance is running the job, skip this round.
    let options = GuardOptions::new(Duration::from_secs(30));
    match locker
        .with_lock("jobs/nightly-report", options, run_report)
        .await
    {
        Ok(rows) => println!("report written: {rows} rows"),
        Err(e) if e.is_contended() => println!("another instance is running the report; skipped"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// The job. The lock is renewed while it runs; if the lock is lost, this
/// future is dropped at its next await and `with_lock` says so.
async fn run_report(token: lockkit::FencingToken) -> u64 {
    println!("running the report under fencing token {token}");
    tokio::time::sleep(Duration::from_millis(50)).await; // the real work
    1234
}
