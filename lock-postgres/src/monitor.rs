//! The loss signal: while locks are held, one task per backend checks, on a
//! connection of its own, that the server sessions holding them still
//! exist, so a guard learns that the server ended one (terminated,
//! restarted, timed out) within a check, not at its next renewal.
//!
//! The holders' own connections cannot tell: each sits idle in its
//! transaction, and the driver reads its socket only when a statement is
//! sent. `pg_stat_activity` can: a session leaves it when its process exits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lock_core::LostReason;
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::sync::watch;

use crate::errors;

/// The longest time between two checks.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The shortest time between two checks, however short the TTLs.
const CHECK_AT_MOST_EVERY: Duration = Duration::from_millis(25);

/// A server session: its process id, and when it started (in microseconds
/// since the epoch), since a restarted server hands out process ids again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Session {
    pid: i32,
    started: i64,
}

/// The sessions among `$1` (process ids) that exist, as [`Session`] rows.
const ALIVE: &str = "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8 \
                     FROM pg_stat_activity WHERE pid = ANY($1)";

/// This connection's own session.
const OWN: &str = "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8 \
                   FROM pg_stat_activity WHERE pid = pg_backend_pid()";

impl Session {
    /// The session of `conn` (one round trip, when the connection opens).
    pub(crate) async fn of(conn: &mut PgConnection) -> Result<Session, sqlx::Error> {
        let (pid, started) = sqlx::query_as::<_, (i32, i64)>(OWN).fetch_one(conn).await?;
        Ok(Session { pid, started })
    }
}

/// One backend's watch over the sessions of its held locks.
pub(crate) struct Monitor {
    shared: Arc<Shared>,
}

struct Shared {
    options: PgConnectOptions,
    endpoint: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    watched: HashMap<u64, Watched>,
    /// Whether the checking task runs; it ends when nothing is watched.
    running: bool,
    /// The checks' connection while no task runs, kept for the next one.
    conn: Option<PgConnection>,
}

struct Watched {
    session: Session,
    ttl: Duration,
    lost: watch::Sender<Option<LostReason>>,
}

/// A held lock's place in the watch; dropping it ends the watch.
pub(crate) struct Watching {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.shared.state().watched.remove(&self.id);
    }
}

/// What one check found.
enum Verdict {
    /// These sessions exist.
    Alive(Vec<Session>),
    /// The connection failed and a new one was refused: no server listens,
    /// so no session of the old one lives.
    ServerDown,
    /// No answer in time, or an error that proves nothing: check again.
    Unknown,
}

impl Monitor {
    pub(crate) fn new(
        options: PgConnectOptions,
        endpoint: String,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Monitor {
        Monitor {
            shared: Arc::new(Shared {
                options,
                endpoint,
                connect_timeout,
                response_timeout,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Watches `session`, which holds a lock of `ttl`, until the returned
    /// guard drops; the receiver turns to `Some` if the session ends first.
    pub(crate) fn watch(
        &self,
        session: Session,
        ttl: Duration,
    ) -> (Watching, watch::Receiver<Option<LostReason>>) {
        let (lost, receiver) = watch::channel(None);
        let mut state = self.shared.state();
        let id = state.next_id;
        state.next_id += 1;
        state.watched.insert(id, Watched { session, ttl, lost });
        if !state.running {
            state.running = true;
            tokio::spawn(run(self.shared.clone()));
        }
        let watching = Watching {
            id,
            shared: self.shared.clone(),
        };
        (watching, receiver)
    }

    /// Closes the checks' connection if no task uses it (nothing is held).
    pub(crate) async fn close_idle(&self) {
        let conn = self.shared.state().conn.take();
        if let Some(conn) = conn {
            let _ = sqlx::Connection::close(conn).await;
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the sessions on `conn`, or on a new connection if it failed:
    /// a failure of its own may be the server's restart, which ended the
    /// holders' sessions too, and only a new connection can tell.
    async fn check(&self, conn: &mut Option<PgConnection>, pids: &[i32]) -> Verdict {
        for _ in 0..2 {
            let checking = match conn {
                Some(checking) => checking,
                None => match self.open().await {
                    Ok(opened) => conn.insert(opened),
                    Err(verdict) => return verdict,
                },
            };
            let query = sqlx::query_as::<_, (i32, i64)>(ALIVE)
                .bind(pids)
                .fetch_all(checking);
            match tokio::time::timeout(self.response_timeout, query).await {
                Ok(Ok(rows)) => {
                    let alive = rows
                        .into_iter()
                        .map(|(pid, started)| Session { pid, started });
                    return Verdict::Alive(alive.collect());
                }
                Ok(Err(e)) if errors::is_connection_lost(&e) => *conn = None,
                Ok(Err(e)) => {
                    tracing::debug!(endpoint = %self.endpoint, error = %e, "checking the holders' sessions failed");
                    return Verdict::Unknown;
                }
                // Dropped mid-reply: the connection cannot be trusted.
                Err(_) => {
                    *conn = None;
                    return Verdict::Unknown;
                }
            }
        }
        Verdict::Unknown
    }

    /// A new connection for the checks; refused means no server listens.
    async fn open(&self) -> Result<PgConnection, Verdict> {
        match tokio::time::timeout(self.connect_timeout, self.options.connect()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(sqlx::Error::Io(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                Err(Verdict::ServerDown)
            }
            Ok(Err(e)) => {
                tracing::debug!(endpoint = %self.endpoint, error = %e, "no connection to check the holders' sessions");
                Err(Verdict::Unknown)
            }
            Err(_) => Err(Verdict::Unknown),
        }
    }
}

/// Checks every [`CHECK_EVERY`] (a quarter of the shortest TTL held, if
/// shorter) while anything is watched, then keeps its connection and ends.
async fn run(shared: Arc<Shared>) {
    let mut conn = shared.state().conn.take();
    loop {
        let every = {
            let mut state = shared.state();
            let Some(shortest) = state.watched.values().map(|w| w.ttl).min() else {
                state.running = false;
                state.conn = conn;
                return;
            };
            (shortest / 4).clamp(CHECK_AT_MOST_EVERY, CHECK_EVERY)
        };
        tokio::time::sleep(every).await;
        // Only what is watched before the check is judged by it: a session
        // opened during the check would be missing from its answer.
        let judged: Vec<(u64, Session)> = shared
            .state()
            .watched
            .iter()
            .map(|(id, w)| (*id, w.session))
            .collect();
        if judged.is_empty() {
            continue;
        }
        let mut pids: Vec<i32> = judged.iter().map(|(_, s)| s.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let ended: Vec<u64> = match shared.check(&mut conn, &pids).await {
            Verdict::Alive(alive) => judged
                .iter()
                .filter(|(_, session)| !alive.contains(session))
                .map(|(id, _)| *id)
                .collect(),
            Verdict::ServerDown => judged.iter().map(|(id, _)| *id).collect(),
            Verdict::Unknown => Vec::new(),
        };
        let mut state = shared.state();
        for id in ended {
            // Gone already if released meanwhile.
            if let Some(watched) = state.watched.remove(&id) {
                watched.lost.send_replace(Some(LostReason::ConnectionLost));
            }
        }
    }
}
