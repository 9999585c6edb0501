//! Configuration errors from the `lease` command: before any session, a
//! wrong password, an unknown role or an unknown database exit 1 at once
//! with one clear line; a closed port keeps retrying and says why. No
//! password appears in any output line.

use crate::common::*;
use lease_tests::Cluster;
use lease_tests::Replica;
use lease_tests::Stream;
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;
use std::time::Instant;

const PASSWORD: &str = "right-Secret-7781";

const WRONG: &str = "wrong-Secret-4410";

/// `lease run` with a clean environment.
fn lease_run(url: &str) -> Command {
    let mut cmd = lease();
    cmd.args(["run", "--database-url", url])
        .args(["--retry-interval", "50ms", "--query-timeout", "1s"])
        .args(["job", "--", "sleep", "30"]);
    cmd
}

/// Runs `lease run` against `url`; asserts exit 1 within 2 s with one error
/// line containing `words`, and no password anywhere.
fn exits_at_once(url: &str, words: &str) {
    let start = Instant::now();
    let mut r = Replica::spawn(lease_run(url)).expect("spawn lease");
    let status = r.wait_exit(MS(5_000)).expect("lease exits");
    let took = start.elapsed();
    let _ = r.wait_for_line(|_| false, MS(200));
    let lines: Vec<String> = r.lines().into_iter().map(|l| l.text).collect();
    eprintln!("exit {status} after {took:?}: {lines:#?}");
    assert_eq!(status.code(), Some(1), "{lines:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    for line in &lines {
        assert!(!line.contains(PASSWORD) && !line.contains(WRONG), "{line}");
    }
    let errors: Vec<&String> = lines.iter().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line: {lines:?}");
    assert!(errors[0].contains("cannot connect: "), "{}", errors[0]);
    assert!(errors[0].contains(words), "{}", errors[0]);
    assert!(
        !lines.iter().any(|l| l.contains("session lost")),
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("still retrying")),
        "{lines:?}"
    );
    assert!(r.lines().iter().all(|l| l.stream == Stream::Stderr));
}

#[test]
fn wrong_password_unknown_role_and_unknown_database_exit_1_at_once() {
    let c = Cluster::start_password_auth().expect("start a cluster");
    c.sql(&format!("CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'"))
        .expect("create role");
    let port = c.port();
    exits_at_once(
        &format!("postgres://app:{WRONG}@127.0.0.1:{port}/postgres"),
        "password authentication failed for user \"app\" (SQLSTATE 28P01)",
    );
    exits_at_once(
        &format!("host=127.0.0.1 port={port} user=app password={WRONG} dbname=postgres"),
        "password authentication failed for user \"app\"",
    );
    // postgres is trusted on this cluster: an unknown database, and an
    // unknown role over a trusted line of the same server (a socket).
    exits_at_once(
        &format!("postgres://app:{PASSWORD}@127.0.0.1:{port}/no_such_db"),
        "database \"no_such_db\" does not exist (SQLSTATE 3D000)",
    );
    let sock = c.socket_dir();
    exits_at_once(
        &format!(
            "host={} port={port} user=no_such_role password={WRONG} dbname=postgres",
            sock.display()
        ),
        "role \"no_such_role\" does not exist (SQLSTATE 28000)",
    );
}

/// Startup settings the server refuses, and a client that refuses the
/// server's authentication: each exits 1 at once, as psql does.
#[test]
fn refused_startup_options_and_channel_binding_exit_1_at_once() {
    let c = cluster();
    let base = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable",
        c.port()
    );
    exits_at_once(
        &format!("{base} options='-X'"),
        "invalid command-line argument for server process",
    );
    exits_at_once(
        &format!("{base} options='-c shared_buffers=1MB'"),
        "cannot be changed without restarting the server (SQLSTATE 55P02)",
    );
    exits_at_once(
        &format!("{base} channel_binding=require"),
        "server did not use channel binding",
    );
}

/// Several hosts: the first answers that the database does not exist, the
/// second is down. The unknown database decides (it is the same on every
/// host): exit 1 at once, whatever the order of the hosts.
#[test]
fn a_configuration_error_on_any_host_exits_1_at_once() {
    let c = cluster();
    let free = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    for ports in [
        format!("{},{free}", c.port()),
        format!("{free},{}", c.port()),
    ] {
        exits_at_once(
            &format!(
                "host=127.0.0.1,127.0.0.1 port={ports} user=postgres dbname=no_such_db \
                 sslmode=disable"
            ),
            "database \"no_such_db\" does not exist (at 127.0.0.1:",
        );
    }
}

/// An argument that is not UTF-8 is a usage error (exit 2, one line), never a
/// panic quoting it: here a `--database-url` with its password.
#[test]
fn a_non_utf8_argument_is_a_usage_error_that_quotes_nothing() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let mut url = format!("postgres://app:{PASSWORD}@db.example.com/app").into_bytes();
    url.push(0xff);
    let mut cmd = lease();
    cmd.env_remove("RUST_BACKTRACE")
        .arg("run")
        .arg("--database-url")
        .arg(OsString::from_vec(url))
        .args(["job", "--", "true"]);
    let (status, _, err, _) = output(cmd, Duration::from_secs(10));
    assert!(!err.contains(PASSWORD), "the password is printed: {err}");
    assert!(!err.contains("panicked"), "a panic: {err}");
    assert_eq!(status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn a_closed_port_keeps_retrying_and_names_the_cause() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("postgres://app:{WRONG}@127.0.0.1:{port}/postgres");
    let mut r = Replica::spawn(lease_run(&url)).expect("spawn lease");
    let (_, line) = r
        .wait_for_line(|l| l.contains("still retrying"), MS(5_000))
        .expect("says it keeps retrying");
    eprintln!("{}", line);
    assert!(line.contains("cannot reach the database"), "{}", line);
    assert!(line.contains("Connection refused"), "{}", line);
    assert!(r.is_alive(), "a closed port was fatal");
    r.sigterm().expect("SIGTERM");
    let status = r.wait_exit(MS(2_000)).expect("exits");
    assert_eq!(status.code(), Some(0));
    for l in r.lines() {
        assert!(!l.text.contains(WRONG), "{}", l.text);
    }
}

/// PostgreSQL 13 (fetched by .ci/install-deps) rejects the server guard's
/// `idle_session_timeout` at startup: `lease run` exits 1 at once with the
/// version it needs, not a "cannot connect" nor a retry; with
/// `--no-server-guard` the command runs.
#[test]
fn postgres_13_exits_1_naming_the_version_needed() {
    let c = Cluster::start_version(13).expect("start PostgreSQL 13");
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", c.port());
    let start = Instant::now();
    let mut r = Replica::spawn(lease_run(&url)).expect("spawn lease");
    let status = r.wait_exit(MS(5_000)).expect("lease exits");
    let took = start.elapsed();
    let _ = r.wait_for_line(|_| false, MS(200));
    let lines: Vec<String> = r.lines().into_iter().map(|l| l.text).collect();
    eprintln!("exit {status} after {took:?}: {lines:#?}");
    assert_eq!(status.code(), Some(1), "{lines:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let last = lines.last().expect("a line");
    assert!(
        last.contains("ERROR") && last.contains("lease needs PostgreSQL 14 or newer"),
        "{lines:?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("cannot connect") || l.contains("retrying")),
        "{lines:?}"
    );

    let mut cmd = lease();
    cmd.args(["run", "--database-url", &url, "--no-server-guard"])
        .args(["--retry-interval", "50ms", "--query-timeout", "1s"])
        .args(["job", "--", "echo", "led-on-13"]);
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    let status = r.wait_exit(MS(10_000)).expect("lease exits");
    let _ = r.wait_for_line(|_| false, MS(200));
    let lines: Vec<String> = r.lines().into_iter().map(|l| l.text).collect();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert!(lines.iter().any(|l| l == "led-on-13"), "{lines:?}");
}

/// `keepalives_idle` / `keepalives_interval` beyond Linux's 32767 s, or
/// `keepalives_count` beyond 127: they were accepted, then every connection
/// attempt failed with `Invalid argument (os error 22)` from setsockopt, a
/// "network" error retried for ever. Now one error naming the keyword, exit
/// 2 (a bad connection string) at once.
#[test]
fn out_of_range_keepalive_options_exit_2_at_once() {
    let c = cluster();
    for (opt, keyword) in [
        ("keepalives_idle=40000", "keepalives_idle"),
        ("keepalives_interval=40000", "keepalives_interval"),
        ("keepalives_count=4000000000", "keepalives_count"),
    ] {
        let url = format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable {opt}",
            c.port()
        );
        let start = Instant::now();
        let mut r = Replica::spawn(lease_run(&url)).expect("spawn lease");
        let status = r.wait_exit(MS(3_000)).ok();
        let took = start.elapsed();
        if status.is_none() {
            let _ = r.sigterm();
            let _ = r.wait_exit(MS(3_000));
        }
        let _ = r.wait_for_line(|_| false, MS(200));
        let lines: Vec<String> = r.lines().into_iter().map(|l| l.text).collect();
        eprintln!("{opt}: exit {status:?} after {took:?}: {lines:#?}");
        assert!(
            !lines.iter().any(|l| l.contains("still retrying")),
            "retried for ever: {lines:#?}"
        );
        // A bad connection string: exit 2, as for any other.
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{lines:#?}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let errors: Vec<&String> = lines.iter().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "one error line: {lines:?}");
        assert!(
            errors[0].contains(keyword) && errors[0].contains("out of range"),
            "{}",
            errors[0]
        );
    }
}
