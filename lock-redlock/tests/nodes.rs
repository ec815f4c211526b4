//! What Redlock learns of its nodes when it connects: whether two entries
//! are one server, and whether a node may evict lock keys.

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
