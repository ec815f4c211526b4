//! A fencing token bound into a real PostgreSQL query (feature `sqlx`): the
//! resource-side check as users write it, a stale holder refused, and the
//! values a BIGINT cannot hold refused rather than wrapped.

#![cfg(feature = "sqlx")]

use lockkit::FencingToken;
use sqlx::Connection;
use sqlx::postgres::PgConnection;

async fn database() -> Option<PgConnection> {
    let url = match std::env::var("LOCKKIT_POSTGRES_URL") {
        Ok(url) => url,
        Err(_) if std::env::var("LOCKKIT_REQUIRE_SERVERS").is_ok_and(|v| v == "1") => {
            panic!("LOCKKIT_POSTGRES_URL is not set, and LOCKKIT_REQUIRE_SERVERS=1")
        }
        Err(_) => return None,
    };
    Some(PgConnection::connect(&url).await.expect("connect"))
}

#[tokio::test]
async fn a_token_binds_as_bigint_and_a_stale_one_writes_nothing() {
    let Some(mut db) = database().await else {
        return;
    };
    sqlx::query("CREATE TEMP TABLE fenced (id int PRIMARY KEY, value text, fence bigint NOT NULL)")
        .execute(&mut db)
        .await
        .unwrap();
    sqlx::query("INSERT INTO fenced VALUES (1, 'first', 0)")
        .execute(&mut db)
        .await
        .unwrap();
    let write = |value: &'static str, token: FencingToken| {
        sqlx::query("UPDATE fenced SET value = $1, fence = $2 WHERE id = 1 AND fence <= $2")
            .bind(value)
            .bind(token)
    };
    let newer = write("newer", FencingToken::new(8))
        .execute(&mut db)
        .await
        .unwrap();
    assert_eq!(newer.rows_affected(), 1);
    let stale = write("stale", FencingToken::new(7))
        .execute(&mut db)
        .await
        .unwrap();
    assert_eq!(stale.rows_affected(), 0, "a stale token must write nothing");
    let (value, fence): (String, FencingToken) =
        sqlx::query_as("SELECT value, fence FROM fenced WHERE id = 1")
            .fetch_one(&mut db)
            .await
            .unwrap();
    assert_eq!((value.as_str(), fence), ("newer", FencingToken::new(8)));
}

#[tokio::test]
async fn tokens_a_bigint_cannot_hold_are_refused_not_wrapped() {
    let Some(mut db) = database().await else {
        return;
    };
    let err = sqlx::query("SELECT $1::bigint")
        .bind(FencingToken::new(u64::MAX))
        .execute(&mut db)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    let err = sqlx::query_scalar::<_, FencingToken>("SELECT (-1)::bigint")
        .fetch_one(&mut db)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("never negative"), "{err}");
    let max: FencingToken = sqlx::query_scalar("SELECT $1::bigint")
        .bind(FencingToken::new(i64::MAX as u64))
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(max.get(), i64::MAX as u64);
}
