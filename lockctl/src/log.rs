//! The library's warnings on stderr: a renewal that failed and is retried
//! until the deadline, a Redlock node unreachable at connect. Without them
//! an operator would learn of trouble only when the lock was lost.
//!
//! `LOCKKIT_LOG` sets the level: `off`, `error`, `warn` (the default),
//! `info`, `debug` or `trace`. The library's events carry no owner token or
//! password, so no level shows one.

use std::io::IsTerminal;

use tracing_subscriber::filter::LevelFilter;

/// The environment variable that sets the level.
pub const VAR: &str = "LOCKKIT_LOG";

/// Sends events at the level `LOCKKIT_LOG` names to stderr. An unknown
/// level is refused, naming the ones there are.
pub fn init() -> Result<(), String> {
    let level = match std::env::var(VAR) {
        Err(_) => LevelFilter::WARN,
        Ok(text) => level(&text)?,
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
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
