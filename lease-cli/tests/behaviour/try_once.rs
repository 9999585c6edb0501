//! `lease run --try [--wait D]`: COMMAND runs only if the lease is won at the first try (or
//! within D); held, `lease run` exits 3 with one line naming the holder and runs nothing; won,
//! COMMAND runs once and its status passes through; lost while COMMAND runs, it is not run
//! again. The usage errors are in `run.rs` with the others.

use crate::common::*;
use lease_proto::key_for_name;
use lease_tests::{Cluster, Replica};
use std::path::Path;
use std::time::{Duration, Instant};

/// A holder of `name`: its command prints `start` and runs `sleep SECS`; its backend pid.
fn holder(c: &Cluster, name: &str, secs: &str) -> (Replica, i64) {
    let script = format!("echo start; exec sleep {secs}");
    let r = Replica::spawn(fast_sh(c, name, &[], &script)).expect("spawn the holder");
    let (_, ready) = r
        .wait_for_line(|l| l.contains("lease session ready"), MS(10_000))
        .expect("the holder's session");
    r.wait_for_line(|l| l == "start", MS(10_000))
        .expect("the holder leads");
    (r, field(&ready, "backend_pid").expect("backend_pid"))
}

/// `lease run --try EXTRA... NAME -- sh -c 'date >> MARKER; exit CODE'`.
fn trying(
    c: &Cluster,
    name: &str,
    extra: &[&str],
    marker: &Path,
    code: i32,
) -> std::process::Command {
    let mut args = vec!["--try"];
    args.extend_from_slice(extra);
    let script = format!("date +%s.%N >> {}; exit {code}", marker.display());
    fast_sh(c, name, &args, &script)
}

/// The stderr lines that are not blank.
fn lines(err: &str) -> Vec<&str> {
    err.lines().filter(|l| !l.trim().is_empty()).collect()
}

#[test]
fn try_runs_when_the_lease_is_free_and_passes_the_exit_status() {
    let c = cluster();
    let name = unique("try-free");
    let dir = Dir::new("try-free");
    let marker = dir.file("ran");
    let (status, _, err, took) = output(trying(&c, &name, &[], &marker, 7), MS(10_000));
    eprintln!("--try, free lease: {status} after {took:?}");
    assert_eq!(status.code(), Some(7), "{err}");
    assert_eq!(stamps(&marker).len(), 1, "COMMAND ran once: {err}");
    assert!(
        err.contains("leading: started sh"),
        "the usual lines: {err}"
    );
    assert!(!held(&c, key_for_name(&name)), "the lease was not released");
}

#[test]
fn try_exits_3_with_one_line_naming_the_holder_when_the_lease_is_held() {
    let c = cluster();
    let name = unique("try-held");
    let dir = Dir::new("try-held");
    let marker = dir.file("ran");
    let (mut a, pid) = holder(&c, &name, "30");

    let (status, out, err, took) = output(trying(&c, &name, &[], &marker, 0), MS(10_000));
    eprintln!("--try, held lease: {status} after {took:?}: {}", err.trim());
    assert_eq!(status.code(), Some(3), "{err}");
    let err = lines(&err);
    assert_eq!(err.len(), 1, "not one line: {err:?}");
    let want = format!(
        "lease: {name} is held by backend {pid} ({}, 127.0.0.1:",
        app(&name)
    );
    assert!(err[0].starts_with(&want), "{}", err[0]);
    assert!(err[0].ends_with(": not run (--try)"), "{}", err[0]);
    assert!(out.is_empty(), "{out}");
    assert!(stamps(&marker).is_empty(), "COMMAND ran");
    assert!(took < MS(5_000), "{took:?}");

    // --wait: gives up once it has passed, the same way.
    let (status, _, err, took) = output(
        trying(&c, &name, &["--wait", "300ms"], &marker, 0),
        MS(10_000),
    );
    eprintln!("--try --wait 300ms, held lease: {status} after {took:?}");
    assert_eq!(status.code(), Some(3), "{err}");
    let err = lines(&err);
    assert_eq!(err.len(), 1, "not one line: {err:?}");
    assert!(
        err[0].contains(&format!("is held by backend {pid} ")),
        "{}",
        err[0]
    );
    assert!(
        err[0].ends_with(": not run (--try --wait 300ms)"),
        "{}",
        err[0]
    );
    assert!(took >= MS(300), "gave up before --wait: {took:?}");
    assert!(stamps(&marker).is_empty(), "COMMAND ran");

    // The holder was not disturbed.
    assert!(held(&c, key_for_name(&name)));
    assert!(a.wait_exit(MS(10)).is_err(), "the holder exited");
    a.sigterm().expect("SIGTERM the holder");
    assert_eq!(a.wait_exit(MS(5_000)).expect("exits").code(), Some(0));
}

#[test]
fn try_with_wait_runs_once_the_holder_releases() {
    let c = cluster();
    let name = unique("try-wait");
    let dir = Dir::new("try-wait");
    let marker = dir.file("ran");
    // The holder's command exits after 500 ms: its runner releases the lease and exits.
    let (mut a, pid) = holder(&c, &name, "0.5");
    let start = Instant::now();
    let (status, _, err, took) =
        output(trying(&c, &name, &["--wait", "2s"], &marker, 5), MS(10_000));
    let released = a.wait_exit(MS(5_000)).expect("the holder exits");
    eprintln!("--try --wait 2s, released after ~500 ms: {status} after {took:?}");
    assert_eq!(released.code(), Some(0));
    assert_eq!(status.code(), Some(5), "{err}");
    assert_eq!(stamps(&marker).len(), 1, "COMMAND ran once: {err}");
    // It found the lease held first (its info lines, held back, were printed at the start).
    let standing_by = format!("holder_backend_pid={pid}");
    assert!(err.contains(&standing_by), "it never stood by: {err}");
    assert!(start.elapsed() < Duration::from_secs(5), "{took:?}");
    assert!(!held(&c, key_for_name(&name)), "the lease was not released");
}

#[test]
fn try_does_not_run_again_after_a_lost_lease() {
    let c = cluster();
    let name = unique("try-lost");
    let dir = Dir::new("try-lost");
    let marker = dir.file("ran");
    let script = format!(
        "date +%s.%N >> {}; echo start; exec sleep 30",
        marker.display()
    );
    let mut r = Replica::spawn(fast_sh(&c, &name, &["--try"], &script)).expect("spawn");
    let (_, ready) = r
        .wait_for_line(|l| l.contains("lease session ready"), MS(10_000))
        .expect("session");
    r.wait_for_line(|l| l == "start", MS(10_000))
        .expect("COMMAND runs");
    let pid = field(&ready, "backend_pid").expect("backend_pid") as i32;
    assert!(c.terminate_backend(pid).expect("terminate"));
    let status = r.wait_exit(MS(5_000)).expect("lease run --try exits");
    eprintln!("--try, session terminated while COMMAND ran: {status}");
    assert_eq!(status.code(), Some(1), "{}", stderr_of(&r));
    assert!(stderr_of(&r).contains("not running it again (--try)"));
    assert_eq!(stamps(&marker).len(), 1, "COMMAND ran again");
}

#[test]
fn try_exits_1_not_3_when_the_database_cannot_be_reached() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "postgres://u@127.0.0.1:{}/x",
        closed.local_addr().expect("addr").port()
    );
    drop(closed);
    let dir = Dir::new("try-unreachable");
    let marker = dir.file("ran");
    let script = format!("date +%s.%N >> {}", marker.display());
    for extra in [&["--try"][..], &["--try", "--wait", "300ms"]] {
        let (status, _, err, took) = output(run_sh(&url, extra, "job", &script), MS(10_000));
        eprintln!("{extra:?}, no server: {status} after {took:?}");
        assert_eq!(status.code(), Some(1), "{extra:?}: {err}");
        let last = lines(&err).last().copied().unwrap_or_default();
        assert!(
            last.starts_with("lease: cannot reach the database ("),
            "{last}"
        );
        assert!(stamps(&marker).is_empty(), "COMMAND ran");
        assert!(took < MS(3_000), "{extra:?}: {took:?}");
    }
}
