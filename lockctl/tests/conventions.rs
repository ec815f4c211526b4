//! What users of `flock`, `etcdctl lock` and `consul lock` expect of the
//! real `lockctl` binary: waiting by default, `-n`, a hold mode, JSON for
//! scripts, the `--` hint, LOCK_URL shown in the help, log directives.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Stdio};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A `lockctl hold` that is killed if the test fails before it ends.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `lockctl --url URL hold KEY`, its first line read: (holder, its stdout,
/// the fencing token it printed).
fn hold(url: &str, key: &str) -> (Holder, BufReader<ChildStdout>, String) {
    let mut child = lockctl()
        .args(["--url", url, "hold", "-n", key, "--ttl", "10s"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("lockctl starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let child = Holder(child);
    let mut line = String::new();
    out.read_line(&mut line).expect("hold prints a line");
    let fields: Vec<_> = line.trim_end().split('\t').collect();
    assert_eq!(fields[..2], [key, "held"], "{line:?}");
    let token = fields[2]
        .strip_prefix("fencing_token=")
        .unwrap_or_else(|| panic!("no token in {line:?}"))
        .to_owned();
    (child, out, token)
}

/// The JSON `lockctl args...` prints and its exit code; `None` if the
/// backend cannot list locks (Redlock: exit 64, saying so).
fn json(args: &[&str]) -> Option<(Option<i32>, serde_json::Value)> {
    let out = output(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(code::USAGE) && stderr.contains("does not support listing") {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}; stderr: {stderr}"));
    Some((out.status.code(), value))
}

#[test]
fn a_command_without_the_double_dash_is_told_where_it_goes() {
    let out = output(&["--url", "memory://", "run", "k", "echo", "hi"]);
    assert_fails(&out, code::USAGE, "put the command after `--`");
}

#[test]
fn the_help_names_lock_url_but_never_shows_its_value() {
    let out = lockctl()
        .arg("--help")
        .env("LOCK_URL", "redis://:hunter2@h:6379")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[env: LOCK_URL"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");
}

#[test]
fn lock_url_in_the_environment_does_not_conflict_with_a_profile() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lockkit.toml");
    std::fs::write(&file, "[profiles.tests]\nurl = \"memory://\"\n").unwrap();
    let out = lockctl()
        .args(["--config", file.to_str().unwrap(), "--profile", "tests"])
        .args(["run", "k", "--", "true"])
        .env("LOCK_URL", "redis://127.0.0.1:1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn log_directives_select_targets_and_bad_ones_are_refused() {
    let out = lockctl()
        .args(["--url", "memory://", "run", "k", "--", "true"])
        .env("LOCKKIT_LOG", "lock_core=info,warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("acquired"), "no INFO event: {stderr}");
    let out = lockctl()
        .args(["--url", "memory://", "run", "k", "--", "true"])
        .env("LOCKKIT_LOG", "lock_core=loud")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_fails(&out, code::CONFIG, "lock_core=loud");
}

/// `run` waits for a held lock by default, as `flock` does; `-n` does not.
#[test]
fn run_waits_by_default_and_no_wait_fails_at_once() {
    for (backend, url) in servers() {
        let key = unique_key("waits");
        let (mut holder, _out, _) = hold(&url, &key);
        let waiter = lockctl()
            .args(["--url", &url, "run", &key, "--", "echo", "second"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = output(&["--url", &url, "run", "-n", &key, "--", "true"]);
        assert_fails(&out, code::NOT_ACQUIRED, &key);
        let mut waiter = waiter;
        assert!(
            waiter.try_wait().unwrap().is_none(),
            "{backend}: the waiter gave up while the lock was held"
        );
        kill(Pid::from_raw(holder.0.id() as i32), Signal::SIGINT).unwrap();
        assert!(wait_exit(&mut holder.0).success(), "{backend}");
        let out = waiter.wait_with_output().unwrap();
        assert!(out.status.success(), "{backend}: {:?}", out.status);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "second\n",
            "{backend}"
        );
    }
}

/// `hold` keeps the lock until Ctrl-C, `status --json` and `list --json`
/// see it with the token `hold` printed, and it is free afterwards.
#[test]
fn hold_keeps_the_lock_until_interrupted_and_json_shows_it() {
    for (backend, url) in servers() {
        let key = unique_key("held");
        let (mut holder, mut out, token) = hold(&url, &key);

        let listed = json(&["--url", &url, "status", "--json", &key]);
        if let Some((code, status)) = listed {
            check_listing(backend, &url, &key, &token, code, status);
        }

        kill(Pid::from_raw(holder.0.id() as i32), Signal::SIGINT).unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, format!("{key}\treleased\n"), "{backend}");
        assert!(wait_exit(&mut holder.0).success(), "{backend}");

        if let Some((code, status)) = json(&["--url", &url, "status", "--json", &key]) {
            assert_eq!(code, Some(1), "{backend}");
            assert_eq!(status["held"], false, "{backend}: {status}");
        }
        // A second holder gets the lock at once: the first let go.
        let (_again, _, _) = hold(&url, &key);
    }
}

/// `status --json` and `list --json` while `key` is held with `token`.
fn check_listing(
    backend: &str,
    url: &str,
    key: &str,
    token: &str,
    code: Option<i32>,
    status: serde_json::Value,
) {
    assert_eq!(code, Some(0), "{backend}: {status}");
    assert_eq!(status["key"], key, "{backend}");
    assert_eq!(status["held"], true, "{backend}");
    let remaining = status["remaining_ms"].as_u64();
    assert!(
        remaining.is_none_or(|ms| ms <= 10_000),
        "{backend}: {status}"
    );
    if let Some(t) = status["fencing_token"].as_u64() {
        assert_eq!(t.to_string(), token, "{backend}");
    }
    let prefix = key.rsplit_once('/').unwrap().0;
    let (code, list) = json(&["--url", url, "list", "--json", prefix]).unwrap();
    assert_eq!(code, Some(0), "{backend}");
    let keys: Vec<_> = list["held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["key"])
        .collect();
    assert_eq!(keys, [key], "{backend}: {list}");
    assert_eq!(list["leaks"], serde_json::json!([]), "{backend}: {list}");
}

/// In a terminal, the command has the foreground, as under `flock`: it
/// reads what is typed (outside it, `read` would be stopped by SIGTTIN for
/// good), and Ctrl-Z does not leave it stopped under the held lock.
#[test]
fn the_command_reads_the_terminal_and_ctrl_z_does_not_leave_it_stopped() {
    use std::io::Write;
    use std::sync::mpsc;

    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let slave = || Stdio::from(pty.slave.try_clone().unwrap());
    // `setsid -c`: a session of its own, with the pseudo-terminal as its
    // controlling terminal and lockctl in its foreground.
    let child = std::process::Command::new("setsid")
        .args(["-w", "-c", env!("CARGO_BIN_EXE_lockctl")])
        .args(["--url", "memory://", "run", "k", "--"])
        .args(["sh", "-c", "echo ready; read line; echo \"got $line\""])
        .env_remove("LOCK_URL")
        .stdin(slave())
        .stdout(slave())
        .stderr(slave())
        .spawn()
        .expect("setsid runs lockctl");
    let mut child = Holder(child);
    let master = std::fs::File::from(pty.master);
    let mut keyboard = master.try_clone().unwrap();
    let (lines, screen) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(master);
        let mut line = String::new();
        while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            if lines.send(std::mem::take(&mut line)).is_err() {
                break;
            }
        }
    });
    let shown = |needle: &str| loop {
        let line = screen.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            panic!("`{needle}` never shown: the command cannot read the terminal")
        });
        if line.contains(needle) {
            break;
        }
    };
    shown("ready");
    keyboard.write_all(b"\x1a").unwrap();
    keyboard.write_all(b"hello\n").unwrap();
    shown("got hello");
    assert!(wait_exit(&mut child.0).success());
}

/// A lock key with no TTL (written by something else, or with its TTL
/// removed) blocks its lock for ever: `list` names it as a leak.
#[test]
fn list_names_a_key_that_never_expires_as_a_leak() {
    let Some(url) = conformance_tests::server_url("LOCKKIT_REDIS_URL") else {
        return;
    };
    let prefix = unique_key("leak");
    let key = format!("{prefix}/stuck");
    let stored = lock_redis_wire::KeyLayout::default().keys(&key).lock;
    let mut redis = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to the shared Redis");
    redis::cmd("SET")
        .arg(&stored)
        .arg("no-ttl")
        .query::<()>(&mut redis)
        .expect("SET");

    let text = output(&["--url", &url, "list", &prefix]);
    let json = output(&["--url", &url, "list", "--json", &prefix]);
    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&stored).query(&mut redis);

    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("{stored}\tleak\t"))),
        "{text:?}"
    );
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(json["leaks"], serde_json::json!([stored]), "{json}");
}

/// A key name that is not UTF-8 (written by another client) neither breaks
/// `list` nor prints raw: a lock key with no TTL is shown as a leak, its
/// bytes escaped.
#[test]
fn list_copes_with_key_names_that_are_not_utf8() {
    let Some(url) = conformance_tests::server_url("LOCKKIT_REDIS_URL") else {
        return;
    };
    let prefix = unique_key("bytes");
    let stored = lock_redis_wire::KeyLayout::default()
        .keys(&format!("{prefix}/x"))
        .lock;
    // The same name with a byte that is not UTF-8 inside the braces.
    let mut raw = stored.clone().into_bytes();
    let at = raw.len() - 2;
    raw.insert(at, 0xff);
    let mut redis = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to the shared Redis");
    redis::cmd("SET")
        .arg(&raw)
        .arg("no-ttl")
        .query::<()>(&mut redis)
        .expect("SET");

    let out = output(&["--url", &url, "list", &prefix]);
    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&raw).query(&mut redis);

    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("\tleak\t"))
        .unwrap_or_else(|| panic!("no leak line: {stdout:?}"));
    assert!(line.contains("\\xff"), "{line:?}");
    assert!(!line.contains('\u{fffd}'), "{line:?}");
}
