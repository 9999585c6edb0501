//! A blocking tokio-postgres connection on a private current-thread runtime: the
//! connection is driven only while a query runs, on the calling thread, so a timed query
//! measures the round trip and the server's work, not cross-thread wake-ups.

use crate::R;
use lease_tests::scenario::text_rows;
use std::time::Instant;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

pub struct Pg {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl Pg {
    /// Connects to database `db` of the server at 127.0.0.1:`port` as `postgres`.
    pub fn connect(port: u16, db: &str, app: &str) -> R<Pg> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("building a tokio runtime: {e}"))?;
        let conn = format!(
            "host=127.0.0.1 port={port} user=postgres dbname={db} application_name={app} \
             connect_timeout=10"
        );
        let (client, connection) = rt
            .block_on(tokio_postgres::connect(&conn, NoTls))
            .map_err(|e| format!("connecting to database {db}: {e}"))?;
        rt.spawn(async move {
            let _ = connection.await;
        });
        Ok(Pg { rt, client })
    }

    /// Every row of `sql` (simple-query protocol) as text columns ([`text_rows`]).
    pub fn rows(&self, sql: &str) -> R<Vec<Vec<Option<String>>>> {
        let messages = self
            .rt
            .block_on(self.client.simple_query(sql))
            .map_err(|e| format!("query {sql:?}: {e}"))?;
        Ok(text_rows(messages))
    }

    /// The first column of the first row.
    pub fn one(&self, sql: &str) -> R<String> {
        self.rows(sql)?
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next().flatten())
            .ok_or_else(|| format!("query {sql:?} returned no value"))
    }

    /// Runs `sql` `reps` times and returns each round trip in nanoseconds, and the row
    /// count of the last run.
    pub fn time(&self, sql: &str, reps: usize) -> R<(Vec<u64>, usize)> {
        self.rt.block_on(async {
            let mut times = Vec::with_capacity(reps);
            let mut rows = 0;
            for _ in 0..reps {
                let t = Instant::now();
                let messages = self
                    .client
                    .simple_query(sql)
                    .await
                    .map_err(|e| format!("timed query: {e}"))?;
                times.push(t.elapsed().as_nanos() as u64);
                rows = messages
                    .iter()
                    .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
                    .count();
            }
            Ok((times, rows))
        })
    }
}
