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

use crate::pool::Pinned;
use crate::sql;
use crate::{PostgresBackend, errors, simple, within};

/// How often a permit's rows may vanish under it (deleted by someone
/// else) before it gives up.
const VANISHED_LIMIT: usize = 3;

impl PostgresBackend {
    /// One attempt at a permit of a semaphore of `permits`: the key's rows
    /// exist (autocommit, so that a second contender never blocks behind a
    /// first one's uncommitted insert), then the permit's transaction
    /// share-locks the lock and permits rows, checks the number, locks a
    /// free slot and draws the token after it, as an exclusive grant does.
    pub(crate) async fn permit(&self, key: &LockKey, ttl: Duration, permits: u32) -> Result<Grant> {
        let inner = &*self.inner;
        let (rt, endpoint) = (inner.response_timeout, inner.conns.endpoint.as_str());
        let statements = &inner.statements;
        let asked = Mode::semaphore(permits);
        // MAX_PERMITS, checked by the Locker, fits an int.
        let n = i32::try_from(permits).unwrap_or(i32::MAX);
        let (mut fresh, mut renumbered, mut vanished) = (false, false, 0);
        loop {
            let (mut pinned, reused) = inner.conns.pin(fresh).await?;
            let conn = &mut pinned.conn;
            let rows = sqlx::query(&statements.permit_rows)
                .bind(key.as_str())
                .bind(n)
                .execute(&mut *conn);
            match within(rt, endpoint, "the permit rows", Box::pin(rows)).await? {
                Ok(_) => {}
                // An idle connection may have died since its last use: retry once on a new one.
                Err(e) if reused && !fresh && errors::is_connection_lost(&e) => {
                    fresh = true;
                    continue;
                }
                Err(e) => return Err(errors::connect(endpoint, e)),
            }
            let begin = sql::begin(sql::grant_idle_timeout(ttl, rt), rt, inner.modern);
            within(rt, endpoint, "BEGIN", simple(&mut *conn, &begin))
                .await?
                .map_err(|e| errors::connect(endpoint, e))?;
            let mode = sqlx::query_scalar::<_, Option<i32>>(&statements.permit_mode)
                .bind(key.as_str())
                .fetch_optional(&mut *conn);
            match within(rt, endpoint, "the permits row lock", Box::pin(mode)).await? {
                Ok(Some(Some(held))) if held == n => {}
                Ok(Some(Some(held))) => {
                    // Another number (0: readers): taken over only if no holder shares the row.
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    let held = if held == 0 {
                        Mode::Shared
                    } else {
                        Mode::semaphore(u32::try_from(held).unwrap_or(0))
                    };
                    if !renumbered && self.renumber(key, n).await? {
                        renumbered = true;
                        continue;
                    }
                    return Err(Error::ModeConflict {
                        key: key.to_string(),
                        held: Some(held),
                        asked,
                    });
                }
                // The rows were deleted since they were inserted: insert them again, a few times.
                Ok(_) if vanished < VANISHED_LIMIT => {
                    vanished += 1;
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    continue;
                }
                Ok(_) => {
                    return Err(Error::Backend {
                        backend: errors::BACKEND,
                        message: format!(
                            "the permit rows of semaphore `{key}` keep disappearing; is something deleting rows?"
                        ),
                        source: None,
                    });
                }
                Err(e) if errors::is_lock_not_available(&e) => {
                    return Err(self.refusal(pinned, key, asked).await);
                }
                Err(e) => return Err(errors::connect(endpoint, e)),
            }
            let slot = sqlx::query_as::<_, (i64, Option<i64>)>(&statements.permit_slot)
                .bind(key.as_str())
                .bind(n)
                .fetch_optional(&mut *conn);
            return match within(rt, endpoint, "the slot lock", Box::pin(slot)).await? {
                Ok(Some((token, logged))) => {
                    if let Err(e) = self.flush_token(logged).await {
                        inner.conns.roll_back_and_give_back(pinned, rt).await;
                        return Err(e);
                    }
                    let sent = self.refresh(&mut pinned.conn, key, ttl).await?;
                    Ok(self.hand_out(pinned, token, ttl, sent))
                }
                Ok(None) => {
                    inner.conns.roll_back_and_give_back(pinned, rt).await;
                    Err(Error::Contended {
                        key: key.to_string(),
                        remaining: None,
                    })
                }
                Err(e) => Err(errors::connect(endpoint, e)),
            };
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
