//! The backend's settings: parsed from a `postgres://` URL or built in code.

use std::str::FromStr;
use std::time::Duration;

use lock_core::{Error, Result, url::redact};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::sql::Names;

/// The driver's query parameters (sqlx's, in its spellings), passed on to it.
/// Any other parameter is refused: the driver would ignore it with a
/// warning that logs its value, and a misspelt `table` or `sequence` would
/// quietly put two applications' locks in different places.
const DRIVER_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Query parameters this crate reads; the driver's go to it.
const OWN_PARAMS: &[&str] = &[
    "max_held_locks",
    "connect_timeout_ms",
    "response_timeout_ms",
    "schema",
    "table",
    "sequence",
    "create_schema",
];

/// Settings of a [`PostgresBackend`](crate::PostgresBackend).
///
/// Built from a URL with [`PostgresOptions::from_url`] (or from the
/// application's own [`PgConnectOptions`] with
/// [`from_connect_options`](Self::from_connect_options)), then adjusted with
/// the setters, each named after its URL option. The setters only store
/// their value; [`PostgresBackend::connect_with`](crate::PostgresBackend::connect_with)
/// checks the values before it opens any connection (as [`check`](Self::check)
/// does, without connecting), and its error names the URL option:
///
/// ```
/// use std::time::Duration;
/// use lock_postgres::PostgresOptions;
///
/// let options = PostgresOptions::from_url("postgres://app:secret@db:5432/app?max_held_locks=8")?
///     .response_timeout(Duration::from_secs(2))
///     .create_schema(false);
/// options.check()?;
/// assert_eq!(options.get_max_held_locks(), 8);
/// assert!(!format!("{options:?}").contains("secret"));
///
/// let err = options.max_held_locks(0).check().unwrap_err();
/// assert!(err.to_string().contains("max_held_locks"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    pub(crate) connect: PgConnectOptions,
    pub(crate) endpoint: String,
    // These four are stored as the setters got them, and checked by
    // `check` before anything connects.
    pub(crate) names: Names,
    pub(crate) max_held_locks: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) create_schema: bool,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("endpoint", &self.endpoint)
            .field("table", &self.names.table())
            .field("sequence", &self.names.sequence())
            .field("max_held_locks", &self.max_held_locks)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("create_schema", &self.create_schema)
            .finish_non_exhaustive()
    }
}

impl PostgresOptions {
    /// Default number of locks one backend may hold at once (each pins a connection).
    pub const DEFAULT_MAX_HELD_LOCKS: usize = 32;
    /// The most locks one backend may hold at once: PostgreSQL's own
    /// ceiling on connections (`MAX_BACKENDS`, 2^18 - 1), since each pins one.
    pub const MAX_HELD_LOCKS: usize = 262_143;
    /// Default time allowed to open a connection.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Default time allowed for one statement's reply.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

    /// Parses `postgres://` or `postgresql://` URLs. The driver's options
    /// (`sslmode`, `application_name`, `options`, `sslrootcert`, ...) are passed
    /// to the driver; this crate reads `max_held_locks`, `connect_timeout_ms`,
    /// `response_timeout_ms`, `schema`, `table`, `sequence` and `create_schema`.
    /// Any other parameter is refused, named (its value is never shown).
    pub fn from_url(url: &str) -> Result<PostgresOptions> {
        lock_core::url::hide_if_ambiguous(url, Self::read_url(url))
    }

    /// Options over the connection settings an application already has:
    /// the ones its own pool was built with
    /// (`(*pool.connect_options()).clone()`), so that lockkit reaches the
    /// same database as the same user, with the same TLS. lockkit opens
    /// connections of its own from them rather than borrowing the pool's:
    /// a held lock keeps its connection in an open transaction for as long
    /// as it is held, which would starve the application's pool.
    ///
    /// ```
    /// use lock_postgres::PostgresOptions;
    /// use sqlx::postgres::PgConnectOptions;
    ///
    /// let app = PgConnectOptions::new().host("db.internal").database("billing").username("app");
    /// let options = PostgresOptions::from_connect_options(app)?.create_schema(false);
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn from_connect_options(connect: PgConnectOptions) -> Result<PostgresOptions> {
        let endpoint = format!(
            "postgres://{}:{}/{}",
            connect.get_host(),
            connect.get_port(),
            connect.get_database().unwrap_or_default()
        );
        let needs_tls = !matches!(
            connect.get_ssl_mode(),
            PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer
        );
        if needs_tls && !cfg!(feature = "tls") {
            return Err(Error::invalid(
                "connect_options",
                format!(
                    "{endpoint}: this sslmode needs TLS, which lock-postgres was built without (cargo feature `tls`)"
                ),
            ));
        }
        Ok(PostgresOptions {
            connect,
            endpoint,
            names: Names::default(),
            max_held_locks: Self::DEFAULT_MAX_HELD_LOCKS,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            create_schema: true,
        })
    }

    fn read_url(url: &str) -> Result<PostgresOptions> {
        lock_core::url::check_user_info(url)?;
        let redacted = redact(url);
        let bad = |problem: String| Error::invalid("url", format!("{redacted}: {problem}"));
        let mut parsed = url::Url::parse(url).map_err(|e| bad(format!("not a URL: {e}")))?;
        if !crate::SCHEMES.contains(&parsed.scheme()) {
            return Err(bad(format!(
                "scheme `{}` is not one of {}",
                parsed.scheme(),
                crate::SCHEMES.join(", ")
            )));
        }
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let own = |name: &str| {
            pairs
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let is_driver =
            |k: &str| DRIVER_PARAMS.contains(&k) || (k.starts_with("options[") && k.ends_with(']'));
        if let Some((unknown, _)) = pairs
            .iter()
            .find(|(k, _)| !OWN_PARAMS.contains(&k.as_str()) && !is_driver(k))
        {
            // Named, never shown with its value, which may be a secret.
            return Err(bad(format!(
                "unknown parameter `{unknown}`; known: {}, and the driver's {}",
                OWN_PARAMS.join(", "),
                DRIVER_PARAMS.join(", ")
            )));
        }
        let driver: Vec<_> = pairs.iter().filter(|(k, _)| is_driver(k)).collect();
        if driver.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(driver);
        }
        let connect = PgConnectOptions::from_str(parsed.as_str())
            .map_err(|e| bad(format!("rejected by the driver: {e}")))?;

        let needs_tls = !matches!(
            connect.get_ssl_mode(),
            PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer
        );
        if needs_tls && !cfg!(feature = "tls") {
            return Err(bad("this sslmode needs TLS, which lock-postgres was built without (cargo feature `tls`)".into()));
        }
        let number = |name: &str| -> Result<Option<u64>> {
            own(name)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| bad(format!("`{name}` must be a whole number, got `{v}`")))
                })
                .transpose()
        };
        let mut options = PostgresOptions {
            connect,
            endpoint: redacted.clone(),
            names: Names::default(),
            max_held_locks: Self::DEFAULT_MAX_HELD_LOCKS,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            create_schema: true,
        };
        if let Some(n) = number("max_held_locks")? {
            options = options.max_held_locks(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(ms) = number("connect_timeout_ms")? {
            options = options.connect_timeout(Duration::from_millis(ms));
        }
        if let Some(ms) = number("response_timeout_ms")? {
            options = options.response_timeout(Duration::from_millis(ms));
        }
        let schema = own("schema").unwrap_or(options.names.schema());
        let table = own("table").unwrap_or(options.names.table_name());
        let sequence = own("sequence").unwrap_or(options.names.sequence_name());
        options.names = Names::unchecked(schema, table, sequence);
        if let Some(v) = own("create_schema") {
            options.create_schema = match v {
                "true" | "1" | "on" => true,
                "false" | "0" | "off" => false,
                _ => {
                    return Err(bad(format!(
                        "`create_schema` must be true or false, got `{v}`"
                    )));
                }
            };
        }
        options.check()?;
        Ok(options)
    }

    /// Sets how many locks this backend may hold at once, from 1 to
    /// [`MAX_HELD_LOCKS`](Self::MAX_HELD_LOCKS). Each held lock (and each
    /// `acquire` waiting in the server) pins one connection; past the limit,
    /// `try_acquire` fails at once with [`Error::LimitReached`] and `acquire`
    /// queues for a connection within its wait. `connect_with` refuses any
    /// other value, naming `max_held_locks`.
    pub fn max_held_locks(mut self, max: usize) -> Self {
        self.max_held_locks = max;
        self
    }

    /// Sets the time allowed to open a connection (URL option
    /// `connect_timeout_ms`, default 5 s): at least 1 ms, or `connect_with`
    /// refuses it naming `connect_timeout_ms`; a value past what the clock
    /// can count, `Duration::MAX`, means no limit.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the time allowed for one statement's reply, not for waiting on
    /// a lock (URL option `response_timeout_ms`, default 5 s): at least
    /// 1 ms, or `connect_with` refuses it naming `response_timeout_ms`; a
    /// value past what the clock can count, `Duration::MAX`, means no
    /// limit. It is also the session's `lock_timeout`, which the server
    /// caps at 2^31 - 1 ms (24.8 days).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Sets the schema, table and sequence names (URL options `schema`,
    /// `table`, `sequence`; default `lockkit`, `locks`, `fencing_tokens`).
    /// Each must be a plain identifier: ASCII letters, digits and `_`, not
    /// starting with a digit, at most 63 bytes, or `connect_with` refuses
    /// it, naming which.
    pub fn names(mut self, schema: &str, table: &str, sequence: &str) -> Self {
        self.names = Names::unchecked(schema, table, sequence);
        self
    }

    /// Checks every value as
    /// [`PostgresBackend::connect_with`](crate::PostgresBackend::connect_with)
    /// does before it connects, without connecting: the error names the URL
    /// option (`max_held_locks`, `connect_timeout_ms`, `table`, ...).
    pub fn check(&self) -> Result<()> {
        if !(1..=Self::MAX_HELD_LOCKS).contains(&self.max_held_locks) {
            return Err(Error::invalid(
                "max_held_locks",
                format!(
                    "`max_held_locks` is {}; it must be from 1 to {} (PostgreSQL's most connections, one per held lock)",
                    self.max_held_locks,
                    Self::MAX_HELD_LOCKS
                ),
            ));
        }
        lock_core::raw::validate::timeout("connect_timeout_ms", self.connect_timeout)?;
        lock_core::raw::validate::timeout("response_timeout_ms", self.response_timeout)?;
        self.names.check()
    }

    /// Whether `connect` creates the schema, table and sequence when they are
    /// missing (URL option `create_schema`, default true). Turn it off when
    /// migrations are managed elsewhere with [`schema_sql`](Self::schema_sql).
    pub fn create_schema(mut self, create: bool) -> Self {
        self.create_schema = create;
        self
    }

    /// The limit on locks held at once.
    pub fn get_max_held_locks(&self) -> usize {
        self.max_held_locks
    }

    /// The time allowed to open a connection.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The time allowed for one statement's reply.
    pub fn get_response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The statements that create the schema, table and sequence for these
    /// names; [`SCHEMA_SQL`](crate::SCHEMA_SQL) for the default names. A
    /// name that is not a plain identifier is refused, naming which, as
    /// `connect_with` does.
    pub fn schema_sql(&self) -> Result<String> {
        self.names.check()?;
        Ok(self.names.schema_sql())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_parameters_are_read_and_driver_parameters_passed_on() {
        let o = PostgresOptions::from_url(
            "postgresql://u:pw@db.example:6543/app?sslmode=disable&application_name=billing&max_held_locks=3&table=my_locks&response_timeout_ms=250&options[search_path]=app",
        )
        .unwrap();
        assert_eq!(o.max_held_locks, 3);
        assert_eq!(o.response_timeout, Duration::from_millis(250));
        assert_eq!(o.names.table(), "\"lockkit\".\"my_locks\"");
        assert_eq!(o.connect.get_application_name(), Some("billing"));
        assert_eq!(o.connect.get_port(), 6543);
        assert_eq!(o.connect.get_database(), Some("app"));
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("pw") && shown.contains("db.example"),
            "{shown}"
        );
    }

    /// Each option's range, at its ends: `Ok` or the field an input error names.
    #[test]
    fn options_are_accepted_within_their_range_and_refused_by_name_outside_it() {
        let field =
            |query: &str| match PostgresOptions::from_url(&format!("postgres://h/db?{query}")) {
                Ok(_) => "ok",
                Err(Error::InvalidInput { field, .. }) => field,
                Err(e) => panic!("{query}: {e}"),
            };
        for (query, expect) in [
            ("max_held_locks=1", "ok"),
            ("max_held_locks=262143", "ok"),
            ("max_held_locks=0", "max_held_locks"),
            ("max_held_locks=262144", "max_held_locks"),
            ("max_held_locks=18446744073709551615", "max_held_locks"),
            ("max_held_locks=18446744073709551616", "url"),
            ("max_held_locks=-1", "url"),
            ("connect_timeout_ms=1", "ok"),
            ("connect_timeout_ms=18446744073709551615", "ok"),
            ("connect_timeout_ms=0", "connect_timeout_ms"),
            ("connect_timeout_ms=1.5", "url"),
            ("response_timeout_ms=1", "ok"),
            ("response_timeout_ms=18446744073709551615", "ok"),
            ("response_timeout_ms=0", "response_timeout_ms"),
            ("response_timeout_ms=", "url"),
            ("schema=_a1", "ok"),
            ("table=t", "ok"),
            (&format!("sequence={}", "s".repeat(63)), "ok"),
            (&format!("sequence={}", "s".repeat(64)), "sequence"),
            ("schema=1a", "schema"),
            ("table=", "table"),
            ("table=a-b", "table"),
            ("create_schema=off", "ok"),
            ("create_schema=yes", "url"),
            ("unknown=1", "url"),
        ] {
            assert_eq!(field(query), expect, "{query}");
        }
    }

    #[test]
    fn bad_values_are_refused_without_the_password() {
        for (url, expect) in [
            ("postgres://u:pw@h/db?max_held_locks=0", "from 1 to 262143"),
            (
                "postgres://u:pw@h/db?max_held_locks=262144",
                "from 1 to 262143",
            ),
            (
                "postgres://u:pw@h/db?max_held_locks=18446744073709551615",
                "from 1 to 262143",
            ),
            ("postgres://u:pw@h/db?max_held_locks=many", "whole number"),
            (
                "postgres://u:pw@h/db?response_timeout_ms=0",
                "at least 1 ms",
            ),
            ("postgres://u:pw@h/db?connect_timeout_ms=0", "at least 1 ms"),
            ("postgres://u:pw@h/db?table=locks;drop", "plain identifier"),
            ("postgres://u:pw@h/db?create_schema=maybe", "true or false"),
            ("mysql://u:pw@h/db", "scheme"),
            (
                "postgres://u:pw@h/db?tabel=my_locks",
                "unknown parameter `tabel`",
            ),
            (
                "postgres://u@h/db?pasword=hunter2",
                "unknown parameter `pasword`",
            ),
            // A password with an unencoded `?`: the rest reads as a query.
            (
                "postgres://u:1?hunter2@h/db",
                "postgres://***: the URL is refused",
            ),
            #[cfg(not(feature = "tls"))]
            ("postgres://u:pw@h/db?sslmode=require", "feature `tls`"),
        ] {
            let err = PostgresOptions::from_url(url).unwrap_err().to_string();
            assert!(err.contains(expect), "{url}: {err}");
            assert!(
                !err.contains("pw@") && !err.contains("hunter2"),
                "{url}: {err}"
            );
        }
    }
}
