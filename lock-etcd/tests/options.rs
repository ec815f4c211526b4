//! Connection options at the ends of their range, on the shared cluster:
//! each either works or is refused with an input error naming it, and
//! nothing panics. A setter's value that cannot be taken is refused by
//! `connect_with`, naming the option, before any member is dialled.

use lock_core::Wait;
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, GuardOptions, LockBackend, Locker};
use lock_etcd::{EtcdBackend, EtcdOptions};

/// Connects in a task of its own, so that a panic is reported as one.
async fn outcome(options: Result<EtcdOptions, Error>) -> Result<EtcdBackend, Error> {
    tokio::spawn(async move { EtcdBackend::connect_with(options?).await })
        .await
        .expect("connecting panicked")
}

/// A backend that connected holds a lock in a guard (which watches for its
/// loss), makes a contender wait until it gives up, and releases.
async fn works(backend: EtcdBackend) {
    let locker = Locker::new(backend);
    let key = unique_key("options");
    let guard = locker
        .guard(&key, GuardOptions::new(Duration::from_secs(5)))
        .await
        .expect("guard");
    let waited = locker
        .acquire(
            &key,
            Duration::from_secs(5),
            Wait::at_most(Duration::from_millis(200)),
        )
        .await;
    assert!(
        waited.as_ref().is_err_and(Error::is_timed_out),
        "{waited:?}"
    );
    guard.release().await.expect("release");
}

/// Works, or is refused naming `field`.
async fn works_or_names(what: &str, field: &str, connected: Result<EtcdBackend, Error>) {
    match connected {
        Ok(backend) => works(backend).await,
        Err(Error::InvalidInput { field: f, problem }) => {
            assert_eq!(f, field, "{what}: {problem}");
        }
        Err(e) => panic!("{what}: neither connected nor refused the input: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_timeouts_connect_or_are_refused_by_name_without_a_panic() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let options = || EtcdOptions::from_url(&url);
    let huge = [Duration::MAX, Duration::from_millis(u64::MAX)];
    for d in huge {
        let connected = outcome(options().map(|o| o.connect_timeout(d))).await;
        let what = format!("connect_timeout {d:?}");
        works_or_names(&what, "connect_timeout_ms", connected).await;
        let connected = outcome(options().map(|o| o.response_timeout(d))).await;
        let what = format!("response_timeout {d:?}");
        works_or_names(&what, "response_timeout_ms", connected).await;
    }
    for option in ["connect_timeout_ms", "response_timeout_ms"] {
        let with = format!("{url}?{option}={}", u64::MAX);
        let connected = outcome(EtcdOptions::from_url(&with)).await;
        works_or_names(option, option, connected).await;
    }
}

/// Options read from the URL and adjusted with every setter connect, and
/// the backend puts its locks where the setters said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_from_the_url_and_the_setters_connect() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let prefix = unique_key("options-prefix/");
    let options = EtcdOptions::from_url(&format!("{url}?prefix=ignored/&min_ttl_s=3"))
        .expect("options")
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(4))
        .prefix(prefix.clone())
        .min_ttl(Duration::from_secs(2));
    assert_eq!(options.get_prefix(), prefix);
    assert_eq!(options.get_response_timeout(), Duration::from_secs(4));
    let backend = outcome(Ok(options)).await.expect("connect");
    assert_eq!(
        backend.capabilities().limits.min_ttl,
        Duration::from_secs(2)
    );
    let locker = Locker::new(backend);
    let key = unique_key("options");
    let lease = locker
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .expect("granted");
    // The entry lives under the setter's prefix, not the URL's.
    let client = etcd_client::Client::connect(
        [url.trim_start_matches("etcd://").split(',').next().unwrap()],
        None,
    )
    .await
    .expect("a plain client");
    let count = |p: String| {
        let mut client = client.clone();
        async move {
            let only = etcd_client::GetOptions::new()
                .with_prefix()
                .with_count_only();
            client.get(p, Some(only)).await.expect("get").count()
        }
    };
    assert_eq!(count(prefix.clone()).await, 1);
    assert_eq!(count("ignored/".to_owned()).await, 0);
    locker.release(lease).await.expect("release");
}

/// A closed port: dialling it fails at once as unavailable, so an input
/// error shows that the check ran before any member was dialled.
const CLOSED: &str = "etcd://127.0.0.1:1";

#[tokio::test]
async fn a_setters_bad_value_is_refused_by_connect_with_naming_the_option_before_connecting() {
    let options = || EtcdOptions::from_url(CLOSED).expect("a plain URL");
    let zero = Duration::ZERO;
    let missing = "/nonexistent/lockkit/ca.pem";
    let file = std::env::current_exe().expect("this test's own file");
    let file = file.to_str().expect("a UTF-8 path");
    let mut cases = vec![
        ("connect_timeout_ms", options().connect_timeout(zero)),
        ("response_timeout_ms", options().response_timeout(zero)),
        ("prefix", options().prefix("a\nb")),
        ("min_ttl_s", options().min_ttl(Duration::from_millis(1500))),
        ("ca_file", options().ca_file(missing)),
        ("cert_file", options().client_certificate(file, file)),
    ];
    if cfg!(feature = "tls") {
        let tls = || options().ca_file(file);
        cases.push(("cert_file", tls().client_certificate(missing, file)));
        cases.push(("key_file", tls().client_certificate(file, missing)));
    }
    for (option, bad) in cases {
        let checked = bad.check();
        assert!(
            matches!(&checked, Err(Error::InvalidInput { field, .. }) if *field == option),
            "check: {checked:?}"
        );
        let connected = outcome(Ok(bad)).await;
        assert!(
            matches!(&connected, Err(Error::InvalidInput { field, .. }) if *field == option),
            "{option}: {connected:?}"
        );
    }
    // The same URL with good values goes on to dial, and finds no member.
    let connected = outcome(Ok(options())).await;
    assert!(
        matches!(connected, Err(Error::Unavailable { .. })),
        "{connected:?}"
    );
}

/// A TLS file the URL names is read when connecting; when the URL is
/// ambiguous (its path may hold a piece of the password), the refusal
/// names the option but not the path.
#[cfg(feature = "tls")]
#[tokio::test]
async fn an_unreadable_file_of_an_ambiguous_url_is_refused_without_its_path() {
    // `@` after the servers: the URL is ambiguous, so nothing of it is shown.
    let url = "etcd://u:pw@127.0.0.1:1?ca_file=/nonexistent/a@corp/ca.pem";
    let options = EtcdOptions::from_url(url).expect("read; its file is not read yet");
    let connected = outcome(Ok(options)).await;
    match connected {
        Err(Error::InvalidInput {
            field: "ca_file",
            problem,
        }) => assert!(
            !problem.contains("corp") && !problem.contains("pw"),
            "{problem}"
        ),
        other => panic!("expected an input error naming ca_file, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_ttl_beyond_the_longest_ttl_is_refused_by_name() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let with = format!("{url}?min_ttl_s={}", u64::MAX);
    let connected = outcome(EtcdOptions::from_url(&with)).await;
    assert!(
        matches!(
            connected,
            Err(Error::InvalidInput {
                field: "min_ttl_s",
                ..
            })
        ),
        "{connected:?}"
    );
    let options = EtcdOptions::from_url(&url).map(|o| o.min_ttl(Duration::from_secs(u64::MAX)));
    let connected = outcome(options).await;
    assert!(
        matches!(
            connected,
            Err(Error::InvalidInput {
                field: "min_ttl_s",
                ..
            })
        ),
        "{connected:?}"
    );
}
