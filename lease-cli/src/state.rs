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
use std::time::{Duration, Instant, SystemTime};

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
             token    bigint      NOT NULL,     -- the fencing token of the schedule's leader\n    \
             due      timestamptz,              -- the last due time claimed (NULL: none yet)\n    \
             run_id   text,                     -- NAME@<due as Unix seconds> (LEASE_RUN_ID)\n    \
             started  timestamptz,              -- when it was claimed (the server's clock)\n    \
             finished timestamptz,              -- when its run ended; NULL while it runs\n    \
             outcome  text                      -- ok, exit N, stopped, or not started\n);"
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

/// What taking a schedule over found in its row.
#[derive(Debug)]
pub enum Fenced {
    /// This leader's token is in the row now: no older leader's claim can land.
    /// The last claim, if any.
    Record(Option<Record>),
    /// The row carries a newer token: a newer leader has taken the schedule over.
    Newer,
}

/// Takes schedule `name` over for the leader of fencing token `token`: writes
/// the token into the row (creating it), unless a newer one is there, and
/// reads the last claim. From then on every claim of an older leader is
/// refused.
pub async fn fence(
    target: &Target,
    timeout: Duration,
    table: &Table,
    (name, schedule): (&str, &str),
    token: i64,
) -> Result<Fenced, StateError> {
    let sql = format!(
        "INSERT INTO {} AS t (name, schedule, token) VALUES ($1, $2, $3) \
         ON CONFLICT (name) DO UPDATE SET token = excluded.token, schedule = excluded.schedule \
         WHERE t.token OPERATOR(pg_catalog.<=) excluded.token \
         RETURNING due, finished IS NOT NULL, outcome IS NOT DISTINCT FROM 'not started'",
        table.quoted
    );
    let (name, schedule) = (name.to_owned(), schedule.to_owned());
    with_client(target, timeout, |client| async move {
        let result = client.query_opt(&sql, &[&name, &schedule, &token]).await;
        let fenced = result.map_err(|e| state_error(&e)).map(|row| match row {
            None => Fenced::Newer,
            Some(r) => Fenced::Record(r.get::<_, Option<SystemTime>>(0).map(|due| Record {
                due,
                finished: r.get::<_, bool>(1),
                started: !r.get::<_, bool>(2),
            })),
        });
        (client, fenced)
    })
    .await
}

/// Claims due time `due` of schedule `name` for the leader of fencing token
/// `token`: `Ok(true)` when it is this leader's to run.
///
/// A claim that waits on the row (another transaction holds it) is aborted by
/// the server while the client still waits for the answer: it runs in a
/// transaction whose server-side `statement_timeout` (and
/// `idle_in_transaction_session_timeout`) ends well before `timeout` does.
/// Only a COMMIT already on its way when the client gives up, or an answer
/// lost on its way back, leaves a claim the client does not know of: `again` (a retry, by this leader, of a claim that
/// failed) then takes the row's claim of `due` as this leader's own, if it
/// carries this token and this run id and no run's end or "not started" was
/// recorded for it (this leader starts a run only after a claim answered).
pub async fn claim(
    target: &Target,
    timeout: Duration,
    table: &Table,
    name: &str,
    (due, run_id): (SystemTime, &str),
    token: i64,
    (retry, again): (Option<SystemTime>, bool),
) -> Result<bool, StateError> {
    let deadline = Instant::now() + timeout;
    let sql = format!(
        "UPDATE {} AS t SET due = $2, run_id = $4, started = pg_catalog.clock_timestamp(), \
         finished = NULL, outcome = NULL \
         WHERE t.name OPERATOR(pg_catalog.=) $1 AND t.token OPERATOR(pg_catalog.=) $3 \
         AND (t.due IS NULL OR t.due OPERATOR(pg_catalog.<) $2 \
         OR (t.due OPERATOR(pg_catalog.=) $5 AND $5 OPERATOR(pg_catalog.=) $2 \
         AND t.finished IS NULL) \
         OR ($6 AND t.due OPERATOR(pg_catalog.=) $2 AND t.run_id OPERATOR(pg_catalog.=) $4 \
         AND t.finished IS NULL AND t.outcome IS NULL)) \
         RETURNING 1",
        table.quoted
    );
    let (name, run_id) = (name.to_owned(), run_id.to_owned());
    with_client(target, timeout, |mut client| async move {
        // What is left of `timeout` once connected; the server gives the
        // claim half of it (at least 1 ms: 0 would mean no limit).
        let left = deadline.saturating_duration_since(Instant::now());
        let server = (left / 2).as_millis().max(1);
        let result = async {
            let tx = client.transaction().await?;
            tx.batch_execute(&format!(
                "SET LOCAL statement_timeout = {server}; \
                 SET LOCAL idle_in_transaction_session_timeout = {server}"
            ))
            .await?;
            let row = tx
                .query_opt(&sql, &[&name, &due, &token, &run_id, &retry, &again])
                .await?;
            tx.commit().await?;
            Ok(row.is_some())
        }
        .await;
        (client, result.map_err(|e| state_error(&e)))
    })
    .await
}

/// Records the end of the run of `due` claimed with `token`, or (`ran` false)
/// that it never started (the lease was lost right after the claim): left
/// unfinished, so the next leader runs it. `Ok(false)`: the row no longer holds
/// that claim (a newer leader took the schedule over), nothing was written.
pub async fn finish(
    target: &Target,
    timeout: Duration,
    table: &Table,
    name: &str,
    (due, token): (SystemTime, i64),
    (outcome, ran): (&str, bool),
) -> Result<bool, StateError> {
    let sql = format!(
        "UPDATE {} SET finished = CASE WHEN $5 THEN pg_catalog.clock_timestamp() END, \
         outcome = $4 \
         WHERE name OPERATOR(pg_catalog.=) $1 AND due OPERATOR(pg_catalog.=) $2 \
         AND token OPERATOR(pg_catalog.=) $3",
        table.quoted
    );
    let (name, outcome) = (name.to_owned(), outcome.to_owned());
    with_client(target, timeout, |client| async move {
        let result = client
            .execute(&sql, &[&name, &due, &token, &outcome, &ran])
            .await;
        (client, result.map(|n| n > 0).map_err(|e| state_error(&e)))
    })
    .await
}

/// A schedule's row, as `lease status --state-table` shows it.
#[derive(Debug)]
pub struct Row {
    pub name: String,
    pub schedule: String,
    pub due: Option<SystemTime>,
    pub run_id: Option<String>,
    pub started: Option<SystemTime>,
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
    use std::time::UNIX_EPOCH;

    /// An ephemeral server (stopped when dropped), its target, the state
    /// table `name` and a runtime.
    fn server(name: &str) -> (lease_tests::Cluster, Target, Table, tokio::runtime::Runtime) {
        let cluster = lease_tests::Cluster::start().expect("an ephemeral PostgreSQL");
        let target = crate::conn::resolve(Some(&cluster.url("postgres"))).expect("target");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (cluster, target, Table::parse(name).unwrap(), rt)
    }

    /// [`claim`] of job's due time `s` (run id `job@s`) by leader `token`.
    async fn claim_job(
        (target, t, table): (&Target, Duration, &Table),
        s: u64,
        token: i64,
        retry: (Option<SystemTime>, bool),
    ) -> bool {
        let run_id = format!("job@{s}");
        claim(target, t, table, "job", (due(s), &run_id), token, retry)
            .await
            .unwrap()
    }

    /// Due time `s` seconds after a fixed moment.
    fn due(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    /// The fence and the claim against a real server: once a newer leader took
    /// the schedule over, an older leader's claim is refused; a due time is
    /// claimed once; only the recorded unfinished one is claimed again.
    #[test]
    fn an_older_leader_cannot_claim_after_a_takeover() {
        let (_cluster, target, table, rt) = server("schedules_fence");
        let t = Duration::from_secs(10);
        rt.block_on(async {
            init(&target, t, &table).await.expect("init");
            let spec = ("job", "every 1m");
            // Leader 1 takes over and claims 60.
            let fenced = fence(&target, t, &table, spec, 1).await.unwrap();
            assert!(matches!(fenced, Fenced::Record(None)), "{fenced:?}");
            assert!(claim_job((&target, t, &table), 60, 1, (None, false)).await);
            assert!(
                !claim_job((&target, t, &table), 60, 1, (None, false)).await,
                "a due time is claimed once"
            );
            // Leader 2 takes over (its run of 60 never finished).
            let fenced = fence(&target, t, &table, spec, 2).await.unwrap();
            let Fenced::Record(Some(r)) = fenced else {
                panic!("{fenced:?}")
            };
            assert_eq!((r.due, r.finished, r.started), (due(60), false, true));
            // Leader 1, thawed, claims 120: refused, whatever it sends.
            assert!(!claim_job((&target, t, &table), 120, 1, (None, false)).await);
            assert!(matches!(
                fence(&target, t, &table, spec, 1).await.unwrap(),
                Fenced::Newer
            ));
            // Leader 2 runs 60 again only when told to (--unfinished retry).
            assert!(!claim_job((&target, t, &table), 60, 2, (None, false)).await);
            assert!(claim_job((&target, t, &table), 60, 2, (Some(due(60)), false)).await);
            finish(&target, t, &table, "job", (due(60), 2), ("ok", true))
                .await
                .unwrap();
            assert!(claim_job((&target, t, &table), 120, 2, (Some(due(60)), false)).await);
            // Claimed, never started: recorded so.
            finish(
                &target,
                t,
                &table,
                "job",
                (due(120), 2),
                ("not started", false),
            )
            .await
            .unwrap();
            let Fenced::Record(Some(r)) = fence(&target, t, &table, spec, 3).await.unwrap() else {
                panic!("a record")
            };
            assert_eq!((r.due, r.finished, r.started), (due(120), false, false));
            let rows = rows(&target, t, &table, &[]).await.unwrap();
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].outcome.as_deref(), Some("not started"));
        });
    }

    /// A claim that waits on the row past its timeout is aborted by the server
    /// (it never lands after the client gave up on it), and a retry by the same
    /// leader (`again`) takes its own unstarted claim, never a recorded one.
    #[test]
    fn a_claim_never_lands_after_its_timeout_and_a_retry_finds_its_own() {
        let (_cluster, target, table, rt) = server("schedules_slow");
        let t = Duration::from_secs(10);
        rt.block_on(async {
            init(&target, t, &table).await.expect("init");
            fence(&target, t, &table, ("job", "every 1m"), 1)
                .await
                .unwrap();
            // Another transaction holds the row past the claim's timeout.
            let (holder, connection) = crate::conn::connect(&target, t).await.unwrap();
            let connection = tokio::spawn(connection);
            holder
                .batch_execute("BEGIN; SELECT 1 FROM schedules_slow WHERE name = 'job' FOR UPDATE")
                .await
                .unwrap();
            let short = Duration::from_millis(600);
            let slow = claim(
                &target,
                short,
                &table,
                "job",
                (due(60), "job@60"),
                1,
                (None, false),
            );
            assert!(slow.await.is_err(), "the row is held: the claim times out");
            tokio::time::sleep(Duration::from_millis(300)).await;
            holder.batch_execute("COMMIT").await.unwrap();
            drop(holder);
            let _ = connection.await;
            let rows = rows(&target, t, &table, &[]).await.unwrap();
            assert_eq!(rows[0].due, None, "the timed-out claim did not land later");
            // A claim whose answer was lost: the same leader's retry finds it.
            let claim_60 = |again| {
                claim(
                    &target,
                    t,
                    &table,
                    "job",
                    (due(60), "job@60"),
                    1,
                    (None, again),
                )
            };
            assert!(claim_60(false).await.unwrap());
            assert!(!claim_60(false).await.unwrap(), "claimed once");
            assert!(claim_60(true).await.unwrap(), "its own claim, not started");
            assert!(
                !claim_job((&target, t, &table), 60, 2, (None, true)).await,
                "never another token's"
            );
            assert!(
                finish(&target, t, &table, "job", (due(60), 1), ("ok", true))
                    .await
                    .unwrap()
            );
            assert!(!claim_60(true).await.unwrap(), "a run that ended");
            assert!(claim_job((&target, t, &table), 120, 1, (None, false)).await);
            finish(
                &target,
                t,
                &table,
                "job",
                (due(120), 1),
                ("not started", false),
            )
            .await
            .unwrap();
            assert!(
                !claim_job((&target, t, &table), 120, 1, (None, true)).await,
                "a claim recorded as not started is not taken again"
            );
            // Taken over: the old leader's end is not written.
            fence(&target, t, &table, ("job", "every 1m"), 2)
                .await
                .unwrap();
            assert!(
                !finish(&target, t, &table, "job", (due(120), 1), ("ok", true))
                    .await
                    .unwrap()
            );
        });
    }

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
