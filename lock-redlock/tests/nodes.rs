//! What Redlock learns of its nodes when it connects: whether two entries
//! are one server, and whether a node may evict lock keys.

use lock_core::{Assumption, LockBackend};
use lock_redlock::RedlockBackend;
use lock_testkit::RedisNodes;

/// `127.0.0.1:P` and `localhost:P` pass the URL's check (they are spelt
/// differently) but reach one server, which would count twice towards a
/// quorum: the servers' `run_id` gives them away.
#[tokio::test]
async fn two_names_of_one_server_are_refused_at_connect_naming_both_entries() {
    let nodes = RedisNodes::start(2).expect("2 redis nodes");
    let (a, b) = (nodes.node(0).port(), nodes.node(1).port());
    let url =
        format!("redlock://:pw-9e1b@127.0.0.1:{a},:pw-9e1b@localhost:{a},:pw-9e1b@127.0.0.1:{b}");
    // With a password, to see that no error shows it.
    for node in nodes.nodes() {
        node.cli(&["CONFIG", "SET", "requirepass", "pw-9e1b"])
            .expect("requirepass");
    }
    let err = RedlockBackend::connect(&url)
        .await
        .expect_err("one server under two names was taken as two nodes");
    let text = err.to_string();
    assert!(err.is_invalid_input(), "{err}");
    assert!(
        text.contains(&format!("node #1 (127.0.0.1:{a})"))
            && text.contains(&format!("node #2 (localhost:{a})")),
        "{text}"
    );
    assert!(!text.contains("pw-9e1b"), "{text}");

    let distinct = format!("redlock://:pw-9e1b@127.0.0.1:{a},:pw-9e1b@localhost:{b}");
    RedlockBackend::connect(&distinct)
        .await
        .expect("two servers, one of them by name");
}

/// Every node is asked for its eviction policy; one that may evict lock
/// keys is named by its place in the URL and its address.
#[tokio::test]
async fn a_node_that_may_evict_lock_keys_is_named_in_the_capabilities() {
    let nodes = RedisNodes::start(3).expect("3 redis nodes");
    let backend = RedlockBackend::connect(&nodes.url())
        .await
        .expect("connect");
    let caps = backend.capabilities();
    assert!(
        caps.exclusion_rests_on
            .contains(&Assumption::ServerEvictsNoLockKeys),
        "{caps:?}"
    );
    assert_eq!(caps.lock_key_eviction, None, "no node has a maxmemory");

    nodes
        .node(1)
        .cli(&[
            "CONFIG",
            "SET",
            "maxmemory",
            "2mb",
            "maxmemory-policy",
            "allkeys-lru",
        ])
        .expect("CONFIG SET");
    let backend = RedlockBackend::connect(&nodes.url())
        .await
        .expect("connect");
    assert_eq!(
        backend.capabilities().lock_key_eviction.as_deref(),
        Some(
            format!(
                "`allkeys-lru` (maxmemory 2097152 bytes) on node #2 ({})",
                nodes.node(1).host_port()
            )
            .as_str()
        )
    );
}
