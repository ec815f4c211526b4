//! Options read from a URL and adjusted with the setters, on the shared
//! nodes: they connect, and each setting takes effect; a setter's value
//! that cannot be taken is refused by `connect_with`, naming the option,
//! before any node is dialled.

use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, Locker};
use lock_redlock::{RedlockBackend, RedlockOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_from_the_url_and_the_setters_connect() {
    let Some(url) = server_url("LOCKKIT_REDLOCK_URL") else {
        return;
    };
    let prefix = unique_key("options-prefix") + ":";
    let options = RedlockOptions::from_url(&format!("{url}?prefix=ignored:&node_timeout_ms=1"))
        .expect("options")
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(5))
        .prefix(prefix.clone());
    assert_eq!(options.get_prefix(), prefix);
    let backend = RedlockBackend::connect_with(options)
        .await
        .expect("connect");
    assert!(format!("{backend:?}").contains("500ms"), "{backend:?}");
    let key = unique_key("options");
    let keys = backend.redis_keys(&key);
    let locker = Locker::new(backend);
    let held = locker
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .expect("granted");
    // The grant lives on the nodes under the setter's prefix.
    assert!(keys.lock.starts_with(&prefix), "{}", keys.lock);
    let mut holding = 0;
    for node in url.trim_start_matches("redlock://").split(',') {
        let client = redis::Client::open(format!("redis://{node}")).expect("a plain client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let exists: bool = redis::cmd("EXISTS")
            .arg(&keys.lock)
            .query_async(&mut conn)
            .await
            .expect("EXISTS");
        holding += usize::from(exists);
    }
    assert!(holding > 0, "{} is on no node", keys.lock);
    locker.release(held).await.expect("release");
}

/// Closed ports: dialling them fails at once, so an input error shows that
/// the check ran before any node was dialled.
const CLOSED: &str = "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3";

#[tokio::test]
async fn a_setters_bad_value_is_refused_by_connect_with_naming_the_option_before_connecting() {
    let options = || RedlockOptions::from_url(CLOSED).expect("a plain URL");
    let zero = Duration::ZERO;
    for (option, bad) in [
        ("node_timeout_ms", options().node_timeout(zero)),
        ("connect_timeout_ms", options().connect_timeout(zero)),
        ("prefix", options().prefix("a}b")),
    ] {
        let checked = bad.check();
        assert!(
            matches!(&checked, Err(Error::InvalidInput { field, .. }) if *field == option),
            "check: {checked:?}"
        );
        let connected = RedlockBackend::connect_with(bad).await;
        assert!(
            matches!(&connected, Err(Error::InvalidInput { field, .. }) if *field == option),
            "{option}: {connected:?}"
        );
    }
    // The same URL with good values goes on to dial, and finds no node.
    let connected = RedlockBackend::connect_with(options()).await;
    assert!(
        matches!(connected, Err(Error::Unavailable { .. })),
        "{connected:?}"
    );
}
