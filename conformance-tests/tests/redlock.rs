//! The conformance suite against Redlock over the 5 nodes of `scripts/servers.sh`.
//! The sabotage is the operator's force release: a `DEL` on every node.

use std::time::Duration;

use conformance_tests::{Fixture, ForceRelease, conformance_suite, server_url};
use lock_core::Locker;
use lock_redlock::{RedlockBackend, RedlockOptions};

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_REDLOCK_URL")?;
    // A loaded test machine can stall a reply past the 50 ms default.
    let options = RedlockOptions::from_url(&url)
        .expect("the URL of the shared nodes")
        .node_timeout(Duration::from_millis(500));
    let connect = || async {
        Locker::new(
            RedlockBackend::connect_with(options.clone())
                .await
                .expect("connect"),
        )
    };
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
