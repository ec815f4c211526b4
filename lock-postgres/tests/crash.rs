//! Fencing tokens across a crash of a private PostgreSQL server
//! (lock-testkit): SIGKILL to every server process, so whatever WAL was
//! still in the server's buffers is lost, as in a power failure.

use std::time::Duration;

use lock_core::Locker;
use lock_postgres::PostgresBackend;
use lock_testkit::Postgres;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_server_crash() {
    let server = Postgres::start().expect("start postgres");
    let locker = Locker::new(
        PostgresBackend::connect(&server.url())
            .await
            .expect("connect"),
    );
    let keys = ["crash/a", "crash/b", "crash/c"];
    // The rows exist from here on, so the grants below insert nothing and
    // commit nothing: only the token's own flush can put their WAL on disk.
    for key in keys {
        let lease = locker.try_acquire(key, TTL).await.unwrap();
        locker.release(lease).await.unwrap();
    }
    let mut highest = 0;
    for round in 0..3 {
        // After a checkpoint the next `nextval` writes a WAL record (it
        // otherwise logs 32 values ahead), and it is the record a crash loses.
        server.psql("CHECKPOINT").expect("checkpoint");
        let mut leases = Vec::new();
        for key in keys {
            let lease = locker.try_acquire(key, TTL).await.unwrap();
            let token = lease.fencing_token().get();
            assert!(token > highest, "round {round}: {token} after {highest}");
            highest = token;
            leases.push(lease);
        }
        // The holders are still in their transactions: nothing has ended them.
        server.kill().expect("kill");
        drop(leases);
        server.restart().expect("restart");
        assert_eq!(
            server
                .psql("SELECT count(*) FROM lockkit.locks WHERE name LIKE 'crash/%'")
                .unwrap(),
            "3",
            "the committed rows did not survive the crash: this test would prove nothing"
        );
        // The same backend: its idle connections died with the server.
        let lease = locker.try_acquire(keys[0], TTL).await.unwrap();
        let token = lease.fencing_token().get();
        assert!(
            token > highest,
            "round {round}: token {token} after the crash, though {highest} was handed out before it"
        );
        highest = token;
        locker.release(lease).await.unwrap();
    }
}
