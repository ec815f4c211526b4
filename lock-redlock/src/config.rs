//! The `redlock://` URL and the options it carries.

use std::time::Duration;

use lock_core::url::ServerUrl;
use lock_core::{Error, Result};
use lock_redis_wire::config::RESPONSE_TIMEOUT;
use lock_redis_wire::{RedisSettings, Timeouts};

/// The query options this backend reads beyond the ones every Redis backend
/// understands ([`lock_redis_wire::config::OPTIONS`]): the per-node timeout, and
/// `tls=true` for TLS to every node (with the `tls` cargo feature).
pub(crate) const OPTIONS: &[&str] = &["node_timeout_ms", "tls"];

/// How a [`RedlockBackend`](crate::RedlockBackend) talks to its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedlockOptions {
    /// How long one node may take to answer one request before it counts as
    /// failed for that request. Small against the TTL, so that a slow or
    /// paused node cannot eat the validity of a lock held on the others.
    /// URL: `node_timeout_ms`. Default 50 ms.
    pub node_timeout: Duration,
    /// How long connecting to one node may take. URL: `connect_timeout_ms`
    /// (or `timeout_ms`). Default 3 s.
    pub connect_timeout: Duration,
}

impl Default for RedlockOptions {
    fn default() -> Self {
        RedlockOptions {
            node_timeout: Duration::from_millis(50),
            connect_timeout: Timeouts::default().connect,
        }
    }
}

impl RedlockOptions {
    /// Sets the per-node timeout.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// These options with any the URL's query sets instead.
    pub(crate) fn with_url(mut self, url: &ServerUrl, settings: &RedisSettings) -> Result<Self> {
        if let Some(t) = url.millis_param("node_timeout_ms")? {
            self.node_timeout = t;
        }
        if url.param("connect_timeout_ms").is_some() || url.param("timeout_ms").is_some() {
            self.connect_timeout = settings.timeouts.connect;
        }
        lock_core::validate::timeout("node_timeout_ms", self.node_timeout)?;
        lock_core::validate::timeout("connect_timeout_ms", self.connect_timeout)?;
        Ok(self)
    }
}

/// Parses a `redlock://` URL, refusing other schemes and unknown options.
pub(crate) fn parse(url: &str, options: RedlockOptions) -> Result<(RedisSettings, RedlockOptions)> {
    lock_core::url::hide_if_ambiguous(url, read(url, options))
}

fn read(url: &str, options: RedlockOptions) -> Result<(RedisSettings, RedlockOptions)> {
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
    let settings = RedisSettings::from_url(&parsed, tls, OPTIONS)?;
    let options = options.with_url(&parsed, &settings)?;
    Ok((settings, options))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_url_options() {
        let (settings, options) =
            parse("redlock://a:1,b:2,c:3", RedlockOptions::default()).unwrap();
        assert_eq!(options, RedlockOptions::default());
        assert_eq!(settings.endpoints.len(), 3);
        let url = "redlock://a:1,b:2,c:3?node_timeout_ms=20&connect_timeout_ms=500";
        let (_, options) = parse(url, RedlockOptions::default()).unwrap();
        assert_eq!(options.node_timeout, Duration::from_millis(20));
        assert_eq!(options.connect_timeout, Duration::from_millis(500));
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
            let err = parse(input, RedlockOptions::default()).unwrap_err();
            assert!(
                err.is_invalid_input() && err.to_string().contains(expected),
                "{input}: {err}"
            );
            assert!(!err.to_string().contains("pw"), "{err}");
        }
    }
}
