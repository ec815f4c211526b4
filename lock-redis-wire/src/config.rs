//! Connection settings from a backend URL.
//!
//! `scheme://[user[:password]@]host[:port][,host[:port]...][/db][?options]`
//!
//! | option | meaning | default |
//! |---|---|---|
//! | `/db` (path) | database number (single server only) | `0` |
//! | `connect_timeout_ms` | how long to wait for a connection | 3000 |
//! | `response_timeout_ms` | how long to wait for each reply (for a backend that lists [`RESPONSE_TIMEOUT`]) | 3000 |
//! | `timeout_ms` | sets both timeouts | |
//! | `prefix` | key prefix (see [`KeyLayout`]) | `lockkit:` |
//! | `ca_file` | with TLS: the PEM file of the CA(s) to trust instead of the system's | system roots |
//! | `cert_file`, `key_file` | with TLS: PEM files of a client certificate and its key, for servers that ask for one (`tls-auth-clients yes`); both | none |
//!
//! User and password are Redis ACL credentials (`AUTH user password`; only
//! a password: the `default` user). They are never printed.
//!
//! TLS (`rediss://`, or `tls=true` for Redlock's nodes) needs this crate's
//! `tls` cargo feature (rustls); without it such a URL is refused, naming
//! the feature.

use std::time::Duration;

use lock_core::url::{Server, ServerUrl};
use lock_core::{Error, Result};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::KeyLayout;

/// The port used when a server names none.
pub const DEFAULT_PORT: u16 = 6379;

/// The query options every Redis backend understands.
pub const OPTIONS: &[&str] = &[
    "connect_timeout_ms",
    "timeout_ms",
    "prefix",
    "ca_file",
    "cert_file",
    "key_file",
];

/// The query option for [`Timeouts::response`]: a backend that bounds its
/// replies by this one timeout lists it among its own options (Redlock
/// bounds each node's by a per-node timeout instead, and does not).
pub const RESPONSE_TIMEOUT: &str = "response_timeout_ms";

/// How long to wait for the server. A timeout too long for the clock to
/// count (`Duration::MAX`) waits as long as it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Opening a connection (TCP, TLS, `AUTH`, `SELECT`).
    pub connect: Duration,
    /// Each reply.
    pub response: Duration,
}

impl Timeouts {
    /// Refuses a timeout under 1 ms, naming it.
    pub fn check(&self) -> Result<()> {
        lock_core::raw::validate::timeout("connect_timeout_ms", self.connect)?;
        lock_core::raw::validate::timeout("response_timeout_ms", self.response)?;
        Ok(())
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(3),
            response: Duration::from_secs(3),
        }
    }
}

/// Everything needed to connect to one or more Redis servers, parsed from a URL.
///
/// `Debug` and every `endpoint` leave the password out.
#[derive(Clone)]
pub struct RedisSettings {
    /// One entry per server, in URL order, with credentials and database.
    pub servers: Vec<ConnectionInfo>,
    /// For errors and logs: `scheme://[user@]host:port` per server, in URL order.
    pub endpoints: Vec<String>,
    /// For errors and logs: `host:port` per server, in URL order, without
    /// user or password (`***` when the URL is
    /// [ambiguous](lock_core::url::is_ambiguous)).
    pub addresses: Vec<String>,
    /// The whole URL without password or query, for errors about all servers.
    pub url: String,
    /// Where locks live.
    pub layout: KeyLayout,
    /// Connect and response timeouts.
    pub timeouts: Timeouts,
    /// Whether connections use TLS.
    pub tls: bool,
    /// With TLS: the PEM of the CAs to trust (`ca_file`), instead of the
    /// system's roots. (Without the `tls` feature TLS URLs are refused, so
    /// it stays unread.)
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    ca_pem: Option<Vec<u8>>,
    /// With TLS: the PEM of a client certificate and of its key
    /// (`cert_file`, `key_file`). Never printed.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &self.url)
            .field("prefix", &self.layout.prefix())
            .field("timeouts", &self.timeouts)
            .field("tls", &self.tls)
            .finish()
    }
}

impl RedisSettings {
    /// Reads `url`. `tls` says whether the scheme asks for TLS; `backend_options`
    /// names query options the calling backend reads itself (any other
    /// option beyond [`OPTIONS`] is refused, so a typo is not ignored).
    pub fn from_url(url: &ServerUrl, tls: bool, backend_options: &[&str]) -> Result<Self> {
        url.refuse_unknown_options(&[OPTIONS, backend_options])?;
        let db = match url.path.as_str() {
            "" => 0,
            path => path
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| {
                    Error::invalid(
                        "url",
                        format!("{url}: the path must be a database number, got `/{path}`"),
                    )
                })?,
        };
        let mut timeouts = Timeouts::default();
        if let Some(both) = url.millis_param("timeout_ms")? {
            timeouts = Timeouts {
                connect: both,
                response: both,
            };
        }
        if let Some(connect) = url.millis_param("connect_timeout_ms")? {
            timeouts.connect = connect;
        }
        // Refused above unless the backend listed it.
        if let Some(response) = url.millis_param(RESPONSE_TIMEOUT)? {
            timeouts.response = response;
        }
        timeouts.check()?;
        if tls && !cfg!(feature = "tls") {
            return Err(Error::invalid(
                "url",
                format!(
                    "{url}: TLS needs the `tls` cargo feature (of lockkit, or of lock-redis / lock-redlock)"
                ),
            ));
        }
        let ca_pem = tls_file(url, tls, "ca_file")?;
        let client_pem = match url.client_cert_files()? {
            Some(_) => tls_file(url, tls, "cert_file")?.zip(tls_file(url, tls, "key_file")?),
            None => None,
        };
        let layout = match url.param("prefix") {
            Some(prefix) => KeyLayout::new(prefix)?,
            None => KeyLayout::default(),
        };
        let servers = url
            .servers
            .iter()
            .map(|s| connection_info(&url.scheme, s, db, tls))
            .collect::<Result<_>>()?;
        let endpoints: Vec<String> = url
            .servers
            .iter()
            .map(|s| s.endpoint(&url.scheme, DEFAULT_PORT))
            .collect();
        // An ambiguous URL's endpoints are `scheme://***`, its servers not shown.
        let addresses = (url.servers.iter().zip(&endpoints))
            .map(|(s, endpoint)| match endpoint.ends_with("://***") {
                true => "***".to_owned(),
                false => s.address(DEFAULT_PORT),
            })
            .collect();
        Ok(RedisSettings {
            servers,
            endpoints,
            addresses,
            url: url.to_string(),
            layout,
            timeouts,
            tls,
            ca_pem,
            client_pem,
        })
    }

    /// Parses `url` and reads it with [`from_url`](Self::from_url).
    pub fn parse(url: &str, tls: bool, backend_options: &[&str]) -> Result<Self> {
        Self::from_url(&ServerUrl::parse(url)?, tls, backend_options)
    }

    /// The database number (the same for every server).
    pub fn db(&self) -> i64 {
        self.servers.first().map_or(0, |s| s.redis_settings().db())
    }

    /// A client for server number `index`.
    pub fn client(&self, index: usize) -> Result<redis::Client> {
        self.client_for(self.servers[index].clone())
            .map_err(|e| crate::map_error("redis", &self.endpoints[index], e))
    }

    /// A client for `info` (one of [`servers`](Self::servers), perhaps
    /// with other settings), trusting the URL's `ca_file` when it names one.
    pub fn client_for(&self, info: ConnectionInfo) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(certs) = self.tls_certificates() {
            return redis::Client::build_with_tls(info, certs);
        }
        redis::Client::open(info)
    }

    /// The CAs of the URL's `ca_file` to trust and its client certificate
    /// (`cert_file`, `key_file`), as the redis crate takes them, if it names
    /// either (without a `ca_file`, TLS trusts the system's roots).
    #[cfg(feature = "tls")]
    pub fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        if self.ca_pem.is_none() && self.client_pem.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .client_pem
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca_pem.clone(),
        })
    }

    /// The address of another server `host:port` of the same deployment
    /// (a cluster node learned from the cluster), over TLS when the URL's
    /// servers are.
    pub fn addr_of(&self, host: String, port: u16) -> ConnectionAddr {
        if self.tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        }
    }
}

/// The contents of the file the URL's TLS `option` (`ca_file`, `cert_file`,
/// `key_file`) names, if it names one: refused without TLS, or when it
/// cannot be read, naming the option.
fn tls_file(url: &ServerUrl, tls: bool, option: &'static str) -> Result<Option<Vec<u8>>> {
    match url.param(option) {
        None => Ok(None),
        Some(_) if !tls => Err(Error::invalid(
            option,
            format!("{url}: `{option}` applies to TLS connections only (rediss://, or tls=true)"),
        )),
        Some(path) => lock_core::url::read_option_file(option, path).map(Some),
    }
}

fn connection_info(scheme: &str, server: &Server, db: i64, tls: bool) -> Result<ConnectionInfo> {
    let port = server.port.unwrap_or(DEFAULT_PORT);
    let addr = if tls {
        ConnectionAddr::TcpTls {
            host: server.host.clone(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(server.host.clone(), port)
    };
    let mut redis = RedisConnectionInfo::default().set_db(db);
    if let Some(user) = &server.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &server.password {
        redis = redis.set_password(password.expose());
    }
    let info = addr.into_connection_info().map_err(|e| {
        Error::invalid(
            "url",
            format!("{}: {e}", server.endpoint(scheme, DEFAULT_PORT)),
        )
    })?;
    Ok(info.set_redis_settings(redis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_credentials_db_timeouts_and_prefix() {
        let s = RedisSettings::parse(
            "redis://app:hunter2@10.0.0.1:7000/3?timeout_ms=50&response_timeout_ms=70&prefix=jobs:",
            false,
            &[RESPONSE_TIMEOUT],
        )
        .unwrap();
        assert_eq!(s.db(), 3);
        assert_eq!(
            s.timeouts,
            Timeouts {
                connect: Duration::from_millis(50),
                response: Duration::from_millis(70)
            }
        );
        assert_eq!(s.layout.prefix(), "jobs:");
        assert_eq!(s.endpoints, ["redis://app@10.0.0.1:7000"]);
        assert_eq!(s.addresses, ["10.0.0.1:7000"]);
        assert_eq!(s.servers[0].redis_settings().username(), Some("app"));
        assert_eq!(s.servers[0].redis_settings().password(), Some("hunter2"));
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn the_response_timeout_is_read_only_for_a_backend_that_lists_it() {
        let url = "redlock://a?response_timeout_ms=70";
        let err = RedisSettings::parse(url, false, &["node_timeout_ms"]).unwrap_err();
        let text = err.to_string();
        let (_, known) = text.split_once("; known: ").expect("the known options");
        assert!(
            text.contains("unknown option `response_timeout_ms`"),
            "{err}"
        );
        assert!(!known.contains("response_timeout_ms"), "{err}");
    }

    #[test]
    fn several_servers_and_defaults() {
        let s = RedisSettings::parse("redlock://:pw@a,b:7001,c", false, &["quorum"]).unwrap();
        assert_eq!(
            s.endpoints,
            ["redlock://a:6379", "redlock://b:7001", "redlock://c:6379"]
        );
        assert_eq!(s.addresses, ["a:6379", "b:7001", "c:6379"]);
        assert_eq!(s.servers[2].redis_settings().password(), Some("pw"));
        let ambiguous = RedisSettings::parse("redlock://a,b?prefix=x@y:", false, &[]).unwrap();
        assert_eq!(ambiguous.addresses, ["***", "***"]);
        assert_eq!(s.timeouts, Timeouts::default());
        assert_eq!(s.layout, KeyLayout::default());
    }

    #[test]
    fn tls_needs_the_feature_and_ca_file_needs_tls() {
        let tls = RedisSettings::parse("rediss://h", true, &[]);
        if cfg!(feature = "tls") {
            assert!(tls.unwrap().tls);
        } else {
            let err = tls.unwrap_err();
            assert!(err.to_string().contains("`tls` cargo feature"), "{err}");
        }
        for option in ["ca_file", "cert_file", "key_file"] {
            let url = format!("redis://h?{option}=/etc/hostname");
            let err = RedisSettings::parse(&url, false, &[]).unwrap_err();
            assert!(
                err.is_invalid_input() && err.to_string().contains(option),
                "{err}"
            );
        }
        if cfg!(feature = "tls") {
            // Half of a client certificate names the missing half.
            let url = "rediss://h?cert_file=/etc/hostname";
            let err = RedisSettings::parse(url, true, &[]).unwrap_err();
            assert!(err.to_string().contains("key_file"), "{err}");
        }
    }

    #[test]
    fn bad_options_are_refused_without_the_password() {
        for (url, expect) in [
            ("redis://:hunter2@h/x", "database number"),
            ("redis://:hunter2@h?timeout=5", "unknown option `timeout`"),
            ("redis://:hunter2@h?timeout_ms=0", "at least 1 ms"),
            ("redis://:hunter2@h?prefix=%7Bx", "hash tag"),
        ] {
            let err = RedisSettings::parse(url, false, &[]).unwrap_err();
            assert!(
                err.is_invalid_input() && err.to_string().contains(expect),
                "{url}: {err}"
            );
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }
}
