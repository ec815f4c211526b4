//! Read-write locks: a read hold is a transaction that share-locks the
//! key's row `FOR SHARE NOWAIT`, as the writer, the key's exclusive lock,
//! is a transaction that locks it `FOR UPDATE`.
//!
//! How the pieces fit, with the server's own locks only:
//! - **Readers and the writer exclude each other in the server**: every
//!   reader share-locks the key's lock row, which the writer locks
//!   `FOR UPDATE`.
//! - **A waiting writer refuses new readers.** PostgreSQL grants a share
//!   lock on a row held only in share mode without queueing it behind a
//!   waiting `FOR UPDATE`, so the row lock alone would let a stream of
//!   readers starve a writer. So each key has a gate, an advisory lock
//!   ([`readers_gate`](crate::sql::readers_gate)): a reader takes it shared
//!   with a `try` and keeps it while it holds; a writer that waits queues
//!   for it exclusive, then for the row, and keeps it until its
//!   transaction ends. Advisory locks queue, and a `try` that conflicts
//!   with a queued request is refused, so from the moment a writer waits,
//!   new readers are refused, until the writer has been granted and gone.
//!   The mark is a lock of the writer's session: it vanishes with the
//!   session (on PostgreSQL 14 and newer, a waiter whose client went away
//!   leaves within a second, `client_connection_check_interval`), and a
//!   writer that does not wait (`Wait::NONE`) never takes it.
//! - **Readers and semaphores do not mix**: the key's mode row (its
//!   permits row, slot -1) says 0 while readers hold it, N for a semaphore
//!   of N. Readers and permit holders both share-lock it, and its number
//!   changes only by an `UPDATE` behind `FOR UPDATE NOWAIT` (see
//!   `permits.rs`), which fails while any of them holds.
//!
//! `FOR SHARE`, not `FOR KEY SHARE`: on the key's row either would refuse
//! the writer's `FOR UPDATE`, but on the mode row only `FOR SHARE` stops
//! the `UPDATE` of its number (an update of a non-key column takes
//! `FOR NO KEY UPDATE`, which `FOR KEY SHARE` admits); and `FOR SHARE` on
//! the key's row is what permit holders take, so the shared modes lock it
//! alike.

use std::time::Duration;

use lock_core::raw::Grant;
use lock_core::{Error, LockKey, Mode, Result};
use tokio::time::Instant;

use crate::permits::{MODE_RECHECK_PAUSE, MODE_RECHECKS};
use crate::sql::millis;
use crate::{PostgresBackend, errors, simple, within};

/// How often a key's rows may vanish under a reader (deleted by someone
/// else) before it gives up.
const VANISHED_LIMIT: usize = 3;

/// The reply of [`Statements::read_nowait`](crate::sql::Statements): the
/// gate was open, the mode row's number, the token, its logged bound, done.
type ReadRow = (bool, Option<i32>, Option<i64>, Option<i64>, Option<bool>);

impl PostgresBackend {
    /// One attempt at a read hold, in as many round trips as an exclusive
    /// `try_acquire`: `BEGIN`, then one statement that passes the gate,
    /// share-locks the rows and draws the token (and, for a key's first
    /// hold, the rows' insert before them; after a mode change, one
    /// `UPDATE` of the mode row).
    pub(crate) async fn read(&self, key: &LockKey, ttl: Duration) -> Result<Grant> {
        let inner = &*self.inner;
        let (rt, endpoint) = (inner.response_timeout, inner.conns.endpoint.as_str());
        let statements = &inner.statements;
        let contended = || Error::Contended {
            key: key.to_string(),
            remaining: None,
        };
        let (mut fresh, mut missing, mut rechecks, mut vanished) = (false, false, 0, 0);
        loop {
            let (mut pinned, reused) = inner.conns.pin(fresh).await?;
            let conn = &mut pinned.conn;
            // Retried once on a new connection: an idle one may have died since its last use.
            let retry = reused && !fresh;
            if missing {
                // In a statement of its own (autocommit): inside the hold's transaction,
                // a second reader's insert would wait for the first one's commit.
                let rows = sqlx::query(&statements.read_rows)
                    .bind(key.as_str())
                    .execute(&mut *conn);
                match within(rt, endpoint, "the row insert", Box::pin(rows)).await? {
                    Ok(_) => {}
                    Err(e) if retry && errors::is_connection_lost(&e) => {
                        fresh = true;
                        continue;
                    }
                    Err(e) => return Err(errors::connect(endpoint, e)),
                }
            }
            match within(rt, endpoint, "BEGIN", simple(&mut *conn, "BEGIN")).await? {
                Ok(_) => {}
                Err(e) if retry && !missing && errors::is_connection_lost(&e) => {
                    fresh = true;
                    continue;
                }
                Err(e) => return Err(errors::connect(endpoint, e)),
            }
            let idle = crate::sql::grant_idle_timeout(ttl, rt);
            let sent = Instant::now();
            let read = sqlx::query_as::<_, ReadRow>(&statements.read_nowait)
                .bind(key.as_str())
                .bind(millis(ttl).to_string())
                .bind(millis(rt).to_string())
                .bind(inner.flusher.flushed_bound())
                .bind(millis(idle).to_string())
                .fetch_one(&mut *conn);
            match within(rt, endpoint, "the read hold", Box::pin(read)).await? {
                Ok((true, Some(0), Some(token), logged, done)) => {
                    let sent = if done == Some(true) {
                        // The token is on disk and the statement set the TTL clock.
                        sent
                    } else {
                        if let Err(e) = self.flush_token(logged).await {
                            inner.conns.roll_back_and_give_back(pinned, rt).await;
                            return Err(e);
                        }
                        self.refresh(&mut pinned.conn, key, ttl).await?
                    };
                    return Ok(self.hand_out(pinned, token, ttl, sent));
                }
                // The gate is closed: a writer waits, or holds after waiting.
                Ok((false, ..)) => {
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    return Err(contended());
                }
                // A row is missing: both go in first, then the hold is tried again.
                Ok((true, None, ..)) if vanished < VANISHED_LIMIT => {
                    vanished += usize::from(missing);
                    missing = true;
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                }
                Ok((true, None, ..)) => {
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    return Err(Error::Backend {
                        backend: errors::BACKEND,
                        message: format!(
                            "the rows of lock `{key}` keep disappearing; is something deleting rows?"
                        ),
                        source: None,
                    });
                }
                // The key was last a semaphore: taken over only if no permit holder shares its mode row.
                Ok((true, Some(permits), ..)) => {
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    let held = Mode::semaphore(u32::try_from(permits).unwrap_or(0));
                    if rechecks >= MODE_RECHECKS {
                        return Err(Error::ModeConflict {
                            key: key.to_string(),
                            held: Some(held),
                            asked: Mode::Shared,
                        });
                    }
                    // Renumbered, or refused because a holder shares the row: read
                    // it again either way, since a caller asking for this very mode
                    // may have renumbered it first and hold it now.
                    if !self.renumber(key, 0).await? {
                        tokio::time::sleep(MODE_RECHECK_PAUSE).await;
                    }
                    rechecks += 1;
                }
                // The writer holds the key's row (or its mode row is being changed).
                Err(e) if errors::is_lock_not_available(&e) => {
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    return Err(contended());
                }
                Err(e) => return Err(errors::connect(endpoint, e)),
            }
        }
    }

    /// The keys under `prefix` with a read hold now, one entry per reader.
    pub(crate) async fn held_readers(&self, prefix: &str) -> Result<Vec<String>> {
        self.all_on_pool_connection(
            "listing read holds",
            &self.inner.statements.held_readers,
            prefix,
        )
        .await
    }
}
