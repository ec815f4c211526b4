//! Options read from a URL and adjusted with the setters, on the shared
//! nodes: they connect, and each setting takes effect; a setter given a
//! value it cannot take refuses it, naming the option.

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
        .and_then(|o| o.node_timeout(Duration::from_millis(500)))
        .and_then(|o| o.connect_timeout(Duration::from_secs(5)))
        .and_then(|o| o.prefix(prefix.clone()))
        .expect("options");
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

#[test]
fn a_setters_bad_value_is_refused_naming_the_option() {
    let options = || RedlockOptions::from_url("redlock://a:1,b:2,c:3").expect("a plain URL");
    let named = |r: Result<RedlockOptions, Error>| match r {
        Err(Error::InvalidInput { field, .. }) => field,
        other => panic!("expected an input error, got {other:?}"),
    };
    let zero = Duration::ZERO;
    assert_eq!(named(options().node_timeout(zero)), "node_timeout_ms");
    assert_eq!(named(options().connect_timeout(zero)), "connect_timeout_ms");
    assert_eq!(named(options().prefix("a}b")), "prefix");
}
