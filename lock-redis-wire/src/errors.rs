//! Redis client errors as [`lock_core::Error`] kinds.

use std::time::Duration;

use lock_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Maps a client error from the server at `endpoint` (already without
/// password) to the contract's error kinds:
/// - refused credentials (`WRONGPASS`, `NOAUTH`, ...) → [`Error::Auth`];
/// - I/O errors, timeouts, a closed connection, a cluster that is down,
///   loading or failing over → [`Error::Unavailable`] (nothing was granted,
///   or the grant lapses with its TTL);
/// - anything else → [`Error::Backend`], keeping the client error as source.
pub fn map_error(backend: &'static str, endpoint: &str, err: RedisError) -> Error {
    let code = err.code().unwrap_or_default().to_owned();
    if err.kind() == ErrorKind::AuthenticationFailed
        || matches!(code.as_str(), "WRONGPASS" | "NOAUTH")
    {
        let reason = err.detail().map_or_else(
            || err.to_string(),
            |d| format!("{code} {d}").trim().to_owned(),
        );
        return Error::Auth {
            backend,
            endpoint: endpoint.to_owned(),
            reason,
        };
    }
    let unavailable = err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(
            err.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::MasterDown
                        // A replica refuses writes: a failover moved the
                        // master away, and nothing was written here.
                        | ServerErrorKind::ReadOnly
                )
        )
        || code == "READONLY";
    if unavailable {
        return Error::Unavailable {
            backend,
            endpoint: endpoint.to_owned(),
            reason: err.to_string(),
            source: Some(Box::new(err)),
        };
    }
    Error::Backend {
        backend,
        message: format!("{endpoint}: {}", describe(&err)),
        source: Some(Box::new(err)),
    }
}

/// The client error's text, with what it means where the text does not say.
///
/// Every command the backends send is valid on Redis 7.0 and later, so a
/// syntax error from the server means an older one (Redis 6.2 refuses
/// `SET ... NX ... GET`, which the lock scripts run): the text says so,
/// rather than leave the user to decode a script's error.
pub fn describe(err: &RedisError) -> String {
    let text = err.to_string();
    if text.contains("syntax error") {
        format!(
            "{text}; the server refused the syntax of a lock script's command: lockkit needs Redis 7.0 or newer"
        )
    } else {
        text
    }
}

/// The error for a server that did not answer within `after`.
pub fn timed_out(backend: &'static str, endpoint: &str, what: &str, after: Duration) -> Error {
    Error::Unavailable {
        backend,
        endpoint: endpoint.to_owned(),
        reason: format!("no {what} within {after:?}"),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        let e = map_error("redis", "redis://h:1", io);
        assert!(
            e.is_unavailable() && e.to_string().contains("redis://h:1"),
            "{e}"
        );
        let auth = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert!(matches!(
            map_error("redis", "redis://h:1", auth),
            Error::Auth { .. }
        ));
        let other = RedisError::from((ErrorKind::UnexpectedReturnType, "odd reply"));
        assert!(matches!(
            map_error("redis", "redis://h:1", other),
            Error::Backend { .. }
        ));
        // How Redis 6.2 answers the lock script's `SET ... NX ... GET`,
        // in a call of one operation and as one operation of many.
        let older = [
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                "syntax error script: 4f1c, on @user_script:95.".to_owned(),
            )),
            RedisError::from((
                ErrorKind::Extension,
                "a lock operation failed in the batch script",
                "ERR syntax error script: 4f1c, on @user_script:95.".to_owned(),
            )),
        ];
        for err in older {
            let e = map_error("redis", "redis://h:1", err);
            assert!(
                matches!(e, Error::Backend { .. }) && e.to_string().contains("Redis 7.0 or newer"),
                "{e}"
            );
        }
        assert!(
            timed_out(
                "redis",
                "redis://h:1",
                "connection",
                Duration::from_millis(5)
            )
            .is_unavailable()
        );
    }
}
