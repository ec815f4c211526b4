//! `lockctl run`: a command in its own process group, under a renewed lock.
//!
//! The command is started as the leader of a new process group, so that
//! the signals lockctl forwards reach everything it starts at once. If the
//! lock is lost, the command and every process it started are terminated
//! (SIGTERM, then SIGKILL after the grace period) before lockctl exits: no
//! grandchild keeps running unprotected. Processes the command leaves
//! behind when it exits are terminated the same way before the lock is
//! released, for the same reason. On Linux lockctl is a child subreaper, so
//! that processes which left the group (`setsid`, a daemon's double fork)
//! are re-parented to it and found below it ([`crate::stop`]).

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockkit::{GuardOptions, Locker, Mode};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::exit;
use crate::printable;
use crate::stop::Tree;
use crate::terminal::{self, Foreground};

/// What `lockctl run` was asked to do.
pub struct RunOptions {
    /// The backend key.
    pub key: String,
    /// Exclusive, or one permit of a semaphore.
    pub mode: Mode,
    /// TTL of the grant, renewed every TTL/3.
    pub ttl: Duration,
    /// How long to wait for the lock.
    pub wait: Duration,
    /// Between SIGTERM and SIGKILL when the group must go; at most an hour
    /// (the command line caps it), so adding it to an `Instant` cannot overflow.
    pub grace: Duration,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

/// The signals forwarded to the command's process group. The command runs
/// in a group of its own, so keys pressed in the terminal reach only
/// lockctl's group: lockctl passes them on.
const FORWARDED: [(SignalKind, Signal); 4] = [
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
];

/// Ctrl-Z. Stopped, lockctl would stop renewing while its command, which
/// does not get it, runs on: the lock would lapse under it. So lockctl
/// catches it and keeps going. (SIGTTIN and SIGTTOU are left alone: caught,
/// a write to the terminal from the background under `stty tostop` would
/// be retried for ever instead of stopping lockctl.)
const CTRL_Z: SignalKind = SignalKind::from_raw(Signal::SIGTSTP as i32);

/// Runs the command under the lock and returns lockctl's exit code.
pub async fn run(locker: &Locker, opts: RunOptions) -> ExitCode {
    // Take over the signals before anything else, so that a Ctrl-C never
    // kills lockctl while its command runs on unsignalled.
    let mut streams = Vec::new();
    for (kind, sig) in FORWARDED {
        match signal(kind) {
            Ok(s) => streams.push((s, sig)),
            Err(e) => {
                eprintln!("lockctl: cannot handle {sig}: {e}");
                return ExitCode::from(exit::UNAVAILABLE);
            }
        }
    }
    let [(int, _), (term, _), (hup, _), (quit, _)] = &mut streams[..] else {
        unreachable!("four signals registered above")
    };
    // A caught signal stays caught for the life of the process: nothing
    // needs to read it.
    if let Err(e) = signal(CTRL_Z) {
        eprintln!("lockctl: cannot handle {}: {e}", Signal::SIGTSTP);
        return ExitCode::from(exit::UNAVAILABLE);
    }
    let mut orphans = match signal(SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lockctl: cannot handle {}: {e}", Signal::SIGCHLD);
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };

    let options = GuardOptions::new(opts.ttl).wait(opts.wait);
    let guard = tokio::select! {
        got = locker.guard_in(&opts.key, opts.mode, options) => match got {
            Ok(guard) => guard,
            Err(e) => return exit::fail(&e),
        },
        // Interrupted while waiting: nothing runs yet; give up as a shell would.
        _ = int.recv() => return ExitCode::from(128 + Signal::SIGINT as u8),
        _ = term.recv() => return ExitCode::from(128 + Signal::SIGTERM as u8),
        _ = hup.recv() => return ExitCode::from(128 + Signal::SIGHUP as u8),
        _ = quit.recv() => return ExitCode::from(128 + Signal::SIGQUIT as u8),
    };

    // Orphans below the command (a `setsid` child, a daemon's double fork)
    // come to lockctl rather than init, so that it can find and stop them.
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!(
            "lockctl: warning: cannot become a child subreaper ({e}): a process the command detaches may outlive the lock"
        );
    }

    let mut command = Command::new(&opts.command[0]);
    command
        .args(&opts.command[1..])
        .env("LOCK_KEY", &opts.key)
        .env(
            "LOCK_FENCING_TOKEN",
            guard.fencing_token().get().to_string(),
        )
        .env("LOCK_DEADLINE", unix_millis(guard.deadline()).to_string())
        // The command has no use for it, and it may carry a password.
        .env_remove(crate::target::URL_ENV)
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            let name = opts.command[0].to_string_lossy();
            eprintln!("lockctl: cannot run `{}`: {e}", printable::text(&name));
            return ExitCode::from(match e.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            });
        }
    };
    let Some(pgid) = child.id().map(|id| Pid::from_raw(id as i32)) else {
        eprintln!("lockctl: the command exited before it could be watched");
        return ExitCode::from(exit::CANNOT_EXECUTE);
    };

    // In a terminal, the command gets its foreground (lockctl keeps its
    // own group, and gets the terminal back when `foreground` is dropped).
    let foreground = Foreground::lend(pgid);
    let mut tree = Tree::new(pgid);
    let lost = guard.lost();
    tokio::pin!(lost);
    // Set by a forwarded SIGTERM: what is still running --grace later gets
    // SIGKILL, as `timeout -k` does, so that lockctl never holds the lock
    // for a command that will not stop.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let status = loop {
        let killing = async {
            match kill_at {
                Some(at) if !killed => sleep_until(at).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            reason = &mut lost => {
                eprintln!(
                    "lockctl: lock `{}` lost while the command ran ({}); terminating it and every process it started",
                    printable::key(&opts.key),
                    printable::text(&reason.to_string())
                );
                let until = kill_at.unwrap_or_else(|| Instant::now() + opts.grace);
                tree.stop(Some(&mut child), until).await;
                return ExitCode::from(exit::LOST);
            }
            status = child.wait() => break status,
            _ = int.recv() => tree.forward(Signal::SIGINT),
            _ = term.recv() => {
                tree.forward(Signal::SIGTERM);
                kill_at.get_or_insert_with(|| Instant::now() + opts.grace);
            }
            _ = hup.recv() => tree.forward(Signal::SIGHUP),
            _ = quit.recv() => tree.forward(Signal::SIGQUIT),
            // An orphan re-parented to lockctl has exited: reap it now, or
            // a long run would collect zombies. Or the command was stopped
            // (Ctrl-Z in the terminal it holds): it goes on.
            _ = orphans.recv() => {
                drop(tree.left());
                if let Some(fg) = &foreground
                    && terminal::is_stopped(pgid)
                {
                    fg.resume();
                }
            }
            () = killing => {
                eprintln!(
                    "lockctl: the command was still running {} after SIGTERM; killing it and every process it started",
                    lockkit::human::duration(opts.grace)
                );
                tree.kill_all();
                killed = true;
            }
        }
    };

    drop(foreground);
    // Whatever the command left running would run on without the lock: it
    // goes before the lock is released. After a forwarded SIGTERM the grace
    // period is already running (or over): it is not started again when
    // the command exits.
    let until = kill_at.unwrap_or_else(|| Instant::now() + opts.grace);
    tree.stop(None, until).await;
    if let Some(reason) = guard.lost_reason() {
        eprintln!(
            "lockctl: lock `{}` was lost before the command finished ({})",
            printable::key(&opts.key),
            printable::text(&reason.to_string())
        );
        return ExitCode::from(exit::LOST);
    }
    if let Err(e) = guard.release().await {
        // The command finished while the lock was held; the TTL frees it.
        eprintln!(
            "lockctl: warning: release failed, the TTL will free the lock: {}",
            printable::text(&e.to_string())
        );
    }
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => ExitCode::from(code as u8),
            (None, Some(sig)) => ExitCode::from(128u8.wrapping_add(sig as u8)),
            (None, None) => ExitCode::FAILURE,
        },
        Err(e) => {
            eprintln!("lockctl: lost track of the command: {e}");
            ExitCode::from(exit::CANNOT_EXECUTE)
        }
    }
}

/// A monotonic deadline as milliseconds since the Unix epoch on this
/// machine's wall clock: now plus the time left.
fn unix_millis(deadline: Instant) -> u128 {
    let left = deadline.saturating_duration_since(Instant::now());
    (SystemTime::now() + left)
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
