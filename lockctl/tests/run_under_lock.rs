//! `lockctl run` against every shared server this build can reach: mutual
//! exclusion between processes, termination of the whole process group on
//! loss, signal forwarding and release.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};

use common::*;

fn spawn(args: &[&str]) -> Child {
    lockctl()
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lockctl starts")
}

fn stderr_of(child: Child) -> String {
    let out = child.wait_with_output().expect("output");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Each child appends `start ID TOKEN` and `end ID`; with the lock held,
/// every start is followed by its own end, and tokens grow in that order.
#[test]
fn runs_on_one_key_never_overlap() {
    for (backend, url) in servers() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let key = unique_key("no-overlap");
        let script = format!(
            "echo \"start $ID $LOCK_FENCING_TOKEN\" >> {log}; sleep 0.2; echo \"end $ID\" >> {log}",
            log = log.display()
        );
        let children: Vec<_> = (0..4)
            .map(|id| {
                lockctl()
                    .args(["--url", &url, "run", &key, "--ttl", "10s", "--wait", "60s"])
                    .args(["--", "sh", "-c", &script])
                    .env("ID", id.to_string())
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("lockctl starts")
            })
            .collect();
        for mut child in children {
            let status = wait_exit(&mut child);
            assert!(status.success(), "{backend}: {status}");
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 8, "{backend}: {text}");
        let mut last_token = 0u64;
        for pair in lines.chunks(2) {
            let start: Vec<_> = pair[0].split(' ').collect();
            assert_eq!(start[0], "start", "{backend}: interleaved: {text}");
            assert_eq!(
                pair[1],
                format!("end {}", start[1]),
                "{backend}: interleaved: {text}"
            );
            let token: u64 = start[2].parse().expect("a fencing token");
            assert!(
                token > last_token,
                "{backend}: tokens not increasing: {text}"
            );
            last_token = token;
        }
    }
}

/// The grant vanishes behind lockctl's back: the command AND a grandchild
/// that ignores SIGTERM are gone when lockctl exits with the "lost" code.
#[test]
fn a_lost_lock_terminates_the_whole_process_group() {
    for (backend, url) in servers() {
        let dir = tempfile::tempdir().unwrap();
        let (child_pid, grandchild_pid) = (dir.path().join("child"), dir.path().join("grandchild"));
        let key = unique_key("lost");
        let script = format!(
            "(trap '' TERM; exec sleep 1000) & echo $! > {gc}; echo $$ > {c}; wait",
            gc = grandchild_pid.display(),
            c = child_pid.display()
        );
        let mut lockctl = spawn(&[
            "--url", &url, "run", &key, "--ttl", "3s", "--grace", "1s", "--", "sh", "-c", &script,
        ]);
        let (child, grandchild) = (read_pid(&child_pid), read_pid(&grandchild_pid));
        assert!(process_alive(child) && process_alive(grandchild));
        remove_from_outside(backend, &url, &key);
        let status = wait_exit(&mut lockctl);
        let stderr = stderr_of(lockctl);
        assert_eq!(status.code(), Some(code::LOST), "{backend}: {stderr}");
        assert!(
            stderr.contains("lost while the command ran"),
            "{backend}: {stderr}"
        );
        assert!(!process_alive(child), "{backend}: the command survived");
        assert!(
            !process_alive(grandchild),
            "{backend}: the grandchild survived"
        );
    }
}

/// Commands that leave a `sleep 1000` outside their process group and
/// write its pid to the file named by `$GC`: (what, script). Each test adds
/// what the command does next.
const DETACHING: [(&str, &str); 3] = [
    (
        "a setsid grandchild that ignores SIGTERM",
        "setsid sh -c 'trap \"\" TERM; echo $$ > \"$GC\"; exec sleep 1000' >/dev/null 2>&1 &",
    ),
    (
        "a daemon (fork, setsid, fork)",
        "(setsid sh -c 'sleep 1000 & echo $! > \"$GC\"' >/dev/null 2>&1 &);",
    ),
    (
        "a double fork",
        "(sleep 1000 & echo $! > \"$GC\") >/dev/null 2>&1 &",
    ),
];

/// Bounded, so that a command cannot outlive a failed run by long.
const KEEP_RUNNING: &str = " i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done";

/// The grant vanishes: what the command started outside its process group
/// (in a session of its own, or detached by a double fork) is gone too when
/// lockctl exits with the "lost" code.
#[test]
fn a_lost_lock_terminates_what_the_command_detached() {
    for (backend, url) in servers() {
        for (what, script) in DETACHING {
            let dir = tempfile::tempdir().unwrap();
            let pid_file = dir.path().join("grandchild");
            let key = unique_key("lost-detached");
            let mut lockctl = lockctl()
                .args(["--url", &url, "run", &key, "--ttl", "3s", "--grace", "1s"])
                .args(["--", "sh", "-c", &format!("{script}{KEEP_RUNNING}")])
                .env("GC", &pid_file)
                .stdin(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("lockctl starts");
            let grandchild = Stray::new(read_pid(&pid_file));
            assert!(process_alive(grandchild.pid), "{backend}, {what}");
            remove_from_outside(backend, &url, &key);
            let status = wait_exit(&mut lockctl);
            let stderr = stderr_of(lockctl);
            assert_eq!(
                status.code(),
                Some(code::LOST),
                "{backend}, {what}: {stderr}"
            );
            assert!(
                !process_alive(grandchild.pid),
                "{backend}, {what}: the grandchild survived: {stderr}"
            );
        }
    }
}

/// The command exits, leaving behind a process outside its group: lockctl
/// terminates it before it releases the lock and exits.
#[test]
fn what_the_command_detached_is_terminated_when_it_exits() {
    for (what, script) in DETACHING {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild");
        // The command waits for the pid, then exits 0.
        let script = format!("{script} while [ ! -s \"$GC\" ]; do sleep 0.01; done; exit 0");
        let mut lockctl = lockctl()
            .args(["--url", "memory://", "run", "k", "--grace", "1s"])
            .args(["--", "sh", "-c", &script])
            .env("GC", &pid_file)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lockctl starts");
        let status = wait_exit(&mut lockctl);
        let stderr = stderr_of(lockctl);
        let grandchild = Stray::new(read_pid(&pid_file));
        assert_eq!(status.code(), Some(0), "{what}: {stderr}");
        assert!(
            !process_alive(grandchild.pid),
            "{what}: the grandchild survived: {stderr}"
        );
    }
}

/// SIGTERM to lockctl: a grandchild in a session of its own gets SIGTERM
/// too (not only a SIGKILL later), and is gone when lockctl exits.
#[test]
fn sigterm_to_lockctl_reaches_a_grandchild_in_its_own_session() {
    let dir = tempfile::tempdir().unwrap();
    let (pid_file, got) = (dir.path().join("grandchild"), dir.path().join("got-term"));
    let script = format!(
        "setsid sh -c 'trap \"echo > {got}; exit 0\" TERM; echo $$ > {pid};{KEEP_RUNNING}' >/dev/null 2>&1 & wait",
        got = got.display(),
        pid = pid_file.display()
    );
    let mut lockctl = run_in_memory(&[], &script);
    let grandchild = Stray::new(read_pid(&pid_file));
    signal(&lockctl, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(&mut lockctl);
    let stderr = stderr_of(lockctl);
    assert!(got.exists(), "the grandchild never got SIGTERM: {stderr}");
    assert!(
        !process_alive(grandchild.pid),
        "the grandchild survived: {stderr}"
    );
    assert_eq!(status.code(), Some(128 + 15), "{stderr}");
}

/// A descendant that starts another process when told to stop leaves
/// nothing behind: lockctl looks again until no descendant is left.
#[test]
fn a_descendant_that_forks_when_told_to_stop_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (pid_file, late_file) = (dir.path().join("grandchild"), dir.path().join("late"));
    let script = format!(
        "setsid sh -c 'trap \"sleep 1000 & echo \\$! > {late}; exit 0\" TERM; \
           echo $$ > {pid};{KEEP_RUNNING}' >/dev/null 2>&1 & \
         while [ ! -s {pid} ]; do sleep 0.01; done",
        late = late_file.display(),
        pid = pid_file.display()
    );
    let mut lockctl = run_in_memory(&[], &script);
    let status = wait_exit(&mut lockctl);
    let stderr = stderr_of(lockctl);
    let grandchild = Stray::new(read_pid(&pid_file));
    assert!(
        late_file.exists(),
        "the grandchild never got SIGTERM: {stderr}"
    );
    let late = Stray::new(read_pid(&late_file));
    assert!(
        !process_alive(grandchild.pid),
        "the grandchild survived: {stderr}"
    );
    assert!(
        !process_alive(late.pid),
        "its late child survived: {stderr}"
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// A process the command detached that exits while the command runs is
/// reaped by lockctl (its new parent) at once, not left a zombie holding
/// its pid until the run ends.
#[test]
fn a_detached_process_that_exits_during_the_run_is_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let (pid_file, go, done) = (
        dir.path().join("orphan"),
        dir.path().join("go"),
        dir.path().join("done"),
    );
    // Both loops are bounded, so that they cannot outlive a failed run by long.
    let wait_for = |file: &std::path::Path| {
        format!(
            "i=0; while [ ! -e {} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
            file.display()
        )
    };
    let script = format!(
        "(setsid sh -c 'echo $$ > {pid}; {wait_go}' >/dev/null 2>&1 &); {wait_done}",
        pid = pid_file.display(),
        wait_go = wait_for(&go),
        wait_done = wait_for(&done)
    );
    let mut lockctl = run_in_memory(&[], &script);
    let orphan = read_pid(&pid_file);
    std::fs::write(&go, "").unwrap();
    let until = std::time::Instant::now() + PATIENCE;
    while std::path::Path::new(&format!("/proc/{orphan}")).exists() {
        assert!(
            std::time::Instant::now() < until,
            "the exited process was never reaped"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::fs::write(&done, "").unwrap();
    let status = wait_exit(&mut lockctl);
    assert_eq!(status.code(), Some(0), "{}", stderr_of(lockctl));
}

/// SIGTERM to lockctl reaches the command, which exits on it; the lock is
/// then free at once (well before its TTL).
#[test]
fn sigterm_reaches_the_command_and_the_lock_is_released() {
    for (backend, url) in servers() {
        let dir = tempfile::tempdir().unwrap();
        let (ready, got) = (dir.path().join("ready"), dir.path().join("got-term"));
        let key = unique_key("sigterm");
        let script = format!(
            "trap 'echo $LOCK_KEY > {got}; exit 0' TERM; echo > {ready}; while :; do sleep 0.05; done",
            got = got.display(),
            ready = ready.display()
        );
        let mut lockctl = spawn(&[
            "--url", &url, "run", &key, "--ttl", "60s", "--", "sh", "-c", &script,
        ]);
        wait_for_file(&ready);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(lockctl.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = wait_exit(&mut lockctl);
        assert_eq!(status.code(), Some(0), "{backend}: {}", stderr_of(lockctl));
        assert_eq!(
            std::fs::read_to_string(&got).unwrap().trim(),
            key,
            "{backend}"
        );
        let again = output(&["--url", &url, "run", &key, "--ttl", "60s", "--", "true"]);
        assert!(
            again.status.success(),
            "{backend}: lock not released: {}",
            String::from_utf8_lossy(&again.stderr)
        );
    }
}

/// A held lock makes a second `lockctl run` give up after --wait with the
/// "not acquired" code, without running its command.
#[test]
fn acquire_timeout_has_its_own_exit_code() {
    for (backend, url) in servers() {
        let dir = tempfile::tempdir().unwrap();
        let (ready, done, ran) = (
            dir.path().join("ready"),
            dir.path().join("done"),
            dir.path().join("ran"),
        );
        let key = unique_key("timeout");
        let holder_script = format!(
            "echo > {r}; while [ ! -e {d} ]; do sleep 0.05; done",
            r = ready.display(),
            d = done.display()
        );
        let mut holder = spawn(&[
            "--url",
            &url,
            "run",
            &key,
            "--ttl",
            "30s",
            "--",
            "sh",
            "-c",
            &holder_script,
        ]);
        wait_for_file(&ready);
        let out = output(&[
            "--url",
            &url,
            "run",
            &key,
            "--wait",
            "300ms",
            "--",
            "sh",
            "-c",
            &format!("echo > {}", ran.display()),
        ]);
        let stderr = assert_fails(&out, code::NOT_ACQUIRED, &key);
        assert!(
            !ran.exists(),
            "{backend}: the command ran without the lock: {stderr}"
        );
        std::fs::write(&done, "").unwrap();
        assert!(wait_exit(&mut holder).success(), "{backend}");
    }
}

/// A run leaves nothing on the cluster once it exits: the released lock's
/// etcd lease, which the backend would keep for a next lock, is revoked
/// rather than left to expire a TTL later (on a private one-member cluster,
/// whose leases are all ours).
#[test]
fn a_run_leaves_no_etcd_lease_behind() {
    if !lockkit::available_schemes().contains(&"etcd") {
        eprintln!("skipped: this build lacks the etcd backend; build with --all-features");
        return;
    }
    let cluster = lock_testkit::EtcdCluster::start(1).expect("start a private etcd cluster");
    let out = output(&[
        "--url",
        &cluster.url(),
        "run",
        "leaves-nothing",
        "--ttl",
        "30s",
        "--",
        "true",
    ]);
    assert!(out.status.success(), "lockctl run: {out:?}");
    let leases = cluster.etcdctl(&["lease", "list"]).expect("list leases");
    assert_eq!(leases.trim(), "found 0 leases", "{leases}");
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// The state letter of `pid` in /proc (`T` when stopped).
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(") ").next()?.chars().next()
}

/// A command that ignores SIGTERM does not keep lockctl, and the lock,
/// forever: --grace after the forwarded SIGTERM, its group is killed.
#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        // Bounded, so that it cannot outlive a failed run by long.
        "trap '' TERM; echo > {}; i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        ready.display()
    );
    let mut lockctl = run_in_memory(&["--grace", "200ms"], &script);
    wait_for_file(&ready);
    signal(&lockctl, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(&mut lockctl);
    let stderr = stderr_of(lockctl);
    assert_eq!(status.code(), Some(128 + 9), "{stderr}");
    assert!(stderr.contains("still running"), "{stderr}");
}

/// The grace period starts at the forwarded SIGTERM, once: a leader that
/// exits within it, leaving a process that ignores SIGTERM, does not start
/// a second one for what it left behind.
#[test]
fn the_grace_period_is_not_restarted_when_the_leader_exits_within_it() {
    let dir = tempfile::tempdir().unwrap();
    let (pid_file, ready) = (dir.path().join("pid"), dir.path().join("ready"));
    // The leader takes 1 s to stop; its child ignores SIGTERM. Each writes
    // its file once its trap is set. Both loops are bounded, so that they
    // cannot outlive a failed run by long.
    let script = format!(
        "(trap '' TERM; sh -c 'echo $PPID' > {pid}; \
           i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done) & \
         trap 'sleep 1; exit 0' TERM; \
         while [ ! -s {pid} ]; do sleep 0.01; done; echo > {ready}; \
         i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        pid = pid_file.display(),
        ready = ready.display()
    );
    let mut lockctl = run_in_memory(&["--grace", "2500ms"], &script);
    wait_for_file(&ready);
    let left_behind = read_pid(&pid_file);
    let sent = std::time::Instant::now();
    signal(&lockctl, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(&mut lockctl);
    let took = sent.elapsed();
    let stderr = stderr_of(lockctl);
    assert_eq!(status.code(), Some(0), "{stderr}");
    // 2.5 s after SIGTERM, not 1 + 2.5 s.
    assert!(
        took < std::time::Duration::from_millis(3000),
        "lockctl took {took:?} after SIGTERM with --grace 2500ms: {stderr}"
    );
    assert!(
        !process_alive(left_behind),
        "the process left behind still runs"
    );
}

/// A stopped command (here it stops itself, as a terminal read from the
/// background would) still gets a forwarded signal, here Ctrl-\'s SIGQUIT.
#[test]
fn a_forwarded_signal_reaches_a_stopped_command() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!(
        "trap 'exit 3' QUIT; echo $$ > {}; kill -STOP $$; while :; do sleep 0.05; done",
        pid_file.display()
    );
    let mut lockctl = run_in_memory(&[], &script);
    let pid = read_pid(&pid_file);
    let until = std::time::Instant::now() + PATIENCE;
    // No event tells another process that one has stopped: poll its state.
    while state(pid) != Some('T') {
        assert!(
            std::time::Instant::now() < until,
            "the command never stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    signal(&lockctl, nix::sys::signal::Signal::SIGQUIT);
    let status = wait_exit(&mut lockctl);
    assert_eq!(status.code(), Some(3), "{}", stderr_of(lockctl));
}

/// Ctrl-Z (SIGTSTP) does not stop lockctl: stopped, it would stop renewing
/// while the command, in a group of its own, ran on.
#[test]
fn ctrl_z_does_not_stop_lockctl() {
    let dir = tempfile::tempdir().unwrap();
    let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
    let script = format!(
        "echo > {}; while [ ! -e {} ]; do sleep 0.02; done",
        ready.display(),
        go.display()
    );
    // In a process group of its own, whose parent is outside it: the
    // kernel drops a stop signal sent to an orphaned group, which would
    // pass this test without the fix.
    let mut lockctl = lockctl()
        .args(["--url", "memory://", "run", "k", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("lockctl starts");
    wait_for_file(&ready);
    signal(&lockctl, nix::sys::signal::Signal::SIGTSTP);
    std::fs::write(&go, "").unwrap();
    // A stopped lockctl would never see its command end.
    let status = wait_exit(&mut lockctl);
    assert_eq!(status.code(), Some(0), "{}", stderr_of(lockctl));
}

/// `lockctl run` of `sh -c script` on the key `k` of an in-memory backend,
/// with `options` before the command.
fn run_in_memory(options: &[&str], script: &str) -> Child {
    let mut args = vec!["--url", "memory://", "run", "k"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    spawn(&args)
}
