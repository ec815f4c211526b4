//! Bad input, configuration and exit codes of the real `lockctl` binary.

mod common;

use std::io::Write;

use common::*;

#[test]
fn the_command_exit_code_passes_through() {
    let out = output(&["--url", "memory://", "run", "k", "--", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    let out = output(&[
        "--url",
        "memory://",
        "run",
        "k",
        "--",
        "sh",
        "-c",
        "kill -9 $$",
    ]);
    assert_eq!(out.status.code(), Some(128 + 9));
}

#[test]
fn the_command_sees_key_token_and_deadline() {
    let out = output(&[
        "--url",
        "memory://",
        "run",
        "jobs/1",
        "--ttl",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $LOCK_KEY $LOCK_FENCING_TOKEN $LOCK_DEADLINE",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let parts: Vec<_> = text.split_whitespace().collect();
    assert_eq!(parts[..2], ["jobs/1", "1"]);
    let deadline: u128 = parts[2].parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    assert!(
        deadline > now + 15_000 && deadline <= now + 20_000,
        "{deadline} vs {now}"
    );
}

#[test]
fn bad_input_gives_one_line_and_its_exit_code() {
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["run", "k", "--", "true"],
            code::CONFIG,
            "no backend given",
        ),
        (
            &["--url", "localhost:6379", "run", "k", "--", "true"],
            code::CONFIG,
            "expected scheme://",
        ),
        (
            &["--url", "zk://u:hunter2@h", "run", "k", "--", "true"],
            code::CONFIG,
            "unknown scheme `zk`",
        ),
        (
            &["--url", "memory://", "run", "", "--", "true"],
            code::CONFIG,
            "key",
        ),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--ttl",
                "1ms",
                "--",
                "true",
            ],
            code::CONFIG,
            "ttl",
        ),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--ttl",
                "soon",
                "--",
                "true",
            ],
            code::USAGE,
            "not a duration",
        ),
        (&["--url", "memory://", "run", "k"], code::USAGE, "required"),
        (
            &["--url", "memory://", "frobnicate"],
            code::USAGE,
            "frobnicate",
        ),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--",
                "no-such-command-here",
            ],
            code::NOT_FOUND,
            "no-such-command-here",
        ),
        (
            &["--url", "memory://", "release", "k"],
            code::USAGE,
            "--force --yes-i-know",
        ),
        (
            &["--url", "memory://", "release", "k", "--force"],
            code::USAGE,
            "--force --yes-i-know",
        ),
        (
            &["--profile", "p", "run", "k", "--", "true"],
            code::CONFIG,
            "LOCKKIT_CONFIG",
        ),
        (
            &[
                "--profile",
                "p",
                "--config",
                "/no/such/file.toml",
                "run",
                "k",
                "--",
                "true",
            ],
            code::CONFIG,
            "/no/such/file.toml",
        ),
        (
            &["check-config", "/no/such/file.toml"],
            code::CONFIG,
            "/no/such/file.toml",
        ),
        // Past what an Instant can hold: refused, not a panic at the loss.
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--grace",
                "18446744073709551615s",
                "--",
                "true",
            ],
            code::USAGE,
            "at most 3600s",
        ),
        // A URL given where clap expected a subcommand is shown redacted.
        (
            &["redis://:hunter2@h", "run", "k", "--", "true"],
            code::USAGE,
            "redis://:***@h",
        ),
        // A password whose `@host` was forgotten reads as a port: not shown.
        (
            &["--url", "redis://default:hunter2", "run", "k", "--", "true"],
            code::CONFIG,
            "redis://***",
        ),
        (
            &["--url", "postgres://app:hunter2", "run", "k", "--", "true"],
            code::CONFIG,
            "postgres://***",
        ),
        // Also when its password holds a quote or a space.
        (
            &["redis://:hunter2's x@h", "run", "k", "--", "true"],
            code::USAGE,
            "redis://",
        ),
        // The two flags on either side of the subcommand.
        (
            &[
                "--profile",
                "p",
                "run",
                "--url",
                "memory://",
                "k",
                "--",
                "true",
            ],
            code::USAGE,
            "cannot be used with",
        ),
        (
            &[
                "--url",
                "memory://",
                "--profile",
                "p",
                "run",
                "k",
                "--",
                "true",
            ],
            code::USAGE,
            "cannot be used with",
        ),
    ];
    for (args, code, needle) in cases {
        let out = output(args);
        let stderr = assert_fails(&out, *code, needle);
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

#[test]
fn lock_url_from_the_environment() {
    let out = lockctl()
        .env("LOCK_URL", "memory://")
        .args(["run", "k", "--", "true"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The command does not inherit `LOCK_URL`, which may carry a password.
#[test]
fn the_command_does_not_see_the_backend_url() {
    let out = lockctl()
        .env("LOCK_URL", "memory://")
        .args(["run", "k", "--", "sh", "-c", "test -z \"$LOCK_URL\""])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "LOCK_URL reached the command: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn config_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn a_profile_supplies_url_prefix_and_ttl() {
    let f =
        config_file("[profiles.jobs]\nurl = \"memory://\"\nttl = \"20s\"\nprefix = \"jobs/\"\n");
    let out = lockctl()
        .env("LOCKKIT_CONFIG", f.path())
        .args([
            "--profile",
            "jobs",
            "run",
            "nightly",
            "--",
            "sh",
            "-c",
            "echo $LOCK_KEY",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "jobs/nightly");

    let path = f.path().to_str().unwrap();
    let out = output(&[
        "--profile",
        "nope",
        "--config",
        path,
        "run",
        "k",
        "--",
        "true",
    ]);
    assert_fails(&out, code::CONFIG, "no profile `nope`; profiles: jobs");
    let out = output(&["check-config", path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("profile `jobs`: ok"));
}

/// `check-config --offline` checks each profile's URL as connecting would
/// read it, and reports the others as parsed.
#[test]
fn an_offline_check_refuses_a_profile_url_connect_would_refuse() {
    if !lockkit::available_schemes().contains(&"redis") {
        return;
    }
    let f = config_file(
        "[profiles.bad]\nurl = \"redis://u:hunter2@h:6379?colour=red\"\n[profiles.good]\nurl = \"memory://\"\n",
    );
    let path = f.path().to_str().unwrap();
    let out = output(&["check-config", "--offline", path]);
    let stderr = assert_fails(&out, code::CONFIG, "profile `bad`: url:");
    assert!(
        stderr.contains("unknown option `colour`") && !stderr.contains("hunter2"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("profile `good`: parsed"));
}

/// A profile whose password lost its `@host` is refused without showing it.
#[test]
fn a_profile_url_missing_its_host_never_shows_the_password() {
    for url in [
        "redis://u:hunter2",
        "etcd://u:hunter2/x",
        "redlock://h:1,u:hunter2",
    ] {
        let f = config_file(&format!("[profiles.typo]\nurl = \"{url}\"\n"));
        let path = f.path().to_str().unwrap();
        for args in [
            vec!["check-config", "--offline", path],
            vec![
                "--config",
                path,
                "--profile",
                "typo",
                "run",
                "k",
                "--",
                "true",
            ],
        ] {
            let out = output(&args);
            let stderr = assert_fails(&out, code::CONFIG, "profile `typo`: url:");
            assert!(!stderr.contains("hunter2"), "{stderr}");
        }
    }
}

#[test]
fn a_malformed_config_names_the_file_and_line() {
    let f = config_file("[profiles.a]\nurl = \"memory://\"\nttl = 30\n");
    let path = f.path().to_str().unwrap();
    let out = output(&["check-config", path]);
    let stderr = assert_fails(&out, code::CONFIG, path);
    assert!(stderr.contains("line 3"), "{stderr}");
}

/// A profile that needs a real lock service is refused on the in-process
/// backend at start-up, and the command never runs.
#[test]
fn a_profile_whose_requirements_the_backend_misses_is_refused() {
    let f = config_file(
        "[profiles.payments]\nurl = \"memory://\"\nuse = \"financial\"\n\
         [profiles.payments.require]\nsurvives_server_loss = 1\n",
    );
    let path = f.path().to_str().unwrap();
    let out = output(&[
        "--profile",
        "payments",
        "--config",
        path,
        "run",
        "k",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    let stderr = assert_fails(
        &out,
        code::CONFIG,
        "profile `payments` (with `use = \"financial-inventory\"`) requires safety of at least `single-node`",
    );
    assert!(stderr.contains("memory:// offers `in-process`"), "{stderr}");
    assert!(
        stderr.contains("requires locks that survive the loss of 1 server(s)"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "the command ran");
    let out = output(&["check-config", path]);
    assert_fails(&out, code::CONFIG, "profile `payments`");
}

/// Fencing that must not rest on a clock is refused, with the explanation,
/// on every shared server whose fencing rests on one.
#[test]
fn clock_free_fencing_is_refused_where_the_backend_rests_on_clocks() {
    for (backend, url) in servers() {
        let f = config_file(&format!(
            "[profiles.payments]\nurl = \"{url}\"\n[profiles.payments.require]\n\
             fencing = \"strict\"\nno_clock_assumptions = true\n"
        ));
        let path = f.path().to_str().unwrap();
        let out = output(&[
            "--profile",
            "payments",
            "--config",
            path,
            "run",
            "k",
            "--",
            "true",
        ]);
        let locker = block_on(lockkit::connect(&url)).expect("connect");
        if locker.capabilities().fencing.rests_on_clocks() {
            let stderr = assert_fails(
                &out,
                code::CONFIG,
                &format!(
                    "profile `payments` requires fencing that rests on no clock assumption; {} offers a counter that rests on: ",
                    lockkit::url::redact(&url)
                ),
            );
            assert!(stderr.contains("clock"), "{backend}: {stderr}");
        } else {
            assert!(
                out.status.success(),
                "{backend}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn an_unreachable_backend_has_its_own_exit_code() {
    // A port nothing listens on (the discard port is closed on test machines).
    let urls = [
        (
            "redis",
            "redis://127.0.0.1:9/?connect_timeout_ms=500&response_timeout_ms=500",
        ),
        ("etcd", "etcd://127.0.0.1:9"),
        ("postgres", "postgres://postgres@127.0.0.1:9/x"),
    ];
    for (scheme, url) in urls {
        if !lockkit::available_schemes().contains(&scheme) {
            continue;
        }
        let out = output(&["--url", url, "run", "k", "--", "true"]);
        assert_fails(&out, code::UNAVAILABLE, "127.0.0.1:9");
    }
}

#[test]
fn list_status_and_forced_release_on_the_memory_backend() {
    // Each lockctl process has its own memory lock space: nothing is held.
    let out = output(&["--url", "memory://", "list"]);
    assert!(out.status.success() && out.stdout.is_empty());
    let out = output(&["--url", "memory://", "status", "k"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "k\tfree");
    let out = output(&[
        "--url",
        "memory://",
        "release",
        "k",
        "--force",
        "--yes-i-know",
    ]);
    assert_eq!(out.status.code(), Some(1));
}

/// Characters that would make a terminal lie, one of each kind: (raw, as
/// lockctl must show it).
const SPOOFING: [(&str, &str); 10] = [
    ("\u{202e}", "\\u{202e}"), // right-to-left override
    ("\u{200b}", "\\u{200b}"), // zero-width space
    ("\u{2028}", "\\u{2028}"), // line separator
    ("\u{feff}", "\\u{feff}"), // byte order mark
    ("\u{ffff}", "\\u{ffff}"), // noncharacter
    ("\u{e000}", "\\u{e000}"), // private use
    ("\u{1b}", "\\u{1b}"),     // ESC, as in ESC [ 2 J (clear the screen)
    ("\u{85}", "\\u{85}"),     // next line (C1)
    ("\t", "\\t"),             // lockctl's own field separator
    ("\u{3164}", "\\u{3164}"), // Hangul filler: a letter that shows as nothing
];

/// A key written into Redis by a client that skipped validation shows
/// escaped in `list` and `status`, never as the raw characters.
#[test]
fn keys_that_could_spoof_the_terminal_are_shown_escaped() {
    if !lockkit::available_schemes().contains(&"redis") {
        eprintln!("skipped: this build lacks the redis backend; build with --all-features");
        return;
    }
    let Some(url) = conformance_tests::server_url("LOCKKIT_REDIS_URL") else {
        return;
    };
    let prefix = unique_key("spoof");
    let raw: String = SPOOFING.iter().map(|(raw, _)| *raw).collect();
    let shown: String = SPOOFING.iter().map(|(_, shown)| *shown).collect();
    // A backslash is doubled, so that no key can pass for another's escape.
    let (key, key_shown) = (
        format!("{prefix}/evil{raw}\\end"),
        format!("{prefix}/evil{shown}\\\\end"),
    );
    // Without control characters: `list` shows what another client wrote.
    let (valid, valid_shown) = (
        format!("{prefix}/txt.\u{202e}exe"),
        format!("{prefix}/txt.\\u{{202e}}exe"),
    );
    let layout = lock_redis_wire::KeyLayout::default();
    let mut redis = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to the shared Redis");
    for k in [&key, &valid] {
        redis::cmd("SET")
            .arg(layout.keys(k).lock)
            .arg("written-by-another-client")
            .arg("PX")
            .arg(60_000)
            .query::<()>(&mut redis)
            .expect("SET");
    }

    let list = output(&["--url", &url, "list", &prefix]);
    let status = output(&["--url", &url, "status", &valid]);
    for k in [&key, &valid] {
        let _: redis::RedisResult<()> =
            redis::cmd("DEL").arg(layout.keys(k).lock).query(&mut redis);
    }

    assert!(list.status.success(), "{list:?}");
    let text = String::from_utf8(list.stdout).expect("UTF-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    let first_field = |line: &str| line.split('\t').next().unwrap_or("").to_owned();
    let mut keys: Vec<String> = lines.iter().map(|l| first_field(l)).collect();
    keys.sort();
    let mut expected = vec![key_shown, valid_shown];
    expected.sort();
    assert_eq!(keys, expected, "{text:?}");
    for (raw, _) in SPOOFING {
        let inside_fields = text.replace(['\t', '\n'], "");
        assert!(
            !inside_fields.contains(raw),
            "{raw:?} printed raw: {text:?}"
        );
    }

    // Such a key cannot be asked for by name: lockkit refuses it as input,
    // naming the code point without printing it.
    assert_eq!(status.status.code(), Some(code::CONFIG), "{status:?}");
    let text = String::from_utf8(status.stderr).expect("UTF-8");
    assert!(text.contains("U+202E"), "{text:?}");
    assert!(!text.contains('\u{202e}'), "{text:?}");
}

#[test]
fn help_documents_the_exit_codes() {
    let out = output(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for code in ["64", "69", "75", "77", "78", "127", "128+S"] {
        assert!(help.contains(code), "{code} missing from --help");
    }
}

/// `run --help` says what lockctl stops besides the process group, and
/// what can still escape it.
#[test]
fn run_help_says_what_can_escape() {
    let out = output(&["run", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "setsid",
        "double fork",
        "What can still escape",
        "SIGKILL",
        "systemd-run",
    ] {
        assert!(help.contains(needle), "`{needle}` missing from run --help");
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// The library's warnings reach the operator on stderr (here: a Redlock
/// node that does not answer at connect), and `LOCKKIT_LOG` silences them.
#[test]
fn the_librarys_warnings_reach_stderr() {
    if !lockkit::available_schemes().contains(&"redlock") {
        return;
    }
    let Some(url) = conformance_tests::server_url("LOCKKIT_REDLOCK_URL") else {
        return;
    };
    // Two of the nodes, and a port that nothing listens on.
    let nodes: Vec<&str> = url["redlock://".len()..].split(',').take(2).collect();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("redlock://{},{},127.0.0.1:{closed}", nodes[0], nodes[1]);
    let run = |level: Option<&str>| {
        let mut c = lockctl();
        c.args(["--url", &url, "run", &unique_key("warned"), "--", "true"]);
        if let Some(level) = level {
            c.env("LOCKKIT_LOG", level);
        }
        let out = c.output().expect("lockctl runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let warned = run(None);
    assert!(
        warned.contains("WARN")
            && warned.contains("unreachable")
            && warned.contains(&format!("127.0.0.1:{closed}")),
        "{warned}"
    );
    assert_eq!(run(Some("error")), "");
    let out = lockctl()
        .args(["--url", "memory://", "list"])
        .env("LOCKKIT_LOG", "loud")
        .output()
        .expect("lockctl runs");
    assert_fails(&out, code::CONFIG, "LOCKKIT_LOG=`loud`");
}
