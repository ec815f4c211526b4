//! Every process below lockctl, read from /proc: what a lost lock or the
//! command's end must terminate, wherever in the tree it went.
//!
//! A process group misses what left it: a `setsid` child, a daemon's double
//! fork, a server that detaches. On Linux lockctl is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so such a process, once its parent exits, is
//! re-parented to lockctl rather than to init, and stays in this tree. A
//! cgroup would hold them too, but it needs a delegated, writable cgroup v2
//! subtree (rare for an unprivileged user or inside a container) and
//! `cgroup.kill` (Linux 5.14): not simpler, and not always there.
//!
//! Where /proc cannot be read (another platform) the tree is empty and the
//! process group is all lockctl can reach.

use std::collections::HashMap;
use std::fs;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// One process of the tree, as /proc showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Process {
    /// Its id.
    pub pid: Pid,
    /// Its parent's id.
    pub ppid: Pid,
    /// Its process group.
    pub pgid: Pid,
    /// Exited, waiting for its parent to reap it.
    pub zombie: bool,
    /// When it started, in clock ticks since boot: with the pid, it names
    /// the process even after the pid is reused.
    start: u64,
}

impl Process {
    /// Its pid with its start time: this process, and no later one that
    /// gets the same pid.
    pub fn id(&self) -> (Pid, u64) {
        (self.pid, self.start)
    }

    /// Sends `sig`, unless the pid now names another process (the one seen
    /// exited and its pid was reused since the scan).
    pub fn signal(&self, sig: Signal) {
        if read(self.pid).is_some_and(|now| now.start == self.start) {
            // ESRCH: it exited meanwhile, nothing to stop.
            let _ = kill(self.pid, sig);
        }
    }
}

/// Every process below `root` (its children, theirs, and so on), zombies
/// included, parents before their children.
pub fn below(root: Pid) -> Vec<Process> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<Pid, Vec<Process>> = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(process) = read(Pid::from_raw(pid)) {
            children.entry(process.ppid).or_default().push(process);
        }
    }
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for child in children.remove(&parent).unwrap_or_default() {
            parents.push(child.pid);
            found.push(child);
        }
    }
    found
}

/// `/proc/<pid>/stat`, or None once the process is gone.
fn read(pid: Pid) -> Option<Process> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse(pid, &stat)
}

/// Reads the fields after the command name, which may itself hold `) `:
/// state, ppid, pgrp, then the 19th further on, starttime.
fn parse(pid: Pid, stat: &str) -> Option<Process> {
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<i64>().ok();
    Some(Process {
        pid,
        ppid: Pid::from_raw(i32::try_from(number(1)?).ok()?),
        pgid: Pid::from_raw(i32::try_from(number(2)?).ok()?),
        zombie: matches!(fields.first(), Some(&("Z" | "X"))),
        start: u64::try_from(number(19)?).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_parentheses_and_spaces_is_skipped() {
        let stat = "42 (a) b (c) S 7 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123456 1 2";
        let p = parse(Pid::from_raw(42), stat).unwrap();
        assert_eq!(
            (p.ppid.as_raw(), p.pgid.as_raw(), p.zombie, p.start),
            (7, 42, false, 123456)
        );
        let zombie = stat.replace(") S ", ") Z ");
        assert!(parse(Pid::from_raw(42), &zombie).unwrap().zombie);
        assert_eq!(parse(Pid::from_raw(42), "42 (truncated"), None);
        assert_eq!(parse(Pid::from_raw(42), "42 (x) S 7"), None);
    }

    #[test]
    fn the_tree_below_this_test_holds_its_child_and_grandchild() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 1000 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let tree = below(nix::unistd::getpid());
        let _ = kill(Pid::from_raw(grandchild), Signal::SIGKILL);
        let _ = child.wait();
        let pids: Vec<i32> = tree.iter().map(|p| p.pid.as_raw()).collect();
        assert!(pids.contains(&(child.id() as i32)), "{pids:?}");
        assert!(pids.contains(&grandchild), "{pids:?}");
    }
}
