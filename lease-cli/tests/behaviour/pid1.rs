//! `lease run` as PID 1, as in a container without an init (deploy/Dockerfile): in a new PID
//! namespace (`unshare --pid --fork --mount-proc`, as root), SIGTERM from outside reaches it
//! (a PID 1 without a handler would ignore it), and it stops its command's whole tree, a
//! background grandchild included, releases the lease and exits 0.

use crate::common::*;
use lease_tests::Replica;
use std::time::Instant;

/// The children of `pid` (from `/proc/PID/task/*/children`).
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Processes whose command line is `sleep NEEDLE`.
fn with_argument(needle: &str) -> Vec<i32> {
    let want = format!("sleep\0{needle}\0");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes())
        })
        .collect()
}

#[test]
fn lease_run_as_pid_1_stops_its_tree_and_releases_on_sigterm() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let unshare = std::process::Command::new("unshare").arg("--help").output();
    if !root || unshare.is_err() {
        eprintln!("SKIPPED: needs root and unshare (util-linux) for a PID namespace");
        return;
    }
    let c = cluster();
    let name = unique("pid1");
    // A grandchild in the background, told apart by its argument.
    let marker = format!("{}.{}", 900 + std::process::id() % 90, std::process::id());
    let script = format!(
        r#"echo start; trap "echo stop; exit 0" TERM; sleep {marker} & while :; do sleep 0.02; done"#
    );
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_lease"));
    for var in ENVIRONMENT {
        cmd.env_remove(var);
    }
    let cmd = run_sh_with(cmd, &c.url("postgres"), &FAST, &name, &script);
    let mut r = Replica::spawn(cmd).expect("spawn unshare");
    r.wait_for_line(|l| l == "start", MS(10_000))
        .expect("the command starts");
    let lease = children(r.pid());
    assert_eq!(lease.len(), 1, "unshare's child: {lease:?}");
    let lease = lease[0];
    let status = std::fs::read_to_string(format!("/proc/{lease}/status")).expect("its status");
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .expect("NSpid");
    assert!(
        nspid.trim_end().ends_with("\t1"),
        "not PID 1 in its namespace: {nspid}"
    );
    let started = Instant::now();
    while with_argument(&marker).len() != 1 {
        assert!(started.elapsed() < MS(5_000), "the grandchild never ran");
        std::thread::sleep(MS(10));
    }
    let sent = Instant::now();
    // SAFETY: kill with a valid pid and signal.
    assert_eq!(unsafe { libc::kill(lease, libc::SIGTERM) }, 0);
    let status = r.wait_exit(MS(10_000)).expect("it exits");
    let (out, err) = texts(&r);
    eprintln!(
        "FIGURE lease run as PID 1: exit {:?} after SIGTERM",
        sent.elapsed()
    );
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        out.lines().any(|l| l == "stop"),
        "the command got no SIGTERM:\n{out}\n{err}"
    );
    assert!(err.contains("lease released"), "{err}");
    assert!(
        with_argument(&marker).is_empty(),
        "the grandchild outlived lease run"
    );
}
