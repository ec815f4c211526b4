//! sqlx errors mapped into lock_core's kinds.

use lock_core::{Error, LostReason};

pub(crate) const BACKEND: &str = "postgres";

/// The SQLSTATE of a database error, if it is one.
fn code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// 55P03 lock_not_available: NOWAIT refused, or `lock_timeout` ran out.
pub(crate) fn is_lock_not_available(e: &sqlx::Error) -> bool {
    code(e).as_deref() == Some("55P03")
}

/// 57014 query_canceled: here, `statement_timeout` ended a grant's wait.
pub(crate) fn is_statement_timeout(e: &sqlx::Error) -> bool {
    code(e).as_deref() == Some("57014")
}

/// The session is gone or unusable: socket errors, class 08 (connection
/// exception), 57P0x (terminated by an administrator, server shutdown) and
/// 25P03 (ended by `idle_in_transaction_session_timeout`).
pub(crate) fn is_connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        _ => code(e).is_some_and(|c| c.starts_with("08") || c.starts_with("57P0") || c == "25P03"),
    }
}

/// Lost because of `e`: the connection died, or the transaction became unusable.
pub(crate) fn lost(key: &str, e: &sqlx::Error) -> Error {
    let reason = if is_connection_lost(e) {
        LostReason::ConnectionLost
    } else {
        LostReason::NotHeld
    };
    Error::lost(key, reason)
}

/// A failure to open or use a pooled connection.
pub(crate) fn connect(endpoint: &str, e: sqlx::Error) -> Error {
    match code(&e).as_deref() {
        Some("28P01" | "28000") => Error::Auth {
            backend: BACKEND,
            endpoint: endpoint.to_owned(),
            reason: e
                .as_database_error()
                .map(|d| d.message().to_owned())
                .unwrap_or_default(),
        },
        Some(c) if !c.starts_with("08") && !c.starts_with("57P") => backend("statement failed", e),
        _ => Error::Unavailable {
            backend: BACKEND,
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
            source: Some(Box::new(e)),
        },
    }
}

/// No reply in time.
pub(crate) fn timed_out(endpoint: &str, what: &str) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        endpoint: endpoint.to_owned(),
        reason: format!("no reply to {what} in time"),
        source: None,
    }
}

pub(crate) fn backend(message: &str, e: sqlx::Error) -> Error {
    Error::Backend {
        backend: BACKEND,
        message: format!("{message}: {e}"),
        source: Some(Box::new(e)),
    }
}
