//! The conformance suite against the single Redis of `scripts/servers.sh`.

use conformance_tests::{Fixture, Sabotage, conformance_suite, server_url};
use lock_core::Locker;
use lock_redis::RedisBackend;

struct Break(RedisBackend);

#[async_trait::async_trait]
impl Sabotage for Break {
    async fn remove_grant(&self, key: &str) {
        assert!(
            self.0.break_lock(key).await.expect("DEL"),
            "no grant on {key} to remove"
        );
    }
}

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_REDIS_URL")?;
    let backend = RedisBackend::connect(&url).await.expect("connect");
    Some(Fixture::new(Locker::new(backend.clone()), Break(backend)))
}

conformance_suite!(fixture);
