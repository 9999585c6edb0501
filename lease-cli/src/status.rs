//! `lease status` (who holds which lease) and `lease key` (a name's key).

use std::time::Duration;

use lease_proto::{key_for_name, HolderRow, LeaseId, HOLDERS_SQL};
use serde_json::json;

use crate::args::{KeyArgs, StatusArgs};
use crate::{conn, usage_error, EXIT_FAILURE};

/// One line of output: a lease (named or not) and its holder, if any.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    name: Option<String>,
    key: i64,
    holder: Option<HolderRow>,
}

/// Runs `lease key`.
pub fn key(args: KeyArgs) -> i32 {
    match LeaseId::named(args.name.as_str()) {
        Ok(id) => {
            println!("{}", id.key());
            0
        }
        Err(e) => usage_error(2, &e.to_string()),
    }
}

/// Runs `lease status`; returns the exit status.
pub fn main(args: StatusArgs) -> i32 {
    let mut ids = Vec::new();
    for name in &args.names {
        match LeaseId::named(name.as_str()) {
            Ok(id) => ids.push(id),
            Err(e) => return usage_error(2, &format!("{e}: {name:?}")),
        }
    }
    if args.timeout.is_zero() {
        return usage_error(2, "--timeout must be greater than zero");
    }
    let mut target = match conn::resolve(&args.conn) {
        Ok(t) => t,
        Err(e) => return usage_error(2, &e),
    };
    for warning in &target.warnings {
        eprintln!("lease: warning: {warning}");
    }
    target.config.application_name("lease status");
    target.config.connect_timeout(args.timeout);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease: error: cannot start the async runtime: {e}");
            return EXIT_FAILURE;
        }
    };
    if args.watch {
        return runtime.block_on(watch(&args, &ids, &target));
    }
    match runtime.block_on(render(&args, &ids, &target)) {
        Ok(out) => {
            print!("{out}");
            0
        }
        Err(e) => {
            eprintln!("lease: error: cannot query {}: {e}", target.summary);
            EXIT_FAILURE
        }
    }
}

/// One query, rendered as `lease status` prints it (a table or JSON lines).
/// `Err` is a one-line, redacted message.
async fn render(
    args: &StatusArgs,
    ids: &[LeaseId],
    target: &conn::Target,
) -> Result<String, String> {
    let held = match tokio::time::timeout(args.timeout, query(target)).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(args.timeout)
        )),
    };
    let held = held.map_err(|e| conn::redact(&e).replace(['\r', '\n'], " "))?;
    let entries = entries(ids, held);
    Ok(if args.json {
        entries.iter().map(|e| json_line(e) + "\n").collect()
    } else {
        table(&entries, ids.is_empty())
    })
}

/// `--watch`: queries every `--interval` until SIGINT or SIGTERM (exit 0).
/// On a terminal each table replaces the last (ANSI clear and home);
/// otherwise each is printed after the last, headed by its time. A failed
/// query is shown in place of the table and retried at the next interval.
async fn watch(args: &StatusArgs, ids: &[LeaseId], target: &conn::Target) -> i32 {
    use std::io::{IsTerminal, Write};
    use tokio::signal::unix::{signal, SignalKind};
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(int), Ok(term)) => (int, term),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("lease: error: cannot install signal handlers: {e}");
            return EXIT_FAILURE;
        }
    };
    let tty = std::io::stdout().is_terminal();
    let every = humantime::format_duration(args.interval);
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = int.recv() => return 0,
            _ = term.recv() => return 0,
        }
        let body = tokio::select! {
            r = render(args, ids, target) => r,
            _ = int.recv() => return 0,
            _ = term.recv() => return 0,
        };
        let body = body.unwrap_or_else(|e| format!("cannot query {}: {e}\n", target.summary));
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        // JSON lines stay JSON lines: no heading.
        let head = if args.json {
            String::new()
        } else {
            format!("every {every} at {now} (Ctrl-C to stop)\n")
        };
        let frame = if tty {
            // Home, then the table, clearing what the last frame left below.
            format!("\x1b[H\x1b[2J{head}{body}")
        } else {
            format!("{head}{body}{}", if args.json { "" } else { "\n" })
        };
        let mut out = std::io::stdout().lock();
        if out
            .write_all(frame.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            // The reader went away (a closed pipe): nothing left to show.
            return 0;
        }
    }
}

async fn query(target: &conn::Target) -> Result<Vec<HolderRow>, String> {
    let (client, connection) = target
        .config
        .connect(target.tls.clone())
        .await
        .map_err(|e| conn::error_chain(&e))?;
    let connection = tokio::spawn(connection);
    let rows = client
        .query(HOLDERS_SQL, &[])
        .await
        .map_err(|e| conn::error_chain(&e))?;
    drop(client);
    let _ = tokio::time::timeout(Duration::from_secs(1), connection).await;
    let mut held = Vec::with_capacity(rows.len());
    for row in rows {
        let holder = HolderRow {
            key: row.try_get(0).map_err(|e| conn::error_chain(&e))?,
            pid: row.try_get(1).map_err(|e| conn::error_chain(&e))?,
            mode: row.try_get(2).map_err(|e| conn::error_chain(&e))?,
            application_name: row.try_get(3).map_err(|e| conn::error_chain(&e))?,
            client_addr: row.try_get(4).map_err(|e| conn::error_chain(&e))?,
            client_port: row.try_get(5).map_err(|e| conn::error_chain(&e))?,
            backend_start: row.try_get(6).map_err(|e| conn::error_chain(&e))?,
            state_change: row.try_get(7).map_err(|e| conn::error_chain(&e))?,
            state: row.try_get(8).map_err(|e| conn::error_chain(&e))?,
        };
        held.push(holder);
    }
    Ok(held)
}

/// The named leases (held or not), or every held key when none is named.
fn entries(ids: &[LeaseId], held: Vec<HolderRow>) -> Vec<Entry> {
    if ids.is_empty() {
        return held
            .into_iter()
            .map(|h| Entry {
                name: guess_name(&h),
                key: h.key,
                holder: Some(h),
            })
            .collect();
    }
    let mut out = Vec::new();
    for id in ids {
        let mut found = false;
        for h in held.iter().filter(|h| h.key == id.key()) {
            found = true;
            out.push(Entry {
                name: Some(id.name().to_owned()),
                key: id.key(),
                holder: Some(h.clone()),
            });
        }
        if !found {
            out.push(Entry {
                name: Some(id.name().to_owned()),
                key: id.key(),
                holder: None,
            });
        }
    }
    out
}

/// The lease name of a holder that runs `lease run` (application_name
/// `lease:NAME`, confirmed by the key).
fn guess_name(h: &HolderRow) -> Option<String> {
    let name = h.application_name.as_deref()?.strip_prefix("lease:")?;
    (key_for_name(name) == h.key).then(|| name.to_owned())
}

fn client(h: &HolderRow) -> Option<String> {
    match (&h.client_addr, h.client_port) {
        (Some(a), Some(p)) if p > 0 => Some(format!("{a}:{p}")),
        (Some(a), _) => Some(a.clone()),
        (None, Some(-1)) => Some("local".to_owned()),
        _ => None,
    }
}

fn json_line(e: &Entry) -> String {
    let h = e.holder.as_ref();
    json!({
        "name": e.name,
        "key": e.key,
        "held": h.is_some(),
        "pid": h.and_then(|h| h.pid),
        "mode": h.and_then(|h| h.mode.clone()),
        "application_name": h.and_then(|h| h.application_name.clone()),
        "client_addr": h.and_then(|h| h.client_addr.clone()),
        "client_port": h.and_then(|h| h.client_port),
        "backend_start": h.and_then(|h| h.backend_start.clone()),
        "state_change": h.and_then(|h| h.state_change.clone()),
        "state": h.and_then(|h| h.state.clone()),
    })
    .to_string()
}

/// An aligned table with a header; a note when nothing is held.
fn table(entries: &[Entry], all: bool) -> String {
    if entries.is_empty() && all {
        return "no advisory locks are held in this database\n".to_owned();
    }
    let dash = || "-".to_owned();
    let mut rows = vec![[
        "NAME",
        "KEY",
        "HELD",
        "PID",
        "APPLICATION",
        "CLIENT",
        "BACKEND START",
        "STATE CHANGE",
    ]
    .map(str::to_owned)];
    for e in entries {
        let h = e.holder.as_ref();
        let name = e.name.clone().unwrap_or_else(dash);
        let name = name.replace(char::is_whitespace, " ");
        rows.push([
            name,
            e.key.to_string(),
            if h.is_some() { "yes" } else { "no" }.to_owned(),
            h.and_then(|h| h.pid).map_or_else(dash, |p| p.to_string()),
            h.and_then(|h| h.application_name.clone())
                .filter(|a| !a.is_empty())
                .unwrap_or_else(dash),
            h.and_then(client).unwrap_or_else(dash),
            h.and_then(|h| h.backend_start.clone()).unwrap_or_else(dash),
            h.and_then(|h| h.state_change.clone()).unwrap_or_else(dash),
        ]);
    }
    let mut widths = [0; 8];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(key: i64, app: &str) -> HolderRow {
        HolderRow {
            key,
            pid: Some(42),
            application_name: Some(app.to_owned()),
            client_addr: Some("127.0.0.1".to_owned()),
            client_port: Some(5000),
            ..HolderRow::default()
        }
    }

    #[test]
    fn named_leases_show_held_or_not() {
        let a = LeaseId::named("a").unwrap();
        let b = LeaseId::named("b").unwrap();
        let e = entries(&[a.clone(), b.clone()], vec![holder(a.key(), "lease:a")]);
        assert_eq!(e.len(), 2);
        assert!(e[0].holder.is_some());
        assert!(e[1].holder.is_none());
        let text = table(&e, false);
        assert!(text.contains("yes") && text.contains("no"), "{text}");
        assert!(text.contains("127.0.0.1:5000"), "{text}");
        let line: serde_json::Value = serde_json::from_str(&json_line(&e[0])).unwrap();
        assert_eq!(line["held"], true);
        assert_eq!(line["pid"], 42);
        assert_eq!(line["key"], a.key());
    }

    #[test]
    fn unnamed_keys_get_their_name_from_lease_run() {
        let a = LeaseId::named("sweeper").unwrap();
        let e = entries(
            &[],
            vec![holder(a.key(), "lease:sweeper"), holder(7, "other")],
        );
        assert_eq!(e[0].name.as_deref(), Some("sweeper"));
        assert_eq!(e[1].name, None);
        assert_eq!(
            table(&[], true),
            "no advisory locks are held in this database\n"
        );
    }
}
