//! Reading the lock table yourself: who holds which lease key and which
//! sessions wait for it, as `lease status` shows it. [`HOLDERS_SQL`] is the
//! query, [`HolderRow`] one row of it, [`ADVISORY_KEY_SQL`](crate::server::ADVISORY_KEY_SQL)
//! the `pg_locks` expression of a key. Nothing here is the machine's: a lease
//! client never sends it.

use std::fmt;

/// A [`HOLDERS_SQL`] row lacks a column or has one of the wrong type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectError {
    /// The zero-based column (the row's length when columns are missing).
    pub column: usize,
    /// Its text (at most 64 characters), `None` for NULL or missing.
    pub text: Option<String>,
}

impl fmt::Display for InspectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (column, text) = (self.column, &self.text);
        write!(f, "malformed lock table row: column {column} is {text:?}")
    }
}

impl std::error::Error for InspectError {}

/// `to_char` of a `timestamptz` expression as UTC RFC 3339 with microseconds.
macro_rules! utc_text {
    ($e:literal) => {
        concat!(
            "pg_catalog.to_char((",
            $e,
            ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
        )
    };
}

/// Who holds and who waits for which advisory key in the current database:
/// one row per single-`bigint` advisory lock request in `pg_locks`, granted
/// (a holder) or not (a waiter: a standby waiting on the server, on its
/// lease session or, while it holds another lease, its watch session, or any
/// other client blocked in `pg_advisory_lock`-like calls), with its session
/// from `pg_stat_activity` (NULLs when it is gone or not visible to the
/// querying role).
///
/// Rows are ordered by key, then granted before waiting, then waiters by
/// `waitstart` (the server's queue order as far as `pg_locks` shows it: a
/// waiter whose `lock_timeout` ran out and that waits again joins the end),
/// then pid. Columns, in order, as [`HolderRow`]'s fields: `key int8, pid
/// int4, mode text, application_name text, client_addr text, client_port
/// int4, backend_start text, state_change text, state text, granted bool,
/// wait_start text`; the times are UTC in RFC 3339 with microseconds.
///
/// What the server does not record, this cannot show: when a granted lock
/// was granted (`pg_locks.waitstart` is NULL once a lock is held; the
/// holder's `backend_start` is only a lower bound), nor a holder's fencing
/// token (the transaction that made it ended long ago; only the holder's
/// process knows it). `wait_start` needs PostgreSQL 14 or later (NULL
/// before; the statement reads it through `to_jsonb`, so it runs on older
/// servers too).
///
/// Unlike [`Statement`](crate::Statement)s this one is for people and tools (`lease status`):
/// its columns are not all `int8`. Send it with the simple-query protocol
/// and parse each row's text columns with [`HolderRow::parse`].
pub const HOLDERS_SQL: &str = concat!(
    "SELECT h.k AS key, h.pid, h.mode, \
     a.application_name, pg_catalog.host(a.client_addr), a.client_port, ",
    utc_text!("a.backend_start"),
    ", ",
    utc_text!("a.state_change"),
    ", a.state, h.granted, ",
    utc_text!("h.waitstart"),
    " FROM (SELECT ",
    advisory_key!(),
    " AS k, l.pid, l.mode, l.granted, \
     (pg_catalog.to_jsonb(l) OPERATOR(pg_catalog.->>) 'waitstart')::pg_catalog.timestamptz \
     AS waitstart FROM pg_catalog.pg_locks AS l \
     WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.objsubid OPERATOR(pg_catalog.=) 1 \
     AND l.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
     WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())) AS h \
     LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) h.pid \
     ORDER BY h.k, h.granted DESC, h.waitstart NULLS FIRST, h.pid"
);

/// The number of columns of [`HOLDERS_SQL`].
const HOLDER_COLUMNS: usize = 11;

/// One row of [`HOLDERS_SQL`]: an advisory lock request on a key, granted
/// (its holder) or waiting (a standby, or another client), and the session
/// that made it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HolderRow {
    /// The advisory key.
    pub key: i64,
    /// The session's backend pid (`None` for a prepared transaction's lock).
    pub pid: Option<i32>,
    /// The lock mode: `ExclusiveLock` for `pg_advisory_lock` (a lease
    /// holder), `ShareLock` for the `_shared` forms (a standby waiting on
    /// the server asks for one).
    pub mode: Option<String>,
    /// The session's `application_name` (`lease:NAME` for `lease run`).
    pub application_name: Option<String>,
    /// The session's client address.
    pub client_addr: Option<String>,
    /// The session's client port (-1: a Unix socket).
    pub client_port: Option<i32>,
    /// When the session's backend started (UTC, RFC 3339): for a holder a
    /// lower bound of when it took the key, for a standby when it started
    /// standing by (as far as its current session goes).
    pub backend_start: Option<String>,
    /// When the session last changed state (UTC, RFC 3339).
    pub state_change: Option<String>,
    /// The session's state (`idle`, `active`, ...).
    pub state: Option<String>,
    /// The lock is held (`false`: the session waits for it).
    pub granted: bool,
    /// When the session's current wait for this lock began (UTC, RFC
    /// 3339); `None` for a granted lock, and before PostgreSQL 14.
    pub wait_start: Option<String>,
}

impl HolderRow {
    /// Parses one row of [`HOLDERS_SQL`] as the simple-query protocol
    /// returns it: each column's text, `None` for NULL.
    ///
    /// # Errors
    /// [`InspectError`] for a missing column, a key or pid that
    /// is not an integer, or a `granted` that is not `t` or `f`.
    pub fn parse<'a>(
        columns: impl IntoIterator<Item = Option<&'a str>>,
    ) -> Result<HolderRow, InspectError> {
        let columns: Vec<Option<&str>> = columns.into_iter().collect();
        let bad = |column: usize| InspectError {
            column,
            text: (columns.get(column).copied().flatten()).map(|t| t.chars().take(64).collect()),
        };
        if columns.len() != HOLDER_COLUMNS {
            return Err(bad(columns.len().min(HOLDER_COLUMNS)));
        }
        let text = |i: usize| columns[i].map(str::to_owned);
        let int = |i: usize| -> Result<Option<i32>, InspectError> {
            columns[i]
                .map(|t| t.parse::<i32>().map_err(|_| bad(i)))
                .transpose()
        };
        Ok(HolderRow {
            key: (columns[0].and_then(|t| t.parse::<i64>().ok())).ok_or_else(|| bad(0))?,
            pid: int(1)?,
            mode: text(2),
            application_name: text(3),
            client_addr: text(4),
            client_port: int(5)?,
            backend_start: text(6),
            state_change: text(7),
            state: text(8),
            granted: match columns[9] {
                Some("t") => true,
                Some("f") => false,
                _ => return Err(bad(9)),
            },
            wait_start: text(10),
        })
    }

    /// The columns a server sends for this row, as text (for tests and
    /// simulated servers).
    pub fn to_text(&self) -> Vec<Option<String>> {
        vec![
            Some(self.key.to_string()),
            self.pid.map(|p| p.to_string()),
            self.mode.clone(),
            self.application_name.clone(),
            self.client_addr.clone(),
            self.client_port.map(|p| p.to_string()),
            self.backend_start.clone(),
            self.state_change.clone(),
            self.state.clone(),
            Some(if self.granted { "t" } else { "f" }.to_owned()),
            self.wait_start.clone(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::ADVISORY_KEY_SQL;

    #[test]
    fn holder_rows_parse_holders_and_waiters() {
        // A holder and a standby waiting on the server, as the simple-query
        // protocol returns them.
        let holder = [
            Some("-3074394522925186474"),
            Some("81234"),
            Some("ExclusiveLock"),
            Some("lease:nightly"),
            Some("127.0.0.1"),
            Some("51234"),
            Some("2026-12-01T10:00:00.123456Z"),
            Some("2026-12-01T10:05:00.000001Z"),
            Some("idle"),
            Some("t"),
            None,
        ];
        let h = HolderRow::parse(holder).unwrap();
        assert_eq!(h.key, -3_074_394_522_925_186_474);
        assert_eq!(h.pid, Some(81234));
        assert!(h.granted && h.wait_start.is_none());
        assert_eq!(h.client_port, Some(51234));
        assert_eq!(h.state.as_deref(), Some("idle"));
        let mut waiter = holder;
        waiter[1] = Some("81240");
        waiter[2] = Some("ShareLock");
        waiter[8] = Some("active");
        waiter[9] = Some("f");
        waiter[10] = Some("2026-12-01T10:05:01.000000Z");
        let w = HolderRow::parse(waiter).unwrap();
        assert!(!w.granted);
        assert_eq!(w.mode.as_deref(), Some("ShareLock"));
        assert_eq!(w.wait_start.as_deref(), Some("2026-12-01T10:05:01.000000Z"));
        // A session gone from pg_stat_activity: NULLs but the lock's own.
        let gone = HolderRow::parse([
            Some("7"),
            None,
            Some("ExclusiveLock"),
            None,
            None,
            None,
            None,
            None,
            None,
            Some("t"),
            None,
        ])
        .unwrap();
        assert_eq!((gone.key, gone.pid, gone.application_name), (7, None, None));
        for row in [h, w] {
            let text = row.to_text();
            assert_eq!(HolderRow::parse(text.iter().map(|c| c.as_deref())), Ok(row));
        }
    }

    #[test]
    fn malformed_holder_rows_are_errors() {
        let good = HolderRow {
            key: 1,
            granted: true,
            ..HolderRow::default()
        }
        .to_text();
        let with = |column: usize, text: Option<&str>| {
            let mut row: Vec<Option<&str>> = good.iter().map(|c| c.as_deref()).collect();
            row[column] = text;
            HolderRow::parse(row)
        };
        assert!(with(0, Some("1")).is_ok());
        assert_eq!(
            with(0, Some("k")),
            Err(InspectError {
                column: 0,
                text: Some("k".into())
            })
        );
        assert!(with(0, None).is_err());
        assert!(with(1, Some("99999999999")).is_err());
        assert!(with(5, Some("-")).is_err());
        assert!(with(9, Some("true")).is_err());
        assert!(with(9, None).is_err());
        // Too few or too many columns.
        let short = good[..10].iter().map(|c| c.as_deref());
        assert_eq!(
            HolderRow::parse(short),
            Err(InspectError {
                column: 10,
                text: None
            })
        );
        let long = good.iter().map(|c| c.as_deref()).chain([Some("x")]);
        assert!(HolderRow::parse(long).is_err());
        // The text in the error is cut short.
        let junk = "x".repeat(1000);
        let err = with(0, Some(&junk)).unwrap_err();
        assert!(err.to_string().len() < 120, "{err}");
    }

    #[test]
    fn the_key_expression_is_shared() {
        assert!(HOLDERS_SQL.contains(ADVISORY_KEY_SQL));
        assert_eq!(HolderRow::default().to_text().len(), HOLDER_COLUMNS);
    }
}
