//! The terminal's foreground, handed to the command as `flock` and
//! `etcdctl lock` leave it: a command that reads the terminal (a prompt, an
//! editor) gets what the user types, and keys such as Ctrl-C reach it
//! directly. The command still runs in a process group of its own, which
//! lockctl signals and stops as a whole; lockctl takes the terminal back
//! when the command ends.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

/// The terminal lent to the command's group; given back on drop.
pub struct Foreground {
    command: Pid,
}

impl Foreground {
    /// Hands the terminal on stdin to the `command` group, if lockctl's own
    /// group has it (lockctl runs in the foreground of a terminal);
    /// otherwise there is nothing to lend.
    pub fn lend(command: Pid) -> Option<Foreground> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() || tcgetpgrp(stdin.as_fd()).ok()? != getpgrp() {
            return None;
        }
        set_foreground(command).ok()?;
        Some(Foreground { command })
    }

    /// Ctrl-Z stopped the command: lockctl holds the lock on, so it gives
    /// the command the terminal again and continues it, as it ignores
    /// Ctrl-Z itself (a command stopped under a held lock would keep every
    /// other holder out with no one at the terminal able to resume it).
    pub fn resume(&self) {
        let _ = set_foreground(self.command);
        let _ = killpg(self.command, Signal::SIGCONT);
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let _ = set_foreground(getpgrp());
    }
}

/// Makes `group` the terminal's foreground group. lockctl may be in the
/// background when it calls this, where the kernel would stop it with
/// SIGTTOU; blocked, the signal is not sent and the call goes through.
fn set_foreground(group: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut before = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before))?;
    let done = tcsetpgrp(std::io::stdin().as_fd(), group);
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
    done
}

/// Whether the process `pid` is stopped (state `T` in /proc; Linux).
pub fn is_stopped(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit(") ").next()?.chars().next())
        == Some('T')
}
