//! `lockctl run --shared`: readers of one key run together, on every shared
//! server whose backend offers read-write locks; a clear refusal on the
//! others.

mod common;

use std::process::Stdio;

use common::*;

/// Two `--shared` runs run together (each waits until both have started:
/// under an exclusive lock the first would wait alone, and the check fails).
#[test]
fn readers_run_together() {
    for (backend, url) in servers() {
        if !offers_read_write(&url) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let key = unique_key("shared");
        let script = format!(
            "echo start >> {log}; i=0; while [ $(grep -c start {log}) -lt 2 ] && [ $i -lt 100 ]; \
             do sleep 0.1; i=$((i+1)); done; echo end >> {log}",
            log = log.display()
        );
        let children: Vec<_> = (0..2)
            .map(|_| {
                lockctl()
                    .args(["--url", &url, "run", &key, "--shared"])
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
        assert!(
            text.starts_with("start\nstart\n"),
            "{backend}: both readers ran together: {text}"
        );
    }
}

/// A backend without read-write locks refuses `--shared` before running
/// anything, saying why; `--shared` with `--permits` is refused everywhere.
#[test]
fn shared_is_refused_where_not_offered() {
    for (backend, url) in servers() {
        let key = unique_key("shared-refused");
        let both = output(&[
            "--url",
            &url,
            "run",
            &key,
            "--shared",
            "--permits",
            "2",
            "--",
            "true",
        ]);
        assert!(
            !both.status.success(),
            "{backend}: --shared with --permits ran"
        );
        if offers_read_write(&url) {
            continue;
        }
        let out = output(&["--url", &url, "run", &key, "--shared", "--", "true"]);
        assert_fails(&out, 64, "does not support read-write locks");
    }
}

fn offers_read_write(url: &str) -> bool {
    offers(url, lockkit::Mode::Shared)
}
