//! `lease status`: the holder, the standbys waiting on the server, and the key it names
//! is the core's.

use crate::common::*;
use lease_proto::key_for_name;
use lease_tests::Cluster;
use lease_tests::Replica;
use std::process::Command;
use std::time::Instant;

#[test]
fn status_shows_the_holder() {
    let c = cluster();
    let name = unique("status");
    let other = unique("nobody");
    let mut a =
        Replica::spawn(fast_sh(&c, &name, &[], "echo started; exec sleep 1000")).expect("spawn");
    a.wait_for_line(|l| l == "started", MS(10_000))
        .expect("a leads");
    let pids = c
        .backends_by_application_name(&app(&name))
        .expect("backends");
    assert_eq!(pids.len(), 1, "{pids:?}");
    let pid = pids[0];
    let status = |args: &[&str]| {
        let mut cmd = lease();
        cmd.arg("status")
            .args(["--database-url", &c.conn_string()])
            .args(args);
        let (st, out, err, _) = output(cmd, MS(10_000));
        assert!(st.success(), "{st}: {err}");
        out
    };

    let text = status(&[&name, &other]);
    eprintln!("{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .expect("a row for the lease");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], key_for_name(&name).to_string());
    assert_eq!(cells[2], "holder");
    assert_eq!(cells[3], pid.to_string());
    assert_eq!(cells[4], app(&name));
    assert!(cells[5].starts_with("127.0.0.1:"), "{row}");
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("{other} ")))
        .expect("a row for the other lease");
    assert!(row.split_whitespace().nth(2) == Some("free"), "{row}");

    let json = status(&["--json", &name, &other]);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), 2, "{json}");
    let v = &lines[0];
    assert_eq!(v["name"], name.as_str());
    assert_eq!(v["key"], key_for_name(&name));
    assert_eq!(v["held"], true);
    assert_eq!(v["backend_pid"], pid);
    assert_eq!(v["application_name"], app(&name).as_str());
    assert_eq!(v["client_addr"], "127.0.0.1");
    assert!(v["backend_start"].is_string() && v["state_change"].is_string());
    assert_eq!(v["standbys"], serde_json::json!([]));
    assert_eq!(lines[1]["held"], false);

    // With no name: every held key, named from `lease:NAME`.
    let all = status(&["--json"]);
    assert!(
        all.lines().any(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            v["name"] == name.as_str() && v["backend_pid"] == pid
        }),
        "{all}"
    );
    a.sigterm().expect("SIGTERM");
    assert_eq!(a.wait_exit(MS(5_000)).expect("exit").code(), Some(0));
}

/// `psql -c SQL` on the cluster as `application_name` `app`, in the background.
fn psql(c: &Cluster, app: &str, sql: &str) -> Replica {
    let mut cmd = Command::new(c.psql());
    cmd.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", c.host(), "-p", &c.port().to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-c", sql])
        .env("PGAPPNAME", app);
    Replica::spawn(cmd).expect("spawn psql")
}

/// Backends waiting (not granted) for advisory key `key`, in wait order.
fn waiting(c: &Cluster, key: i64) -> Vec<i32> {
    let out = c
        .sql(&format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND NOT granted AND {} = {key} ORDER BY waitstart",
            lease_proto::server::ADVISORY_KEY_SQL
        ))
        .expect("query pg_locks");
    out.lines().map(|l| l.parse().expect("a pid")).collect()
}

/// Waits until `n` sessions wait for `key`; returns their pids in wait order.
fn wait_waiting(c: &Cluster, key: i64, n: usize) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let pids = waiting(c, key);
        if pids.len() == n {
            return pids;
        }
        assert!(start.elapsed() < MS(10_000), "waiting for {key}: {pids:?}");
        std::thread::sleep(MS(20));
    }
}

/// Sessions waiting on the server for a held lease are listed as its
/// standbys, in queue order, whatever client they are: one waits as the
/// library's standbys do (a shared, transaction-level lock bounded by a
/// statement-local lock_timeout), one is a plain `pg_advisory_lock`. Text,
/// `--json` and `--watch`.
#[test]
fn status_lists_the_standbys_waiting_on_the_server() {
    let c = cluster();
    let name = unique("standbys");
    let key = key_for_name(&name);
    let mut a =
        Replica::spawn(fast_sh(&c, &name, &[], "echo started; exec sleep 1000")).expect("spawn");
    a.wait_for_line(|l| l == "started", MS(10_000))
        .expect("a leads");
    let holder = c
        .backends_by_application_name(&app(&name))
        .expect("backends")[0];
    let waiter_app = app(&name);
    let shared = psql(
        &c,
        &waiter_app,
        &format!(
            "SELECT set_config('lock_timeout', '30000', true); \
             SELECT pg_backend_pid()::int8 FROM (SELECT pg_advisory_xact_lock_shared({key})) w"
        ),
    );
    let first = wait_waiting(&c, key, 1)[0];
    let other_app = "not-a-lease-client";
    let plain = psql(
        &c,
        other_app,
        &format!("SET lock_timeout = '30s'; SELECT pg_advisory_lock({key})"),
    );
    let pids = wait_waiting(&c, key, 2);
    assert_eq!(pids[0], first);
    let second = pids[1];
    let status = |args: &[&str]| {
        let mut cmd = lease();
        cmd.arg("status")
            .args(["--database-url", &c.conn_string()])
            .args(args);
        let (st, out, err, took) = output(cmd, MS(10_000));
        assert!(st.success(), "{st}: {err}");
        eprintln!("lease status {args:?} ({took:?}):\n{out}");
        out
    };

    let text = status(&[&name]);
    let rows: Vec<Vec<&str>> = (text.lines())
        .filter(|l| l.starts_with(&format!("{name} ")))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    let holder_s = holder.to_string();
    let first_s = first.to_string();
    let second_s = second.to_string();
    assert_eq!(rows[0][2..5], ["holder", &holder_s, &waiter_app], "{text}");
    assert_eq!(rows[1][2..5], ["standby", &first_s, &waiter_app], "{text}");
    assert_eq!(rows[2][2..5], ["standby", &second_s, other_app], "{text}");
    for row in &rows[1..] {
        assert!(row[5].starts_with("127.0.0.1:"), "{text}");
        // SINCE (the session's start) and WAIT START, both UTC seconds.
        assert!(row[6].ends_with('Z') && row[7].ends_with('Z'), "{text}");
    }
    assert_eq!(rows[0][7], "-", "a holder waits for nothing: {text}");

    let json = status(&["--json", &name]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("one JSON line");
    assert_eq!(
        (v["held"].clone(), v["backend_pid"].clone()),
        (true.into(), holder.into())
    );
    let standbys = v["standbys"].as_array().expect("a standbys array");
    let got: Vec<(i64, &str, &str)> = standbys
        .iter()
        .map(|s| {
            (
                s["backend_pid"].as_i64().unwrap(),
                s["mode"].as_str().unwrap(),
                s["application_name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (i64::from(first), "ShareLock", waiter_app.as_str()),
            (i64::from(second), "ExclusiveLock", other_app)
        ],
        "{json}"
    );
    for s in standbys {
        assert!(
            s["wait_start"].is_string() && s["backend_start"].is_string(),
            "{s}"
        );
        assert!(
            s["wait_start"].as_str() >= s["backend_start"].as_str(),
            "{s}"
        );
        assert_eq!(s["client_addr"], "127.0.0.1");
    }

    // Every key of the database: this one named from `lease:NAME`, with its standbys.
    let all = status(&["--json"]);
    assert!(
        all.lines().any(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            v["name"] == name.as_str() && v["standbys"].as_array().map(Vec::len) == Some(2)
        }),
        "{all}"
    );

    // --watch: a line per lease, the standbys as a count and pids; SIGINT ends it.
    let mut cmd = lease();
    cmd.args(["status", "--database-url", &c.conn_string()])
        .args(["--watch", "--interval", "100ms", &name]);
    let mut watch = Replica::spawn(cmd).expect("spawn lease status --watch");
    let want = format!("2: {first},{second}");
    let mut frames = 0;
    let (_, line) = watch
        .wait_for_line(
            |l| {
                frames += usize::from(l.starts_with(&format!("{name} ")) && l.ends_with(&want));
                frames >= 2
            },
            MS(10_000),
        )
        .expect("two frames with both standbys");
    eprintln!("lease status --watch: {line}");
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[2..4], ["yes", &holder_s], "{line}");
    assert!(
        line.contains(" before "),
        "held before the watch began: {line}"
    );
    let stop = Instant::now();
    watch.sigint().expect("SIGINT");
    let st = watch.wait_exit(MS(5_000)).expect("exits on SIGINT");
    eprintln!("--watch exited {st} {:?} after SIGINT", stop.elapsed());
    assert_eq!(st.code(), Some(0));

    // The holder leaves: the shared waiter is granted and done, the plain one
    // then holds the key until its session ends.
    a.sigterm().expect("SIGTERM");
    assert_eq!(a.wait_exit(MS(5_000)).expect("exit").code(), Some(0));
    for mut w in [shared, plain] {
        assert_eq!(w.wait_exit(MS(10_000)).expect("psql exits").code(), Some(0));
    }
    assert!(waiting(&c, key).is_empty());
}

#[test]
fn key_matches_the_core() {
    for name in ["sweeper", "billing-reconciler", "ünïcödé/名前"] {
        let mut cmd = lease();
        cmd.args(["key", name]);
        let (status, out, err, _) = output(cmd, MS(5_000));
        assert!(status.success(), "{err}");
        assert_eq!(out.trim(), key_for_name(name).to_string(), "{name}");
    }
}

#[test]
fn the_identity_names_the_replica_and_status_still_names_the_lease() {
    let c = cluster();
    let name = unique("identity");
    let mut a = Replica::spawn(fast_sh(
        &c,
        &name,
        &["--identity", "web-7"],
        "echo started; exec sleep 1000",
    ))
    .expect("spawn");
    let (_, contending) = a
        .wait_for_line(|l| l.contains("contending for the lease"), MS(10_000))
        .expect("the first line");
    assert!(contending.contains("identity=\"web-7\""), "{contending}");
    a.wait_for_line(|l| l == "started", MS(10_000))
        .expect("a leads");
    let mut cmd = lease();
    cmd.arg("status").args(["--database-url", &c.conn_string()]);
    let (st, out, err, _) = output(cmd, MS(10_000));
    assert!(st.success(), "{err}");
    // Every held key, named after its session's application_name.
    let row = out
        .lines()
        .find(|l| l.contains(&format!("lease:{name}@web-7")))
        .unwrap_or_else(|| panic!("no row of the replica: {out}"));
    assert!(
        row.starts_with(&format!("{name} ")),
        "named by its lease: {row}"
    );
    let _ = a.kill9();
    let _ = a.wait_exit(MS(5_000));
}
