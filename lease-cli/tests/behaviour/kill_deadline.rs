//! No command outlives the moment the server could hand its lease to another session, with
//! real `lease run` processes against ephemeral PostgreSQL servers: a partitioned holder's
//! command that ignores SIGTERM is dead before the standby's starts, and a stalled runner
//! leaves no command running (the guard-deadline kill and the watchdog).
//!
//! The commands write wall-clock stamps (`date +%s.%N`) to a file every 50 ms;
//! overlap is the last stamp of the old holder's command minus the first stamp
//! of the new holder's, so a positive overlap means both commands ran at once.

use crate::common::*;
use lease_tests::pid_alive;
use lease_tests::FaultProxy;
use lease_tests::Mode;
use lease_tests::Replica;
use lease_tests::Stream;
use std::net::SocketAddr;
use std::time::Duration;
use std::time::Instant;

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

/// A partitioned holder whose command ignores SIGTERM, at the default
/// `--grace` (10 s). The holder reaches the server through a FaultProxy that
/// is black-holed; the standby connects directly. The old command must be
/// dead before the standby's command starts (overlap <= 0): SIGKILL no later
/// than the moment the server could hand the lease over (last statement +
/// `idle_session_timeout`), whatever `--grace` says.
#[test]
fn partitioned_holder_ignoring_sigterm_is_dead_before_the_standby_starts() {
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

/// A stalled runner. Only the holder's `lease run` process is stopped
/// (SIGSTOP of the runner, not of its command's process group); the server
/// guard ends its session and the standby takes over. The old command must be
/// dead before the standby's command starts.
#[test]
fn stalled_runner_leaves_no_command_running() {
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
