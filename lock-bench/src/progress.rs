//! The run's progress on stderr: the step, what runs, its operation count,
//! the time spent and an estimate of the time left. On a terminal this is
//! an indicatif bar that updates in place; otherwise each step prints one
//! plain line.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressState, ProgressStyle};

/// The progress of one run.
pub struct Progress {
    started: Instant,
    step: AtomicUsize,
    total: usize,
    /// When the current step began, in milliseconds since `started`.
    step_began_ms: Arc<AtomicU64>,
    /// The bar, on a terminal only.
    bar: Option<ProgressBar>,
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

/// The time left: the steps done so far took `done_by` in all, so each
/// step left is taken to last as long as they did on average, less what
/// the step under way has run already. `None` before the first step ends.
pub(crate) fn time_left(
    done: usize,
    total: usize,
    done_by: Duration,
    in_step: Duration,
) -> Option<Duration> {
    if done == 0 {
        return None;
    }
    let per_step = done_by / u32::try_from(done).unwrap_or(u32::MAX);
    let left = u32::try_from(total.saturating_sub(done)).unwrap_or(u32::MAX);
    // The step under way is not done: never less than what the others need.
    let floor = per_step * left.saturating_sub(1);
    Some((per_step * left).saturating_sub(in_step).max(floor))
}

/// `m:ss`, or `h:mm:ss` from an hour on.
pub(crate) fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// "about 2:30 left", or "estimating" before there is anything to go on.
fn left_text(left: Option<Duration>) -> String {
    left.map_or("estimating time left".into(), |d| {
        format!("about {} left", clock(d))
    })
}

impl Progress {
    /// A run of about `total` steps.
    pub fn new(total: usize) -> Arc<Progress> {
        let step_began_ms = Arc::new(AtomicU64::new(0));
        let bar = std::io::stderr().is_terminal().then(|| {
            let began = step_began_ms.clone();
            let left = move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let began = Duration::from_millis(began.load(Ordering::Relaxed));
                let done = usize::try_from(state.pos()).unwrap_or(usize::MAX);
                let total = state
                    .len()
                    .map_or(done, |l| usize::try_from(l).unwrap_or(usize::MAX));
                let in_step = state.elapsed().saturating_sub(began);
                let _ = w.write_str(&left_text(time_left(done, total, began, in_step)));
            };
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{bar:24}] {pos:>3}/{len:<3} {left} · {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key("left", left)
            .progress_chars("=> ");
            let bar = ProgressBar::new(total as u64).with_style(style);
            bar.enable_steady_tick(Duration::from_millis(500));
            bar
        });
        Arc::new(Progress {
            started: Instant::now(),
            step: AtomicUsize::new(0),
            total,
            step_began_ms,
            bar,
        })
    }

    /// Starts the next step.
    pub fn step(self: &Arc<Self>, label: String) -> Step {
        let n = self.step.fetch_add(1, Ordering::Relaxed) + 1;
        let total = self.total.max(n);
        let elapsed = self.started.elapsed();
        let millis = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.step_began_ms.store(millis, Ordering::Relaxed);
        let ops = Arc::new(AtomicU64::new(0));
        let Some(bar) = &self.bar else {
            let left = left_text(time_left(n - 1, total, elapsed, Duration::ZERO));
            eprintln!(
                "lab [{n:>3}/{total:<3}] {label} (run {}, {left})",
                clock(elapsed)
            );
            return Step { ops, ticker: None };
        };
        bar.set_length(total as u64);
        bar.set_position((n - 1) as u64);
        bar.set_message(label.clone());
        let (bar, counter, begun) = (bar.clone(), ops.clone(), Instant::now());
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let done = counter.load(Ordering::Relaxed);
                bar.set_message(format!(
                    "{label} · {done} ops · {:.1}s",
                    begun.elapsed().as_secs_f64()
                ));
            }
        });
        Step {
            ops,
            ticker: Some(ticker),
        }
    }

    /// Ends the bar (before printing the summary).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        eprintln!("lab: done in {}", clock(self.started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_time_left_is_the_average_step_times_the_steps_left() {
        assert_eq!(time_left(0, 10, S(0), S(3)), None);
        // 4 steps in 40 s: 6 left at 10 s each, the current one 4 s in.
        assert_eq!(time_left(4, 10, S(40), S(4)), Some(S(56)));
        // A step running long does not eat into the steps after it.
        assert_eq!(time_left(4, 10, S(40), S(30)), Some(S(50)));
        // More steps than planned: nothing left, not an underflow.
        assert_eq!(time_left(12, 10, S(60), S(1)), Some(S(0)));
    }

    #[test]
    fn times_read_as_a_clock() {
        assert_eq!(clock(S(5)), "0:05");
        assert_eq!(clock(S(13 * 60 + 7)), "13:07");
        assert_eq!(clock(S(3600 + 62)), "1:01:02");
        assert_eq!(left_text(None), "estimating time left");
        assert_eq!(left_text(Some(S(150))), "about 2:30 left");
    }
}
