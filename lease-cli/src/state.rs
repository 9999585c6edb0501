//! `--state-table`: one row per schedule in a table of the user's database (the
//! last due time claimed, its token, when it started and finished, its
//! outcome), so a due time starts at most once across failovers, frozen
//! leaders and deploys, and a new leader knows what nobody ran.
//!
//! Every statement runs on a short-lived connection of its own, never on the
//! lease session (which writes nothing). The claim is one fenced statement: it
//! takes a due time only if it is later than the row's (or, with
//! `--unfinished retry`, the row's own unfinished one) and the claimer's fencing
//! token is not older than the row's.

use crate::conn::{self, Target};
use lease_proto::schedule::Record;
use std::time::{Duration, SystemTime};

/// `--state-table` when `lease schedule init` is not told.
pub const DEFAULT_TABLE: &str = "lease_schedule";

/// A state table's name, checked and quoted: `TABLE` or `SCHEMA.TABLE`, each part
/// a plain identifier (letters, digits, `_`; not starting with a digit; at most 63
/// bytes).
#[derive(Debug, Clone)]
pub struct Table {
    quoted: String,
    plain: String,
}

impl Table {
    pub fn parse(name: &str) -> Result<Table, String> {
        let parts: Vec<&str> = name.split('.').collect();
        let ok = |p: &str| {
            !p.is_empty()
                && p.len() <= 63
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !p.starts_with(|c: char| c.is_ascii_digit())
        };
        if parts.len() > 2 || !parts.iter().all(|p| ok(p)) {
            return Err(format!(
                "--state-table {name:?}: a table name (letters, digits and _, optionally \
                 SCHEMA.TABLE), such as {DEFAULT_TABLE}"
            ));
        }
        let quoted = parts
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(".");
        Ok(Table {
            quoted,
            plain: name.to_owned(),
        })
    }

    /// The name as given.
    pub fn name(&self) -> &str {
        &self.plain
    }

    /// The statement that creates the table (if it is absent).
    pub fn ddl(&self) -> String {
        let t = &self.quoted;
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n    \
             name     text        PRIMARY KEY,  -- the lease name of the schedule\n    \
             schedule text        NOT NULL,     -- every 15m, or cron \"0 3 * * *\" in Europe/Berlin\n    \
             due      timestamptz NOT NULL,     -- the last due time claimed\n    \
             token    bigint      NOT NULL,     -- the claiming leader's fencing token\n    \
             run_id   text        NOT NULL,     -- NAME@<due as Unix seconds> (LEASE_RUN_ID)\n    \
             started  timestamptz NOT NULL,     -- when it was claimed (the server's clock)\n    \
             finished timestamptz,              -- when its run ended; NULL while it runs\n    \
             outcome  text                      -- ok, exit N, or stopped\n);"
        )
    }
}

/// A state-table statement that failed.
#[derive(Debug)]
pub enum StateError {
    /// The table does not exist (SQLSTATE 42P01).
    Missing,
    /// Anything else: the connection, a timeout, permissions.
    Other(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Missing => f.write_str("the state table does not exist"),
            StateError::Other(e) => f.write_str(e),
        }
    }
}

fn state_error(e: &tokio_postgres::Error) -> StateError {
    if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
        StateError::Missing
    } else {
        StateError::Other(conn::error_chain(e))
    }
}

/// Runs `work` on a connection of its own, within `timeout`.
async fn with_client<T, F, Fut>(
    target: &Target,
    timeout: Duration,
    work: F,
) -> Result<T, StateError>
where
    F: FnOnce(tokio_postgres::Client) -> Fut,
    Fut: std::future::Future<Output = (tokio_postgres::Client, Result<T, StateError>)>,
{
    let all = async {
        let (client, connection) = conn::connect(target, timeout)
            .await
            .map_err(StateError::Other)?;
        let (client, result) = work(client).await;
        drop(client);
        let _ = tokio::time::timeout(Duration::from_secs(1), connection).await;
        result
    };
    match tokio::time::timeout(timeout, all).await {
        Ok(r) => r,
        Err(_) => Err(StateError::Other(format!(
            "the state table did not answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// The row of schedule `name`: `None` when it has none yet.
pub async fn read(
    target: &Target,
    timeout: Duration,
    table: &Table,
    name: &str,
) -> Result<Option<Record>, StateError> {
    let sql = format!(
        "SELECT due, finished IS NOT NULL FROM {} WHERE name OPERATOR(pg_catalog.=) $1",
        table.quoted
    );
    let name = name.to_owned();
    with_client(target, timeout, |client| async move {
        let result = client.query_opt(&sql, &[&name]).await;
        let record = result.map_err(|e| state_error(&e)).map(|row| {
            row.map(|r| Record {
                due: r.get::<_, SystemTime>(0),
                finished: r.get::<_, bool>(1),
            })
        });
        (client, record)
    })
    .await
}

/// Claims due time `due` of schedule `name` for the leader of fencing token
/// `token`: `Ok(true)` when it is this leader's to run.
pub async fn claim(
    target: &Target,
    timeout: Duration,
    table: &Table,
    name: &str,
    (due, run_id): (SystemTime, &str),
    token: i64,
    (retry_unfinished, schedule): (bool, &str),
) -> Result<bool, StateError> {
    let sql = format!(
        "INSERT INTO {} AS t (name, schedule, due, token, run_id, started) \
         VALUES ($1, $6, $2, $3, $4, pg_catalog.clock_timestamp()) \
         ON CONFLICT (name) DO UPDATE SET schedule = excluded.schedule, due = excluded.due, \
         token = excluded.token, run_id = excluded.run_id, started = excluded.started, \
         finished = NULL, outcome = NULL \
         WHERE t.token OPERATOR(pg_catalog.<=) excluded.token \
         AND (t.due OPERATOR(pg_catalog.<) excluded.due \
         OR ($5 AND t.due OPERATOR(pg_catalog.=) excluded.due AND t.finished IS NULL \
         AND t.token OPERATOR(pg_catalog.<) excluded.token)) \
         RETURNING 1",
        table.quoted
    );
    let (name, run_id, schedule) = (name.to_owned(), run_id.to_owned(), schedule.to_owned());
    with_client(target, timeout, |client| async move {
        let result = client
            .query_opt(
                &sql,
                &[&name, &due, &token, &run_id, &retry_unfinished, &schedule],
            )
            .await;
        (
            client,
            result.map(|r| r.is_some()).map_err(|e| state_error(&e)),
        )
    })
    .await
}

/// Records the end of the run of `due` claimed with `token`.
pub async fn finish(
    target: &Target,
    timeout: Duration,
    table: &Table,
    name: &str,
    (due, token): (SystemTime, i64),
    outcome: &str,
) -> Result<(), StateError> {
    let sql = format!(
        "UPDATE {} SET finished = pg_catalog.clock_timestamp(), outcome = $4 \
         WHERE name OPERATOR(pg_catalog.=) $1 AND due OPERATOR(pg_catalog.=) $2 \
         AND token OPERATOR(pg_catalog.=) $3",
        table.quoted
    );
    let (name, outcome) = (name.to_owned(), outcome.to_owned());
    with_client(target, timeout, |client| async move {
        let result = client.execute(&sql, &[&name, &due, &token, &outcome]).await;
        (client, result.map(drop).map_err(|e| state_error(&e)))
    })
    .await
}

/// A schedule's row, as `lease status --state-table` shows it.
#[derive(Debug)]
pub struct Row {
    pub name: String,
    pub schedule: String,
    pub due: SystemTime,
    pub run_id: String,
    pub started: SystemTime,
    pub finished: Option<SystemTime>,
    pub outcome: Option<String>,
}

/// The rows of `names` (every row when empty), by name.
pub async fn rows(
    target: &Target,
    timeout: Duration,
    table: &Table,
    names: &[String],
) -> Result<Vec<Row>, StateError> {
    let sql = format!(
        "SELECT name, schedule, due, run_id, started, finished, outcome FROM {} \
         WHERE pg_catalog.cardinality($1::pg_catalog.text[]) OPERATOR(pg_catalog.=) 0 \
         OR name OPERATOR(pg_catalog.=) ANY ($1) ORDER BY name",
        table.quoted
    );
    let names = names.to_vec();
    with_client(target, timeout, |client| async move {
        let result = client.query(&sql, &[&names]).await;
        let rows = result.map_err(|e| state_error(&e)).map(|rows| {
            rows.iter()
                .map(|r| Row {
                    name: r.get(0),
                    schedule: r.get(1),
                    due: r.get(2),
                    run_id: r.get(3),
                    started: r.get(4),
                    finished: r.get(5),
                    outcome: r.get(6),
                })
                .collect()
        });
        (client, rows)
    })
    .await
}

/// `lease schedule init`: creates the table if it is absent; what it did.
pub async fn init(target: &Target, timeout: Duration, table: &Table) -> Result<String, StateError> {
    let exists_sql = "SELECT pg_catalog.to_regclass($1) IS NOT NULL";
    let ddl = table.ddl();
    let regclass = table.quoted.clone();
    let name = table.name().to_owned();
    with_client(target, timeout, |client| async move {
        let existed = match client.query_one(exists_sql, &[&regclass]).await {
            Ok(row) => row.get::<_, bool>(0),
            Err(e) => return (client, Err(state_error(&e))),
        };
        if existed {
            return (
                client,
                Ok(format!("table {name} exists already: nothing done")),
            );
        }
        let result = client.batch_execute(&ddl).await;
        let said = result
            .map(|()| format!("created table {name} (one row per schedule)"))
            .map_err(|e| state_error(&e));
        (client, said)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked_and_quoted() {
        assert_eq!(
            Table::parse("lease_schedule").unwrap().quoted,
            "\"lease_schedule\""
        );
        assert_eq!(
            Table::parse("ops.Runs_2").unwrap().quoted,
            "\"ops\".\"Runs_2\""
        );
        for bad in ["", "a.b.c", "1abc", "x;drop", "a b", "\"x\"", "a."] {
            assert!(Table::parse(bad).is_err(), "{bad:?}");
        }
    }
}
