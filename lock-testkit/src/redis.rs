//! Redis: one server ([`RedisServer`]) or N independent masters ([`RedisNodes`]).

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::process::{Process, Spec, find_binary, free_port, retry_addr_in_use, run_client};

/// How to start a [`RedisServer`].
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// `true`: append-only file with `appendfsync always`, so every
    /// acknowledged write survives a SIGKILL and [`RedisServer::restart`].
    /// `false` (the default): no persistence at all (`--save ""
    /// --appendonly no`), so a restart comes back empty.
    pub persistence: bool,
    /// More `redis-server` arguments, appended last (so they win), e.g.
    /// `["--maxmemory", "10mb"]`.
    pub extra_args: Vec<String>,
    /// Environment variables for the `redis-server` process, on top of the
    /// inherited ones (e.g. `LD_PRELOAD` and `FAKETIME_*` to run it under
    /// libfaketime). They apply to every restart too.
    pub env: Vec<(String, String)>,
    /// Serve TLS too, on a port of its own ([`RedisServer::tls_port`]);
    /// from [`TestCa::redis_tls`](crate::TestCa::redis_tls). The plain
    /// port stays, for [`RedisServer::cli`].
    pub tls: Option<RedisTls>,
    /// Run as a Redis Cluster node (`--cluster-enabled yes`), its cluster
    /// bus on a free port of its own (the default, the port + 10000, may
    /// not be free), over TLS when `tls` is set.
    pub cluster_node: bool,
    /// A program to run `redis-server` under, with its arguments (e.g.
    /// `["valgrind", "--tool=callgrind"]`): the server's path and arguments
    /// follow them. It runs in the server's directory
    /// ([`RedisServer::dir`]), and its PID is [`RedisServer::pid`].
    pub wrapper: Vec<String>,
}

/// How a [`RedisServer`] serves TLS: its certificate, the CA it trusts,
/// and whether it asks clients for a certificate.
#[derive(Debug, Clone)]
pub struct RedisTls {
    /// The server certificate (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// The CA whose client certificates (and cluster peers) it trusts.
    pub ca_file: PathBuf,
    /// Ask every client for a certificate (`tls-auth-clients yes`).
    pub client_certs: bool,
}

impl RedisTls {
    fn args(&self, port: u16) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--tls-port".into(), port.to_string().into()];
        for (flag, file) in [
            ("--tls-cert-file", &self.cert_file),
            ("--tls-key-file", &self.key_file),
            ("--tls-ca-cert-file", &self.ca_file),
        ] {
            args.extend([flag.into(), file.into()]);
        }
        let auth = if self.client_certs { "yes" } else { "no" };
        args.extend(["--tls-auth-clients".into(), auth.into()]);
        args
    }
}

/// A private `redis-server` on a free loopback port with its own temp dir.
///
/// Dropping it kills the process and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    tls_port: Option<u16>,
    process: Process,
    // Declared after `process` so the server is killed before its dir goes.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a Redis without persistence and waits until it answers PING.
    pub fn start() -> io::Result<RedisServer> {
        Self::start_with(RedisOptions::default())
    }

    /// Starts a Redis with `options` and waits until it answers PING.
    pub fn start_with(options: RedisOptions) -> io::Result<RedisServer> {
        let binary = find_binary("redis-server")?;
        // redis-cli is what tests use to talk to it: fail now, not later.
        find_binary("redis-cli")?;
        retry_addr_in_use(|| {
            let dir = tempfile::Builder::new()
                .prefix("lock-testkit-redis-")
                .tempdir()?;
            let port = free_port()?;
            let mut args: Vec<OsString> = ["--bind", "127.0.0.1", "--port", &port.to_string()]
                .iter()
                .map(OsString::from)
                .collect();
            args.extend(["--dir".into(), dir.path().into()]);
            let persistence: &[&str] = if options.persistence {
                &["--appendonly", "yes", "--appendfsync", "always"]
            } else {
                &["--appendonly", "no"]
            };
            for arg in ["--save", "", "--daemonize", "no", "--protected-mode", "no"]
                .iter()
                .chain(persistence)
            {
                args.push(arg.into());
            }
            // Every port is picked here, so a collision on any is retried.
            let tls_port = match &options.tls {
                Some(tls) => {
                    let port = free_port()?;
                    args.extend(tls.args(port));
                    Some(port)
                }
                None => None,
            };
            if options.cluster_node {
                let bus = free_port()?.to_string();
                for arg in [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                ] {
                    args.push(arg.into());
                }
                if options.tls.is_some() {
                    args.extend(["--tls-cluster".into(), "yes".into()]);
                }
            }
            args.extend(options.extra_args.iter().map(OsString::from));
            let program = match options.wrapper.split_first() {
                Some((wrapper, wrapper_args)) => {
                    let mut all: Vec<OsString> = wrapper_args.iter().map(OsString::from).collect();
                    all.push(binary.clone().into());
                    all.append(&mut args);
                    args = all;
                    find_binary(wrapper)?
                }
                None => binary.clone(),
            };
            let process = Process::new(Spec {
                name: format!("redis-server 127.0.0.1:{port}"),
                program,
                args,
                cwd: dir.path().to_path_buf(),
                log: dir.path().join("redis.log"),
                user: None,
                env: options.env.clone(),
            });
            let server = RedisServer {
                port,
                tls_port,
                process,
                dir,
            };
            server.process.spawn()?;
            server.wait_ready()?;
            Ok(server)
        })
    }

    fn wait_ready(&self) -> io::Result<()> {
        self.process.wait_ready("answering PING", || {
            self.ping(Duration::from_millis(500)).is_ok()
        })
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The TCP port; it stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port, when started with [`RedisOptions::tls`]; it too stays
    /// the same across restarts.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The server's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The server's working directory (where the AOF files live).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log file (appended to across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.process.spec.log.clone()
    }

    /// SIGSTOP: the server keeps its connections open but answers nothing
    /// until [`resume`](Self::resume).
    pub fn pause(&self) -> io::Result<()> {
        self.process.signal(Signal::SIGSTOP)
    }

    /// SIGCONT: undoes [`pause`](Self::pause).
    pub fn resume(&self) -> io::Result<()> {
        self.process.signal(Signal::SIGCONT)
    }

    /// SIGKILL and reap: a crash. Clients see their connections reset. Does
    /// nothing if the server is not running.
    pub fn kill(&self) -> io::Result<()> {
        self.process.kill()
    }

    /// Kills the server if it runs, starts it again on the same port with the
    /// same directory, and waits until it answers PING. With persistence the
    /// data survives; without it the server comes back empty.
    pub fn restart(&self) -> io::Result<()> {
        self.process.kill()?;
        self.process.spawn()?;
        self.wait_ready()
    }

    /// Whether the process is alive (a paused server is alive).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Sends PING on a new connection; fails if no `+PONG` came within
    /// `timeout` (kind `TimedOut` or `WouldBlock` for a paused server,
    /// `ConnectionRefused` for a dead one).
    pub fn ping(&self, timeout: Duration) -> io::Result<()> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut reply = [0u8; 64];
        let mut len = 0;
        while !reply[..len].ends_with(b"\r\n") && len < reply.len() {
            let n = stream.read(&mut reply[len..])?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            len += n;
        }
        if &reply[..len] == b"+PONG\r\n" {
            Ok(())
        } else {
            // E.g. "-LOADING Redis is loading the dataset in memory".
            Err(io::Error::other(format!(
                "PING answered {:?}",
                String::from_utf8_lossy(&reply[..len]).trim_end()
            )))
        }
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT ARGS...` and returns its output
    /// without the trailing newline (a nil reply is the empty string).
    pub fn cli(&self, args: &[&str]) -> io::Result<String> {
        run_client(
            Command::new(find_binary("redis-cli")?)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(args),
        )
    }

    /// How often the server ran `command` (lower case, e.g. `evalsha`;
    /// commands inside scripts count too) since it started or since
    /// `CONFIG RESETSTAT`, from `INFO commandstats`.
    pub fn command_calls(&self, command: &str) -> io::Result<u64> {
        let stats = self.cli(&["INFO", "commandstats"])?;
        let prefix = format!("cmdstat_{command}:calls=");
        Ok(stats
            .lines()
            .find_map(|l| l.trim().strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0))
    }
}

/// N independent Redis masters (for Redlock), each a [`RedisServer`].
#[derive(Debug)]
pub struct RedisNodes {
    nodes: Vec<RedisServer>,
}

impl RedisNodes {
    /// Starts `n` Redis servers without persistence.
    pub fn start(n: usize) -> io::Result<RedisNodes> {
        Self::start_with(n, RedisOptions::default())
    }

    /// Starts `n` Redis servers, all with `options`.
    pub fn start_with(n: usize, options: RedisOptions) -> io::Result<RedisNodes> {
        let nodes = (0..n)
            .map(|_| RedisServer::start_with(options.clone()))
            .collect::<io::Result<_>>()?;
        Ok(RedisNodes { nodes })
    }

    /// `redlock://127.0.0.1:P1,127.0.0.1:P2,...`
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(RedisServer::host_port).collect();
        format!("redlock://{}", nodes.join(","))
    }

    /// The `i`-th server. Panics if `i >= len()`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// All servers, in URL order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// How many servers there are.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}
