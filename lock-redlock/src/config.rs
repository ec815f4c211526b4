//! The `redlock://` URL and the options it carries.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use lock_core::url::{Server, ServerUrl};
use lock_core::{Error, Result};
use lock_redis_wire::config::{DEFAULT_PORT, RESPONSE_TIMEOUT};
use lock_redis_wire::{KeyLayout, RedisSettings};

/// The query options this backend reads beyond the ones every Redis backend
/// understands ([`lock_redis_wire::config::OPTIONS`]): the per-node timeout, and
/// `tls=true` for TLS to every node (with the `tls` cargo feature).
pub(crate) const OPTIONS: &[&str] = &["node_timeout_ms", "tls"];

/// How a [`RedlockBackend`](crate::RedlockBackend) talks to its nodes:
/// what the URL says, adjustable in code.
///
/// Read a URL with [`from_url`](Self::from_url), adjust it with the setters
/// (each named after its URL option), then hand it to
/// [`RedlockBackend::connect_with`](crate::RedlockBackend::connect_with).
/// The setters only store their value; `connect_with` checks the values
/// before it connects to any node (as [`check`](Self::check) does, without
/// connecting), and its error names the URL option:
///
/// ```
/// use std::time::Duration;
/// use lock_redlock::RedlockOptions;
///
/// let options = RedlockOptions::from_url("redlock://:secret@10.0.0.1,10.0.0.2,10.0.0.3")?
///     .node_timeout(Duration::from_millis(20))
///     .prefix("billing:");
/// options.check()?;
/// assert_eq!(options.get_node_timeout(), Duration::from_millis(20));
/// assert!(!format!("{options:?}").contains("secret"));
///
/// let err = options.prefix("a{b}").check().unwrap_err();
/// assert!(err.to_string().contains("prefix"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedlockOptions {
    /// The nodes, their credentials and TLS, and the connect timeout as
    /// the setters left it, unchecked (its `Debug` leaves passwords out).
    settings: RedisSettings,
    /// Unchecked until connecting, as the setters store it.
    prefix: String,
    /// Unchecked until connecting, as the setters store it.
    node_timeout: Duration,
}

/// How long one node may take to answer one request, by default: small
/// against a TTL of seconds, so that a slow node cannot eat the validity.
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);

impl RedlockOptions {
    /// Reads a `redlock://host1:port1,host2:port2,...` URL (see the crate
    /// docs for its options). A node listed twice, an unknown option or a
    /// bad value is refused, naming it (never showing a password).
    pub fn from_url(url: &str) -> Result<RedlockOptions> {
        lock_core::url::hide_if_ambiguous(url, read(url))
    }

    /// How long one node may take to answer one request before it counts as
    /// failed for that request (URL option `node_timeout_ms`, default
    /// 50 ms). Small against the TTL, so that a slow or paused node cannot
    /// eat the validity of a lock held on the others. At least 1 ms, or
    /// `connect_with` refuses it naming `node_timeout_ms`; `Duration::MAX`
    /// means no limit.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// How long connecting to one node may take (URL option
    /// `connect_timeout_ms`, or `timeout_ms`; default 3 s). At least 1 ms,
    /// or `connect_with` refuses it naming `connect_timeout_ms`;
    /// `Duration::MAX` means no limit.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeouts.connect = timeout;
        self
    }

    /// Puts locks under `prefix` instead of the URL's (URL option `prefix`,
    /// default `lockkit:`). `connect_with` refuses it, naming `prefix`,
    /// when it holds `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Checks every value as
    /// [`RedlockBackend::connect_with`](crate::RedlockBackend::connect_with)
    /// does before it connects, without connecting: the error names the
    /// URL option (`node_timeout_ms`, `connect_timeout_ms`, `prefix`).
    pub fn check(&self) -> Result<()> {
        self.clone().checked().map(drop)
    }

    /// The settings and the per-node timeout to connect with, once every
    /// value is checked.
    pub(crate) fn checked(self) -> Result<(RedisSettings, Duration)> {
        let mut settings = self.settings;
        settings.timeouts.check()?;
        settings.layout = KeyLayout::new(self.prefix)?;
        let node_timeout = lock_core::raw::validate::timeout("node_timeout_ms", self.node_timeout)?;
        Ok((settings, node_timeout))
    }

    /// How long one node may take to answer one request.
    pub fn get_node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// How long connecting to one node may take.
    pub fn get_connect_timeout(&self) -> Duration {
        self.settings.timeouts.connect
    }

    /// The prefix locks live under.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The number of nodes the URL names.
    pub fn nodes(&self) -> usize {
        self.settings.servers.len()
    }
}

fn read(url: &str) -> Result<RedlockOptions> {
    let parsed = ServerUrl::parse(url)?;
    if !crate::SCHEMES.contains(&parsed.scheme.as_str()) {
        return Err(Error::invalid(
            "url",
            format!(
                "{parsed}: the redlock backend serves {}://, not {}://",
                crate::SCHEMES.join(", "),
                parsed.scheme
            ),
        ));
    }
    let tls = match parsed.param("tls") {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(Error::invalid(
                "url",
                format!("{parsed}: `tls` is `true` or `false`, got `{other}`"),
            ));
        }
    };
    // The single-server backend's option, named here so that a URL moved
    // over from it is told what to use instead (not only that it is unknown).
    if parsed.param(RESPONSE_TIMEOUT).is_some() {
        return Err(Error::invalid(
            "url",
            format!(
                "{parsed}: `{RESPONSE_TIMEOUT}` does not apply to Redlock; each node's answer is bounded by `node_timeout_ms`"
            ),
        ));
    }
    refuse_duplicate_nodes(&parsed)?;
    let settings = RedisSettings::from_url(&parsed, tls, OPTIONS)?;
    let options = RedlockOptions {
        prefix: settings.layout.prefix().to_owned(),
        settings,
        node_timeout: (parsed.millis_param("node_timeout_ms")?).unwrap_or(DEFAULT_NODE_TIMEOUT),
    };
    options.check()?;
    Ok(options)
}

/// Refuses a node listed twice: both connections would reach one server,
/// which would then count twice towards a quorum (and `h,h,h` is one
/// server that claims to survive a failure). Entries are compared by host
/// and port as the URL writes them, after the forms that name one address
/// alike: the host's case, a trailing dot, the default port, IPv6 spellings
/// and IPv4 addresses mapped into IPv6. (Two names of one server, such as
/// `localhost` and `127.0.0.1`, are told apart at connect by the servers'
/// `run_id`.)
fn refuse_duplicate_nodes(url: &ServerUrl) -> Result<()> {
    let identity = |server: &Server| {
        let host = server.host.trim_end_matches('.').to_ascii_lowercase();
        let host = match host.parse::<IpAddr>() {
            Ok(ip) => ip.to_canonical().to_string(),
            Err(_) => host,
        };
        (host, server.port.unwrap_or(DEFAULT_PORT))
    };
    let mut seen = HashMap::new();
    for (i, server) in url.servers.iter().enumerate() {
        if let Some(&first) = seen.get(&identity(server)) {
            let address = |i: usize| url.servers[i].address(DEFAULT_PORT);
            return Err(Error::invalid(
                "url",
                format!(
                    "{url}: node #{} ({}) and node #{} ({}) are one server listed twice; it would count twice towards a quorum, so list each node once",
                    first + 1,
                    address(first),
                    i + 1,
                    address(i)
                ),
            ));
        }
        seen.insert(identity(server), i);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_url_options() {
        let options = RedlockOptions::from_url("redlock://a:1,b:2,c:3").unwrap();
        assert_eq!(options.get_node_timeout(), DEFAULT_NODE_TIMEOUT);
        assert_eq!(options.get_connect_timeout(), Duration::from_secs(3));
        assert_eq!(options.nodes(), 3);
        let url = "redlock://a:1,b:2,c:3?node_timeout_ms=20&connect_timeout_ms=500";
        let options = RedlockOptions::from_url(url).unwrap();
        assert_eq!(options.get_node_timeout(), Duration::from_millis(20));
        assert_eq!(options.get_connect_timeout(), Duration::from_millis(500));
    }

    /// Two entries for one server would let that server count twice
    /// towards a quorum.
    #[test]
    fn a_node_listed_twice_is_refused_naming_both_entries() {
        for (input, first, second) in [
            (
                "redlock://a:6379,a:6379,b:6379",
                "#1 (a:6379)",
                "#2 (a:6379)",
            ),
            ("redlock://h:1,h:1,h:1", "#1 (h:1)", "#2 (h:1)"),
            // The default port, the host's case, a trailing dot.
            ("redlock://a,b:7000,A:6379", "#1 (a:6379)", "#3 (A:6379)"),
            (
                "redlock://db.example.,b,db.EXAMPLE",
                "#1 (db.example.:6379)",
                "#3 (db.EXAMPLE:6379)",
            ),
            // IPv6 written two ways, and an IPv4 address mapped into IPv6.
            (
                "redlock://[::1]:7000,b,[0:0:0:0:0:0:0:1]:7000",
                "#1 ([::1]:7000)",
                "#3 ([::1]:7000)",
            ),
            (
                "redlock://127.0.0.1,b,[::ffff:127.0.0.1]:6379",
                "#1 (127.0.0.1:6379)",
                "#3 ([::ffff:127.0.0.1]:6379)",
            ),
            // Other credentials do not make another server.
            (
                "redlock://u1:secret-1@a:1,u2:secret-2@a:1,u3:secret-3@c:1",
                "#1 (a:1)",
                "#2 (a:1)",
            ),
        ] {
            let err = RedlockOptions::from_url(input).unwrap_err();
            let text = err.to_string();
            assert!(err.is_invalid_input(), "{input}: {err}");
            assert!(
                text.contains(&format!("node {first}")) && text.contains(&format!("node {second}")),
                "{input}: {text}"
            );
            assert!(!text.contains("secret"), "{input}: {text}");
        }
        for distinct in [
            "redlock://a:6379,a:6380,b:6379",
            "redlock://127.0.0.1,127.0.0.2,localhost",
            "redlock://[::1],[::2],a",
        ] {
            RedlockOptions::from_url(distinct).expect(distinct);
        }
    }

    #[test]
    fn bad_options_and_schemes_are_refused() {
        for (input, expected) in [
            ("redlock://a:1?node_timeout_ms=fast", "node_timeout_ms"),
            ("redlock://a:1?node_timeout_ms=0", "at least 1 ms"),
            (
                "redlock://:pw@a:1?response_timeout_ms=20",
                "bounded by `node_timeout_ms`",
            ),
            ("redis://:pw@a:1", "not redis://"),
            (
                "redlock://:pw@a:1?node_timout_ms=5",
                "unknown option `node_timout_ms`; known: ca_file, cert_file, connect_timeout_ms, key_file, node_timeout_ms, prefix, timeout_ms, tls",
            ),
        ] {
            let err = RedlockOptions::from_url(input).unwrap_err();
            assert!(
                err.is_invalid_input() && err.to_string().contains(expected),
                "{input}: {err}"
            );
            assert!(!err.to_string().contains("pw"), "{err}");
        }
    }
}
