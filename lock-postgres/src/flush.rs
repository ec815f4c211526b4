//! Making fencing tokens durable before they are handed out.
//!
//! `nextval` runs in the holder's transaction, which never commits, so
//! nothing waits for the sequence's WAL record to reach disk; a server crash
//! before some later flush would recover the sequence to an older value and
//! hand the same token out again. A transaction that writes WAL and commits
//! with `synchronous_commit = on` waits until the WAL is on disk up to its
//! commit record, and so every record written before it, the token's included.
//!
//! The transaction must write WAL itself: PostgreSQL commits a transaction
//! that wrote none asynchronously whatever `synchronous_commit` says, even
//! with an xid (`txid_current()` alone flushes nothing). So it locks a
//! reserved row `FOR KEY SHARE`, which is WAL-logged, conflicts with no other
//! flush and leaves no dead row behind. The row's name is the empty string,
//! which no lock key can be; the statement inserts it first if it is missing.
//!
//! Most grants need no flush. `nextval` writes a WAL record only every 32
//! values, logging the value 32 ahead (the sequence's logged bound, its
//! `last_value + log_cnt` after any `nextval`), and a recovery restarts the
//! sequence past the last record on disk. So once a flush has covered the
//! record that logged a bound, every token up to that bound is safe. A
//! grant reads the bound right after its `nextval`: if it is at most the
//! highest bound known flushed, the latest record, which covers the token,
//! is on disk. A checkpoint does not break this: the first `nextval` after
//! one writes a new record with a higher bound (the checkpoint's copy of
//! the sequence holds only the values handed out), which is flushed before
//! its token is used. This rests on INCREMENT BY 1 (the bound grows by one
//! value per record otherwise); with any other increment every grant
//! flushes.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex as SyncMutex, MutexGuard};
use std::time::Duration;

use lock_core::{Error, Result};
use sqlx::postgres::PgConnection;
use tokio::sync::Mutex;

use crate::{errors, pool::Connections, simple};

/// How long a grant waits for its token's flush: the flush may first wait
/// for one already running, so one response timeout is too tight; past
/// this, the grant fails and frees the row.
pub(crate) fn budget(response_timeout: Duration) -> Duration {
    response_timeout.saturating_mul(2)
}

/// Runs flushes on one connection of its own (outside the budget of held
/// locks), one at a time; callers that arrive while one runs share the next.
#[derive(Default)]
pub(crate) struct Flusher {
    conn: Mutex<Option<PgConnection>>,
    counts: SyncMutex<Counts>,
    /// The highest logged bound of the sequence known to be on disk; 0 for
    /// none. Stays 0 when bounds do not apply (an increment other than 1).
    flushed_bound: AtomicI64,
    /// Whether logged bounds can be trusted (INCREMENT BY 1).
    bounds_apply: bool,
}

/// Flushes are numbered in the order they start.
#[derive(Default)]
struct Counts {
    /// The number the next flush will take.
    next: u64,
    /// The highest number of a flush that committed.
    done: Option<u64>,
    /// The number of the last flush that failed, and why.
    failed: Option<(u64, String)>,
}

impl Flusher {
    /// A flusher for a sequence with `increment`.
    pub(crate) fn new(increment: i64) -> Flusher {
        Flusher {
            bounds_apply: increment == 1,
            ..Flusher::default()
        }
    }

    /// The highest logged bound known on disk, for the grant statement.
    pub(crate) fn flushed_bound(&self) -> i64 {
        self.flushed_bound.load(Ordering::Acquire)
    }

    /// Records that `logged`, a bound read before a flush that has since
    /// committed (see [`flush`](Self::flush)), is on disk.
    pub(crate) fn flushed_through(&self, logged: Option<i64>) {
        if let (true, Some(logged)) = (self.bounds_apply, logged) {
            self.flushed_bound.fetch_max(logged, Ordering::AcqRel);
        }
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once a flush that started after this call began has
    /// committed: whatever the server wrote to its WAL before this call is
    /// then on disk. Fails if the flush meant to cover this call failed, or
    /// if that takes longer than `budget` (see [`budget`]), waiting for a
    /// flush already running included: a grant's idle limit counts on it.
    /// `sql` is [`Statements::flush`](crate::sql::Statements).
    pub(crate) async fn flush(
        &self,
        conns: &Connections,
        sql: &str,
        budget: Duration,
    ) -> Result<()> {
        tokio::time::timeout(budget, self.flush_unbounded(conns, sql))
            .await
            .map_err(|_| errors::timed_out(&conns.endpoint, "the fencing token's WAL flush"))?
    }

    async fn flush_unbounded(&self, conns: &Connections, sql: &str) -> Result<()> {
        let need = self.counts().next;
        let mut slot = self.conn.lock().await;
        let number = {
            let mut counts = self.counts();
            if counts.done.is_some_and(|done| done >= need) {
                return Ok(());
            }
            if let Some((failed, reason)) = &counts.failed
                && *failed >= need
            {
                return Err(Error::Unavailable {
                    backend: errors::BACKEND,
                    endpoint: conns.endpoint.clone(),
                    reason: format!("the fencing token's WAL flush failed: {reason}"),
                    source: None,
                });
            }
            counts.next += 1;
            counts.next - 1
        };
        let outcome = self.run(&mut slot, conns, sql).await;
        let mut counts = self.counts();
        match &outcome {
            Ok(()) => counts.done = Some(counts.done.map_or(number, |d| d.max(number))),
            Err(e) => counts.failed = Some((number, e.to_string())),
        }
        outcome
    }

    async fn run(
        &self,
        slot: &mut Option<PgConnection>,
        conns: &Connections,
        sql: &str,
    ) -> Result<()> {
        // Bounded by the caller (`flush`), which drops this future, and
        // with it a connection mid-reply, when the budget runs out.
        loop {
            let reused = slot.is_some();
            let mut conn = match slot.take() {
                Some(conn) => conn,
                None => conns.open().await?,
            };
            // Any failure drops the connection: it may be mid-reply or inside the transaction.
            match simple(&mut conn, sql).await {
                // The row was inserted or locked, so the transaction wrote WAL.
                Ok(done) if done.rows_affected() >= 1 => {
                    *slot = Some(conn);
                    return Ok(());
                }
                Ok(_) => {
                    return Err(Error::Backend {
                        backend: errors::BACKEND,
                        message: "the fencing token's WAL flush found its reserved row (name '') neither present nor insertable; is something deleting rows?".into(),
                        source: None,
                    });
                }
                // The connection may have died since its last use: retry once on a new one.
                Err(e) if reused && errors::is_connection_lost(&e) => continue,
                Err(e) if errors::is_connection_lost(&e) => {
                    return Err(errors::connect(&conns.endpoint, e));
                }
                Err(e) => {
                    return Err(errors::backend("the fencing token's WAL flush failed", e));
                }
            }
        }
    }
}
