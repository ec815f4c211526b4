//! etcd: a real multi-member cluster whose members can be killed, paused and
//! restarted one by one.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::process::{Process, Spec, find_binary, free_port, retry_addr_in_use, run_client};

/// A private etcd cluster (etcd 3.4 flags) on free loopback ports, one temp
/// dir holding every member's data dir and log.
///
/// Dropping it kills every member and removes the directory.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    etcdctl: PathBuf,
    // Declared last so the members are killed before their dirs go.
    dir: TempDir,
}

/// One member of an [`EtcdCluster`].
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// The CA of the member's client certificate when it serves TLS.
    client_ca: Option<PathBuf>,
    /// The client certificate and key etcdctl presents, when the member
    /// asks clients for one.
    client_cert: Option<(PathBuf, PathBuf)>,
    etcdctl: PathBuf,
    process: Process,
}

impl EtcdCluster {
    /// Starts a cluster of `members` members (1, 3 or 5 make sense) and waits
    /// until every member reports healthy (a leader is elected and a
    /// quorum read works).
    pub fn start(members: usize) -> io::Result<EtcdCluster> {
        Self::start_with(members, None, false)
    }

    /// As [`start`](Self::start), with the members serving clients over TLS
    /// with the server certificate of `ca` (peers still talk plain HTTP).
    pub fn start_tls(members: usize, ca: &crate::TestCa) -> io::Result<EtcdCluster> {
        Self::start_with(members, Some(ca), false)
    }

    /// As [`start_tls`](Self::start_tls), with the members also asking
    /// every client for a certificate signed by `ca` (`--client-cert-auth`):
    /// [`TestCa::client_cert_file`](crate::TestCa::client_cert_file) is one.
    pub fn start_mtls(members: usize, ca: &crate::TestCa) -> io::Result<EtcdCluster> {
        Self::start_with(members, Some(ca), true)
    }

    fn start_with(
        members: usize,
        tls: Option<&crate::TestCa>,
        client_certs: bool,
    ) -> io::Result<EtcdCluster> {
        if members == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an etcd cluster needs at least one member",
            ));
        }
        let etcd = find_binary("etcd")?;
        let etcdctl = find_binary("etcdctl")?;
        retry_addr_in_use(|| {
            let dir = tempfile::Builder::new()
                .prefix("lock-testkit-etcd-")
                .tempdir()?;
            let ports = (0..members)
                .map(|_| Ok((free_port()?, free_port()?)))
                .collect::<io::Result<Vec<(u16, u16)>>>()?;
            let initial_cluster = ports
                .iter()
                .enumerate()
                .map(|(i, (_, peer))| format!("etcd-{i}=http://127.0.0.1:{peer}"))
                .collect::<Vec<_>>()
                .join(",");
            // A token unique to this cluster, so members of two clusters
            // started by parallel tests can never join each other.
            static CLUSTERS: AtomicU64 = AtomicU64::new(0);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let token = format!(
                "lock-testkit-{}-{}-{nanos}",
                std::process::id(),
                CLUSTERS.fetch_add(1, Ordering::Relaxed)
            );
            let members = ports
                .iter()
                .enumerate()
                .map(|(i, &(client_port, peer_port))| {
                    let name = format!("etcd-{i}");
                    let scheme = if tls.is_some() { "https" } else { "http" };
                    let client = format!("{scheme}://127.0.0.1:{client_port}");
                    let peer = format!("http://127.0.0.1:{peer_port}");
                    let data_dir = dir.path().join(&name);
                    let mut args: Vec<OsString> = vec![
                        "--name".into(),
                        name.clone().into(),
                        "--data-dir".into(),
                        data_dir.into(),
                        "--listen-client-urls".into(),
                        client.clone().into(),
                        "--advertise-client-urls".into(),
                        client.into(),
                        "--listen-peer-urls".into(),
                        peer.clone().into(),
                        "--initial-advertise-peer-urls".into(),
                        peer.into(),
                        "--initial-cluster".into(),
                        initial_cluster.clone().into(),
                        // Ignored on restart: a member with a data dir rejoins
                        // the cluster recorded there.
                        "--initial-cluster-state".into(),
                        "new".into(),
                        "--initial-cluster-token".into(),
                        token.clone().into(),
                        // etcd 3.4 defaults to the deprecated capnslog logger.
                        "--logger".into(),
                        "zap".into(),
                        "--log-outputs".into(),
                        "stderr".into(),
                    ];
                    if let Some(ca) = tls {
                        args.extend([
                            "--cert-file".into(),
                            ca.server_cert_file().into(),
                            "--key-file".into(),
                            ca.server_key_file().into(),
                        ]);
                        if client_certs {
                            args.extend([
                                "--client-cert-auth".into(),
                                "--trusted-ca-file".into(),
                                ca.ca_file().into(),
                            ]);
                        }
                    }
                    EtcdMember {
                        process: Process::new(Spec {
                            name: format!("etcd member {name} (client port {client_port})"),
                            program: etcd.clone(),
                            args,
                            cwd: dir.path().to_path_buf(),
                            log: dir.path().join(format!("{name}.log")),
                            user: None,
                            env: Vec::new(),
                        }),
                        name,
                        client_port,
                        peer_port,
                        client_ca: tls.map(crate::TestCa::ca_file),
                        client_cert: tls
                            .filter(|_| client_certs)
                            .map(|ca| (ca.client_cert_file(), ca.client_key_file())),
                        etcdctl: etcdctl.clone(),
                    }
                })
                .collect();
            let cluster = EtcdCluster {
                members,
                etcdctl: etcdctl.clone(),
                dir,
            };
            // All members must run before any can be healthy (quorum).
            for member in &cluster.members {
                member.process.spawn()?;
            }
            for member in &cluster.members {
                member.wait_healthy()?;
            }
            Ok(cluster)
        })
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,...` (client ports).
    pub fn url(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("etcd://{}", members.join(","))
    }

    /// The client endpoints, `http://127.0.0.1:PORT` each, as etcd clients
    /// take them.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }

    /// The `i`-th member. Panics if `i >= len()`.
    pub fn member(&self, i: usize) -> &EtcdMember {
        &self.members[i]
    }

    /// All members.
    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The directory holding every member's data dir and log.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The index of the member that reports itself leader, asking each
    /// running member in turn (`etcdctl endpoint status -w json`); `None` if
    /// no running member does (no quorum, election in progress).
    pub fn leader_index(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.is_running() && m.is_leader())
    }

    /// Runs `etcdctl` (v3 API) against all endpoints of the cluster and
    /// returns its stdout without the trailing newline.
    pub fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        let first = self.members.first();
        let ca = first.and_then(|m| m.client_ca.as_deref());
        let cert = first.and_then(|m| m.client_cert.as_ref());
        let endpoints = self.endpoints().join(",");
        run_client(etcdctl_command(&self.etcdctl, &endpoints, ca, cert, "5s").args(args))
    }

    /// Revokes every lease the cluster knows (deleting the keys attached to
    /// them, as if every lock holder's lease had expired at once). Returns
    /// how many were revoked.
    pub fn revoke_all_leases(&self) -> io::Result<usize> {
        // Output: "found N leases" then one hex lease ID per line.
        let list = self.etcdctl(&["lease", "list"])?;
        let mut revoked = 0;
        for id in list
            .lines()
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            match self.etcdctl(&["lease", "revoke", id]) {
                Ok(_) => revoked += 1,
                // It expired between the list and the revoke: fine.
                Err(e) if e.to_string().contains("not found") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(revoked)
    }

    /// Starts every member that is not running, then waits until all are
    /// healthy. Use this instead of [`EtcdMember::restart`] one by one when
    /// the cluster lost its quorum (a lone restarted member cannot become
    /// healthy).
    pub fn start_stopped_members(&self) -> io::Result<()> {
        for member in &self.members {
            if !member.is_running() {
                member.process.spawn()?;
            }
        }
        self.members.iter().try_for_each(EtcdMember::wait_healthy)
    }
}

impl EtcdMember {
    /// The member's name in the cluster (`etcd-0`, `etcd-1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `http://127.0.0.1:CLIENT_PORT`
    pub fn endpoint(&self) -> String {
        let scheme = if self.client_ca.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The port clients talk to.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The port other members talk to.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The member's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The member's log file (appended to across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.process.spec.log.clone()
    }

    /// SIGSTOP: the member stops answering clients and peers (if it led,
    /// the others elect a new leader after the election timeout).
    pub fn pause(&self) -> io::Result<()> {
        self.process.signal(Signal::SIGSTOP)
    }

    /// SIGCONT: undoes [`pause`](Self::pause).
    pub fn resume(&self) -> io::Result<()> {
        self.process.signal(Signal::SIGCONT)
    }

    /// SIGKILL and reap. Does nothing if the member is not running.
    pub fn kill(&self) -> io::Result<()> {
        self.process.kill()
    }

    /// Kills the member if it runs, starts it again with its data dir (it
    /// rejoins the cluster) and waits until it is healthy, which needs a
    /// quorum of running members.
    pub fn restart(&self) -> io::Result<()> {
        self.process.kill()?;
        self.process.spawn()?;
        self.wait_healthy()
    }

    /// Whether the process is alive (a paused member is alive).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// `etcdctl endpoint health` against this member only: true when it
    /// answers and the cluster has a leader and a quorum.
    pub fn is_healthy(&self) -> bool {
        self.etcdctl(&["endpoint", "health"]).is_ok()
    }

    /// Whether this member says it is the leader.
    pub fn is_leader(&self) -> bool {
        let Ok(out) = self.etcdctl(&["endpoint", "status", "-w", "json"]) else {
            return false;
        };
        // One object: {"Endpoint":..,"Status":{"header":{..,"member_id":N,..},..,"leader":N,..}}
        match (json_u64(&out, "member_id"), json_u64(&out, "leader")) {
            (Some(me), Some(leader)) => me == leader,
            _ => false,
        }
    }

    /// Runs `etcdctl` (v3 API) against this member only.
    pub fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        run_client(
            etcdctl_command(
                &self.etcdctl,
                &self.endpoint(),
                self.client_ca.as_deref(),
                self.client_cert.as_ref(),
                "2s",
            )
            .args(args),
        )
    }

    /// How many calls of the gRPC `method` (`"Watch"`, `"LeaseKeepAlive"`,
    /// `"Range"`...) this member has started since it started, from its
    /// Prometheus metrics: what a test counts to show how many requests
    /// the client sent. Plain HTTP, so not for a TLS cluster.
    pub fn grpc_calls_started(&self, method: &str) -> io::Result<u64> {
        let body = self.metrics()?;
        let wanted = format!("grpc_method=\"{method}\"");
        // No line at all until the first such call.
        Ok(body
            .lines()
            .find(|l| l.starts_with("grpc_server_started_total{") && l.contains(&wanted))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .map_or(0, |n| n as u64))
    }

    /// The value of the unlabelled counter `name` (`"etcd_mvcc_put_total"`,
    /// `"etcd_mvcc_range_total"`...) in this member's Prometheus metrics; 0
    /// before it first counts. Plain HTTP, so not for a TLS cluster.
    pub fn counter(&self, name: &str) -> io::Result<u64> {
        let body = self.metrics()?;
        Ok(body
            .lines()
            .find(|l| l.split(' ').next() == Some(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .map_or(0, |n| n as u64))
    }

    fn metrics(&self) -> io::Result<String> {
        let address = format!("127.0.0.1:{}", self.client_port());
        crate::http::get_blocking(&address, "/metrics")
    }

    fn wait_healthy(&self) -> io::Result<()> {
        self.process.wait_ready("healthy", || self.is_healthy())
    }
}

/// `etcdctl` against `endpoints`, trusting `ca` when the members serve TLS
/// and presenting `cert` (certificate, key) when they ask for one.
fn etcdctl_command(
    etcdctl: &PathBuf,
    endpoints: &str,
    ca: Option<&Path>,
    cert: Option<&(PathBuf, PathBuf)>,
    command_timeout: &str,
) -> Command {
    let mut cmd = Command::new(etcdctl);
    cmd.env("ETCDCTL_API", "3").args([
        format!("--endpoints={endpoints}"),
        "--dial-timeout=1s".to_string(),
        format!("--command-timeout={command_timeout}"),
    ]);
    if let Some(ca) = ca {
        cmd.arg(format!("--cacert={}", ca.display()));
    }
    if let Some((cert, key)) = cert {
        cmd.arg(format!("--cert={}", cert.display()))
            .arg(format!("--key={}", key.display()));
    }
    cmd
}

/// The unsigned number after `"key":` in `json` (first occurrence): enough
/// for etcdctl's flat status output without a JSON dependency.
fn json_u64(json: &str, key: &str) -> Option<u64> {
    let needle = format!("\"{key}\":");
    let rest = json[json.find(&needle)? + needle.len()..].trim_start();
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::json_u64;

    #[test]
    fn json_u64_reads_numbers_and_quoted_numbers() {
        let out = r#"[{"Endpoint":"127.0.0.1:1","Status":{"header":{"cluster_id":1,"member_id":5918418463437342279,"revision":1},"leader": 5918418463437342279,"raftTerm":"2"}}]"#;
        assert_eq!(json_u64(out, "member_id"), Some(5918418463437342279));
        assert_eq!(json_u64(out, "leader"), Some(5918418463437342279));
        assert_eq!(json_u64(out, "raftTerm"), Some(2));
        assert_eq!(json_u64(out, "missing"), None);
    }
}
