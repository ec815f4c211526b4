//! Connection options at the ends of their range, on the shared cluster:
//! each either works or is refused with an input error naming it, and
//! nothing panics.

use lock_core::Wait;
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, GuardOptions, Locker};
use lock_etcd::{EtcdBackend, EtcdOptions};

/// Connects in a task of its own, so that a panic is reported as one.
async fn outcome(url: String, options: EtcdOptions) -> Result<EtcdBackend, Error> {
    tokio::spawn(async move { EtcdBackend::connect_with(&url, options).await })
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
    let huge = [Duration::MAX, Duration::from_millis(u64::MAX)];
    for d in huge {
        let options = EtcdOptions::default().connect_timeout(d);
        let what = format!("connect_timeout {d:?}");
        works_or_names(
            &what,
            "connect_timeout_ms",
            outcome(url.clone(), options).await,
        )
        .await;
        let options = EtcdOptions::default().request_timeout(d);
        let what = format!("request_timeout {d:?}");
        works_or_names(
            &what,
            "request_timeout_ms",
            outcome(url.clone(), options).await,
        )
        .await;
    }
    for option in ["connect_timeout_ms", "request_timeout_ms"] {
        let with = format!("{url}?{option}={}", u64::MAX);
        let connected = outcome(with, EtcdOptions::default()).await;
        works_or_names(option, option, connected).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_ttl_beyond_the_longest_ttl_is_refused_by_name() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let with = format!("{url}?min_ttl_s={}", u64::MAX);
    let connected = outcome(with, EtcdOptions::default()).await;
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
    let options = EtcdOptions::default().min_ttl(Duration::from_secs(u64::MAX));
    let connected = outcome(url, options).await;
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
