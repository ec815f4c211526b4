//! The conformance suite against the PostgreSQL of `scripts/servers.sh`.
//! The sabotage ends the holder's session with `pg_terminate_backend`.

use conformance_tests::{Fixture, Sabotage, conformance_suite, server_url};
use lock_core::Locker;
use lock_postgres::PostgresBackend;

struct Terminate(Locker);

#[async_trait::async_trait]
impl Sabotage for Terminate {
    async fn remove_grant(&self, key: &str) {
        assert!(
            self.0
                .force_release(key)
                .await
                .expect("pg_terminate_backend"),
            "no holder of {key} to terminate"
        );
    }
}

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_POSTGRES_URL")?;
    let backend = PostgresBackend::connect(&url).await.expect("connect");
    // The sabotage has its own connections, so a case's budget never blocks it.
    let operator = PostgresBackend::connect(&url).await.expect("connect");
    Some(Fixture::new(
        Locker::new(backend),
        Terminate(Locker::new(operator)),
    ))
}

conformance_suite!(fixture);
