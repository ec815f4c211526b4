//! Every statement this backend sends, built once from validated names.

use std::time::Duration;

use lock_core::{Error, Result};

/// The schema SQL for the default names; see
/// [`PostgresOptions::schema_sql`](crate::PostgresOptions::schema_sql) for others.
pub const SCHEMA_SQL: &str = include_str!("../sql/schema.sql");

/// The custom setting marking the lock's transaction: `SET LOCAL` makes it
/// vanish when that transaction ends, whoever ended it.
const HELD_MARK: &str = "lockkit.held";

/// The custom setting that keeps the session's `statement_timeout` while
/// the grant's own statements run without it.
const SAVED_STATEMENT_TIMEOUT: &str = "lockkit.statement_timeout";

/// The permits table's name is the lock table's with this after it.
const PERMITS_SUFFIX: &str = "_permits";

/// Validated schema, table and sequence names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    schema: String,
    table: String,
    sequence: String,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            schema: "lockkit".into(),
            table: "locks".into(),
            sequence: "fencing_tokens".into(),
        }
    }
}

/// Accepts plain identifiers only, so names can be spliced into SQL quoted.
pub(crate) fn identifier(field: &'static str, name: &str) -> Result<()> {
    let plain = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!(
                "`{name}` is not a plain identifier (ASCII letters, digits and _, not starting with a digit, at most 63 bytes)"
            ),
        ))
    }
}

impl Names {
    /// The names as a setter was given them: [`check`](Self::check) runs
    /// before they reach any statement.
    pub(crate) fn unchecked(schema: &str, table: &str, sequence: &str) -> Names {
        Names {
            schema: schema.into(),
            table: table.into(),
            sequence: sequence.into(),
        }
    }

    /// Refuses a name that is not a plain identifier, naming which.
    pub(crate) fn check(&self) -> Result<()> {
        identifier("schema", &self.schema)?;
        identifier("table", &self.table)?;
        // The permits table is named after the lock table, and PostgreSQL
        // would cut a name past 63 bytes short.
        if self.table.len() > 63 - PERMITS_SUFFIX.len() {
            return Err(Error::invalid(
                "table",
                format!(
                    "`{}` is {} bytes; at most {} are accepted, leaving room for the `{PERMITS_SUFFIX}` table beside it",
                    self.table,
                    self.table.len(),
                    63 - PERMITS_SUFFIX.len()
                ),
            ));
        }
        identifier("sequence", &self.sequence)
    }

    pub(crate) fn schema(&self) -> &str {
        &self.schema
    }
    pub(crate) fn table_name(&self) -> &str {
        &self.table
    }
    pub(crate) fn sequence_name(&self) -> &str {
        &self.sequence
    }

    /// `"schema"."table"`.
    pub(crate) fn table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    /// `"schema"."table_permits"`: the semaphores' rows (see `permits.rs`).
    pub(crate) fn permits(&self) -> String {
        format!("\"{}\".\"{}{PERMITS_SUFFIX}\"", self.schema, self.table)
    }

    /// `"schema"."sequence"`.
    pub(crate) fn sequence(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.sequence)
    }

    pub(crate) fn schema_sql(&self) -> String {
        SCHEMA_SQL
            .replace("\"lockkit\".\"locks_permits\"", &self.permits())
            .replace("\"lockkit\".\"locks\"", &self.table())
            .replace("\"lockkit\".\"fencing_tokens\"", &self.sequence())
            .replace(
                "SCHEMA IF NOT EXISTS \"lockkit\"",
                &format!("SCHEMA IF NOT EXISTS \"{}\"", self.schema),
            )
    }
}

/// The statements for one set of names.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Autocommit, before the transaction: a contender never blocks on a
    /// holder's uncommitted insert, and an existing row is left alone.
    pub insert: String,
    /// The grant in one statement, after a bare `BEGIN`: locks the row
    /// without waiting (no row: the row is missing, and the caller inserts
    /// it first), then draws the token: `nextval` runs only once the row is
    /// locked, so tokens follow the order of grants. Returns the token, the
    /// sequence's logged bound read after it (see `flush.rs`), and whether
    /// that bound is at most `$4` (already on disk). It also sets up the
    /// lock's transaction as [`begin`] does, with no wait: the held mark,
    /// `lock_timeout` to the response timeout (`$3`), `transaction_timeout`
    /// off, and the idle limit to the TTL (`$2`) when the token is on disk,
    /// so one round trip grants, or else to the grant's idle limit (`$5`,
    /// see [`grant_idle_timeout`]) until a flush and
    /// [`refresh`](Self::refresh) follow.
    pub lock_nowait: String,
    /// Locks the row, waiting in the server's lock queue up to
    /// `lock_timeout`, after [`begin`]; returns the token, the logged bound,
    /// and NULL when sent with `$4` = 0 (after a wait, the grant ends with
    /// [`refresh`](Self::refresh), which restarts the TTL clock). Before the
    /// row, it queues for the key's readers' gate (see `readers.rs`), which
    /// it then keeps until its transaction ends: new readers are refused
    /// from the moment it waits.
    pub lock_wait: String,
    /// Autocommit, before a read hold's transaction: the key's lock row and
    /// its mode row (the permits row, slot -1, with 0 permits), each left
    /// alone if it exists.
    pub read_rows: String,
    /// A read hold in one statement, after a bare `BEGIN`, as
    /// [`lock_nowait`](Self::lock_nowait) is the exclusive grant: takes the
    /// readers' gate shared (refused while a writer waits or holds it),
    /// share-locks the key's lock row and mode row without waiting, and
    /// draws the token if the mode row says 0 (read holds). Returns whether
    /// the gate was open, the mode row's number (NULL: a row is missing),
    /// the token, the logged bound, and whether the grant is done, as
    /// `lock_nowait` does with the same parameters.
    pub read_nowait: String,
    /// The keys under a prefix with a read hold now, one row per reader.
    pub held_readers: String,
    /// Whether the lock's transaction is still open, and the new idle
    /// timeout (`$1`).
    pub extend: String,
    /// The grant's last statement: [`extend`](Self::extend), and
    /// `lock_timeout` back to the response timeout (`$2`) from the wait's
    /// time left, for the holder's own statements (which may set their own).
    pub refresh: String,
    /// The server process holding a key's row lock.
    pub holder_pid: String,
    /// The keys under a prefix whose rows are locked now (not the flush's row).
    pub held: String,
    /// Flushes the WAL up to a commit of its own, so up to every record
    /// written before it (see `flush.rs`). One round trip, simple protocol.
    pub flush: String,
    /// Whether the tables and the sequence exist.
    pub exists: &'static str,
    /// Autocommit, before a permit's transaction: the key's lock row, its
    /// permits row (slot -1, with the number of permits `$2`) and its slot
    /// rows 0 to `$2` - 1, each left alone if it exists.
    pub permit_rows: String,
    /// A permit in one statement, after a bare `BEGIN`, as
    /// [`lock_nowait`](Self::lock_nowait) is the exclusive grant:
    /// share-locks the key's lock row and its permits row without waiting,
    /// and if the permits row says `$6`, locks the first free slot below
    /// `$6` (`SKIP LOCKED`) and draws the token after it. Returns the
    /// permits row's number (NULL: a row is missing), the token, the logged
    /// bound, whether the grant is done (with `lock_nowait`'s `$2` to `$5`),
    /// and, when no slot was locked under the caller's number, whether the
    /// slot rows reach `$6` (false: a larger N needs its rows first; true:
    /// every permit is held).
    pub permit_nowait: String,
    /// Autocommit: sets the key's number of permits to `$2` (0: read
    /// holds) if no permit holder or reader share-locks its permits row
    /// (else it fails at once).
    pub permit_renumber: String,
    /// Autocommit, after a refusal: the key's number of permits (if it
    /// was ever a semaphore), and whether a permit holder holds a slot now.
    pub permit_holders: String,
    /// The slot rows under a prefix whose locks are held now, each with
    /// the key's number of permits.
    pub held_permits: String,
    /// The sequence's settings (by schema and name) that [`sequence_problem`]
    /// checks, as a [`SequenceSettings`] row; no row if it is not a sequence.
    pub sequence: &'static str,
    /// Creates them under an advisory lock, so concurrent first connects do not race.
    pub create: String,
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Statements {
        let (table, sequence, permits) = (names.table(), names.sequence(), names.permits());
        let gate = readers_gate(&table);
        // A reader's hold of the key `name`'s gate, in `pg_locks` (`r`).
        let reader_lock = |name: &str| {
            format!(
                "r.locktype = 'advisory' \
                 AND r.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND r.classid = hashtext('{table}')::oid AND r.objid = hashtext({name})::oid \
                 AND r.objsubid = 2 AND r.mode = 'ShareLock' AND r.granted"
            )
        };
        let reader_held = |name: &str| {
            format!(
                "EXISTS (SELECT 1 FROM pg_locks r WHERE {})",
                reader_lock(name)
            )
        };
        // `drawn` is materialised (it calls a volatile function), so the
        // correlated read of the sequence runs after `nextval`; OFFSET 0
        // keeps `x` a subquery, so the bound is read once.
        let lock = |wait: &str| {
            format!(
                "WITH intent AS (SELECT pg_advisory_xact_lock({gate}) AS queued), \
                 held AS (SELECT name FROM {table} WHERE name = $1 AND (SELECT true FROM intent) FOR UPDATE{wait}), \
                 drawn AS (SELECT nextval('{sequence}') AS token FROM held) \
                 SELECT x.token, x.logged, CASE WHEN x.logged <= $4 \
                 THEN current_setting('{HELD_MARK}', true) = 'on' \
                 AND set_config('idle_in_transaction_session_timeout', $2, true) IS NOT NULL \
                 AND set_config('lock_timeout', $3, true) IS NOT NULL \
                 AND set_config('statement_timeout', current_setting('{SAVED_STATEMENT_TIMEOUT}'), true) IS NOT NULL END \
                 FROM (SELECT d.token, (SELECT s.last_value + s.log_cnt FROM {sequence} s WHERE d.token IS NOT NULL) AS logged \
                 FROM drawn d OFFSET 0) x"
            )
        };
        // The exclusive grant's settings, after the token: the held mark, the
        // statement timeout kept aside, lock_timeout to the response timeout,
        // no transaction_timeout, and the idle limit by whether the token is on disk.
        let settle = |x: &str| {
            format!(
                "set_config('{HELD_MARK}', 'on', true) = 'on' \
                 AND set_config('{SAVED_STATEMENT_TIMEOUT}', current_setting('statement_timeout'), true) IS NOT NULL \
                 AND set_config('lock_timeout', $3, true) IS NOT NULL \
                 AND (current_setting('transaction_timeout', true) IS NULL OR set_config('transaction_timeout', '0', true) IS NOT NULL) \
                 AND set_config('idle_in_transaction_session_timeout', CASE WHEN {x}.logged <= $4 THEN $2 ELSE $5 END, true) IS NOT NULL \
                 AND {x}.logged <= $4"
            )
        };
        // The gate is tried first, so a refused reader locks no row; `held` is
        // read twice, so it runs once (a locking CTE is never inlined), and
        // `nextval` only after both rows are share-locked.
        let read_nowait = format!(
            "WITH gate AS (SELECT pg_try_advisory_xact_lock_shared({gate}) AS open), \
             held AS (SELECT n.permits FROM {table} k JOIN {permits} n ON n.name = k.name AND n.slot = -1 \
             WHERE k.name = $1 AND (SELECT open FROM gate) FOR SHARE OF k, n NOWAIT), \
             drawn AS (SELECT nextval('{sequence}') AS token FROM held WHERE permits = 0), \
             x AS (SELECT d.token, (SELECT s.last_value + s.log_cnt FROM {sequence} s WHERE d.token IS NOT NULL) AS logged \
             FROM drawn d OFFSET 0) \
             SELECT g.open, h.permits, x.token, x.logged, {} \
             FROM gate g LEFT JOIN held h ON true LEFT JOIN x ON true",
            settle("x")
        );
        let lock_nowait = format!(
            "WITH held AS (SELECT name FROM {table} WHERE name = $1 FOR UPDATE NOWAIT), \
             drawn AS (SELECT nextval('{sequence}') AS token FROM held) \
             SELECT x.token, x.logged, {} \
             FROM (SELECT d.token, (SELECT s.last_value + s.log_cnt FROM {sequence} s WHERE d.token IS NOT NULL) AS logged \
             FROM drawn d OFFSET 0) x",
            settle("x")
        );
        // `held` is read twice, so it runs once (a locking CTE is never
        // inlined), before `slot` reads its number; `nextval` runs only once a
        // slot is locked. Whether the slot rows reach N is read only when no
        // slot was locked: it tells a full semaphore from a larger N.
        let permit_nowait = format!(
            "WITH held AS (SELECT n.permits FROM {table} k JOIN {permits} n ON n.name = k.name AND n.slot = -1 \
             WHERE k.name = $1 FOR SHARE OF k, n NOWAIT), \
             slot AS (SELECT slot FROM {permits} WHERE name = $1 AND slot BETWEEN 0 AND $6 - 1 \
             AND (SELECT permits FROM held) = $6 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED), \
             drawn AS (SELECT nextval('{sequence}') AS token FROM slot), \
             x AS (SELECT d.token, (SELECT s.last_value + s.log_cnt FROM {sequence} s WHERE d.token IS NOT NULL) AS logged \
             FROM drawn d OFFSET 0) \
             SELECT h.permits, x.token, x.logged, {}, \
             CASE WHEN x.token IS NULL AND h.permits = $6 \
             THEN EXISTS (SELECT 1 FROM {permits} WHERE name = $1 AND slot = $6 - 1) END \
             FROM (VALUES (1)) one (o) LEFT JOIN held h ON true LEFT JOIN x ON true",
            settle("x")
        );
        // A slot row is only ever locked FOR UPDATE, never updated, so its
        // xmax names the transaction of its holder, as the lock row's does.
        let slot_held = "JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = p.xmax \
                         AND l.mode = 'ExclusiveLock' AND l.granted";
        Statements {
            read_rows: format!(
                "WITH k AS (INSERT INTO {table} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING) \
                 INSERT INTO {permits} (name, slot, permits) VALUES ($1, -1, 0) ON CONFLICT (name, slot) DO NOTHING"
            ),
            read_nowait,
            permit_nowait,
            held_readers: format!(
                "SELECT k.name FROM {table} k JOIN pg_locks r ON {} \
                 WHERE left(k.name, length($1)) = $1 AND k.name <> ''",
                reader_lock("k.name")
            ),
            permit_rows: format!(
                "WITH k AS (INSERT INTO {table} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING), \
                 n AS (INSERT INTO {permits} (name, slot, permits) VALUES ($1, -1, $2) ON CONFLICT (name, slot) DO NOTHING) \
                 INSERT INTO {permits} (name, slot) SELECT $1, g FROM generate_series(0, $2 - 1) g \
                 WHERE NOT EXISTS (SELECT 1 FROM {permits} WHERE name = $1 AND slot = $2 - 1) \
                 ON CONFLICT (name, slot) DO NOTHING"
            ),
            permit_renumber: format!(
                "UPDATE {permits} n SET permits = $2 FROM (SELECT name FROM {permits} \
                 WHERE name = $1 AND slot = -1 FOR UPDATE NOWAIT) free WHERE n.name = free.name AND n.slot = -1"
            ),
            // pg_locks is read only for a key that has ever been a semaphore.
            permit_holders: format!(
                "SELECT n.permits, CASE WHEN n.permits IS NULL THEN false \
                 ELSE EXISTS (SELECT 1 FROM {permits} p {slot_held} WHERE p.name = n.name AND p.slot >= 0) END \
                 FROM (SELECT $1::text AS name) k LEFT JOIN {permits} n ON n.name = k.name AND n.slot = -1"
            ),
            held_permits: format!(
                "SELECT p.name, n.permits FROM {permits} p {slot_held} \
                 JOIN {permits} n ON n.name = p.name AND n.slot = -1 \
                 WHERE left(p.name, length($1)) = $1 AND p.slot >= 0"
            ),
            insert: format!("INSERT INTO {table} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING"),
            lock_nowait,
            lock_wait: lock(""),
            extend: format!(
                "SELECT current_setting('{HELD_MARK}', true) = 'on', set_config('idle_in_transaction_session_timeout', $1, true)"
            ),
            refresh: format!(
                "SELECT current_setting('{HELD_MARK}', true) = 'on', \
                 set_config('idle_in_transaction_session_timeout', $1, true), set_config('lock_timeout', $2, true), \
                 set_config('statement_timeout', current_setting('{SAVED_STATEMENT_TIMEOUT}'), true)"
            ),
            flush: format!(
                "BEGIN; SET LOCAL synchronous_commit = on; SET LOCAL statement_timeout = 0; \
                 INSERT INTO {table} (name) VALUES ('') ON CONFLICT (name) DO NOTHING; \
                 SELECT 1 FROM {table} WHERE name = '' FOR KEY SHARE; COMMIT;"
            ),
            // A lock row share-locked by permit holders or readers names one of them
            // in its xmax too: keys whose slots are held are semaphores, and keys
            // whose readers' gate is held shared are read-held, not exclusive locks.
            holder_pid: format!(
                "SELECT l.pid FROM {table} k JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = k.xmax \
                 AND l.mode = 'ExclusiveLock' AND l.granted WHERE k.name = $1 \
                 AND NOT EXISTS (SELECT 1 FROM {permits} p {slot_held} WHERE p.name = k.name AND p.slot >= 0) \
                 AND NOT {}",
                reader_held("k.name")
            ),
            held: format!(
                "SELECT k.name FROM {table} k JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = k.xmax \
                 AND l.mode = 'ExclusiveLock' AND l.granted WHERE left(k.name, length($1)) = $1 AND k.name <> '' \
                 AND NOT EXISTS (SELECT 1 FROM {permits} p {slot_held} WHERE p.name = k.name AND p.slot >= 0) \
                 AND NOT {}",
                reader_held("k.name")
            ),
            exists: "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL",
            sequence: "SELECT s.cache_size, s.cycle, s.increment_by, c.relpersistence = 'u', \
                       s.min_value, s.max_value, s.start_value, coalesce(s.last_value, s.start_value) \
                       FROM pg_catalog.pg_sequences s \
                       JOIN pg_catalog.pg_namespace n ON n.nspname = s.schemaname \
                       JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = s.sequencename \
                       WHERE s.schemaname = $1 AND s.sequencename = $2",
            // A fixed advisory key: any lockkit process creating any schema serialises here, briefly, once.
            create: format!(
                "BEGIN; SELECT pg_advisory_xact_lock(7236120351244620127); {} COMMIT;",
                names.schema_sql()
            ),
        }
    }
}

/// The row of [`Statements::sequence`], read into [`SequenceSettings`].
pub(crate) type SequenceRow = (i64, bool, i64, bool, i64, i64, i64, i64);

/// What `connect` reads about the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SequenceSettings {
    pub cache: i64,
    pub cycle: bool,
    pub increment: i64,
    pub unlogged: bool,
    pub min: i64,
    pub max: i64,
    pub start: i64,
    /// The last value handed out, or START if none has been since the
    /// sequence was created or restarted (`pg_sequences` does not show a
    /// `RESTART WITH` value not yet handed out).
    pub current: i64,
}

impl From<SequenceRow> for SequenceSettings {
    fn from(
        (cache, cycle, increment, unlogged, min, max, start, current): SequenceRow,
    ) -> SequenceSettings {
        SequenceSettings {
            cache,
            cycle,
            increment,
            unlogged,
            min,
            max,
            start,
            current,
        }
    }
}

/// Why fencing tokens drawn from `sequence` would not always increase, with
/// the `ALTER SEQUENCE` that fixes it; `None` if they would. `settings` is
/// `None` when `sequence` is not a sequence at all.
pub(crate) fn sequence_problem(
    sequence: &str,
    settings: Option<SequenceSettings>,
) -> Option<String> {
    let Some(SequenceSettings {
        cache,
        cycle,
        increment,
        unlogged,
        min,
        max,
        start,
        current,
    }) = settings
    else {
        return Some(format!(
            "{sequence} is not a sequence; fencing tokens need one: `CREATE SEQUENCE {sequence} AS bigint MINVALUE 1 CACHE 1 NO CYCLE`"
        ));
    };
    let mut why = Vec::new();
    let mut fix = Vec::new();
    // A per-session cache hands each session its own block of values, so
    // tokens of different sessions would interleave instead of increasing.
    if cache != 1 {
        why.push(format!(
            "has CACHE {cache}, so fencing tokens drawn by different sessions would not increase"
        ));
        fix.push("CACHE 1".to_owned());
    }
    if cycle {
        why.push(
            "has CYCLE, so it wraps around at its MAXVALUE and fencing tokens would go backwards"
                .to_owned(),
        );
        fix.push("NO CYCLE".to_owned());
    }
    if increment <= 0 {
        why.push(format!(
            "has INCREMENT BY {increment}, so fencing tokens would not increase"
        ));
        fix.push("INCREMENT BY 1".to_owned());
    }
    if unlogged {
        why.push(
            "is UNLOGGED, so a crash resets it and fencing tokens would go backwards".to_owned(),
        );
        fix.push("SET LOGGED".to_owned());
    }
    // Values below 1 are all read as fencing token 0.
    if min < 1 {
        why.push(format!(
            "has MINVALUE {min}, so it can hand out values below 1, all read as fencing token 0, and fencing tokens would not increase"
        ));
        // PostgreSQL refuses a MINVALUE not below MAXVALUE, or above START or
        // the current value. The current value is moved only if below 1: the
        // latest tokens were then all 0, so restarting (at START, 1 or more
        // by then) goes forwards; one of 1 or more must not be restarted.
        // After INCREMENT BY 1 (run before), NO MAXVALUE is the type's maximum.
        let mut f = "MINVALUE 1".to_owned();
        if max <= 1 {
            f.push_str(" NO MAXVALUE");
        }
        if start < 1 {
            f.push_str(" START WITH 1");
        }
        if current < 1 {
            f.push_str(" RESTART");
        }
        fix.push(f);
    }
    if why.is_empty() {
        return None;
    }
    let fix: Vec<String> = fix
        .iter()
        .map(|f| format!("ALTER SEQUENCE {sequence} {f}"))
        .collect();
    Some(format!(
        "sequence {sequence} {}; run `{}`",
        why.join(", and "),
        fix.join("; ")
    ))
}

/// The arguments of the advisory lock that is a key's readers' gate: the
/// lock table's name and the key, each hashed to 32 bits (the two-key form,
/// apart from the one-number advisory locks applications take). A reader
/// takes it shared, for as long as it holds; a writer that waits takes it
/// exclusive. PostgreSQL queues advisory locks, and refuses a `try` whose
/// mode conflicts with a queued request: a waiting writer refuses new
/// readers, which its row lock alone would not (a row's share lock is
/// granted beside a queued `FOR UPDATE`). Two keys whose names hash alike
/// share a gate: a writer waiting on one then also waits for the other's
/// readers and refuses its new ones, for no longer than its wait;
/// exclusion rests on the row locks, never on the gate.
pub(crate) fn readers_gate(table: &str) -> String {
    format!("hashtext('{table}'), hashtext($1)")
}

/// Opens the lock's transaction in one round trip. `idle` is the idle
/// timeout while the grant is being made (see [`grant_idle_timeout`]); the
/// grant's last statement sets it to the TTL. `lock_timeout` bounds any wait
/// (the row lock when waiting, anything else as a safety net). Values are
/// whole milliseconds, so splicing is safe.
///
/// Two server settings would end the lock early, so they are lifted:
/// - `statement_timeout` (a role's or the server's) would cancel a wait
///   for the row before the caller's wait is over. It is kept aside and
///   given back by the grant's last statement, for the holder's own
///   statements. Meanwhile it is `lock_timeout` too: a waiting writer
///   waits twice (the readers' gate, then the row), each wait bounded by
///   `lock_timeout`, so this bounds both together.
/// - `transaction_timeout` (PostgreSQL 17 and newer) would end the lock's
///   transaction, and so the lock, before its deadline. It stays at 0 for
///   the whole transaction. Servers without it skip this (`current_setting`
///   with `missing_ok` is then NULL).
pub(crate) fn begin(idle: Duration, lock_timeout: Duration, check_client: bool) -> String {
    let mut sql = format!(
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}; SET LOCAL lock_timeout = {}; SET LOCAL {HELD_MARK} = 'on'; \
         SELECT set_config('{SAVED_STATEMENT_TIMEOUT}', current_setting('statement_timeout'), true), \
         set_config('statement_timeout', '{}', true), \
         CASE WHEN current_setting('transaction_timeout', true) IS NOT NULL \
         THEN set_config('transaction_timeout', '0', true) END;",
        millis(idle),
        millis(lock_timeout),
        millis(lock_timeout)
    );
    if check_client {
        // A waiter whose client went away (a cancelled acquire) leaves the queue within a second.
        sql.push_str(" SET LOCAL client_connection_check_interval = 1000;");
    }
    sql
}

/// The idle timeout of a grant's transaction until the grant is handed out.
///
/// Between the row lock and the hand-out, the transaction sits idle while
/// another connection flushes the token to disk, for up to the flush's
/// [`budget`](crate::flush::budget). With the TTL alone as the limit, a slow disk would let
/// the server end a grant before it is handed out. Nobody holds a lease
/// yet, so the longer limit costs no safety; it only bounds how long a
/// client that stalls mid-grant keeps the row. The grant's last statement
/// sets the limit to the TTL.
pub(crate) fn grant_idle_timeout(ttl: Duration, response_timeout: Duration) -> Duration {
    ttl.saturating_add(crate::flush::budget(response_timeout))
}

/// Whole milliseconds, at least 1 (0 would mean "no timeout" to PostgreSQL).
pub(crate) fn millis(d: Duration) -> u64 {
    (d.as_millis().min(i32::MAX as u128) as u64).max(1)
}

/// Whether the lock's transaction is open and healthy (fails if it is aborted).
pub(crate) const HELD_CHECK: &str = "SELECT current_setting('lockkit.held', true) = 'on'";

#[cfg(test)]
mod tests {
    use super::*;

    /// `examples/pairs.pgbench.sql`, the lab's pgbench bound, sends what an
    /// uncontended try_acquire + release sends (default names, a 30 s TTL,
    /// the default 5 s response timeout), one line per round trip.
    #[test]
    fn the_pgbench_script_sends_these_statements() {
        let statements = Statements::new(&Names::default());
        let (ttl, rt) = (Duration::from_secs(30), Duration::from_secs(5));
        let key = "'pgbench/' || :client_id";
        // pgbench sends a line's statements in one round trip when `\;` joins them.
        let joined = |sql: &str| sql.replace("; ", " \\; ");
        let expected = [
            "BEGIN;".to_owned(),
            format!(
                "{};",
                statements
                    .lock_nowait
                    .replace("$1", key)
                    .replace("$2", &format!("'{}'", millis(ttl)))
                    .replace("$3", &format!("'{}'", millis(rt)))
                    .replace("$4", &i64::MAX.to_string())
                    .replace("$5", &format!("'{}'", millis(grant_idle_timeout(ttl, rt))))
            ),
            "ROLLBACK;".to_owned(),
            "\\set flush random(1, 32)".to_owned(),
            "\\if :flush = 1".to_owned(),
            joined(&statements.flush),
            "\\endif".to_owned(),
        ];
        let script = include_str!("../examples/pairs.pgbench.sql");
        let sent: Vec<&str> = script.lines().filter(|l| !l.starts_with("--")).collect();
        assert_eq!(sent, expected);
    }

    #[test]
    fn identifiers_are_plain_or_refused() {
        for ok in ["locks", "_x", "Locks_2"] {
            assert!(identifier("table", ok).is_ok(), "{ok}");
        }
        for bad in ["", "2locks", "lo\"cks", "a.b", "a b", "é", &"x".repeat(64)] {
            assert!(identifier("table", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_table_name_leaves_room_for_its_permits_table() {
        let fits = "t".repeat(55);
        assert!(Names::unchecked("s", &fits, "q").check().is_ok());
        let long = "t".repeat(56);
        match Names::unchecked("s", &long, "q").check() {
            Err(Error::InvalidInput {
                field: "table",
                problem,
            }) => assert!(
                problem.contains("56 bytes") && problem.contains("at most 55"),
                "{problem}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn shipped_schema_is_the_default_names_schema() {
        assert_eq!(Names::default().schema_sql(), SCHEMA_SQL);
        let custom = Names::unchecked("app", "mutex", "tokens").schema_sql();
        assert!(
            custom.contains("\"app\".\"mutex\"")
                && custom.contains("\"app\".\"tokens\"")
                && custom.contains("\"app\".\"mutex_permits\""),
            "{custom}"
        );
        assert!(!custom.contains("\"lockkit\""), "{custom}");
    }

    /// The shipped sequence, after some tokens were drawn.
    fn fine() -> SequenceSettings {
        SequenceSettings {
            cache: 1,
            cycle: false,
            increment: 1,
            unlogged: false,
            min: 1,
            max: i64::MAX,
            start: 1,
            current: 42,
        }
    }

    #[test]
    fn only_a_logged_increasing_uncached_non_cycling_sequence_from_1_passes() {
        let seq = "\"s\".\"t\"";
        assert_eq!(sequence_problem(seq, Some(fine())), None);
        let steps_of_7 = SequenceSettings {
            increment: 7,
            ..fine()
        };
        assert_eq!(sequence_problem(seq, Some(steps_of_7)), None);
        let from_5 = SequenceSettings {
            min: 5,
            start: 5,
            ..fine()
        };
        assert_eq!(sequence_problem(seq, Some(from_5)), None);
        let cases = [
            (
                SequenceSettings {
                    cache: 20,
                    ..fine()
                },
                "has CACHE 20",
                "CACHE 1",
            ),
            (
                SequenceSettings {
                    cycle: true,
                    ..fine()
                },
                "has CYCLE",
                "NO CYCLE",
            ),
            (
                SequenceSettings {
                    increment: -1,
                    ..fine()
                },
                "has INCREMENT BY -1",
                "INCREMENT BY 1",
            ),
            (
                SequenceSettings {
                    increment: 0,
                    ..fine()
                },
                "has INCREMENT BY 0",
                "INCREMENT BY 1",
            ),
            (
                SequenceSettings {
                    unlogged: true,
                    ..fine()
                },
                "is UNLOGGED",
                "SET LOGGED",
            ),
            // Already past 0: nothing to restart.
            (
                SequenceSettings { min: 0, ..fine() },
                "has MINVALUE 0",
                "MINVALUE 1",
            ),
            // Started below 1, now past 0: START must follow, the value must not.
            (
                SequenceSettings {
                    min: -10,
                    start: -5,
                    current: 3,
                    ..fine()
                },
                "has MINVALUE -10",
                "MINVALUE 1 START WITH 1",
            ),
            // Still below 1 (or never drawn from): restarted at the new START.
            (
                SequenceSettings {
                    min: -10,
                    start: -5,
                    current: -5,
                    ..fine()
                },
                "has MINVALUE -10",
                "MINVALUE 1 START WITH 1 RESTART",
            ),
            (
                SequenceSettings {
                    min: -10,
                    start: 1,
                    current: 0,
                    ..fine()
                },
                "has MINVALUE -10",
                "MINVALUE 1 RESTART",
            ),
            // MINVALUE must stay below MAXVALUE.
            (
                SequenceSettings {
                    min: 0,
                    max: 1,
                    ..fine()
                },
                "has MINVALUE 0",
                "MINVALUE 1 NO MAXVALUE",
            ),
        ];
        for (settings, why, fix) in cases {
            let message = sequence_problem(seq, Some(settings)).expect("refused");
            assert!(
                message.contains(&format!("sequence {seq} {why}"))
                    && message.ends_with(&format!("run `ALTER SEQUENCE {seq} {fix}`")),
                "{message}"
            );
        }
        // A descending sequence as PostgreSQL makes one by default.
        let descending = SequenceSettings {
            cache: 5,
            cycle: true,
            increment: -2,
            unlogged: true,
            min: i64::MIN,
            max: -1,
            start: -1,
            current: -7,
        };
        let all = sequence_problem(seq, Some(descending)).expect("refused");
        assert!(
            all.contains(&format!(
                "`ALTER SEQUENCE {seq} CACHE 1; ALTER SEQUENCE {seq} NO CYCLE; \
                 ALTER SEQUENCE {seq} INCREMENT BY 1; ALTER SEQUENCE {seq} SET LOGGED; \
                 ALTER SEQUENCE {seq} MINVALUE 1 NO MAXVALUE START WITH 1 RESTART`"
            )),
            "{all}"
        );
        let none = sequence_problem(seq, None).expect("refused");
        assert!(none.contains("is not a sequence"), "{none}");
    }

    #[test]
    fn timeouts_are_never_zero() {
        assert!(begin(Duration::from_micros(10), Duration::ZERO, false).contains("= 1;"));
    }
}
