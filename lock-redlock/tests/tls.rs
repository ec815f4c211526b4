//! Redlock over TLS (`tls=true`, with the `tls` feature): three private
//! Redis nodes serving TLS with certificates from one throwaway CA.
#![cfg(feature = "tls")]

use std::time::Duration;

use lock_core::Locker;
use lock_redlock::RedlockBackend;
use lock_testkit::{RedisOptions, RedisServer, TestCa};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_tls_on_every_node() {
    let ca = TestCa::generate().expect("make a test CA");
    let mut nodes = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..3 {
        let node = RedisServer::start_with(RedisOptions {
            tls: Some(ca.redis_tls()),
            ..RedisOptions::default()
        })
        .expect("start redis with TLS");
        ports.push(format!(
            "127.0.0.1:{}",
            node.tls_port().expect("a TLS port")
        ));
        nodes.push(node);
    }
    let url = format!(
        "redlock://{}?tls=true&ca_file={}",
        ports.join(","),
        ca.ca_file().display()
    );
    let locker = Locker::new(RedlockBackend::connect(&url).await.expect("connect"));
    let lease = locker
        .try_acquire("tls/redlock", Duration::from_secs(30))
        .await
        .expect("a quorum of TLS nodes grants");
    for node in &nodes {
        let held = node
            .cli(&["EXISTS", "lockkit:{tls/redlock}"])
            .expect("EXISTS");
        assert_eq!(held.trim(), "1", "granted on every node");
    }
    locker.release(lease).await.expect("release");
}
