//! EtcdCluster against real etcd processes.

use std::io;
use std::time::{Duration, Instant};

use lock_testkit::EtcdCluster;

#[test]
fn three_member_cluster_survives_a_killed_leader_and_the_member_rejoins() -> io::Result<()> {
    let cluster = EtcdCluster::start(3)?;
    assert_eq!(cluster.len(), 3);
    let expected: Vec<String> = cluster
        .members()
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.client_port()))
        .collect();
    assert_eq!(cluster.url(), format!("etcd://{}", expected.join(",")));

    assert_eq!(cluster.etcdctl(&["put", "lock/a", "1"])?, "OK");
    assert_eq!(
        cluster.etcdctl(&["get", "lock/a", "--print-value-only"])?,
        "1"
    );

    let leader = cluster
        .leader_index()
        .expect("a fresh healthy cluster has a leader");
    cluster.member(leader).kill()?;
    assert!(!cluster.member(leader).is_running());

    // The two others elect a new leader and keep serving writes.
    let deadline = Instant::now() + Duration::from_secs(15);
    let new_leader = loop {
        if let Some(i) = cluster.leader_index() {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "no new leader after the old one was killed"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(new_leader, leader);
    assert_eq!(cluster.etcdctl(&["put", "lock/b", "2"])?, "OK");

    // The killed member comes back with its data dir and catches up.
    cluster.member(leader).restart()?;
    assert!(cluster.member(leader).is_healthy());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Serializable: answered from this member's own copy of the data.
        let got = cluster.member(leader).etcdctl(&[
            "get",
            "lock/b",
            "--print-value-only",
            "--consistency=s",
        ])?;
        if got == "2" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "restarted member did not catch up: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Leases: a key attached to a lease goes when the lease is revoked.
    let grant = cluster.etcdctl(&["lease", "grant", "60"])?;
    // "lease 694d7f4e1c2b2a0b granted with TTL(60s)"
    let lease = grant
        .split_whitespace()
        .nth(1)
        .expect("lease id")
        .to_string();
    cluster.etcdctl(&["put", "lock/leased", "x", &format!("--lease={lease}")])?;
    assert_eq!(cluster.revoke_all_leases()?, 1);
    assert_eq!(
        cluster.etcdctl(&["get", "lock/leased", "--print-value-only"])?,
        ""
    );
    assert_eq!(
        cluster.etcdctl(&["get", "lock/a", "--print-value-only"])?,
        "1"
    );
    Ok(())
}

#[test]
fn a_paused_member_is_unhealthy_until_resumed() -> io::Result<()> {
    let cluster = EtcdCluster::start(1)?;
    let member = cluster.member(0);
    assert_eq!(cluster.leader_index(), Some(0));
    member.pause()?;
    assert!(member.is_running());
    assert!(!member.is_healthy());
    member.resume()?;
    assert!(member.is_healthy());
    Ok(())
}

/// A member's metrics are read over HTTP from plain code and from inside a
/// runtime alike, and a path the member does not serve is an error.
#[tokio::test]
async fn metrics_are_read_inside_and_outside_a_runtime() -> io::Result<()> {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .expect("start task")?;
    let member = cluster.member(0);
    // Inside this test's runtime.
    assert!(member.counter("etcd_server_has_leader")? >= 1);
    let address = format!("127.0.0.1:{}", member.client_port());
    let metrics = lock_testkit::http::get(&address, "/metrics").await?;
    assert!(metrics.contains("etcd_server_has_leader"), "{metrics}");
    let missing = lock_testkit::http::get(&address, "/no-such-page").await;
    assert!(
        missing
            .as_ref()
            .is_err_and(|e| e.to_string().contains("404")),
        "{missing:?}"
    );
    // Outside any runtime.
    let (cluster, calls) = tokio::task::spawn_blocking(move || {
        let calls = cluster.member(0).grpc_calls_started("Range");
        (cluster, calls)
    })
    .await
    .expect("read task");
    calls?;
    drop(cluster);
    Ok(())
}
