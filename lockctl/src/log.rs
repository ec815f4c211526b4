//! The library's warnings on stderr: a renewal that failed and is retried
//! until the deadline, a Redlock node unreachable at connect. Without them
//! an operator would learn of trouble only when the lock was lost.
//!
//! `LOCKKIT_LOG` sets the level of lockkit's own events: `off`, `error`,
//! `warn` (the default), `info`, `debug` or `trace`. They carry no owner
//! token or password, so no level shows one. The client libraries under
//! the backends (redis, etcd-client, sqlx) are shown at `error` only
//! (`off` silences them too): at lower levels they speak of their own
//! workings (sqlx, for one, warns of any statement slower than a second,
//! which a PostgreSQL wait for a lock is by design).

use std::io::IsTerminal;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Where lockkit's events come from: the targets that start so (tracing's
/// targets are module paths, matched by prefix).
const OURS: &[&str] = &[
    "lockctl",
    "lockkit",
    "lock_core",
    "lock_redis",
    "lock_redlock",
    "lock_etcd",
    "lock_postgres",
];

/// The environment variable that sets the level.
pub const VAR: &str = "LOCKKIT_LOG";

/// Sends events at the level `LOCKKIT_LOG` names to stderr. An unknown
/// level is refused, naming the ones there are.
pub fn init() -> Result<(), String> {
    let level = match std::env::var(VAR) {
        Err(_) => LevelFilter::WARN,
        Ok(text) => level(&text)?,
    };
    let others = level.min(LevelFilter::ERROR);
    let filter = OURS
        .iter()
        .fold(Targets::new().with_default(others), |f, target| {
            f.with_target(*target, level)
        });
    let output = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    tracing_subscriber::registry()
        .with(output)
        .with(filter)
        .init();
    Ok(())
}

fn level(text: &str) -> Result<LevelFilter, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "off" => Ok(LevelFilter::OFF),
        "error" => Ok(LevelFilter::ERROR),
        "warn" | "" => Ok(LevelFilter::WARN),
        "info" => Ok(LevelFilter::INFO),
        "debug" => Ok(LevelFilter::DEBUG),
        "trace" => Ok(LevelFilter::TRACE),
        _ => Err(format!(
            "{VAR}=`{text}` is not a level; use off, error, warn, info, debug or trace"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_read_in_any_case_and_others_refused() {
        assert_eq!(level("Debug"), Ok(LevelFilter::DEBUG));
        assert_eq!(level("off"), Ok(LevelFilter::OFF));
        let err = level("loud").unwrap_err();
        assert!(err.contains("`loud`") && err.contains("trace"), "{err}");
    }
}
