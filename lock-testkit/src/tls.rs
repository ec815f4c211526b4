//! A throwaway certificate authority for TLS tests: a CA, a server
//! certificate for `127.0.0.1` (and `localhost`) and a client certificate,
//! made with the `openssl` command line tool in a temp dir that goes with
//! the value.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::process::find_binary;
use crate::redis::RedisTls;

/// An openssl step's file arguments: (flag, path).
type Files<'a> = Vec<(&'a str, PathBuf)>;

/// A CA and the server and client certificates (and keys) it signed.
#[derive(Debug)]
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    /// Makes a new CA (EC P-256, valid for a day), a server certificate for
    /// `IP:127.0.0.1` and `DNS:localhost`, and a client certificate.
    pub fn generate() -> io::Result<TestCa> {
        let openssl = find_binary("openssl")?;
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-ca-")
            .tempdir()?;
        let path = |name: &str| dir.path().join(name);
        std::fs::write(
            path("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )?;
        std::fs::write(
            path("client.ext"),
            "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        )?;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        // The CA signs itself; then, for the server and the client, a key
        // and request, and the CA's signature on it with the extensions.
        let mut steps: Vec<(Vec<&str>, Files)> = vec![(
            [
                &["req", "-x509"][..],
                &ec,
                &["-days", "1", "-subj", "/CN=lockkit test CA"],
            ]
            .concat(),
            vec![("-keyout", path("ca.key")), ("-out", path("ca.crt"))],
        )];
        for (name, subject) in [
            ("server", "/CN=127.0.0.1"),
            ("client", "/CN=lockkit test client"),
        ] {
            let file = |ext: &str| path(&format!("{name}.{ext}"));
            steps.push((
                [&["req"][..], &ec, &["-subj", subject]].concat(),
                vec![("-keyout", file("key")), ("-out", file("csr"))],
            ));
            steps.push((
                vec!["x509", "-req", "-days", "1", "-CAcreateserial"],
                vec![
                    ("-in", file("csr")),
                    ("-CA", path("ca.crt")),
                    ("-CAkey", path("ca.key")),
                    ("-extfile", file("ext")),
                    ("-out", file("crt")),
                ],
            ));
        }
        for (args, files) in &steps {
            let mut cmd = Command::new(&openssl);
            cmd.args(args).current_dir(dir.path());
            for (flag, file) in files {
                cmd.arg(flag).arg(file);
            }
            let out = cmd.output()?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "openssl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
        }
        Ok(TestCa { dir })
    }

    /// The CA's certificate (PEM): what a client trusts.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server certificate (PEM), for `127.0.0.1` and `localhost`.
    pub fn server_cert_file(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server certificate's private key (PEM).
    pub fn server_key_file(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The client certificate (PEM), for servers that ask for one.
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.path().join("client.crt")
    }

    /// The client certificate's private key (PEM).
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// The folder with `ca.crt`, `server.crt` and `server.key`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// TLS for a [`RedisServer`](crate::RedisServer) with this CA's server
    /// certificate, asking clients for none.
    pub fn redis_tls(&self) -> RedisTls {
        self.redis_tls_with(false)
    }

    /// As [`redis_tls`](Self::redis_tls), with the server asking every
    /// client for a certificate signed by this CA (`tls-auth-clients yes`):
    /// [`client_cert_file`](Self::client_cert_file) is one.
    pub fn redis_mtls(&self) -> RedisTls {
        self.redis_tls_with(true)
    }

    fn redis_tls_with(&self, client_certs: bool) -> RedisTls {
        RedisTls {
            cert_file: self.server_cert_file(),
            key_file: self.server_key_file(),
            ca_file: self.ca_file(),
            client_certs,
        }
    }
}

/// What every TLS test checks once connected: a lock is granted, refused to
/// a second acquire while held, and granted again after its release with a
/// higher fencing token. Panics, naming the step, otherwise.
pub async fn lock_round_trip(locker: &lock_core::Locker, key: &str) {
    let ttl = std::time::Duration::from_secs(10);
    let first = locker.try_acquire(key, ttl).await.expect("acquire");
    let refused = locker
        .try_acquire(key, ttl)
        .await
        .expect_err("a held lock is refused");
    assert!(
        matches!(refused, lock_core::Error::Contended { .. }),
        "{refused}"
    );
    let token = first.fencing_token();
    locker.release(first).await.expect("release");
    let second = locker.try_acquire(key, ttl).await.expect("acquire again");
    assert!(second.fencing_token() > token, "the token moves on");
    locker.release(second).await.expect("release again");
}
