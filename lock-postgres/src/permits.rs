//! Semaphores: a permit is a slot row locked `FOR UPDATE SKIP LOCKED` in a
//! transaction that stays open while the permit is held, as an exclusive
//! lock is its key's row locked `FOR UPDATE NOWAIT`.
//!
//! How the modes exclude each other, with row locks only (PostgreSQL's
//! `FOR SHARE` admits other `FOR SHARE` lockers and refuses `FOR UPDATE`):
//! - every permit holder share-locks the key's lock row, which an
//!   exclusive grant locks `FOR UPDATE`: while a permit is held no
//!   exclusive grant gets in, and while an exclusive lock is held no
//!   permit does;
//! - every permit holder share-locks the key's permits row (slot -1),
//!   which holds the number of permits; the number changes only through
//!   an `UPDATE` behind `FOR UPDATE NOWAIT` on that row, so it cannot
//!   change while a permit is held, and a holder checks it under its share
//!   lock;
//! - each permit holder locks one slot row (0 to N-1) `FOR UPDATE`, so at
//!   most N hold at once.

use std::time::Duration;

use lock_core::raw::Grant;
use lock_core::{Error, LockKey, Mode, Result};
use tokio::time::Instant;

use crate::pool::Pinned;
use crate::sql::{self, millis};
use crate::{PostgresBackend, errors, simple, within};

/// How often a permit's rows may vanish under it (deleted by someone
/// else) before it gives up.
const VANISHED_LIMIT: usize = 3;

/// The reply of [`Statements::permit_nowait`](crate::sql::Statements): the
/// permits row's number, the token, its logged bound, done, and whether the
/// slot rows reach the caller's number (asked only when no slot was locked).
type PermitRow = (
    Option<i32>,
    Option<i64>,
    Option<i64>,
    Option<bool>,
    Option<bool>,
);

/// How many times a permit or a read hold looks at the key's mode again
/// before it answers a mode conflict: two callers that switch a key to the
/// same mode at once each see the other's switch under way, which is no
/// conflict (the looks cost a round trip and a pause each, on that path only).
pub(crate) const MODE_RECHECKS: u8 = 3;

/// The pause before such a look: one statement of the other caller's.
pub(crate) const MODE_RECHECK_PAUSE: Duration = Duration::from_millis(2);

impl PostgresBackend {
    /// One attempt at a permit of a semaphore of `permits`, in as many
    /// round trips as an exclusive `try_acquire`: `BEGIN`, then one
    /// statement that share-locks the key's lock and permits rows, checks
    /// the number, locks a free slot and draws the token after it. The
    /// rows go in first (autocommit, so that a second contender never
    /// blocks behind a first one's uncommitted insert) only when they are
    /// missing: a key's first permit, or a larger N than its slot rows reach.
    pub(crate) async fn permit(&self, key: &LockKey, ttl: Duration, permits: u32) -> Result<Grant> {
        let inner = &*self.inner;
        let (rt, endpoint) = (inner.response_timeout, inner.conns.endpoint.as_str());
        let statements = &inner.statements;
        let asked = Mode::semaphore(permits);
        // MAX_PERMITS, checked by the Locker, fits an int.
        let n = i32::try_from(permits).unwrap_or(i32::MAX);
        let (mut fresh, mut missing, mut rechecks, mut vanished) = (false, false, 0, 0);
        loop {
            let (mut pinned, reused) = inner.conns.pin(fresh).await?;
            let conn = &mut pinned.conn;
            // Retried once on a new connection: an idle one may have died since its last use.
            let retry = reused && !fresh;
            if missing {
                let rows = sqlx::query(&statements.permit_rows)
                    .bind(key.as_str())
                    .bind(n)
                    .execute(&mut *conn);
                match within(rt, endpoint, "the permit rows", Box::pin(rows)).await? {
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
            let idle = sql::grant_idle_timeout(ttl, rt);
            let sent = Instant::now();
            let permit = sqlx::query_as::<_, PermitRow>(&statements.permit_nowait)
                .bind(key.as_str())
                .bind(millis(ttl).to_string())
                .bind(millis(rt).to_string())
                .bind(inner.flusher.flushed_bound())
                .bind(millis(idle).to_string())
                .bind(n)
                .fetch_one(&mut *conn);
            match within(rt, endpoint, "the permit", Box::pin(permit)).await? {
                Ok((Some(held), Some(token), logged, done, _)) if held == n => {
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
                // Every slot below N is held.
                Ok((Some(held), None, _, _, Some(true))) if held == n => {
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    return Err(Error::Contended {
                        key: key.to_string(),
                        remaining: None,
                    });
                }
                Ok((Some(held), ..)) if held != n => {
                    // Another number (0: readers): taken over only if no holder shares the row.
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    let held = if held == 0 {
                        Mode::Shared
                    } else {
                        Mode::semaphore(u32::try_from(held).unwrap_or(0))
                    };
                    if rechecks >= MODE_RECHECKS {
                        return Err(Error::ModeConflict {
                            key: key.to_string(),
                            held: Some(held),
                            asked,
                        });
                    }
                    // Renumbered, or refused because a holder shares the row: read
                    // it again either way, since a caller asking for this very mode
                    // may have renumbered it first and hold it now.
                    if !self.renumber(key, n).await? {
                        tokio::time::sleep(MODE_RECHECK_PAUSE).await;
                    }
                    rechecks += 1;
                }
                // A row is missing (the key's, or the slots of a larger N): they go in
                // first, then the permit is tried again; a few times if they were deleted.
                Ok(_) if vanished < VANISHED_LIMIT => {
                    vanished += usize::from(missing);
                    missing = true;
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                }
                Ok(_) => {
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    return Err(Error::Backend {
                        backend: errors::BACKEND,
                        message: format!(
                            "the permit rows of semaphore `{key}` keep disappearing; is something deleting rows?"
                        ),
                        source: None,
                    });
                }
                // An exclusive lock holds the key's row (or its permits row is being renumbered).
                Err(e) if errors::is_lock_not_available(&e) => {
                    let refused = self.refusal(pinned, key, asked).await;
                    // "Held exclusively" is also what another caller's change of the
                    // key's mode looks like while its statement runs: look again.
                    let exclusive = matches!(
                        refused,
                        Error::ModeConflict {
                            held: Some(Mode::Exclusive),
                            ..
                        }
                    );
                    if !exclusive || rechecks >= MODE_RECHECKS {
                        return Err(refused);
                    }
                    tokio::time::sleep(MODE_RECHECK_PAUSE).await;
                    rechecks += 1;
                }
                Err(e) => return Err(errors::connect(endpoint, e)),
            }
        }
    }

    /// Sets the number in `key`'s mode row (its permits row) to `permits`
    /// (0: read holds), in a statement of its own: true if done, false if a
    /// holder share-locks the row, so the key is held in its present mode.
    pub(crate) async fn renumber(&self, key: &LockKey, permits: i32) -> Result<bool> {
        let inner = &*self.inner;
        let (rt, endpoint) = (inner.response_timeout, inner.conns.endpoint.as_str());
        let (mut pinned, _) = inner.conns.pin(false).await?;
        let renumber = sqlx::query(&inner.statements.permit_renumber)
            .bind(key.as_str())
            .bind(permits)
            .execute(&mut pinned.conn);
        let done = match within(rt, endpoint, "the key's new mode", Box::pin(renumber)).await? {
            Ok(_) => true,
            Err(e) if errors::is_lock_not_available(&e) => false,
            Err(e) => return Err(errors::connect(endpoint, e)),
        };
        inner.conns.give_back(pinned);
        Ok(done)
    }

    /// Why a row lock asked for in `asked` was refused in the transaction
    /// open on `pinned`: the key is held in the other mode
    /// ([`Error::ModeConflict`]), or in the same one ([`Error::Contended`]).
    /// A permit holder holds a slot row, so whether one exists tells the
    /// modes apart. One more round trip, on the refused connection after its
    /// `ROLLBACK`, and only when a grant is refused.
    pub(crate) async fn refusal(&self, mut pinned: Pinned, key: &LockKey, asked: Mode) -> Error {
        let contended = Error::Contended {
            key: key.to_string(),
            remaining: None,
        };
        let inner = &*self.inner;
        let (rt, endpoint) = (inner.response_timeout, inner.conns.endpoint.as_str());
        // On any failure the connection is dropped (ending its transaction), and the refusal stands.
        pinned.busy = true;
        let Ok(Ok(_)) = within(
            rt,
            endpoint,
            "ROLLBACK",
            simple(&mut pinned.conn, "ROLLBACK"),
        )
        .await
        else {
            return contended;
        };
        let query = sqlx::query_as::<_, (Option<i32>, bool)>(&inner.statements.permit_holders)
            .bind(key.as_str())
            .fetch_one(&mut pinned.conn);
        let Ok(Ok((permits, permit_holders))) =
            within(rt, endpoint, "the mode check", Box::pin(query)).await
        else {
            return contended;
        };
        pinned.busy = false;
        inner.conns.give_back(pinned);
        let held = match (asked, permits, permit_holders) {
            (Mode::Exclusive, Some(permits), true) => {
                Mode::semaphore(u32::try_from(permits).unwrap_or(0))
            }
            // The permits row was being renumbered, or the holder just left.
            (Mode::Exclusive, _, _) | (_, _, true) => return contended,
            // A permit's share lock refused: an exclusive lock holds the key's row.
            _ => Mode::Exclusive,
        };
        Error::ModeConflict {
            key: key.to_string(),
            held: Some(held),
            asked,
        }
    }

    /// The keys under `prefix` with a permit held now, one entry per holder,
    /// each with its number of permits.
    pub(crate) async fn held_permits(&self, prefix: &str) -> Result<Vec<(String, i32)>> {
        let inner = &*self.inner;
        let (rt, endpoint) = (inner.response_timeout, inner.conns.endpoint.as_str());
        let (mut pinned, _) = inner.conns.pin(false).await?;
        let query = sqlx::query_as::<_, (String, i32)>(&inner.statements.held_permits)
            .bind(prefix)
            .fetch_all(&mut pinned.conn);
        let rows = within(rt, endpoint, "listing held permits", Box::pin(query))
            .await?
            .map_err(|e| errors::connect(endpoint, e))?;
        inner.conns.give_back(pinned);
        Ok(rows)
    }
}
