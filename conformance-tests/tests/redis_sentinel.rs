//! The conformance suite against the Redis Sentinel deployment of
//! `scripts/servers.sh` (a master, a replica, three sentinels).
//! The sabotage is the operator's force release: a `DEL` of the lock key.

use conformance_tests::{Fixture, ForceRelease, conformance_suite, server_url};
use lock_core::Locker;
use lock_redis::SentinelBackend;

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_REDIS_SENTINEL_URL")?;
    let connect = || async { Locker::new(SentinelBackend::connect(&url).await.expect("connect")) };
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
