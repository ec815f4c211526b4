//! PostgreSQL: a private cluster, initdb'ed into a temp dir.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::signal::{self, Signal};
use nix::unistd::{Pid, Uid, User};
use tempfile::TempDir;

use crate::process::{Process, Spec, find_binary, free_port, retry_addr_in_use, run_client};

/// A private PostgreSQL server on a free loopback port, with a `lockkit`
/// database and trust authentication for the `postgres` role.
///
/// When the tests run as root, initdb and the server run as the `postgres`
/// user (PostgreSQL refuses to run as root) and the temp dir is handed to
/// that user. Dropping it kills the server and removes the directory.
#[derive(Debug)]
pub struct Postgres {
    port: u16,
    bin: Binaries,
    process: Process,
    // Declared last so the server is killed before its dir goes.
    dir: TempDir,
}

#[derive(Debug)]
struct Binaries {
    psql: PathBuf,
    pg_isready: PathBuf,
}

impl Postgres {
    /// Runs initdb, starts the server, waits until `pg_isready` answers and
    /// creates the `lockkit` database.
    pub fn start() -> io::Result<Postgres> {
        Self::start_with(None)
    }

    /// As [`start`](Self::start), with the server also accepting TLS
    /// (`ssl=on`) with the server certificate of `ca`.
    pub fn start_tls(ca: &crate::TestCa) -> io::Result<Postgres> {
        Self::start_with(Some((ca, false)))
    }

    /// As [`start_tls`](Self::start_tls), with the server also asking TCP
    /// clients over TLS for a certificate signed by `ca`
    /// (`clientcert=verify-ca`): [`TestCa::client_cert_file`] is one.
    /// Connections without TLS are still let in, for the testkit's own psql.
    ///
    /// [`TestCa::client_cert_file`]: crate::TestCa::client_cert_file
    pub fn start_mtls(ca: &crate::TestCa) -> io::Result<Postgres> {
        Self::start_with(Some((ca, true)))
    }

    /// `tls`: the CA whose server certificate to serve, and whether to ask
    /// clients for a certificate too.
    fn start_with(tls: Option<(&crate::TestCa, bool)>) -> io::Result<Postgres> {
        let initdb = find_binary("initdb")?;
        let postgres = find_binary("postgres")?;
        let bin = Binaries {
            psql: find_binary("psql")?,
            pg_isready: find_binary("pg_isready")?,
        };
        let user = server_user()?;
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-pg-")
            .tempdir()?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        let data = dir.path().join("data");

        let mut cmd = Command::new(&initdb);
        cmd.arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .current_dir(dir.path());
        if let Some((uid, gid)) = user {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        run_client(&mut cmd)?;
        // The server reads its key only if it owns it and no one else can.
        let mut tls_settings = Vec::new();
        if let Some((ca, client_certs)) = tls {
            let mut files = vec![
                ("server.crt", ca.server_cert_file()),
                ("server.key", ca.server_key_file()),
            ];
            if client_certs {
                files.push(("ca.crt", ca.ca_file()));
            }
            for (name, from) in files {
                let to = dir.path().join(name);
                std::fs::copy(from, &to)?;
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))?;
                if let Some((uid, gid)) = user {
                    std::os::unix::fs::chown(&to, Some(uid), Some(gid))?;
                }
            }
            tls_settings = vec![
                "ssl=on".to_string(),
                format!("ssl_cert_file={}", dir.path().join("server.crt").display()),
                format!("ssl_key_file={}", dir.path().join("server.key").display()),
            ];
            if client_certs {
                tls_settings.push(format!(
                    "ssl_ca_file={}",
                    dir.path().join("ca.crt").display()
                ));
                // First match wins: TLS connections need a certificate.
                let hba = "hostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n\
                           hostnossl all all 127.0.0.1/32 trust\n\
                           local all all trust\n";
                let path = data.join("pg_hba.conf");
                std::fs::write(&path, hba)?;
                if let Some((uid, gid)) = user {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
                }
            }
        }

        let (port, process) = retry_addr_in_use(|| {
            let port = free_port()?;
            let mut args: Vec<OsString> = vec![
                "-D".into(),
                data.clone().into(),
                "-p".into(),
                port.to_string().into(),
            ];
            args.extend(["-k".into(), dir.path().into()]);
            for setting in [
                "listen_addresses=127.0.0.1",
                // Safe for these tests: a killed *process* loses nothing that
                // was written (the kernel still has it); only a machine crash
                // would, and tests do not crash the machine.
                "fsync=off",
            ]
            .into_iter()
            .chain(tls_settings.iter().map(String::as_str))
            {
                args.extend(["-c".into(), setting.into()]);
            }
            let process = Process::new(Spec {
                name: format!("postgres 127.0.0.1:{port}"),
                program: postgres.clone(),
                args,
                cwd: dir.path().to_path_buf(),
                log: dir.path().join("postgres.log"),
                user,
                env: Vec::new(),
            });
            process.spawn()?;
            process.wait_ready("accepting connections", || {
                pg_isready(&bin.pg_isready, port)
            })?;
            Ok((port, process))
        })?;
        let server = Postgres {
            port,
            bin,
            process,
            dir,
        };
        server.psql_db("postgres", "CREATE DATABASE lockkit")?;
        Ok(server)
    }

    /// `postgres://postgres@127.0.0.1:PORT/lockkit`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/lockkit", self.port)
    }

    /// The TCP port; it stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The directory holding the data dir (`data/`), the socket and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log file (appended to across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.process.spec.log.clone()
    }

    /// Runs `sql` with psql in the `lockkit` database and returns the rows,
    /// unaligned and without headers (`-A -t`: columns separated by `|`,
    /// one row per line). Stops at the first error, which is returned.
    pub fn psql(&self, sql: &str) -> io::Result<String> {
        self.psql_db("lockkit", sql)
    }

    fn psql_db(&self, db: &str, sql: &str) -> io::Result<String> {
        run_client(
            Command::new(&self.bin.psql)
                .args([
                    "-X",
                    "-q",
                    "-A",
                    "-t",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                ])
                .args(["-p", &self.port.to_string(), "-d", db, "-c", sql])
                // Plain TCP: a server asking TLS clients for a certificate
                // (`start_mtls`) lets this one in without.
                .env("PGSSLMODE", "disable"),
        )
    }

    /// A crash: SIGKILL to the postmaster and every backend, so every client
    /// connection is reset at once (killing only the postmaster would leave
    /// the backends serving their clients for a while). Does nothing if the
    /// server is not running.
    pub fn kill(&self) -> io::Result<()> {
        let mut children = Vec::new();
        if let Some(pid) = self.process.pid() {
            // Stopped first, so it cannot fork a new child while we look.
            let _ = signal::kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
            children = children_of(pid);
            for &child in &children {
                let _ = signal::kill(Pid::from_raw(child), Signal::SIGKILL);
            }
        }
        self.process.kill()?;
        // A backend still exiting keeps the shared memory attached, and a
        // restart then refuses to start ("pre-existing shared memory block
        // is still in use"). Nothing signals their end to us (they are not
        // our children), so look until each has exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while children.iter().any(|&child| !has_exited(child)) {
            if std::time::Instant::now() > deadline {
                return Err(io::Error::other(
                    "postgres backends still running 10 s after SIGKILL",
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }

    /// SIGSTOP to the postmaster and every backend: the server keeps its
    /// connections open but answers nothing until [`resume`](Self::resume).
    pub fn pause(&self) -> io::Result<()> {
        let pid = self
            .process
            .pid()
            .ok_or_else(|| io::Error::other("postgres is not running"))?;
        // The postmaster first, so it cannot fork a new backend meanwhile.
        signal::kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).map_err(io::Error::from)?;
        for child in children_of(pid) {
            let _ = signal::kill(Pid::from_raw(child), Signal::SIGSTOP);
        }
        Ok(())
    }

    /// SIGCONT to every backend and the postmaster: undoes [`pause`](Self::pause).
    pub fn resume(&self) -> io::Result<()> {
        let pid = self
            .process
            .pid()
            .ok_or_else(|| io::Error::other("postgres is not running"))?;
        for child in children_of(pid) {
            let _ = signal::kill(Pid::from_raw(child), Signal::SIGCONT);
        }
        signal::kill(Pid::from_raw(pid as i32), Signal::SIGCONT).map_err(io::Error::from)
    }

    /// Kills the server if it runs (see [`kill`](Self::kill)), starts it
    /// again on the same port with the same data dir (it runs crash recovery;
    /// committed data survives) and waits until it accepts connections.
    pub fn restart(&self) -> io::Result<()> {
        self.kill()?;
        self.process.spawn()?;
        self.process.wait_ready("accepting connections", || {
            pg_isready(&self.bin.pg_isready, self.port)
        })
    }

    /// Whether the postmaster is alive.
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

fn pg_isready(binary: &Path, port: u16) -> bool {
    Command::new(binary)
        .args([
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-t",
            "1",
        ])
        .args(["-p", &port.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Who runs initdb and the server: the `postgres` user when we are root
/// (PostgreSQL refuses to run as root), ourselves otherwise.
fn server_user() -> io::Result<Option<(u32, u32)>> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    match User::from_name("postgres").map_err(io::Error::from)? {
        Some(user) => Ok(Some((user.uid.as_raw(), user.gid.as_raw()))),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            "lock-testkit: running as root but there is no `postgres` user to run PostgreSQL as \
             (it refuses to run as root); `scripts/servers.sh up` installs postgresql, which creates it",
        )),
    }
}

/// PIDs whose parent is `pid`, from /proc.
/// Gone, or a zombie (it has released its memory; only its exit status is left).
fn has_exited(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // "PID (comm) STATE ...": comm may contain spaces and ')'.
    stat.rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next())
        .is_none_or(|state| state == "Z" || state == "X")
}

fn children_of(pid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let child: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // "PID (comm) STATE PPID ...": comm may contain spaces and ')'.
            let after_comm = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after_comm.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}
