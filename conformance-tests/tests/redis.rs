//! The conformance suite against the single Redis of `scripts/servers.sh`.
//! The sabotage is the operator's force release: a `DEL` of the lock key.

use conformance_tests::{Fixture, ForceRelease, conformance_suite, server_url};
use lock_core::Locker;
use lock_redis::RedisBackend;

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_REDIS_URL")?;
    let connect = || async { Locker::new(RedisBackend::connect(&url).await.expect("connect")) };
    Some(
        Fixture::new(
            connect().await,
            connect().await,
            ForceRelease(connect().await),
        )
        .with_url(&url),
    )
}

conformance_suite!(fixture);
