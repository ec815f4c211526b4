//! `lockctl run --shared`: readers of one key run together, on every shared
//! server whose backend offers read-write locks; a clear refusal on the
//! others.

mod common;

use common::*;

/// Two `--shared` runs run together (each waits until both have started:
/// under an exclusive lock the first would wait alone, and the check fails).
#[test]
fn readers_run_together() {
    for (backend, url) in servers() {
        if !offers_read_write(&url) {
            continue;
        }
        let key = unique_key("shared");
        let text = runs_that_wait_for_a_second(backend, &url, &key, &["--shared"], 2);
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
