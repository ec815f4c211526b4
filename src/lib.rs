#![doc = include_str!("../README.md")]

pub use lock_core::*;

#[cfg(feature = "etcd")]
pub use lock_etcd as etcd;
#[cfg(feature = "postgres")]
pub use lock_postgres as postgres;
#[cfg(feature = "redis")]
pub use lock_redis as redis;
#[cfg(feature = "redlock")]
pub use lock_redlock as redlock;

/// Every URL scheme lockkit knows, the cargo feature that serves it, and
/// whether this build has that feature.
const SCHEMES: &[(&str, &str, bool)] = &[
    ("memory", "(always on)", true),
    ("redis", "redis", false),
    ("rediss", "redis", false),
    ("redis+cluster", "redis", false),
    ("redlock", "redlock", false),
    ("etcd", "etcd", false),
    ("postgres", "postgres", false),
    ("postgresql", "postgres", false),
];

/// The URL schemes this build can connect to.
pub fn available_schemes() -> Vec<&'static str> {
    SCHEMES
        .iter()
        .filter(|(_, _, on)| *on)
        .map(|(s, _, _)| *s)
        .collect()
}

/// Connects to the backend the URL names and returns a [`Locker`] over it.
///
/// | scheme | backend | cargo feature |
/// |---|---|---|
/// | `memory://` | in-process ([`MemoryBackend`]); each call makes a new, empty lock space | always |
///
/// An unknown scheme, or one whose cargo feature is off in this build, is
/// refused with an error that lists the schemes available.
pub async fn connect(url: &str) -> Result<Locker> {
    let redacted = url::redact(url);
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::invalid(
            "url",
            format!(
                "{redacted}: expected scheme://..., with a scheme among {}",
                available_schemes().join(", ")
            ),
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "memory" => Ok(Locker::new(MemoryBackend::new())),
        other => Err(unavailable_scheme(other, &redacted)),
    }
}

fn unavailable_scheme(scheme: &str, redacted: &str) -> Error {
    let available = available_schemes().join(", ");
    let problem = match SCHEMES.iter().find(|(s, _, _)| *s == scheme) {
        Some((_, feature, _)) => format!(
            "{redacted}: scheme `{scheme}` needs lockkit's `{feature}` cargo feature, which this build lacks; available: {available}"
        ),
        None => format!("{redacted}: unknown scheme `{scheme}`; available: {available}"),
    };
    Error::invalid("url", problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_url_connects() {
        let locker = connect("memory://").await.unwrap();
        assert_eq!(locker.capabilities().backend, "memory");
    }

    #[tokio::test]
    async fn unknown_scheme_lists_the_available_ones() {
        let err = connect("zookeeper://u:pw@h:2181")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown scheme `zookeeper`") && err.contains("memory"),
            "{err}"
        );
        assert!(!err.contains("pw@"), "{err}");
    }

    #[tokio::test]
    async fn missing_scheme_is_refused() {
        let err = connect("localhost:6379").await.unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }
}
