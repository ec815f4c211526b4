//! The conformance suite against the Redis Cluster (3 masters) of `scripts/servers.sh`.

use conformance_tests::{Fixture, Sabotage, conformance_suite, server_url};
use lock_core::Locker;
use lock_redis::RedisBackend;

struct Break(Locker);

#[async_trait::async_trait]
impl Sabotage for Break {
    async fn remove_grant(&self, key: &str) {
        assert!(
            self.0.force_release(key).await.expect("DEL"),
            "no grant on {key} to remove"
        );
    }
}

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_REDIS_CLUSTER_URL")?;
    let backend = RedisBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend);
    Some(Fixture::new(locker.clone(), Break(locker)))
}

conformance_suite!(fixture);
