//! [`LockTransaction`]: the open transaction that holds a lock, lent to the
//! holder for writing data in it.

use std::fmt;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use sqlx::postgres::{PgConnection, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Describe, Either, Execute, Executor, Postgres};
use tokio::sync::OwnedMutexGuard;

use crate::pool::Pinned;

/// The open transaction holding a lock, for writing data in it: those
/// writes commit when the lease is released, and only if the session kept
/// the lock all along. If the server ended the holder (idle longer than the
/// TTL, terminated, connection lost), the writes fail or roll back with it,
/// so no other holder can ever see them: fencing for free.
///
/// It is an [`Executor`]: run statements on `&mut tx`.
///
/// ```no_run
/// # async fn demo() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{Locker, Wait};
/// use lock_postgres::{PostgresBackend, sqlx};
///
/// let backend = PostgresBackend::connect("postgres://app@db/app").await?;
/// let locker = Locker::new(backend.clone());
/// let lease = locker.acquire("invoice/42", Duration::from_secs(10), Wait::at_most(Duration::from_secs(5))).await?;
/// {
///     let mut tx = backend.transaction(&lease).await?;
///     sqlx::query("UPDATE invoices SET state = 'sent' WHERE id = 42")
///         .execute(&mut tx)
///         .await
///         .map_err(|e| lock_core::Error::Backend { backend: "postgres", message: e.to_string(), source: None })?;
/// } // drop the guard before releasing or renewing
/// // Release commits the writes. An error here means they did not persist.
/// locker.release(lease).await?;
/// # Ok(()) }
/// ```
///
/// - A failed statement aborts the lock's transaction: release then reports
///   the failure and the lock is freed. To recover from an error and keep
///   the lock, wrap statements in a savepoint: `SAVEPOINT s` first, then
///   `RELEASE SAVEPOINT s`, or `ROLLBACK TO SAVEPOINT s` after an error.
/// - It offers no way to begin, commit or roll back a transaction (on the
///   bare connection, sqlx's `begin()` would send `BEGIN`, and its commit
///   `COMMIT`, ending the lock's own). Never send `COMMIT` or `ROLLBACK`
///   through it either: that ends the lock.
/// - Renewal and release wait while the guard is alive, so keep it short.
pub struct LockTransaction {
    guard: OwnedMutexGuard<Option<Pinned>>,
}

impl LockTransaction {
    /// Lends the pinned connection in `guard`, which must hold one.
    pub(crate) fn new(guard: OwnedMutexGuard<Option<Pinned>>) -> LockTransaction {
        debug_assert!(guard.is_some(), "a LockTransaction needs its connection");
        LockTransaction { guard }
    }

    fn connection(&mut self) -> &mut PgConnection {
        // Checked when the guard was made, and nothing empties the slot while it is locked.
        &mut self
            .guard
            .as_mut()
            .expect("a LockTransaction always holds its connection")
            .conn
    }
}

impl fmt::Debug for LockTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockTransaction").finish_non_exhaustive()
    }
}

/// Statements only, passed to the connection: the connection itself (and
/// with it sqlx's `begin()`) stays out of reach.
impl<'c> Executor<'c> for &'c mut LockTransaction {
    type Database = Postgres;

    fn fetch_many<'e, 'q, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
        'q: 'e,
    {
        self.connection().fetch_many(query)
    }

    fn fetch_optional<'e, 'q, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
        'q: 'e,
    {
        self.connection().fetch_optional(query)
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.connection().prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.connection().describe(sql)
    }
}
