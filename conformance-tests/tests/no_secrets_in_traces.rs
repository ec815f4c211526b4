//! Nothing traced or logged carries an owner token or a password, on every
//! backend: every event and span at the most detailed level (`TRACE`), with
//! all their fields, of lockkit's crates and of the client libraries under
//! the backends alike: etcd-client's gRPC stack and sqlx, which trace, and
//! redis, which logs through the `log` crate. That is more than `lockctl`
//! shows (the libraries at `error` only), and what an application with a
//! subscriber of its own may show.
//!
//! Each backend is driven through the paths that trace: grants, renewals,
//! refusals, a wait that runs out, a guard whose grant goes behind its back,
//! and a connection with a password in its URL; the memory backend also
//! through renewals that fail. The lock events (acquired, released, lost,
//! a failed renewal) are among what is checked, and must be there. Owner tokens are 32 hex
//! digits; no run of 32 hex digits may appear, so that a token the test
//! never saw (a refused attempt's) is caught too.
//!
//! One test binary, one global subscriber and logger: the backends'
//! background tasks run on any thread, and all of them write into the one
//! capture.

use lock_core::Wait;
use std::io::Write;
use std::sync::{Mutex, Once};
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, GuardOptions, Locker};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// In the URLs with a password.
const PASSWORD: &str = "Pw-3fX9qL7t";

/// Everything traced and logged so far.
static CAPTURE: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Everything traced and logged so far, as text.
fn captured() -> String {
    String::from_utf8_lossy(&CAPTURE.lock().expect("capture lock")).into_owned()
}

/// Sends every span and event, and every `log` record, into [`CAPTURE`].
fn capture_everything() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(|| Capture)
                    .with_ansi(false)
                    .with_span_events(FmtSpan::FULL),
            )
            .with(LevelFilter::TRACE)
            .init();
        log::set_logger(&Capture).expect("the only logger");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

/// Writes into [`CAPTURE`]: a tracing writer and a `log` logger.
struct Capture;

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        CAPTURE
            .lock()
            .expect("capture lock")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        let line = format!(
            "{} {}: {}\n",
            record.level(),
            record.target(),
            record.args()
        );
        let _ = Capture.write(line.as_bytes());
    }

    fn flush(&self) {}
}

/// The first run of exactly 32 hex digits in `text`: how an owner token is
/// written.
fn token_like(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        let end = start
            + bytes[start..]
                .iter()
                .take_while(|b| b.is_ascii_hexdigit())
                .count();
        if end - start == 32 {
            return Some(&text[start..end]);
        }
        start = end + 1;
    }
    None
}

/// `url` with `user:PASSWORD@` after its scheme.
fn with_password(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    format!("{scheme}://{user}:{PASSWORD}@{rest}")
}

/// `wanted`, raised to the backend's shortest TTL.
fn ttl(locker: &Locker, wanted: Duration) -> Duration {
    let limits = &locker.capabilities().limits;
    let grain = limits.ttl_granularity.as_nanos().max(1);
    let nanos = wanted.max(limits.min_ttl).as_nanos().div_ceil(grain) * grain;
    Duration::from_nanos(nanos as u64)
}

/// Drives `locker` through the paths that trace, with `other` as the
/// second client, then checks the capture.
async fn exercise(name: &str, locker: Locker, other: Locker) {
    let key = unique_key(&format!("no-secrets-{name}"));
    let long = ttl(&locker, Duration::from_secs(30));
    let mut lease = locker.try_acquire(&key, long).await.expect("grant");
    let mut owners = vec![lease.owner().to_hex()];
    locker.extend(&mut lease, long).await.expect("extend");
    let refused = other.try_acquire(&key, long).await.expect_err("held");
    assert!(matches!(refused, Error::Contended { .. }), "{refused}");
    let waited = other
        .acquire(&key, long, Wait::at_most(Duration::from_millis(300)))
        .await
        .expect_err("held");
    assert!(matches!(waited, Error::TimedOut { .. }), "{waited}");
    locker.release(lease).await.expect("release");

    // A guard whose grant goes behind its back: its renewal finds the grant
    // gone and reports the loss.
    let guarded = format!("{key}-guard");
    let short = ttl(&locker, Duration::from_secs(3));
    let guard = locker
        .guard(&guarded, GuardOptions::new(short).renew_every(short / 6))
        .await
        .expect("guard");
    let lost = guard.lost();
    assert!(
        other.force_release(&guarded).await.expect("force release"),
        "the guard's grant was there to remove"
    );
    tokio::time::timeout(short * 3, lost)
        .await
        .expect("the guard notices the loss");
    drop(guard);

    let lease = other.try_acquire(&key, long).await.expect("grant");
    owners.push(lease.owner().to_hex());
    other.release(lease).await.expect("release");

    check(name, &key, &owners);
}

/// The capture names `key` (so it holds this backend's traces), holds its
/// lock events, and shows no owner token and no password.
fn check(name: &str, key: &str, owners: &[String]) {
    let text = captured();
    assert!(
        text.contains(key),
        "{name}: nothing was traced for {key}; the capture is:\n{text}"
    );
    for event in ["lock acquired", "lock released", "lock lost"] {
        assert!(
            text.lines().any(|l| l.contains(event) && l.contains(key)),
            "{name}: no `{event}` event for {key}"
        );
    }
    no_secrets(name, &text, owners);
}

/// `text` shows none of `owners`, nothing written like an owner token, and
/// no password.
fn no_secrets(name: &str, text: &str, owners: &[String]) {
    for owner in owners {
        // As text, and as the bytes of that text in a request's Debug form.
        let as_bytes = format!("{:?}", owner.as_bytes());
        let as_bytes = as_bytes.trim_matches(['[', ']']);
        assert!(
            !text.contains(owner.as_str()) && !text.contains(as_bytes),
            "{name}: an owner token was traced"
        );
    }
    if let Some(token) = token_like(text) {
        let line = text.lines().find(|l| l.contains(token)).unwrap_or_default();
        panic!("{name}: something written like an owner token was traced: {line}");
    }
    assert!(!text.contains(PASSWORD), "{name}: the password was traced");
}

/// A guard whose renewals all fail: each is retried, with a warning, until
/// the deadline passes.
async fn renewals_fail(backend: &lock_core::MemoryBackend, locker: &Locker) {
    let key = unique_key("no-secrets-renewals");
    let options = GuardOptions::new(Duration::from_secs(3)).renew_every(Duration::from_millis(100));
    let guard = locker.guard(&key, options).await.expect("guard");
    backend.fail_next_renewals(u32::MAX);
    let reason = guard.lost().await;
    backend.fail_next_renewals(0);
    assert_eq!(reason, lock_core::LostReason::DeadlinePassed);
    let text = captured();
    for event in ["renewal failed; retrying until the deadline", "lock lost"] {
        assert!(
            text.lines().any(|l| l.contains(event) && l.contains(&key)),
            "memory: no `{event}` event for {key}"
        );
    }
    no_secrets("memory", &text, &[]);
}

/// Connects with a password in the URL (refused or not, depending on the
/// server), and checks that neither the error nor the capture shows it.
async fn connect_with_password<F, Fut, B>(name: &str, url: String, connect: F) -> Option<B>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = lock_core::Result<B>>,
{
    let connected = connect(url).await;
    if let Err(e) = &connected {
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains(PASSWORD), "{name}: {shown}");
    }
    let text = captured();
    assert!(!text.contains(PASSWORD), "{name}: the password was traced");
    connected.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_backend_traces_a_secret() {
    capture_everything();
    let mut ran = vec!["memory"];
    let backend = lock_core::MemoryBackend::new();
    let memory = Locker::new(backend.clone());
    exercise("memory", memory.clone(), memory.clone()).await;
    renewals_fail(&backend, &memory).await;

    // Every backend whose URL takes a password in its user part, connected
    // through the URL alone (Redlock's nodes given time to answer on a busy
    // machine).
    for (name, var, options) in [
        ("redis", "LOCKKIT_REDIS_URL", ""),
        ("redis-cluster", "LOCKKIT_REDIS_CLUSTER_URL", ""),
        ("redis-sentinel", "LOCKKIT_REDIS_SENTINEL_URL", ""),
        ("redlock", "LOCKKIT_REDLOCK_URL", "?node_timeout_ms=500"),
        ("etcd", "LOCKKIT_ETCD_URL", ""),
    ] {
        let Some(url) = server_url(var) else { continue };
        let url = format!("{url}{options}");
        let connect = || async { lockkit::connect(&url).await.expect("connect") };
        exercise(name, connect().await, connect().await).await;
        connect_with_password(name, with_password(&url, "lockkit"), |u| async move {
            lockkit::connect(&u).await
        })
        .await;
        ran.push(name);
    }
    if let Some(url) = server_url("LOCKKIT_POSTGRES_URL") {
        // The test server trusts local connections and never asks for the
        // password in the URL, so the whole run goes through that URL.
        let (user, rest) = url
            .split_once("://")
            .and_then(|(_, rest)| rest.split_once('@'))
            .expect("a PostgreSQL URL with a user");
        let url = format!("postgres://{user}:{PASSWORD}@{rest}");
        let connect = || {
            connect_with_password("postgres", url.clone(), |u| async move {
                lock_postgres::PostgresBackend::connect(&u).await
            })
        };
        let (one, two) = (connect().await, connect().await);
        let (one, two) = (one.expect("connect"), two.expect("connect"));
        exercise("postgres", Locker::new(one), Locker::new(two)).await;
        ran.push("postgres");
    }
    // The client libraries spoke too, so their output was looked at.
    let text = captured();
    for (backend, library) in [
        ("redis", " redis::"),
        ("etcd", " h2::"),
        ("postgres", " sqlx"),
    ] {
        if ran.contains(&backend) {
            assert!(
                text.contains(library),
                "{backend}: nothing from{library} was captured"
            );
        }
    }
    eprintln!("checked: {} ({} bytes traced)", ran.join(", "), text.len());
}

#[test]
fn a_token_written_in_hex_is_found_and_other_hex_is_not() {
    let token = lock_core::OwnerToken::random().to_hex();
    assert_eq!(
        token_like(&format!("owner={token} ok")),
        Some(token.as_str())
    );
    // A script's SHA-1 (40 digits) and a key's random suffix (16) are no tokens.
    let sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db";
    assert_eq!(token_like(&format!("{sha} key-0123456789abcdef")), None);
}
