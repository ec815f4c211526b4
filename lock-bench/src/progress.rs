//! A live progress line on stderr: the step, what runs, its operation count
//! and the time spent. On a terminal the line updates in place; otherwise
//! each step prints one line.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The progress of one run.
pub struct Progress {
    started: Instant,
    step: AtomicUsize,
    total: usize,
    tty: bool,
}

/// One step; its ticker stops when this is dropped.
pub struct Step {
    /// Operations done so far in this step (shown on the line).
    pub ops: Arc<AtomicU64>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Step {
    fn drop(&mut self) {
        if let Some(t) = self.ticker.take() {
            t.abort();
        }
    }
}

impl Progress {
    /// A run of about `total` steps.
    pub fn new(total: usize) -> Arc<Progress> {
        Arc::new(Progress {
            started: Instant::now(),
            step: AtomicUsize::new(0),
            total,
            tty: std::io::stderr().is_terminal(),
        })
    }

    /// Starts the next step.
    pub fn step(self: &Arc<Self>, label: String) -> Step {
        let n = self.step.fetch_add(1, Ordering::Relaxed) + 1;
        let ops = Arc::new(AtomicU64::new(0));
        let head = format!("[{n:>3}/{:<3}] {label}", self.total.max(n));
        if !self.tty {
            eprintln!("lab {head}");
            return Step { ops, ticker: None };
        }
        let (this, counter, begun) = (self.clone(), ops.clone(), Instant::now());
        let ticker = tokio::spawn(async move {
            loop {
                let done = counter.load(Ordering::Relaxed);
                let total = this.started.elapsed().as_secs();
                eprint!(
                    "\r\x1b[2K{head} · {done} ops · {:.1}s · run {}:{:02}",
                    begun.elapsed().as_secs_f64(),
                    total / 60,
                    total % 60
                );
                let _ = std::io::stderr().flush();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Step {
            ops,
            ticker: Some(ticker),
        }
    }

    /// Ends the line (before printing the summary).
    pub fn finish(&self) {
        if self.tty {
            eprintln!(
                "\r\x1b[2Klab: done in {:.0}s",
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}
