//! The connection of `lease run` and `lease status`: `--database-url`,
//! `DATABASE_URL` or the libpq environment, resolved by lease-libpq (its
//! crate docs have every keyword, variable and `sslmode` rule), a
//! connection opened the way the lease session opens one, and the session
//! that reads the lock table on one.

use std::time::Duration;

use lease_proto::inspect::{holders_sql, members_sql, HolderRow, LockTable};
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::Config;

pub use lease_libpq::redact;

/// The TLS connector `lease` connects with (every mode: tokio-postgres does
/// not call it for `disable`).
pub type Connector = tokio_postgres_rustls::MakeRustlsConnect;

/// A resolved connection.
#[derive(Clone)]
pub struct Target {
    /// The configuration to connect with.
    pub config: Config,
    /// The TLS connector to connect with.
    pub tls: Connector,
    /// Where it points, for log lines (never the password).
    pub summary: String,
    /// What the user should know but that does not stop `lease`: to log.
    pub warnings: Vec<String>,
    /// Where no password was found, if none was: for a "password missing"
    /// error ([`lease_libpq::Conninfo::password_search`]).
    pub password_search: Option<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The summary, not the config: nothing that could hold a secret.
        f.debug_struct("Target")
            .field("summary", &self.summary)
            .finish_non_exhaustive()
    }
}

/// Resolves `--database-url` (`url`), else `DATABASE_URL`, with the process
/// environment.
///
/// # Errors
/// lease-libpq's one-line message, naming the keyword or variable.
/// A `DATABASE_URL` or `PG*` variable that is not UTF-8 is an error naming
/// it (never its value), not a silent "unset" that connects elsewhere.
pub fn resolve(url: Option<&str>) -> Result<Target, String> {
    let from_env;
    let (string, origin) = match url {
        Some(u) => (Some(u), "--database-url"),
        None => {
            from_env = lease_libpq::env_var("DATABASE_URL").map_err(|e| e.to_string())?;
            (from_env.as_deref(), "DATABASE_URL")
        }
    };
    target(lease_libpq::Conninfo::from_process_env(string, origin))
}

/// [`resolve`] with an explicit environment, for tests.
#[cfg(test)]
fn resolve_from(url: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Target, String> {
    let from_env;
    let (string, origin) = match url {
        Some(u) => (Some(u), "--database-url"),
        None => {
            from_env = env("DATABASE_URL").filter(|v| !v.is_empty());
            (from_env.as_deref(), "DATABASE_URL")
        }
    };
    target(lease_libpq::Conninfo::resolve(string, origin, env))
}

fn target(
    conninfo: Result<lease_libpq::Conninfo, lease_libpq::ConninfoError>,
) -> Result<Target, String> {
    let conninfo = conninfo.map_err(|e| e.to_string())?;
    Ok(Target {
        tls: Connector::new((*conninfo.rustls()).clone()),
        summary: conninfo.summary().to_owned(),
        warnings: conninfo.warnings().to_vec(),
        password_search: conninfo.password_search().map(str::to_owned),
        config: conninfo.into_config(),
    })
}

/// Connects to `target` like the lease session does: each host in turn, each
/// within its share of `timeout` (lease-driver's docs, "Several hosts"), so a
/// host that accepts connections but never answers costs only its share.
/// The connection runs on a spawned task; its handle comes back with the
/// client. `Err` is the last host's error chain (not yet redacted).
pub async fn connect(
    target: &Target,
    timeout: Duration,
) -> Result<
    (
        tokio_postgres::Client,
        tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    ),
    String,
> {
    let hosts = lease_driver::hosts(&target.config, timeout);
    let mut error = "no host given".to_owned();
    for (mut host, share) in hosts {
        // `read-write` is a primary for a lease, read-only by default or not,
        // checked as the lease session checks it (lease-driver's docs,
        // "Several hosts"), not by tokio-postgres's `transaction_read_only`.
        let primary = host.get_target_session_attrs() == TargetSessionAttrs::ReadWrite;
        host.target_session_attrs(TargetSessionAttrs::Any);
        let tls = target.tls.clone();
        let attempt = async move {
            let (client, connection) = host.connect(tls).await.map_err(|e| error_chain(&e))?;
            let connection = tokio::spawn(connection);
            if primary {
                if let Err(e) = lease_driver::check_primary(&client).await {
                    connection.abort();
                    return Err(e.message);
                }
            }
            Ok((client, connection))
        };
        let result = match share {
            Some(share) => match tokio::time::timeout(share, attempt).await {
                Ok(r) => r,
                Err(_) => Err(format!(
                    "connection attempt timed out after {} ms",
                    share.as_millis()
                )),
            },
            None => attempt.await,
        };
        match result {
            Ok(opened) => return Ok(opened),
            Err(e) => error = e,
        }
    }
    Err(error)
}

/// A session that reads the lock table: `lease status`'s (kept open across
/// `--watch` refreshes) and `lease run`'s holder lookups.
pub struct LockSession {
    client: tokio_postgres::Client,
    connection: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
}

impl LockSession {
    pub async fn connect(target: &Target, timeout: Duration) -> Result<LockSession, String> {
        let (client, connection) = connect(target, timeout).await?;
        Ok(LockSession { client, connection })
    }

    /// Every advisory lock request of the database ([`holders_sql`]).
    pub async fn locks(&self) -> Result<LockTable, String> {
        self.rows(holders_sql()).await.map(LockTable::from_rows)
    }

    /// Every lease group member of the database ([`members_sql`]), with the
    /// group id as the row's key.
    pub async fn members(&self) -> Result<Vec<HolderRow>, String> {
        self.rows(members_sql()).await
    }

    async fn rows(&self, sql: &str) -> Result<Vec<HolderRow>, String> {
        use tokio_postgres::SimpleQueryMessage;
        let messages = (self.client.simple_query(sql).await).map_err(|e| error_chain(&e))?;
        let mut rows = Vec::new();
        for message in messages {
            if let SimpleQueryMessage::Row(row) = message {
                let columns = (0..row.len()).map(|i| row.get(i));
                rows.push(HolderRow::parse(columns).map_err(|e| e.to_string())?);
            }
        }
        Ok(rows)
    }

    /// Whether backend `pid` is a session of this database
    /// (`pg_stat_activity`, which any role may read).
    pub async fn connected_here(&self, pid: i32) -> Result<bool, String> {
        let sql = format!(
            "SELECT 1 FROM pg_catalog.pg_stat_activity WHERE pid OPERATOR(pg_catalog.=) {pid} \
             AND datname OPERATOR(pg_catalog.=) pg_catalog.current_database()"
        );
        let messages = (self.client.simple_query(&sql).await).map_err(|e| error_chain(&e))?;
        Ok((messages.iter()).any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))))
    }

    /// Asks the holder of `key` to hand it over to backend `pid` (the
    /// request on the handover channel: `lease_proto::server::handover_request_payload`).
    pub async fn request_handover(&self, key: i64, pid: i32) -> Result<(), String> {
        let payload = lease_proto::server::handover_request_payload(key, i64::from(pid));
        let sql = format!(
            "SELECT pg_catalog.pg_notify('{}', '{payload}')",
            lease_proto::server::HANDOVER_CHANNEL
        );
        let result = self.client.simple_query(&sql).await;
        result.map(drop).map_err(|e| error_chain(&e))
    }

    /// Ends the session (a Terminate message, then the socket closes).
    pub async fn close(self) {
        drop(self.client);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.connection).await;
    }
}

/// An error and its sources, `: `-separated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_flag_wins_over_database_url() {
        let env = with_env(&[("USER", "u"), ("DATABASE_URL", "host=fromenv")]);
        let t = resolve_from(Some("host=fromflag"), &env).unwrap();
        assert!(t.summary.starts_with("host fromflag "), "{}", t.summary);
        let t = resolve_from(None, &env).unwrap();
        assert!(t.summary.starts_with("host fromenv "), "{}", t.summary);
        let e = resolve_from(Some("host=h usr=x"), &env).unwrap_err();
        assert_eq!(
            e,
            "unknown keyword `usr` in --database-url (did you mean `user`?)"
        );
        let e = resolve_from(None, &with_env(&[("DATABASE_URL", "host=h usr=x")])).unwrap_err();
        assert!(e.ends_with("in DATABASE_URL (did you mean `user`?)"), "{e}");
    }
}
