//! Lease groups: three `replica` processes run the same [`LEASES`] leases in one group
//! (`--group`), at the bench's intervals (without `--quick`: the library defaults) and
//! the library's default design, per driver:
//! - **connections**: `pg_stat_activity` rows per process (by its `application_name`)
//!   of a process running one lease, leading and standing by (one session each), and of
//!   each member of a settled group (it holds leases and wants the others': its lease
//!   session and its watch session);
//! - **settle**: the three start together → 4/4/4, and nothing moves in the two retry
//!   intervals after;
//! - **kill**: repetitions of SIGKILL of one member (picked at random), a random fraction
//!   of the retry interval after the group settled: the kill → each of its 4 leases'
//!   first `start` on a survivor (the slowest of the 4 is the figure), the kill → 6/6;
//!   then it restarts (a new process) → 4/4/4, and how many leases moved to get there.
//!   Until the kill, `pg_locks` is sampled every [`WATCH_SAMPLE`]: a member is *watched*
//!   while another session waits for a key it holds (a watch session's wait), and the
//!   repetition records whether the victim was watched at the last sample before the
//!   kill and how long after the settle every member was;
//! - **rolling restart**: each of the three live members in turn gets SIGTERM, its
//!   process exits, a new one starts, and the bench waits for 4/4/4 before the next:
//!   how many times each lease started a term during each such step (the least
//!   possible is once for the stopped member's 4 leases and once for the 4 the new
//!   member takes), and SIGTERM → the stopped member's leases led again;
//! - **server restart**: the server restarts (fast shutdown, start) with the group
//!   settled, a random fraction of the retry interval after it settled: the server
//!   accepting connections again (the kit sees `ready` in `postmaster.pid`, read every
//!   5 ms) → each of the 12 leases' first `start` (the slowest is the figure), and → 4/4/4;
//! - over the whole run, every lease's terms on every process: the longest overlap of
//!   two (a term runs from its `start` to its `stop`, or to the SIGKILL) and whether the
//!   fencing tokens increase in start order.

use crate::duel::Bench;
use crate::{failed, replica, Design, Plan, DRIVERS, FAILOVER_DB, R};
use lease_tests::monotonic_nanos;
use lease_tests::scenario::{Driver, Event, Node};
use std::collections::BTreeMap;
use std::thread::sleep;
use std::time::Duration;

/// Members of the group.
pub const MEMBERS: usize = 3;
/// Leases of the group: 4 per member.
pub const LEASES: usize = 12;
/// How often `pg_locks` is read for who is watched, between a settle and a kill.
pub const WATCH_SAMPLE: Duration = Duration::from_millis(20);
/// A kill whose leases took longer than this to be led again (the p99 bound)
/// leaves its members' logs in `OUT/slow/` ([`keep_slow_kill`]).
pub const SLOW_KILL: Duration = Duration::from_millis(100);
/// A slow kill's logs run from a retry interval before it to this long after it.
pub const SLOW_KILL_LOG_AFTER: Duration = Duration::from_secs(2);
/// The members' log filter, unless `RUST_LOG` is set: the driver's debug events (a
/// wake, a read, a try) date each step of a slow kill.
pub const MEMBER_LOG: &str = "info,lease_driver=debug";

/// Whether a kill whose leases were led again `takeover_ns` after it (`None`: not
/// within the window) was slower than [`SLOW_KILL`].
pub fn slow(takeover_ns: Option<u64>) -> bool {
    takeover_ns.is_none_or(|t| t > SLOW_KILL.as_nanos() as u64)
}

/// One kill repetition.
#[derive(Clone, Debug)]
pub struct KillRep {
    /// SIGKILL → the last of the killed member's leases started on a survivor; `None`:
    /// not all within the window.
    pub takeover_ns: Option<u64>,
    /// SIGKILL → the first of them.
    pub first_ns: Option<u64>,
    /// SIGKILL → the survivors lead 6/6.
    pub even_ns: Option<u64>,
    /// Restart (spawn) → 4/4/4.
    pub settle_ns: u64,
    /// Term starts from the restart to 4/4/4 (the least possible is 4).
    pub moved_by_restart: usize,
    /// Hand-offs (`cancel ... handed-over`) from the kill to 4/4/4.
    pub handoffs: usize,
    /// The victim was the previous repetition's restarted member.
    pub victim_newest: bool,
    /// The group's last settle (4/4/4) → the kill.
    pub since_settle_ns: u64,
    /// At the last sample before the kill, another session waited for a key the victim
    /// held; `None`: no sample (no pid known).
    pub victim_watched: Option<bool>,
    /// The settle → the first sample with every member watched; `None`: not before the
    /// kill.
    pub all_watched_ns: Option<u64>,
}

/// One step of the rolling restart.
#[derive(Clone, Debug)]
pub struct RollStep {
    /// Term starts per lease from the SIGTERM to 4/4/4, for every lease of the group.
    pub moves: Vec<usize>,
    /// SIGTERM → the last of the stopped member's leases started elsewhere.
    pub takeover_ns: Option<u64>,
    /// SIGTERM → 4/4/4 with the new member.
    pub settle_ns: u64,
    /// Hand-offs in the step.
    pub handoffs: usize,
}

/// One server restart.
#[derive(Clone, Debug)]
pub struct RestartRep {
    /// The restart began → the server accepted connections again.
    pub down_ns: u64,
    /// The server accepted connections → the last of the group's leases started again;
    /// `None`: not all within the window.
    pub led_ns: Option<u64>,
    /// → the first of them.
    pub first_ns: Option<u64>,
    /// The server accepted connections → 4/4/4.
    pub settle_ns: u64,
}

/// Everything measured for one driver.
#[derive(Clone, Debug)]
pub struct GroupRun {
    pub driver: Driver,
    /// Sessions of a one-lease process: leading, standing by.
    pub single: (usize, usize),
    /// Sessions of each member of the settled group.
    pub member_sessions: Vec<usize>,
    /// The three started together → 4/4/4.
    pub settle_ns: u64,
    /// Term starts to get there (the least possible is [`LEASES`]).
    pub starts_to_settle: usize,
    /// Term starts in the two retry intervals after settling.
    pub starts_while_settled: usize,
    pub kills: Vec<KillRep>,
    pub roll: Vec<RollStep>,
    pub restarts: Vec<RestartRep>,
    /// Terms checked, the longest overlap of two terms of one lease, and the leases
    /// whose tokens did not increase in start order.
    pub terms: usize,
    pub overlap_ns: u64,
    pub out_of_order: Vec<String>,
    /// The files [`keep_slow_kill`] wrote (one per kill slower than [`SLOW_KILL`], unless
    /// writing it failed).
    pub slow_logs: Vec<String>,
}

pub fn run_all(bench: &mut Bench, plan: &Plan) -> R<Vec<GroupRun>> {
    let mut out = Vec::new();
    // An earlier run's slow kills are not this run's.
    if let Ok(dir) = std::fs::read_dir(plan.out.join("slow")) {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("groups-") && name.ends_with(".log") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    for driver in DRIVERS {
        eprintln!(
            "bench: groups {}: {MEMBERS} members × {LEASES} leases, {} kills, a rolling restart, \
             {} server restarts",
            driver.name(),
            plan.group_reps,
            plan.group_restarts
        );
        let run = group_run(bench, plan, driver)?;
        eprintln!(
            "bench: groups {:<5} kill -9 → its leases led again (slowest of 4) ms [{}]",
            driver.name(),
            (run.kills.iter())
                .map(|k| k
                    .takeover_ns
                    .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6)))
                .collect::<Vec<_>>()
                .join(" ")
        );
        eprintln!(
            "bench: groups {:<5} rolling restart: most moves of one lease per step {:?}",
            driver.name(),
            (run.roll.iter())
                .map(|s| s.moves.iter().copied().max().unwrap_or(0))
                .collect::<Vec<_>>()
        );
        out.push(run);
    }
    Ok(out)
}

/// Sessions whose `application_name` is `app`.
fn sessions(bench: &Bench, app: &str) -> R<usize> {
    let n = bench.admin.one(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'"
    ))?;
    n.parse().map_err(|_| format!("count(*) gave {n:?}"))
}

/// The most sessions of `app` over a few samples `span` apart.
fn most_sessions(bench: &Bench, app: &str, span: Duration) -> R<usize> {
    let mut most = 0;
    for _ in 0..5 {
        most = most.max(sessions(bench, app)?);
        sleep(span / 5);
    }
    Ok(most)
}

/// A one-lease process leading and one standing by: their sessions.
fn single(bench: &Bench, driver: Driver) -> R<(usize, usize)> {
    let url = bench.cluster.url(FAILOVER_DB);
    let lease = format!("groups-single-{}", driver.name());
    let spawn = |label: &str| {
        let mut rc = replica(&bench.iv, driver, Design::Default, &url, &lease, 1);
        rc.app_name = Some(format!("bench-{lease}-{label}"));
        rc.spawn(&bench.bins.replica, label)
            .map_err(|e| format!("spawning replica {label}: {e}"))
    };
    let holder = spawn("holder")?;
    holder
        .wait_start(0, bench.setup_timeout())
        .map_err(|e| failed("the one-lease holder did not start its job", e, &[&holder]))?;
    let standby = spawn("standby")?;
    let app = format!("bench-{lease}-standby");
    crate::duel::wait_standing_by(&bench.admin, &format!("application_name = '{app}'"), {
        bench.setup_timeout()
    })
    .map_err(|e| failed("the one-lease standby did not stand by", e, &[&standby]))?;
    let span = Duration::from_secs(1);
    let led = most_sessions(bench, &format!("bench-{lease}-holder"), span)?;
    let stood = most_sessions(bench, &app, span)?;
    Ok((led, stood))
}

/// A member of the group: its process, and its label for messages and app name.
struct Member {
    node: Node,
    app: String,
}

/// Which of the backends `pids` are watched: another session waits for a key it holds.
fn watched(bench: &Bench, pids: &[i32]) -> R<Vec<bool>> {
    let rows = bench.admin.rows(
        "SELECT DISTINCT h.pid FROM pg_locks h JOIN pg_locks w ON w.locktype = 'advisory'          AND w.objsubid = 1 AND NOT w.granted AND (w.classid, w.objid) = (h.classid, h.objid)          WHERE h.locktype = 'advisory' AND h.objsubid = 1 AND h.granted",
    )?;
    let held: Vec<i32> = (rows.into_iter())
        .filter_map(|r| r.into_iter().next().flatten()?.parse().ok())
        .collect();
    Ok(pids.iter().map(|p| held.contains(p)).collect())
}

/// Sleeps until `until` (monotonic ns), sampling who of `members` is watched every
/// [`WATCH_SAMPLE`]: (the last sample, when every member was first watched).
fn sample_watched(
    bench: &Bench,
    members: &[Member],
    until: u64,
) -> R<(Option<Vec<bool>>, Option<u64>)> {
    let (mut last, mut all) = (None, None);
    loop {
        let now = monotonic_nanos();
        if now >= until {
            return Ok((last, all));
        }
        let pids: Option<Vec<i32>> = members.iter().map(|m| m.node.last_pid()).collect();
        if let Some(pids) = pids {
            let w = watched(bench, &pids)?;
            if all.is_none() && w.iter().all(|&x| x) {
                all = Some(monotonic_nanos());
            }
            last = Some(w);
        }
        let left = until.saturating_sub(monotonic_nanos());
        sleep(WATCH_SAMPLE.min(Duration::from_nanos(left)));
    }
}

/// How many leases each member leads now.
fn counts(members: &[Member]) -> Vec<usize> {
    members.iter().map(|m| m.node.leading().len()).collect()
}

/// Waits until the members lead `want` leases each; returns when.
fn wait_counts(members: &[Member], want: &[usize], timeout: Duration, what: &str) -> R<u64> {
    let deadline = monotonic_nanos() + timeout.as_nanos() as u64;
    loop {
        let now = counts(members);
        if now == want {
            return Ok(monotonic_nanos());
        }
        if monotonic_nanos() > deadline {
            let nodes: Vec<&Node> = members.iter().map(|m| &m.node).collect();
            return Err(failed(
                what,
                format!("leading {now:?}, expected {want:?} within {timeout:?}"),
                &nodes,
            ));
        }
        sleep(Duration::from_millis(5));
    }
}

/// The members' processes.
fn all(members: &[Member]) -> Vec<&Node> {
    members.iter().map(|m| &m.node).collect()
}

/// `start` events of `nodes` at or after `t0`: (lease, t).
fn starts_since(nodes: &[&Node], t0: u64) -> Vec<(String, u64)> {
    (nodes.iter())
        .flat_map(|n| n.events())
        .filter_map(|e| match e {
            Event::Start { lease, t, .. } if t >= t0 => Some((lease, t)),
            _ => None,
        })
        .collect()
}

/// Hand-offs of `nodes` at or after `t0`.
fn handoffs_since(nodes: &[&Node], t0: u64) -> usize {
    (nodes.iter())
        .flat_map(|n| n.cancels())
        .filter(|(_, kind, t)| kind == "handed-over" && *t >= t0)
        .count()
}

/// For each of `leases`, its first start among `nodes` after `t0`, once all have one
/// (or `None` after `timeout`): (first, last) after `t0`.
fn led_again(nodes: &[&Node], leases: &[String], t0: u64, timeout: Duration) -> Option<(u64, u64)> {
    let deadline = monotonic_nanos() + timeout.as_nanos() as u64;
    loop {
        let starts = starts_since(nodes, t0);
        let firsts: Vec<Option<u64>> = (leases.iter())
            .map(|l| {
                (starts.iter())
                    .filter(|(s, _)| s == l)
                    .map(|&(_, t)| t)
                    .min()
            })
            .collect();
        if firsts.iter().all(Option::is_some) {
            let firsts: Vec<u64> = firsts.into_iter().flatten().collect();
            let first = firsts.iter().min().copied().unwrap_or(t0);
            let last = firsts.iter().max().copied().unwrap_or(t0);
            return Some((first - t0, last - t0));
        }
        if monotonic_nanos() > deadline {
            return None;
        }
        sleep(Duration::from_millis(2));
    }
}

fn group_run(bench: &mut Bench, plan: &Plan, driver: Driver) -> R<GroupRun> {
    let iv = bench.iv;
    let url = bench.cluster.url(FAILOVER_DB);
    let single = single(bench, driver)?;
    eprintln!(
        "bench: groups {:<5} sessions of a one-lease process: leading {}, standing by {}",
        driver.name(),
        single.0,
        single.1
    );

    let lease = format!("groups-{}", driver.name());
    let mut spawned = 0;
    let mut spawn = |bench: &Bench| -> R<Member> {
        let label = format!("m{spawned}");
        spawned += 1;
        let mut rc = replica(&iv, driver, Design::Default, &url, &lease, LEASES);
        rc.group = Some(lease.clone());
        let app = format!("bench-{lease}-{label}");
        rc.app_name = Some(app.clone());
        let log = std::env::var("RUST_LOG").unwrap_or_else(|_| MEMBER_LOG.into());
        let node = (rc.spawn_wrapped(&bench.bins.replica, &label, |mut cmd| {
            cmd.env("RUST_LOG", &log);
            cmd
        }))
        .map_err(|e| format!("spawning replica {label}: {e}"))?;
        Ok(Member { node, app })
    };
    // A join settles at the second membership read that sees the newcomer (within two
    // retry intervals), the moved jobs' stops and the new tries after: generous slack.
    let settle_timeout = iv.retry * 6 + Duration::from_secs(30);
    // Every process ever started (killed and stopped ones too), for the terms.
    let mut gone: Vec<(Node, Option<u64>)> = Vec::new();

    let t0 = monotonic_nanos();
    let mut live = Vec::new();
    for _ in 0..MEMBERS {
        live.push(spawn(bench)?);
    }
    let settled = wait_counts(
        &live,
        &[4, 4, 4],
        settle_timeout,
        "the group did not settle",
    )?;
    let starts_to_settle = starts_since(&all(&live), t0).len();
    let mut member_sessions = Vec::new();
    for m in &live {
        member_sessions.push(most_sessions(bench, &m.app, Duration::from_secs(1))?);
    }
    eprintln!(
        "bench: groups {:<5} settled 4/4/4 in {:.0} ms ({starts_to_settle} starts); sessions \
         per member {member_sessions:?}",
        driver.name(),
        (settled - t0) as f64 / 1e6
    );
    let quiet_from = monotonic_nanos();
    sleep(iv.retry * 2);
    let starts_while_settled = starts_since(&all(&live), quiet_from).len();

    let mut kills = Vec::new();
    let mut slow_logs = Vec::new();
    // The last settle, and which member started last.
    let mut settled_at = settled;
    let mut newest = None;
    for i in 0..plan.group_reps {
        let at = monotonic_nanos() + iv.retry.mul_f64(bench.random()).as_nanos() as u64;
        let victim = ((bench.random() * MEMBERS as f64) as usize).min(MEMBERS - 1);
        let (last, all_watched) = sample_watched(bench, &live, at)?;
        let leases: Vec<String> = (live[victim].node.leading().into_iter())
            .map(|t| t.lease)
            .collect();
        let mut dead = live.remove(victim);
        let t_kill = dead
            .node
            .kill9()
            .map_err(|e| failed("killing a member", e, &[&dead.node]))?;
        let wall_kill = std::time::SystemTime::now();
        let window = iv.window();
        let led = led_again(&all(&live), &leases, t_kill, window);
        let even = wait_counts(&live, &[6, 6], settle_timeout, "no 6/6 after the kill").ok();
        if slow(led.map(|(_, last)| last)) {
            let what = format!(
                "kill {i} of member {victim} (its leases {leases:?}): {}",
                led.map_or("not all led again within the window".into(), |(_, l)| {
                    format!("led again after {:.1} ms", l as f64 / 1e6)
                })
            );
            // The logs reach past the kill: wait for them to be written.
            let until = wall_kill + SLOW_KILL_LOG_AFTER;
            if let Ok(left) = until.duration_since(std::time::SystemTime::now()) {
                sleep(left);
            }
            let name = format!("groups-{}-kill-{i}.log", driver.name());
            let members: Vec<&Node> = all(&live).into_iter().chain([&dead.node]).collect();
            match keep_slow_kill(&plan.out, &name, &what, wall_kill, iv.retry, &members) {
                Ok(path) => {
                    eprintln!("bench: groups {:<5} {what}: logs in {path}", driver.name());
                    slow_logs.push(path);
                }
                Err(e) => eprintln!("bench: groups: keeping the logs of a slow kill: {e}"),
            }
        }
        gone.push((dead.node, Some(t_kill)));
        let t_restart = monotonic_nanos();
        live.insert(victim, spawn(bench)?);
        let settled = wait_counts(
            &live,
            &[4, 4, 4],
            settle_timeout,
            "no 4/4/4 after the restart",
        )?;
        let rep = KillRep {
            takeover_ns: led.map(|(_, last)| last),
            first_ns: led.map(|(first, _)| first),
            even_ns: even.map(|t| t - t_kill),
            settle_ns: settled - t_restart,
            moved_by_restart: starts_since(&all(&live), t_restart).len(),
            handoffs: handoffs_since(&all(&live), t_kill),
            victim_newest: newest == Some(victim),
            since_settle_ns: t_kill.saturating_sub(settled_at),
            victim_watched: last.map(|w| w[victim]),
            all_watched_ns: all_watched.map(|t| t.saturating_sub(settled_at)),
        };
        (settled_at, newest) = (settled, Some(victim));
        eprintln!(
            "bench: groups {:<5} kill {i}: member {victim}{} {:.0} ms after the settle, \
             watched {:?} (all watched {} ms after the settle): its {} leases led again in {} \
             ms (first {} ms), 6/6 at {} ms; restart → 4/4/4 in {:.0} ms, {} starts, {} \
             hand-offs",
            driver.name(),
            if rep.victim_newest { " (newest)" } else { "" },
            rep.since_settle_ns as f64 / 1e6,
            rep.victim_watched,
            rep.all_watched_ns
                .map_or("-".into(), |g| format!("{:.0}", g as f64 / 1e6)),
            leases.len(),
            rep.takeover_ns
                .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6)),
            rep.first_ns
                .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6)),
            rep.even_ns
                .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6)),
            rep.settle_ns as f64 / 1e6,
            rep.moved_by_restart,
            rep.handoffs
        );
        kills.push(rep);
    }

    let mut roll = Vec::new();
    for i in 0..MEMBERS {
        sleep(iv.retry.mul_f64(bench.random()));
        let leases: Vec<String> = (live[i].node.leading().into_iter())
            .map(|t| t.lease)
            .collect();
        let mut old = live.remove(i);
        let t_stop = monotonic_nanos();
        old.node
            .replica()
            .sigterm()
            .map_err(|e| failed("stopping a member", e, &[&old.node]))?;
        old.node
            .wait_exit(settle_timeout)
            .map_err(|e| failed("a stopped member did not exit", e, &[&old.node]))?;
        let led = led_again(&all(&live), &leases, t_stop, iv.window());
        gone.push((old.node, None));
        live.insert(i, spawn(bench)?);
        let settled = wait_counts(&live, &[4, 4, 4], settle_timeout, "no 4/4/4 in the roll")?;
        let mut nodes = all(&live);
        nodes.extend(gone.iter().map(|(n, _)| n));
        let starts = starts_since(&nodes, t_stop);
        let moves = (0..LEASES)
            .map(|k| {
                let name = format!("{lease}-{k}");
                starts.iter().filter(|(l, _)| *l == name).count()
            })
            .collect();
        let step = RollStep {
            moves,
            takeover_ns: led.map(|(_, last)| last),
            settle_ns: settled - t_stop,
            handoffs: handoffs_since(&nodes, t_stop),
        };
        eprintln!(
            "bench: groups {:<5} roll {i}: moves per lease {:?}, its leases led again in {} ms, \
             4/4/4 in {:.0} ms, {} hand-offs",
            driver.name(),
            step.moves,
            step.takeover_ns
                .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6)),
            step.settle_ns as f64 / 1e6,
            step.handoffs
        );
        roll.push(step);
    }

    let mut restarts = Vec::new();
    let names: Vec<String> = (0..LEASES).map(|k| format!("{lease}-{k}")).collect();
    let mut settled_at = monotonic_nanos();
    for i in 0..plan.group_restarts {
        let at = settled_at + iv.retry.mul_f64(bench.random()).as_nanos() as u64;
        if let Some(left) = at.checked_sub(monotonic_nanos()) {
            sleep(Duration::from_nanos(left));
        }
        let t_restart = monotonic_nanos();
        bench.restart_server()?;
        let t_up = monotonic_nanos();
        let led = led_again(&all(&live), &names, t_up, iv.window());
        let settled = wait_counts(
            &live,
            &[4, 4, 4],
            settle_timeout,
            "no 4/4/4 after a server restart",
        )?;
        settled_at = settled;
        let rep = RestartRep {
            down_ns: t_up - t_restart,
            led_ns: led.map(|(_, last)| last),
            first_ns: led.map(|(first, _)| first),
            settle_ns: settled - t_up,
        };
        eprintln!(
            "bench: groups {:<5} server restart {i}: down {:.0} ms; up → its {} leases led \
             again in {} ms (first {} ms), 4/4/4 in {:.0} ms",
            driver.name(),
            rep.down_ns as f64 / 1e6,
            LEASES,
            rep.led_ns
                .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6)),
            rep.first_ns
                .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6)),
            rep.settle_ns as f64 / 1e6,
        );
        restarts.push(rep);
    }

    let mut every: Vec<(&Node, Option<u64>)> = live.iter().map(|m| (&m.node, None)).collect();
    every.extend(gone.iter().map(|(n, k)| (n, *k)));
    let (terms, overlap_ns, out_of_order) = check_terms(&every);
    Ok(GroupRun {
        driver,
        single,
        member_sessions,
        settle_ns: settled - t0,
        starts_to_settle,
        starts_while_settled,
        kills,
        roll,
        restarts,
        terms,
        overlap_ns,
        out_of_order,
        slow_logs,
    })
}

/// Writes `OUT/slow/name`: `what`, then each of `nodes`' stderr lines (the last is the
/// killed member) dated from a retry interval before the kill at `wall` to
/// [`SLOW_KILL_LOG_AFTER`] after it (the replicas' log lines start with their UTC time,
/// `2026-12-03T08:23:42.789012Z`).
fn keep_slow_kill(
    out: &std::path::Path,
    name: &str,
    what: &str,
    wall: std::time::SystemTime,
    retry: Duration,
    nodes: &[&Node],
) -> R<String> {
    let of_time = crate::seconds_of_day;
    let (from, to) = (of_time(wall - retry), of_time(wall + SLOW_KILL_LOG_AFTER));
    let within = |s: f64| {
        if from <= to {
            from <= s && s <= to
        } else {
            s >= from || s <= to
        }
    };
    let mut text = format!(
        "{what}; the SIGKILL at {:.6} s after midnight UTC\n",
        of_time(wall)
    );
    for (i, node) in nodes.iter().enumerate() {
        let role = if i + 1 == nodes.len() {
            "killed"
        } else {
            "survivor"
        };
        text.push_str(&format!("\n--- {} ({role}) ---\n", node.label));
        for line in node.stderr() {
            if crate::line_seconds_of_day(&line, 11..26).is_some_and(within) {
                text.push_str(&line);
                text.push('\n');
            }
        }
    }
    let dir = out.join("slow");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

/// One job's term: from its `start` to its `stop` (the job returned), or to the
/// SIGKILL of its process; `u64::MAX` while it runs.
struct Term {
    node: String,
    token: i64,
    start: u64,
    end: u64,
}

/// Every lease's terms over `nodes` (each with its SIGKILL time, if killed): how many,
/// the longest overlap of two terms of one lease, and the leases whose tokens did not
/// increase in start order.
fn check_terms(nodes: &[(&Node, Option<u64>)]) -> (usize, u64, Vec<String>) {
    let mut by_lease: BTreeMap<String, Vec<Term>> = BTreeMap::new();
    for (node, killed) in nodes {
        let mut open: BTreeMap<String, (i64, u64)> = BTreeMap::new();
        for e in node.events() {
            match e {
                Event::Start { lease, token, t } => {
                    open.insert(lease, (token, t));
                }
                Event::Stop { lease, t } => {
                    if let Some((token, start)) = open.remove(&lease) {
                        let term = Term {
                            node: node.label.clone(),
                            token,
                            start,
                            end: t,
                        };
                        by_lease.entry(lease).or_default().push(term);
                    }
                }
                _ => {}
            }
        }
        for (lease, (token, start)) in open {
            let end = killed.map_or(u64::MAX, |k| k.max(start));
            let term = Term {
                node: node.label.clone(),
                token,
                start,
                end,
            };
            by_lease.entry(lease).or_default().push(term);
        }
    }
    let (mut count, mut worst, mut out_of_order) = (0, 0, Vec::new());
    for (lease, mut terms) in by_lease {
        terms.sort_by_key(|t| t.start);
        count += terms.len();
        for pair in terms.windows(2) {
            worst = worst.max(pair[0].end.saturating_sub(pair[1].start));
            if pair[1].token <= pair[0].token {
                out_of_order.push(format!(
                    "{lease}: {} token {} then {} token {}",
                    pair[0].node, pair[0].token, pair[1].node, pair[1].token
                ));
            }
        }
    }
    (count, worst, out_of_order)
}
