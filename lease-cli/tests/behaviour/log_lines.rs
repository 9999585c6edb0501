//! What `lease run` and `lease status` say: which process a PID names, how often an unreachable server is
//! reported, and that the default options start without a warning.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;

use lease_tests::{pid_alive, Replica, Stream};

use crate::common::{cluster, lease, unique, MS};

/// `key=VALUE` of a log line (text format), as a number.
fn field(line: &str, key: &str) -> Option<i64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Every stderr line of a replica.
fn stderr_of(r: &Replica) -> Vec<String> {
    (r.lines().into_iter())
        .filter(|l| l.stream == Stream::Stderr)
        .map(|l| l.text)
        .collect()
}

/// A loopback address with a port free right now (nothing listens there
/// once the listener is dropped).
fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("its address")
}

/// One `GET path` over plain TCP: the body.
fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, MS(500)).ok()?;
    s.set_read_timeout(Some(MS(2_000))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    Some(response.split_once("\r\n\r\n")?.1.to_owned())
}

/// Runs `cmd` to its end: (exit code, stdout).
fn stdout_of(mut cmd: Command) -> (Option<i32>, String) {
    let out = cmd.output().expect("run lease");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The runner's log names the command by `command_pid` (the OS process a
/// newcomer would signal) and its session by `backend_pid`; `lease status`
/// (text and JSON) and `/healthz` use the same word for the server's
/// backend, so no number is shown under a bare "pid".
#[test]
fn the_command_and_the_backend_have_one_labelled_pid_each() {
    let c = cluster();
    let name = unique("pids");
    let addr = free_addr();
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", &c.url("postgres")])
        .args(["--metrics-addr", &addr.to_string()])
        .arg(&name)
        .args(["--", "sh", "-c", "echo \"own=$$\"; exec sleep 1000"]);
    let r = Replica::spawn(cmd).expect("spawn lease run");
    let (_, own) = r
        .wait_for_line(|l| l.starts_with("own="), MS(10_000))
        .expect("the command started");
    let own = field(&own, "own").expect("the command's pid");
    let (_, started) = r
        .wait_for_line(|l| l.contains("leading: started"), MS(2_000))
        .expect("the runner says it started the command");
    let (_, ready) = r
        .wait_for_line(|l| l.contains("lease session ready"), MS(2_000))
        .expect("the runner says its session is ready");
    assert_eq!(field(&started, "command_pid"), Some(own), "{started}");
    assert!(
        field(&started, "pid").is_none(),
        "an unlabelled pid: {started}"
    );
    let backend = field(&ready, "backend_pid").expect("the session's backend pid");
    assert_ne!(backend, own);
    assert!(pid_alive(own as i32));

    // `lease status`, text: the column says whose pid it is.
    let mut status = lease();
    status.args(["status", "--database-url", &c.url("postgres"), &name]);
    let (code, text) = stdout_of(status);
    assert_eq!(code, Some(0), "{text}");
    let mut lines = text.lines();
    let header = lines.next().expect("a header");
    assert!(header.contains("BACKEND PID"), "{text}");
    let row = lines.next().expect("the holder's row");
    assert!(
        row.split_whitespace().any(|w| w == backend.to_string()),
        "{text}"
    );

    // `lease status --json`: `backend_pid`, for the holder and for standbys.
    let mut status = lease();
    status.args([
        "status",
        "--json",
        "--database-url",
        &c.url("postgres"),
        &name,
    ]);
    let (code, json) = stdout_of(status);
    assert_eq!(code, Some(0), "{json}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("one JSON line");
    assert_eq!(v["backend_pid"], backend, "{json}");
    assert!(v.get("pid").is_none(), "an unlabelled pid: {json}");

    // `/healthz`: the same word.
    let health = get(addr, "/healthz").expect("/healthz answers");
    assert!(
        health.contains(&format!("backend_pid {backend}")),
        "{health}"
    );

    r.sigterm().expect("SIGTERM");
    let mut r = r;
    let status = r.wait_exit(MS(15_000)).expect("exits");
    assert_eq!(status.code(), Some(0));
}

/// A closed port: the first failed attempt is logged at once, and the
/// repeats within the report interval (30 s) add no line, however fast the
/// retries are.
#[test]
fn an_unreachable_server_is_reported_once_per_interval() {
    let port = free_addr().port();
    let mut cmd = lease();
    cmd.arg("run")
        .args([
            "--database-url",
            &format!("postgres://app@127.0.0.1:{port}/postgres"),
        ])
        .args(["--retry-interval", "50ms", "--query-timeout", "1s"])
        .args(["unreachable", "--", "true"]);
    let mut r = Replica::spawn(cmd).expect("spawn lease run");
    let (first, _) = r
        .wait_for_line(|l| l.contains("cannot reach the database"), MS(2_000))
        .expect("the first failure is logged at once");
    // Several backoffs' worth of attempts (the backoff grows from the retry
    // interval and is capped at it times 20: more than ten attempts in 6 s).
    std::thread::sleep(MS(6_000));
    assert!(r.is_alive(), "an unreachable server was fatal");
    r.sigterm().expect("SIGTERM");
    let _ = r.wait_exit(MS(5_000)).expect("exits");
    let lines = stderr_of(&r);
    let reports: Vec<&String> = (lines.iter())
        .filter(|l| l.contains("cannot reach the database"))
        .collect();
    let warnings = lines.iter().filter(|l| l.contains("WARN")).count();
    eprintln!(
        "{} report(s), {warnings} WARN line(s) in {:?}:\n{}",
        reports.len(),
        first.elapsed(),
        lines.join("\n")
    );
    assert_eq!(reports.len(), 1, "{lines:#?}");
    assert!(reports[0].contains("Connection refused"), "{}", reports[0]);
    assert!(reports[0].contains("still retrying"), "{}", reports[0]);
    assert_eq!(warnings, 1, "{lines:#?}");
}

/// `lease run` with every option at its default starts without a warning;
/// a `--grace` the user asked for that a lost lease cannot give in full is
/// still announced.
#[test]
fn default_options_start_without_a_warning() {
    let c = cluster();
    let run = |extra: &[&str]| {
        let mut cmd = lease();
        cmd.arg("run")
            .args(["--database-url", &c.url("postgres")])
            .args(extra)
            .arg(unique("defaults"))
            .args(["--", "true"]);
        let out = cmd.output().expect("run lease");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        err
    };
    let err = run(&[]);
    eprintln!("defaults:\n{err}");
    assert!(!err.contains("WARN"), "a default warned:\n{err}");
    assert!(!err.contains("ERROR"), "{err}");

    // A long --grace (the deploy recipes' 20s) is a choice: said at INFO.
    let err = run(&["--grace", "10s"]);
    assert!(!err.contains("WARN"), "a chosen --grace warned:\n{err}");
    assert!(
        err.contains("--grace 10s applies in full to graceful stops"),
        "{err}"
    );
}
