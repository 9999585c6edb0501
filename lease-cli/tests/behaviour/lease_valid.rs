//! `lease valid`: the command asks its runner
//! whether its lease is valid, over the Unix socket named by `LEASE_SOCKET`.
//! Real `lease run` against an ephemeral server; the latency is printed
//! (`cargo test -p lease-cli lease_valid:: -- --nocapture`).

use crate::common::*;
use lease_proto::key_for_name;
use lease_tests::Replica;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::Duration;
use std::time::Instant;

/// Median and 99th percentile of `samples`, in milliseconds.
fn median_p99(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5).as_secs_f64() * 1e3, at(0.99).as_secs_f64() * 1e3)
}

#[test]
fn lease_valid_says_0_while_leading_and_1_once_the_lease_is_lost() {
    let c = cluster();
    let name = unique("valid");
    // The command asks once at its start, and again in its SIGTERM trap
    // after the lease is lost; --lock-delay 2s leaves the trap time to ask
    // before SIGKILL (and a validity window longer than that: the query
    // timeout is 4 s).
    let script = r#"trap '"$LEASE_BIN" valid; echo "after_loss=$?"; exit 0' TERM
"$LEASE_BIN" valid; echo "inside=$? socket=$LEASE_SOCKET"
while :; do sleep 0.05; done"#;
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", &c.url("postgres")])
        .args(["--retry-interval", "3s", "--heartbeat-interval", "100ms"])
        .args([
            "--query-timeout",
            "4s",
            "--lock-delay",
            "2s",
            "--grace",
            "5s",
        ])
        .arg(&name)
        .args(["--", "sh", "-c", script])
        .env("LEASE_BIN", env!("CARGO_BIN_EXE_lease"));
    let r = Replica::spawn(cmd).expect("spawn lease run");
    let (_, inside) = r
        .wait_for_line(|l| l.starts_with("inside="), MS(10_000))
        .expect("the command asked");
    let answer = r
        .lines()
        .iter()
        .rev()
        .find(|l| l.text.starts_with("valid") || l.text.starts_with("invalid"))
        .map(|l| l.text.clone())
        .unwrap_or_default();
    eprintln!("inside the leading command: {answer:?}, {inside}");
    assert!(
        inside.starts_with("inside=0 "),
        "`lease valid` from inside a leading command: {inside} ({answer})"
    );
    let socket = inside
        .split_whitespace()
        .find_map(|w| w.strip_prefix("socket="))
        .expect("LEASE_SOCKET")
        .to_owned();

    // Latency: 100 calls of the binary (what a command pays), and 100 bare
    // connect-and-read round trips (what the runner adds).
    let mut calls = Vec::new();
    for _ in 0..100 {
        let start = Instant::now();
        let status = lease()
            .args(["valid", "--quiet", "--socket", &socket])
            .status()
            .expect("run lease valid");
        calls.push(start.elapsed());
        assert_eq!(status.code(), Some(0));
    }
    let mut trips = Vec::new();
    for _ in 0..100 {
        let start = Instant::now();
        let mut s = UnixStream::connect(&socket).expect("connect");
        let mut line = String::new();
        s.read_to_string(&mut line).expect("read");
        trips.push(start.elapsed());
        assert!(line.starts_with("valid "), "{line}");
    }
    let (call_median, call_p99) = median_p99(calls);
    let (trip_median, trip_p99) = median_p99(trips);
    eprintln!(
        "`lease valid` (debug build, loaded machine): median {call_median:.2} ms, p99 \
         {call_p99:.2} ms per call of the binary; socket round trip median {trip_median:.3} \
         ms, p99 {trip_p99:.3} ms"
    );

    // A frozen runner answers nothing: an error, never "valid".
    r.sigstop().expect("SIGSTOP the runner");
    let start = Instant::now();
    let frozen = lease()
        .args(["valid", "--timeout", "300ms", "--socket", &socket])
        .output()
        .expect("run lease valid");
    let took = start.elapsed();
    r.sigcont().expect("SIGCONT the runner");
    eprintln!(
        "against a stopped runner: exit {:?} after {took:?}: {}",
        frozen.status.code(),
        String::from_utf8_lossy(&frozen.stderr).trim()
    );
    assert_eq!(frozen.status.code(), Some(2));

    // Lose the lease: the command's SIGTERM trap asks again.
    let key = key_for_name(&name);
    let holder = c.held_advisory_keys().expect("pg_locks");
    let holder = holder.iter().find(|&&(k, _)| k == key).expect("held");
    assert!(c.terminate_backend(holder.1).expect("terminate"));
    let (_, after) = r
        .wait_for_line(|l| l.starts_with("after_loss="), MS(10_000))
        .expect("the command asked after the loss");
    // The trap's own answer: the last one before its `after_loss=` line (the
    // runner leads again afterwards, and its new command asks too).
    let lines = r.lines();
    let end = lines
        .iter()
        .position(|l| l.text.starts_with("after_loss="))
        .unwrap_or(lines.len());
    let answer = lines[..end]
        .iter()
        .rev()
        .find(|l| l.text.starts_with("invalid") || l.text.starts_with("valid"))
        .map(|l| l.text.clone())
        .unwrap_or_default();
    eprintln!("in the SIGTERM trap after pg_terminate_backend: {answer:?}, {after}");
    assert_eq!(after, "after_loss=1", "{answer}");
}

#[test]
fn lease_valid_outside_lease_run_is_an_error() {
    let out = lease()
        .arg("valid")
        .env_remove("LEASE_SOCKET")
        .output()
        .expect("run lease valid");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("LEASE_SOCKET is not set"), "{err}");
    let out = lease()
        .args(["valid", "--socket", "/nonexistent/valid.sock"])
        .output()
        .expect("run lease valid");
    assert_eq!(out.status.code(), Some(2));
}

/// A stopped runner accepts nothing, and once its socket's backlog is full
/// a plain `connect` waits until it does. `lease valid --timeout 1s` gives up
/// within its timeout all the same, connect included: exit 2 (an error, never
/// "valid") with one line. The socket here is a listener nobody accepts on,
/// its backlog filled by non-blocking connects.
#[test]
fn lease_valid_gives_up_within_its_timeout_when_the_backlog_is_full() {
    use socket2::{Domain, SockAddr, Socket, Type};
    let dir = std::env::temp_dir().join(unique("lease-valid-backlog"));
    std::fs::create_dir(&dir).expect("mkdir");
    let path = dir.join("valid.sock");
    let addr = SockAddr::unix(&path).expect("address");
    let listener = Socket::new(Domain::UNIX, Type::STREAM, None).expect("socket");
    listener.bind(&addr).expect("bind");
    listener.listen(0).expect("listen");
    let mut queued = Vec::new();
    let full = loop {
        let s = Socket::new(Domain::UNIX, Type::STREAM, None).expect("socket");
        s.set_nonblocking(true).expect("nonblocking");
        match s.connect(&addr) {
            Ok(()) => queued.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
            Err(e) => panic!("connect: {e}"),
        }
        if queued.len() > 10_000 {
            break false;
        }
    };
    assert!(full, "the backlog never filled");
    let mut cmd = lease();
    cmd.args(["valid", "--timeout", "1s", "--socket"])
        .arg(&path);
    let (status, out, err, took) = try_output(cmd, MS(5_000));
    drop((queued, listener));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    eprintln!(
        "`lease valid --timeout 1s` on a full backlog: {} after {took:?}; stdout {:?}, stderr \
         {lines:?}",
        exit_text(status),
        out.trim()
    );
    assert!(
        status.and_then(|s| s.code()) == Some(2) && took < MS(1_500),
        "`lease valid --timeout 1s` against a full backlog: {} after {took:?} (want exit 2 \
         within 1.5 s)",
        exit_text(status)
    );
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("timed out after 1s"), "{}", lines[0]);
    assert!(out.is_empty(), "{out}");
}
