//! `lockctl run --permits N`: at most N commands at once under one key,
//! on every shared server whose backend offers semaphores; a clear refusal
//! on the others.

mod common;

use common::*;

/// Three runs of a semaphore of 2 permits: the first two run together
/// (each waits until two have started), the third only after one ended.
#[test]
fn at_most_n_commands_run_at_once() {
    for (backend, url) in servers() {
        if !offers_semaphores(&url) {
            continue;
        }
        let key = unique_key("permits");
        let text = runs_that_wait_for_a_second(backend, &url, &key, &["--permits", "2"], 3);
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
