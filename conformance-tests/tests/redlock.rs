//! The conformance suite against Redlock over the nodes of `LOCKKIT_REDLOCK_URL`.

use conformance_tests::{Fixture, Sabotage, conformance_suite, server_url};
use lock_core::Locker;
use lock_core::url::ServerUrl;
use lock_redlock::RedlockBackend;

/// Deletes the grant on every node, as an operator's `DEL` would.
struct Del {
    backend: RedlockBackend,
    nodes: Vec<(String, u16)>,
}

#[async_trait::async_trait]
impl Sabotage for Del {
    async fn remove_grant(&self, key: &str) {
        let lock = self.backend.redis_keys(key).lock;
        let mut deleted = 0;
        for (host, port) in &self.nodes {
            let out = std::process::Command::new("redis-cli")
                .args(["-h", host, "-p", &port.to_string(), "DEL", &lock])
                .output()
                .expect("redis-cli runs");
            deleted += String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u32>()
                .unwrap_or(0);
        }
        assert!(deleted > 0, "no node held {lock}");
    }
}

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_REDLOCK_URL")?;
    let nodes = ServerUrl::parse(&url).expect("a redlock:// URL").servers;
    let nodes = nodes
        .into_iter()
        .map(|s| (s.host, s.port.unwrap_or(6379)))
        .collect();
    // A loaded test machine can stall a reply past the 50 ms default.
    let backend = RedlockBackend::connect_with(
        &url,
        lock_redlock::RedlockOptions::default().node_timeout(std::time::Duration::from_millis(500)),
    )
    .await
    .expect("connect");
    Some(Fixture::new(
        Locker::new(backend.clone()),
        Del { backend, nodes },
    ))
}

conformance_suite!(fixture);
