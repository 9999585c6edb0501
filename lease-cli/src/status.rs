//! `lease status` (who holds which lease) and `lease key` (a name's key).

use lease_proto::inspect::{
    application_lease_names, HeldSince, HolderHistory, HolderRow, LeaseLocks, LockTable,
};
use lease_proto::{key_for_name, GroupId, LeaseId};
use serde_json::json;

use crate::args::{ConnArgs, HandoverArgs, KeyArgs, StatusArgs, MAX_SHARDS};
use crate::conn::{self, LockSession};
use crate::log::{usage_error, EXIT_FAILURE};

/// Runs `lease key`.
pub fn key(args: KeyArgs) -> i32 {
    match crate::args::lease_or_shard(args.name.as_str()) {
        Ok(id) => {
            println!("{}", id.key());
            0
        }
        Err(e) => usage_error(2, &e.to_string()),
    }
}

/// How long `lease handover` looks for backend PID among the key's waiters
/// before it refuses (at most `--timeout`): a standby waiting on the server
/// issues its wait again at each retry interval, and is not waiting for the
/// round trip in between.
const STANDBY_LOOK: std::time::Duration = std::time::Duration::from_millis(500);

/// `lease handover NAME --to PID`: checks that backend PID waits for NAME's
/// key on the server (`pg_locks`, a request not granted) or, failing that
/// within [`STANDBY_LOOK`], is at least a session of this database (a
/// standby crowded out of the key's queue, which queues when it hears the
/// request), refusing without sending anything otherwise; then asks NAME's
/// holder to hand it over to backend PID and waits until PID holds it (the
/// rule, and the holder's own check: lease-proto's `machine/handover.rs`).
pub fn handover(args: HandoverArgs) -> i32 {
    let id = match LeaseId::named(args.name.as_str()) {
        Ok(id) => id,
        Err(e) => return usage_error(2, &format!("{e}: {:?}", args.name)),
    };
    let (target, runtime) = match connect_setup("lease handover", &args.conn, args.timeout) {
        Ok(setup) => setup,
        Err(status) => return status,
    };
    match runtime.block_on(hand_over(&args, &id, &target)) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("lease: error: {e}");
            EXIT_FAILURE
        }
    }
}

async fn hand_over(
    args: &HandoverArgs,
    id: &LeaseId,
    target: &conn::Target,
) -> Result<String, String> {
    let (name, to) = (id.name(), args.to);
    let session = LockSession::connect(target, args.timeout).await?;
    let holder = |table: &LockTable| {
        (table.key(id.key()).and_then(|l| l.holders.first())).and_then(|h| h.pid)
    };
    // Nothing is sent unless backend `to` waits for the key: a mistyped pid
    // would stop the holder's command and leave the lease to nobody for the
    // hand-over's window.
    let look = std::time::Instant::now();
    loop {
        let table = session.locks().await?;
        match holder(&table) {
            None => return Err(format!("{name} is not held: nothing to hand over")),
            Some(pid) if pid == to => return Ok(format!("{name} is held by backend {to} already")),
            Some(_) => {}
        }
        let waiters = table.key(id.key()).map_or(&[][..], |l| &l.waiters);
        if waiters.iter().any(|w| w.pid == Some(to)) {
            break;
        }
        if look.elapsed() >= args.timeout.min(STANDBY_LOOK) {
            // A standby crowded out of the queue polls; named, it queues,
            // and the holder hands over only once it sees it wait.
            if session.connected_here(to).await? {
                break;
            }
            session.close().await;
            let pids: Vec<String> = (waiters.iter())
                .filter_map(|w| w.pid.map(|p| p.to_string()))
                .collect();
            let standbys = if pids.is_empty() {
                "none".to_owned()
            } else {
                pids.join(", ")
            };
            return Err(format!(
                "backend {to} is not a session of this database, nor waiting for {name} (the \
                 backends waiting for it: {standbys}; see `lease status`): nothing was sent"
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let start = std::time::Instant::now();
    session.request_handover(id.key(), to).await?;
    loop {
        let now = holder(&session.locks().await?);
        if now == Some(to) {
            session.close().await;
            return Ok(format!(
                "{name} handed over to backend {to} in {} ms",
                start.elapsed().as_millis()
            ));
        }
        if start.elapsed() >= args.timeout {
            session.close().await;
            let held = now.map_or("nobody".into(), |p| format!("backend {p}"));
            return Err(format!(
                "{name} is held by {held}, not backend {to}, {} after the request",
                humantime::format_duration(args.timeout)
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// What `lease status` and `lease handover` set up before they connect:
/// `--timeout` checked, the target resolved (its warnings printed), named
/// `application`, and a current-thread runtime. `Err`: the exit status,
/// the error already printed.
fn connect_setup(
    application: &str,
    conn: &ConnArgs,
    timeout: std::time::Duration,
) -> Result<(conn::Target, tokio::runtime::Runtime), i32> {
    if timeout.is_zero() {
        return Err(usage_error(2, "--timeout must be greater than zero"));
    }
    let mut target = conn::resolve(conn.database_url.as_deref()).map_err(|e| usage_error(2, &e))?;
    for warning in &target.warnings {
        eprintln!("lease: warning: {warning}");
    }
    target.config.application_name(application);
    target.config.connect_timeout(timeout);
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Ok((target, runtime)),
        Err(e) => {
            eprintln!("lease: error: cannot start the async runtime: {e}");
            Err(EXIT_FAILURE)
        }
    }
}

/// Runs `lease status`; returns the exit status.
pub fn main(args: StatusArgs) -> i32 {
    let mut ids = Vec::new();
    let mut groups = Vec::new();
    for name in &args.names {
        let named = match args.shards {
            None => (crate::args::lease_or_shard(name.as_str()).map(|id| vec![id]))
                .map_err(|e| format!("{e}: {name:?}")),
            Some(n) => crate::args::shard_leases(name, n),
        };
        match named {
            Ok(named) => {
                if args.shards.is_some() {
                    groups.extend(named.first().and_then(LeaseId::group).cloned());
                }
                ids.extend(named);
            }
            Err(e) => return usage_error(2, &e),
        }
    }
    if let Some(table) = &args.state_table {
        if let Err(e) = crate::state::Table::parse(table) {
            return usage_error(2, &e);
        }
    }
    let shown = Shown {
        ids,
        groups,
        shards: args.shards.unwrap_or(0),
    };
    let (target, runtime) = match connect_setup("lease status", &args.conn, args.timeout) {
        Ok(setup) => setup,
        Err(status) => return status,
    };
    if args.watch {
        return runtime.block_on(watch(&args, &shown, &target));
    }
    match runtime.block_on(render(&args, &shown, &target)) {
        Ok(out) => {
            print!("{out}");
            let Some(table) = &args.state_table else {
                return 0;
            };
            let schedules =
                crate::schedule::status(&target, args.timeout, table, &args.names, args.json);
            match runtime.block_on(schedules) {
                Ok(out) => {
                    if !args.json {
                        println!();
                    }
                    print!("{out}");
                    0
                }
                Err(e) => {
                    eprintln!("lease: error: cannot read the schedules: {e}");
                    EXIT_FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("lease: error: cannot query {}: {e}", target.summary);
            EXIT_FAILURE
        }
    }
}

/// What to show: the named leases (none: every key), and with `--shards`
/// the groups they are the shards of.
struct Shown {
    ids: Vec<LeaseId>,
    groups: Vec<GroupId>,
    /// `--shards` (0 without).
    shards: u16,
}

/// One read: the lock table, and with `--shards` every group member
/// ([`members_sql`](lease_proto::inspect::members_sql)).
struct Read {
    table: LockTable,
    members: Vec<HolderRow>,
}

async fn read(session: &LockSession, groups: bool) -> Result<Read, String> {
    let table = session.locks().await?;
    let members = if groups {
        session.members().await?
    } else {
        Vec::new()
    };
    Ok(Read { table, members })
}

/// Reads the lock table on `session`, connecting first when there is none
/// (or when the one kept from the last refresh fails: the server may have
/// closed it meanwhile), all within `--timeout`. `Err` is a one-line,
/// redacted message.
async fn lookup(
    args: &StatusArgs,
    target: &conn::Target,
    session: &mut Option<LockSession>,
) -> Result<Read, String> {
    let groups = args.shards.is_some();
    let attempt = async {
        if let Some(kept) = session.take() {
            if let Ok(rows) = read(&kept, groups).await {
                *session = Some(kept);
                return Ok(rows);
            }
            kept.close().await;
        }
        let fresh = LockSession::connect(target, args.timeout).await?;
        let rows = read(&fresh, groups).await;
        *session = Some(fresh);
        rows
    };
    let rows = match tokio::time::timeout(args.timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(args.timeout)
        )),
    };
    rows.map_err(|e| conn::redact(&e).replace(['\r', '\n'], " "))
}

/// One query, rendered as `lease status` prints it (a table or JSON lines).
async fn render(args: &StatusArgs, what: &Shown, target: &conn::Target) -> Result<String, String> {
    let mut session = None;
    let rows = lookup(args, target, &mut session).await;
    if let Some(s) = session {
        s.close().await;
    }
    let read = rows?;
    let leases = shown(&what.ids, &read.table);
    Ok(if args.json {
        groups_json(what, &read) + &json_lines(&leases)
    } else {
        groups_table(what, &read) + &table(&leases, what.ids.is_empty())
    })
}

/// `--watch`: queries every `--interval` on one session (reconnecting when
/// it fails) until SIGINT or SIGTERM (exit 0). On a terminal each table
/// replaces the last (ANSI clear and home); otherwise each is printed after
/// the last, headed by its time. A failed query is shown in place of the
/// table and retried at the next interval.
///
/// The table has one line per lease ([`watch_table`]); JSON lines are those
/// of a single query.
async fn watch(args: &StatusArgs, what: &Shown, target: &conn::Target) -> i32 {
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
    let mut session = None;
    let mut seen = HolderHistory::default();
    let status = loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = int.recv() => break 0,
            _ = term.recv() => break 0,
        }
        let rows = tokio::select! {
            r = lookup(args, target, &mut session) => r,
            _ = int.recv() => break 0,
            _ = term.recv() => break 0,
        };
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let body = match rows {
            Ok(read) => {
                let leases = shown(&what.ids, &read.table);
                if args.json {
                    groups_json(what, &read) + &json_lines(&leases)
                } else {
                    seen.update(&read.table, now.clone());
                    groups_table(what, &read) + &watch_table(&leases, &seen, what.ids.is_empty())
                }
            }
            Err(e) => format!("cannot query {}: {e}\n", target.summary),
        };
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
            break 0;
        }
    };
    if let Some(s) = session {
        s.close().await;
    }
    status
}

/// The named leases (held or not), or every key in the lock table when none
/// is named.
fn shown(ids: &[LeaseId], read: &LockTable) -> Vec<LeaseLocks> {
    if ids.is_empty() {
        read.all().iter().cloned().map(shard_named).collect()
    } else {
        read.leases(ids)
    }
}

/// A key that no session's `lease:NAME` names, named `NAME/I` if it is
/// that shard of a session's `lease:NAME` (`lease run NAME --shards N`).
fn shard_named(mut lease: LeaseLocks) -> LeaseLocks {
    if lease.name.is_none() {
        let mut sessions = lease.holders.iter().chain(&lease.waiters);
        lease.name = sessions.find_map(|s| {
            let groups = application_lease_names(s.application_name.as_deref()?);
            groups.into_iter().find_map(|group| {
                (0..MAX_SHARDS)
                    .map(|i| format!("{group}/{i}"))
                    .find(|shard| key_for_name(shard) == lease.key)
            })
        });
    }
    lease
}

/// The live members of `group` in `read`.
fn members<'a>(group: &GroupId, read: &'a Read) -> impl Iterator<Item = &'a HolderRow> {
    let id = i64::from(group.id());
    read.members.iter().filter(move |m| m.key == id)
}

/// The shards of `group` (of `shards`) that backend `pid` holds.
fn leads(group: &GroupId, shards: u16, table: &LockTable, pid: Option<i32>) -> Vec<u16> {
    (0..shards)
        .filter(|i| {
            let key = key_for_name(&format!("{}/{i}", group.name()));
            let holders = table.key(key).map_or(&[][..], |l| &l.holders);
            pid.is_some() && holders.iter().any(|h| h.pid == pid)
        })
        .collect()
}

/// `--shards`: a line per member of each group, before the leases' table:
/// its session (as a holder's), SINCE (its backend start) and LEADS (how
/// many of the group's shards it holds: which). A group without a live
/// member has one line of dashes. Empty without `--shards`.
fn groups_table(what: &Shown, read: &Read) -> String {
    if what.groups.is_empty() {
        return String::new();
    }
    let mut rows = vec![[
        "GROUP",
        "BACKEND PID",
        "APPLICATION",
        "CLIENT",
        "SINCE",
        "LEADS",
    ]
    .map(str::to_owned)];
    for group in &what.groups {
        let name = group.name().replace(char::is_whitespace, " ");
        let mut any = false;
        for m in members(group, read) {
            any = true;
            let [pid, application, client] = session_cells(Some(m));
            let leads = leads(group, what.shards, &read.table, m.pid);
            let list: Vec<String> = leads.iter().map(u16::to_string).collect();
            rows.push([
                name.clone(),
                pid,
                application,
                client,
                m.backend_start.as_deref().map_or_else(dash, seconds),
                if list.is_empty() {
                    "0".to_owned()
                } else {
                    format!("{}: {}", list.len(), list.join(","))
                },
            ]);
        }
        if !any {
            rows.push([name, dash(), dash(), dash(), dash(), dash()]);
        }
    }
    align(&rows) + "\n"
}

/// `--shards --json`: an object per group, with a `members` array (each
/// with the shards it `leads`). Empty without `--shards`.
fn groups_json(what: &Shown, read: &Read) -> String {
    let line = |group: &GroupId| {
        let members: Vec<serde_json::Value> = members(group, read)
            .map(|m| {
                json!({
                    "backend_pid": m.pid,
                    "application_name": m.application_name,
                    "client_addr": m.client_addr,
                    "client_port": m.client_port,
                    "backend_start": m.backend_start,
                    "leads": leads(group, what.shards, &read.table, m.pid),
                })
            })
            .collect();
        let value = json!({
            "group": group.name(),
            "group_id": group.id(),
            "shards": what.shards,
            "members": members,
        });
        value.to_string() + "\n"
    };
    what.groups.iter().map(line).collect()
}

/// Each holder of a lease, or `None` once for a lease nobody holds: a
/// line of the tables and of the JSON output each.
fn holders(lease: &LeaseLocks) -> Vec<Option<&HolderRow>> {
    if lease.holders.is_empty() {
        vec![None]
    } else {
        lease.holders.iter().map(Some).collect()
    }
}

/// Each lease with each of its [`holders`].
fn lines(leases: &[LeaseLocks]) -> impl Iterator<Item = (&LeaseLocks, Option<&HolderRow>)> {
    (leases.iter()).flat_map(|l| holders(l).into_iter().map(move |h| (l, h)))
}

/// Where a session connects from: `ADDR:PORT`, `local` for a Unix socket.
pub fn client(h: &HolderRow) -> Option<String> {
    match (&h.client_addr, h.client_port) {
        (Some(a), Some(p)) if p > 0 => Some(format!("{a}:{p}")),
        (Some(a), _) => Some(a.clone()),
        (None, Some(-1)) => Some("local".to_owned()),
        _ => None,
    }
}

/// One JSON object per lease and holder, a line each.
fn json_lines(leases: &[LeaseLocks]) -> String {
    lines(leases).map(|(l, h)| json_line(l, h) + "\n").collect()
}

fn json_line(e: &LeaseLocks, h: Option<&HolderRow>) -> String {
    let standbys: Vec<serde_json::Value> = (e.waiters.iter())
        .map(|s| {
            json!({
                "backend_pid": s.pid,
                "mode": s.mode,
                "application_name": s.application_name,
                "client_addr": s.client_addr,
                "client_port": s.client_port,
                "backend_start": s.backend_start,
                "wait_start": s.wait_start,
                "state": s.state,
            })
        })
        .collect();
    json!({
        "name": e.name,
        "key": e.key,
        "held": h.is_some(),
        "backend_pid": h.and_then(|h| h.pid),
        "mode": h.and_then(|h| h.mode.clone()),
        "application_name": h.and_then(|h| h.application_name.clone()),
        "client_addr": h.and_then(|h| h.client_addr.clone()),
        "client_port": h.and_then(|h| h.client_port),
        "backend_start": h.and_then(|h| h.backend_start.clone()),
        "state_change": h.and_then(|h| h.state_change.clone()),
        "state": h.and_then(|h| h.state.clone()),
        "standbys": standbys,
    })
    .to_string()
}

/// An RFC 3339 time of [`holders_sql`](lease_proto::inspect::holders_sql)
/// cut to whole seconds, for tables and log lines.
pub fn seconds(t: &str) -> String {
    match t.split_once('.') {
        Some((s, _)) if t.ends_with('Z') => format!("{s}Z"),
        _ => t.to_owned(),
    }
}

/// Aligns rows of cells into lines, the first row the header.
fn align<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
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

const NOTHING: &str = "no advisory locks are held or waited for in this database\n";

fn dash() -> String {
    "-".to_owned()
}

fn name_cell(e: &LeaseLocks) -> String {
    (e.name.clone().unwrap_or_else(dash)).replace(char::is_whitespace, " ")
}

/// The BACKEND PID, APPLICATION and CLIENT cells of a session (dashes for
/// none).
fn session_cells(s: Option<&HolderRow>) -> [String; 3] {
    [
        s.and_then(|s| s.pid).map_or_else(dash, |p| p.to_string()),
        s.and_then(|s| s.application_name.clone())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(dash),
        s.and_then(client).unwrap_or_else(dash),
    ]
}

/// The table of a single query: a line per session, the holder's (ROLE
/// `holder`, or `free` when nobody holds the lease) then its standbys' in
/// queue order (ROLE `standby`). SINCE is the session's backend start: when
/// a standby began standing by on its current session, and for a holder the
/// earliest it can have taken the key (the server records no grant time).
/// WAIT START is when a standby's current wait began (a standby that waits
/// with a lock timeout starts a new wait at each timeout).
fn table(leases: &[LeaseLocks], all: bool) -> String {
    if leases.is_empty() && all {
        return NOTHING.to_owned();
    }
    let mut rows = vec![[
        "NAME",
        "KEY",
        "ROLE",
        "BACKEND PID",
        "APPLICATION",
        "CLIENT",
        "SINCE",
        "WAIT START",
    ]
    .map(str::to_owned)];
    let line = |e: &LeaseLocks, role: &str, s: Option<&HolderRow>| {
        let [pid, application, client] = session_cells(s);
        [
            name_cell(e),
            e.key.to_string(),
            role.to_owned(),
            pid,
            application,
            client,
            s.and_then(|s| s.backend_start.as_deref().map(seconds))
                .unwrap_or_else(dash),
            s.and_then(|s| s.wait_start.as_deref().map(seconds))
                .unwrap_or_else(dash),
        ]
    };
    for e in leases {
        for h in holders(e) {
            let role = if h.is_some() { "holder" } else { "free" };
            rows.push(line(e, role, h));
        }
        // The standbys once per lease, after its last holder.
        for s in &e.waiters {
            rows.push(line(e, "standby", Some(s)));
        }
    }
    align(&rows)
}

/// The `--watch` table: a line per lease with its holder and, as pids, its
/// standbys. HELD SINCE is what this watch saw ([`HolderHistory::since`]):
/// the refresh that first showed the holder (it took the key after the
/// refresh before), or `before` the first refresh. The holder's fencing
/// token is not shown because no one but the holder can know it (the
/// server keeps no record of it).
fn watch_table(leases: &[LeaseLocks], seen: &HolderHistory<String>, all: bool) -> String {
    if leases.is_empty() && all {
        return NOTHING.to_owned();
    }
    let mut rows = vec![[
        "NAME",
        "KEY",
        "HELD",
        "BACKEND PID",
        "APPLICATION",
        "CLIENT",
        "HELD SINCE",
        "STANDBYS",
    ]
    .map(str::to_owned)];
    for (e, h) in lines(leases) {
        let standbys = (e.waiters.iter())
            .map(|s| s.pid.map_or_else(|| "?".to_owned(), |p| p.to_string()))
            .collect::<Vec<_>>();
        let standbys = if standbys.is_empty() {
            "0".to_owned()
        } else {
            format!("{}: {}", standbys.len(), standbys.join(","))
        };
        let [pid, application, client] = session_cells(h);
        rows.push([
            name_cell(e),
            e.key.to_string(),
            if h.is_some() { "yes" } else { "no" }.to_owned(),
            pid,
            application,
            client,
            h.and_then(|h| seen.since(h))
                .map_or_else(dash, |since| match since {
                    HeldSince::At(at) => at.clone(),
                    HeldSince::Before(at) => format!("before {at}"),
                }),
            standbys,
        ]);
    }
    align(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(key: i64, app: &str) -> HolderRow {
        HolderRow {
            key,
            pid: Some(42),
            mode: Some("ExclusiveLock".to_owned()),
            application_name: Some(app.to_owned()),
            client_addr: Some("127.0.0.1".to_owned()),
            client_port: Some(5000),
            backend_start: Some("2026-12-01T10:00:00.123456Z".to_owned()),
            granted: true,
            ..HolderRow::default()
        }
    }

    fn standby(key: i64, pid: i32, app: &str) -> HolderRow {
        HolderRow {
            pid: Some(pid),
            mode: Some("ShareLock".to_owned()),
            client_port: Some(-1),
            client_addr: None,
            granted: false,
            wait_start: Some("2026-12-01T10:05:00.5Z".to_owned()),
            ..holder(key, app)
        }
    }

    /// The JSON lines of `leases`, parsed.
    fn json_values(leases: &[LeaseLocks]) -> Vec<serde_json::Value> {
        let json = json_lines(leases);
        (json.lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn named_leases_show_held_or_not() {
        let a = LeaseId::named("a").unwrap();
        let b = LeaseId::named("b").unwrap();
        let read = LockTable::from_rows([holder(a.key(), "lease:a")]);
        let e = shown(&[a.clone(), b.clone()], &read);
        let text = table(&e, false);
        assert!(
            text.contains(" holder ") && text.contains(" free"),
            "{text}"
        );
        assert!(text.contains("127.0.0.1:5000"), "{text}");
        assert!(text.contains("2026-12-01T10:00:00Z"), "{text}");
        let lines = json_values(&e);
        assert_eq!(lines.len(), 2, "{lines:?}");
        let line = &lines[0];
        assert_eq!(line["held"], true);
        assert_eq!(line["backend_pid"], 42);
        assert_eq!(line["key"], a.key());
        assert_eq!(line["standbys"], serde_json::json!([]));
        assert_eq!(
            (lines[1]["held"].clone(), lines[1]["name"].clone()),
            (false.into(), "b".into())
        );
    }

    #[test]
    fn standbys_follow_their_holder_in_queue_order() {
        let a = LeaseId::named("a").unwrap();
        let b = LeaseId::named("b").unwrap();
        let rows = vec![
            holder(a.key(), "lease:a"),
            standby(a.key(), 50, "lease:a"),
            standby(a.key(), 49, "psql"),
            // A waiter with nobody holding (the instant after a release).
            standby(b.key(), 60, "lease:b"),
        ];
        let e = shown(&[a.clone(), b.clone()], &LockTable::from_rows(rows));

        let text = table(&e, false);
        let roles: Vec<(&str, &str)> = (text.lines().skip(1))
            .map(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                (c[2], c[3])
            })
            .collect();
        assert_eq!(
            roles,
            [
                ("holder", "42"),
                ("standby", "50"),
                ("standby", "49"),
                ("free", "-"),
                ("standby", "60")
            ],
            "{text}"
        );
        let standby_line = text.lines().nth(3).unwrap();
        assert!(standby_line.contains(" psql "), "{text}");
        assert!(standby_line.contains(" local "), "{text}");
        assert!(standby_line.ends_with("2026-12-01T10:05:00Z"), "{text}");

        let lines = json_values(&e);
        let v = &lines[0];
        assert_eq!(v["backend_pid"], 42);
        let s = v["standbys"].as_array().unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0]["backend_pid"], 50);
        assert_eq!(s[0]["mode"], "ShareLock");
        assert_eq!(s[0]["wait_start"], "2026-12-01T10:05:00.5Z");
        assert_eq!(s[1]["application_name"], "psql");
        let v = &lines[1];
        assert_eq!(
            (v["held"].clone(), v["standbys"][0]["backend_pid"].clone()),
            (false.into(), 60.into())
        );
    }

    #[test]
    fn watch_lines_count_standbys_and_date_holders() {
        let a = LeaseId::named("a").unwrap();
        let ids = [a.clone()];
        let mut seen = HolderHistory::default();
        let first = LockTable::from_rows([holder(a.key(), "lease:a")]);
        seen.update(&first, "T0".to_owned());
        let text = watch_table(&shown(&ids, &first), &seen, false);
        assert!(text.contains(" before T0 "), "{text}");
        assert!(text.trim_end().ends_with(" 0"), "{text}");
        // Another holder, seen first at T1, and two standbys.
        let mut next = holder(a.key(), "lease:a");
        next.pid = Some(43);
        let rows = [
            next,
            standby(a.key(), 50, "lease:a"),
            standby(a.key(), 51, "x"),
        ];
        let second = LockTable::from_rows(rows);
        seen.update(&second, "T1".to_owned());
        let text = watch_table(&shown(&ids, &second), &seen, false);
        let line = text.lines().nth(1).unwrap();
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[2..4], ["yes", "43"], "{text}");
        assert_eq!(cells[6..], ["T1", "2:", "50,51"], "{text}");
    }

    /// `--shards`: a line per member with the shards it holds, a line of
    /// dashes for a group without members; JSON the same; with no name, a
    /// shard's key is named after its session's `lease:NAME`.
    #[test]
    fn groups_show_their_members_and_the_shards_each_leads() {
        let ids = crate::args::shard_leases("g", 3).unwrap();
        let other = GroupId::named("empty").unwrap();
        let group = ids[0].group().unwrap().clone();
        let mut member = holder(i64::from(group.id()), "lease:g");
        member.pid = Some(7);
        let mut second = member.clone();
        second.pid = Some(8);
        let mut held = holder(ids[2].key(), "lease:g");
        held.pid = Some(7);
        let read = Read {
            table: LockTable::from_rows([held.clone()]),
            members: vec![member, second],
        };
        let what = Shown {
            ids: ids.clone(),
            groups: vec![group.clone(), other],
            shards: 3,
        };
        let text = groups_table(&what, &read);
        let lines: Vec<Vec<&str>> = (text.lines().skip(1))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0][..2], ["g", "7"], "{text}");
        assert_eq!(lines[0][5..], ["1:", "2"], "{text}");
        assert_eq!(lines[1][5..], ["0"], "{text}");
        assert_eq!(lines[2], ["empty", "-", "-", "-", "-", "-"], "{text}");
        assert!(text.ends_with("\n\n"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(groups_json(&what, &read).lines().next().unwrap()).unwrap();
        assert_eq!(json["group"], "g");
        assert_eq!(json["members"][0]["leads"], serde_json::json!([2]));
        assert_eq!(json["members"][1]["leads"], serde_json::json!([]));
        let all = shown(&[], &read.table);
        assert_eq!(all[0].name.as_deref(), Some("g/2"));
        assert!(groups_table(
            &Shown {
                groups: vec![],
                ..what
            },
            &read
        )
        .is_empty());
    }

    #[test]
    fn nothing_held_and_times_in_seconds() {
        assert_eq!(table(&[], true), NOTHING);
        assert_eq!(watch_table(&[], &HolderHistory::default(), true), NOTHING);
        assert_eq!(
            seconds("2026-12-01T10:00:00.123456Z"),
            "2026-12-01T10:00:00Z"
        );
        assert_eq!(seconds("odd"), "odd");
    }
}
