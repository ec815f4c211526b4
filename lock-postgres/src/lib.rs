#![doc = include_str!("../README.md")]

mod config;
mod errors;
mod fence;
mod flush;
mod monitor;
mod permits;
mod pool;
mod readers;
mod sql;
mod transaction;

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{Grant, LossFuture, Waiting, async_trait};
use lock_core::{
    Assumption, Capabilities, Error, FencingGuarantee, FencingToken, Lease, Limits, LockBackend,
    LockKey, LostReason, Mode, Offer, OwnerToken, Result, SafetyModel, WaitingOrder, WakeUp,
};
use sqlx::postgres::{PgConnection, PgQueryResult};
use tokio::sync::{Mutex, watch};
use tokio::time::{Instant, timeout};

pub(crate) type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use config::PostgresOptions;
pub use fence::FenceTable;
pub use sql::SCHEMA_SQL;
/// The driver, re-exported so that code using [`LockTransaction`] or
/// [`FenceTable`] names the same version.
pub use sqlx;
pub use transaction::LockTransaction;

use flush::Flusher;
use monitor::Monitor;
use pool::{Connections, Pinned};
use sql::{Statements, millis};

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// The shortest TTL accepted. Once a lock is granted, the TTL is the
/// session's `idle_in_transaction_session_timeout`, whose clock runs between
/// renewals, so it must exceed the client's round trips plus scheduling
/// hiccups by a wide margin: below about 100 ms, a busy client would see
/// healthy holders ended by the server.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// Locks held as row locks inside open PostgreSQL transactions.
///
/// Each held lock pins one connection whose transaction has locked the
/// lock's row with `SELECT ... FOR UPDATE`; the server frees the row when
/// that transaction ends: on release, when the connection closes or dies,
/// or when the holder stays idle longer than the TTL
/// (`idle_in_transaction_session_timeout`). Clones share the connections
/// and the budget. While locks are held, one task checks that their
/// sessions still exist, so that a guard learns of a session the server
/// ended within a quarter of a second, not at its next renewal.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conns: Connections,
    /// Makes each grant's fencing token durable before it is handed out.
    flusher: Flusher,
    /// Tells held locks' guards when the server ended their session.
    monitor: Monitor,
    statements: Statements,
    capabilities: Capabilities,
    response_timeout: Duration,
    /// PostgreSQL 14+: `client_connection_check_interval`, timed `pg_terminate_backend`.
    modern: bool,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("endpoint", &self.inner.conns.endpoint)
            .field("max_held_locks", &self.inner.conns.limit())
            .finish_non_exhaustive()
    }
}

/// What a lease keeps: the connection whose open transaction holds the row.
struct HeldLock {
    slot: Arc<Mutex<Option<Pinned>>>,
    /// Turns to `Some` when the monitor finds the session gone.
    lost: watch::Receiver<Option<LostReason>>,
}

/// How early a cancelled statement may end before its wait's end and still
/// be that wait's `statement_timeout`: the server's timer starts after the
/// client computed the wait, so it fires a little after, never this early.
const WAIT_END_SLACK: Duration = Duration::from_millis(50);

impl PostgresBackend {
    /// Checks a URL as [`connect`](Self::connect) reads it, without
    /// connecting: a malformed URL or an unknown option is refused the same.
    pub fn check_url(url: &str) -> Result<()> {
        PostgresOptions::from_url(url).map(drop)
    }

    /// Connects with the settings of a `postgres://` or `postgresql://` URL
    /// (see [`PostgresOptions::from_url`]) and creates the schema if missing.
    ///
    /// ```no_run
    /// # async fn demo() -> lock_core::Result<()> {
    /// use lock_core::Locker;
    /// use lock_postgres::PostgresBackend;
    ///
    /// let locker = Locker::new(PostgresBackend::connect("postgres://locks@db.internal/app?max_held_locks=64").await?);
    /// # let _ = locker; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<PostgresBackend> {
        Self::connect_with(PostgresOptions::from_url(url)?).await
    }

    /// Connects with explicit options. Their values are checked first, as
    /// [`PostgresOptions::check`] does: a bad one is refused with
    /// [`Error::InvalidInput`] naming its URL option, before any connection
    /// is opened.
    pub async fn connect_with(options: PostgresOptions) -> Result<PostgresBackend> {
        options.check()?;
        // A session-wide lock_timeout keeps the autocommit statements from
        // hanging behind a lock held by something else (a migration, say).
        let lock_timeout = millis(options.response_timeout).to_string();
        let connect = options
            .connect
            .clone()
            .options([("lock_timeout", lock_timeout.as_str())]);
        let monitor = Monitor::new(
            connect.clone(),
            options.endpoint.clone(),
            options.connect_timeout,
            options.response_timeout,
        );
        let conns = Connections::new(
            connect,
            options.endpoint.clone(),
            options.max_held_locks,
            options.connect_timeout,
        );
        let statements = Statements::new(&options.names);
        let (mut first, _) = conns.pin(true).await?;
        let modern = first
            .conn
            .server_version_num()
            .is_some_and(|v| v >= 140_000);
        let exists = sqlx::query_scalar::<_, bool>(statements.exists)
            .bind(options.names.table())
            .bind(options.names.sequence())
            .bind(options.names.permits());
        let present = within(
            options.response_timeout,
            &conns.endpoint,
            "the schema check",
            Box::pin(exists.fetch_one(&mut first.conn)),
        )
        .await?
        .map_err(|e| errors::connect(&conns.endpoint, e))?;
        if !present {
            if !options.create_schema {
                return Err(Error::Backend {
                    backend: errors::BACKEND,
                    message: format!(
                        "table {}, table {} or sequence {} is missing and create_schema is off; run PostgresOptions::schema_sql() first",
                        options.names.table(),
                        options.names.permits(),
                        options.names.sequence()
                    ),
                    source: None,
                });
            }
            within(
                options.response_timeout,
                &conns.endpoint,
                "creating the schema",
                simple(&mut first.conn, &statements.create),
            )
            .await?
            .map_err(|e| errors::backend("creating the schema failed", e))?;
        }
        // Tokens must strictly increase across sessions and crashes.
        let settings = sqlx::query_as::<_, sql::SequenceRow>(statements.sequence)
            .bind(options.names.schema())
            .bind(options.names.sequence_name());
        let settings = within(
            options.response_timeout,
            &conns.endpoint,
            "the sequence check",
            Box::pin(settings.fetch_optional(&mut first.conn)),
        )
        .await?
        .map_err(|e| errors::connect(&conns.endpoint, e))?;
        let settings = settings.map(sql::SequenceSettings::from);
        if let Some(message) = sql::sequence_problem(&options.names.sequence(), settings) {
            return Err(Error::Backend {
                backend: errors::BACKEND,
                message,
                source: None,
            });
        }
        conns.give_back(first);
        let capabilities = Capabilities::new(errors::BACKEND, SafetyModel::AcidTransaction)
            // Readers poll (lock-core's wait in a mode); a waiting writer queues in the server.
            .with_read_write(Offer::Offered {
                waiting_order: WaitingOrder::Unordered,
            })
            .with_fencing(FencingGuarantee::Strict, [Assumption::DurableDatabase])
            .with_wake_up(WakeUp::ServerBlocking)
            .with_lock_outlives_connection(false)
            .with_tolerated_server_failures(0)
            .with_remaining_ttl(false)
            .with_limits(Limits {
                min_ttl: MIN_TTL,
                ..Limits::default()
            })
            // Permit takers poll (lock-core's wait in a mode): whoever asks first once a slot frees.
            .with_semaphore(Offer::Offered {
                waiting_order: WaitingOrder::Unordered,
            });
        let inner = Inner {
            conns,
            flusher: Flusher::new(settings.map_or(0, |s| s.increment)),
            monitor,
            statements,
            capabilities,
            response_timeout: options.response_timeout,
            modern,
        };
        Ok(PostgresBackend {
            inner: Arc::new(inner),
        })
    }

    /// The open transaction that holds `lease`'s lock, for writing data
    /// atomically with holding it. See [`LockTransaction`].
    pub async fn transaction(&self, lease: &Lease) -> Result<LockTransaction> {
        let key = lease.key().as_str();
        let held = held(lease)?;
        let mut guard = held.slot.clone().lock_owned().await;
        match guard.as_mut() {
            Some(pinned) if !pinned.busy => pinned.wrote = true,
            _ => return Err(Error::lost(key, LostReason::NotHeld)),
        }
        Ok(LockTransaction::new(guard))
    }

    /// The server process id of the session holding `key` exclusively (the
    /// writer), if any: an operator's view of who holds what (it uses a
    /// connection of the budget). A key held by readers or permit holders
    /// has no single holder: `None`.
    pub async fn holder_pid(&self, key: &str) -> Result<Option<i32>> {
        self.on_pool_connection(
            "looking up the holder",
            &self.inner.statements.holder_pid,
            key,
        )
        .await
    }

    async fn on_pool_connection<T>(&self, what: &str, sql: &str, key: &str) -> Result<Option<T>>
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        Ok(self
            .all_on_pool_connection(what, sql, key)
            .await?
            .into_iter()
            .next())
    }

    /// Runs a one-parameter query on a connection of the budget, outside any lock.
    async fn all_on_pool_connection<T>(&self, what: &str, sql: &str, key: &str) -> Result<Vec<T>>
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        let inner = &*self.inner;
        let (mut pinned, _) = inner.conns.pin(false).await?;
        let query = sqlx::query_scalar::<_, T>(sql)
            .bind(key)
            .fetch_all(&mut pinned.conn);
        let values = within(
            inner.response_timeout,
            &inner.conns.endpoint,
            what,
            Box::pin(query),
        )
        .await?
        .map_err(|e| errors::connect(&inner.conns.endpoint, e))?;
        inner.conns.give_back(pinned);
        Ok(values)
    }

    /// Closes the idle connections kept for the next grants, and the loss
    /// signal's connection if no lock is held. Held locks are not affected.
    pub async fn close_idle(&self) {
        self.inner.conns.close_idle().await;
        self.inner.monitor.close_idle().await;
    }

    /// One grant: the row exists (autocommit), then the lock's transaction
    /// locks it, waiting in the server until `until` or not at all, and
    /// draws the token; the token is flushed to disk before the grant
    /// returns. A grant that waits queues for a connection first while the
    /// budget is used up, and times out if none comes in time.
    async fn grant(&self, key: &LockKey, ttl: Duration, until: Option<Instant>) -> Result<Grant> {
        let inner = &*self.inner;
        let (rt, endpoint) = (inner.response_timeout, inner.conns.endpoint.as_str());
        let mut fresh = false;
        let mut vanished = 0;
        // Rows stay once inserted, so the lock statement comes first and finds
        // the row but for a lock's first grant.
        let mut missing = false;
        loop {
            let (mut pinned, reused) = match until {
                None => inner.conns.pin(fresh).await?,
                Some(until) => match inner.conns.pin_by(fresh, until).await? {
                    Some(pinned) => pinned,
                    None => {
                        return Err(Error::TimedOut {
                            key: key.to_string(),
                            waited: Duration::ZERO,
                        });
                    }
                },
            };
            // What is left of the wait once a connection is ours; too little to wait on is one try.
            let wait = until
                .map(|until| until.saturating_duration_since(Instant::now()))
                .filter(|left| *left >= Duration::from_millis(1));
            let conn = &mut pinned.conn;
            if missing {
                // The row goes in first, in a statement of its own (autocommit): inside
                // the lock's transaction, a second contender's insert would wait for the
                // first one's transaction instead of being refused at once.
                let insert = sqlx::query(&inner.statements.insert)
                    .bind(key.as_str())
                    .execute(&mut *conn);
                match within(rt, endpoint, "the row insert", Box::pin(insert)).await? {
                    Ok(_) => {}
                    // An idle connection may have died since its last use: retry once on a new one.
                    Err(e) if reused && !fresh && errors::is_connection_lost(&e) => {
                        fresh = true;
                        continue;
                    }
                    Err(e) => return Err(errors::connect(endpoint, e)),
                }
            }
            let idle = sql::grant_idle_timeout(ttl, rt);
            // Without a wait, the lock statement sets the transaction up itself.
            let begin = match wait {
                Some(wait) => sql::begin(idle, wait, inner.modern).into(),
                None => std::borrow::Cow::Borrowed("BEGIN"),
            };
            match within(rt, endpoint, "BEGIN", simple(&mut *conn, &begin)).await? {
                Ok(_) => {}
                Err(e) if reused && !fresh && !missing && errors::is_connection_lost(&e) => {
                    fresh = true;
                    continue;
                }
                Err(e) => return Err(errors::connect(endpoint, e)),
            }
            let (statement, flushed_bound) = if wait.is_some() {
                // The server queues this request while the row is held.
                tracing::debug!(target: lock_core::WAITING_EVENT_TARGET, key = %key, "waiting");
                // After a wait, the TTL clock restarts with the last statement below.
                (&inner.statements.lock_wait, 0)
            } else {
                (&inner.statements.lock_nowait, inner.flusher.flushed_bound())
            };
            let sent = Instant::now();
            let mut lock = sqlx::query_as::<_, (i64, Option<i64>, Option<bool>)>(statement)
                .bind(key.as_str())
                .bind(millis(ttl).to_string())
                .bind(millis(rt).to_string())
                .bind(flushed_bound);
            if wait.is_none() {
                lock = lock.bind(millis(idle).to_string());
            }
            let lock = lock.fetch_optional(&mut *conn);
            match within(
                rt.saturating_add(wait.unwrap_or_default()),
                endpoint,
                "the row lock",
                Box::pin(lock),
            )
            .await?
            {
                Ok(Some((token, logged, done))) => {
                    let sent = match (done, wait) {
                        // The token is already on disk, and the statement set the TTL
                        // clock: the server starts it when the reply leaves, after `sent`.
                        (Some(true), _) => sent,
                        (Some(false), Some(_)) => {
                            return Err(Error::lost(key.as_str(), LostReason::NotHeld));
                        }
                        _ => {
                            if let Err(e) = self.flush_token(logged).await {
                                inner.conns.roll_back_and_give_back(pinned, rt).await;
                                return Err(e);
                            }
                            self.refresh(&mut pinned.conn, key, ttl).await?
                        }
                    };
                    return Ok(self.hand_out(pinned, token, ttl, sent));
                }
                // No row: inserted first on the next round. A row deleted again
                // between the insert and the lock goes in again, a few times.
                Ok(None) if vanished < 3 => {
                    vanished += usize::from(missing);
                    missing = true;
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                }
                Ok(None) => {
                    return Err(Error::Backend {
                        backend: errors::BACKEND,
                        message: format!(
                            "the row of lock `{key}` keeps disappearing; is something deleting rows?"
                        ),
                        source: None,
                    });
                }
                // Permit holders share-lock the row: then the key is a semaphore's. A wait
                // ends with lock_timeout, or statement_timeout when it waited twice (the
                // readers' gate, then the row). A cancel (57014 too) before the wait's
                // end is someone else's, an operator's say: an error, below.
                Err(e)
                    if errors::is_lock_not_available(&e)
                        || (errors::is_statement_timeout(&e)
                            && until
                                .is_some_and(|until| Instant::now() + WAIT_END_SLACK >= until)) =>
                {
                    return Err(self.refusal(pinned, key, Mode::Exclusive).await);
                }
                Err(e) => return Err(errors::connect(endpoint, e)),
            }
        }
    }
}

impl PostgresBackend {
    /// Makes a token drawn in a grant's transaction durable before it is
    /// handed out, unless a flush already covered its logged bound.
    ///
    /// The token was drawn by `nextval` in the holder's transaction, after the
    /// row lock, so tokens follow the order in which grants lock the row; drawn
    /// anywhere else (in the flush below, say), a grant that locked the row later
    /// could draw a smaller token. But that transaction never commits, so nothing
    /// has flushed the sequence's WAL record: a crash now could recover the
    /// sequence to an older value and hand the token out again. The flush commits,
    /// on another connection, a transaction whose commit record follows the token's
    /// record in the WAL, and waits until it is on disk.
    /// (After a wait, a flush since may already have covered it.)
    async fn flush_token(&self, logged: Option<i64>) -> Result<()> {
        let inner = &*self.inner;
        if logged.is_none_or(|logged| logged > inner.flusher.flushed_bound()) {
            let budget = flush::budget(inner.response_timeout);
            inner
                .flusher
                .flush(&inner.conns, &inner.statements.flush, budget)
                .await?;
            inner.flusher.flushed_through(logged);
        }
        Ok(())
    }

    /// One more statement in the holder's transaction, which drew the token: its
    /// reply proves no crash came between the token and the flush (a crash ends
    /// every session), so the flush was of the same WAL. It also sets the
    /// server's TTL clock (the session's idle timer) to the TTL, from a known
    /// instant: after the flush, and after any wait in the server's queue.
    /// Returns when it was sent, where the deadline starts.
    async fn refresh(
        &self,
        conn: &mut PgConnection,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Instant> {
        let (rt, endpoint) = (
            self.inner.response_timeout,
            self.inner.conns.endpoint.as_str(),
        );
        let sent = Instant::now();
        let refresh = sqlx::query_scalar::<_, Option<bool>>(&self.inner.statements.refresh)
            .bind(millis(ttl).to_string())
            .bind(millis(rt).to_string())
            .fetch_one(conn);
        match within(rt, endpoint, "the TTL refresh", Box::pin(refresh)).await? {
            Ok(Some(true)) => Ok(sent),
            Ok(_) => Err(Error::lost(key.as_str(), LostReason::NotHeld)),
            Err(e) => Err(errors::connect(endpoint, e)),
        }
    }

    /// The grant of a connection whose open transaction now holds a lock
    /// (or a permit) with `token`: the monitor watches its session.
    fn hand_out(&self, mut pinned: Pinned, token: i64, ttl: Duration, sent: Instant) -> Grant {
        let token = FencingToken::new(u64::try_from(token).unwrap_or(0));
        let (watching, lost) = self.inner.monitor.watch(pinned.session, ttl);
        pinned.watching = Some(watching);
        let state: Arc<dyn Any + Send + Sync> = Arc::new(HeldLock {
            slot: Arc::new(Mutex::new(Some(pinned))),
            lost,
        });
        Grant::new(token).sent_at(sent).with_state(state)
    }
}

/// Runs `sql` (one or more statements, no parameters) in one round trip.
pub(crate) fn simple<'c>(
    conn: &'c mut PgConnection,
    sql: &'c str,
) -> BoxFuture<'c, Result<PgQueryResult, sqlx::Error>> {
    use sqlx::Executor;
    conn.execute(sqlx::raw_sql(sql))
}

/// Awaits `fut` for at most `limit`; the error names what had no reply.
async fn within<'a, T>(
    limit: Duration,
    endpoint: &str,
    what: &str,
    fut: BoxFuture<'a, T>,
) -> Result<T> {
    timeout(limit, fut)
        .await
        .map_err(|_| errors::timed_out(endpoint, what))
}

fn held(lease: &Lease) -> Result<&HeldLock> {
    lease
        .state()
        .and_then(|s| (**s).downcast_ref::<HeldLock>())
        .ok_or_else(|| Error::lost(lease.key().as_str(), LostReason::NotHeld))
}

#[async_trait]
impl LockBackend for PostgresBackend {
    /// Besides what [`Capabilities`] lists: the loss signal. A guard's
    /// `lost()` fires within 250 ms (a quarter of the shortest TTL held, at
    /// least 25 ms, if shorter) plus a round trip after the server ends the
    /// holder's session, long before the next renewal. It costs, per
    /// backend and only while locks are held, one query on
    /// `pg_stat_activity` per check (4 a second, at most 40) on one more
    /// connection; see the README.
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// Closes the idle connections kept for the next grants.
    async fn close_idle(&self) {
        PostgresBackend::close_idle(self).await
    }

    /// Completes when the monitor finds the session holding `lease` gone
    /// (terminated, the server restarted or down, ended by the idle
    /// timeout): within 250 ms (less for TTLs under a second) plus a round
    /// trip, long before the next renewal.
    fn loss_signal(&self, lease: &Lease) -> Option<LossFuture> {
        let mut lost = held(lease).ok()?.lost.clone();
        Some(Box::pin(async move {
            let found = lost.wait_for(Option::is_some).await.map(|reason| *reason);
            match found {
                Ok(reason) => reason.unwrap_or(LostReason::ConnectionLost),
                // Released, or dropped after a failed renewal, which reports the loss itself.
                Err(_) => std::future::pending().await,
            }
        }))
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        _owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Grant> {
        self.grant(key, ttl, None).await
    }

    /// An exclusive lock as [`try_acquire`](Self::try_acquire) takes it, a
    /// permit of a semaphore, or a read hold (see the README's sections on
    /// semaphores and read-write locks).
    async fn try_acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
    ) -> Result<Grant> {
        match mode {
            Mode::Semaphore { permits } => self.permit(key, ttl, permits).await,
            Mode::Shared => self.read(key, ttl).await,
            _ => self.try_acquire(key, owner, ttl).await,
        }
    }

    /// Waits in the server: `SELECT ... FOR UPDATE` without NOWAIT, with
    /// `lock_timeout` set to the time left; the statement that follows the
    /// token's flush restarts the server's TTL clock, and its send time starts
    /// the deadline. The server queues waiters and
    /// wakes exactly the next one when the holder's transaction ends, so
    /// there is no herd and no polling delay; LISTEN/NOTIFY would wake every
    /// waiter to race for the row and still need polling for holders ended
    /// by the server, which send no notification. While every connection of
    /// the budget is pinned, the waiter first queues for one, first come,
    /// first served, within the same wait. Before the row, it queues for the
    /// key's readers' gate, so that new readers are refused while it waits
    /// (see the README's section on read-write locks).
    async fn acquire(
        &self,
        key: &LockKey,
        _owner: &OwnerToken,
        ttl: Duration,
        wait: &Waiting,
    ) -> Result<Grant> {
        let mut tries = 0;
        loop {
            let left = wait.until.saturating_duration_since(Instant::now());
            let until = (left >= Duration::from_millis(1)).then_some(wait.until);
            match self.grant(key, ttl, until).await {
                Err(Error::Contended { .. } | Error::TimedOut { .. }) => {
                    return Err(wait.timed_out(key));
                }
                Err(e @ Error::Unavailable { .. }) => {
                    let now = Instant::now();
                    if now >= wait.until {
                        return Err(e);
                    }
                    tokio::time::sleep(wait.backoff.delay(tries).min(wait.until - now)).await;
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// The keys whose rows are locked by an open transaction now, and one
    /// entry per permit holder of a semaphore and per reader. The remaining
    /// TTL is unknown (the server does not expose its idle timer).
    async fn inspect(&self, prefix: &str) -> Result<Vec<lock_core::HeldLock>> {
        let keys: Vec<String> = self
            .all_on_pool_connection("listing held locks", &self.inner.statements.held, prefix)
            .await?;
        let permits = self.held_permits(prefix).await?;
        let readers = self.held_readers(prefix).await?;
        let mut held: Vec<_> = keys.into_iter().map(lock_core::HeldLock::new).collect();
        held.extend(
            readers
                .into_iter()
                .map(|key| lock_core::HeldLock::new(key).with_mode(Mode::Shared)),
        );
        held.extend(permits.into_iter().map(|(key, permits)| {
            let permits = u32::try_from(permits).unwrap_or(0);
            lock_core::HeldLock::new(key).with_mode(Mode::semaphore(permits))
        }));
        held.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(held)
    }

    /// Ends the session holding `key` with `pg_terminate_backend`: its
    /// transaction rolls back, the row is free, and the holder's next
    /// renewal reports the connection lost. Needs the right to signal that
    /// session (same role, superuser, or `pg_signal_backend`).
    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        // PostgreSQL 14+ waits until the process has exited, so the row is free on return.
        let wait = if self.inner.modern { ", 5000" } else { "" };
        let sql = format!(
            "SELECT pg_terminate_backend(pid{wait}) FROM ({}) AS holder",
            self.inner.statements.holder_pid
        );
        Ok(self
            .on_pool_connection::<bool>("terminating the holder", &sql, key.as_str())
            .await?
            .unwrap_or(false))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let key = lease.key().as_str();
        let mut slot = held(lease)?.slot.lock().await;
        let Some(pinned) = slot.as_mut() else {
            return Err(Error::lost(key, LostReason::NotHeld));
        };
        if pinned.busy {
            // An earlier statement was abandoned mid-reply: the connection cannot be trusted.
            *slot = None;
            return Err(Error::lost(key, LostReason::ConnectionLost));
        }
        pinned.busy = true;
        let check = sqlx::query_scalar::<_, Option<bool>>(&self.inner.statements.extend)
            .bind(millis(ttl).to_string())
            .fetch_one(&mut pinned.conn);
        let outcome = timeout(self.inner.response_timeout, check).await;
        pinned.busy = false;
        let error = match outcome {
            Ok(Ok(Some(true))) => return Ok(()),
            // The transaction was ended behind our back (a COMMIT through the exposed connection).
            Ok(Ok(_)) => Error::lost(key, LostReason::NotHeld),
            Ok(Err(e)) => errors::lost(key, &e),
            Err(_) => Error::lost(key, LostReason::ConnectionLost),
        };
        // Dropping the connection ends whatever is left of the transaction.
        *slot = None;
        Err(error)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let key = lease.key().as_str();
        let taken = held(lease)?.slot.lock().await.take();
        let Some(mut pinned) = taken else {
            return Err(Error::lost(key, LostReason::NotHeld));
        };
        if pinned.busy {
            return Err(Error::lost(key, LostReason::ConnectionLost));
        }
        let rt = self.inner.response_timeout;
        let endpoint = self.inner.conns.endpoint.as_str();
        pinned.busy = true;
        if pinned.wrote {
            // COMMIT of an aborted transaction silently rolls back; find out first.
            let check =
                sqlx::query_scalar::<_, Option<bool>>(sql::HELD_CHECK).fetch_one(&mut pinned.conn);
            match within(rt, endpoint, "the transaction check", Box::pin(check)).await? {
                Ok(Some(true)) => {}
                Ok(_) => return Err(Error::lost(key, LostReason::NotHeld)),
                Err(e) if errors::is_connection_lost(&e) => {
                    return Err(Error::lost(key, LostReason::ConnectionLost));
                }
                Err(e) => {
                    return Err(errors::backend(
                        "the lock's transaction had failed, so its writes were rolled back",
                        e,
                    ));
                }
            }
        }
        // Nothing to keep unless the holder wrote: ROLLBACK also skips the commit's WAL flush.
        let end = if pinned.wrote { "COMMIT" } else { "ROLLBACK" };
        match within(rt, endpoint, end, simple(&mut pinned.conn, end)).await? {
            Ok(_) => {
                pinned.busy = false;
                self.inner.conns.give_back(pinned);
                Ok(())
            }
            Err(e) if errors::is_connection_lost(&e) => {
                Err(Error::lost(key, LostReason::ConnectionLost))
            }
            Err(e) => Err(errors::backend(
                "COMMIT failed, so the writes made in the lock's transaction were rolled back",
                e,
            )),
        }
    }
}
