//! Mapping etcd client errors into lock-core's kinds, and bounding every
//! request by the request timeout.

use std::future::Future;
use std::time::Duration;

use lock_core::Error;

/// gRPC status codes (stable across gRPC implementations).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
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
    /// `special` may map an error its own way first (a lease that is gone
    /// means a lost lock, not a backend error).
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        timeout: Duration,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
        special: impl FnOnce(&etcd_client::Error) -> Option<Error>,
    ) -> lock_core::Result<T> {
        match tokio::time::timeout(timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(special(&e).unwrap_or_else(|| self.map(what, e))),
            Err(_) => Err(self.unavailable(
                format!("{what}: no answer within the request timeout of {timeout:?} (is a majority of members up?)"),
                None,
            )),
        }
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
