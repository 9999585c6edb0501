//! `lease run` and its command tree, with real `lease run` processes against ephemeral
//! PostgreSQL servers (the timings are printed with `--nocapture`).
//!
//! - After `pg_terminate_backend` of the holder's session or a server restart, the server
//!   has freed the key at once; a command that ignores SIGTERM must be dead before the
//!   standby's command starts.
//! - A descendant that leaves the command's process group (`setsid`) must not outlive a
//!   graceful stop, a lost lease, or a kill -9 of the runner.
//!
//! Each command writes `date +%s%N` stamps to a file named by its own pid
//! every 10 ms, so every command instance is one interval [first, last] and
//! overlap is checked between all of them, whichever runner led when.

use crate::common::*;
use lease_proto::key_for_name;
use lease_tests::pid_alive;
use lease_tests::Cluster;
use lease_tests::Replica;
use lease_tests::Stream;
use std::fs;
use std::path::Path;
use std::time::Duration;
use std::time::Instant;

/// A command that prints `pid=$$ token=$LEASE_TOKEN`, ignores SIGTERM, and
/// stamps `DIR/$$` every 10 ms.
fn stubborn_stamper(dir: &Path) -> String {
    format!(
        r#"echo "pid=$$ token=$LEASE_TOKEN"; trap "" TERM; while :; do date +%s%N >> {}/$$; sleep 0.01; done"#,
        dir.display()
    )
}

/// The pids of the commands a runner started so far (its `pid=` lines).
fn commands(r: &Replica) -> Vec<i32> {
    r.lines()
        .iter()
        .filter(|l| l.stream == Stream::Stdout && l.text.starts_with("pid="))
        .filter_map(|l| field(&l.text, "pid").map(|p| p as i32))
        .collect()
}

/// Waits until the runners together started `n` commands.
fn wait_commands(rs: &[&Replica], n: usize, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if rs.iter().map(|r| commands(r).len()).sum::<usize>() >= n {
            return true;
        }
        std::thread::sleep(MS(5));
    }
    false
}

/// How the holder's session ends in a session-end test.
enum SessionEnd {
    Terminate,
    Restart,
    /// `pg_terminate_backend` while the holder's runner stops its command
    /// gracefully (SIGTERM to `lease run`: the key is held until the command
    /// is gone, up to `--grace`).
    TerminateDuringGracefulStop,
    /// `pg_terminate_backend` of the holder's backend while a heartbeat is in
    /// flight (the backend SIGSTOPped across a heartbeat, terminated, then
    /// SIGCONTed): the server answers the statement with FATAL 57P01 and
    /// frees the key.
    TerminateInFlight,
}

/// Two runners at the default intervals and `--grace` (10 s), both
/// commands ignoring SIGTERM; the holder's session is ended by the server.
/// No two commands may ever have run at once.
fn session_end_leaves_no_overlap(c: &mut Cluster, how: SessionEnd) {
    let label = match how {
        SessionEnd::Terminate => "pg_terminate_backend",
        SessionEnd::Restart => "pg_ctl restart -m fast",
        SessionEnd::TerminateDuringGracefulStop => "pg_terminate_backend during a graceful stop",
        SessionEnd::TerminateInFlight => "pg_terminate_backend with a heartbeat in flight",
    };
    // A heartbeat in flight needs a heartbeat within the freeze, and the
    // freeze must end before the query timeout.
    let args: &[&str] = match how {
        SessionEnd::TerminateInFlight => {
            &["--heartbeat-interval", "200ms", "--query-timeout", "2s"]
        }
        _ => &[],
    };
    let dir = Dir::new("hole2");
    let name = unique("hole2");
    let url = c.url("postgres");
    let a = Replica::spawn(run_sh(&url, args, &name, &stubborn_stamper(dir.path()))).expect("a");
    assert!(wait_commands(&[&a], 1, MS(10_000)), "a did not lead");
    let pid_a = commands(&a)[0];
    let b = Replica::spawn(run_sh(&url, args, &name, &stubborn_stamper(dir.path()))).expect("b");
    b.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("b stands by");
    std::thread::sleep(MS(300));

    if let SessionEnd::TerminateDuringGracefulStop = how {
        a.sigterm().expect("SIGTERM to a");
        a.wait_for_line(|l| l.contains("stopping the command"), MS(5_000))
            .expect("a stops its command");
        std::thread::sleep(MS(200));
    }
    let start = Instant::now();
    match how {
        SessionEnd::Terminate | SessionEnd::TerminateDuringGracefulStop => {
            let key = key_for_name(&name);
            let holder = c.held_advisory_keys().expect("pg_locks");
            let holder = holder.iter().find(|&&(k, _)| k == key).expect("a holds");
            assert!(c.terminate_backend(holder.1).expect("terminate"));
        }
        SessionEnd::Restart => c.restart().expect("restart"),
        SessionEnd::TerminateInFlight => {
            let key = key_for_name(&name);
            let holder = c.held_advisory_keys().expect("pg_locks");
            let backend = holder.iter().find(|&&(k, _)| k == key).expect("a holds").1;
            let signal = |sig| {
                // SAFETY: kill with a live backend's pid and a signal number.
                assert_eq!(
                    unsafe { libc::kill(backend, sig) },
                    0,
                    "signal {sig} to {backend}"
                );
            };
            signal(libc::SIGSTOP);
            // More than a heartbeat interval: a heartbeat waits on the frozen backend.
            std::thread::sleep(MS(500));
            // No wait for the exit: the backend is frozen.
            let sql = format!("SELECT pg_terminate_backend({backend})");
            assert_eq!(c.sql(&sql).expect("terminate"), "t");
            signal(libc::SIGCONT);
        }
    }
    let next = wait_commands(&[&a, &b], 2, MS(30_000));
    let a_gone = wait_gone(pid_a, MS(15_000));
    std::thread::sleep(MS(200));
    let all = intervals(dir.path());
    let (first_a, last_a) = all.get(&pid_a).copied().unwrap_or((0, 0));
    let worst = worst_overlap(dir.path());
    eprintln!(
        "{label} of the holder's session, SIGTERM-ignoring commands, default --grace: a new \
         command started: {next}; a's first command (pid {pid_a}) gone: {a_gone}, last stamp \
         {:.0} ms after the {label} call started (it stamped for {:.0} ms in all); commands {:?}; \
         worst overlap {:?} ms",
        (last_a as f64 - now_nanos_at(start) as f64) / 1e6,
        (last_a as f64 - first_a as f64) / 1e6,
        all.keys().collect::<Vec<_>>(),
        worst.map(|(w, p, q)| format!("{w:.1} ({p}, {q})")),
    );
    assert!(next, "no command started after the {label}");
    let (overlap, p, q) = worst.expect("two commands stamped");
    assert!(
        overlap < 0.0,
        "after {label}, commands {p} and {q} ran at once for {overlap:.1} ms (the old one \
         ignores SIGTERM; default --grace 10s)\n--- a's stderr ---\n{}\n--- b's stderr ---\n{}",
        stderr_of(&a),
        stderr_of(&b),
    );
}

/// The wall clock (nanoseconds since the epoch) at `at`, a moment in the past.
fn now_nanos_at(at: Instant) -> u128 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    now - at.elapsed().as_nanos()
}

#[test]
fn terminate_with_a_statement_in_flight_leaves_no_overlap() {
    let mut c = Cluster::start().expect("start PostgreSQL");
    session_end_leaves_no_overlap(&mut c, SessionEnd::TerminateInFlight);
}

#[test]
fn terminated_holder_ignoring_sigterm_is_dead_before_the_standby_starts() {
    let mut c = Cluster::start().expect("start PostgreSQL");
    session_end_leaves_no_overlap(&mut c, SessionEnd::Terminate);
}

#[test]
fn terminate_during_a_graceful_stop_leaves_no_overlap() {
    let mut c = Cluster::start().expect("start PostgreSQL");
    session_end_leaves_no_overlap(&mut c, SessionEnd::TerminateDuringGracefulStop);
}

#[test]
fn restarted_server_leaves_no_overlap_with_a_sigterm_ignoring_command() {
    let mut c = Cluster::start().expect("start PostgreSQL");
    session_end_leaves_no_overlap(&mut c, SessionEnd::Restart);
}

/// A command that starts a writer that leaves its process group and session
/// (`setsid`) and ignores SIGTERM, then prints `pid=$$ token=$LEASE_TOKEN`
/// and waits. The writer appends a line to `DIR/esc-PID` every 10 ms and
/// writes its own pid to `DIR/esc-PID.pid` (PID: the command's).
fn escaper(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"setsid bash -c 'echo $$ > {d}/esc-$1.pid; trap "" TERM; while :; do echo x >> {d}/esc-$1; sleep 0.01; done' esc $$ & echo "pid=$$ token=$LEASE_TOKEN"; while :; do sleep 0.05; done"#
    )
}

/// Every live process whose environment has `LEASE_TOKEN=token`: the
/// command's whole tree, wherever it moved (setsid, double fork), unless it
/// cleared its environment. The watchdog (`lease __watchdog`, which passes
/// the variables on to the command) is not part of it: after a deadline
/// kill it waits for its frozen runner.
fn tree_by_token(token: i64) -> Vec<(i32, String)> {
    let needle = format!("LEASE_TOKEN={token}");
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(env) = fs::read(entry.path().join("environ")) else {
            continue;
        };
        let has = env.split(|&b| b == 0).any(|v| v == needle.as_bytes());
        let stat = fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|s| s == "Z" || s == "X");
        if has && !zombie {
            let cmd = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if !cmd.contains(" __watchdog ") {
                out.push((pid, cmd.trim().to_owned()));
            }
        }
    }
    out
}

/// Waits until no process of the token's tree is left; what is left.
fn wait_tree_gone(token: i64, limit: Duration) -> Vec<(i32, String)> {
    let start = Instant::now();
    loop {
        let left = tree_by_token(token);
        if left.is_empty() || start.elapsed() >= limit {
            return left;
        }
        std::thread::sleep(MS(10));
    }
}

/// Lines in `file` now and 300 ms later.
fn growth(file: &Path) -> (usize, usize) {
    let n = || fs::read_to_string(file).map_or(0, |s| s.lines().count());
    let before = n();
    std::thread::sleep(MS(300));
    (before, n())
}

/// How an escaped-descendant test stops the command.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// SIGTERM to `lease run`: a graceful stop.
    Graceful,
    /// `pg_terminate_backend` of the holder's session: a lost lease.
    LostLease,
    /// `kill -9` of `lease run`.
    RunnerKilled,
    /// SIGSTOP of `lease run` (its command and watchdog run on): the
    /// watchdog's deadline.
    RunnerFrozen,
}

/// After `stop`, no process of the command's tree may be alive, the escaped
/// writer included, and the writer's file stops growing.
fn escaped_descendant_dies_with_the_command(stop: Stop) {
    let c = cluster();
    let dir = Dir::new("hole6");
    let name = unique("hole6");
    let mut r = Replica::spawn(run_sh(
        &c.url("postgres"),
        &fast_and(&["--grace", "1s"]),
        &name,
        &escaper(dir.path()),
    ))
    .expect("spawn lease run");
    let (_, line) = r
        .wait_for_line(|l| l.starts_with("pid="), MS(10_000))
        .expect("the command started");
    let pid = field(&line, "pid").expect("pid") as i32;
    let token = field(&line, "token").expect("token");
    let esc_file = dir.path().join(format!("esc-{pid}"));
    let pid_file = dir.path().join(format!("esc-{pid}.pid"));
    let start = Instant::now();
    let esc = loop {
        let p = fs::read_to_string(&pid_file).ok();
        if let Some(p) = p.and_then(|s| s.trim().parse::<i32>().ok()) {
            if fs::metadata(&esc_file).is_ok_and(|m| m.len() > 0) {
                break p;
            }
        }
        assert!(
            start.elapsed() < MS(5_000),
            "the escaped writer did not start"
        );
        std::thread::sleep(MS(10));
    };
    let before = tree_by_token(token);
    let stopped = Instant::now();
    match stop {
        Stop::Graceful => {
            r.sigterm().expect("SIGTERM");
            let status = r.wait_exit(MS(15_000));
            eprintln!(
                "graceful stop: lease run exited {status:?} after {:?}",
                stopped.elapsed()
            );
        }
        Stop::LostLease => {
            let key = key_for_name(&name);
            let holder = c.held_advisory_keys().expect("pg_locks");
            let holder = holder.iter().find(|&&(k, _)| k == key).expect("held");
            assert!(c.terminate_backend(holder.1).expect("terminate"));
            r.wait_for_line(|l| l.contains("the command stopped"), MS(10_000))
                .expect("the runner stopped its command");
        }
        Stop::RunnerKilled => {
            r.kill9().expect("kill -9");
            let _ = r.wait_exit(MS(5_000));
        }
        // The watchdog kills at the kill deadline, within the guard (2.1 s).
        Stop::RunnerFrozen => r.sigstop().expect("SIGSTOP"),
    }
    let left = wait_tree_gone(token, MS(5_000));
    let took = stopped.elapsed();
    let (n1, n2) = growth(&esc_file);
    eprintln!(
        "{stop:?}: the command's tree before the stop: {before:?}; {:?} after the stop: left \
         {left:?}; the escaped writer (pid {esc}, alive: {}) wrote {n1} -> {n2} lines in the \
         next 300 ms",
        took,
        pid_alive(esc),
    );
    let escaped = pid_alive(esc);
    // Nothing of a failed run may keep writing after the test.
    for &(p, _) in &left {
        // SAFETY: kill of a process of this test's command tree.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    assert!(
        left.is_empty() && !escaped && n1 == n2,
        "{stop:?}: processes of the command's tree (LEASE_TOKEN={token}) outlived the stop: \
         {left:?}; the escaped writer (pid {esc}) wrote {n1} -> {n2} lines in 300 ms\n--- \
         stderr ---\n{}",
        stderr_of(&r)
    );
}

#[test]
fn escaped_descendant_dies_at_a_graceful_stop() {
    escaped_descendant_dies_with_the_command(Stop::Graceful);
}

#[test]
fn escaped_descendant_dies_at_a_lost_lease() {
    escaped_descendant_dies_with_the_command(Stop::LostLease);
}

#[test]
fn escaped_descendant_dies_with_a_killed_runner() {
    escaped_descendant_dies_with_the_command(Stop::RunnerKilled);
}

#[test]
fn escaped_descendant_dies_at_the_watchdog_deadline_of_a_frozen_runner() {
    escaped_descendant_dies_with_the_command(Stop::RunnerFrozen);
}

/// A session ended while a leftover is stopped: the command exits at once,
/// leaving a `setsid` writer that ignores SIGTERM; `lease run` holds the key
/// while it stops the leftover (`--grace` 10 s). The holder's session is
/// terminated meanwhile: the server frees the key, so the leftover must die
/// before the standby's command starts, not at the end of `--grace`.
#[test]
fn leftover_of_an_exited_command_is_dead_before_the_standby_starts() {
    let c = cluster();
    let dir = Dir::new("hole2-leftover");
    let name = unique("hole2-leftover");
    let d = dir.path().display();
    let leaver = format!(
        r#"setsid bash -c 'trap "" TERM; while :; do date +%s%N >> {d}/leftover; sleep 0.01; done' & echo "pid=$$ token=$LEASE_TOKEN"; sleep 0.3; exit 0"#
    );
    let url = c.url("postgres");
    let a = Replica::spawn(run_sh(&url, &["--grace", "10s"], &name, &leaver)).expect("a");
    assert!(wait_commands(&[&a], 1, MS(10_000)), "a did not lead");
    a.wait_for_line(
        |l| l.contains("processes left in the command's tree"),
        MS(5_000),
    )
    .expect("a stops the leftover");
    let b = Replica::spawn(run_sh(&url, &[], &name, &stubborn_stamper(dir.path()))).expect("b");
    b.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("b stands by");
    let key = key_for_name(&name);
    let holder = c.held_advisory_keys().expect("pg_locks");
    let holder = holder.iter().find(|&&(k, _)| k == key).expect("a holds");
    let start = Instant::now();
    assert!(c.terminate_backend(holder.1).expect("terminate"));
    assert!(wait_commands(&[&b], 1, MS(15_000)), "b did not lead");
    let pid_b = commands(&b)[0];
    let first_b = loop {
        if let Some(&(first, _)) = intervals(dir.path()).get(&pid_b) {
            break first;
        }
        assert!(start.elapsed() < MS(15_000), "b's command did not stamp");
        std::thread::sleep(MS(5));
    };
    // Wait for the leftover to stop writing (at most --grace).
    let mut last = 0;
    for _ in 0..120 {
        std::thread::sleep(MS(100));
        let now = fs::read_to_string(dir.path().join("leftover")).map_or(0, |s| s.lines().count());
        if now == last {
            break;
        }
        last = now;
    }
    let last_leftover = fs::read_to_string(dir.path().join("leftover"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<u128>().ok())
        .next_back()
        .unwrap_or(0);
    let overlap = (last_leftover as f64 - first_b as f64) / 1e6;
    eprintln!(
        "pg_terminate_backend while `lease run` stops a SIGTERM-ignoring leftover (--grace \
         10s): the leftover's last stamp is {overlap:.1} ms after b's command's first"
    );
    assert!(
        overlap < 0.0,
        "the leftover of a's exited command ran {overlap:.1} ms into b's command\n--- a's \
         stderr ---\n{}",
        stderr_of(&a)
    );
}

/// The partitioned counterpart of the session-end tests: a graceful stop (the
/// key held until the command is gone, `--grace` 10 s) whose session goes
/// silent (a partition: the holder's heartbeat times out, the session is
/// given up on and closed at the guard deadline, and the server frees the key
/// by then too). The SIGTERM-ignoring command must be dead before the
/// standby's command starts.
#[test]
fn graceful_stop_on_a_partitioned_session_ends_before_the_standby_starts() {
    let c = cluster();
    let proxy =
        lease_tests::FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], c.port())))
            .expect("proxy");
    let dir = Dir::new("graceful-partition");
    let name = unique("graceful-partition");
    // Validity 700 ms, guard 1 s, --grace 10 s.
    let short = SHORT;
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let a = Replica::spawn(run_sh(
        &via_proxy,
        &short,
        &name,
        &stubborn_stamper(dir.path()),
    ))
    .expect("a");
    assert!(wait_commands(&[&a], 1, MS(10_000)), "a did not lead");
    let pid_a = commands(&a)[0];
    let b = Replica::spawn(run_sh(
        &c.url("postgres"),
        &short,
        &name,
        &stubborn_stamper(dir.path()),
    ))
    .expect("b");
    b.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("b stands by");
    a.sigterm().expect("SIGTERM to a");
    a.wait_for_line(|l| l.contains("stopping the command"), MS(5_000))
        .expect("a stops its command");
    std::thread::sleep(MS(100));
    proxy.set_mode(lease_tests::Mode::BlackHole);
    assert!(wait_commands(&[&b], 1, MS(15_000)), "b did not lead");
    let a_gone = wait_gone(pid_a, MS(15_000));
    std::thread::sleep(MS(200));
    let worst = worst_overlap(dir.path());
    let said: Vec<String> = a
        .lines()
        .iter()
        .filter(|l| l.text.contains("during the graceful stop"))
        .map(|l| l.text.clone())
        .collect();
    eprintln!(
        "partition during a graceful stop (--grace 10s, guard 1s): a's command gone: {a_gone}; \
         worst overlap {:?} ms; a said: {said:?}",
        worst.map(|(w, p, q)| format!("{w:.1} ({p}, {q})"))
    );
    let (overlap, p, q) = worst.expect("two commands stamped");
    assert!(
        overlap < 0.0,
        "a partition during a graceful stop: commands {p} and {q} ran at once for {overlap:.1} \
         ms\n--- a's stderr ---\n{}",
        stderr_of(&a)
    );
}

/// After `pg_terminate_backend` of the holder's session, what the log says
/// about the watchdog is the loss the runner reported, with its reason, never
/// a runner that stopped renewing (which reads like a frozen runner); and a
/// command that exits on SIGTERM by itself gets no watchdog WARN at all.
/// Each command ignores SIGTERM (`deaf`: the kill deadline the runner set
/// after the loss fires) or exits 0 at SIGTERM.
#[test]
fn a_terminated_session_is_named_in_the_watchdogs_line() {
    let c = cluster();
    for deaf in [true, false] {
        let name = unique("wdline");
        let script = if deaf {
            r#"echo "pid=$$"; trap "" TERM; while :; do sleep 0.01; done"#
        } else {
            r#"echo "pid=$$"; trap "exit 0" TERM; sleep 1000 & wait"#
        };
        let mut r = Replica::spawn(fast_sh(&c, &name, &[], script)).expect("spawn lease run");
        started(&r, MS(10_000)).expect("the command starts");
        std::thread::sleep(MS(300));
        let key = key_for_name(&name);
        let holder = c.held_advisory_keys().expect("pg_locks");
        let backend = holder.iter().find(|&&(k, _)| k == key).expect("held").1;
        assert!(c.terminate_backend(backend).expect("terminate"));
        r.wait_for_line(|l| l.contains("the command stopped"), MS(10_000))
            .expect("the command stops");
        // The watchdog's line, if any, comes at the kill deadline (half the
        // lock delay after the loss); its `done` soon after the stop.
        std::thread::sleep(MS(300));
        r.sigterm().expect("SIGTERM");
        let _ = r.wait_exit(MS(15_000)).expect("lease run exits");
        let err = stderr_of(&r);
        let watchdog: Vec<&str> = err.lines().filter(|l| l.contains("watchdog:")).collect();
        eprintln!(
            "SIGTERM-deaf command: {deaf}; the watchdog's lines: {watchdog:#?}\n--- stderr ---\n{err}"
        );
        for line in &watchdog {
            assert!(!line.contains("did not renew"), "{line}");
            assert!(line.contains("the lease was lost"), "{line}");
            assert!(line.contains("administrator command"), "{line}");
        }
        if !deaf {
            assert!(
                !watchdog.iter().any(|l| l.contains("WARN")),
                "a watchdog WARN for a command that exited at SIGTERM: {watchdog:#?}"
            );
        }
    }
}
