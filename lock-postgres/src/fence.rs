//! The fencing check for data kept outside the lock's transaction.

use lock_core::{FencingToken, Result, StaleToken};
use sqlx::postgres::PgConnection;

use crate::{errors, sql::identifier};

/// A table remembering, for each protected resource, the highest fencing
/// token that wrote to it; writes carrying an older token are refused.
///
/// Call [`admit`](Self::admit) in the same transaction as the write it
/// guards. The upsert locks the resource's fence row until that transaction
/// ends, so a stale holder cannot slip in between the check and the write:
///
/// ```no_run
/// # async fn demo(token: lock_core::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
/// use lock_postgres::{FenceTable, sqlx::{self, Connection}};
///
/// let fences = FenceTable::new("public", "fences")?;
/// let mut conn = sqlx::PgConnection::connect("postgres://app@db/app").await?;
/// sqlx::raw_sql(&fences.create_sql()).execute(&mut conn).await?;
///
/// let mut tx = conn.begin().await?;
/// match fences.admit(&mut tx, "invoice/42", token).await? {
///     Ok(()) => {
///         sqlx::query("UPDATE invoices SET state = 'sent' WHERE id = 42").execute(&mut *tx).await?;
///         tx.commit().await?;
///     }
///     Err(stale) => eprintln!("refused: {stale}"), // dropping `tx` rolls back
/// }
/// # Ok(()) }
/// ```
///
/// When the protected rows can carry a fence column themselves, the same
/// check is one statement; zero rows updated means a newer holder wrote first:
///
/// ```sql
/// UPDATE invoices SET state = 'sent', fence = $1 WHERE id = 42 AND fence <= $1;
/// ```
///
/// (`<=` admits the same holder's next write; use `<` to admit each token once.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceTable {
    table: String,
}

impl FenceTable {
    /// A fence table at `schema.table`; both must be plain identifiers.
    pub fn new(schema: &str, table: &str) -> Result<FenceTable> {
        identifier("schema", schema)?;
        identifier("table", table)?;
        Ok(FenceTable {
            table: format!("\"{schema}\".\"{table}\""),
        })
    }

    /// The statement creating the table if it is missing.
    pub fn create_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (resource text PRIMARY KEY, fence bigint NOT NULL)",
            self.table
        )
    }

    /// Records `token` for `resource` if no greater token wrote to it before,
    /// and returns [`StaleToken`] otherwise. Run it in the transaction of the
    /// write it guards, and commit only if it admitted the token.
    pub async fn admit(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        token: FencingToken,
    ) -> Result<std::result::Result<(), StaleToken>> {
        let table = &self.table;
        let value = i64::try_from(token.get()).unwrap_or(i64::MAX);
        let upsert = format!(
            "INSERT INTO {table} AS f (resource, fence) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence WHERE f.fence <= EXCLUDED.fence"
        );
        let admitted = sqlx::query(&upsert)
            .bind(resource)
            .bind(value)
            .execute(&mut *conn)
            .await
            .map_err(|e| errors::backend("the fence check failed", e))?
            .rows_affected();
        if admitted == 1 {
            return Ok(Ok(()));
        }
        let highest: i64 =
            sqlx::query_scalar(&format!("SELECT fence FROM {table} WHERE resource = $1"))
                .bind(resource)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| errors::backend("reading the fence failed", e))?;
        Ok(Err(StaleToken {
            offered: token,
            highest: FencingToken::new(highest as u64),
        }))
    }
}
