//! Private servers for one cell (lock-testkit), each behind a proxy of the
//! harness, and the fault actions on them.

use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use lock_testkit::{EtcdCluster, Postgres, RedisOptions, RedisSentinel, RedisServer};

use crate::faults::Backend;
use lock_testkit::{Net, Proxy};

/// The server processes.
#[derive(Debug)]
pub enum Servers {
    /// One Redis, or Redlock's independent masters.
    Redis(Vec<RedisServer>),
    /// An etcd cluster.
    Etcd(EtcdCluster),
    /// One PostgreSQL.
    Postgres(Box<Postgres>),
    /// A Redis Sentinel deployment. Its clients reach the servers the
    /// sentinels name, with no proxy between.
    Sentinel(Box<RedisSentinel>),
}

/// Servers, proxies in front of them, and the URL clients use.
#[derive(Debug)]
pub struct Deployment {
    /// The servers (shared with blocking tasks).
    pub servers: Arc<Servers>,
    proxies: Vec<Proxy>,
    /// The URL through the proxies.
    pub url: String,
    /// Per Redis server: the libfaketime timestamp file, if it runs under it.
    pub clock_files: Vec<PathBuf>,
    _clock_dir: Option<tempfile::TempDir>,
}

/// The libfaketime preload for a Redis server: glibc's malloc first (Redis
/// ships jemalloc, which libfaketime's own allocations must not meet), then
/// libfaketime. `None` when either library is missing.
pub fn faketime_preload() -> Option<String> {
    let faketime = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file())?;
    let ldconfig = Command::new("ldconfig").arg("-p").output().ok()?;
    let malloc = String::from_utf8_lossy(&ldconfig.stdout)
        .lines()
        .filter(|l| l.contains("libc_malloc_debug.so.0"))
        .find_map(|l| l.split("=>").nth(1).map(|p| p.trim().to_string()))?;
    Some(format!("{malloc} {faketime}"))
}

impl Deployment {
    /// Starts the servers for `backend` (blocking: run it off the runtime's
    /// workers) and their proxies.
    pub async fn start(backend: Backend, persistence: bool, faketime: bool) -> io::Result<Self> {
        let preload = if faketime {
            Some(faketime_preload().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "libfaketime or glibc's libc_malloc_debug.so.0 not installed",
                )
            })?)
        } else {
            None
        };
        let clock_dir = if faketime {
            Some(
                tempfile::Builder::new()
                    .prefix("lock-faults-clock-")
                    .tempdir()?,
            )
        } else {
            None
        };
        let nodes = match backend {
            Backend::Redis => 1,
            Backend::Redlock => 5,
            _ => 0,
        };
        let mut clock_files = Vec::new();
        let mut redis_options = Vec::new();
        for i in 0..nodes {
            let mut options = RedisOptions {
                persistence,
                ..Default::default()
            };
            if let (Some(preload), Some(dir)) = (&preload, &clock_dir) {
                let file = dir.path().join(format!("node-{i}"));
                std::fs::write(&file, "+0\n")?;
                options.env = vec![
                    ("LD_PRELOAD".into(), preload.clone()),
                    ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
                    ("FAKETIME_NO_CACHE".into(), "1".into()),
                ];
                clock_files.push(file);
            }
            redis_options.push(options);
        }
        let servers = tokio::task::spawn_blocking(move || -> io::Result<Servers> {
            Ok(match backend {
                Backend::Redis | Backend::Redlock => Servers::Redis(
                    redis_options
                        .into_iter()
                        .map(RedisServer::start_with)
                        .collect::<io::Result<_>>()?,
                ),
                Backend::Etcd => Servers::Etcd(EtcdCluster::start(3)?),
                Backend::Postgres => Servers::Postgres(Box::new(Postgres::start()?)),
                Backend::RedisSentinel | Backend::RedisSentinelWait => {
                    Servers::Sentinel(Box::new(RedisSentinel::start()?))
                }
            })
        })
        .await
        .map_err(io::Error::other)??;
        let ports: Vec<u16> = match &servers {
            Servers::Redis(nodes) => nodes.iter().map(RedisServer::port).collect(),
            Servers::Etcd(cluster) => cluster.members().iter().map(|m| m.client_port()).collect(),
            Servers::Postgres(pg) => vec![pg.port()],
            Servers::Sentinel(_) => Vec::new(),
        };
        let mut proxies = Vec::new();
        for port in ports {
            proxies.push(Proxy::start(port).await?);
        }
        let hosts: Vec<String> = proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port()))
            .collect();
        let sentinel_url = match &servers {
            Servers::Sentinel(s) => s.url(),
            _ => String::new(),
        };
        let url = match backend {
            Backend::RedisSentinel => format!("{sentinel_url}?timeout_ms=1000"),
            Backend::RedisSentinelWait => format!("{sentinel_url}?timeout_ms=1000&min_replicas=1"),
            Backend::Redis => format!("redis://{}?timeout_ms=1000", hosts[0]),
            Backend::Redlock => format!(
                "redlock://{}?connect_timeout_ms=1000&node_timeout_ms=200",
                hosts.join(",")
            ),
            Backend::Etcd => format!(
                "etcd://{}?connect_timeout_ms=1000&response_timeout_ms=1000",
                hosts.join(",")
            ),
            Backend::Postgres => format!(
                "postgres://postgres@{}/lockkit?connect_timeout_ms=1000&response_timeout_ms=1000",
                hosts[0]
            ),
        };
        Ok(Deployment {
            servers: Arc::new(servers),
            proxies,
            url,
            clock_files,
            _clock_dir: clock_dir,
        })
    }

    /// How many servers.
    pub fn len(&self) -> usize {
        self.proxies.len()
    }

    /// Sets the network condition on every proxy.
    pub fn set_net(&self, net: Net) {
        for proxy in &self.proxies {
            proxy.set(net);
        }
    }

    /// Runs `f` on the servers in a blocking task.
    pub async fn on_servers<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Servers) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let servers = self.servers.clone();
        tokio::task::spawn_blocking(move || f(&servers))
            .await
            .map_err(io::Error::other)?
    }
}

impl Servers {
    /// SIGKILL servers `which` (Redis nodes, etcd members, or PostgreSQL).
    pub fn kill(&self, which: &[usize]) -> io::Result<()> {
        match self {
            Servers::Redis(nodes) => which.iter().try_for_each(|&i| nodes[i].kill()),
            Servers::Etcd(cluster) => which.iter().try_for_each(|&i| cluster.member(i).kill()),
            Servers::Postgres(pg) => pg.kill(),
            Servers::Sentinel(_) => Err(not_here()),
        }
    }

    /// Starts servers `which` again and waits until they answer.
    pub fn restart(&self, which: &[usize]) -> io::Result<()> {
        match self {
            Servers::Redis(nodes) => which.iter().try_for_each(|&i| nodes[i].restart()),
            Servers::Etcd(cluster) => which.iter().try_for_each(|&i| cluster.member(i).restart()),
            Servers::Postgres(pg) => pg.restart(),
            Servers::Sentinel(_) => Err(not_here()),
        }
    }

    /// SIGSTOP servers `which`.
    pub fn pause(&self, which: &[usize]) -> io::Result<()> {
        match self {
            Servers::Redis(nodes) => which.iter().try_for_each(|&i| nodes[i].pause()),
            Servers::Etcd(cluster) => which.iter().try_for_each(|&i| cluster.member(i).pause()),
            Servers::Postgres(pg) => pg.pause(),
            Servers::Sentinel(_) => Err(not_here()),
        }
    }

    /// SIGCONT servers `which`.
    pub fn resume(&self, which: &[usize]) -> io::Result<()> {
        match self {
            Servers::Redis(nodes) => which.iter().try_for_each(|&i| nodes[i].resume()),
            Servers::Etcd(cluster) => which.iter().try_for_each(|&i| cluster.member(i).resume()),
            Servers::Postgres(pg) => pg.resume(),
            Servers::Sentinel(_) => Err(not_here()),
        }
    }

    /// Seconds of Redis node `i`'s wall clock (`TIME`).
    pub fn redis_time(&self, i: usize) -> io::Result<u64> {
        let Servers::Redis(nodes) = self else {
            return Err(io::Error::other("not a Redis deployment"));
        };
        let out = nodes[i].cli(&["TIME"])?;
        out.lines()
            .next()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("TIME answered {out:?}")))
    }
}

/// A Sentinel deployment takes only its own fault (see [`Action::Failover`](crate::faults::Action::Failover)).
fn not_here() -> io::Error {
    io::Error::other("a Sentinel deployment's servers are struck by the failover fault only")
}
