//! The conformance suite against the in-memory backend: no server needed.

use conformance_tests::{Fixture, Sabotage, conformance_suite};
use lock_core::{Locker, MemoryBackend};

struct Expire(MemoryBackend);

#[async_trait::async_trait]
impl Sabotage for Expire {
    async fn remove_grant(&self, key: &str) {
        assert!(self.0.expire_now(key), "no grant on {key} to remove");
    }
}

async fn fixture() -> Option<Fixture> {
    let memory = MemoryBackend::new();
    Some(Fixture::new(
        Locker::new(memory.clone()),
        Locker::new(memory.clone()),
        Expire(memory),
    ))
}

conformance_suite!(fixture);
