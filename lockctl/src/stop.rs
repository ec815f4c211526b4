//! Stopping the command and everything it started: its process group, and
//! every other process below lockctl (one in a session of its own, a
//! daemon's double fork), which a signal to the group would miss.
//!
//! SIGTERM first (each process once, with SIGCONT so that a stopped one
//! gets it), SIGKILL once the grace period has passed, and a new look at
//! the tree after each step until nothing is left, since a process may
//! start another while it is being stopped.

use std::collections::HashSet;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{Pid, getpid};
use tokio::process::Child;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::descendants::{self, Process};

/// How often the tree is looked at again while it is being stopped: no
/// event says that a process outside lockctl's children has exited.
const POLL: Duration = Duration::from_millis(20);

/// How long processes that were all sent SIGKILL may take to vanish before
/// lockctl goes on: one still there is in an uninterruptible wait (a hung
/// file system, say) and dies as soon as it leaves it, without running
/// another instruction of its own.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The command's process group and the processes below lockctl, and which
/// of them were already told to stop.
pub struct Tree {
    me: Pid,
    /// The command's process group; also the command's pid.
    pgid: Pid,
    /// Whether the group as a whole was sent SIGTERM.
    group_told: bool,
    /// (pid, start time) of each process sent SIGTERM, so that none gets it
    /// twice (a second SIGTERM means "hurry" to some programs).
    told: HashSet<(Pid, u64)>,
    /// (pid, start time) of each process sent SIGKILL.
    killed: HashSet<(Pid, u64)>,
}

impl Tree {
    /// The tree below this process, around the command whose group is `pgid`.
    pub fn new(pgid: Pid) -> Tree {
        Tree {
            me: getpid(),
            pgid,
            group_told: false,
            told: HashSet::new(),
            killed: HashSet::new(),
        }
    }

    /// Forwards `sig` to the command's group (SIGTERM also to every process
    /// below lockctl outside it): lockctl's SIGTERM means that all of it
    /// should end.
    pub fn forward(&mut self, sig: Signal) {
        if sig == Signal::SIGTERM {
            let left = self.left();
            self.terminate(true, &left);
        } else {
            forward(self.pgid, sig);
        }
    }

    /// The live processes below lockctl, once the exited ones that were
    /// re-parented to it are reaped (zombies hold a pid each until then).
    /// The command itself is left to tokio, which waits for it.
    pub fn left(&self) -> Vec<Process> {
        let mut live = descendants::below(self.me);
        for p in live.iter().filter(|p| p.zombie) {
            if p.ppid == self.me && p.pid != self.pgid {
                let _ = waitpid(p.pid, Some(WaitPidFlag::WNOHANG));
            }
        }
        live.retain(|p| !p.zombie);
        live
    }

    /// SIGTERM (and SIGCONT) to the group when `group`, and to each process
    /// of `left` not told before.
    fn terminate(&mut self, group: bool, left: &[Process]) {
        if group {
            forward(self.pgid, Signal::SIGTERM);
            self.group_told = true;
            let in_group = left.iter().filter(|p| p.pgid == self.pgid);
            self.told.extend(in_group.map(Process::id));
        }
        for p in left {
            if self.told.insert(p.id()) {
                p.signal(Signal::SIGTERM);
                p.signal(Signal::SIGCONT);
            }
        }
    }

    /// SIGKILL to the group and to each process of `left`; returns whether
    /// every one of them had been sent it before.
    fn kill(&mut self, left: &[Process]) -> bool {
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let mut all_before = true;
        for p in left {
            if self.killed.insert(p.id()) {
                all_before = false;
                p.signal(Signal::SIGKILL);
            }
        }
        all_before
    }

    /// SIGKILL to the group and to every process below lockctl, at once.
    pub fn kill_all(&mut self) {
        let left = self.left();
        self.kill(&left);
    }

    /// Stops everything: SIGTERM, then SIGKILL once `until` has passed,
    /// until nothing is left. `leader` is the command while it still runs.
    pub async fn stop(&mut self, mut leader: Option<&mut Child>, until: Instant) {
        let mut kill_wait_ends: Option<Instant> = None;
        loop {
            let left = self.left();
            // The group is all there is to look at where /proc is not.
            if leader.is_none() && left.is_empty() && !group_alive(self.pgid) {
                return;
            }
            let now = Instant::now();
            if now < until {
                self.terminate(!self.group_told, &left);
            } else {
                let all_before = self.kill(&left);
                let ends = *kill_wait_ends.get_or_insert(now + KILL_WAIT);
                if all_before && now >= ends {
                    let pids: Vec<String> = left.iter().map(|p| p.pid.to_string()).collect();
                    eprintln!(
                        "lockctl: warning: still there {KILL_WAIT:?} after SIGKILL (in an uninterruptible wait, they die when it ends): {}",
                        pids.join(" ")
                    );
                    return;
                }
            }
            let next = if now < until {
                (now + POLL).min(until)
            } else {
                now + POLL
            };
            // The command's exit is an event: it ends the wait at once.
            match leader.as_deref_mut() {
                Some(child) => {
                    if timeout_at(next, child.wait()).await.is_ok() {
                        leader = None;
                    }
                }
                None => sleep_until(next).await,
            }
        }
    }
}

/// `sig` to the group, then SIGCONT: a stopped process (one that read the
/// terminal from the background, say) would keep the signal pending, and
/// lockctl the lock, for good.
fn forward(pgid: Pid, sig: Signal) {
    // ESRCH: the group is already gone, nothing to tell.
    let _ = killpg(pgid, sig);
    let _ = killpg(pgid, Signal::SIGCONT);
}

fn group_alive(pgid: Pid) -> bool {
    !matches!(killpg(pgid, None), Err(Errno::ESRCH))
}
