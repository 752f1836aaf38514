//! Decoding what the `pgoutput` plugin writes to a logical replication
//! slot (protocol version 1, PostgreSQL's "Logical Replication Message
//! Formats"), as far as the outbox needs: relations, inserts, commits.
//! Pure: bytes in, messages out; `events::wal::slot` does the I/O.
//!
//! Invariants kept here: a message that is cut short or malformed is an
//! error, never a guess; an outbox row is built only from columns named
//! as the outbox names them (a column added later is ignored, one missing
//! is an error), so a change of the table's layout cannot shift values
//! into the wrong fields.

use std::collections::HashMap;

use thiserror::Error;

use crate::events::sink::OutboxEvent;

/// Why a slot's message could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("a pgoutput message ended early")]
    Short,
    #[error("a pgoutput message has an unknown tuple column kind {0:?}")]
    ColumnKind(char),
    #[error("an insert names relation {0}, which no relation message described")]
    UnknownRelation(u32),
    #[error("an outbox row has no column {0}")]
    MissingColumn(&'static str),
    #[error("an outbox row's {column} is not valid: {value:?}")]
    BadValue { column: &'static str, value: String },
    #[error("a pgoutput text field is not UTF-8")]
    NotUtf8,
}

/// A message of the stream, as far as the relay needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin,
    /// A table's layout, sent before its first change in a decoding
    /// session (each peek is one).
    Relation {
        oid: u32,
        namespace: String,
        name: String,
        columns: Vec<String>,
    },
    /// A new row: each column's text form, `None` for NULL.
    Insert {
        relation: u32,
        values: Vec<Option<String>>,
    },
    Commit,
    /// Anything else (updates, deletes, truncates, types, origins): the
    /// publication sends inserts only, so these are skipped.
    Other(u8),
}

/// A cursor over one message's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(DecodeError::Short);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A NUL-terminated string.
    fn cstr(&mut self) -> Result<String, DecodeError> {
        let end = self
            .bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or(DecodeError::Short)?;
        let s = std::str::from_utf8(&self.bytes[..end])
            .map_err(|_| DecodeError::NotUtf8)?
            .to_string();
        self.bytes = &self.bytes[end + 1..];
        Ok(s)
    }
}

/// Decodes one message (one row of `pg_logical_slot_peek_binary_changes`).
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader { bytes };
    let tag = r.u8()?;
    match tag {
        b'B' => Ok(Message::Begin),
        b'C' => Ok(Message::Commit),
        b'R' => {
            let oid = r.u32()?;
            let namespace = r.cstr()?;
            let name = r.cstr()?;
            let _replica_identity = r.u8()?;
            let n = r.u16()?;
            let mut columns = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let _flags = r.u8()?;
                columns.push(r.cstr()?);
                let _type_oid = r.u32()?;
                let _type_modifier = r.u32()?;
            }
            Ok(Message::Relation {
                oid,
                namespace,
                name,
                columns,
            })
        }
        b'I' => {
            let relation = r.u32()?;
            if r.u8()? != b'N' {
                return Err(DecodeError::Short);
            }
            let n = r.u16()?;
            let mut values = Vec::with_capacity(n as usize);
            for _ in 0..n {
                match r.u8()? {
                    b'n' => values.push(None),
                    b't' => {
                        let len = r.u32()? as usize;
                        let text =
                            std::str::from_utf8(r.take(len)?).map_err(|_| DecodeError::NotUtf8)?;
                        values.push(Some(text.to_string()));
                    }
                    other => return Err(DecodeError::ColumnKind(other as char)),
                }
            }
            Ok(Message::Insert { relation, values })
        }
        other => Ok(Message::Other(other)),
    }
}

/// The relations described so far in a decoding session: oid → columns.
#[derive(Debug, Default)]
pub struct Relations {
    columns: HashMap<u32, (String, Vec<String>)>,
}

impl Relations {
    /// Learns a relation message's layout.
    pub fn learn(&mut self, oid: u32, namespace: &str, name: &str, columns: Vec<String>) {
        self.columns
            .insert(oid, (format!("{namespace}.{name}"), columns));
    }

    /// The outbox row an insert carries, `None` when the insert is into
    /// another table (a publication that names more than the outbox).
    pub fn outbox_row(
        &self,
        relation: u32,
        values: &[Option<String>],
    ) -> Result<Option<OutboxEvent>, DecodeError> {
        let (table, columns) = self
            .columns
            .get(&relation)
            .ok_or(DecodeError::UnknownRelation(relation))?;
        if !table.ends_with(".outbox") {
            return Ok(None);
        }
        let get = |name: &'static str| -> Result<&str, DecodeError> {
            columns
                .iter()
                .position(|c| c == name)
                .and_then(|i| values.get(i))
                .and_then(|v| v.as_deref())
                .ok_or(DecodeError::MissingColumn(name))
        };
        let bad = |column: &'static str, value: &str| DecodeError::BadValue {
            column,
            value: value.to_string(),
        };
        let id = get("id")?;
        let payload = get("payload")?;
        let created_at = get("created_at")?;
        Ok(Some(OutboxEvent {
            id: id.parse().map_err(|_| bad("id", id))?,
            event_id: get("event_id")?.to_string(),
            kind: get("type")?.to_string(),
            payload: serde_json::from_str(payload).map_err(|_| bad("payload", payload))?,
            created_at: timestamptz(created_at).ok_or_else(|| bad("created_at", created_at))?,
        }))
    }
}

/// A `timestamptz` in PostgreSQL's ISO text form (`2026-12-06
/// 14:39:16.411721+00`, an offset of hours or hours and minutes).
fn timestamptz(text: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z")
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cstr(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    const OUTBOX: [&str; 6] = [
        "id",
        "event_id",
        "type",
        "payload",
        "created_at",
        "published_at",
    ];

    fn relation(oid: u32, table: &str, columns: &[&str]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend_from_slice(&oid.to_be_bytes());
        cstr(&mut m, "public");
        cstr(&mut m, table);
        m.push(b'd');
        m.extend_from_slice(&(columns.len() as u16).to_be_bytes());
        for c in columns {
            m.push(0);
            cstr(&mut m, c);
            m.extend_from_slice(&25u32.to_be_bytes());
            m.extend_from_slice(&u32::MAX.to_be_bytes());
        }
        m
    }

    fn insert(oid: u32, values: &[Option<&str>]) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend_from_slice(&oid.to_be_bytes());
        m.push(b'N');
        m.extend_from_slice(&(values.len() as u16).to_be_bytes());
        for v in values {
            match v {
                None => m.push(b'n'),
                Some(t) => {
                    m.push(b't');
                    m.extend_from_slice(&(t.len() as u32).to_be_bytes());
                    m.extend_from_slice(t.as_bytes());
                }
            }
        }
        m
    }

    fn learned(oid: u32, table: &str, columns: &[&str]) -> Relations {
        let mut rel = Relations::default();
        match decode(&relation(oid, table, columns)).unwrap() {
            Message::Relation {
                oid,
                namespace,
                name,
                columns,
            } => rel.learn(oid, &namespace, &name, columns),
            other => panic!("not a relation: {other:?}"),
        }
        rel
    }

    const ROW: [Option<&str>; 6] = [
        Some("7"),
        Some("evt_r1.held"),
        Some("batch"),
        Some(r#"{"a": "it's"}"#),
        Some("2026-12-06 14:39:16.411721+00"),
        None,
    ];

    #[test]
    fn an_outbox_insert_becomes_its_row() {
        let rel = learned(16_384, "outbox", &OUTBOX);
        let Message::Insert { relation, values } = decode(&insert(16_384, &ROW)).unwrap() else {
            panic!("not an insert");
        };
        let row = rel.outbox_row(relation, &values).unwrap().unwrap();
        assert_eq!(row.id, 7);
        assert_eq!(row.event_id, "evt_r1.held");
        assert_eq!(row.kind, "batch");
        assert_eq!(row.payload, serde_json::json!({"a": "it's"}));
        assert_eq!(
            row.created_at.to_rfc3339(),
            "2026-12-06T14:39:16.411721+00:00"
        );
    }

    #[test]
    fn columns_are_found_by_name_not_position() {
        let mut cols = OUTBOX.to_vec();
        cols.swap(1, 2);
        cols.push("added_later");
        let rel = learned(1, "outbox", &cols);
        let mut row: Vec<Option<String>> = ROW.iter().map(|v| v.map(String::from)).collect();
        row.swap(1, 2);
        row.push(Some("x".into()));
        let r = rel.outbox_row(1, &row).unwrap().unwrap();
        assert_eq!(
            (r.event_id.as_str(), r.kind.as_str()),
            ("evt_r1.held", "batch")
        );
    }

    #[test]
    fn offsets_other_than_utc_are_read() {
        let t = timestamptz("2026-12-06 21:39:16+07").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-06T14:39:16+00:00");
        let t = timestamptz("2026-12-06 20:09:16.5+05:30").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-06T14:39:16.500+00:00");
        assert!(timestamptz("yesterday").is_none());
    }

    #[test]
    fn other_tables_are_skipped_and_unknown_relations_refused() {
        let rel = learned(2, "reservations", &["id"]);
        assert!(rel.outbox_row(2, &[Some("r1".into())]).unwrap().is_none());
        assert_eq!(
            rel.outbox_row(3, &[]).unwrap_err(),
            DecodeError::UnknownRelation(3)
        );
    }

    #[test]
    fn a_missing_or_bad_value_is_an_error_not_a_guess() {
        let rel = learned(1, "outbox", &OUTBOX);
        let mut row: Vec<Option<String>> = ROW.iter().map(|v| v.map(String::from)).collect();
        row[3] = None;
        assert_eq!(
            rel.outbox_row(1, &row).unwrap_err(),
            DecodeError::MissingColumn("payload")
        );
        row[3] = Some("{not json".into());
        assert!(matches!(
            rel.outbox_row(1, &row).unwrap_err(),
            DecodeError::BadValue {
                column: "payload",
                ..
            }
        ));
    }

    #[test]
    fn cut_short_or_unknown_kinds_are_errors() {
        let whole = insert(1, &ROW);
        for n in 1..whole.len() {
            assert!(decode(&whole[..n]).is_err(), "cut at {n}");
        }
        let whole = relation(1, "outbox", &OUTBOX);
        for n in 1..whole.len() {
            assert!(decode(&whole[..n]).is_err(), "cut at {n}");
        }
        let mut odd = insert(1, &[Some("x")]);
        odd[8] = b'b'; // binary column values are not asked for
        assert_eq!(decode(&odd).unwrap_err(), DecodeError::ColumnKind('b'));
        assert_eq!(decode(b"B\0\0").unwrap(), Message::Begin);
        assert_eq!(decode(b"Yxyz").unwrap(), Message::Other(b'Y'));
        assert_eq!(decode(b"").unwrap_err(), DecodeError::Short);
    }
}
