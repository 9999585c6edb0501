//! `lease run`'s life with its command: the environment it gives the command, the exit
//! status passed through, leftovers stopped, a lost lease stopping the whole group, a
//! killed runner taking its command along, SIGTERM, usage errors, and a password never
//! printed.

use crate::common::*;
use lease_proto::key_for_name;
use lease_tests::pid_alive;
use lease_tests::Cluster;
use lease_tests::Replica;
use std::io::ErrorKind;
use std::net::TcpListener;
use std::time::Duration;
use std::time::Instant;

#[test]
fn child_sees_lease_name_key_and_token() {
    let c = cluster();
    let name = unique("env");
    let script = r#"echo "name=$LEASE_NAME key=$LEASE_KEY token=$LEASE_TOKEN""#;
    let (status, out, err, _) = output(fast_sh(&c, &name, &["--quiet"], script), MS(10_000));
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
        let (status, _, err, took) = output(fast_sh(&c, &name, &[], script), MS(10_000));
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
    let (status, out, err, took) = output(fast_sh(&c, &name, &[], script), MS(10_000));
    assert!(status.success(), "{status}: {err}");
    let grandchild = field(&out, "grandchild").expect("pid") as i32;
    assert!(
        gone_at(grandchild, MS(1_000)).is_some(),
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
    let r = Replica::spawn(fast_sh(&c, &name, &[], script)).expect("spawn");
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
    let watch = |pid: i32| std::thread::spawn(move || gone_at(pid, MS(10_000)));
    let (child_watch, grandchild_watch) = (watch(child), watch(grandchild));
    let start = Instant::now();
    let app = app(&name);
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
    assert!(gone_at(child2, MS(2_000)).is_some());
    assert!(gone_at(grandchild2, MS(2_000)).is_some());
    assert!(!held(&c, key_for_name(&name)));
}

#[test]
fn runner_killed_with_sigkill_takes_its_child_along() {
    let c = cluster();
    let name = unique("pdeath");
    let mut r =
        Replica::spawn(fast_sh(&c, &name, &[], "echo child=$$; exec sleep 1000")).expect("spawn");
    let (_, line) = r
        .wait_for_line(|l| l.starts_with("child="), MS(10_000))
        .expect("the child started");
    let child = field(&line, "child").expect("child pid") as i32;
    assert!(pid_alive(child));
    // SIGKILL reaches the runner only: the child has its own process group.
    let start = Instant::now();
    r.kill9().expect("SIGKILL the runner");
    let gone = gone_at(child, MS(5_000)).expect("the child died with its runner") - start;
    eprintln!("kill -9 of the runner: its child was gone {gone:?} later (PR_SET_PDEATHSIG)");
    let _ = r.wait_exit(MS(5_000));
    assert!(gone < MS(1_000), "{gone:?}");
}

#[test]
fn runner_killed_with_sigkill_takes_the_whole_group_along() {
    let c = cluster();
    let name = unique("pdeath-group");
    let script = "sleep 1000 & echo grandchild=$!; wait";
    let mut r = Replica::spawn(fast_sh(&c, &name, &[], script)).expect("spawn");
    let (_, line) = r
        .wait_for_line(|l| l.starts_with("grandchild="), MS(10_000))
        .expect("the command started");
    let grandchild = field(&line, "grandchild").expect("pid") as i32;
    let (_, line) = r
        .wait_for_line(|l| l.contains("leading: started"), MS(1_000))
        .expect("the leading line");
    let watchdog = field(&line, "watchdog_pid").expect("watchdog pid") as i32;
    assert!(pid_alive(grandchild) && pid_alive(watchdog));
    let start = Instant::now();
    r.kill9().expect("SIGKILL the runner");
    let gone = gone_at(grandchild, MS(5_000)).expect("the grandchild died with its runner");
    let dog_gone = gone_at(watchdog, MS(5_000)).expect("the watchdog exited");
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
        fast_sh(&c, &unique("grace-warning"), &["--grace", "10s"], "true"),
        MS(10_000),
    );
    assert_eq!(status.code(), Some(0), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("--grace")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains(
            "--grace 10s applies in full to graceful stops (a shutdown, a hand-over); after a \
             lost lease the command is killed sooner, before the server may hand the lease to \
             another replica: 343ms after SIGTERM at the latest"
        ),
        "{}",
        warnings[0]
    );
    // FAST's --grace 300ms is within the margin: no warning.
    let (status, _, err, _) = output(fast_sh(&c, &unique("no-warning"), &[], "true"), MS(10_000));
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("--grace"), "{err}");
    // Without the server guard: what bounds the command instead.
    let (status, _, err, _) = output(
        fast_sh(&c, &unique("no-guard"), &["--no-server-guard"], "true"),
        MS(10_000),
    );
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("--no-server-guard: ")
            && err.contains("gets SIGKILL --grace 300ms after SIGTERM"),
        "{err}"
    );
}

/// A SIGTERM that reaches `lease run` while its command is starting (here: sent by the
/// command itself, first thing, to its watchdog's parent) stops the command as any shutdown
/// does: SIGTERM, its trap runs, the lease is released, exit 0. (The runner counted itself
/// leading only once the watchdog reported the start: a signal before that report made it
/// exit as a standby would, and the watchdog SIGKILLed the command. That order is up to the
/// scheduler, so this test sees the old fault only on a loaded machine:
/// `lease_run_as_pid_1_stops_its_tree_and_releases_on_sigterm` met it once that way.)
#[test]
fn a_signal_while_the_command_starts_stops_it_gracefully() {
    let c = cluster();
    // Shell builtins only (no fork): the signal comes before the runner hears of the start.
    let script = r#"trap "echo stop; exit 0" TERM; read -r _ _ _ runner _ < /proc/$PPID/stat; kill -TERM "$runner"; echo start; while :; do sleep 0.02; done"#;
    for _ in 0..3 {
        let (status, out, err, _) =
            output(fast_sh(&c, &unique("early-term"), &[], script), MS(10_000));
        assert_eq!(status.code(), Some(0), "{err}");
        assert!(
            out.lines().any(|l| l == "stop"),
            "no graceful stop:\n{out}\n{err}"
        );
        assert!(!err.contains("SIGKILL to the command's tree"), "{err}");
        assert!(err.contains("lease released"), "{err}");
    }
}

/// The child of a handover test: prints `start TOKEN`, on SIGTERM `stop`.
const ANNOUNCE: &str = r#"echo "start token=$LEASE_TOKEN"; trap "echo stop; exit 0" TERM; while :; do sleep 0.02; done"#;

/// A runner of `name` with the options `extra` whose command is [`ANNOUNCE`].
fn announcing(c: &Cluster, name: &str, extra: &[&str]) -> Replica {
    Replica::spawn(fast_sh(c, name, extra, ANNOUNCE)).expect("spawn")
}

/// An [`announcing`] runner of `name` without options, once its command started; its
/// fencing token.
fn leading(c: &Cluster, name: &str) -> (Replica, i64) {
    let a = announcing(c, name, &[]);
    let (_, line) = a
        .wait_for_line(|l| l.starts_with("start"), MS(10_000))
        .expect("a leads");
    (a, field(&line, "token").expect("token"))
}

/// Waits until `r` stands by.
fn stands_by(r: &Replica) {
    r.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("stands by");
}

/// `b` takes the lease over from `a`: b's command starts within `within` and a's command
/// got SIGTERM; when b's command started, its token, and when a's command stopped.
fn takes_over(b: &Replica, a: &Replica, within: Duration) -> (Instant, i64, Instant) {
    let (started, line) = b
        .wait_for_line(|l| l.starts_with("start"), within)
        .expect("b takes over");
    let (stopped, _) = a
        .wait_for_line(|l| l == "stop", MS(1_000))
        .expect("a's command got SIGTERM");
    (started, field(&line, "token").expect("token"), stopped)
}

#[test]
fn sigterm_while_leading_hands_over_to_the_standby_at_once() {
    let c = cluster();
    let name = unique("handover");
    let (mut a, token_a) = leading(&c, &name);
    // B polls only every 5 s: a takeover within tens of ms is the handover
    // notification, not polling.
    let b = announcing(&c, &name, &["--retry-interval", "5s"]);
    stands_by(&b);
    let (_, held_by) = b
        .wait_for_line(|l| l.contains("the lease is held by"), MS(5_000))
        .expect("b says who holds the lease");
    assert!(held_by.contains(&app(&name)), "{held_by}");

    let signalled = Instant::now();
    a.sigterm().expect("SIGTERM a");
    let (started, token_b, stopped) = takes_over(&b, &a, MS(10_000));
    let status = a.wait_exit(MS(5_000)).expect("a exits");
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
    let (a, _) = leading(&c, &name);
    let mut b = announcing(&c, &name, &[]);
    stands_by(&b);
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
/// Two slips a first try makes get a hint in their one line: a command without the `--`
/// before it, and a URL whose `://` is mistyped (its password never printed).
#[test]
fn usage_hints_for_a_missing_separator_and_a_mistyped_url() {
    let out = lease()
        .args(["run", "job", "./job.sh", "--batch", "5"])
        .output()
        .expect("run lease");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("unexpected argument './job.sh' found")
            && err.contains("the command goes after `--`: lease run [OPTIONS] NAME -- ./job.sh"),
        "{err}"
    );
    for (how, set) in [
        ("--database-url", None),
        ("DATABASE_URL", Some("postgres//app:sekrit@db.internal/app")),
    ] {
        let mut cmd = lease();
        match set {
            None => cmd.args([
                "run",
                "--database-url",
                "postgres//app:sekrit@db.internal/app",
            ]),
            Some(url) => cmd.env("DATABASE_URL", url).arg("run"),
        };
        let out = cmd.args(["job", "--", "true"]).output().expect("run lease");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{how}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!(
                "from {how}: it starts with `postgres//`, not a URL's `postgres://`"
            )),
            "{how}: {err}"
        );
        assert!(!err.contains("sekrit"), "{err}");
    }
}

type UsageCase<'a> = (&'a str, Vec<&'a str>, Option<(&'a str, &'a str)>);

#[test]
fn usage_errors_exit_2_on_one_line_without_touching_the_database() {
    // A listener that records any connection: none may arrive.
    let db = TcpListener::bind("127.0.0.1:0").expect("bind");
    db.set_nonblocking(true).expect("nonblocking");
    let port = db.local_addr().expect("addr").port();
    let url = format!("postgres://u:pw@127.0.0.1:{port}/x");
    let long_name = "x".repeat(lease_proto::LeaseId::MAX_NAME_LEN);
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
            "an observer with a priority",
            vec!["run", "--observer", "--priority", "1", "job", "--", "true"],
            None,
        ),
        (
            "a priority with shards",
            vec![
                "run",
                "--priority",
                "1",
                "--shards",
                "2",
                "job",
                "--",
                "true",
            ],
            None,
        ),
        (
            "shards without notifications",
            vec!["run", "--no-notify", "--shards", "2", "job", "--", "true"],
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
        (
            "no shards",
            vec!["run", "--shards", "0", "job", "--", "true"],
            None,
        ),
        (
            "too many shards",
            vec!["run", "--shards", "257", "job", "--", "true"],
            None,
        ),
        (
            "a shard's name too long",
            vec!["run", "--shards", "1", &long_name, "--", "true"],
            None,
        ),
        (
            "--wait without --try",
            vec!["run", "--wait", "1s", "job", "--", "true"],
            None,
        ),
        (
            "--try with a zero --wait",
            vec!["run", "--try", "--wait", "0s", "job", "--", "true"],
            None,
        ),
        (
            "--try with shards",
            vec!["run", "--try", "--shards", "2", "job", "--", "true"],
            None,
        ),
        (
            "--try with --observer",
            vec!["run", "--try", "--observer", "job", "--", "true"],
            None,
        ),
        (
            "--try with a priority",
            vec!["run", "--try", "--priority", "1", "job", "--", "true"],
            None,
        ),
        (
            "status: shards without a name",
            vec!["status", "--shards", "2"],
            None,
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

/// Absurd settings are bad usage: exit 2 with one clear line before any
/// connection to the database.
#[test]
fn absurd_intervals_are_a_usage_error() {
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
    let (status, _, err, took) = try_output(cmd, MS(3_000));
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

/// `lease handover NAME --to PID` with two standbys: the named one takes the lease at
/// the holder's release (the holder's command stopped as on SIGTERM first), the other
/// does not, and the command says how long it took.
#[test]
fn handover_to_a_named_standby() {
    let c = cluster();
    let name = unique("handto");
    let (mut a, token_a) = leading(&c, &name);
    // The standbys poll only every 5 s: a takeover within the second is the hand-over.
    let slow = ["--retry-interval", "5s"];
    let b = announcing(&c, &name, &slow);
    let d = announcing(&c, &name, &slow);
    let ready = |r: &Replica| {
        let (_, l) = (r.wait_for_line(|l| l.contains("backend_pid="), MS(10_000)))
            .expect("the session is ready");
        field(&l, "backend_pid").expect("backend_pid")
    };
    let (pid_b, _) = (ready(&b), ready(&d));
    stands_by(&b);
    stands_by(&d);
    let asked = Instant::now();
    let mut cmd = lease();
    cmd.args(["handover", &name, "--to", &pid_b.to_string()])
        .args(["--database-url", &c.url("postgres")]);
    let (status, out, err, _) = output(cmd, MS(15_000));
    let (started, token_b, stopped) = takes_over(&b, &a, MS(5_000));
    eprintln!(
        "handover --to: {} ({:?} after the request, {:?} after a's command stopped)",
        out.trim(),
        started.saturating_duration_since(asked),
        started.saturating_duration_since(stopped)
    );
    assert!(status.success(), "{status}: {err}");
    assert!(
        out.contains(&format!("handed over to backend {pid_b}")),
        "{out}"
    );
    assert!(stopped <= started, "b started before a's command stopped");
    assert!(token_b > token_a);
    std::thread::sleep(MS(300));
    assert!(
        !d.lines().iter().any(|l| l.text.starts_with("start")),
        "the standby not named took the lease"
    );
    // a stands by again (a hand-over is not a shutdown).
    assert!(
        a.wait_exit(MS(200)).is_err(),
        "a exited after the hand-over"
    );
    handover_lines_in_order(&a, pid_b);
    let _ = (a.sigterm(), b.sigterm(), d.sigterm());
}

/// The old holder's lines of a hand-over to backend `to`, when each happens: first that it
/// is handing the lease over (to whom), then its command's stop with the hand-over's reason
/// (not a lease group's, on a lease without one), then the release.
fn handover_lines_in_order(holder: &Replica, to: i64) {
    let (_, err) = texts(holder);
    let at = |what: &str| err.lines().position(|l| l.contains(what));
    let handing = at("handing the lease over to the backend a hand-over request named")
        .unwrap_or_else(|| panic!("no hand-over line:\n{err}"));
    assert!(
        err.lines()
            .nth(handing)
            .unwrap()
            .contains(&format!("to_backend_pid={to}")),
        "{err}"
    );
    let stopping = at("stopping the command's tree").expect("the stop");
    let released = at(" lease released lease=").expect("the release");
    assert!(
        handing < stopping && stopping < released,
        "out of order ({handing}, {stopping}, {released}):\n{err}"
    );
    let stop = err.lines().nth(stopping).unwrap();
    assert!(
        stop.contains("reason=handed over to another session"),
        "{stop}"
    );
    assert!(!err.contains("member of its group"), "{err}");
}

/// The share of `flood` from `t0` in which one of `replicas` (running [`ANNOUNCE`]) led,
/// and their command starts and stops meanwhile.
fn led_share(replicas: &[&Replica], t0: Instant, flood: Duration) -> (f64, Vec<(Instant, bool)>) {
    let mut events: Vec<(Instant, bool)> = (replicas.iter())
        .flat_map(|r| r.lines())
        .filter(|l| l.at >= t0 && (l.text.starts_with("start") || l.text == "stop"))
        .map(|l| (l.at, l.text.starts_with("start")))
        .collect();
    events.sort_by_key(|e| e.0);
    let mut unled = Duration::ZERO;
    let mut stopped_at = None;
    for (at, start) in &events {
        match (start, stopped_at) {
            (false, _) => stopped_at = Some(*at),
            (true, Some(s)) => {
                unled += at.saturating_duration_since(s);
                stopped_at = None;
            }
            (true, None) => {}
        }
    }
    if let Some(s) = stopped_at {
        unled += (t0 + flood).saturating_duration_since(s);
    }
    (1.0 - unled.as_secs_f64() / flood.as_secs_f64(), events)
}

/// A flood of hand-over requests that no standby asked for (any role that can connect may
/// `NOTIFY`): every second for 10 s, `to KEY 99999` (a backend that does not exist) and a
/// `prefer` at the highest priority from the flooder's own backend, which waits for
/// nothing. The holder's command is never interrupted, no standby starts, and the lease
/// stays led throughout. Before the holder checked `pg_locks`, each request stopped the
/// holder's command and every replica left the key to the named backend for two query
/// timeouts: the lease was led 0.1 % of the time.
#[test]
fn a_flood_of_requests_for_backends_that_do_not_wait_never_interrupts_the_holder() {
    let c = cluster();
    let name = unique("flood");
    let key = lease_proto::key_for_name(&name);
    let (a, _) = leading(&c, &name);
    let b = announcing(&c, &name, &[]);
    let d = announcing(&c, &name, &[]);
    stands_by(&b);
    stands_by(&d);
    let t0 = Instant::now();
    for _ in 0..10 {
        c.sql(&format!(
            "SELECT pg_notify('lease_handover_v1', 'to {key} 99999'), \
             pg_notify('lease_handover_v1', concat('prefer {key} ', pg_backend_pid(), ' 1000'))"
        ))
        .expect("NOTIFY");
        std::thread::sleep(MS(1_000));
    }
    let flood = t0.elapsed();
    // Led: from the first start to the end, less every gap between a stop and the next start.
    let (led, events) = led_share(&[&a, &b, &d], t0, flood);
    let refused = stderr_of(&a)
        .lines()
        .filter(|l| l.contains("does not wait for the lease; declined"))
        .count();
    eprintln!(
        "a request flood for {flood:?}: led {:.1} % of it, {} starts and stops, {refused} \
         requests refused by the holder",
        led * 100.0,
        events.len()
    );
    assert!(
        events.is_empty(),
        "the holder's command was interrupted: {events:?}"
    );
    assert!(refused >= 1, "{}", stderr_of(&a));
    let _ = (a.sigterm(), b.sigterm(), d.sigterm());
}

/// `lease handover NAME --to PID` with a PID that waits for nothing of NAME (a mistyped
/// pid: a process that is no backend, or the backend of another lease's holder) never
/// touches the holder: no backend at all is refused with one line and nothing is sent;
/// another session is asked for, and the holder, whose check never finds it waiting for
/// the lease, keeps leading (exit 1 at `--timeout`). Before the checks the holder stopped
/// its command and released the lease to nobody for the hand-over's window.
#[test]
fn handover_to_a_backend_not_waiting_for_the_lease_is_refused() {
    let c = cluster();
    let name = unique("handnot");
    let (a, token_a) = leading(&c, &name);
    let b = announcing(&c, &name, &["--retry-interval", "5s"]);
    stands_by(&b);
    let (other, _) = leading(&c, &unique("handother"));
    let (_, line) = (other.wait_for_line(|l| l.contains("backend_pid="), MS(10_000)))
        .expect("the other lease's session is ready");
    let other_pid = field(&line, "backend_pid").expect("backend_pid");
    let mut wrong = Vec::new();
    for (what, pid) in [
        (
            "no backend (this test's own pid)",
            i64::from(std::process::id()),
        ),
        ("the backend of another lease's holder", other_pid),
    ] {
        let mut cmd = lease();
        cmd.args([
            "handover",
            &name,
            "--to",
            &pid.to_string(),
            "--timeout",
            "2s",
        ])
        .args(["--database-url", &c.url("postgres")]);
        let (status, out, err, took) = output(cmd, MS(15_000));
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        eprintln!("--to {pid} ({what}): {status} after {took:?}, stdout {out:?}, stderr {lines:?}");
        // No session at all: refused at once. Another session: sent, and the holder,
        // whose check never finds it waiting for the lease, keeps leading.
        let said = if pid == other_pid {
            format!("not backend {pid}")
        } else {
            format!("backend {pid} is not a session of this database")
        };
        let refused = status.code() == Some(1)
            && out.is_empty()
            && lines.len() == 1
            && lines[0].contains(&said);
        if !refused {
            wrong.push(format!("--to {pid} ({what}): {status}, {out:?}, {lines:?}"));
        }
    }
    std::thread::sleep(MS(500));
    let stopped = a.lines().iter().any(|l| l.text == "stop");
    let b_started = b.lines().iter().any(|l| l.text.starts_with("start"));
    let (a_out, _) = texts(&a);
    let tokens: Vec<i64> = a_out.lines().filter_map(|l| field(l, "token")).collect();
    assert!(
        wrong.is_empty() && !stopped && !b_started && tokens == [token_a],
        "a hand-over to a backend that waits for nothing of the lease: refused on one line: \
         {}; the holder's command stopped: {stopped}; the standby started: {b_started}; the \
         holder's tokens: {tokens:?}",
        if wrong.is_empty() {
            "yes".to_owned()
        } else {
            format!("no, {wrong:?}")
        }
    );
    let _ = (a.sigterm(), b.sigterm(), other.sigterm());
}

/// `--priority 1` beside a holder of priority 0: the standby asks for the lease at its
/// first try and takes it in one graceful hand-over (the holder's command stopped as on
/// SIGTERM first, a larger token, the old holder standing by again). `--observer` never
/// runs its command: not while the lease is held, nor once both others are killed (kill
/// -9) and the lease is free.
#[test]
fn a_preferred_standby_takes_over_and_an_observer_never_leads() {
    let c = cluster();
    let name = unique("prefer");
    let (mut a, token_a) = leading(&c, &name);
    let observer = announcing(&c, &name, &["--observer"]);
    observer
        .wait_for_line(|l| l.contains("observing the lease"), MS(10_000))
        .expect("the observer reads the holder");
    // b polls only every 5 s: a takeover within the second is the hand-over it asked for.
    let spawned = Instant::now();
    let b = announcing(&c, &name, &["--priority", "1", "--retry-interval", "5s"]);
    let (started, token_b, stopped) = takes_over(&b, &a, MS(5_000));
    eprintln!(
        "FIGURE priority takeover: b led {:?} after it was spawned (connect, setup, try, \
         request, a's stop, release, try), {:?} after a's command stopped",
        started.saturating_duration_since(spawned),
        started.saturating_duration_since(stopped)
    );
    assert!(stopped <= started, "b started before a's command stopped");
    assert!(token_b > token_a);
    assert!(
        a.wait_exit(MS(300)).is_err(),
        "a exited after the hand-over"
    );
    handover_lines_in_order(
        &a,
        field(
            &b.wait_for_line(|l| l.contains("backend_pid="), MS(1_000))
                .expect("b's session")
                .1,
            "backend_pid",
        )
        .expect("backend_pid"),
    );
    // Nobody but the observer is left: the lease is free, and stays unled.
    a.kill9().expect("kill -9 a");
    b.kill9().expect("kill -9 b");
    let key = key_for_name(&name);
    let freed = Instant::now();
    while held(&c, key) {
        assert!(freed.elapsed() < MS(5_000), "the lease was never freed");
        std::thread::sleep(MS(20));
    }
    std::thread::sleep(MS(1_500));
    assert!(!held(&c, key), "someone took the lease");
    let (out, err) = texts(&observer);
    assert!(
        !out.lines().any(|l| l.starts_with("start")),
        "the observer ran its command:\n{out}\n{err}"
    );
    // Its lines say it observes, never that it stands by as a standby would.
    assert!(!err.contains("standing by"), "{err}");
    let _ = observer.sigterm();
}

/// Any role that may connect sends, every 500 ms for 10 s, `prefer KEY <W> 1000` where W
/// is a backend that waits for the key (read from `pg_locks`, which any role may), from its
/// own backend: a `prefer` counts only from the backend it names, so nothing moves. (A
/// first version took the asker's watch session as a fifth word, which a forger could fill
/// in with W: the lease was led 1.3 % of the time.)
#[test]
fn a_forged_prefer_naming_a_waiting_standby_never_strands_the_lease() {
    let c = cluster();
    let name = unique("fprefer");
    let key = lease_proto::key_for_name(&name);
    let (a, _) = leading(&c, &name);
    let b = announcing(&c, &name, &[]);
    let d = announcing(&c, &name, &[]);
    stands_by(&b);
    stands_by(&d);
    std::thread::sleep(MS(300));
    let t0 = Instant::now();
    let mut sent = 0;
    while t0.elapsed() < MS(10_000) {
        let r = c.sql(&format!(
            "SELECT pg_notify('lease_handover_v1', concat('prefer {key} ', w.pid, ' 1000')) \
             FROM (SELECT pid FROM pg_locks WHERE locktype = 'advisory' \
             AND NOT granted AND objsubid = 1 \
             AND ((classid::int8 << 32) | objid::int8) = {key} LIMIT 1) AS w"
        ));
        if r.is_ok() {
            sent += 1;
        }
        std::thread::sleep(MS(500));
    }
    let flood = t0.elapsed();
    let (led, events) = led_share(&[&a, &b, &d], t0, flood);
    let declined = [&a, &b, &d]
        .iter()
        .map(|r| stderr_of(r))
        .collect::<Vec<_>>()
        .join("\n");
    let declined: Vec<&str> = declined
        .lines()
        .filter(|l| l.contains("declin") || l.contains("handed") || l.contains("acquired"))
        .take(6)
        .collect();
    let _ = (a.sigterm(), b.sigterm(), d.sigterm());
    assert!(
        led >= 0.9,
        "a forged-prefer flood ({sent} NOTIFYs in {flood:?}): led {:.1} %, {} starts and stops; \
         e.g. {declined:?}",
        led * 100.0,
        events.len()
    );
}

/// Review 5: with three standbys, the one with the largest backend pid is crowded out of
/// the key's queue (`HERD_WAITERS` = 2) and polls. The core makes a standby named by a
/// request queue for the key whatever the crowd (`the_named_standby_queues_for_the_key_\
/// whatever_the_crowd`), but `lease handover --to` first looks for PID among the key's
/// waiters and refuses: the third standby can never be named.
#[test]
fn handover_to_a_crowded_out_standby_is_not_refused() {
    let c = cluster();
    let name = unique("handcrowd");
    let (a, _) = leading(&c, &name);
    let ready = |r: &Replica| {
        let (_, l) = (r.wait_for_line(|l| l.contains("backend_pid="), MS(10_000)))
            .expect("the session is ready");
        field(&l, "backend_pid").expect("backend_pid")
    };
    let standbys: Vec<Replica> = (0..3).map(|_| announcing(&c, &name, &[])).collect();
    let mut pids: Vec<i64> = standbys.iter().map(ready).collect();
    for s in &standbys {
        stands_by(s);
    }
    std::thread::sleep(MS(500));
    pids.sort();
    let crowded = pids[2];
    let mut cmd = lease();
    cmd.args(["handover", &name, "--to", &crowded.to_string()])
        .args(["--database-url", &c.url("postgres")]);
    let (status, out, err, _) = output(cmd, MS(15_000));
    let _ = a.sigterm();
    for s in &standbys {
        let _ = s.sigterm();
    }
    assert!(
        status.success(),
        "lease handover --to {crowded} (the third standby, pids {pids:?}): {status}: {out}{err}"
    );
}
