//! `lockctl run --permits N`: at most N commands at once under one key,
//! on every shared server whose backend offers semaphores; a clear refusal
//! on the others.

mod common;

use std::process::Stdio;

use common::*;

/// Three runs of a semaphore of 2 permits: the first two run together
/// (each waits until two have started), the third only after one ended.
#[test]
fn at_most_n_commands_run_at_once() {
    for (backend, url) in servers() {
        if !offers_semaphores(&url) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let key = unique_key("permits");
        // Waits (10 s at most) until two runs have started: under an
        // exclusive lock the first would wait alone, and the check fails.
        let script = format!(
            "echo start >> {log}; i=0; while [ $(grep -c start {log}) -lt 2 ] && [ $i -lt 100 ]; \
             do sleep 0.1; i=$((i+1)); done; echo end >> {log}",
            log = log.display()
        );
        let children: Vec<_> = (0..3)
            .map(|_| {
                lockctl()
                    .args(["--url", &url, "run", &key, "--permits", "2"])
                    .args(["--ttl", "10s", "--wait", "60s", "--", "sh", "-c", &script])
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
        let (mut running, mut most) = (0, 0);
        for line in text.lines() {
            running += if line == "start" { 1 } else { -1 };
            most = most.max(running);
        }
        assert_eq!(
            most, 2,
            "{backend}: at most 2 at once, and 2 did run together: {text}"
        );
    }
}

/// A backend without semaphores refuses `--permits` before running
/// anything, saying why; a number of 0 is refused everywhere.
#[test]
fn permits_are_refused_where_not_offered_and_checked_everywhere() {
    for (_, url) in servers() {
        let key = unique_key("permits-refused");
        let zero = output(&["--url", &url, "run", &key, "--permits", "0", "--", "true"]);
        assert_fails(&zero, 78, "permits");
        if offers_semaphores(&url) {
            continue;
        }
        let out = output(&["--url", &url, "run", &key, "--permits", "2", "--", "true"]);
        assert_fails(&out, 64, "does not support semaphores");
    }
}

fn offers_semaphores(url: &str) -> bool {
    offers(url, lockkit::Mode::semaphore(2))
}
