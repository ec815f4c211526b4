//! A [`FencingToken`] bound straight into a query (feature `sqlx`), for the
//! resource-side check, on any database sqlx speaks, as a signed 64-bit
//! integer (`BIGINT`):
//!
//! ```sql
//! UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2
//! ```
//!
//! ```ignore
//! sqlx::query("UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2")
//!     .bind(balance)
//!     .bind(guard.fencing_token())
//!     .bind(id)
//!     .execute(&pool)
//!     .await?;
//! ```
//!
//! A token past `i64::MAX` (which no backend's counter reaches) is refused
//! with an error rather than stored wrapped, which would let a stale holder
//! through; a negative value read back is refused the same way.

use sqlx_core::database::Database;
use sqlx_core::decode::Decode;
use sqlx_core::encode::{Encode, IsNull};
use sqlx_core::error::BoxDynError;
use sqlx_core::types::Type;

use crate::FencingToken;

impl<DB: Database> Type<DB> for FencingToken
where
    i64: Type<DB>,
{
    fn type_info() -> DB::TypeInfo {
        <i64 as Type<DB>>::type_info()
    }

    fn compatible(ty: &DB::TypeInfo) -> bool {
        <i64 as Type<DB>>::compatible(ty)
    }
}

impl<'q, DB: Database> Encode<'q, DB> for FencingToken
where
    i64: Encode<'q, DB>,
{
    fn encode_by_ref(
        &self,
        buf: &mut <DB as Database>::ArgumentBuffer<'q>,
    ) -> Result<IsNull, BoxDynError> {
        let value = i64::try_from(*self)
            .map_err(|_| format!("fencing token {self} does not fit a signed 64-bit column"))?;
        value.encode_by_ref(buf)
    }
}

impl<'r, DB: Database> Decode<'r, DB> for FencingToken
where
    i64: Decode<'r, DB>,
{
    fn decode(value: <DB as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        let raw = <i64 as Decode<'r, DB>>::decode(value)?;
        FencingToken::try_from(raw)
            .map_err(|_| format!("{raw} is not a fencing token: tokens are never negative").into())
    }
}
