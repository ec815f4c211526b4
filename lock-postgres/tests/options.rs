//! Settings at the ends of their range, on the shared server: each either
//! works or is refused with an input error naming it, and nothing panics.

use lock_core::Wait;
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, GuardOptions, Locker};
use lock_postgres::{PostgresBackend, PostgresOptions};

fn with(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Connects in a task of its own, so that a panic is reported as one.
async fn connected(options: Result<PostgresOptions, Error>) -> Result<PostgresBackend, Error> {
    tokio::spawn(async move { PostgresBackend::connect_with(options?).await })
        .await
        .expect("connecting panicked")
}

/// A backend that connected holds a lock in a guard, makes a contender
/// wait in the server until it gives up, and releases.
async fn works(what: &str, backend: PostgresBackend) {
    let locker = Locker::new(backend);
    let key = unique_key("pg-options");
    let run = tokio::spawn(async move {
        let guard = locker
            .guard(&key, GuardOptions::new(Duration::from_secs(5)))
            .await
            .expect("guard");
        let waited = locker
            .acquire(
                &key,
                Duration::from_secs(5),
                Wait::at_most(Duration::from_millis(200)),
            )
            .await;
        assert!(
            waited.as_ref().is_err_and(Error::is_timed_out),
            "{waited:?}"
        );
        guard.release().await.expect("release");
    });
    if let Err(e) = run.await {
        panic!("{what}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_held_locks_past_the_limit_is_refused_by_name() {
    let Some(url) = server_url("LOCKKIT_POSTGRES_URL") else {
        return;
    };
    let limit = PostgresOptions::MAX_HELD_LOCKS;
    let refused = |what: &str, outcome: Result<PostgresBackend, Error>| match outcome {
        Err(Error::InvalidInput {
            field: "max_held_locks",
            problem,
        }) => assert!(problem.contains(&limit.to_string()), "{what}: {problem}"),
        other => panic!("{what}: expected an input error naming max_held_locks, got {other:?}"),
    };
    for n in [limit as u64 + 1, usize::MAX as u64, u64::MAX] {
        let url = with(&url, &format!("max_held_locks={n}"));
        refused(&url, connected(PostgresOptions::from_url(&url)).await);
    }
    for n in [limit + 1, usize::MAX] {
        let options = PostgresOptions::from_url(&url).map(|o| o.max_held_locks(n));
        refused(&format!("max_held_locks({n})"), connected(options).await);
    }
    let options = PostgresOptions::from_url(&url).map(|o| o.max_held_locks(limit));
    works(
        "the largest budget",
        connected(options).await.expect("connect"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_timeouts_mean_no_limit_without_a_panic() {
    let Some(url) = server_url("LOCKKIT_POSTGRES_URL") else {
        return;
    };
    for d in [Duration::MAX, Duration::from_millis(u64::MAX)] {
        let options = PostgresOptions::from_url(&url).map(|o| o.connect_timeout(d));
        let what = format!("connect timeout {d:?}");
        works(&what, connected(options).await.expect(&what)).await;
        let options = PostgresOptions::from_url(&url).map(|o| o.response_timeout(d));
        let what = format!("response timeout {d:?}");
        works(&what, connected(options).await.expect(&what)).await;
    }
    for option in ["connect_timeout_ms", "response_timeout_ms"] {
        let url = with(&url, &format!("{option}={}", u64::MAX));
        let backend = connected(PostgresOptions::from_url(&url)).await;
        works(option, backend.expect(option)).await;
    }
}

/// The connection settings an application built its own pool with give a
/// working backend, and no password reaches the backend's messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_own_connect_options_give_a_working_backend() {
    let Some(url) = server_url("LOCKKIT_POSTGRES_URL") else {
        return;
    };
    let app: sqlx::postgres::PgConnectOptions = url.parse().expect("the driver reads the URL");
    let app = app.password("not-needed-but-secret");
    let options = PostgresOptions::from_connect_options(app.clone()).expect("options");
    assert!(!format!("{options:?}").contains("not-needed-but-secret"));
    works(
        "connect options",
        connected(Ok(options)).await.expect("connect"),
    )
    .await;

    let tls = app.ssl_mode(sqlx::postgres::PgSslMode::Require);
    let built_with_tls = cfg!(feature = "tls");
    match PostgresOptions::from_connect_options(tls) {
        Ok(_) => assert!(built_with_tls, "TLS accepted without the tls feature"),
        Err(e) => assert!(!built_with_tls && e.to_string().contains("tls"), "{e}"),
    }
}

/// Options read from the URL and adjusted with the setters connect, and
/// each setting takes effect: one held lock is the limit the setter set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_from_the_url_and_the_setters_connect() {
    let Some(url) = server_url("LOCKKIT_POSTGRES_URL") else {
        return;
    };
    let options = PostgresOptions::from_url(&with(&url, "max_held_locks=8"))
        .expect("options")
        .max_held_locks(1)
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(4))
        .create_schema(true);
    assert_eq!(options.get_max_held_locks(), 1);
    assert_eq!(options.get_response_timeout(), Duration::from_secs(4));
    let locker = Locker::new(connected(Ok(options)).await.expect("connect"));
    let ttl = Duration::from_secs(5);
    let held = locker
        .try_acquire(&unique_key("pg-options"), ttl)
        .await
        .expect("granted");
    let second = locker.try_acquire(&unique_key("pg-options"), ttl).await;
    assert!(
        matches!(second, Err(Error::LimitReached { .. })),
        "{second:?}"
    );
    locker.release(held).await.expect("release");
}

/// A closed port: connecting there fails at once as unavailable, so an
/// input error shows that the check ran before any connection.
const CLOSED: &str = "postgres://lockkit@127.0.0.1:1/db";

#[tokio::test]
async fn a_setters_bad_value_is_refused_by_connect_with_naming_the_option_before_connecting() {
    let options = || PostgresOptions::from_url(CLOSED).expect("a plain URL");
    let zero = Duration::ZERO;
    for (option, bad) in [
        ("connect_timeout_ms", options().connect_timeout(zero)),
        ("response_timeout_ms", options().response_timeout(zero)),
        ("max_held_locks", options().max_held_locks(0)),
        ("table", options().names("s", "t-1", "q")),
    ] {
        let checked = bad.check();
        assert!(
            matches!(&checked, Err(Error::InvalidInput { field, .. }) if *field == option),
            "check: {checked:?}"
        );
        let connected = PostgresBackend::connect_with(bad).await;
        assert!(
            matches!(&connected, Err(Error::InvalidInput { field, .. }) if *field == option),
            "{option}: {connected:?}"
        );
    }
    // The same URL with good values goes on to connect, and finds no server.
    let connected = PostgresBackend::connect_with(options()).await;
    assert!(
        matches!(connected, Err(Error::Unavailable { .. })),
        "{connected:?}"
    );
}

#[test]
fn the_schema_sql_of_a_bad_name_is_refused_naming_it() {
    let options = PostgresOptions::from_url(CLOSED).expect("a plain URL");
    let sql = options.clone().names("app", "locks", "tokens").schema_sql();
    assert!(sql.is_ok_and(|sql| sql.contains("\"app\".\"tokens\"")));
    let refused = options.names("app", "locks", "tokens;drop").schema_sql();
    assert!(
        matches!(
            &refused,
            Err(Error::InvalidInput {
                field: "sequence",
                ..
            })
        ),
        "{refused:?}"
    );
}
