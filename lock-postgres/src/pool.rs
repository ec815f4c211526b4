//! The connection budget: each held lock pins one connection for as long as
//! it is held; released connections wait here for the next grant.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{Error, Result};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::errors;
use crate::monitor::{Session, Watching};

/// A connection taken out of the budget. Dropping it closes the socket, so
/// the server ends its transaction and frees any row it locked.
pub(crate) struct Pinned {
    pub conn: PgConnection,
    /// Which server session this connection is, for the loss signal.
    pub session: Session,
    /// Set while the connection holds a handed-out lock; dropping it (on
    /// release, or with the connection) stops the loss signal's checks.
    pub watching: Option<Watching>,
    /// True while a statement is in flight; still true at the next use if
    /// that statement's future was dropped, leaving the protocol mid-reply.
    pub busy: bool,
    /// The holder wrote through the lock's transaction, so release commits.
    pub wrote: bool,
    _permit: OwnedSemaphorePermit,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("session", &self.session)
            .field("busy", &self.busy)
            .field("wrote", &self.wrote)
            .finish()
    }
}

pub(crate) struct Connections {
    options: PgConnectOptions,
    pub endpoint: String,
    budget: Arc<Semaphore>,
    max: usize,
    idle: Mutex<Vec<(PgConnection, Session)>>,
    connect_timeout: Duration,
}

impl Connections {
    pub(crate) fn new(
        options: PgConnectOptions,
        endpoint: String,
        max: usize,
        connect_timeout: Duration,
    ) -> Self {
        Connections {
            options,
            endpoint,
            budget: Arc::new(Semaphore::new(max)),
            max,
            idle: Mutex::new(Vec::new()),
            connect_timeout,
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.max
    }

    /// A connection within the budget, or [`Error::LimitReached`] at once.
    /// `fresh` skips idle connections (after one turned out to be dead).
    pub(crate) async fn pin(&self, fresh: bool) -> Result<(Pinned, bool)> {
        let permit = self.budget.clone().try_acquire_owned().map_err(|_| Error::LimitReached {
            what: "locks held (or waited for) at once by this postgres backend, each pinning a connection".into(),
            limit: self.max,
        })?;
        self.pin_with(permit, fresh).await
    }

    /// As [`pin`](Self::pin), but queued first come, first served (tokio's
    /// semaphore is fair) while the budget is used up; `None` if no
    /// connection came free before `until`.
    pub(crate) async fn pin_by(
        &self,
        fresh: bool,
        until: Instant,
    ) -> Result<Option<(Pinned, bool)>> {
        match tokio::time::timeout_at(until, self.budget.clone().acquire_owned()).await {
            // The semaphore is never closed.
            Ok(Ok(permit)) => self.pin_with(permit, fresh).await.map(Some),
            Ok(Err(_)) | Err(_) => Ok(None),
        }
    }

    async fn pin_with(&self, permit: OwnedSemaphorePermit, fresh: bool) -> Result<(Pinned, bool)> {
        let idle = if fresh {
            None
        } else {
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
        };
        let ((conn, session), reused) = match idle {
            Some(idle) => (idle, true),
            None => (self.open_session().await?, false),
        };
        Ok((
            Pinned {
                conn,
                session,
                watching: None,
                busy: false,
                wrote: false,
                _permit: permit,
            },
            reused,
        ))
    }

    /// Opens a new connection and learns its session, within the connect timeout.
    async fn open_session(&self) -> Result<(PgConnection, Session)> {
        let open = async {
            let mut conn = self.options.connect().await?;
            let session = Session::of(&mut conn).await?;
            Ok::<_, sqlx::Error>((conn, session))
        };
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(Ok(opened)) => Ok(opened),
            Ok(Err(e)) => Err(errors::connect(&self.endpoint, e)),
            Err(_) => Err(errors::timed_out(&self.endpoint, "the connection attempt")),
        }
    }

    /// Opens a new connection within the connect timeout.
    pub(crate) async fn open(&self) -> Result<PgConnection> {
        match tokio::time::timeout(self.connect_timeout, self.options.connect()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(errors::connect(&self.endpoint, e)),
            Err(_) => Err(errors::timed_out(&self.endpoint, "the connection attempt")),
        }
    }

    /// Puts a connection that is outside any transaction back for reuse;
    /// the permit is returned after it, so the next grant finds it.
    pub(crate) fn give_back(&self, pinned: Pinned) {
        let Pinned {
            conn,
            session,
            busy,
            _permit,
            ..
        } = pinned;
        if !busy {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((conn, session));
        }
        drop(_permit);
    }

    /// Ends the open transaction with ROLLBACK and keeps the connection, or
    /// drops it (which ends the transaction too) if that fails.
    pub(crate) async fn roll_back_and_give_back(&self, mut pinned: Pinned, timeout: Duration) {
        pinned.busy = true;
        if let Ok(Ok(_)) =
            tokio::time::timeout(timeout, crate::simple(&mut pinned.conn, "ROLLBACK")).await
        {
            pinned.busy = false;
            self.give_back(pinned);
        }
    }

    /// Closes idle connections (they are reopened on demand).
    pub(crate) async fn close_idle(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        for (conn, _) in idle {
            let _ = conn.close().await;
        }
    }
}
