//! The machinery every server type shares: finding binaries and free ports,
//! spawning a child with its output in a log file, signalling it, and waiting
//! (bounded) until it answers.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// How long a server gets to answer after it was started.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Directories searched after `PATH`: Debian keeps the PostgreSQL server
/// binaries (initdb, postgres, pg_ctl) off `PATH`.
const EXTRA_BIN_DIRS: &[&str] = &["/usr/lib/postgresql/15/bin"];

/// Finds `name` on `PATH` or in the PostgreSQL bin dir.
pub(crate) fn find_binary(name: &str) -> io::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(EXTRA_BIN_DIRS.iter().map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "lock-testkit: binary `{name}` not found on PATH nor in {}; \
             `scripts/servers.sh up` installs it",
            EXTRA_BIN_DIRS.join(", ")
        ),
    ))
}

/// Returns a loopback port nobody listens on right now, found by binding
/// `127.0.0.1:0`. Ports handed out earlier by this process are never handed
/// out twice, so parallel tests in one binary do not race each other for the
/// same port (another process still can, hence the retries on "address in use"
/// in the `start` functions).
pub(crate) fn free_port() -> io::Result<u16> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    for _ in 0..100 {
        let port = TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
        if lock(&HANDED_OUT).insert(port) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "lock-testkit: no free loopback port found",
    ))
}

/// Locks a mutex, ignoring poisoning: a panicking test must not make the
/// Drop of a server (which kills the process) panic too.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How a server process is (re)started: the same command every time.
#[derive(Debug)]
pub(crate) struct Spec {
    /// Short name for messages, e.g. "redis-server 127.0.0.1:4321".
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub cwd: PathBuf,
    /// Appended to across restarts, so the tail shows the whole story.
    pub log: PathBuf,
    /// Run as this uid/gid (PostgreSQL refuses to run as root).
    pub user: Option<(u32, u32)>,
    /// Extra environment variables (the rest is inherited).
    pub env: Vec<(String, String)>,
}

/// A server process that can be started again with the same command.
#[derive(Debug)]
pub(crate) struct Process {
    pub spec: Spec,
    child: Mutex<Option<Child>>,
}

impl Process {
    pub fn new(spec: Spec) -> Self {
        Process {
            spec,
            child: Mutex::new(None),
        }
    }

    /// Spawns the process; it must not be running.
    pub fn spawn(&self) -> io::Result<()> {
        let mut slot = lock(&self.child);
        if let Some(child) = slot.as_mut()
            && child.try_wait()?.is_none()
        {
            return Err(io::Error::other(format!(
                "{} is already running",
                self.spec.name
            )));
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)?;
        let mut cmd = Command::new(&self.spec.program);
        cmd.args(&self.spec.args)
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.spec.cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some((uid, gid)) = self.spec.user {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "lock-testkit: cannot spawn {}: {e}",
                    self.spec.program.display()
                ),
            )
        })?;
        *slot = Some(child);
        Ok(())
    }

    /// The PID while the process runs (or is paused).
    pub fn pid(&self) -> Option<u32> {
        let mut slot = lock(&self.child);
        let child = slot.as_mut()?;
        match child.try_wait() {
            Ok(None) => Some(child.id()),
            _ => None,
        }
    }

    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Sends `sig` to the running process.
    pub fn signal(&self, sig: Signal) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other(format!("{} is not running", self.spec.name)))?;
        signal::kill(Pid::from_raw(pid as i32), sig).map_err(io::Error::from)
    }

    /// SIGKILL and reap. Fine when the process is not running (or paused).
    pub fn kill(&self) -> io::Result<()> {
        let mut slot = lock(&self.child);
        if let Some(mut child) = slot.take() {
            if child.try_wait()?.is_none() {
                // ESRCH only if it died in between: wait() below reaps it.
                let _ = child.kill();
            }
            child.wait()?;
        }
        Ok(())
    }

    /// The last `lines` lines of the log file.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.spec.log, lines)
    }

    /// Polls `ready` until it returns true, for at most [`READY_TIMEOUT`].
    /// Fails early if the process exits. Errors carry the tail of the log;
    /// their kind is `AddrInUse` when the log says the port was taken, so the
    /// caller can retry on other ports.
    pub fn wait_ready(&self, what: &str, mut ready: impl FnMut() -> bool) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pause = Duration::from_millis(10);
        loop {
            if ready() {
                return Ok(());
            }
            if !self.is_running() {
                return Err(self.startup_error(&format!("exited before it was {what}")));
            }
            if Instant::now() >= deadline {
                let mut err =
                    self.startup_error(&format!("was not {what} after {READY_TIMEOUT:?}"));
                if err.kind() != io::ErrorKind::AddrInUse {
                    err = io::Error::new(io::ErrorKind::TimedOut, err.to_string());
                }
                return Err(err);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    fn startup_error(&self, what: &str) -> io::Error {
        let tail = self.log_tail(30);
        let kind = if tail.to_ascii_lowercase().contains("address already in use") {
            io::ErrorKind::AddrInUse
        } else {
            io::ErrorKind::Other
        };
        io::Error::new(
            kind,
            format!(
                "lock-testkit: {} {what}; last lines of {}:\n{tail}",
                self.spec.name,
                self.spec.log.display()
            ),
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// The last `lines` lines of a file (at most its last 64 KiB are read).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        let all: Vec<&str> = text.lines().collect();
        Ok(all[all.len().saturating_sub(lines)..].join("\n"))
    };
    read().unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()))
}

/// Runs a client command (redis-cli, etcdctl, psql) to completion and
/// returns its stdout with the trailing newline removed; a non-zero exit
/// becomes an error carrying stderr.
pub(crate) fn run_client(cmd: &mut Command) -> io::Result<String> {
    let out = cmd.stdin(Stdio::null()).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout)
        .trim_end_matches(['\n', '\r'])
        .to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(io::Error::other(format!(
            "lock-testkit: {cmd:?} failed ({}): {}{}",
            out.status,
            stderr.trim(),
            if stderr.trim().is_empty() {
                stdout.as_str()
            } else {
                ""
            }
        )))
    }
}

/// Runs `attempt` up to three times while it fails because a port was taken
/// between [`free_port`] and the server's bind.
pub(crate) fn retry_addr_in_use<T>(mut attempt: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 0;
    loop {
        match attempt() {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 2 => tries += 1,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_names_it_and_the_script() {
        let err = find_binary("lock-testkit-no-such-binary").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let msg = err.to_string();
        assert!(msg.contains("`lock-testkit-no-such-binary`"), "{msg}");
        assert!(msg.contains("scripts/servers.sh up"), "{msg}");
    }

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let a = free_port().unwrap();
        let b = free_port().unwrap();
        assert_ne!(a, b);
        TcpListener::bind(("127.0.0.1", a)).unwrap();
    }

    #[test]
    fn env_reaches_the_process_on_every_spawn() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let process = Process::new(Spec {
            name: "sh".into(),
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!("echo \"$PROBE\" >> {}", out.display()).into(),
            ],
            cwd: dir.path().to_path_buf(),
            log: dir.path().join("log"),
            user: None,
            env: vec![("PROBE".into(), "on".into())],
        });
        for _ in 0..2 {
            process.spawn().unwrap();
            process.wait_ready("done", || false).ok();
        }
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "on\non\n");
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "1\n2\n3\n4\n").unwrap();
        assert_eq!(log_tail(&path, 2), "3\n4");
        assert!(log_tail(&dir.path().join("missing"), 2).contains("cannot read"));
    }
}
