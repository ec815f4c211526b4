//! Options read from a URL and adjusted with the setters, on the shared
//! server: they connect, and each setting takes effect; a setter given a
//! value it cannot take refuses it, naming the option.

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
        .and_then(|o| o.connect_timeout(Duration::from_secs(5)))
        .and_then(|o| o.response_timeout(Duration::from_secs(4)))
        .and_then(|o| o.prefix(prefix.clone()))
        .and_then(|o| o.waiter_lease(lease))
        .expect("options");
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

#[test]
fn a_setters_bad_value_is_refused_naming_the_option() {
    let options = || RedisOptions::from_url("redis://127.0.0.1:6379").expect("a plain URL");
    let named = |r: Result<RedisOptions, Error>| match r {
        Err(Error::InvalidInput { field, .. }) => field,
        other => panic!("expected an input error, got {other:?}"),
    };
    let zero = Duration::ZERO;
    assert_eq!(named(options().connect_timeout(zero)), "connect_timeout_ms");
    assert_eq!(
        named(options().response_timeout(zero)),
        "response_timeout_ms"
    );
    assert_eq!(named(options().prefix("a{b}")), "prefix");
    assert_eq!(named(options().waiter_lease(zero)), "waiter_lease");
}
