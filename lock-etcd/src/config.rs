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
    "response_timeout_ms",
];

/// The URL option's name before it took the other backends' word; named in
/// its refusal, so that an old URL is told what to write instead.
const OLD_RESPONSE_TIMEOUT: &str = "request_timeout_ms";

/// How an [`EtcdBackend`](crate::EtcdBackend) talks to the cluster: what
/// the URL says, adjustable in code.
///
/// Read a URL with [`from_url`](Self::from_url), adjust it with the setters
/// (each named after its URL option), then hand it to
/// [`EtcdBackend::connect_with`](crate::EtcdBackend::connect_with):
///
/// ```
/// use std::time::Duration;
/// use lock_etcd::EtcdOptions;
///
/// let options = EtcdOptions::from_url("etcd://root:secret@10.0.0.1:2379,10.0.0.2:2379")?
///     .response_timeout(Duration::from_secs(2))?
///     .prefix("billing/")?;
/// assert_eq!(options.get_prefix(), "billing/");
/// assert!(!format!("{options:?}").contains("secret"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// The members (and the credentials the URL gives).
    pub(crate) url: ServerUrl,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) prefix: String,
    pub(crate) min_ttl: Duration,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<Secret>,
    /// The CA to trust, read when set: a missing file is reported by
    /// `from_url` or the setter, naming its option.
    pub(crate) ca_file: Option<PemFile>,
    /// The client certificate and its key, read when set.
    pub(crate) client_cert: Option<(PemFile, PemFile)>,
    /// Whether the URL is ambiguous: then file paths, which may hold a
    /// piece of the password, are not shown either.
    hidden: bool,
}

/// A PEM file a TLS option names: its path, for `Debug`, and its contents.
#[derive(Clone)]
pub(crate) struct PemFile {
    path: String,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) pem: Vec<u8>,
}

impl PemFile {
    fn read(option: &'static str, path: impl Into<String>) -> Result<PemFile> {
        let path = path.into();
        let pem = lock_core::url::read_option_file(option, &path)?;
        Ok(PemFile { path, pem })
    }
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL prints without its passwords; the password is left out.
        let path = |file: &PemFile| match self.hidden {
            true => "***".to_owned(),
            false => file.path.clone(),
        };
        f.debug_struct("EtcdOptions")
            .field("url", &self.url.to_string())
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("prefix", &self.prefix)
            .field("min_ttl", &self.min_ttl)
            .field("user", &self.user)
            .field("ca_file", &self.ca_file.as_ref().map(path))
            .field(
                "client_cert",
                &(self.client_cert.as_ref()).map(|(c, k)| (path(c), path(k))),
            )
            .finish_non_exhaustive()
    }
}

impl EtcdOptions {
    /// Default time allowed to connect (and authenticate).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
    /// Default time allowed for one request.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
    /// Default key prefix under which locks live.
    pub const DEFAULT_PREFIX: &str = "lockkit/";
    /// Default shortest lease TTL the cluster grants: 1.5 × etcd's default
    /// election timeout (1 s), rounded up to whole seconds.
    pub const DEFAULT_MIN_TTL: Duration = Duration::from_secs(2);

    /// Reads an `etcd://host1:port1,host2:port2` URL: its members, the
    /// credentials of its first server, and the options of its query (see
    /// [`OPTIONS`] and the crate docs). An unknown option or a bad value is
    /// refused, naming it (never showing the password).
    pub fn from_url(url: &str) -> Result<EtcdOptions> {
        lock_core::url::hide_if_ambiguous(url, read(url))
    }

    /// How long connecting (and authenticating) may take (URL option
    /// `connect_timeout_ms`, default 3 s). At least 1 ms, or refused naming
    /// `connect_timeout_ms`; `Duration::MAX` means no limit.
    pub fn connect_timeout(mut self, timeout: Duration) -> Result<Self> {
        self.connect_timeout = lock_core::raw::validate::timeout("connect_timeout_ms", timeout)?;
        Ok(self)
    }

    /// How long one request may take before the cluster counts as
    /// unavailable for it (URL option `response_timeout_ms`, default 3 s).
    /// Without a quorum etcd does not answer writes at all, so this bounds
    /// every operation. At least 1 ms, or refused naming
    /// `response_timeout_ms`; `Duration::MAX` means no limit.
    pub fn response_timeout(mut self, timeout: Duration) -> Result<Self> {
        self.response_timeout = lock_core::raw::validate::timeout("response_timeout_ms", timeout)?;
        Ok(self)
    }

    /// Puts every lock under this key prefix (URL option `prefix`, default
    /// `lockkit/`). Refused, naming `prefix`, when it holds a control
    /// character.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        if prefix.chars().any(char::is_control) {
            return Err(Error::invalid(
                "prefix",
                "the key prefix must be printable text",
            ));
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// The shortest lease TTL the cluster grants (URL option `min_ttl_s`,
    /// default 2 s): etcd raises shorter ones to 1.5 × its election
    /// timeout, rounded up to whole seconds. TTLs below it are refused.
    /// Whole seconds from 1 to 86400 (the longest TTL), or refused naming
    /// `min_ttl_s`.
    pub fn min_ttl(mut self, min_ttl: Duration) -> Result<Self> {
        let longest = lock_core::raw::validate::MAX_TTL;
        if min_ttl.is_zero() || min_ttl.subsec_nanos() != 0 || min_ttl > longest {
            return Err(Error::invalid(
                "min_ttl_s",
                format!(
                    "`min_ttl_s` is {min_ttl:?}; it must be a whole number of seconds from 1 to {} (the longest TTL)",
                    longest.as_secs()
                ),
            ));
        }
        self.min_ttl = min_ttl;
        Ok(self)
    }

    /// Speaks TLS, trusting the CA in this PEM file (URL option `ca_file`),
    /// read now. Refused, naming `ca_file`, when the file cannot be read or
    /// lock-etcd was built without its `tls` cargo feature.
    pub fn ca_file(mut self, path: impl Into<String>) -> Result<Self> {
        refuse_tls_without_the_feature()?;
        self.ca_file = Some(PemFile::read("ca_file", path)?);
        Ok(self)
    }

    /// Presents the client certificate in `cert_file` (PEM), with its key
    /// in `key_file`, to members that ask for one (URL options `cert_file`
    /// and `key_file`), both read now. Refused, naming the option, when a
    /// file cannot be read. Needs TLS ([`ca_file`](Self::ca_file)).
    pub fn client_certificate(
        mut self,
        cert_file: impl Into<String>,
        key_file: impl Into<String>,
    ) -> Result<Self> {
        let cert = PemFile::read("cert_file", cert_file)?;
        let key = PemFile::read("key_file", key_file)?;
        self.client_cert = Some((cert, key));
        Ok(self)
    }

    /// Sets the credentials for etcd authentication (in the URL: the user
    /// info of the first server, `etcd://user:password@host:2379,...`).
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(Secret::new(password));
        self
    }

    /// How long connecting may take.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How long one request may take.
    pub fn get_response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The key prefix under which locks live.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The shortest lease TTL the cluster grants.
    pub fn get_min_ttl(&self) -> Duration {
        self.min_ttl
    }

    /// Refuses combinations that cannot work, naming the option: each
    /// setter has checked its own value already.
    pub(crate) fn check(&self) -> Result<()> {
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
        Ok(())
    }
}

fn refuse_tls_without_the_feature() -> Result<()> {
    if !cfg!(feature = "tls") {
        return Err(Error::invalid(
            "ca_file",
            "TLS was asked for, but lock-etcd was built without its `tls` cargo feature",
        ));
    }
    Ok(())
}

/// Reads an `etcd://` URL, refusing other schemes and unknown options.
fn read(url: &str) -> Result<EtcdOptions> {
    let url = ServerUrl::parse(url)?;
    if !crate::SCHEMES.contains(&url.scheme.as_str()) {
        return Err(Error::invalid(
            "url",
            format!(
                "{url}: scheme `{}` is not served by the etcd backend (use etcd://)",
                url.scheme
            ),
        ));
    }
    if url.param(OLD_RESPONSE_TIMEOUT).is_some() {
        return Err(Error::invalid(
            "url",
            format!(
                "{url}: `{OLD_RESPONSE_TIMEOUT}` is now `response_timeout_ms`, as on the other backends"
            ),
        ));
    }
    url.refuse_unknown_options(&[OPTIONS])?;
    let first = url.servers.first();
    let mut options = EtcdOptions {
        connect_timeout: EtcdOptions::DEFAULT_CONNECT_TIMEOUT,
        response_timeout: EtcdOptions::DEFAULT_RESPONSE_TIMEOUT,
        prefix: EtcdOptions::DEFAULT_PREFIX.to_owned(),
        min_ttl: EtcdOptions::DEFAULT_MIN_TTL,
        user: first.and_then(|s| s.username.clone()),
        password: first.and_then(|s| s.password.clone()),
        ca_file: None,
        client_cert: None,
        hidden: url.to_string().ends_with("://***"),
        url: url.clone(),
    };
    if let Some(t) = url.millis_param("connect_timeout_ms")? {
        options = options.connect_timeout(t)?;
    }
    if let Some(t) = url.millis_param("response_timeout_ms")? {
        options = options.response_timeout(t)?;
    }
    if let Some(p) = url.param("prefix") {
        options = options.prefix(p)?;
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
        options = options.min_ttl(Duration::from_secs(secs))?;
    }
    // The rules between options first: a certificate without TLS is
    // refused as such, before any file is read.
    let client_cert = url.client_cert_files()?;
    if client_cert.is_some() && url.param("ca_file").is_none() {
        return Err(Error::invalid(
            "cert_file",
            "a client certificate is for TLS, which `ca_file` turns on",
        ));
    }
    if let Some(path) = url.param("ca_file") {
        options = options.ca_file(path)?;
    }
    if let Some((cert, key)) = client_cert {
        options = options.client_certificate(cert, key)?;
    }
    options.check()?;
    Ok(options)
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
        let o = EtcdOptions::from_url("etcd://root:pw@10.0.0.1:12379,10.0.0.2?response_timeout_ms=250&connect_timeout_ms=100&prefix=app/locks/&min_ttl_s=3").unwrap();
        assert_eq!(
            endpoints(&o.url, false),
            ["http://10.0.0.1:12379", "http://10.0.0.2:2379"]
        );
        assert_eq!(o.response_timeout, Duration::from_millis(250));
        assert_eq!(o.connect_timeout, Duration::from_millis(100));
        assert_eq!(o.prefix, "app/locks/");
        assert_eq!(o.min_ttl, Duration::from_secs(3));
        assert_eq!(o.user.as_deref(), Some("root"));
        assert_eq!(o.password.as_ref().map(Secret::expose), Some("pw"));
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("pw") && shown.contains("10.0.0.1"),
            "{shown}"
        );
    }

    #[test]
    fn bad_options_are_refused_with_their_name() {
        let err = EtcdOptions::from_url("redis://h:1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("etcd://"), "{err}");
        let err = EtcdOptions::from_url("etcd://h?min_ttl_s=1.5").unwrap_err();
        assert!(err.to_string().contains("min_ttl_s"), "{err}");
        let min_ttl = |secs: u64| {
            EtcdOptions::from_url("etcd://h")
                .unwrap()
                .min_ttl(Duration::from_secs(secs))
        };
        assert!(min_ttl(1).is_ok() && min_ttl(86_400).is_ok());
        for secs in [0, 86_401, u64::MAX] {
            let err = min_ttl(secs).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidInput { field: "min_ttl_s", problem } if problem.contains("from 1 to 86400")),
                "{err}"
            );
        }
        let err = EtcdOptions::from_url("etcd://h?response_timeout_ms=0").unwrap_err();
        assert!(err.to_string().contains("response_timeout_ms"), "{err}");
    }

    #[test]
    fn the_old_name_of_the_response_timeout_is_refused_naming_the_new_one() {
        let err = EtcdOptions::from_url("etcd://u:secret@h?request_timeout_ms=100")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`response_timeout_ms`"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    /// Each option's range, at its ends: `Ok` or the field an input error names.
    #[test]
    fn options_are_accepted_within_their_range_and_refused_by_name_outside_it() {
        let field = |query: &str| match EtcdOptions::from_url(&format!("etcd://h?{query}")) {
            Ok(_) => "ok",
            Err(Error::InvalidInput { field, .. }) => field,
            Err(e) => panic!("{query}: {e}"),
        };
        for (query, expect) in [
            ("connect_timeout_ms=1", "ok"),
            ("connect_timeout_ms=18446744073709551615", "ok"),
            ("connect_timeout_ms=0", "connect_timeout_ms"),
            ("connect_timeout_ms=18446744073709551616", "url"),
            ("response_timeout_ms=1", "ok"),
            ("response_timeout_ms=18446744073709551615", "ok"),
            ("response_timeout_ms=0", "response_timeout_ms"),
            ("response_timeout_ms=-1", "url"),
            ("min_ttl_s=1", "ok"),
            ("min_ttl_s=86400", "ok"),
            ("min_ttl_s=0", "min_ttl_s"),
            ("min_ttl_s=86401", "min_ttl_s"),
            ("min_ttl_s=18446744073709551616", "url"),
            ("prefix=", "ok"),
            ("prefix=app/locks/", "ok"),
            ("prefix=a%0Ab", "prefix"),
            ("cert_file=/c.pem&key_file=/k.pem", "cert_file"),
            ("response_timout_ms=1", "url"),
        ] {
            assert_eq!(field(query), expect, "{query}");
        }
    }

    #[test]
    fn tls_without_the_feature_is_refused() {
        let ca = std::env::current_exe().unwrap();
        let url = format!("etcd://h?ca_file={}", ca.display());
        let read = EtcdOptions::from_url(&url);
        assert_eq!(read.is_ok(), cfg!(feature = "tls"), "{read:?}");
    }

    #[test]
    fn a_tls_file_that_cannot_be_read_is_refused_naming_its_option() {
        let named = |r: Result<EtcdOptions>| match r {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected an input error, got {other:?}"),
        };
        let missing = "/nonexistent/ca.pem";
        let url = format!("etcd://h?ca_file={missing}");
        assert_eq!(named(EtcdOptions::from_url(&url)), "ca_file");
        let options = EtcdOptions::from_url("etcd://h").unwrap();
        assert_eq!(named(options.clone().ca_file(missing)), "ca_file");
        let file = std::env::current_exe().unwrap();
        let file = file.to_str().unwrap();
        assert_eq!(
            named(options.clone().client_certificate(missing, file)),
            "cert_file"
        );
        assert_eq!(named(options.client_certificate(file, missing)), "key_file");
    }

    #[test]
    fn an_unknown_option_is_refused_naming_it() {
        for query in ["tls=true", "response_timout_ms=100"] {
            let url = format!("etcd://u:secret@h?{query}");
            let err = EtcdOptions::from_url(&url).unwrap_err().to_string();
            let name = query.split('=').next().unwrap();
            assert!(err.contains(&format!("`{name}`")), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn a_client_certificate_comes_with_its_key_and_tls() {
        let options = |query: &str| EtcdOptions::from_url(&format!("etcd://h?{query}"));
        let named = |query: &str| match options(query) {
            Err(lock_core::Error::InvalidInput { field, .. }) => field,
            other => panic!("{query}: expected an input error, got {other:?}"),
        };
        assert_eq!(named("ca_file=/ca.pem&cert_file=/c.pem"), "key_file");
        assert_eq!(named("ca_file=/ca.pem&key_file=/k.pem"), "cert_file");
        assert_eq!(named("cert_file=/c.pem&key_file=/k.pem"), "cert_file");
        let file = std::env::current_exe().unwrap();
        let f = file.display();
        let both = options(&format!("ca_file={f}&cert_file={f}&key_file={f}"));
        assert_eq!(both.is_ok(), cfg!(feature = "tls"), "{both:?}");
    }
}
