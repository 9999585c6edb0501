//! Process-level tests of the `lease` binary against ephemeral PostgreSQL
//! servers (the workspace's test kit). Measured figures are printed with
//! `eprintln!` (see them with `cargo test -p lease-cli -- --nocapture`).

use std::io::ErrorKind;
use std::net::TcpListener;
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use lease_proto::key_for_name;
use lease_tests::{pid_alive, Cluster, Replica, Stream};

mod common;
use common::{cluster, lease, unique};

const MS: fn(u64) -> Duration = Duration::from_millis;
/// Fast lease intervals for the tests.
const FAST: [&str; 8] = [
    "--retry-interval",
    "50ms",
    "--heartbeat-interval",
    "100ms",
    "--query-timeout",
    "1s",
    "--grace",
    "300ms",
];

/// `lease run --database-url <cluster> FAST... extra... NAME -- sh -c SCRIPT`.
fn run_sh(c: &Cluster, name: &str, extra: &[&str], script: &str) -> Command {
    let mut cmd = lease();
    // FAST, less the options that `extra` sets.
    let fast = FAST
        .chunks(2)
        .filter(|kv| !extra.contains(&kv[0]))
        .flatten();
    cmd.arg("run")
        .args(["--database-url", &c.url("postgres")])
        .args(fast)
        .args(extra)
        .arg(name)
        .args(["--", "sh", "-c", script]);
    cmd
}

/// Runs `cmd` to completion (at most `limit`): status, stdout, stderr, time.
fn output(cmd: Command, limit: Duration) -> (ExitStatus, String, String, Duration) {
    let start = Instant::now();
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    let status = r.wait_exit(limit).expect("lease exits");
    let elapsed = start.elapsed();
    // The output pipes close right after the exit; give the readers a moment.
    let _ = r.wait_for_line(|_| false, MS(200));
    let (out, err) = texts(&r);
    (status, out, err, elapsed)
}

fn texts(r: &Replica) -> (String, String) {
    let mut out = String::new();
    let mut err = String::new();
    for l in r.lines() {
        let s = if l.stream == Stream::Stdout {
            &mut out
        } else {
            &mut err
        };
        s.push_str(&l.text);
        s.push('\n');
    }
    (out, err)
}

/// The value of `key=` in a line of `key=value` words.
fn field(line: &str, key: &str) -> Option<i64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Waits until `pid` is gone; returns when that was seen.
fn wait_gone(pid: i32, limit: Duration) -> Option<Instant> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !pid_alive(pid) {
            return Some(Instant::now());
        }
        std::thread::sleep(MS(1));
    }
    None
}

fn held(c: &Cluster, key: i64) -> bool {
    c.held_advisory_keys()
        .expect("query pg_locks")
        .iter()
        .any(|&(k, _)| k == key)
}

#[test]
fn child_sees_lease_name_key_and_token() {
    let c = cluster();
    let name = unique("env");
    let script = r#"echo "name=$LEASE_NAME key=$LEASE_KEY token=$LEASE_TOKEN""#;
    let (status, out, err, _) = output(run_sh(&c, &name, &["--quiet"], script), MS(10_000));
    assert!(status.success(), "{status}: {err}");
    let line = out.lines().next().expect("the child printed");
    assert!(line.starts_with(&format!("name={name} ")), "{line}");
    assert_eq!(field(line, "key"), Some(key_for_name(&name)), "{line}");
    assert!(field(line, "token").is_some_and(|t| t > 0), "{line}");
    assert!(err.trim().is_empty(), "--quiet printed: {err}");
    assert!(!held(&c, key_for_name(&name)), "the lease was not released");
}

#[test]
fn exit_status_passes_through() {
    let c = cluster();
    let name = unique("exit");
    for (script, want) in [
        ("exit 0", 0),
        ("exit 7", 7),
        ("kill -TERM $$", 128 + 15),
        ("kill -KILL $$", 128 + 9),
    ] {
        let (status, _, err, took) = output(run_sh(&c, &name, &[], script), MS(10_000));
        eprintln!("`{script}`: lease exited with {status} after {took:?}");
        assert_eq!(status.code(), Some(want), "`{script}`: {err}");
        assert!(!held(&c, key_for_name(&name)), "`{script}`: not released");
    }
}

#[test]
fn leftovers_of_the_command_are_stopped_before_the_release() {
    let c = cluster();
    let name = unique("leftover");
    let script = "sleep 1000 & echo grandchild=$!; exit 0";
    let (status, out, err, took) = output(run_sh(&c, &name, &[], script), MS(10_000));
    assert!(status.success(), "{status}: {err}");
    let grandchild = field(&out, "grandchild").expect("pid") as i32;
    assert!(
        wait_gone(grandchild, MS(1_000)).is_some(),
        "{grandchild} outlived the lease"
    );
    eprintln!("command exited leaving a process behind: lease exited 0 after {took:?}, the process stopped");
}

#[test]
fn lost_lease_stops_the_whole_group_then_starts_a_fresh_child() {
    let c = cluster();
    let name = unique("group");
    // The child dies on SIGTERM; the grandchild ignores it (SIGKILL after grace).
    let script = r#"(trap "" TERM; exec sleep 1000) & echo "child=$$ grandchild=$! token=$LEASE_TOKEN"; wait"#;
    let r = Replica::spawn(run_sh(&c, &name, &[], script)).expect("spawn");
    let pids = |nth: usize| {
        let mut seen = 0;
        let (_, line) = r
            .wait_for_line(
                |l| {
                    l.starts_with("child=") && {
                        seen += 1;
                        seen == nth
                    }
                },
                MS(10_000),
            )
            .expect("the child started");
        let pid = |k| field(&line, k).and_then(|p| i32::try_from(p).ok());
        (
            pid("child").expect("child pid"),
            pid("grandchild").expect("grandchild pid"),
            field(&line, "token").expect("token"),
        )
    };
    let (child, grandchild, token) = pids(1);
    assert!(pid_alive(child) && pid_alive(grandchild));

    // Watch both pids from before the termination.
    let watch = |pid: i32| std::thread::spawn(move || wait_gone(pid, MS(10_000)));
    let (child_watch, grandchild_watch) = (watch(child), watch(grandchild));
    let start = Instant::now();
    let app = format!("lease:{name}");
    assert_eq!(c.terminate_by_application_name(&app).expect("terminate"), 1);
    let child_gone = child_watch.join().ok().flatten().expect("the child died");
    let grandchild_gone = grandchild_watch.join().ok().flatten();
    let grandchild_gone = grandchild_gone.expect("the grandchild died");
    let (lost, _) = r
        .wait_for_line(|l| l.contains("lease lost"), MS(1_000))
        .expect("the runner says it lost the lease");
    eprintln!(
        "pg_terminate_backend of the runner's session: the runner logged the loss {:?} after \
         the psql call started; child gone {:?} after that line arrived, grandchild (ignores \
         SIGTERM; grace 300ms) {:?} after",
        lost.saturating_duration_since(start),
        child_gone.saturating_duration_since(lost),
        grandchild_gone.saturating_duration_since(lost),
    );
    assert!(grandchild_gone.saturating_duration_since(lost) < MS(2_000));

    // The runner contends again and starts a fresh child with a larger token.
    let (child2, grandchild2, token2) = pids(2);
    assert!(token2 > token, "{token2} <= {token}");
    assert_ne!(child2, child);
    eprintln!(
        "fresh child after {:?} (token {token} -> {token2})",
        start.elapsed()
    );
    let mut r = r;
    r.sigterm().expect("SIGTERM the runner");
    let status = r.wait_exit(MS(5_000)).expect("the runner exits");
    assert_eq!(status.code(), Some(0));
    assert!(wait_gone(child2, MS(2_000)).is_some());
    assert!(wait_gone(grandchild2, MS(2_000)).is_some());
    assert!(!held(&c, key_for_name(&name)));
}

#[test]
fn runner_killed_with_sigkill_takes_its_child_along() {
    let c = cluster();
    let name = unique("pdeath");
    let mut r =
        Replica::spawn(run_sh(&c, &name, &[], "echo child=$$; exec sleep 1000")).expect("spawn");
    let (_, line) = r
        .wait_for_line(|l| l.starts_with("child="), MS(10_000))
        .expect("the child started");
    let child = field(&line, "child").expect("child pid") as i32;
    assert!(pid_alive(child));
    // SIGKILL reaches the runner only: the child has its own process group.
    let start = Instant::now();
    r.kill9().expect("SIGKILL the runner");
    let gone = wait_gone(child, MS(5_000)).expect("the child died with its runner") - start;
    eprintln!("kill -9 of the runner: its child was gone {gone:?} later (PR_SET_PDEATHSIG)");
    let _ = r.wait_exit(MS(5_000));
    assert!(gone < MS(1_000), "{gone:?}");
}

#[test]
fn runner_killed_with_sigkill_takes_the_whole_group_along() {
    let c = cluster();
    let name = unique("pdeath-group");
    let script = "sleep 1000 & echo grandchild=$!; wait";
    let mut r = Replica::spawn(run_sh(&c, &name, &[], script)).expect("spawn");
    let (_, line) = r
        .wait_for_line(|l| l.starts_with("grandchild="), MS(10_000))
        .expect("the command started");
    let grandchild = field(&line, "grandchild").expect("pid") as i32;
    let (_, line) = r
        .wait_for_line(|l| l.contains("leading: started"), MS(1_000))
        .expect("the leading line");
    let watchdog = field(&line, "watchdog").expect("watchdog pid") as i32;
    assert!(pid_alive(grandchild) && pid_alive(watchdog));
    let start = Instant::now();
    r.kill9().expect("SIGKILL the runner");
    let gone = wait_gone(grandchild, MS(5_000)).expect("the grandchild died with its runner");
    let dog_gone = wait_gone(watchdog, MS(5_000)).expect("the watchdog exited");
    eprintln!(
        "kill -9 of the runner: its command's grandchild was gone {:?} later, the watchdog {:?}",
        gone - start,
        dog_gone - start
    );
    let _ = r.wait_exit(MS(5_000));
    assert!(gone - start < MS(1_000), "{:?}", gone - start);
}

#[test]
fn a_grace_longer_than_the_guard_margin_is_announced() {
    let c = cluster();
    let (status, _, err, _) = output(
        run_sh(&c, &unique("grace-warning"), &["--grace", "10s"], "true"),
        MS(10_000),
    );
    assert_eq!(status.code(), Some(0), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("--grace")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains(
            "--grace 10s is longer than the guard margin less the drift allowance (343ms): \
             after a lost lease the command is killed at the guard deadline"
        ),
        "{}",
        warnings[0]
    );
    // FAST's --grace 300ms is within the margin: no warning.
    let (status, _, err, _) = output(run_sh(&c, &unique("no-warning"), &[], "true"), MS(10_000));
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("--grace"), "{err}");
    // Without the server guard: what bounds the command instead.
    let (status, _, err, _) = output(
        run_sh(&c, &unique("no-guard"), &["--no-server-guard"], "true"),
        MS(10_000),
    );
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("--no-server-guard: ")
            && err.contains("gets SIGKILL --grace 300ms after SIGTERM"),
        "{err}"
    );
}

/// The child of a handover test: prints `start TOKEN`, on SIGTERM `stop`.
const ANNOUNCE: &str = r#"echo "start token=$LEASE_TOKEN"; trap "echo stop; exit 0" TERM; while :; do sleep 0.02; done"#;

#[test]
fn sigterm_while_leading_hands_over_to_the_standby_at_once() {
    let c = cluster();
    let name = unique("handover");
    let mut a = Replica::spawn(run_sh(&c, &name, &[], ANNOUNCE)).expect("spawn a");
    let (_, line) = a
        .wait_for_line(|l| l.starts_with("start"), MS(10_000))
        .expect("a leads");
    let token_a = field(&line, "token").expect("token");
    // B polls only every 5 s: a takeover within tens of ms is the handover
    // notification, not polling.
    let b =
        Replica::spawn(run_sh(&c, &name, &["--retry-interval", "5s"], ANNOUNCE)).expect("spawn b");
    b.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("b stands by");
    let (_, held_by) = b
        .wait_for_line(|l| l.contains("the lease is held by"), MS(5_000))
        .expect("b says who holds the lease");
    assert!(held_by.contains(&format!("lease:{name}")), "{held_by}");

    let signalled = Instant::now();
    a.sigterm().expect("SIGTERM a");
    let (started, line) = b
        .wait_for_line(|l| l.starts_with("start"), MS(10_000))
        .expect("b takes over");
    let (stopped, _) = a
        .wait_for_line(|l| l == "stop", MS(1_000))
        .expect("a's child got SIGTERM");
    let status = a.wait_exit(MS(5_000)).expect("a exits");
    let token_b = field(&line, "token").expect("token");
    let handover = started.saturating_duration_since(signalled);
    let gap = started.saturating_duration_since(stopped);
    eprintln!(
        "SIGTERM handover: standby's child started {handover:?} after the signal, {gap:?} after \
         the old child stopped (token {token_a} -> {token_b})"
    );
    assert_eq!(status.code(), Some(0));
    assert!(token_b > token_a);
    assert!(handover < MS(1_000), "{handover:?}");
}

#[test]
fn sigterm_while_standing_by_exits_at_once() {
    let c = cluster();
    let name = unique("standby");
    let a = Replica::spawn(run_sh(&c, &name, &[], ANNOUNCE)).expect("spawn a");
    a.wait_for_line(|l| l.starts_with("start"), MS(10_000))
        .expect("a leads");
    let mut b = Replica::spawn(run_sh(&c, &name, &[], ANNOUNCE)).expect("spawn b");
    b.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("b stands by");
    let start = Instant::now();
    b.sigterm().expect("SIGTERM b");
    let status = b.wait_exit(MS(2_000)).expect("b exits");
    let took = start.elapsed();
    eprintln!("SIGTERM while standing by: exited {status} after {took:?}");
    assert_eq!(status.code(), Some(0));
    assert!(took < MS(1_000), "{took:?}");
    let (out, _) = texts(&b);
    assert!(!out.contains("start"), "b ran its command: {out}");
    drop(a);
}

/// What is wrong, the arguments, and an environment variable to set.
type UsageCase<'a> = (&'a str, Vec<&'a str>, Option<(&'a str, &'a str)>);

#[test]
fn usage_errors_exit_2_on_one_line_without_touching_the_database() {
    // A listener that records any connection: none may arrive.
    let db = TcpListener::bind("127.0.0.1:0").expect("bind");
    db.set_nonblocking(true).expect("nonblocking");
    let port = db.local_addr().expect("addr").port();
    let url = format!("postgres://u:pw@127.0.0.1:{port}/x");
    let cases: Vec<UsageCase> = vec![
        ("empty name", vec!["run", "", "--", "true"], None),
        ("blank name", vec!["run", "  ", "--", "true"], None),
        ("missing --", vec!["run", "job", "true"], None),
        ("missing COMMAND", vec!["run", "job", "--"], None),
        ("missing NAME", vec!["run", "--", "true"], None),
        (
            "bad duration",
            vec!["run", "--grace", "5parsecs", "job", "--", "true"],
            None,
        ),
        (
            "zero interval",
            vec!["run", "--retry-interval", "0s", "job", "--", "true"],
            None,
        ),
        (
            "interval over a day",
            vec!["run", "--heartbeat-interval", "2days", "job", "--", "true"],
            None,
        ),
        (
            "unknown option",
            vec!["run", "--bogus", "job", "--", "true"],
            None,
        ),
        (
            "bad connection string",
            vec![
                "run",
                "--database-url",
                "host=x port=zz",
                "job",
                "--",
                "true",
            ],
            None,
        ),
        (
            "unknown connection option",
            vec![
                "run",
                "--database-url",
                "host=x frob=1",
                "job",
                "--",
                "true",
            ],
            None,
        ),
        (
            "verify-full without root certificates",
            vec!["run", "job", "--", "true"],
            Some(("PGSSLMODE", "verify-full")),
        ),
        (
            "a missing sslrootcert file",
            vec!["run", "job", "--", "true"],
            Some(("PGSSLROOTCERT", "/nonexistent/ca.pem")),
        ),
        (
            "an invalid sslmode",
            vec!["run", "job", "--", "true"],
            Some(("PGSSLMODE", "verify_full")),
        ),
        ("status: empty name", vec!["status", ""], None),
        ("key: empty name", vec!["key", ""], None),
        ("no subcommand", vec!["frobnicate"], None),
    ];
    let all = Instant::now();
    for (what, args, env) in cases {
        let mut cmd = lease();
        cmd.args(&args);
        if !args.iter().any(|a| a.starts_with("--database-url")) && args[0] != "key" {
            cmd.env("DATABASE_URL", &url);
        }
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let (status, out, err, took) = output(cmd, MS(5_000));
        assert_eq!(status.code(), Some(2), "{what}: {status}\n{err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{what}: not one line:\n{err}");
        assert!(
            lines[0].starts_with("lease: error: "),
            "{what}: {}",
            lines[0]
        );
        assert!(out.is_empty(), "{what}: stdout {out}");
        assert!(took < MS(2_000), "{what}: took {took:?}");
        eprintln!("{what}: {} ({took:?})", lines[0]);
    }
    match db.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("something connected to the database: {other:?}"),
    }
    eprintln!("all usage errors in {:?}", all.elapsed());
}

#[test]
fn password_is_never_printed() {
    let closed = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let url = format!("postgres://u:SECRETPW@127.0.0.1:{port}/x");
    let kv = format!("host=127.0.0.1 port={port} password=SECRETPW frob=1");

    // Bad usage, in both string forms.
    for args in [
        vec![
            "run",
            "--database-url",
            &url,
            "--bogus",
            "job",
            "--",
            "true",
        ],
        vec!["run", "--database-url", &kv, "job", "--", "true"],
        vec!["run", "--database-url", &url, "", "--", "true"],
    ] {
        let mut cmd = lease();
        cmd.args(&args);
        let (status, out, err, _) = output(cmd, MS(5_000));
        assert_eq!(status.code(), Some(2), "{args:?}: {err}");
        assert!(!(out + &err).contains("SECRETPW"), "{args:?}: {err}");
    }

    // An unreachable server: retried (not fatal) and said so, in text and
    // JSON; SIGTERM while standing by exits at once.
    for format in ["text", "json"] {
        let mut cmd = lease();
        cmd.args(["run", "--database-url", &url, "--log-format", format])
            .args(FAST)
            .args(["job", "--", "true"]);
        let mut r = Replica::spawn(cmd).expect("spawn");
        r.wait_for_line(|l| l.contains("still retrying"), MS(5_000))
            .expect("says it keeps retrying");
        std::thread::sleep(MS(300));
        assert!(r.is_alive(), "an unreachable server was fatal");
        let start = Instant::now();
        r.sigterm().expect("SIGTERM");
        let status = r.wait_exit(MS(2_000)).expect("exits");
        eprintln!(
            "unreachable server ({format}): SIGTERM -> exit {status} after {:?}",
            start.elapsed()
        );
        assert_eq!(status.code(), Some(0));
        let (out, err) = texts(&r);
        assert!(!(out + &err).contains("SECRETPW"), "{err}");
        if format == "json" {
            for line in err.lines() {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            }
        }
    }

    // `lease status` against it: exit 1, no password.
    let mut cmd = lease();
    cmd.args(["status", "--timeout", "1s", "--database-url", &url]);
    let (status, out, err, _) = output(cmd, MS(5_000));
    assert_eq!(status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!(out + &err).contains("SECRETPW"), "{err}");
}

#[test]
fn status_shows_the_holder() {
    let c = cluster();
    let name = unique("status");
    let other = unique("nobody");
    let mut a =
        Replica::spawn(run_sh(&c, &name, &[], "echo started; exec sleep 1000")).expect("spawn");
    a.wait_for_line(|l| l == "started", MS(10_000))
        .expect("a leads");
    let pids = c
        .backends_by_application_name(&format!("lease:{name}"))
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
    assert_eq!(cells[4], format!("lease:{name}"));
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
    assert_eq!(v["pid"], pid);
    assert_eq!(v["application_name"], format!("lease:{name}").as_str());
    assert_eq!(v["client_addr"], "127.0.0.1");
    assert!(v["backend_start"].is_string() && v["state_change"].is_string());
    assert_eq!(v["standbys"], serde_json::json!([]));
    assert_eq!(lines[1]["held"], false);

    // With no name: every held key, named from `lease:NAME`.
    let all = status(&["--json"]);
    assert!(
        all.lines().any(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            v["name"] == name.as_str() && v["pid"] == pid
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
            lease_proto::ADVISORY_KEY_SQL
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
        Replica::spawn(run_sh(&c, &name, &[], "echo started; exec sleep 1000")).expect("spawn");
    a.wait_for_line(|l| l == "started", MS(10_000))
        .expect("a leads");
    let holder = c
        .backends_by_application_name(&format!("lease:{name}"))
        .expect("backends")[0];
    let waiter_app = format!("lease:{name}");
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
        (v["held"].clone(), v["pid"].clone()),
        (true.into(), holder.into())
    );
    let standbys = v["standbys"].as_array().expect("a standbys array");
    let got: Vec<(i64, &str, &str)> = standbys
        .iter()
        .map(|s| {
            (
                s["pid"].as_i64().unwrap(),
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

/// A hot standby of the shared server, shared like it.
fn standby() -> Arc<(Arc<Cluster>, Cluster)> {
    static SHARED: Mutex<Weak<(Arc<Cluster>, Cluster)>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = shared.upgrade() {
        return s;
    }
    let c = cluster();
    let standby = c.start_standby().expect("start a hot standby");
    let s = Arc::new((c, standby));
    *shared = Arc::downgrade(&s);
    s
}

#[test]
fn a_hot_standby_is_logged_and_retried() {
    let pair = standby();
    let standby = &pair.1;
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", &standby.conn_string()])
        .args(FAST)
        .args([&unique("standby"), "--", "echo", "ran"]);
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    r.wait_for_line(|l| l.contains("hot standby"), MS(10_000))
        .expect("a hot-standby error line");
    // Backoff and retry: still running, the command never started.
    std::thread::sleep(MS(1_000));
    assert!(r.is_alive(), "lease run exited: {:?}", texts(&r));
    let (out, err) = texts(&r);
    assert!(out.is_empty(), "the command ran: {out}");
    let tries = err.lines().filter(|l| l.contains("hot standby")).count();
    assert!(tries >= 2, "retried {tries} time(s): {err}");
    r.kill9().expect("kill lease");
}

/// Several hosts and no `target_session_attrs`: read-write sessions only (not
/// libpq's `any`), so a standby listed first is skipped for the primary after
/// it; an explicit `any` wins and stays on the standby (retried, never leads).
#[test]
fn several_hosts_default_to_read_write_and_an_explicit_value_wins() {
    let pair = standby();
    let (primary, standby) = (&pair.0, &pair.1);
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        standby.port(),
        primary.port()
    );
    let name = unique("several-hosts");
    let script = r#"echo "start token=$LEASE_TOKEN"; exec sleep 1000"#;
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", &url])
        .args(FAST)
        .args([&name, "--", "sh", "-c", script]);
    let started = Instant::now();
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    let (_, line) = r
        .wait_for_line(|l| l.contains("contending for the lease"), MS(10_000))
        .expect("the connection line");
    assert!(
        line.contains("read-write sessions only (the default with several hosts)"),
        "{line}"
    );
    r.wait_for_line(|l| l.starts_with("start"), MS(10_000))
        .unwrap_or_else(|e| panic!("the primary down the list leads: {e}\n{:?}", texts(&r)));
    let led = started.elapsed();
    assert!(
        held(primary, key_for_name(&name)),
        "not held on the primary"
    );
    let (_, err) = texts(&r);
    assert!(!err.contains("hot standby"), "{err}");
    r.sigterm().expect("SIGTERM");
    assert_eq!(r.wait_exit(MS(5_000)).expect("exits").code(), Some(0));

    // An explicit `any` (the string's keyword, or the variable) wins: the
    // standby first in the list is taken, logged and retried.
    for (url, var) in [
        (format!("{url} target_session_attrs=any"), None),
        (url.clone(), Some(("PGTARGETSESSIONATTRS", "any"))),
    ] {
        let mut cmd = lease();
        cmd.arg("run")
            .args(["--database-url", &url])
            .args(FAST)
            .args([&unique("several-any"), "--", "echo", "ran"]);
        if let Some((k, v)) = var {
            cmd.env(k, v);
        }
        let mut r = Replica::spawn(cmd).expect("spawn lease");
        let (_, line) = r
            .wait_for_line(|l| l.contains("contending for the lease"), MS(10_000))
            .expect("the connection line");
        assert!(!line.contains("read-write"), "{line}");
        r.wait_for_line(|l| l.contains("hot standby"), MS(10_000))
            .unwrap_or_else(|e| panic!("{var:?}: on the standby: {e}\n{:?}", texts(&r)));
        assert!(r.is_alive(), "{:?}", texts(&r));
        let (out, _) = texts(&r);
        assert!(
            out.is_empty(),
            "the command ran on a standby session: {out}"
        );
        r.kill9().expect("kill lease");
    }
    eprintln!(
        "several hosts (standby first, primary second): led on the primary {led:?} after the start"
    );
}

/// Issue 18 hole 11 for `lease status` (its own connection, not the lease driver's): with
/// `host=A,B`, A frozen (SIGSTOP of its postmaster and children: TCP connects, nothing
/// answers) and B its promoted standby, the status comes from B within `--timeout`:
/// each host gets its share. Before the fix the whole `--timeout` went to A.
#[test]
fn status_moves_on_from_a_frozen_first_host() {
    let a = Cluster::start().expect("primary A");
    let b = a.start_standby().expect("hot standby B");
    b.promote().expect("promote B");
    let frozen = a.freeze().expect("freeze A");
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        a.port(),
        b.port()
    );
    let mut cmd = lease();
    cmd.args(["status", "--database-url", &url, "--timeout", "4s"])
        .arg(unique("frozen-first"));
    let (st, out, err, took) = output(cmd, MS(20_000));
    eprintln!("lease status, first host frozen: {st} after {took:?}\n{out}{err}");
    drop(frozen);
    assert!(
        st.success() && out.contains("free"),
        "lease status did not answer from the second host: {st} after {took:?}: {err}"
    );
}

/// Issue 18 hole 11 with `lease run`, as it was reported: `host=A,B` (read-write by
/// default with several hosts), B promoted, A frozen. The runner must lead on B: A
/// costs one share of the attempt (here `--query-timeout 2s` over two hosts). Before
/// the fix every attempt timed out on A ("connection attempt timed out after 2000 ms")
/// and nobody led.
#[test]
fn run_leads_on_the_next_host_when_the_first_is_frozen() {
    let a = Cluster::start().expect("primary A");
    let b = a.start_standby().expect("hot standby B");
    b.promote().expect("promote B");
    let frozen = a.freeze().expect("freeze A");
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        a.port(),
        b.port()
    );
    let mut cmd = lease();
    cmd.args(["run", "--database-url", &url, "--query-timeout", "2s"])
        .args(["--retry-interval", "100ms", "--heartbeat-interval", "200ms"])
        .arg(unique("frozen-first"))
        .args(["--", "sh", "-c", "echo started"]);
    let (st, out, err, took) = output(cmd, MS(20_000));
    eprintln!("lease run, first host frozen: {st} after {took:?}");
    drop(frozen);
    assert!(
        st.success() && out.contains("started"),
        "lease run did not lead on the second host: {st} after {took:?}:\n{err}"
    );
}
