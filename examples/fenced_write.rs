//! A worker that fences its writes: the lock's token goes into every
//! `UPDATE`, and the row refuses a token older than one it has seen. A
//! holder paused past its lock's end (a long GC pause, a stalled VM) then
//! writes nothing, instead of overwriting its successor's work.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --example fenced_write -F sqlx               # lock on memory://
//! LOCK_URL=redis://127.0.0.1:6379 DATABASE_URL=... cargo run --example fenced_write -F sqlx,redis
//! ```

use std::time::Duration;

use lockkit::{FencingToken, GuardOptions};
use sqlx::{Connection, PgConnection};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lock_url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".into());
    let Ok(database) = std::env::var("DATABASE_URL") else {
        eprintln!("set DATABASE_URL to a PostgreSQL database to write to");
        std::process::exit(2);
    };
    let locker = lockkit::connect(&lock_url).await?;
    let mut db = PgConnection::connect(&database).await?;
    // A table of this session's own, so that runs against different lock
    // backends (whose tokens differ) do not see each other's fences.
    sqlx::query(
        "CREATE TEMP TABLE fenced_accounts \
         (id int PRIMARY KEY, balance bigint NOT NULL, fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&mut db)
    .await?;
    sqlx::query("INSERT INTO fenced_accounts (id, balance) VALUES (1, 0)")
        .execute(&mut db)
        .await?;

    let options = GuardOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));

    // An earlier holder, whose lock ends while it is paused...
    let paused = locker.guard("accounts/1", options).await?;
    let stale_token = paused.fencing_token();
    paused.release().await?;

    // ...a newer holder writes...
    let guard = locker.guard("accounts/1", options).await?;
    let written = deposit(&mut db, 100, guard.fencing_token()).await?;
    println!(
        "holder with token {}: {written} row written",
        guard.fencing_token()
    );
    guard.release().await?;

    // ...and the earlier holder wakes up and tries to write: refused.
    let written = deposit(&mut db, 999, stale_token).await?;
    println!("paused holder with token {stale_token}: {written} rows written (refused: stale)");
    assert_eq!(written, 0);
    Ok(())
}

/// The resource-side check: one atomic statement that writes only if no
/// newer holder has written first.
async fn deposit(db: &mut PgConnection, amount: i64, token: FencingToken) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "UPDATE fenced_accounts SET balance = balance + $1, fence = $2 WHERE id = 1 AND fence <= $2",
    )
    .bind(amount)
    .bind(token)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}
