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
/// [`EtcdBackend::connect_with`](crate::EtcdBackend::connect_with). The
/// setters only store their value (the TLS setters store file paths);
/// `connect_with` checks the values and reads the files before it dials
/// any member (as [`check`](Self::check) does, without connecting), and
/// its error names the URL option:
///
/// ```
/// use std::time::Duration;
/// use lock_etcd::EtcdOptions;
///
/// let options = EtcdOptions::from_url("etcd://root:secret@10.0.0.1:2379,10.0.0.2:2379")?
///     .response_timeout(Duration::from_secs(2))
///     .prefix("billing/");
/// options.check()?;
/// assert_eq!(options.get_prefix(), "billing/");
/// assert!(!format!("{options:?}").contains("secret"));
///
/// let err = options.min_ttl(Duration::ZERO).check().unwrap_err();
/// assert!(err.to_string().contains("min_ttl_s"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// The members (and the credentials the URL gives).
    pub(crate) url: ServerUrl,
    // The next four are stored as the setters got them, and checked by
    // `check` before anything connects.
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) prefix: String,
    pub(crate) min_ttl: Duration,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<Secret>,
    /// The path of the CA to trust, read when connecting.
    pub(crate) ca_file: Option<String>,
    /// The paths of the client certificate and its key, read when connecting.
    pub(crate) client_cert: Option<(String, String)>,
}

/// The PEM files the TLS options name, read.
pub(crate) struct TlsFiles {
    /// The CA to trust.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) ca: Vec<u8>,
    /// The client certificate and its key.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL prints without its passwords; the password is left out.
        // When the URL is ambiguous, file paths, which may then hold a
        // piece of the password, are not shown either.
        let hidden = self.url.to_string().ends_with("://***");
        let path = |path: &String| match hidden {
            true => "***".to_owned(),
            false => path.clone(),
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
    /// refused, naming it (never showing the password). The files that
    /// `ca_file`, `cert_file` and `key_file` name are read when connecting.
    pub fn from_url(url: &str) -> Result<EtcdOptions> {
        lock_core::url::hide_if_ambiguous(url, read(url))
    }

    /// How long connecting (and authenticating) may take (URL option
    /// `connect_timeout_ms`, default 3 s). At least 1 ms, or `connect_with`
    /// refuses it naming `connect_timeout_ms`; `Duration::MAX` means no limit.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request may take before the cluster counts as
    /// unavailable for it (URL option `response_timeout_ms`, default 3 s).
    /// Without a quorum etcd does not answer writes at all, so this bounds
    /// every operation. At least 1 ms, or `connect_with` refuses it naming
    /// `response_timeout_ms`; `Duration::MAX` means no limit.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Puts every lock under this key prefix (URL option `prefix`, default
    /// `lockkit/`). `connect_with` refuses it, naming `prefix`, when it
    /// holds a control character.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The shortest lease TTL the cluster grants (URL option `min_ttl_s`,
    /// default 2 s): etcd raises shorter ones to 1.5 × its election
    /// timeout, rounded up to whole seconds. TTLs below it are refused.
    /// Whole seconds from 1 to 86400 (the longest TTL), or `connect_with`
    /// refuses it naming `min_ttl_s`.
    pub fn min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Speaks TLS, trusting the CA in this PEM file (URL option `ca_file`),
    /// read when connecting. `connect_with` refuses it, naming `ca_file`,
    /// when the file cannot be read or lock-etcd was built without its
    /// `tls` cargo feature.
    pub fn ca_file(mut self, path: impl Into<String>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents the client certificate in `cert_file` (PEM), with its key
    /// in `key_file`, to members that ask for one (URL options `cert_file`
    /// and `key_file`), both read when connecting. `connect_with` refuses
    /// them, naming the option, when a file cannot be read, or without TLS
    /// ([`ca_file`](Self::ca_file)).
    pub fn client_certificate(
        mut self,
        cert_file: impl Into<String>,
        key_file: impl Into<String>,
    ) -> Self {
        self.client_cert = Some((cert_file.into(), key_file.into()));
        self
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

    /// Checks every value and reads the TLS files, as
    /// [`EtcdBackend::connect_with`](crate::EtcdBackend::connect_with) does
    /// before it dials any member, without connecting: the error names the
    /// URL option (`connect_timeout_ms`, `min_ttl_s`, `ca_file`, ...).
    pub fn check(&self) -> Result<()> {
        self.tls_files().map(drop)
    }

    /// The TLS files, read once every value is checked (`None` without
    /// TLS). A file's path, which may hold a piece of the password when
    /// the URL is ambiguous, is then not shown.
    pub(crate) fn tls_files(&self) -> Result<Option<TlsFiles>> {
        self.check_values()?;
        let Some(ca) = &self.ca_file else {
            return Ok(None);
        };
        let read = || {
            let ca = lock_core::url::read_option_file("ca_file", ca)?;
            let client = match &self.client_cert {
                Some((cert, key)) => Some((
                    lock_core::url::read_option_file("cert_file", cert)?,
                    lock_core::url::read_option_file("key_file", key)?,
                )),
                None => None,
            };
            Ok(Some(TlsFiles { ca, client }))
        };
        self.url.hide_if_ambiguous(read())
    }

    /// Refuses a value out of range, or options that cannot work together,
    /// naming the option; reads no file.
    fn check_values(&self) -> Result<()> {
        lock_core::raw::validate::timeout("connect_timeout_ms", self.connect_timeout)?;
        lock_core::raw::validate::timeout("response_timeout_ms", self.response_timeout)?;
        if self.prefix.chars().any(char::is_control) {
            return Err(Error::invalid(
                "prefix",
                "the key prefix must be printable text",
            ));
        }
        let longest = lock_core::raw::validate::MAX_TTL;
        let min_ttl = self.min_ttl;
        if min_ttl.is_zero() || min_ttl.subsec_nanos() != 0 || min_ttl > longest {
            return Err(Error::invalid(
                "min_ttl_s",
                format!(
                    "`min_ttl_s` is {min_ttl:?}; it must be a whole number of seconds from 1 to {} (the longest TTL)",
                    longest.as_secs()
                ),
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
    let min_ttl = match url.param("min_ttl_s") {
        None => EtcdOptions::DEFAULT_MIN_TTL,
        Some(s) => Duration::from_secs(s.parse().map_err(|_| {
            Error::invalid(
                "url",
                format!(
                    "{url}: parameter `min_ttl_s` must be a whole number of seconds, got `{s}`"
                ),
            )
        })?),
    };
    let options = EtcdOptions {
        connect_timeout: (url.millis_param("connect_timeout_ms")?)
            .unwrap_or(EtcdOptions::DEFAULT_CONNECT_TIMEOUT),
        response_timeout: (url.millis_param("response_timeout_ms")?)
            .unwrap_or(EtcdOptions::DEFAULT_RESPONSE_TIMEOUT),
        prefix: (url.param("prefix"))
            .unwrap_or(EtcdOptions::DEFAULT_PREFIX)
            .to_owned(),
        min_ttl,
        user: first.and_then(|s| s.username.clone()),
        password: first.and_then(|s| s.password.clone()),
        ca_file: url.param("ca_file").map(str::to_owned),
        client_cert: (url.client_cert_files()?).map(|(c, k)| (c.to_owned(), k.to_owned())),
        url: url.clone(),
    };
    options.check_values()?;
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
        let named = |o: EtcdOptions| match o.check() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected an input error, got {other:?}"),
        };
        let missing = "/nonexistent/ca.pem";
        let url = format!("etcd://h?ca_file={missing}");
        // Without the `tls` feature, `ca_file` is refused as soon as it is read.
        let from_url = EtcdOptions::from_url(&url);
        assert_eq!(from_url.is_ok(), cfg!(feature = "tls"), "{from_url:?}");
        let Ok(from_url) = from_url else {
            return;
        };
        assert_eq!(named(from_url), "ca_file");
        let file = std::env::current_exe().unwrap();
        let file = file.to_str().unwrap();
        let options = EtcdOptions::from_url("etcd://h").unwrap();
        assert_eq!(named(options.clone().ca_file(missing)), "ca_file");
        let tls = options.ca_file(file);
        assert_eq!(
            named(tls.clone().client_certificate(missing, file)),
            "cert_file"
        );
        assert_eq!(named(tls.client_certificate(file, missing)), "key_file");
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
