//! `lease run --every`: three replicas, the leader killed (`kill -9`), stopped
//! (SIGTERM) and frozen (SIGSTOP) 10 ms before a due time, each replaced: every
//! due time runs at most once, and a due time is missed only in a stated
//! failover window (from the old leader's last confirmation to the new leader's
//! grant plus the clock margin). `lease schedule next` and the usage errors.

use crate::common::*;
use lease_tests::{Cluster, Replica};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PERIOD: Duration = Duration::from_secs(2);

/// The fast intervals' validity (heartbeat 100 ms + query timeout 1 s) plus the
/// guard margin: how long before a fault the old leader may have last been
/// confirmed.
const CONFIRMED_WITHIN: Duration = Duration::from_millis(2_200);

/// The clock margin a new leader leaves to the old one (twice
/// `MAX_CLOCK_ERROR`), and the test's own observation delay.
const MARGIN: Duration = Duration::from_millis(150);

fn replica(c: &Cluster, name: &str, file: &Path, extra: &[&str]) -> Replica {
    let script = format!(
        "echo \"$LEASE_RUN_ID $LEASE_DUE $LEASE_TOKEN\" >> {}",
        file.display()
    );
    let mut args = vec!["--every", "2s"];
    args.extend_from_slice(extra);
    Replica::spawn(fast_sh(c, name, &args, &script)).expect("spawn a replica")
}

/// When the next due time after now + `lead` comes, on this host's clock (the
/// server's: the same host).
fn next_due(lead: Duration) -> SystemTime {
    let now = SystemTime::now() + lead;
    let since = now.duration_since(UNIX_EPOCH).unwrap().as_millis();
    let p = PERIOD.as_millis();
    UNIX_EPOCH + Duration::from_millis(u64::try_from((since / p + 1) * p).unwrap())
}

fn sleep_until(t: SystemTime) {
    if let Ok(d) = t.duration_since(SystemTime::now()) {
        std::thread::sleep(d);
    }
}

/// The replica that started a run last (within the last period).
fn leader(replicas: &[Replica]) -> usize {
    let deadline = Instant::now() + MS(20_000);
    loop {
        let last = replicas
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let at = r
                    .lines()
                    .into_iter()
                    .filter(|l| l.text.contains(": starting sh"))
                    .map(|l| l.at)
                    .max()?;
                Some((at, i))
            })
            .max();
        if let Some((at, i)) = last {
            if at.elapsed() < PERIOD + MS(500) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no replica runs the schedule");
        std::thread::sleep(MS(50));
    }
}

/// The first "leading the schedule" line of any replica after `after`: when
/// the schedule was taken over (this host's clock).
fn taken_over(replicas: &[Replica], after: Instant, base: (Instant, SystemTime)) -> SystemTime {
    let deadline = Instant::now() + MS(20_000);
    loop {
        let at = replicas
            .iter()
            .flat_map(|r| r.lines())
            .filter(|l| l.at > after && l.text.contains("leading the schedule"))
            .map(|l| l.at)
            .min();
        if let Some(at) = at {
            return base.1 + (at - base.0);
        }
        assert!(Instant::now() < deadline, "nobody took the schedule over");
        std::thread::sleep(MS(20));
    }
}

#[test]
fn every_due_time_runs_at_most_once_across_kill_stop_and_freeze() {
    let (_, missed) = kill_stop_and_freeze(&[]);
    eprintln!("without a state table, missed in failover windows: {missed:?}");
}

/// A new state table `PREFIX_PID` on `c`, made with `lease schedule init`.
fn state_table(c: &Cluster, prefix: &str) -> String {
    let table = format!("{prefix}_{}", std::process::id());
    let out = lease()
        .args(["schedule", "init", "--state-table", &table])
        .args(["--database-url", &c.url("postgres")])
        .output()
        .expect("lease schedule init");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    table
}

#[test]
fn with_a_state_table_every_due_time_runs_exactly_once_across_kill_stop_and_freeze() {
    let c = cluster();
    let table = state_table(&c, "schedules");
    let (name, missed) =
        kill_stop_and_freeze(&["--state-table", &table, "--catch-up-policy", "all"]);
    assert!(missed.is_empty(), "missed with a state table: {missed:?}");
    // `lease status --state-table` shows the last run and the next due time.
    let out = lease()
        .args(["status", &name, "--state-table", &table, "--json"])
        .args(["--database-url", &c.url("postgres")])
        .output()
        .expect("lease status");
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.contains("\"schedule_name\""))
        .unwrap_or_else(|| panic!("no schedule row: {text}"));
    let row: serde_json::Value = serde_json::from_str(row).expect("JSON");
    assert_eq!(row["schedule"], "every 2s", "{row}");
    assert_eq!(row["outcome"], "ok", "{row}");
    assert!(
        row["run_id"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{name}@")),
        "{row}"
    );
}

/// Three replicas of `lease run --every 2s EXTRA`, the leader killed, stopped
/// and frozen 10 ms before due times: no due time runs twice, none is missed
/// outside a failover window, the thawed leader runs nothing. The lease name, and
/// the due times missed (in a window).
fn kill_stop_and_freeze(extra: &[&str]) -> (String, Vec<String>) {
    let c = cluster();
    let name = unique("every-2s");
    let dir = Dir::new("every-2s");
    let file = dir.file("runs");
    let base = (Instant::now(), SystemTime::now());
    let mut replicas: Vec<Replica> = (0..3).map(|_| replica(&c, &name, &file, extra)).collect();
    leader(&replicas);
    let mut windows = Vec::new();
    let mut thawed = None;
    for fault in ["kill -9", "SIGTERM", "freeze"] {
        // Two runs on the leader, then the fault 10 ms before a due time.
        let l = leader(&replicas);
        let due = next_due(PERIOD * 2);
        sleep_until(due - MS(10));
        let at = Instant::now();
        let fault_time = SystemTime::now();
        match fault {
            "kill -9" => replicas[l].kill9().expect("kill -9"),
            "SIGTERM" => replicas[l].sigterm().expect("SIGTERM"),
            _ => replicas[l].sigstop().expect("SIGSTOP"),
        }
        let took = taken_over(&replicas, at, base);
        eprintln!(
            "{fault} 10 ms before a due time: the schedule taken over {:?} after the fault",
            took.duration_since(fault_time).unwrap_or_default()
        );
        windows.push((fault, fault_time - CONFIRMED_WITHIN, took + MARGIN));
        if fault == "freeze" {
            // Thawed long after its lease ended: it must run nothing.
            std::thread::sleep(MS(1_500));
            replicas[l].sigcont().expect("SIGCONT");
            thawed = Some((l, Instant::now()));
        } else {
            let _ = replicas[l].wait_exit(MS(10_000));
            replicas[l] = replica(&c, &name, &file, extra);
        }
    }
    // Two more runs after the last fault.
    sleep_until(next_due(PERIOD * 2) + MS(300));
    let ended = SystemTime::now() - MS(300);
    for r in &replicas {
        let _ = r.sigterm();
    }
    for r in &mut replicas {
        let _ = r.wait_exit(MS(10_000));
    }

    let text = std::fs::read_to_string(&file).expect("the runs file");
    let mut runs: BTreeMap<u64, usize> = BTreeMap::new();
    for line in text.lines() {
        let id = line.split_whitespace().next().expect("a run id");
        let secs: u64 = id
            .rsplit_once('@')
            .and_then(|(_, s)| s.parse().ok())
            .unwrap_or_else(|| panic!("a run id NAME@SECS: {line}"));
        *runs.entry(secs).or_default() += 1;
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "due times run twice: {twice:?}\n{text}");
    let (l, thaw) = thawed.expect("the freeze");
    let after_thaw: Vec<String> = replicas[l]
        .lines()
        .into_iter()
        .filter(|x| x.at > thaw && x.text.contains(": starting sh"))
        .map(|x| x.text)
        .collect();
    assert!(
        after_thaw.is_empty(),
        "the thawed replica ran: {after_thaw:?}"
    );
    // Every due time from the first run to the end ran, or fell in a window.
    let first_due = runs.keys().next().copied().expect("a run");
    let mut t = UNIX_EPOCH + Duration::from_secs(first_due);
    let mut missed = Vec::new();
    while t <= ended {
        let secs = t.duration_since(UNIX_EPOCH).unwrap().as_secs();
        if !runs.contains_key(&secs) {
            let window = windows.iter().find(|(_, from, to)| *from <= t && t <= *to);
            match window {
                Some((fault, _, _)) => missed.push(format!("{secs} ({fault})")),
                None => panic!(
                    "due time {secs} missed outside every failover window {windows:?}:\n{text}"
                ),
            }
        }
        t += PERIOD;
    }
    eprintln!(
        "every 2s {extra:?} across kill -9, SIGTERM and freeze: {} due times ran once, none \
         twice; missed in failover windows: {missed:?}",
        runs.len()
    );
    (name, missed)
}

/// `lease schedule next --cron '30 2 * * *' --tz Europe/Berlin --from FROM -n 3`'s lines.
fn nightly_berlin_from(from: &str) -> Vec<String> {
    let out = lease()
        .args([
            "schedule",
            "next",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
        ])
        .args(["--from", from, "-n", "3"])
        .output()
        .expect("lease schedule next");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    text.lines().map(str::to_owned).collect()
}

#[test]
fn schedule_next_states_the_dst_rules() {
    let lines = nightly_berlin_from("2026-03-28T12:00:00Z");
    assert_eq!(lines[0], "cron \"30 2 * * *\" in Europe/Berlin");
    assert!(
        lines[1].starts_with("2026-03-29T01:00:00Z  2026-03-29T03:00:00+02:00[Europe/Berlin]"),
        "the skipped 02:30 is due at the end of the gap: {lines:?}"
    );
    assert!(lines[1].contains("end of the gap"), "{lines:?}");
    let lines = nightly_berlin_from("2026-10-24T12:00:00Z");
    assert!(
        lines[1].starts_with("2026-10-25T00:30:00Z  2026-10-25T02:30:00+02:00[Europe/Berlin]"),
        "the repeated 02:30 is due once, at its first pass: {lines:?}"
    );
    assert!(lines[1].contains("first pass"), "{lines:?}");
    assert!(
        lines[2].starts_with("2026-10-26T01:30:00Z"),
        "and not again an hour later: {lines:?}"
    );
}

#[test]
fn bad_schedules_are_usage_errors() {
    for (args, says) in [
        (
            &["--every", "500ms"][..],
            "--every: the period must be at least 1000 ms",
        ),
        (&["--cron", "0 3 * *"][..], "has 4 fields"),
        (
            &["--cron", "0 3 * * *", "--tz", "Mars/Base"][..],
            "unknown time zone",
        ),
        (
            &["--every", "2s", "--jitter", "2s"][..],
            "--jitter: the jitter (2s) must be shorter than the period (2s)",
        ),
        (&["--every", "2s", "--try"][..], "cannot be used with"),
        (&["--tz", "UTC"][..], "--cron"),
        (&["--overlap", "queue"][..], "required"),
        (
            &["--every", "1s", "--catch-up", "3h"][..],
            "--catch-up: the catch-up window (3h) may cover at most 10000 due times",
        ),
        (
            &["--every", "2s", "--catch-up-policy", "all"][..],
            "needs a catch-up window",
        ),
        (
            &["--every", "2s", "--state-table", "a;b"][..],
            "--state-table \"a;b\": a table name",
        ),
    ] {
        let mut cmd = lease();
        cmd.args(["run", "--database-url", "host=127.0.0.1 port=1"])
            .args(args)
            .args(["job", "--", "true"]);
        let (status, _, err, _) = output(cmd, MS(5_000));
        assert_eq!(status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should say {says:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
}

/// The run ids' due seconds in the runs file.
fn due_secs_in(file: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .rsplit_once('@')?
                .1
                .parse()
                .ok()
        })
        .collect()
}

/// A claim under way when the lease is lost does not lose its due time. The leader A
/// sends its claim of due time X; the statement is slow on the server (the schedule's row
/// is locked by another transaction for a moment, as under load), and A's lease is lost
/// meanwhile (its session terminated). Either the server aborts the claim before A stops
/// waiting, or A records the landed claim as never started: the next leader B runs X
/// (`--catch-up-policy all`). It used to be dropped by A, land later, and be skipped by B
/// as claimed and unfinished: X ran nowhere.
#[test]
fn a_claim_dropped_at_a_lease_loss_does_not_lose_its_due_time() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let c = cluster();
    let table = state_table(&c, "schedules_hunt");
    let name = unique("claim-drop");
    let dir = Dir::new("claim-drop");
    let file = dir.file("runs");
    let extra = ["--state-table", table.as_str(), "--catch-up-policy", "all"];
    let mut a = replica(&c, &name, &file, &extra);
    // A leads and runs.
    let deadline = Instant::now() + MS(20_000);
    while due_secs_in(&file).is_empty() {
        assert!(Instant::now() < deadline, "A never ran");
        std::thread::sleep(MS(50));
    }
    let mut b = replica(&c, &name, &file, &extra);
    std::thread::sleep(MS(1_000));
    // Another transaction holds the schedule's row for a moment.
    let mut holder = std::process::Command::new(c.psql())
        .args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-h",
            c.host(),
            "-p",
            &c.port().to_string(),
        ])
        .args(["-U", "postgres", "-d", "postgres"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("psql");
    let mut stdin = holder.stdin.take().unwrap();
    let mut stdout = BufReader::new(holder.stdout.take().unwrap());
    // Lock it just after a due time ran, then wait for the next due time X.
    let x = next_due(MS(1_200));
    sleep_until(x - MS(1_000));
    writeln!(
        stdin,
        "BEGIN; SELECT 1 FROM {table} WHERE name = '{name}' FOR UPDATE; \\echo locked"
    )
    .unwrap();
    let mut line = String::new();
    while !line.contains("locked") {
        line.clear();
        stdout.read_line(&mut line).unwrap();
    }
    sleep_until(x + MS(400));
    // A's claim of X waits on the row; A's lease session is terminated.
    let key = lease_proto::key_for_name(&name);
    let holders: Vec<i32> = c
        .held_advisory_keys()
        .unwrap()
        .into_iter()
        .filter(|&(k, _)| k == key)
        .map(|(_, pid)| pid)
        .collect();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert!(c.terminate_backend(holders[0]).unwrap());
    std::thread::sleep(MS(1_500));
    writeln!(stdin, "COMMIT;").unwrap();
    drop(stdin);
    let _ = holder.wait();
    // Two more due times.
    std::thread::sleep(PERIOD * 2 + MS(500));
    for r in [&a, &b] {
        let _ = r.sigterm();
    }
    let _ = a.wait_exit(MS(10_000));
    let _ = b.wait_exit(MS(10_000));
    let x_secs = x.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let ran = due_secs_in(&file);
    let said = |r: &Replica| -> Vec<String> {
        r.lines()
            .into_iter()
            .map(|l| l.text)
            .filter(|t| t.contains(&format!("@{x_secs}")))
            .collect()
    };
    let row = c
        .sql(&format!(
            "SELECT due, token, started, finished, outcome FROM {table} WHERE name = '{name}'"
        ))
        .unwrap();
    assert!(
        ran.contains(&x_secs),
        "due time {x_secs} ran nowhere: runs {ran:?}\nA said {:?}\nB said {:?}\nrow now: {row}",
        said(&a),
        said(&b)
    );
}

/// A run that finished is not run again when the table is briefly unreachable as it
/// ends (renamed away for a second, as in a failover) and the leader is then stopped
/// gracefully (a deploy): its end is tried again until recorded, the lease held
/// meanwhile, so the new leader with `--unfinished retry` reads it as finished. (Three
/// attempts 200 ms apart used to give up, and the due time ran twice.)
#[test]
fn a_finished_run_whose_end_was_not_recorded_is_not_run_again() {
    let c = cluster();
    let table = state_table(&c, "schedules_retry");
    let name = unique("retry-finished");
    let dir = Dir::new("retry-finished");
    let file = dir.file("runs");
    let script = format!(
        "echo \"$LEASE_RUN_ID $LEASE_DUE $LEASE_TOKEN\" >> {}; sleep 0.6",
        file.display()
    );
    let args = [
        "--every",
        "2s",
        "--state-table",
        table.as_str(),
        "--unfinished",
        "retry",
    ];
    let mut a = Replica::spawn(fast_sh(&c, &name, &args, &script)).unwrap();
    let deadline = Instant::now() + MS(20_000);
    while due_secs_in(&file).is_empty() {
        assert!(Instant::now() < deadline, "A never ran");
        std::thread::sleep(MS(50));
    }
    let mut b = Replica::spawn(fast_sh(&c, &name, &args, &script)).unwrap();
    std::thread::sleep(MS(1_000));
    let x = next_due(MS(300));
    sleep_until(x + MS(300));
    // The run of X goes (0.6 s); its end finds the table away.
    c.sql(&format!("ALTER TABLE {table} RENAME TO {table}_away"))
        .unwrap();
    sleep_until(x + MS(1_200));
    c.sql(&format!("ALTER TABLE {table}_away RENAME TO {table}"))
        .unwrap();
    // A deploy stops A before its next due time.
    a.sigterm().unwrap();
    let _ = a.wait_exit(MS(10_000));
    std::thread::sleep(MS(3_000));
    b.sigterm().unwrap();
    let _ = b.wait_exit(MS(10_000));
    let x_secs = x.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let ran = due_secs_in(&file);
    let times = ran.iter().filter(|&&d| d == x_secs).count();
    let said = |r: &Replica| -> Vec<String> {
        r.lines()
            .into_iter()
            .map(|l| l.text)
            .filter(|t| t.contains(&format!("@{x_secs}")) || t.contains("state table"))
            .collect()
    };
    assert_eq!(
        times,
        1,
        "due time {x_secs} ran {times} times: runs {ran:?}\nA said {:#?}\nB said {:#?}",
        said(&a),
        said(&b)
    );
}

/// A claim that waits on a locked row past its timeout is aborted by the server, and a
/// retry that finds the
/// leader's own claim runs the due time. One leader, no fault but a slow claim: the
/// schedule's row is held by another transaction for 2.5 s around due time X
/// (`--query-timeout` is 1 s here). The server aborts the first claim before the client
/// stops waiting; the retry wins, and X runs. (The first claim used to commit when the row
/// freed and the retry was refused: X never ran, and the row said it ran.)
#[test]
fn a_claim_that_timed_out_and_landed_still_runs_its_due_time() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let c = cluster();
    let table = state_table(&c, "schedules_slow");
    let name = unique("slow-claim");
    let dir = Dir::new("slow-claim");
    let file = dir.file("runs");
    let extra = ["--state-table", table.as_str(), "--every", "4s"];
    let script = format!("echo \"$LEASE_RUN_ID\" >> {}", file.display());
    let mut a = Replica::spawn(fast_sh(&c, &name, &extra, &script)).unwrap();
    let deadline = Instant::now() + MS(20_000);
    while due_secs_in(&file).is_empty() {
        assert!(Instant::now() < deadline, "A never ran");
        std::thread::sleep(MS(50));
    }
    let mut holder = std::process::Command::new(c.psql())
        .args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-h",
            c.host(),
            "-p",
            &c.port().to_string(),
        ])
        .args(["-U", "postgres", "-d", "postgres"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("psql");
    let mut stdin = holder.stdin.take().unwrap();
    let mut stdout = BufReader::new(holder.stdout.take().unwrap());
    // X: a due time of `--every 4s` at least 1.5 s away.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let x_ms = ((now + 1_500) / 4_000 + 1) * 4_000;
    let x = UNIX_EPOCH + Duration::from_millis(u64::try_from(x_ms).unwrap());
    sleep_until(x - MS(500));
    writeln!(
        stdin,
        "BEGIN; SELECT 1 FROM {table} WHERE name = '{name}' FOR UPDATE; \\echo locked"
    )
    .unwrap();
    let mut line = String::new();
    while !line.contains("locked") {
        line.clear();
        stdout.read_line(&mut line).unwrap();
    }
    sleep_until(x + MS(2_000));
    writeln!(stdin, "COMMIT;").unwrap();
    drop(stdin);
    let _ = holder.wait();
    std::thread::sleep(MS(2_500));
    let _ = a.sigterm();
    let _ = a.wait_exit(MS(10_000));
    let x_secs = x.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let ran = due_secs_in(&file);
    let said: Vec<String> = a
        .lines()
        .into_iter()
        .map(|l| l.text)
        .filter(|t| t.contains(&format!("@{x_secs}")))
        .collect();
    let row = c
        .sql(&format!(
            "SELECT due, outcome FROM {table} WHERE name = '{name}'"
        ))
        .unwrap();
    assert!(
        ran.contains(&x_secs),
        "due time {x_secs} never ran: runs {ran:?}\nA said {said:#?}\nrow: {row}"
    );
}

/// A TZif file (version 2) of a zone fixed at `offset` seconds east of UTC, named
/// `abbr` (`posix`: its TZ string, such as `JST-9`): a host's zoneinfo file, made here
/// so the test needs none on the host.
fn fixed_tzif(abbr: &str, offset: i32, posix: &str) -> Vec<u8> {
    let chars = format!("{abbr}\0");
    let header = |out: &mut Vec<u8>| {
        out.extend_from_slice(b"TZif2");
        out.extend_from_slice(&[0; 15]);
        // isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt
        for n in [0, 0, 0, 0, 1, chars.len()] {
            out.extend_from_slice(&u32::try_from(n).unwrap().to_be_bytes());
        }
    };
    let mut out = Vec::new();
    for _ in 0..2 {
        header(&mut out);
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(chars.as_bytes());
    }
    out.extend_from_slice(format!("\n{posix}\n").as_bytes());
    out
}

/// docs/schedules.md: `--tz ZONE` is an IANA zone of the tz database bundled with
/// `lease`, and the hosts play no part: two hosts whose zoneinfo differ (TZDIR here: one
/// whose `localtime` and `Europe/Berlin` are at +09:00, one at +01:00) compute the same
/// due times for the same flags, and `--tz localtime` (each host's own zone), a path
/// or a name the bundled database lacks is refused, saying what to pass.
#[test]
fn the_same_tz_gives_the_same_due_times_on_every_host() {
    let dir = Dir::new("tzdirs");
    let hosts: Vec<_> = [("JST", 9 * 3600, "JST-9"), ("CET", 3600, "CET-1")]
        .into_iter()
        .map(|(abbr, offset, posix)| {
            let tzdir = dir.path().join(abbr);
            std::fs::create_dir_all(tzdir.join("Europe")).unwrap();
            let tzif = fixed_tzif(abbr, offset, posix);
            std::fs::write(tzdir.join("localtime"), &tzif).unwrap();
            std::fs::write(tzdir.join("Europe/Berlin"), &tzif).unwrap();
            std::fs::create_dir_all(tzdir.join("Host")).unwrap();
            std::fs::write(tzdir.join("Host/Zone"), &tzif).unwrap();
            tzdir
        })
        .collect();
    let next = |tz: &str, tzdir: &Path| {
        let out = lease()
            .args(["schedule", "next", "--cron", "0 3 * * *", "--tz", tz])
            .args(["--from", "2027-02-27T00:00:00Z", "-n", "1"])
            .env("TZDIR", tzdir)
            .env("TZ", tzdir.join("localtime"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // An IANA name: the bundled zone, whatever the host's zoneinfo says.
    for tzdir in &hosts {
        let (code, stdout, stderr) = next("Europe/Berlin", tzdir);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stdout.contains("2027-02-27T02:00:00Z  2027-02-27T03:00:00+01:00[Europe/Berlin]"),
            "{stdout}"
        );
    }
    // Not an IANA name of the bundled database: refused alike on every host.
    let host_zone = hosts[0].join("localtime");
    for tz in ["localtime", "Host/Zone", host_zone.to_str().unwrap()] {
        let outs: Vec<_> = hosts.iter().map(|tzdir| next(tz, tzdir)).collect();
        assert_eq!(
            outs[0], outs[1],
            "--tz {tz}: one schedule, two hosts, two answers"
        );
        let (code, _, stderr) = &outs[0];
        assert_eq!(*code, Some(2), "--tz {tz}: {stderr}");
        assert!(
            stderr.contains("--tz") && stderr.contains("IANA") && stderr.contains("Europe/Berlin"),
            "--tz {tz}: {stderr}"
        );
    }
}
