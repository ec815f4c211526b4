//! Options read from a URL and adjusted with the setters, on the shared
//! server: they connect, and each setting takes effect; a setter's value
//! that cannot be taken is refused by `connect_with`, naming the option,
//! before anything connects.

use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, LockBackend, Locker, Stall, WaitingOrder};
use lock_redis::{RedisBackend, RedisOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_from_the_url_and_the_setters_connect() {
    let Some(url) = server_url("LOCKKIT_REDIS_URL") else {
        return;
    };
    let prefix = unique_key("options-prefix") + ":";
    let lease = Duration::from_secs(2);
    let options = RedisOptions::from_url(&format!("{url}?prefix=ignored:&timeout_ms=100"))
        .expect("options")
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(4))
        .prefix(prefix.clone())
        .waiter_lease(lease);
    assert_eq!(options.get_response_timeout(), Duration::from_secs(4));
    let backend = RedisBackend::connect_with(options).await.expect("connect");
    assert_eq!(backend.layout().prefix(), prefix);
    assert_eq!(
        backend.capabilities().waiting_order,
        WaitingOrder::Fifo {
            stall: Stall::WaiterLease(lease)
        }
    );
    let locker = Locker::new(backend);
    let key = unique_key("options");
    let held = locker
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .expect("granted");
    // The grant lives under the setter's prefix, not the URL's.
    let client = redis::Client::open(url.as_str()).expect("a plain client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let keys = |pattern: String| {
        let mut conn = conn.clone();
        async move {
            let found: Vec<String> = redis::cmd("KEYS")
                .arg(pattern)
                .query_async(&mut conn)
                .await
                .expect("KEYS");
            found
        }
    };
    assert!(
        keys(format!("{prefix}*"))
            .await
            .iter()
            .any(|k| k.contains(&key)),
        "no key of the lock under {prefix}"
    );
    assert!(keys(format!("ignored:*{key}*")).await.is_empty());
    locker.release(held).await.expect("release");
    let _: () = redis::cmd("UNLINK")
        .arg(keys(format!("{prefix}*")).await)
        .query_async(&mut conn)
        .await
        .unwrap_or(());
}

/// A closed port: connecting there fails at once as unavailable, so an
/// input error shows that the check ran before any connection.
const CLOSED: &str = "redis://127.0.0.1:1";

#[tokio::test]
async fn a_setters_bad_value_is_refused_by_connect_with_naming_the_option_before_connecting() {
    let options = || RedisOptions::from_url(CLOSED).expect("a plain URL");
    let zero = Duration::ZERO;
    for (option, bad) in [
        ("connect_timeout_ms", options().connect_timeout(zero)),
        ("response_timeout_ms", options().response_timeout(zero)),
        ("prefix", options().prefix("a{b}")),
        ("waiter_lease_ms", options().waiter_lease(zero)),
    ] {
        let checked = bad.check();
        assert!(
            matches!(&checked, Err(Error::InvalidInput { field, .. }) if *field == option),
            "check: {checked:?}"
        );
        let connected = RedisBackend::connect_with(bad).await;
        assert!(
            matches!(&connected, Err(Error::InvalidInput { field, .. }) if *field == option),
            "{option}: {connected:?}"
        );
    }
    // The same URL with good values goes on to connect, and finds no server.
    let connected = RedisBackend::connect_with(options()).await;
    assert!(
        matches!(connected, Err(Error::Unavailable { .. })),
        "{connected:?}"
    );
}

#[test]
fn a_bad_value_names_the_same_option_in_the_url_and_in_the_setter() {
    let named = |r: Result<(), Error>| match r {
        Err(Error::InvalidInput { field, .. }) => field,
        other => panic!("expected an input error, got {other:?}"),
    };
    let url = RedisOptions::from_url(&format!("{CLOSED}?waiter_lease_ms=1")).map(drop);
    let setter = RedisOptions::from_url(CLOSED)
        .expect("a plain URL")
        .waiter_lease(Duration::from_millis(1))
        .check();
    assert_eq!(named(url), "waiter_lease_ms");
    assert_eq!(named(setter), "waiter_lease_ms");
}
