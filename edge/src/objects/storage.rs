//! Durable Object SQL storage as the objects' [`Sql`] (Wasm only).
//!
//! Invariant kept here: a value is bound as the JavaScript value the
//! objects always bound (numbers as numbers, text as strings), and a
//! storage error is a 500 `queue_storage`, never a panic.

use serde::de::DeserializeOwned;
use worker::{SqlStorage, SqlStorageValue};

use crate::api::error::ApiResult;
use crate::store::sql::{Sql, SqlValue, storage_error};

/// An object's `SqlStorage`.
pub struct DoSql(pub SqlStorage);

fn bind(params: &[SqlValue]) -> Vec<SqlStorageValue> {
    params
        .iter()
        .map(|p| match p {
            SqlValue::Null => SqlStorageValue::Null,
            SqlValue::Int(i) => SqlStorageValue::Integer(*i),
            SqlValue::Real(f) => SqlStorageValue::Float(*f),
            SqlValue::Text(s) => SqlStorageValue::String(s.clone()),
        })
        .collect()
}

impl Sql for DoSql {
    fn exec(&self, query: &str, params: &[SqlValue]) -> ApiResult<u64> {
        let cursor = self.0.exec(query, bind(params)).map_err(storage_error)?;
        Ok(cursor.rows_written() as u64)
    }

    fn rows<T: DeserializeOwned>(&self, query: &str, params: &[SqlValue]) -> ApiResult<Vec<T>> {
        self.0
            .exec(query, bind(params))
            .map_err(storage_error)?
            .to_array::<T>()
            .map_err(storage_error)
    }
}
