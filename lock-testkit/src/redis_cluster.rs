//! A Redis Cluster serving its clients and its cluster bus over TLS.

use std::io;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::{find_binary, run_client};
use crate::{RedisOptions, RedisServer, TestCa};

/// How long the nodes may take to agree that the cluster is ok.
const FORMING_TIMEOUT: Duration = Duration::from_secs(30);

/// A private Redis Cluster of N masters without replicas, each a
/// [`RedisServer`] that also serves TLS with a certificate from a
/// [`TestCa`]: clients and the cluster bus use TLS, and the nodes announce
/// their TLS ports (`tls-cluster yes`). Each node keeps its plain port for
/// [`RedisServer::cli`].
///
/// Dropping it kills every node and removes their directories.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    tls_ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts `n` nodes (3 or more: `redis-cli --cluster create` asks for
    /// 3 masters), assigns the slots, and waits until every node reports
    /// `cluster_state:ok`.
    pub fn start_tls(n: usize, ca: &TestCa) -> io::Result<RedisCluster> {
        let mut nodes = Vec::with_capacity(n);
        let mut tls_ports = Vec::with_capacity(n);
        for _ in 0..n {
            let node = RedisServer::start_with(RedisOptions {
                tls: Some(ca.redis_tls()),
                cluster_node: true,
                ..RedisOptions::default()
            })?;
            tls_ports.extend(node.tls_port());
            nodes.push(node);
        }
        let cluster = RedisCluster { nodes, tls_ports };
        let ca_file = ca.ca_file();
        run_client(
            Command::new(find_binary("redis-cli")?)
                .arg("--tls")
                .arg("--cacert")
                .arg(&ca_file)
                .args(["--cluster", "create"])
                .args(cluster.host_ports())
                .args(["--cluster-replicas", "0", "--cluster-yes"]),
        )?;
        cluster.wait_ok()?;
        Ok(cluster)
    }

    /// `rediss+cluster://127.0.0.1:T1,127.0.0.1:T2,...` (the TLS ports),
    /// without the CA: add `?ca_file=` [`TestCa::ca_file`].
    pub fn url(&self) -> String {
        format!("rediss+cluster://{}", self.host_ports().join(","))
    }

    /// The nodes, in URL order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    fn host_ports(&self) -> Vec<String> {
        self.tls_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// Polls every node's `CLUSTER INFO` (no event says the nodes agree).
    fn wait_ok(&self) -> io::Result<()> {
        let deadline = Instant::now() + FORMING_TIMEOUT;
        loop {
            let ok = self.nodes.iter().all(|node| {
                node.cli(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.lines().any(|l| l.trim() == "cluster_state:ok"))
            });
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "lock-testkit: the TLS Redis Cluster was not ok after {FORMING_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
