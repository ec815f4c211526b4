//! Mapping etcd client errors into lock-core's kinds, and bounding every
//! request by the response timeout.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use lock_core::Error;

/// gRPC status codes (stable across gRPC implementations).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// True for the messages of a connection that broke under a request.
fn is_broken_connection(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "transport",
        "connection",
        "broken pipe",
        "h2 protocol",
        "stream",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// Where the cluster is, for error messages (never with a password).
#[derive(Debug, Clone)]
pub(crate) struct Endpoint(pub String);

impl Endpoint {
    pub(crate) fn unavailable(
        &self,
        reason: impl Into<String>,
        source: Option<etcd_client::Error>,
    ) -> Error {
        Error::Unavailable {
            backend: "etcd",
            endpoint: self.0.clone(),
            reason: reason.into(),
            source: source.map(|e| Box::new(e) as lock_core::BoxError),
        }
    }

    /// Maps a client error from the request `what`.
    pub(crate) fn map(&self, what: &str, e: etcd_client::Error) -> Error {
        use etcd_client::Error as E;
        match &e {
            E::GRpcStatus(status) => {
                let message = status.message().to_owned();
                match i32::from(status.code()) {
                    code::UNAVAILABLE | code::DEADLINE_EXCEEDED | code::CANCELLED => {
                        self.unavailable(format!("{what}: {message}"), Some(e))
                    }
                    // A connection that broke mid-request (a member killed,
                    // say) surfaces as an unknown or internal status: the
                    // request may not have been applied, and another member
                    // may take the retry.
                    code::UNKNOWN | code::INTERNAL if is_broken_connection(&message) => {
                        self.unavailable(format!("{what}: {message}"), Some(e))
                    }
                    code::UNAUTHENTICATED | code::PERMISSION_DENIED => self.auth(what, &message),
                    code::INVALID_ARGUMENT | code::FAILED_PRECONDITION
                        if message.contains("auth") =>
                    {
                        self.auth(what, &message)
                    }
                    _ => Error::Backend {
                        backend: "etcd",
                        message: format!("{what}: {message}"),
                        source: Some(Box::new(e)),
                    },
                }
            }
            E::TransportError(_) | E::IoError(_) => {
                self.unavailable(format!("{what}: {e}"), Some(e))
            }
            _ => Error::Backend {
                backend: "etcd",
                message: format!("{what}: {e}"),
                source: Some(Box::new(e)),
            },
        }
    }

    fn auth(&self, what: &str, message: &str) -> Error {
        Error::Auth {
            backend: "etcd",
            endpoint: self.0.clone(),
            reason: format!("{what}: {message}"),
        }
    }

    /// Runs one request, bounded by `timeout`: a cluster without a quorum
    /// does not answer writes at all, and a paused member not even reads.
    /// A request that provably never reached a member (connection refused,
    /// "no leader") is retried within that time: the client spreads requests
    /// over all endpoints, dead ones included.
    /// `special` may map an error its own way first (a lease that is gone
    /// means a lost lock, not a backend error).
    pub(crate) async fn bounded<T, F>(
        &self,
        what: &str,
        timeout: Duration,
        mut request: impl FnMut() -> F,
        special: impl FnOnce(&etcd_client::Error) -> Option<Error>,
    ) -> lock_core::Result<T>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = deadline_in(timeout);
        let mut last: Option<etcd_client::Error> = None;
        loop {
            match tokio::time::timeout_at(deadline, request()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if never_sent(&e) && Instant::now() + RETRY_PAUSE < deadline => {
                    last = Some(e);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e)) => return Err(special(&e).unwrap_or_else(|| self.map(what, e))),
                Err(_) => {
                    let reason = format!(
                        "{what}: no answer within the response timeout of {timeout:?} (is a majority of members up?)"
                    );
                    return Err(self.unavailable(reason, last));
                }
            }
        }
    }
}

/// `timeout` from now; a timeout past what the clock can count (a
/// `Duration::MAX` meaning "no limit") ends about 30 years from now, as in tokio.
pub(crate) fn deadline_in(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// How far away a deadline of "no limit" is.
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// Pause between retries of a request that never reached a member.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// True for errors that prove the request was not processed: the
/// connection could not be made, or the member has no leader (it refuses
/// before proposing anything). Retrying those is safe for any request.
fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) if i32::from(s.code()) == code::UNAVAILABLE => {
            if s.message().contains("no leader") || s.message().contains("connect error") {
                return true;
            }
            let mut source = std::error::Error::source(s);
            while let Some(cause) = source {
                if cause.to_string().contains("connect error") {
                    return true;
                }
                source = cause.source();
            }
            false
        }
        _ => false,
    }
}

/// True when etcd says the lease does not exist (expired or revoked).
pub(crate) fn is_lease_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            i32::from(s.code()) == code::NOT_FOUND || s.message().contains("lease not found")
        }
        // The client's own keep-alive check: a TTL of 0 or less in the reply.
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        _ => false,
    }
}

/// True when etcd says the revision asked for was compacted away.
pub(crate) fn is_compacted(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if i32::from(s.code()) == code::OUT_OF_RANGE && s.message().contains("compacted"))
}
