//! The `etcd://` URL and the options it carries.

use std::time::Duration;

use lock_core::url::ServerUrl;
use lock_core::{Error, Result, Secret};

/// The port etcd serves clients on when the URL names none.
pub const DEFAULT_PORT: u16 = 2379;

/// The URL's query options. Any other is refused, so that a misspelt one
/// (or `tls=true`: TLS is what `ca_file` turns on) is not silently ignored.
pub const OPTIONS: &[&str] = &[
    "ca_file",
    "cert_file",
    "connect_timeout_ms",
    "key_file",
    "min_ttl_s",
    "prefix",
    "request_timeout_ms",
];

/// How an [`EtcdBackend`](crate::EtcdBackend) talks to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// How long connecting (and authenticating) may take, at least 1 ms; a
    /// value past what the clock can count (`Duration::MAX`) means no limit.
    /// URL: `connect_timeout_ms`. Default 3 s.
    pub connect_timeout: Duration,
    /// How long one request may take before the cluster counts as
    /// unavailable for it. Without a quorum etcd does not answer writes at
    /// all, so this bounds every operation. At least 1 ms; a value past
    /// what the clock can count means no limit. URL: `request_timeout_ms`.
    /// Default 3 s.
    pub request_timeout: Duration,
    /// Every lock lives under this key prefix. URL: `prefix`. Default
    /// `lockkit/`.
    pub prefix: String,
    /// The shortest lease TTL the cluster grants: etcd raises shorter ones to
    /// 1.5 × its election timeout, rounded up to whole seconds (2 s with the
    /// default 1 s election timeout). TTLs below it are refused. Whole
    /// seconds from 1 to 86400 (the longest TTL). URL: `min_ttl_s`. Default 2 s.
    pub min_ttl: Duration,
    /// User name for etcd authentication. URL: the user info of the first
    /// server (`etcd://user:password@host:2379,...`).
    pub user: Option<String>,
    /// Password for etcd authentication.
    pub password: Option<Secret>,
    /// PEM file with the CA that signed the members' certificates: speaks
    /// TLS to the members (cargo feature `tls`; no system roots are compiled
    /// in). URL: `ca_file=/path/ca.pem`.
    pub ca_file: Option<String>,
    /// PEM files of the client certificate and its key, for members that
    /// ask clients for one (`--client-cert-auth`). URL: `cert_file=` and
    /// `key_file=`, both, with `ca_file`.
    pub client_cert: Option<(String, String)>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(3),
            prefix: "lockkit/".to_owned(),
            min_ttl: Duration::from_secs(2),
            user: None,
            password: None,
            ca_file: None,
            client_cert: None,
        }
    }
}

impl EtcdOptions {
    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the per-request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the key prefix under which locks live.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the shortest TTL the cluster grants (whole seconds).
    pub fn min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Speaks TLS, trusting the CA in this PEM file (cargo feature `tls`).
    pub fn ca_file(mut self, path: impl Into<String>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents the client certificate in `cert_file` (PEM), with its key
    /// in `key_file`, to members that ask for one. Needs TLS (`ca_file`).
    pub fn client_certificate(
        mut self,
        cert_file: impl Into<String>,
        key_file: impl Into<String>,
    ) -> Self {
        self.client_cert = Some((cert_file.into(), key_file.into()));
        self
    }

    /// Sets the credentials for etcd authentication.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(Secret::new(password));
        self
    }

    /// These options with any the URL sets instead. An option not in
    /// [`OPTIONS`] is refused, naming it.
    pub fn from_url(mut self, url: &ServerUrl) -> Result<Self> {
        url.refuse_unknown_options(&[OPTIONS])?;
        if let Some(t) = url.millis_param("connect_timeout_ms")? {
            self.connect_timeout = t;
        }
        if let Some(t) = url.millis_param("request_timeout_ms")? {
            self.request_timeout = t;
        }
        if let Some(p) = url.param("prefix") {
            self.prefix = p.to_owned();
        }
        if let Some(s) = url.param("min_ttl_s") {
            let secs: u64 = s.parse().map_err(|_| {
                Error::invalid(
                    "url",
                    format!(
                        "{url}: parameter `min_ttl_s` must be a whole number of seconds, got `{s}`"
                    ),
                )
            })?;
            self.min_ttl = Duration::from_secs(secs);
        }
        if let Some(ca) = url.param("ca_file") {
            self.ca_file = Some(ca.to_owned());
        }
        if let Some((cert, key)) = url.client_cert_files()? {
            self.client_cert = Some((cert.to_owned(), key.to_owned()));
        }
        if let Some(first) = url.servers.first() {
            if first.username.is_some() {
                self.user = first.username.clone();
            }
            if first.password.is_some() {
                self.password = first.password.clone();
            }
        }
        Ok(self)
    }

    /// Refuses values that cannot work, naming the option and the limit.
    pub(crate) fn check(&self) -> Result<()> {
        lock_core::raw::validate::timeout("connect_timeout_ms", self.connect_timeout)?;
        lock_core::raw::validate::timeout("request_timeout_ms", self.request_timeout)?;
        let longest = lock_core::raw::validate::MAX_TTL;
        if self.min_ttl.is_zero() || self.min_ttl.subsec_nanos() != 0 || self.min_ttl > longest {
            return Err(Error::invalid(
                "min_ttl_s",
                format!(
                    "`min_ttl_s` is {:?}; it must be a whole number of seconds from 1 to {} (the longest TTL)",
                    self.min_ttl,
                    longest.as_secs()
                ),
            ));
        }
        if self.prefix.chars().any(char::is_control) {
            return Err(Error::invalid(
                "prefix",
                "the key prefix must be printable text",
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(Error::invalid(
                "url",
                "a password was given without a user name; etcd needs both",
            ));
        }
        if self.client_cert.is_some() && self.ca_file.is_none() {
            return Err(Error::invalid(
                "cert_file",
                "a client certificate is for TLS, which `ca_file` turns on",
            ));
        }
        if self.ca_file.is_some() && !cfg!(feature = "tls") {
            return Err(Error::invalid(
                "ca_file",
                "TLS was asked for, but lock-etcd was built without its `tls` cargo feature",
            ));
        }
        Ok(())
    }
}

/// Parses an `etcd://` URL, refusing other schemes.
pub(crate) fn parse(url: &str) -> Result<ServerUrl> {
    let parsed = ServerUrl::parse(url)?;
    if !crate::SCHEMES.contains(&parsed.scheme.as_str()) {
        return Err(Error::invalid(
            "url",
            format!(
                "{parsed}: scheme `{}` is not served by the etcd backend (use etcd://)",
                parsed.scheme
            ),
        ));
    }
    Ok(parsed)
}

/// The gRPC endpoints of the URL's servers, `http://host:port` (or `https://`).
pub(crate) fn endpoints(url: &ServerUrl, tls: bool) -> Vec<String> {
    let scheme = if tls { "https" } else { "http" };
    url.servers
        .iter()
        .map(|s| format!("{scheme}://{}", s.address(DEFAULT_PORT)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_sets_endpoints_timeouts_and_credentials() {
        let url = parse("etcd://root:pw@10.0.0.1:12379,10.0.0.2?request_timeout_ms=250&connect_timeout_ms=100&prefix=app/locks/&min_ttl_s=3").unwrap();
        let o = EtcdOptions::default().from_url(&url).unwrap();
        assert_eq!(
            endpoints(&url, false),
            ["http://10.0.0.1:12379", "http://10.0.0.2:2379"]
        );
        assert_eq!(o.request_timeout, Duration::from_millis(250));
        assert_eq!(o.connect_timeout, Duration::from_millis(100));
        assert_eq!(o.prefix, "app/locks/");
        assert_eq!(o.min_ttl, Duration::from_secs(3));
        assert_eq!(o.user.as_deref(), Some("root"));
        assert_eq!(o.password.as_ref().map(Secret::expose), Some("pw"));
        assert!(o.check().is_ok());
    }

    #[test]
    fn bad_options_are_refused_with_their_name() {
        let err = parse("redis://h:1").unwrap_err().to_string();
        assert!(err.contains("etcd://"), "{err}");
        let url = parse("etcd://h?min_ttl_s=1.5").unwrap();
        assert!(
            EtcdOptions::default()
                .from_url(&url)
                .unwrap_err()
                .to_string()
                .contains("min_ttl_s")
        );
        let min_ttl = |secs: u64| {
            EtcdOptions::default()
                .min_ttl(Duration::from_secs(secs))
                .check()
        };
        assert!(min_ttl(1).is_ok() && min_ttl(86_400).is_ok());
        for secs in [0, 86_401, u64::MAX] {
            let err = min_ttl(secs).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidInput { field: "min_ttl_s", problem } if problem.contains("from 1 to 86400")),
                "{err}"
            );
        }
        let url = parse("etcd://h?request_timeout_ms=0").unwrap();
        let err = EtcdOptions::default()
            .from_url(&url)
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(err.contains("request_timeout_ms"), "{err}");
    }

    /// Each option's range, at its ends: `Ok` or the field an input error names.
    #[test]
    fn options_are_accepted_within_their_range_and_refused_by_name_outside_it() {
        let field = |query: &str| {
            let read = parse(&format!("etcd://h?{query}"))
                .and_then(|url| EtcdOptions::default().from_url(&url))
                .and_then(|o| o.check());
            match read {
                Ok(()) => "ok",
                Err(Error::InvalidInput { field, .. }) => field,
                Err(e) => panic!("{query}: {e}"),
            }
        };
        for (query, expect) in [
            ("connect_timeout_ms=1", "ok"),
            ("connect_timeout_ms=18446744073709551615", "ok"),
            ("connect_timeout_ms=0", "connect_timeout_ms"),
            ("connect_timeout_ms=18446744073709551616", "url"),
            ("request_timeout_ms=1", "ok"),
            ("request_timeout_ms=18446744073709551615", "ok"),
            ("request_timeout_ms=0", "request_timeout_ms"),
            ("request_timeout_ms=-1", "url"),
            ("min_ttl_s=1", "ok"),
            ("min_ttl_s=86400", "ok"),
            ("min_ttl_s=0", "min_ttl_s"),
            ("min_ttl_s=86401", "min_ttl_s"),
            ("min_ttl_s=18446744073709551616", "url"),
            ("prefix=", "ok"),
            ("prefix=app/locks/", "ok"),
            ("prefix=a%0Ab", "prefix"),
            ("cert_file=/c.pem&key_file=/k.pem", "cert_file"),
            ("request_timout_ms=1", "url"),
        ] {
            assert_eq!(field(query), expect, "{query}");
        }
    }

    #[test]
    fn tls_without_the_feature_is_refused() {
        let url = parse("etcd://h?ca_file=/etc/etcd/ca.pem").unwrap();
        let checked = EtcdOptions::default().from_url(&url).unwrap().check();
        assert_eq!(checked.is_ok(), cfg!(feature = "tls"));
    }

    #[test]
    fn an_unknown_option_is_refused_naming_it() {
        for query in ["tls=true", "request_timout_ms=100"] {
            let url = parse(&format!("etcd://u:secret@h?{query}")).unwrap();
            let err = EtcdOptions::default()
                .from_url(&url)
                .unwrap_err()
                .to_string();
            let name = query.split('=').next().unwrap();
            assert!(err.contains(&format!("`{name}`")), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn a_client_certificate_comes_with_its_key_and_tls() {
        let options = |query: &str| {
            let url = parse(&format!("etcd://h?{query}")).unwrap();
            EtcdOptions::default()
                .from_url(&url)
                .and_then(|o| o.check())
        };
        let named = |query: &str| match options(query) {
            Err(lock_core::Error::InvalidInput { field, .. }) => field,
            other => panic!("{query}: expected an input error, got {other:?}"),
        };
        assert_eq!(named("ca_file=/ca.pem&cert_file=/c.pem"), "key_file");
        assert_eq!(named("ca_file=/ca.pem&key_file=/k.pem"), "cert_file");
        assert_eq!(named("cert_file=/c.pem&key_file=/k.pem"), "cert_file");
        let both = options("ca_file=/ca.pem&cert_file=/c.pem&key_file=/k.pem");
        assert_eq!(both.is_ok(), cfg!(feature = "tls"));
    }
}
