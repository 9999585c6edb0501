//! Issue 11, reproduced first: holes 3 and 4 with real `lease run` processes
//! against ephemeral PostgreSQL servers. Each test failed on the code it was
//! written against and is marked `#[ignore]` until fixed (the two hole-3
//! tests pass since the guard-deadline kill and the watchdog); run them with
//! `cargo test -p lease-cli --test holes -- --include-ignored --nocapture`.
//!
//! The commands write wall-clock stamps (`date +%s.%N`) to a file every 50 ms;
//! overlap is the last stamp of the old holder's command minus the first stamp
//! of the new holder's, so a positive overlap means both commands ran at once.
//!
//! These tests live here, not in `tests/tests`, because the `lease` binary's
//! path (`CARGO_BIN_EXE_lease`) is only given to this package's tests.

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lease_proto::{key_for_name, Options};
use lease_tests::{
    pid_alive, Cluster, FaultProxy, Mode, PgBouncer, PgBouncerSettings, PoolMode, Replica, Stream,
};

mod common;
use common::{cluster, lease, unique};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Fast lease intervals for the tests that do not measure a failover.
const FAST: [&str; 6] = [
    "--retry-interval",
    "50ms",
    "--heartbeat-interval",
    "100ms",
    "--query-timeout",
    "1s",
];

/// Short intervals for the failover tests, with the default `--grace` (10 s):
/// validity 700 ms, guard (`idle_session_timeout`) 1 s.
const SHORT: [&str; 8] = [
    "--retry-interval",
    "100ms",
    "--heartbeat-interval",
    "200ms",
    "--query-timeout",
    "500ms",
    "--guard-margin",
    "300ms",
];

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A fresh directory for the stamp files; removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let path = std::env::temp_dir().join(unique(name));
        fs::create_dir(&path).expect("create a temporary directory");
        Dir(path)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `lease run --database-url URL TIMING... NAME -- sh -c SCRIPT`.
fn run_sh(url: &str, timing: &[&str], name: &str, script: &str) -> Command {
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", url])
        .args(timing)
        .arg(name)
        .args(["--", "sh", "-c", script]);
    cmd
}

/// A command that prints `pid=$$ token=$LEASE_TOKEN`, then stamps `file`
/// every 50 ms; with `ignore_term` it (and everything it starts) ignores
/// SIGTERM.
fn stamper(file: &Path, ignore_term: bool) -> String {
    let trap = if ignore_term { r#"trap "" TERM; "# } else { "" };
    format!(
        r#"echo "pid=$$ token=$LEASE_TOKEN"; {trap}while :; do date +%s.%N >> {}; sleep 0.05; done"#,
        file.display()
    )
}

/// The stamps in `file`, in nanoseconds since the epoch.
fn stamps(file: &Path) -> Vec<u128> {
    fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (s, ns) = l.trim().split_once('.')?;
            Some(s.parse::<u128>().ok()? * 1_000_000_000 + ns.parse::<u128>().ok()?)
        })
        .collect()
}

/// Waits until `file` has a stamp; returns the first one.
fn first_stamp(file: &Path, limit: Duration) -> Option<u128> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(&t) = stamps(file).first() {
            return Some(t);
        }
        std::thread::sleep(MS(5));
    }
    None
}

/// Signed milliseconds from `a` to `b` (nanosecond stamps).
fn ms_between(a: u128, b: u128) -> f64 {
    (b as f64 - a as f64) / 1e6
}

/// The value of `key=` in a line of `key=value` words.
fn field(line: &str, key: &str) -> Option<i64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Waits for the `pid=... token=...` line of the command: (pid, token).
fn started(r: &Replica, limit: Duration) -> Result<(i32, i64), String> {
    r.wait_for_line(|l| l.starts_with("pid="), limit)
        .map(|(_, l)| {
            (
                field(&l, "pid").unwrap_or(0) as i32,
                field(&l, "token").unwrap_or(0),
            )
        })
        .map_err(|e| e.to_string())
}

/// Waits until `pid` is gone; whether it went within `limit`.
fn wait_gone(pid: i32, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !pid_alive(pid) {
            return true;
        }
        std::thread::sleep(MS(1));
    }
    false
}

/// Watches `pid` from another thread (1 ms polling): the wall-clock time
/// (nanoseconds) it was first seen gone, `None` if not within `limit`.
fn death_watch(pid: i32, limit: Duration) -> std::thread::JoinHandle<Option<u128>> {
    std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < limit {
            if !pid_alive(pid) {
                return Some(now_nanos());
            }
            std::thread::sleep(MS(1));
        }
        None
    })
}

/// The runner's (and its watchdog's) stderr lines about stopping the command.
fn kill_lines(r: &Replica) -> String {
    r.lines()
        .iter()
        .filter(|l| {
            l.stream == Stream::Stderr
                && ["lease lost", "SIGKILL", "watchdog", "stopped"]
                    .iter()
                    .any(|w| l.text.contains(w))
        })
        .map(|l| l.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn stderr_of(r: &Replica) -> String {
    r.lines()
        .iter()
        .filter(|l| l.stream == Stream::Stderr)
        .map(|l| l.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn last_stderr_line(r: &Replica) -> String {
    r.lines()
        .iter()
        .rev()
        .find(|l| l.stream == Stream::Stderr && !l.text.trim().is_empty())
        .map_or_else(String::new, |l| l.text.clone())
}

/// `exit status: N`, `signal: S`, or `still running` for messages.
fn exit_text(status: Option<ExitStatus>) -> String {
    status.map_or_else(|| "still running".to_owned(), |s| s.to_string())
}

/// Runs `cmd` to completion (at most `limit`): status, stdout, stderr, time.
fn output(cmd: Command, limit: Duration) -> (Option<ExitStatus>, String, String, Duration) {
    let start = Instant::now();
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    let status = r.wait_exit(limit).ok();
    let elapsed = start.elapsed();
    let _ = r.wait_for_line(|_| false, MS(200));
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
    (status, out, err, elapsed)
}

/// Hole 3: a partitioned holder whose command ignores SIGTERM, at the default
/// `--grace` (10 s). The holder reaches the server through a FaultProxy that
/// is black-holed; the standby connects directly. The old command must be
/// dead before the standby's command starts (overlap <= 0): SIGKILL no later
/// than the moment the server could hand the lease over (last statement +
/// `idle_session_timeout`), whatever `--grace` says.
#[test]
fn hole3_partitioned_holder_ignoring_sigterm_is_dead_before_the_standby_starts() {
    let c = cluster();
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], c.port()))).expect("proxy");
    let dir = Dir::new("hole3-partition");
    let (fa, fb) = (dir.file("a"), dir.file("b"));
    let name = unique("hole3-partition");
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let a = Replica::spawn(run_sh(&via_proxy, &SHORT, &name, &stamper(&fa, true))).expect("a");
    let (pid_a, token_a) = started(&a, MS(10_000)).expect("a leads");
    first_stamp(&fa, MS(5_000)).expect("a's command stamps");
    let b = Replica::spawn(run_sh(
        &c.url("postgres"),
        &SHORT,
        &name,
        &stamper(&fb, true),
    ))
    .expect("b");
    b.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("b stands by");

    let cut = now_nanos();
    let death = death_watch(pid_a, MS(15_000));
    proxy.set_mode(Mode::BlackHole);
    let first_b = first_stamp(&fb, MS(10_000)).expect("b takes over");
    let a_alive_at_b_start = pid_alive(pid_a);
    let (_, token_b) = started(&b, MS(1_000)).expect("b's command line");
    // Wait for the old command to go.
    let a_gone = wait_gone(pid_a, MS(15_000));
    let died = death.join().ok().flatten();
    let last_a = stamps(&fa).last().copied().unwrap_or(0);
    let overlap = ms_between(first_b, last_a);
    eprintln!(
        "partition, SIGTERM-ignoring command, default --grace: b's command started {:.0} ms \
         after the cut, a's command last stamped {:.0} ms after the cut and died {} \
         (gone: {a_gone}); overlap {overlap:.0} ms; tokens {token_a} -> {token_b}\n\
         --- a's lines about the kill ---\n{}",
        ms_between(cut, first_b),
        ms_between(cut, last_a),
        died.map_or_else(
            || "never".to_owned(),
            |d| format!(
                "{:.1} ms after the cut, {:.1} ms before b's first stamp",
                ms_between(cut, d),
                ms_between(d, first_b)
            )
        ),
        kill_lines(&a),
    );
    assert!(
        !a_alive_at_b_start && overlap <= 0.0,
        "the partitioned holder's command (pid {pid_a}, ignores SIGTERM) was still running \
         when the standby's command started {:.0} ms after the cut, and both ran together for \
         {overlap:.0} ms (default --grace 10s, guard margin 300ms)\n--- a's stderr ---\n{}",
        ms_between(cut, first_b),
        stderr_of(&a),
    );
}

/// Hole 3: a stalled runner. Only the holder's `lease run` process is stopped
/// (SIGSTOP of the runner, not of its command's process group); the server
/// guard ends its session and the standby takes over. The old command must be
/// dead before the standby's command starts.
#[test]
fn hole3_stalled_runner_leaves_no_command_running() {
    let c = cluster();
    let dir = Dir::new("hole3-stalled");
    let (fa, fb) = (dir.file("a"), dir.file("b"));
    let name = unique("hole3-stalled");
    let url = c.url("postgres");
    let a = Replica::spawn(run_sh(&url, &SHORT, &name, &stamper(&fa, false))).expect("a");
    let (pid_a, _) = started(&a, MS(10_000)).expect("a leads");
    first_stamp(&fa, MS(5_000)).expect("a's command stamps");
    let b = Replica::spawn(run_sh(&url, &SHORT, &name, &stamper(&fb, false))).expect("b");
    b.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("b stands by");

    // The Replica is its own process group; the command has another one.
    let stop = now_nanos();
    let death = death_watch(pid_a, MS(12_000));
    a.sigstop().expect("SIGSTOP the runner");
    let first_b = first_stamp(&fb, MS(10_000)).expect("b takes over");
    let a_alive_at_b_start = pid_alive(pid_a);
    // Watch for 2 s more.
    std::thread::sleep(MS(2_000));
    let a_alive_after = pid_alive(pid_a);
    let died = if a_alive_after {
        None
    } else {
        death.join().ok().flatten()
    };
    let last_a = stamps(&fa).last().copied().unwrap_or(0);
    let overlap = ms_between(first_b, last_a);
    // The runner is stopped: its watchdog's line is all there is yet.
    let _ = a.wait_for_line(|l| l.contains("watchdog:"), MS(500));
    eprintln!(
        "stalled runner: b's command started {:.0} ms after the SIGSTOP; a's command last \
         stamped {:.0} ms after it and died {}, overlap {overlap:.0} ms (watched 2 s; still \
         running: {a_alive_after})\n--- a's lines about the kill ---\n{}",
        ms_between(stop, first_b),
        ms_between(stop, last_a),
        died.map_or_else(
            || "never".to_owned(),
            |d| format!(
                "{:.1} ms after the SIGSTOP, {:.1} ms before b's first stamp",
                ms_between(stop, d),
                ms_between(d, first_b)
            )
        ),
        kill_lines(&a),
    );
    a.sigcont().expect("SIGCONT the runner");
    // Resumed, the runner finds its lease lost and its command dead, and
    // stands by behind b (rather than ending with the command's status).
    let resumed = a.wait_for_line(|l| l.contains("standing by"), MS(10_000));
    eprintln!("--- a's lines after SIGCONT ---\n{}", kill_lines(&a));
    assert!(
        resumed.is_ok(),
        "the resumed runner did not stand by again:\n{}",
        stderr_of(&a)
    );
    assert!(
        !a_alive_at_b_start && overlap <= 0.0,
        "the stalled runner's command (pid {pid_a}) was still running when the standby's \
         command started {:.0} ms after the SIGSTOP, and ran beside it for {overlap:.0} ms of \
         the 2 s watched (still running at the end: {a_alive_after})",
        ms_between(stop, first_b),
    );
}

/// Hole 4: a session-mode PgBouncer (what the docs recommend) must work: the
/// settings go by a statement after connecting when startup options are
/// rejected, are verified, and the run leads.
#[test]
fn hole4_session_mode_pgbouncer_leads() {
    let c = cluster();
    let pgb = PgBouncer::start(&c, PoolMode::Session).expect("start pgbouncer");
    let name = unique("hole4-session");
    let cmd = run_sh(&pgb.url(), &FAST, &name, "echo started");
    let (status, out, err, took) = output(cmd, MS(15_000));
    let status_text = exit_text(status);
    eprintln!("session-mode PgBouncer: lease run: {status_text} after {took:?}");
    assert!(
        status.is_some_and(|s| s.success()) && out.contains("started"),
        "through a session-mode PgBouncer `lease run` ended ({status_text}) after {took:?} \
         without running its command; last stderr line: {}",
        err.lines().last().unwrap_or("")
    );
}

/// Hole 4: a transaction-mode PgBouncer told to ignore `options`, with the
/// guard set by `ALTER ROLE` to exactly the value the lease asks for and one
/// server connection: two `lease run`s through it must never both lead (the
/// machine must see that clients share a backend and refuse).
#[test]
fn hole4_transaction_pgbouncer_ignoring_options_never_gives_two_leaders() {
    // Its own server: the role setting must not leak to other tests.
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let guard = Options {
        retry_interval: MS(50),
        heartbeat_interval: MS(100),
        query_timeout: MS(1_000),
        ..Options::default()
    }
    .guard_timeout()
    .as_millis();
    c.sql(&format!(
        "ALTER ROLE postgres SET idle_session_timeout = {guard}"
    ))
    .expect("ALTER ROLE");
    let settings = PgBouncerSettings {
        pool_size: 1,
        ignore_startup_parameters: vec!["extra_float_digits".into(), "options".into()],
    };
    let pgb = PgBouncer::start_with(&c, PoolMode::Transaction, &settings).expect("pgbouncer");
    let dir = Dir::new("hole4-txn");
    let (fa, fb) = (dir.file("a"), dir.file("b"));
    let name = unique("hole4-txn");
    let a = Replica::spawn(run_sh(&pgb.url(), &FAST, &name, &stamper(&fa, false))).expect("a");
    let b = Replica::spawn(run_sh(&pgb.url(), &FAST, &name, &stamper(&fb, false))).expect("b");
    let ra = started(&a, MS(8_000));
    let rb = started(&b, MS(5_000));
    // Watch for 2 s: a fixed runner may find out at its next heartbeat.
    let watch = MS(2_000);
    std::thread::sleep(watch);
    let holders: Vec<i32> = c
        .held_advisory_keys()
        .expect("pg_locks")
        .into_iter()
        .filter(|&(k, _)| k == key_for_name(&name))
        .map(|(_, pid)| pid)
        .collect();
    let (sa, sb) = (stamps(&fa), stamps(&fb));
    let overlap = match (sa.first(), sa.last(), sb.first(), sb.last()) {
        (Some(&a0), Some(&a1), Some(&b0), Some(&b1)) => ms_between(a0.max(b0), a1.min(b1)),
        _ => 0.0,
    };
    eprintln!(
        "transaction-mode PgBouncer (options ignored, ALTER ROLE idle_session_timeout = \
         {guard}, pool size 1): a {ra:?}, b {rb:?}, both commands ran together {overlap:.0} ms \
         (watched {watch:?}); backends holding the key: {holders:?}"
    );
    assert!(
        overlap <= 0.0,
        "two leaders through a transaction-mode PgBouncer: a (pid, token) {ra:?}, b {rb:?}; \
         their commands ran together for {overlap:.0} ms of the {watch:?} watched; backends \
         holding the key in pg_locks: {holders:?} (one server connection)\n--- a's stderr ---\n{}\n--- b's \
         stderr ---\n{}",
        stderr_of(&a),
        stderr_of(&b),
    );
}

/// Hole 4: a hot standby reached first (a routine HA failover) is retryable:
/// the runner keeps retrying with backoff and leads once the server is
/// promoted, instead of exiting 1 for good.
#[test]
fn hole4_hot_standby_is_retried_until_promoted() {
    let c = cluster();
    let standby = c.start_standby().expect("start a hot standby");
    let name = unique("hole4-standby");
    let spawned = Instant::now();
    let mut r = Replica::spawn(run_sh(
        &standby.url("postgres"),
        &FAST,
        &name,
        "echo started",
    ))
    .expect("spawn");
    std::thread::sleep(MS(1_000));
    let alive_at_promotion = r.is_alive();
    let promoted = spawned.elapsed();
    standby.sql("SELECT pg_promote()").expect("promote");
    let led = r.wait_for_line(|l| l == "started", MS(10_000));
    let status = exit_text(r.wait_exit(MS(0)).ok());
    let last_output = r.lines().last().map(|l| l.at.duration_since(spawned));
    eprintln!(
        "hot standby promoted at {promoted:?}: alive at promotion {alive_at_promotion}, led: \
         {}, {status} (last output at {last_output:?})",
        led.is_ok()
    );
    assert!(
        led.is_ok(),
        "`lease run` against a hot standby promoted {promoted:?} after its start never led: \
         alive at the promotion: {alive_at_promotion}, {status}, last output \
         {last_output:?} after its start; last stderr line: {}",
        last_stderr_line(&r),
    );
}

/// Hole 4: absurd settings are bad usage: exit 2 with one clear line before
/// any connection to the database.
#[test]
fn hole4_absurd_intervals_are_a_usage_error() {
    // A listener that records any connection: none may arrive.
    let db = TcpListener::bind("127.0.0.1:0").expect("bind");
    db.set_nonblocking(true).expect("nonblocking");
    let port = db.local_addr().expect("addr").port();
    let mut cmd = lease();
    cmd.env("DATABASE_URL", format!("postgres://u@127.0.0.1:{port}/x"))
        .args([
            "run",
            "--heartbeat-interval",
            "1h",
            "--query-timeout",
            "1ms",
        ])
        .args([&unique("absurd"), "--", "true"]);
    let (status, _, err, took) = output(cmd, MS(3_000));
    let mut connections = 0;
    while db.accept().is_ok() {
        connections += 1;
    }
    let status_text = exit_text(status);
    eprintln!(
        "--heartbeat-interval 1h --query-timeout 1ms: {status_text} after {took:?}, \
         {connections} connection(s) to the database; stderr:\n{err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        status.and_then(|s| s.code()) == Some(2)
            && connections == 0
            && lines.len() == 1
            && lines[0].starts_with("lease: error: "),
        "`lease run --heartbeat-interval 1h --query-timeout 1ms` was accepted: {status_text} \
         after {took:?}, {connections} connection attempt(s) to the database; first stderr \
         lines: {:?}",
        &lines[..lines.len().min(3)]
    );
}

/// Issue 18 hole 7: a lone `lease run` through a transaction-mode PgBouncer with its
/// default settings (it rejects `options`; the settings go by statement and the setup
/// passes; nobody shares its backend) must not run its command: it exits 1, its last
/// line naming the transaction pooler. Before the fix it led and ran the command.
#[test]
fn hole7_lone_lease_run_through_transaction_pgbouncer_is_refused() {
    let c = cluster();
    let pgb = PgBouncer::start(&c, PoolMode::Transaction).expect("start pgbouncer");
    let name = unique("hole7-lone");
    let cmd = run_sh(&pgb.url(), &FAST, &name, "echo started");
    let (status, out, err, took) = output(cmd, MS(15_000));
    let status_text = exit_text(status);
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("ERROR")).collect();
    eprintln!(
        "a lone lease run through a transaction-mode PgBouncer: {status_text} after {took:?}; \
         stdout {out:?}; error lines: {errors:?}"
    );
    assert!(
        status.and_then(|s| s.code()) == Some(1)
            && !out.contains("started")
            && errors
                .last()
                .is_some_and(|l| l.contains("transaction-mode pooler")),
        "through a transaction-mode PgBouncer a lone `lease run` ended ({status_text}) after \
         {took:?}, stdout {out:?}, error lines {errors:?}; stderr:\n{err}"
    );
}
