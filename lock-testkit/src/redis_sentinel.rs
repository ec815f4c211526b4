//! A Redis Sentinel deployment: a master, a replica, three sentinels.

use std::ffi::OsString;
use std::io;
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::process::{Process, Spec, find_binary, free_port, retry_addr_in_use, run_client};
use crate::{RedisOptions, RedisServer};

/// The name the sentinels monitor the master by.
pub const SENTINEL_MASTER: &str = "mymaster";

/// How long the deployment may take to form, or a failover to finish.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A private Redis Sentinel deployment on free loopback ports: two Redis
/// servers (the first starts as master, the second as its replica) and
/// three sentinels that monitor them with a quorum of two, declaring the
/// master down after 1 s without an answer.
///
/// Dropping it kills every process and removes their directories.
#[derive(Debug)]
pub struct RedisSentinel {
    // Declared first so the sentinels stop before the servers they watch.
    sentinels: Vec<Sentinel>,
    servers: [RedisServer; 2],
}

#[derive(Debug)]
struct Sentinel {
    port: u16,
    process: Process,
    _dir: TempDir,
}

impl RedisSentinel {
    /// Starts the servers and the sentinels, and waits until the replica
    /// is in sync and every sentinel knows the replica and the two other
    /// sentinels (before that, a failover has no one to promote or to
    /// vote).
    pub fn start() -> io::Result<RedisSentinel> {
        Self::start_with(RedisOptions::default())
    }

    /// Like [`start`](Self::start), both servers with `options`.
    pub fn start_with(options: RedisOptions) -> io::Result<RedisSentinel> {
        let master = RedisServer::start_with(options.clone())?;
        let mut replica_options = options;
        replica_options.extra_args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            master.port().to_string(),
        ]);
        let replica = RedisServer::start_with(replica_options)?;
        let sentinels = (0..3)
            .map(|_| Sentinel::start(master.port()))
            .collect::<io::Result<Vec<_>>>()?;
        let deployment = RedisSentinel {
            servers: [master, replica],
            sentinels,
        };
        deployment.wait_until("the replica is in sync", |d| {
            d.servers[1]
                .cli(&["INFO", "replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        })?;
        deployment.wait_until("every sentinel knows the replica and the others", |d| {
            d.sentinels.iter().all(|s| {
                s.cli(&["SENTINEL", "master", SENTINEL_MASTER])
                    .is_ok_and(|m| {
                        field(&m, "num-slaves") == Some("1")
                            && field(&m, "num-other-sentinels") == Some("2")
                    })
            })
        })?;
        Ok(deployment)
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/mymaster`
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", sentinels.join(","))
    }

    /// The server the first sentinel names the master now.
    pub fn master(&self) -> io::Result<&RedisServer> {
        let port = self.master_port()?;
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .ok_or_else(|| io::Error::other(format!("the sentinels name port {port}, not ours")))
    }

    /// The server that is not [`master`](Self::master).
    pub fn replica(&self) -> io::Result<&RedisServer> {
        let port = self.master_port()?;
        Ok(self
            .servers
            .iter()
            .find(|s| s.port() != port)
            .expect("two servers"))
    }

    /// Both servers, in start order (the first started as master).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The master's port, as the first sentinel that answers names it.
    pub fn master_port(&self) -> io::Result<u16> {
        let mut last = io::Error::other("no sentinel");
        for sentinel in &self.sentinels {
            match sentinel.cli(&["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER]) {
                Ok(reply) => match reply.lines().nth(1).and_then(|p| p.trim().parse().ok()) {
                    Some(port) => return Ok(port),
                    None => last = io::Error::other(format!("odd reply {reply:?}")),
                },
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Runs `SENTINEL FAILOVER mymaster` and waits until every sentinel
    /// names the other server, and that server says (`ROLE`) it is the
    /// master. Returns the new master's port.
    pub fn failover(&self) -> io::Result<u16> {
        let old = self.master_port()?;
        self.sentinels[0].cli(&["SENTINEL", "FAILOVER", SENTINEL_MASTER])?;
        self.wait_promoted(old)
    }

    /// Sends `SENTINEL FAILOVER mymaster` until a sentinel takes it (it
    /// refuses while it finds no replica fit to promote, e.g. one that was
    /// paused a moment ago), without waiting for the promotion.
    pub fn start_failover(&self) -> io::Result<()> {
        let mut last = String::new();
        let taken = |reply: &str| reply == "OK" || reply.contains("INPROG");
        self.wait_until("a sentinel starts the failover", |d| {
            match d.sentinels[0].cli(&["SENTINEL", "FAILOVER", SENTINEL_MASTER]) {
                Ok(reply) if taken(&reply) => true,
                Ok(reply) => {
                    last = reply;
                    false
                }
                Err(e) => {
                    last = e.to_string();
                    false
                }
            }
        })
        .map_err(|e| io::Error::new(e.kind(), format!("{e}; last answer: {last}")))
    }

    /// Waits until every sentinel names a master other than port `old`, and
    /// that server says (`ROLE`) it is the master (after a failover that
    /// something else started: a killed master, say). Returns its port.
    pub fn wait_promoted(&self, old: u16) -> io::Result<u16> {
        self.wait_until("the sentinels promote the replica", |d| {
            let Ok(port) = d.master_port() else {
                return false;
            };
            port != old
                && d.sentinels.iter().all(|s| {
                    s.cli(&["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER])
                        .is_ok_and(|r| r.lines().nth(1).map(str::trim) == Some(&port.to_string()))
                })
                && d.servers
                    .iter()
                    .find(|s| s.port() == port)
                    .and_then(|s| s.cli(&["ROLE"]).ok())
                    .is_some_and(|role| role.starts_with("master"))
        })?;
        self.master_port()
    }

    fn wait_until(&self, what: &str, mut ready: impl FnMut(&Self) -> bool) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !ready(self) {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "lock-testkit: Redis Sentinel: not so after {SETTLE_TIMEOUT:?}: {what}"
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Sentinel {
    fn start(master_port: u16) -> io::Result<Sentinel> {
        let binary = find_binary("redis-server")?;
        retry_addr_in_use(|| {
            let dir = tempfile::Builder::new()
                .prefix("lock-testkit-sentinel-")
                .tempdir()?;
            let port = free_port()?;
            // A sentinel rewrites its config file: one per sentinel.
            let config = dir.path().join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 10000\n\
                     sentinel parallel-syncs {SENTINEL_MASTER} 1\n"
                ),
            )?;
            let mut args: Vec<OsString> = vec![config.into(), "--sentinel".into()];
            for arg in [
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--protected-mode",
                "no",
                "--daemonize",
                "no",
            ] {
                args.push(arg.into());
            }
            args.extend(["--dir".into(), dir.path().into()]);
            let process = Process::new(Spec {
                name: format!("redis-sentinel 127.0.0.1:{port}"),
                program: binary.clone(),
                args,
                cwd: dir.path().to_path_buf(),
                log: dir.path().join("sentinel.log"),
                user: None,
                env: Vec::new(),
            });
            process.spawn()?;
            let sentinel = Sentinel {
                port,
                process,
                _dir: dir,
            };
            sentinel.process.wait_ready("answering PING", || {
                sentinel.cli(&["PING"]).is_ok_and(|r| r == "PONG")
            })?;
            Ok(sentinel)
        })
    }

    fn cli(&self, args: &[&str]) -> io::Result<String> {
        run_client(
            Command::new(find_binary("redis-cli")?)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(args),
        )
    }
}

/// The value after `name` in redis-cli's one-item-a-line output of a map.
fn field<'a>(reply: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = reply.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line == name {
            return lines.next();
        }
    }
    None
}
