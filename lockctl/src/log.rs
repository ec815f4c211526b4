//! The library's warnings on stderr: a renewal that failed and is retried
//! until the deadline, a Redlock node unreachable at connect. Without them
//! an operator would learn of trouble only when the lock was lost.
//!
//! `LOCKKIT_LOG` sets the level of lockkit's own events: `off`, `error`,
//! `warn` (the default), `info`, `debug` or `trace`; or, for finer control,
//! takes RUST_LOG-style directives (`lock_core=info,lock_redis=debug,warn`),
//! read by tracing-subscriber's `Targets`, which then apply as written. They carry no owner
//! token or password, so no level shows one. The client libraries under
//! the backends (redis, etcd-client, sqlx) are shown at `error` only
//! (`off` silences them too): at lower levels they speak of their own
//! workings (sqlx, for one, warns of any statement slower than a second,
//! which a PostgreSQL wait for a lock is by design).

use std::fmt;
use std::io::IsTerminal;

use tracing::Subscriber;
use tracing::field::Field;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::{self, FormatFields};

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::printable;

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
    let filter = filter(std::env::var(VAR).ok().as_deref())?;
    tracing_subscriber::registry()
        .with(output(std::io::stderr, std::io::stderr().is_terminal()))
        .with(filter)
        .init();
    Ok(())
}

/// The events as lines of text on `writer`, with colours when `ansi`.
fn output<S, W>(writer: W, ansi: bool) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi)
        .fmt_fields(fields())
}

/// The message, then `name=value` for each other field, every value escaped
/// where it could spoof the terminal: a warning may quote a server's
/// message or a key another client wrote. (The formatter's own escaping
/// leaves bidi overrides and line separators, and Display fields, as they are.)
fn fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    format::debug_fn(
        |w: &mut format::Writer<'_>, field: &Field, value: &dyn fmt::Debug| {
            let value = format!("{value:?}");
            let value = printable::text(&value);
            match field.name() {
                "message" => write!(w, "{value}"),
                name => write!(w, "{name}={value}"),
            }
        },
    )
    .delimited(" ")
}

/// The filter `LOCKKIT_LOG` asks for: a level for lockkit's own events
/// (the client libraries below at `error` at most), or directives.
fn filter(var: Option<&str>) -> Result<Targets, String> {
    let Some(text) = var else {
        return Ok(ours_at(LevelFilter::WARN));
    };
    if text.contains(['=', ',']) {
        return text.parse::<Targets>().map_err(|e| {
            format!(
                "{VAR}=`{text}` is neither a level nor directives like lock_core=info,warn: {e}"
            )
        });
    }
    level(text).map(ours_at)
}

fn ours_at(level: LevelFilter) -> Targets {
    let others = level.min(LevelFilter::ERROR);
    OURS.iter()
        .fold(Targets::new().with_default(others), |f, target| {
            f.with_target(*target, level)
        })
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
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Lines written to memory.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A server's text in an event (its error, as a Display field, and in
    /// the message) is escaped where it could spoof the terminal.
    #[test]
    fn server_text_in_an_event_is_escaped() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::registry().with(output(move || writer.clone(), false));
        let from_server = "ERR \u{1b}]0;owned\u{7}\u{202e}\u{2028}forged";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(error = %from_server, "renewal failed: {from_server}");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        for raw in ['\u{1b}', '\u{7}', '\u{202e}', '\u{2028}'] {
            assert!(!text.contains(raw), "{raw:?} printed raw: {text:?}");
        }
        assert!(
            text.contains("renewal failed: ERR \\u{1b}]0;owned\\u{7}\\u{202e}\\u{2028}forged"),
            "{text:?}"
        );
        assert!(
            text.contains("error=ERR \\u{1b}]0;owned\\u{7}\\u{202e}\\u{2028}forged"),
            "{text:?}"
        );
    }

    #[test]
    fn directives_set_each_target_and_bad_ones_are_refused() {
        let f = filter(Some("lock_core=info,lock_redis=debug,warn")).unwrap();
        assert!(f.would_enable("lock_core::locker", &tracing::Level::INFO));
        assert!(!f.would_enable("lock_core::locker", &tracing::Level::DEBUG));
        assert!(f.would_enable("lock_redis", &tracing::Level::DEBUG));
        assert!(f.would_enable("sqlx", &tracing::Level::WARN));
        assert!(!f.would_enable("sqlx", &tracing::Level::INFO));
        let err = filter(Some("lock_core=loud")).unwrap_err();
        assert!(err.contains("`lock_core=loud`"), "{err}");
        let plain = filter(Some("debug")).unwrap();
        assert!(plain.would_enable("lock_etcd", &tracing::Level::DEBUG));
        assert!(!plain.would_enable("etcd_client", &tracing::Level::WARN));
        let default = filter(None).unwrap();
        assert!(default.would_enable("lock_core", &tracing::Level::WARN));
        assert!(!default.would_enable("lock_core", &tracing::Level::INFO));
    }

    proptest::proptest! {
        /// Whatever LOCKKIT_LOG holds, it is read or refused with a message
        /// that quotes it: never a panic.
        #[test]
        fn any_lockkit_log_value_is_read_or_refused(text in "\\PC{0,40}") {
            if let Err(problem) = filter(Some(&text)) {
                proptest::prop_assert!(problem.contains(VAR), "{}", problem);
            }
        }
    }

    #[test]
    fn levels_are_read_in_any_case_and_others_refused() {
        assert_eq!(level("Debug"), Ok(LevelFilter::DEBUG));
        assert_eq!(level("off"), Ok(LevelFilter::OFF));
        let err = level("loud").unwrap_err();
        assert!(err.contains("`loud`") && err.contains("trace"), "{err}");
    }
}
