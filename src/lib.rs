//! Distributed locks for async Rust that say what they guarantee: one
//! [`Locker`] over Redis (and Redis Cluster), Redlock, etcd, PostgreSQL or
//! memory, chosen by URL with [`connect`], each grant carrying a
//! [`FencingToken`], each backend stating in [`Locker::capabilities`] what
//! its exclusion and fencing rest on.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockkit::Result<()> {
//! use std::time::Duration;
//! use lockkit::GuardOptions;
//!
//! let locker = lockkit::connect("memory://").await?; // redis://, redlock://, etcd://, postgres://
//! let options = GuardOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
//! let rows = locker
//!     .with_lock("jobs/nightly-report", options, |token| async move {
//!         // Held and renewed while this runs; pass `token` with every write.
//!         let _ = token;
//!         1234
//!     })
//!     .await?;
//! assert_eq!(rows, 1234);
//! # Ok(()) }
//! ```
//!
//! Where to start:
//! - [`connect`] and its table of URL schemes and cargo features;
//! - [`Locker`]: `with_lock`, `guard`, `lock` (a reusable [`Lock`]),
//!   `try_acquire` / `acquire` / `extend` / `release` for leases by hand;
//! - [`LockGuard`]: the fencing token, `remaining`, `lost`, `run_until_lost`;
//! - [`Fence`] and [`FencingToken`]: the check the protected resource makes;
//! - [`Error`]: `Contended`, `TimedOut`, `Lost`, `InvalidInput`, ...;
//! - [`config`]: profiles whose required guarantees are checked at connect;
//! - [`MemoryBackend`]: a backend for tests, with faults on cue;
//! - `blocking` (feature `blocking`): the same locks for synchronous code.
//!
//! The guide (choosing a backend, guarantees, operations, lockctl, the lab)
//! is in the repository's `docs/guide/`.

// The README's and the guide's examples compile (and run) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/using.md")]
struct UsingDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/testing.md")]
struct TestingDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/backends.md")]
struct BackendsDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/operations.md")]
struct OperationsDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/modes.md")]
struct ModesDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/waiting.md")]
struct WaitingDoctests;

pub use lock_core::*;

#[cfg(feature = "blocking")]
pub mod blocking;
pub mod config;

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
    ("redis", "redis", cfg!(feature = "redis")),
    ("rediss", "redis", cfg!(feature = "redis")),
    ("redis+cluster", "redis", cfg!(feature = "redis")),
    ("rediss+cluster", "redis", cfg!(feature = "redis")),
    ("redis+sentinel", "redis", cfg!(feature = "redis")),
    ("rediss+sentinel", "redis", cfg!(feature = "redis")),
    ("redlock", "redlock", cfg!(feature = "redlock")),
    ("etcd", "etcd", cfg!(feature = "etcd")),
    ("postgres", "postgres", cfg!(feature = "postgres")),
    ("postgresql", "postgres", cfg!(feature = "postgres")),
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
/// | `redis://host:6379/0`, `redis+cluster://h1,h2,h3` | one Redis server, or a Redis Cluster (`lock_redis`); `rediss://`, `rediss+cluster://` over TLS with the `tls` feature | `redis` |
/// | `redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster` | the master that Redis Sentinel names, followed across failovers (`lock_redis::SentinelBackend`); `rediss+sentinel://` over TLS | `redis` |
/// | `etcd://h1:2379,h2:2379,h3:2379` | etcd leases and transactions, revision fencing, FIFO waiting by watch | `etcd` |
/// | `redlock://h1:6379,h2:6379,h3:6379` | Redlock over N independent Redis masters (`lock_redlock`) | `redlock` |
/// | `postgres://user@host/db`, `postgresql://` | a row lock held in an open PostgreSQL transaction (`lock_postgres`) | `postgres` |
///
/// An unknown scheme, or one whose cargo feature is off in this build, is
/// refused with an error that lists the schemes available.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit::Result<()> {
/// let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".into());
/// let locker = lockkit::connect(&url).await?;
/// println!("{} backend", locker.capabilities().backend);
///
/// let refused = lockkit::connect("zk://h:2181").await.unwrap_err();
/// assert!(refused.is_invalid_input()); // names the schemes this build knows
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Locker> {
    Ok(match backend_of(url)? {
        Backend::Memory => Locker::new(MemoryBackend::new()),
        #[cfg(feature = "redis")]
        Backend::Redis => Locker::new(lock_redis::RedisBackend::connect(url).await?),
        #[cfg(feature = "redis")]
        Backend::RedisSentinel => Locker::new(lock_redis::SentinelBackend::connect(url).await?),
        #[cfg(feature = "etcd")]
        Backend::Etcd => Locker::new(lock_etcd::EtcdBackend::connect(url).await?),
        #[cfg(feature = "redlock")]
        Backend::Redlock => Locker::new(lock_redlock::RedlockBackend::connect(url).await?),
        #[cfg(feature = "postgres")]
        Backend::Postgres => Locker::new(lock_postgres::PostgresBackend::connect(url).await?),
    })
}

/// Checks a URL as [`connect`] reads it, without connecting: an unknown
/// scheme, a malformed URL or an unknown option is refused with the error
/// `connect` would give. What only the server can tell (whether it is
/// there, whether it takes the credentials) is left to `connect`.
pub fn check_url(url: &str) -> Result<()> {
    match backend_of(url)? {
        Backend::Memory => Ok(()),
        #[cfg(feature = "redis")]
        Backend::Redis => lock_redis::RedisBackend::check_url(url),
        #[cfg(feature = "redis")]
        Backend::RedisSentinel => lock_redis::RedisBackend::check_url(url),
        #[cfg(feature = "etcd")]
        Backend::Etcd => lock_etcd::EtcdBackend::check_url(url),
        #[cfg(feature = "redlock")]
        Backend::Redlock => lock_redlock::RedlockBackend::check_url(url),
        #[cfg(feature = "postgres")]
        Backend::Postgres => lock_postgres::PostgresBackend::check_url(url),
    }
}

/// The backends of this build, as a URL's scheme names them.
pub(crate) enum Backend {
    Memory,
    #[cfg(feature = "redis")]
    Redis,
    #[cfg(feature = "redis")]
    RedisSentinel,
    #[cfg(feature = "etcd")]
    Etcd,
    #[cfg(feature = "redlock")]
    Redlock,
    #[cfg(feature = "postgres")]
    Postgres,
}

/// The backend the URL's scheme names, if this build has it.
pub(crate) fn backend_of(url: &str) -> Result<Backend> {
    let redacted = url::redact(url);
    let Some((scheme, rest)) = url.split_once("://") else {
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
        // Nothing after the scheme is read: a name or an option would
        // suggest a shared or configured lock space that is not there.
        "memory" if !rest.is_empty() => Err(Error::invalid(
            "url",
            format!(
                "{redacted}: memory:// takes no host, path or options; each connect makes a new, empty lock space"
            ),
        )),
        "memory" => Ok(Backend::Memory),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => Ok(Backend::Redis),
        #[cfg(feature = "redis")]
        "redis+sentinel" | "rediss+sentinel" => Ok(Backend::RedisSentinel),
        #[cfg(feature = "etcd")]
        "etcd" => Ok(Backend::Etcd),
        #[cfg(feature = "redlock")]
        "redlock" => Ok(Backend::Redlock),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Backend::Postgres),
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
    async fn a_memory_url_with_anything_after_the_scheme_is_refused() {
        for url in ["memory://shared", "memory://?ttl=5", "memory:///x"] {
            let err = connect(url).await.unwrap_err();
            assert!(
                err.is_invalid_input() && err.to_string().contains("takes no host"),
                "{url}: {err}"
            );
        }
    }

    /// A password holding an unencoded `?` makes the rest of it read as an
    /// option and the user and the password's first piece as a host and a
    /// port. Such a URL cannot be told from a valid one with an `@` in an
    /// option's value, so no error about it shows its servers, options or
    /// values.
    #[test]
    fn a_password_read_as_options_never_shows_in_errors() {
        #[allow(unused_mut)]
        let mut schemes: Vec<&str> = Vec::new();
        #[cfg(feature = "redis")]
        schemes.extend(["redis", "redis+cluster", "redis+sentinel"]);
        #[cfg(feature = "etcd")]
        schemes.push("etcd");
        #[cfg(feature = "redlock")]
        schemes.push("redlock");
        #[cfg(feature = "postgres")]
        schemes.push("postgres");
        for scheme in schemes {
            // The password is `7?Zk9=Xq`, `7?ca_file=Xq` and so on, or, with
            // an unencoded `/`, `12/cd==Xq`.
            let options = [
                "Zk9",
                "connect_timeout_ms",
                "tls",
                "min_ttl_s",
                "create_schema",
                "ca_file",
            ];
            let urls = options
                .iter()
                .map(|option| format!("{scheme}://app:7?{option}=Xq@db.example:1/0"))
                .chain([format!("{scheme}://app:12/cd==Xq@db.example:1/0")]);
            for url in urls {
                let text = check_url(&url).expect_err(&url).to_string();
                for piece in ["Zk9", "Xq", "7", "12", "cd==", "db.example"] {
                    assert!(!text.contains(piece), "{url}: `{piece}` in {text}");
                }
                assert!(text.contains(&format!("{scheme}://***")), "{url}: {text}");
            }
        }
        // An `@` in a value is no mistake: such a URL is taken, only not shown.
        #[cfg(feature = "etcd")]
        check_url("etcd://h:2379?prefix=team@corp/").expect("an `@` in a value");
    }

    /// A password whose `@host` was forgotten (`redis://default:S3cret`, a
    /// common typo) reads as a host and a port that is no number; the error
    /// shows neither, on every scheme, through every way of reading a URL.
    #[tokio::test]
    async fn a_password_without_its_host_never_shows_in_errors() {
        let mut schemes = vec!["memory"];
        #[cfg(feature = "redis")]
        schemes.extend(["redis", "rediss", "redis+cluster", "redis+sentinel"]);
        #[cfg(feature = "etcd")]
        schemes.push("etcd");
        #[cfg(feature = "redlock")]
        schemes.push("redlock");
        #[cfg(feature = "postgres")]
        schemes.extend(["postgres", "postgresql"]);
        for scheme in schemes {
            let urls = [
                format!("{scheme}://default:S3cret"),
                format!("{scheme}://:S3cret"),
                format!("{scheme}://default:S3cret/0"),
                format!("{scheme}://default:S3cret?tls=true"),
                format!("{scheme}://h1:1,default:S3cret,h2:2"),
                format!("{scheme}://default:S3cret:x"),
                format!("{scheme}://[::1]:S3cret"),
            ];
            for url in urls {
                let shown = url::redact(&url);
                assert!(!shown.contains("S3cret"), "{url}: redacted as {shown}");
                let errors = [
                    check_url(&url).err(),
                    connect(&url).await.err(),
                    url::ServerUrl::parse(&url).err(),
                ];
                for err in errors.into_iter().flatten() {
                    let text = format!("{err} {err:?}");
                    assert!(!text.contains("S3cret"), "{url}: {text}");
                }
            }
        }
    }

    #[tokio::test]
    async fn missing_scheme_is_refused() {
        let err = connect("localhost:6379").await.unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }
}
