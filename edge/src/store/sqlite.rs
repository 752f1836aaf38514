//! Host tests only: [`Sql`] on an in-memory SQLite (`rusqlite`, bundled),
//! so the objects' own statements run in `cargo test`.
//!
//! Invariant kept here: a row reaches the logic as the Durable Object's
//! cursor hands it over — an object of column name to JSON value (integers
//! and reals as numbers, text as strings, NULL as null).

use std::cell::Cell;

use rusqlite::types::{Value as Db, ValueRef};
use rusqlite::{Connection, params_from_iter};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::api::error::ApiResult;
use crate::store::sql::{Sql, SqlValue, storage_error};

/// An in-memory SQLite database.
pub struct MemSql {
    conn: Connection,
    /// Statements that wrote at least one row (to test that reads write
    /// nothing).
    writes: Cell<u64>,
}

impl Default for MemSql {
    fn default() -> Self {
        Self::new()
    }
}

impl MemSql {
    /// A fresh, empty database.
    pub fn new() -> Self {
        MemSql {
            conn: Connection::open_in_memory().expect("in-memory SQLite"),
            writes: Cell::new(0),
        }
    }

    /// Statements so far that wrote a row.
    pub fn writes(&self) -> u64 {
        self.writes.get()
    }
}

fn bind(params: &[SqlValue]) -> Vec<Db> {
    params
        .iter()
        .map(|p| match p {
            SqlValue::Null => Db::Null,
            SqlValue::Int(i) => Db::Integer(*i),
            SqlValue::Real(f) => Db::Real(*f),
            SqlValue::Text(s) => Db::Text(s.clone()),
        })
        .collect()
}

impl Sql for MemSql {
    fn exec(&self, query: &str, params: &[SqlValue]) -> ApiResult<u64> {
        let mut st = self.conn.prepare(query).map_err(storage_error)?;
        let n = st
            .execute(params_from_iter(bind(params)))
            .map_err(storage_error)?;
        if n > 0 {
            self.writes.set(self.writes.get() + 1);
        }
        Ok(n as u64)
    }

    fn rows<T: DeserializeOwned>(&self, query: &str, params: &[SqlValue]) -> ApiResult<Vec<T>> {
        let mut st = self.conn.prepare(query).map_err(storage_error)?;
        let names: Vec<String> = st.column_names().iter().map(|c| c.to_string()).collect();
        let mut rows = st
            .query(params_from_iter(bind(params)))
            .map_err(storage_error)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(storage_error)? {
            let mut obj = Map::new();
            for (i, name) in names.iter().enumerate() {
                let v = match row.get_ref(i).map_err(storage_error)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(n) => Value::from(n),
                    ValueRef::Real(f) => Value::from(f),
                    ValueRef::Text(t) => Value::from(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Value::from(b.to_vec()),
                };
                obj.insert(name.clone(), v);
            }
            out.push(serde_json::from_value(Value::Object(obj)).map_err(storage_error)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sql::{Meta, SqlValue};

    #[test]
    fn meta_writes_through_and_skips_unchanged_values() {
        let sql = MemSql::new();
        let meta = Meta::default();
        meta.load(&sql).unwrap();
        meta.set(&sql, "a", 7).unwrap();
        meta.set(&sql, "f", 1).unwrap();
        assert_eq!(meta.u64("a"), Some(7));
        assert!(meta.flag("f"));
        // Another object over the same storage reads what was written.
        let again = Meta::default();
        again.load(&sql).unwrap();
        assert_eq!(again.get("a").as_deref(), Some("7"));
        let before = sql.writes();
        meta.set(&sql, "a", 7).unwrap();
        assert_eq!(sql.writes(), before, "an unchanged value writes nothing");
        meta.delete(&sql, "a").unwrap();
        meta.delete(&sql, "missing").unwrap();
        let third = Meta::default();
        third.load(&sql).unwrap();
        assert_eq!(third.get("a"), None);
    }

    #[test]
    fn big_numbers_bind_as_javascript_would_have() {
        assert_eq!(SqlValue::from(5u64), SqlValue::Int(5));
        assert_eq!(SqlValue::from(u64::MAX), SqlValue::Real(u64::MAX as f64));
        assert_eq!(SqlValue::from(true), SqlValue::Int(1));
        assert_eq!(SqlValue::from(None::<&str>), SqlValue::Null);
    }
}
