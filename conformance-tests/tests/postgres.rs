//! The conformance suite against the PostgreSQL of `scripts/servers.sh`.
//! The sabotage is the operator's force release: `pg_terminate_backend` of
//! the holder's session.

use conformance_tests::{Fixture, ForceRelease, conformance_suite, server_url};
use lock_core::Locker;
use lock_postgres::PostgresBackend;

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_POSTGRES_URL")?;
    let connect = || async { Locker::new(PostgresBackend::connect(&url).await.expect("connect")) };
    Some(Fixture::new(
        connect().await,
        connect().await,
        ForceRelease(connect().await),
    ))
}

conformance_suite!(fixture);
