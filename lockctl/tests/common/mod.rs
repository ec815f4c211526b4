//! Running the real `lockctl` binary, and the servers it can reach.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Generous bound for anything a test waits on.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Exit codes, as documented in `lockctl --help`.
pub mod code {
    pub const USAGE: i32 = 64;
    pub const UNAVAILABLE: i32 = 69;
    pub const NOT_ACQUIRED: i32 = 75;
    pub const LOST: i32 = 77;
    pub const CONFIG: i32 = 78;
    pub const NOT_FOUND: i32 = 127;
}

/// `lockctl` with a clean environment for its own variables.
pub fn lockctl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    c.env_remove("LOCK_URL").env_remove("LOCKKIT_CONFIG");
    c
}

/// Runs `lockctl args...` to completion.
pub fn output(args: &[&str]) -> Output {
    lockctl()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("lockctl runs")
}

/// Asserts a failure: the exit code, exactly one line on stderr that
/// contains `needle`, and no panic.
pub fn assert_fails(out: &Output, code: i32, needle: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(stderr.starts_with("lockctl: "), "{stderr}");
    assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// A key no other run uses.
pub fn unique_key(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "lockctl-test/{}-{nanos:x}-{}/{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The shared servers whose backend this build of lockctl includes: (name, url).
/// A server that is compiled in but whose URL is missing fails the test when
/// `LOCKKIT_REQUIRE_SERVERS=1`.
pub fn servers() -> Vec<(&'static str, String)> {
    let candidates = [
        ("redis", "LOCKKIT_REDIS_URL"),
        ("redis+sentinel", "LOCKKIT_REDIS_SENTINEL_URL"),
        ("redlock", "LOCKKIT_REDLOCK_URL"),
        ("etcd", "LOCKKIT_ETCD_URL"),
        ("postgres", "LOCKKIT_POSTGRES_URL"),
    ];
    let built = lockkit::available_schemes();
    let found: Vec<_> = candidates
        .into_iter()
        .filter(|(scheme, _)| built.contains(scheme))
        .filter_map(|(scheme, var)| conformance_tests::server_url(var).map(|u| (scheme, u)))
        .collect();
    if found.is_empty() {
        eprintln!(
            "skipped: no shared server reachable by this build (schemes built in: {}); build with --all-features and source urls.env",
            built.join(", ")
        );
    }
    found
}

/// Polls for a file to appear (the event tests wait on).
pub fn wait_for_file(path: &Path) {
    let until = Instant::now() + PATIENCE;
    while !path.exists() {
        assert!(Instant::now() < until, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a child process to exit, within `PATIENCE`.
pub fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let until = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= until {
            let _ = child.kill();
            panic!("lockctl did not exit within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True while `pid` is a live process (a zombie counts as gone).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
            state != Some('Z') && state != Some('X')
        }
        Err(_) => false,
    }
}

/// Reads a pid written by a test command.
pub fn read_pid(path: &Path) -> i32 {
    let until = Instant::now() + PATIENCE;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < until, "no pid in {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes `key`'s grant behind its holder's back, with `lockctl release
/// --force`, which every backend offers.
pub fn remove_from_outside(backend: &str, url: &str, key: &str) {
    let out = output(&["--url", url, "release", key, "--force", "--yes-i-know"]);
    assert!(
        out.status.success(),
        "{backend}: force release failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A process a test started that may escape lockctl: killed when the test
/// ends, so that a failed run leaves nothing behind.
pub struct Stray {
    /// Its pid.
    pub pid: i32,
    /// Its start time, so that a reused pid is never killed.
    start: Option<String>,
}

impl Stray {
    /// The process `pid`, as it is now.
    pub fn new(pid: i32) -> Stray {
        Stray {
            pid,
            start: start_time(pid),
        }
    }
}

impl Drop for Stray {
    fn drop(&mut self) {
        if self.start.is_some() && start_time(self.pid) == self.start && process_alive(self.pid) {
            let pid = nix::unistd::Pid::from_raw(self.pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// The start time of `pid` (field 22 of its /proc stat).
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit(") ").next()?.split(' ').nth(19)?.to_owned())
}

/// Whether the backend at `url` offers `mode`, as its capabilities say.
pub fn offers(url: &str, mode: lockkit::Mode) -> bool {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let locker = runtime.block_on(lockkit::connect(url)).expect("connects");
    locker.capabilities().offer(&mode).is_offered()
}

/// Starts `runs` lockctl runs of `run KEY <mode_args>` at once, each a
/// command that notes its start, waits (10 s at most) until two runs have
/// started, and notes its end; checks that each succeeded and returns the
/// log, one `start` or `end` per line. Under an exclusive lock the first
/// run would wait alone, so two `start`s in a row show two runs together.
pub fn runs_that_wait_for_a_second(
    backend: &str,
    url: &str,
    key: &str,
    mode_args: &[&str],
    runs: usize,
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo start >> {log}; i=0; while [ $(grep -c start {log}) -lt 2 ] && [ $i -lt 100 ]; \
         do sleep 0.1; i=$((i+1)); done; echo end >> {log}",
        log = log.display()
    );
    let children: Vec<_> = (0..runs)
        .map(|_| {
            lockctl()
                .args(["--url", url, "run", key])
                .args(mode_args)
                .args(["--ttl", "10s", "--wait", "60s", "--", "sh", "-c", &script])
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("lockctl starts")
        })
        .collect();
    for mut child in children {
        let status = wait_exit(&mut child);
        assert!(status.success(), "{backend}: {status}");
    }
    std::fs::read_to_string(&log).unwrap()
}
