//! Every statement the machine sends, and the one row shape they all return.
//!
//! A driver never needs to know what a statement means: it sends
//! [`Statement::sql`] with the simple-query protocol (one round trip, no
//! prepared statements, so it behaves the same through any pooler; the only
//! values in the text are integers the machine formats itself), and hands back
//! every row of every result set, in order, as a [`Row`]: a list of nullable
//! `int8` columns, decoded from text by [`decode_text_row`].

use std::fmt::{self, Write};

/// The LISTEN/NOTIFY channel of graceful handovers. The payload is the
/// released key in decimal.
pub const HANDOVER_CHANNEL: &str = "lease_handover_v1";

/// One result row: every column is a nullable `int8`.
pub type Row = Vec<Option<i64>>;

/// The tags of the setup statement's `(tag, value)` rows.
pub(crate) mod setup_tag {
    pub const SERVER_VERSION: i64 = 1;
    pub const IN_RECOVERY: i64 = 2;
    pub const BACKEND_PID: i64 = 3;
    pub const IDLE_SESSION_TIMEOUT_MS: i64 = 4;
}

/// A statement of the machine, in structured form.
///
/// Drivers use only [`Statement::sql`]; the simulator interprets the structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// First statement of every session: `(tag, value)` rows with the server
    /// version, recovery state, backend pid and `idle_session_timeout` in ms.
    Setup,
    /// `LISTEN` on [`HANDOVER_CHANNEL`], after a successful setup when
    /// handover notifications are on. No rows.
    Listen,
    /// One batched try of every key a standby wants. Rows `(key, token, NULL)`
    /// for keys won, where `token` is the fencing token (a transaction id
    /// assigned after every lock of the batch was granted, so later than any
    /// earlier holder's), and `(key, NULL, holder_pid)` for keys not won.
    TryLock {
        /// Keys to try, none of them held by this session.
        keys: Vec<i64>,
    },
    /// Verifies the session: a `(0, pg_backend_pid())` row, then one
    /// `(1, key)` row per advisory key this session holds in this database
    /// according to `pg_locks`.
    Heartbeat,
    /// Unlocks keys: one `(key, 1 or 0)` row per key, 1 when it was held.
    /// With `notify`, each key actually unlocked is announced on
    /// [`HANDOVER_CHANNEL`].
    Release {
        /// Keys to unlock.
        keys: Vec<i64>,
        /// Whether to `NOTIFY` standbys.
        notify: bool,
    },
}

const THIS_SESSIONS_ADVISORY_KEYS: &str = "\
SELECT (classid::bigint << 32) | objid::bigint AS k, pid FROM pg_locks \
WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";

struct KeyArray<'a>(&'a [i64]);

impl fmt::Display for KeyArray<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("'{")?;
        for (i, k) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_char(',')?;
            }
            write!(f, "{k}")?;
        }
        f.write_str("}'::int8[]")
    }
}

impl Statement {
    /// The SQL text to send with the simple-query protocol.
    pub fn sql(&self) -> String {
        match self {
            Statement::Listen => format!("LISTEN {HANDOVER_CHANNEL}"),
            Statement::Setup => {
                format!(
                    "SELECT {}::int8, current_setting('server_version_num')::int8 \
                     UNION ALL SELECT {}, pg_is_in_recovery()::int::int8 \
                     UNION ALL SELECT {}, pg_backend_pid()::int8 \
                     UNION ALL SELECT {}, (SELECT setting::int8 FROM pg_settings \
                     WHERE name = 'idle_session_timeout')",
                    setup_tag::SERVER_VERSION,
                    setup_tag::IN_RECOVERY,
                    setup_tag::BACKEND_PID,
                    setup_tag::IDLE_SESSION_TIMEOUT_MS,
                )
            }
            // The aggregate consumes every try before the outer query runs, so
            // pg_current_xact_id() is first called (and the xid assigned) after
            // the last lock of the batch was granted, and only if one was.
            Statement::TryLock { keys } => format!(
                "WITH t AS (SELECT array_agg(k) AS won FROM unnest({a}) k \
                 WHERE pg_try_advisory_lock(k)) \
                 SELECT w.k, pg_current_xact_id()::text::int8, NULL::int8 \
                 FROM t, unnest(t.won) w(k) \
                 UNION ALL \
                 SELECT l.k, NULL, h.pid::int8 FROM t CROSS JOIN unnest({a}) l(k) \
                 LEFT JOIN ({THIS_SESSIONS_ADVISORY_KEYS}) h ON h.k = l.k \
                 WHERE NOT (l.k = ANY (coalesce(t.won, '{{}}')))",
                a = KeyArray(keys)
            ),
            Statement::Heartbeat => format!(
                "SELECT 0::int8, pg_backend_pid()::int8 UNION ALL \
                 SELECT 1, s.k FROM ({THIS_SESSIONS_ADVISORY_KEYS}) s \
                 WHERE s.pid = pg_backend_pid()"
            ),
            Statement::Release { keys, notify } => {
                let won = if *notify {
                    format!("(SELECT 1::int8 FROM pg_notify('{HANDOVER_CHANNEL}', k::text))")
                } else {
                    "1::int8".to_string()
                };
                format!(
                    "SELECT k, CASE WHEN pg_advisory_unlock(k) THEN {won} ELSE 0 END \
                     FROM unnest({}) k",
                    KeyArray(keys)
                )
            }
        }
    }
}

/// Why a row could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The zero-based column.
    pub column: usize,
    /// The text that is not a decimal `int8`.
    pub text: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "column {} of a lease reply is not an int8: {:?}",
            self.column, self.text
        )
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one simple-query (text format) row: every column is a decimal
/// `int8` or NULL (`None`).
///
/// # Errors
/// [`DecodeError`] if a column is not a decimal `int8`; a driver reports that
/// as the statement's error.
pub fn decode_text_row<'a>(
    columns: impl IntoIterator<Item = Option<&'a str>>,
) -> Result<Row, DecodeError> {
    columns
        .into_iter()
        .enumerate()
        .map(|(column, text)| match text {
            None => Ok(None),
            Some(t) => t.parse::<i64>().map(Some).map_err(|_| DecodeError {
                column,
                text: t.chars().take(64).collect(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_ints_and_nulls() {
        assert_eq!(
            decode_text_row([Some("1"), None, Some("-9223372036854775808")]),
            Ok(vec![Some(1), None, Some(i64::MIN)])
        );
        assert_eq!(
            decode_text_row([Some("1"), Some("x")]),
            Err(DecodeError {
                column: 1,
                text: "x".into()
            })
        );
        assert!(decode_text_row([Some("9223372036854775808")]).is_err());
        assert_eq!(decode_text_row([]), Ok(vec![]));
    }

    #[test]
    fn key_arrays_render_negative_and_extreme_keys() {
        let sql = Statement::Release {
            keys: vec![i64::MIN, -1, 0, i64::MAX],
            notify: false,
        }
        .sql();
        assert!(sql.contains("'{-9223372036854775808,-1,0,9223372036854775807}'::int8[]"));
    }
}
