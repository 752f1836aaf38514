//! The SQL trait the objects' logic runs on, and the key/value table it
//! keeps settings in. See the part's doc (`store`) for why a SQL trait.
//!
//! Invariants kept here:
//! - [`Meta`] is the only writer of its table, so its memory copy cannot
//!   go stale, and writing a value equal to the stored one writes nothing
//!   (reads that re-assert a setting stay write-free);
//! - a failed statement is an [`ApiError`] (500 `queue_storage` from the
//!   store), never a panic.

use std::cell::RefCell;
use std::collections::HashMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::api::error::{ApiError, ApiResult};

/// A value bound to a statement's `?`.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl From<u64> for SqlValue {
    /// An integer when it fits `i64`; a larger one as the float a
    /// JavaScript number would have made of it.
    fn from(v: u64) -> Self {
        i64::try_from(v).map_or(SqlValue::Real(v as f64), SqlValue::Int)
    }
}

impl From<u32> for SqlValue {
    fn from(v: u32) -> Self {
        SqlValue::Int(i64::from(v))
    }
}

impl From<usize> for SqlValue {
    fn from(v: usize) -> Self {
        SqlValue::from(v as u64)
    }
}

impl From<bool> for SqlValue {
    /// SQLite has no booleans: 1 or 0.
    fn from(v: bool) -> Self {
        SqlValue::Int(i64::from(v))
    }
}

impl From<&str> for SqlValue {
    fn from(v: &str) -> Self {
        SqlValue::Text(v.to_string())
    }
}

impl From<String> for SqlValue {
    fn from(v: String) -> Self {
        SqlValue::Text(v)
    }
}

impl From<Option<&str>> for SqlValue {
    fn from(v: Option<&str>) -> Self {
        v.map_or(SqlValue::Null, SqlValue::from)
    }
}

/// An object's SQL storage: SQLite, on Durable Object storage in the
/// Worker and in memory in host tests. Synchronous, as Durable Object SQL
/// is: a request's statements run without an await between them.
pub trait Sql {
    /// Runs one statement; answers how many rows it wrote.
    fn exec(&self, query: &str, params: &[SqlValue]) -> ApiResult<u64>;

    /// Runs a query; each row is read by column name into a `T`.
    fn rows<T: DeserializeOwned>(&self, query: &str, params: &[SqlValue]) -> ApiResult<Vec<T>>;

    /// The first row of a query, if any.
    fn first<T: DeserializeOwned>(&self, query: &str, params: &[SqlValue]) -> ApiResult<Option<T>> {
        Ok(self.rows(query, params)?.into_iter().next())
    }
}

/// A store's failure as the API answers it.
pub fn storage_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(500, "queue_storage", format!("queue storage error: {e}"))
}

#[derive(Deserialize)]
struct KvRow {
    k: String,
    v: String,
}

/// A `meta (k, v)` table with a write-through copy in memory.
#[derive(Default)]
pub struct Meta {
    map: RefCell<HashMap<String, String>>,
}

impl Meta {
    /// Creates the table if needed and loads it.
    pub fn load(&self, sql: &impl Sql) -> ApiResult<()> {
        sql.exec(
            "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
            &[],
        )?;
        let rows: Vec<KvRow> = sql.rows("SELECT k, v FROM meta", &[])?;
        *self.map.borrow_mut() = rows.into_iter().map(|r| (r.k, r.v)).collect();
        Ok(())
    }

    /// The stored text of `k`.
    pub fn get(&self, k: &str) -> Option<String> {
        self.map.borrow().get(k).cloned()
    }

    /// `k` as an unsigned integer (absent or unreadable: `None`).
    pub fn u64(&self, k: &str) -> Option<u64> {
        self.get(k).and_then(|v| v.parse().ok())
    }

    /// `k` as a float (absent or unreadable: `None`).
    pub fn f64(&self, k: &str) -> Option<f64> {
        self.get(k).and_then(|v| v.parse().ok())
    }

    /// Whether `k` is set to `1`.
    pub fn flag(&self, k: &str) -> bool {
        self.get(k).as_deref() == Some("1")
    }

    /// Stores `v` under `k` (nothing is written when it is there already).
    pub fn set(&self, sql: &impl Sql, k: &str, v: impl ToString) -> ApiResult<()> {
        let v = v.to_string();
        if self.map.borrow().get(k) == Some(&v) {
            return Ok(());
        }
        sql.exec(
            "INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            &[k.into(), v.as_str().into()],
        )?;
        self.map.borrow_mut().insert(k.to_string(), v);
        Ok(())
    }

    /// Removes `k` (nothing is written when it is absent).
    pub fn delete(&self, sql: &impl Sql, k: &str) -> ApiResult<()> {
        if self.map.borrow_mut().remove(k).is_some() {
            sql.exec("DELETE FROM meta WHERE k = ?", &[k.into()])?;
        }
        Ok(())
    }
}
