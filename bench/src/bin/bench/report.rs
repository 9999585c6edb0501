//! Results as Markdown, JSON and an SVG strip plot, all written by hand.

use crate::cost::{clock_ticks_per_s, Cost, HeartbeatTiming, Role, LEASE_COUNTS};
use crate::duel::Rep;
use crate::duel::Scenario;
use crate::failover::Cell;
use crate::groups::{GroupRun, LEASES, MEMBERS};
use crate::takeover::{HerdRep, Takeover};
use crate::{Design, Machine, Plan, DRIVERS, R};
use lease_tests::scenario::Driver;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

pub struct Results {
    pub plan: Plan,
    pub machine: Machine,
    pub cells: Vec<Cell>,
    /// `None`: the takeover phase did not run.
    pub takeover: Option<Takeover>,
    /// Per driver; empty: the groups phase did not run.
    pub groups: Vec<GroupRun>,
    pub heartbeat: Vec<HeartbeatTiming>,
    pub costs: Vec<Cost>,
    pub failover_secs: f64,
    pub takeover_secs: f64,
    pub total_secs: f64,
}

/// Prints the Markdown and writes `results.md`, `results.json` and (with failover
/// scenarios) `failover.svg`.
pub fn write(r: &Results) -> R<()> {
    let md = markdown(r);
    println!("{md}");
    let dir = &r.plan.out;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut files = vec![
        ("results.md", md),
        ("results.json", json(r).to_string() + "\n"),
    ];
    if !r.cells.is_empty() {
        files.push(("failover.svg", svg(r)));
    }
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}

// ---- statistics ----

/// Median (interpolated), p90, p99 (nearest rank) and max of some values.
pub struct Dist {
    pub n: usize,
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn dist(values: &[f64]) -> Option<Dist> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let rank = |q: f64| v[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    (n > 0).then(|| Dist {
        n,
        median: median(&v),
        p90: rank(0.90),
        p99: rank(0.99),
        max: v[n - 1],
    })
}

/// Median of sorted values.
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

fn num(x: f64) -> String {
    match x.abs() {
        a if a >= 100.0 => format!("{x:.0}"),
        a if a >= 10.0 => format!("{x:.1}"),
        a if a >= 1.0 => format!("{x:.2}"),
        _ => format!("{x:.3}"),
    }
}

fn secs(d: Duration) -> String {
    format!("{} s", num(d.as_secs_f64()))
}

fn cell(r: &Results, s: Scenario, driver: Driver, design: Design) -> Option<&Cell> {
    r.cells
        .iter()
        .find(|c| c.scenario == s && c.driver == driver && c.design == design)
}

fn gaps(c: &Cell) -> Vec<f64> {
    c.reps.iter().filter_map(|r| r.gap_ns.map(ms)).collect()
}

/// Median gap with "no failover" counted as infinitely long (NaN without repetitions).
fn median_gap(c: &Cell) -> f64 {
    let mut v: Vec<f64> = c
        .reps
        .iter()
        .map(|r| r.gap_ns.map_or(f64::INFINITY, ms))
        .collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        median(&v)
    }
}

fn gap_text(c: &Cell, window: Duration) -> String {
    let mut text = dist_text(&gaps(c));
    let none = c.reps.iter().filter(|r| r.gap_ns.is_none()).count();
    if none > 0 {
        if !text.is_empty() {
            text.push_str("; ");
        }
        let _ = write!(text, "{none}×: no failover within {}", secs(window));
    }
    text
}

/// Reference over default, as "N×", "∞" or "n/a".
fn ratio(reference: f64, default: f64) -> String {
    if !default.is_finite() || default <= 0.0 || reference.is_nan() {
        "n/a".into()
    } else if reference.is_infinite() {
        "∞".into()
    } else {
        let x = reference / default;
        if x >= 10.0 {
            format!("{x:.0}×")
        } else {
            format!("{x:.2}×")
        }
    }
}

fn overlap_text(c: &Cell) -> String {
    let max = c.reps.iter().map(|r| r.overlap_ns).max().unwrap_or(0);
    let some = c.reps.iter().filter(|r| r.overlap_ns > 0).count();
    format!("{} ({some}/{})", num(ms(max)), c.reps.len())
}

fn cost(r: &Results, design: Design, driver: Driver, role: Role, leases: usize) -> Option<&Cost> {
    r.costs
        .iter()
        .find(|c| c.design == design && c.driver == driver && c.role == role && c.leases == leases)
}

fn statements_text(c: Option<&Cost>) -> String {
    match c.and_then(|c| c.statements) {
        Some((rate, true)) => num(rate),
        Some((rate, false)) => format!("~{}", num(rate)),
        None => "-".into(),
    }
}

// ---- Markdown ----

/// A Markdown table.
fn table(out: &mut String, header: &[&str], rows: Vec<Vec<String>>) {
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    out.push_str(&line(header.iter().map(|h| h.to_string()).collect()));
    out.push_str(&line(vec!["---".into(); header.len()]));
    for row in rows {
        out.push_str(&line(row));
    }
}

/// Rows of `f(default cell, reference cell)` per scenario and driver.
fn cell_rows(r: &Results, f: impl Fn(&Cell, &Cell) -> Vec<String>) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for sc in Scenario::ALL {
        for driver in DRIVERS {
            let d = cell(r, sc, driver, Design::Default);
            if let (Some(d), Some(f_)) = (d, cell(r, sc, driver, Design::Reference)) {
                let mut row = vec![sc.name().to_string(), driver.name().to_string()];
                row.extend(f(d, f_));
                rows.push(row);
            }
        }
    }
    rows
}

fn markdown(r: &Results) -> String {
    let (p, iv, m) = (&r.plan, &r.plan.intervals, &r.machine);
    let mut s = format!(
        "# lease failover benchmark ({mode} mode)\n\n\
         - Command: `{cmd}`\n\
         - Machine: {nproc} CPUs ({cpu}), PostgreSQL {pg}, {date}; load average {load} at the \
         start (the machine is shared: other work adds noise)\n\
         - Run time: {run_time}\n\
         - Metrics: {metrics}\n\
         - Intervals ({which}): retry {retry}, heartbeat {hb}, query timeout {qt}, guard margin \
         {gm}; validity {validity}, server guard (`idle_session_timeout`) {guard}\n\
         - Observation window after each fault: {window}\n\n",
        mode = if p.quick { "quick" } else { "full" },
        cmd = p.command,
        metrics = if crate::METRICS {
            "on (`--features metrics`: the drivers' `metrics` feature, a Prometheus recorder \
             installed in each replica, nothing scraping it)"
        } else {
            "off (the drivers built without their `metrics` feature)"
        },
        nproc = m.nproc,
        cpu = m.cpu,
        pg = m.postgres,
        date = m.date,
        load = m.load,
        run_time = match &p.only {
            None => format!(
                "{:.0} s in all, {:.0} s of it failover scenarios, {:.0} s takeover",
                r.total_secs, r.failover_secs, r.takeover_secs
            ),
            Some(phases) => {
                let names: Vec<&str> = phases.iter().map(|p| p.name()).collect();
                format!(
                    "{:.0} s, only the {} phase{} (`--only {}`)",
                    r.total_secs,
                    names.join(" and "),
                    if names.len() == 1 { "" } else { "s" },
                    names.join(",")
                )
            }
        },
        which = if p.quick {
            "short, `--quick`"
        } else {
            "the library defaults"
        },
        retry = secs(iv.retry),
        hb = secs(iv.heartbeat),
        qt = secs(iv.query_timeout),
        gm = secs(iv.guard_margin),
        validity = secs(iv.heartbeat + iv.query_timeout),
        guard = secs(iv.guard_timeout()),
        window = secs(iv.window()),
    );

    if !r.cells.is_empty() {
        failover_markdown(r, &mut s);
    }
    if let Some(t) = &r.takeover {
        takeover_markdown(r, t, &mut s);
    }
    if !r.groups.is_empty() {
        groups_markdown(r, &mut s);
    }
    if !r.costs.is_empty() || !r.heartbeat.is_empty() {
        cost_markdown(r, &mut s);
    }
    s
}

/// The failover gap and overlap sections.
fn failover_markdown(r: &Results, s: &mut String) {
    let (p, iv) = (&r.plan, &r.plan.intervals);
    let _ = write!(
        s,
        "Failover scenarios: {} repetitions per fast scenario (graceful, kill, terminate), {} \
         per slow one (partition, freeze, restart: each waits out the server guard or a \
         restart), the fault a random fraction of the retry interval after the standby stood \
         by. Designs: **default** = server guard + NOTIFY handover + waiting on the server \
         (library defaults); **reference** = `--no-guard --no-notify --no-wait` (poll-only \
         takeover and handover, no server guard), the closest the options come to the Go \
         package. Gain = reference median / default median.\n\n",
        p.reps, p.slow_reps
    );
    s.push_str(
        "## Failover gap (ms)\n\nFrom the fault to the first `start` of a job on any replica \
         (CLOCK_MONOTONIC). Cells: n: median / p90 / p99 / max (nearest rank; with n < 100, \
         p99 = max).\n\n",
    );
    let rows = cell_rows(r, |d, f| {
        vec![
            gap_text(d, iv.window()),
            gap_text(f, iv.window()),
            ratio(median_gap(f), median_gap(d)),
        ]
    });
    table(
        s,
        &["scenario", "driver", "default", "reference", "gain"],
        rows,
    );
    s.push('\n');
    for sc in Scenario::ALL {
        let _ = writeln!(s, "- {}: {}", sc.name(), sc.what());
    }

    s.push_str(
        "\n## Overlap of the old and the new job (ms)\n\nLongest time a job of the old holder \
         and a job of the other replica ran at once. A job runs from its `start` to its \
         `cancel` or `stop`, its process's death (SIGKILL) or its last `valid_until`, \
         whichever is first (a frozen job acts again only after checking validity). Cells: \
         max (repetitions with overlap > 0 / all). \"Old won\": repetitions where the first \
         job after the fault ran on the old holder (it reconnected and won again before the \
         standby polled).\n\n",
    );
    let won = |c: &Cell| {
        let n = c.reps.iter().filter(|r| r.old_won).count();
        format!("{n}/{}", c.reps.len())
    };
    let rows = cell_rows(r, |d, f| {
        vec![
            overlap_text(d),
            overlap_text(f),
            format!("{} / {}", won(d), won(f)),
        ]
    });
    let header = [
        "scenario",
        "driver",
        "default",
        "reference",
        "old won (default / reference)",
    ];
    table(s, &header, rows);
    s.push('\n');
}

/// "n: median / p90 / p99 / max" of `values` (empty without values).
fn dist_text(values: &[f64]) -> String {
    dist(values).map_or(String::new(), |d| {
        format!(
            "{}: {} / {} / {} / {}",
            d.n,
            num(d.median),
            num(d.p90),
            num(d.p99),
            num(d.max)
        )
    })
}

/// "k/n" of the repetitions `pred` accepts.
fn count<T>(reps: &[T], pred: impl Fn(&T) -> bool) -> String {
    format!("{}/{}", reps.iter().filter(|r| pred(r)).count(), reps.len())
}

fn rep_gaps(reps: &[Rep]) -> Vec<f64> {
    reps.iter().filter_map(|r| r.gap_ns.map(ms)).collect()
}

fn handovers(reps: &[Rep]) -> Vec<f64> {
    (reps.iter())
        .filter_map(|r| r.handover_ns.map(|h| h as f64 / 1e6))
        .collect()
}

/// The takeover, herd and lock-delay sections.
fn takeover_markdown(r: &Results, t: &Takeover, s: &mut String) {
    let p = &r.plan;
    let phase = secs(p.intervals.retry.min(Duration::from_secs(1)));
    let missed = |reps: &[Rep]| {
        let none = reps.iter().filter(|x| x.gap_ns.is_none()).count();
        if none == 0 {
            String::new()
        } else {
            format!("; {none}×: none within {}", secs(p.intervals.window()))
        }
    };
    let _ = write!(
        s,
        "## Instant takeover: SIGKILL of the holder → the standby's job start (ms)\n\n\
         Library defaults (server guard, NOTIFY handover, waiting on the server, lock-delay \
         {delay}), two `replica` processes per repetition, the SIGKILL a random fraction of \
         {phase} after the standby stood by (its try, or the wait on the server after it). \
         From the SIGKILL to the standby's `start` (CLOCK_MONOTONIC). Cells: n: median / \
         p90 / p99 / max (nearest rank; with n < 100, p99 = max).\n\n",
        delay = ms_text(lease_proto::limits::DEFAULT_LOCK_DELAY),
    );
    let rows = (t.kill.iter())
        .map(|(driver, reps)| {
            let overlap = reps.iter().map(|x| x.overlap_ns).max().unwrap_or(0);
            vec![
                driver.name().to_string(),
                dist_text(&rep_gaps(reps)) + &missed(reps),
                format!(
                    "{} ({})",
                    num(ms(overlap)),
                    count(reps, |x| x.overlap_ns > 0)
                ),
            ]
        })
        .collect();
    table(
        s,
        &["driver", "kill -9 → job started", "overlap max (reps > 0)"],
        rows,
    );

    let herd = t.herd_size;
    let _ = write!(
        s,
        "\n## Herd: {herd} standbys on one key, SIGKILL of the holder\n\nA holder and \
         {herd} standbys (library defaults; the `replica` processes without their status \
         poller, `--status-poll 0`, whose wake-up every 20 ms in each of them loaded the \
         machine as no standby of a real fleet does). The herd stands by once every standby is \
         connected and, for a second, between one and twice `HERD_WAITERS` of them wait on \
         the server (`pg_locks.granted = false`; the others poll). The pollers' periodic \
         tries come in rounds (each standby's first one `retry · (1 − RETRY_JITTER·u)` after \
         its start): the SIGKILL falls at a random moment between the end of the first round \
         and the start of the second, with the second after it (kill between polling \
         rounds), so that the statements counted are the takeover's; when the herd took too \
         long to start for that, a random fraction of {phase} after it stood by. First start: \
         SIGKILL → the first standby's `start` (ms). Leaders: standbys that started a job in \
         the second after the SIGKILL, and backends holding the key at its end. Statements: \
         what the {herd} standbys sent in that second, counted in the server log \
         (`log_statement = all`), and what the holder and the standbys sent in the second \
         before the SIGKILL. Waiting: requests for the key not granted just before the \
         SIGKILL and at the end of that second. Where the first start's time goes, from the \
         server log (`log_disconnections`; its times have a resolution of 1 ms): SIGKILL → the \
         holder's backend logged its disconnection (the process died, its socket closed, the \
         backend noticed, released its locks, which granted the key to the first take in its queue, and exited: the machine's \
         and the server's part), → the first try a standby sent (a poller's; a waiting \
         standby's take needs none), and → the end of the winner's statement (its first \
         after the kill: its take, granted the key at the release, or a try) on the server \
         (`log_min_duration_statement = 0`; the winner: the backend holding the key at the \
         end of the second), and how many winners won by their take; the lock-delay \
         ({delay}) and the job's start follow.\n\n",
        delay = ms_text(lease_proto::limits::DEFAULT_LOCK_DELAY),
    );
    let rows = (t.herd.iter())
        .map(|(driver, reps)| {
            let first: Vec<f64> = reps.iter().filter_map(|x| x.first_ns.map(ms)).collect();
            let stmts: Vec<f64> = reps.iter().map(|x| x.statements as f64).collect();
            let before: Vec<f64> = reps.iter().map(|x| x.statements_before as f64).collect();
            let range = |f: fn(&HerdRep) -> usize| {
                let v: Vec<usize> = reps.iter().map(f).collect();
                let (lo, hi) = (v.iter().min(), v.iter().max());
                format!("{}–{}", lo.unwrap_or(&0), hi.unwrap_or(&0))
            };
            let gone: Vec<f64> = reps.iter().filter_map(|x| x.gone_ms).collect();
            let first_try: Vec<f64> = reps.iter().filter_map(|x| x.first_try_ms).collect();
            let won: Vec<f64> = reps.iter().filter_map(|x| x.won_ms).collect();
            vec![
                driver.name().to_string(),
                dist_text(&first),
                dist_text(&gone),
                dist_text(&first_try),
                dist_text(&won),
                count(reps, |x| x.won_by_take == Some(true)),
                count(reps, |x| x.leaders == 1 && x.holders == 1),
                count(reps, |x| x.between_rounds),
                dist(&stmts).map_or(String::new(), |d| format!("{} / {}", d.median, d.max)),
                dist(&before).map_or(String::new(), |d| format!("{} / {}", d.median, d.max)),
                range(|x| x.waiting_at_kill),
                range(|x| x.waiting),
            ]
        })
        .collect();
    let header = [
        "driver",
        "first start (ms)",
        "→ holder's backend gone",
        "→ first try",
        "→ winning statement answered",
        "won by a take",
        "exactly one leader and holder",
        "kill between polling rounds",
        "statements in the second after: median / max",
        "in the second before: median / max",
        "waiting at the kill",
        "waiting after",
    ];
    table(s, &header, rows);

    s.push_str(
        "\n## Lock-delay: `pg_terminate_backend` of the holder's backend (ms)\n\nThe old \
         holder learns of the loss when its connection ends, the standby when its take on \
         the server answers with the key; its job starts after the lock-delay (no handover \
         notification: the release was not graceful), while the old holder reconnects and \
         tries too. `replica`: a cooperative job that returns when cancelled (its end: the \
         `cancel` line). `lease run`: its child (`bench --stamp-child`) prints its start and \
         exits on SIGTERM at once (its end: the moment SIGTERM arrived). First: fault → the \
         first `start` on either side. Standby first: repetitions where the standby's job \
         started first (else the old holder won its key back). Old end: fault → the old \
         job's end. End − start: the old job's end minus the new job's start, over the \
         repetitions the standby came first (positive: both jobs ran at once; negative: a \
         gap). Cells: n: median / p90 / p99 / max.\n\n",
    );
    let rows = (t.delay.iter())
        .map(|c| {
            let old_end: Vec<f64> = c.reps.iter().filter_map(|x| x.old_end_ns.map(ms)).collect();
            let hand = handovers(&c.reps);
            vec![
                ms_text(c.lock_delay),
                c.who.name().to_string(),
                count(&c.reps, |x| x.gap_ns.is_some() && !x.old_won),
                dist_text(&rep_gaps(&c.reps)) + &missed(&c.reps),
                dist_text(&old_end),
                dist_text(&hand),
                format!(
                    "{}/{}",
                    hand.iter().filter(|&&h| h > 0.0).count(),
                    hand.len()
                ),
            ]
        })
        .collect();
    let header = [
        "lock-delay",
        "contender",
        "standby first",
        "first start",
        "old end",
        "end − start",
        "overlap > 0",
    ];
    table(s, &header, rows);
    s.push('\n');
}

/// The lease group sections.
fn groups_markdown(r: &Results, s: &mut String) {
    let p = &r.plan;
    let retry = secs(p.intervals.retry);
    let opt_ms = |v: &[Option<u64>]| -> String {
        let got: Vec<f64> = v.iter().flatten().map(|&n| ms(n)).collect();
        let none = v.len() - got.len();
        let mut text = dist_text(&got);
        if none > 0 {
            let _ = write!(text, "; {none}×: not within {}", secs(p.intervals.window()));
        }
        text
    };
    let _ = write!(
        s,
        "## Lease group: {MEMBERS} processes × {LEASES} leases in one group\n\n\
         The library defaults' design, three `replica` processes running the same {LEASES} \
         leases in one group (`Locker::group`). Settle: the three started together → 4/4/4 \
         (term starts to get there; the least is {LEASES}), then term starts in the two retry \
         intervals after (none is right). Kill: SIGKILL of one member in turn, a random \
         fraction of {retry} after the group settled → each of its 4 leases' first `start` \
         on a survivor: the slowest of the 4 per repetition, and the fastest; → the \
         survivors lead 6/6. Restart: a new process for the killed one → 4/4/4 (term starts: \
         the least is 4). The victim is picked at random; until the kill, `pg_locks` is read \
         every 20 ms: a member is watched while another session waits for a key it holds (a \
         watch session's wait); the kills are split by whether the victim was watched at the \
         last read before its kill. The members log the driver's debug events (`RUST_LOG` \
         `{member_log}` unless set): a kill whose leases took longer than {slow} to be led \
         again leaves the members' log lines from a retry interval before it to {after} after it \
         in `slow/` beside this file. Cells: n: median / p90 / p99 / max (nearest rank; with \
         n < 100, p99 = max).\n\n",
        member_log = crate::groups::MEMBER_LOG,
        slow = ms_text(crate::groups::SLOW_KILL),
        after = secs(crate::groups::SLOW_KILL_LOG_AFTER),
    );
    let rows = (r.groups.iter())
        .map(|g| {
            let k = &g.kills;
            let moved: Vec<f64> = k.iter().map(|x| x.moved_by_restart as f64).collect();
            let settle: Vec<f64> = k.iter().map(|x| ms(x.settle_ns)).collect();
            let split = |w: bool| -> Vec<Option<u64>> {
                (k.iter())
                    .filter(|x| x.victim_watched == Some(w))
                    .map(|x| x.takeover_ns)
                    .collect()
            };
            vec![
                g.driver.name().to_string(),
                format!(
                    "{} ms, {} starts; {} after",
                    num(ms(g.settle_ns)),
                    g.starts_to_settle,
                    g.starts_while_settled
                ),
                opt_ms(&k.iter().map(|x| x.takeover_ns).collect::<Vec<_>>()),
                opt_ms(&split(true)),
                opt_ms(&split(false)),
                opt_ms(&k.iter().map(|x| x.first_ns).collect::<Vec<_>>()),
                opt_ms(&k.iter().map(|x| x.even_ns).collect::<Vec<_>>()),
                dist_text(&settle),
                dist(&moved).map_or(String::new(), |d| format!("{} / {}", d.median, d.max)),
            ]
        })
        .collect();
    let header = [
        "driver",
        "settle",
        "kill → its 4 led again (slowest)",
        "victim watched",
        "victim not watched",
        "(fastest of 4)",
        "kill → 6/6",
        "restart → 4/4/4",
        "starts by the restart: median / max",
    ];
    table(s, &header, rows);
    for g in &r.groups {
        let slow = (g.kills.iter())
            .filter(|k| crate::groups::slow(k.takeover_ns))
            .count();
        let kept = (g.slow_logs.iter())
            .map(|p| {
                let name = std::path::Path::new(p).file_name().unwrap_or_default();
                format!("`slow/{}`", name.to_string_lossy())
            })
            .collect::<Vec<_>>();
        let _ = write!(
            s,
            "\n{}: {} slower than {}{}",
            g.driver.name(),
            match slow {
                0 => "no kill".to_string(),
                1 => "1 kill".to_string(),
                n => format!("{n} kills"),
            },
            ms_text(crate::groups::SLOW_KILL),
            if kept.is_empty() {
                ".\n".to_string()
            } else {
                format!(": {}.\n", kept.join(", "))
            }
        );
    }

    let _ = write!(
        s,
        "\n## Lease group: rolling restart\n\nEach of the three members in turn: SIGTERM, its \
         process exits, a new one starts, and 4/4/4 again before the next (the next SIGTERM a \
         random fraction of {retry} after). Moves: term starts of one lease from the SIGTERM \
         to 4/4/4, per lease and step (the least possible: 1 for the stopped member's 4 \
         leases and for the 4 the new member takes; when the two sets meet, 2). SIGTERM → \
         the stopped member's 4 leases led again (slowest of 4). Overlap and tokens: over \
         every term of the whole run (settle, kills, restarts, roll), a term from its \
         `start` to its `stop`, or to the SIGKILL.\n\n"
    );
    let rows = (r.groups.iter())
        .map(|g| {
            let mut hist = BTreeMap::<usize, usize>::new();
            for step in &g.roll {
                for &m in &step.moves {
                    *hist.entry(m).or_default() += 1;
                }
            }
            let hist: Vec<String> = hist.iter().map(|(m, n)| format!("{m}×: {n}")).collect();
            let per_step: Vec<String> = (g.roll.iter())
                .map(|x| x.moves.iter().copied().max().unwrap_or(0).to_string())
                .collect();
            let total: Vec<String> = (g.roll.iter())
                .map(|x| x.moves.iter().sum::<usize>().to_string())
                .collect();
            let takeover: Vec<Option<u64>> = g.roll.iter().map(|x| x.takeover_ns).collect();
            let settle: Vec<String> = g.roll.iter().map(|x| num(ms(x.settle_ns))).collect();
            vec![
                g.driver.name().to_string(),
                per_step.join(", "),
                hist.join(", "),
                total.join(", "),
                opt_ms(&takeover),
                settle.join(", "),
                format!(
                    "{} terms, overlap {} ms, tokens {}",
                    g.terms,
                    num(ms(g.overlap_ns)),
                    if g.out_of_order.is_empty() {
                        "increasing".to_string()
                    } else {
                        format!("out of order: {}", g.out_of_order.join("; "))
                    }
                ),
            ]
        })
        .collect();
    let header = [
        "driver",
        "most moves of one lease, per step",
        "leases by moves (all steps)",
        "term starts per step",
        "SIGTERM → its 4 led again",
        "SIGTERM → 4/4/4 (ms)",
        "whole run",
    ];
    table(s, &header, rows);

    let _ = write!(
        s,
        "\n## Lease group: server restart\n\nWith the group settled (a random fraction of \
         {retry} after it settled), the server restarts (fast shutdown, start): every session \
         ends, every job is cancelled. Up: the server accepts connections again (the bench \
         reads `ready` in `postmaster.pid` every 5 ms, so up to 5 ms late) → each of the \
         {LEASES} leases' first `start` (the slowest of the {LEASES}, and the fastest); → \
         4/4/4. Cells: n: median / p90 / p99 / max.\n\n"
    );
    let rows = (r.groups.iter())
        .map(|g| {
            let x = &g.restarts;
            let down: Vec<f64> = x.iter().map(|x| ms(x.down_ns)).collect();
            let settle: Vec<f64> = x.iter().map(|x| ms(x.settle_ns)).collect();
            vec![
                g.driver.name().to_string(),
                dist_text(&down),
                opt_ms(&x.iter().map(|x| x.led_ns).collect::<Vec<_>>()),
                opt_ms(&x.iter().map(|x| x.first_ns).collect::<Vec<_>>()),
                dist_text(&settle),
            ]
        })
        .collect();
    let header = [
        "driver",
        "restart → up",
        "up → all 12 led again",
        "(the first)",
        "up → 4/4/4",
    ];
    table(s, &header, rows);

    s.push_str(
        "\n## Sessions per process\n\n`pg_stat_activity` rows by the process's \
         `application_name` (the most of five samples over a second): a one-lease process \
         leading and one standing by, and each member of the settled group (it holds leases \
         and wants the others': its lease session and its watch session).\n\n",
    );
    let rows = (r.groups.iter())
        .map(|g| {
            vec![
                g.driver.name().to_string(),
                g.single.0.to_string(),
                g.single.1.to_string(),
                format!("{:?}", g.member_sessions),
            ]
        })
        .collect();
    let header = [
        "driver",
        "one lease, leading",
        "one lease, standing by",
        "group members",
    ];
    table(s, &header, rows);
    s.push('\n');
}

fn ms_text(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// The database cost, heartbeat duration and client cost sections.
fn cost_markdown(r: &Results, s: &mut String) {
    let tick_ms = 1000 / clock_ticks_per_s();
    let window = r.costs.last().map_or(0.0, |c| c.window_s);
    let _ = write!(
        s,
        "## Database cost per locker\n\nOne locker per database, over a {window:.0} s \
         window: all 1-lease lockers at once, the others each alone (statements reading \
         `pg_locks` pay for every lock on the server). Statements/s: \
         `pg_stat_database.xact_commit` of the locker's database between the first and last \
         change seen (`~`: whole window). Server CPU: the locker's backend, ms per second, \
         from `/proc/PID/schedstat` (in parentheses from utime+stime, {tick_ms} ms ticks). Standbys \
         wait for leases a silent session holds.\n\n"
    );
    let server = |c: Option<&Cost>| {
        c.map_or("-".into(), |c| {
            format!("{} ({})", num(c.server_cpu.0), num(c.server_cpu.1))
        })
    };
    let mut rows = Vec::new();
    for role in [Role::Hold, Role::Standby] {
        for leases in LEASE_COUNTS {
            for driver in DRIVERS {
                let d = cost(r, Design::Default, driver, role, leases);
                let f = cost(r, Design::Reference, driver, role, leases);
                let cpu_ratio = match (d, f) {
                    (Some(d), Some(f)) => ratio(f.server_cpu.0, d.server_cpu.0),
                    _ => "n/a".into(),
                };
                rows.push(vec![
                    role.name().into(),
                    leases.to_string(),
                    driver.name().into(),
                    statements_text(d),
                    statements_text(f),
                    server(d),
                    server(f),
                    cpu_ratio,
                ]);
            }
        }
    }
    let header = [
        "role",
        "leases",
        "driver",
        "statements/s default",
        "reference",
        "server CPU ms/s default",
        "reference",
        "CPU ratio",
    ];
    table(s, &header, rows);

    s.push_str(
        "\n## Heartbeat duration against keys held (µs)\n\n\
         `lease_proto::Statement::Heartbeat` (the steady heartbeat: backend pid, nonce and the server's clock) and \
         `Statement::Verify` (that plus the session's keys from `pg_locks`: the verification \
         after a failed try, and once the heartbeat itself) on a separate tokio-postgres \
         session holding that many advisory keys while another session holds the keys of the \
         second column (and nothing else any), round trip on one thread, simple-query \
         protocol.\n\n",
    );
    let rows = r
        .heartbeat
        .iter()
        .filter_map(|h| {
            let us: Vec<f64> = h.times_ns.iter().map(|&t| t as f64 / 1e3).collect();
            let d = dist(&us)?;
            Some(vec![
                h.statement.to_string(),
                h.keys.to_string(),
                h.others.to_string(),
                d.n.to_string(),
                num(d.median),
                num(d.p90),
                num(d.p99),
                num(d.max),
            ])
        })
        .collect();
    let header = [
        "statement",
        "keys held",
        "by another session",
        "n",
        "median",
        "p90",
        "p99",
        "max",
    ];
    table(s, &header, rows);

    s.push_str(
        "\n## Client cost at rest (one `replica` process, 1 lease)\n\nCPU of all the \
         process's threads in ms per second from schedstat (in parentheses utime+stime), VmRSS \
         at the end of the window. The `replica` processes run with `--status-poll 0` (no \
         status poller) and a job that only waits for its cancellation, so this is the locker \
         and its runtime at rest (tokio: a multi-thread runtime with 2 workers; smol: \
         `smol::block_on` and smol's global executor).\n\n",
    );
    let client = |c: Option<&Cost>| {
        c.map_or("-".into(), |c| {
            format!("{} ({})", num(c.client_cpu.0), num(c.client_cpu.1))
        })
    };
    let rss = |c: Option<&Cost>| c.map_or("-".into(), |c| num(c.client_rss_kib as f64 / 1024.0));
    let mut rows = Vec::new();
    for role in [Role::Hold, Role::Standby] {
        for driver in DRIVERS {
            let d = cost(r, Design::Default, driver, role, 1);
            let f = cost(r, Design::Reference, driver, role, 1);
            let row = [role.name(), driver.name()].map(String::from);
            rows.push([row.to_vec(), vec![client(d), client(f), rss(d), rss(f)]].concat());
        }
    }
    let header = [
        "role",
        "driver",
        "CPU ms/s default",
        "reference",
        "VmRSS MiB default",
        "reference",
    ];
    table(s, &header, rows);
}

// ---- JSON ----

enum J {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(&'static str, J)>),
}

impl std::fmt::Display for J {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            J::Null => f.write_str("null"),
            J::Bool(b) => write!(f, "{b}"),
            J::Num(x) if x.is_finite() => write!(f, "{}", (x * 1e4).round() / 1e4),
            J::Num(_) => f.write_str("null"),
            J::Str(s) => {
                f.write_str("\"")?;
                for ch in s.chars() {
                    match ch {
                        '"' => f.write_str("\\\"")?,
                        '\\' => f.write_str("\\\\")?,
                        c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                        c => write!(f, "{c}")?,
                    }
                }
                f.write_str("\"")
            }
            J::Arr(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            J::Obj(fields) => {
                f.write_str("{")?;
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "\"{k}\":{v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

fn s(text: &str) -> J {
    J::Str(text.to_owned())
}

fn dist_json(values: &[f64]) -> J {
    match dist(values) {
        Some(d) => J::Obj(vec![
            ("n", J::Num(d.n as f64)),
            ("median", J::Num(d.median)),
            ("p90", J::Num(d.p90)),
            ("p99", J::Num(d.p99)),
            ("max", J::Num(d.max)),
        ]),
        None => J::Null,
    }
}

fn reps_json(reps: &[Rep]) -> J {
    let opt = |x: Option<f64>| x.map_or(J::Null, J::Num);
    J::Arr(
        reps.iter()
            .map(|x| {
                J::Obj(vec![
                    ("gap_ms", opt(x.gap_ns.map(ms))),
                    ("overlap_ms", J::Num(ms(x.overlap_ns))),
                    ("old_holder_won", J::Bool(x.old_won)),
                    ("old_job_end_ms", opt(x.old_end_ns.map(ms))),
                    (
                        "old_end_minus_new_start_ms",
                        opt(x.handover_ns.map(|h| h as f64 / 1e6)),
                    ),
                ])
            })
            .collect(),
    )
}

fn takeover_json(t: &Takeover) -> J {
    let kill = t.kill.iter().map(|(driver, reps)| {
        J::Obj(vec![
            ("driver", s(driver.name())),
            ("kill_to_start_ms", dist_json(&rep_gaps(reps))),
            ("reps", reps_json(reps)),
        ])
    });
    let herd = t.herd.iter().map(|(driver, reps)| {
        let reps = reps.iter().map(|x| {
            J::Obj(vec![
                (
                    "first_start_ms",
                    x.first_ns.map_or(J::Null, |g| J::Num(ms(g))),
                ),
                ("leaders", J::Num(x.leaders as f64)),
                ("holders", J::Num(x.holders as f64)),
                ("waiting_at_kill", J::Num(x.waiting_at_kill as f64)),
                ("waiting", J::Num(x.waiting as f64)),
                (
                    "statements_in_the_second_after",
                    J::Num(x.statements as f64),
                ),
                (
                    "statements_in_the_second_before",
                    J::Num(x.statements_before as f64),
                ),
                ("kill_between_polling_rounds", J::Bool(x.between_rounds)),
                ("holder_backend_gone_ms", x.gone_ms.map_or(J::Null, J::Num)),
                ("first_try_ms", x.first_try_ms.map_or(J::Null, J::Num)),
                ("won_ms", x.won_ms.map_or(J::Null, J::Num)),
                ("won_by_take", x.won_by_take.map_or(J::Null, J::Bool)),
            ])
        });
        J::Obj(vec![
            ("driver", s(driver.name())),
            ("standbys", J::Num(t.herd_size as f64)),
            ("reps", J::Arr(reps.collect())),
        ])
    });
    let delay = t.delay.iter().map(|c| {
        let old_end: Vec<f64> = c.reps.iter().filter_map(|x| x.old_end_ns.map(ms)).collect();
        J::Obj(vec![
            ("lock_delay_ms", J::Num(c.lock_delay.as_secs_f64() * 1e3)),
            ("contender", s(c.who.name())),
            ("first_start_ms", dist_json(&rep_gaps(&c.reps))),
            ("old_job_end_ms", dist_json(&old_end)),
            ("old_end_minus_new_start_ms", dist_json(&handovers(&c.reps))),
            (
                "standby_first",
                J::Num(
                    c.reps
                        .iter()
                        .filter(|x| x.gap_ns.is_some() && !x.old_won)
                        .count() as f64,
                ),
            ),
            ("reps", reps_json(&c.reps)),
        ])
    });
    J::Obj(vec![
        ("kill", J::Arr(kill.collect())),
        ("herd", J::Arr(herd.collect())),
        ("terminate_by_lock_delay", J::Arr(delay.collect())),
    ])
}

fn groups_json(g: &GroupRun) -> J {
    let opt = |x: Option<u64>| x.map_or(J::Null, |n| J::Num(ms(n)));
    let kills = g.kills.iter().map(|k| {
        J::Obj(vec![
            ("kill_to_last_of_its_leases_led_ms", opt(k.takeover_ns)),
            ("kill_to_first_of_its_leases_led_ms", opt(k.first_ns)),
            ("kill_to_6_6_ms", opt(k.even_ns)),
            ("restart_to_4_4_4_ms", J::Num(ms(k.settle_ns))),
            ("starts_by_the_restart", J::Num(k.moved_by_restart as f64)),
            ("hand_offs", J::Num(k.handoffs as f64)),
            ("victim_started_last", J::Bool(k.victim_newest)),
            ("settle_to_kill_ms", J::Num(ms(k.since_settle_ns))),
            (
                "victim_watched_at_the_kill",
                k.victim_watched.map_or(J::Null, J::Bool),
            ),
            ("settle_to_all_watched_ms", opt(k.all_watched_ns)),
        ])
    });
    let roll = g.roll.iter().map(|x| {
        J::Obj(vec![
            (
                "moves_per_lease",
                J::Arr(x.moves.iter().map(|&m| J::Num(m as f64)).collect()),
            ),
            ("sigterm_to_its_leases_led_ms", opt(x.takeover_ns)),
            ("sigterm_to_4_4_4_ms", J::Num(ms(x.settle_ns))),
            ("hand_offs", J::Num(x.handoffs as f64)),
        ])
    });
    let restarts = g.restarts.iter().map(|x| {
        J::Obj(vec![
            ("restart_to_up_ms", J::Num(ms(x.down_ns))),
            ("up_to_last_lease_led_ms", opt(x.led_ns)),
            ("up_to_first_lease_led_ms", opt(x.first_ns)),
            ("up_to_4_4_4_ms", J::Num(ms(x.settle_ns))),
        ])
    });
    let takeover: Vec<f64> = g
        .kills
        .iter()
        .filter_map(|k| k.takeover_ns.map(ms))
        .collect();
    J::Obj(vec![
        ("driver", s(g.driver.name())),
        ("members", J::Num(MEMBERS as f64)),
        ("leases", J::Num(LEASES as f64)),
        (
            "sessions",
            J::Obj(vec![
                ("one_lease_leading", J::Num(g.single.0 as f64)),
                ("one_lease_standing_by", J::Num(g.single.1 as f64)),
                (
                    "group_members",
                    J::Arr(
                        g.member_sessions
                            .iter()
                            .map(|&n| J::Num(n as f64))
                            .collect(),
                    ),
                ),
            ]),
        ),
        ("settle_ms", J::Num(ms(g.settle_ns))),
        ("starts_to_settle", J::Num(g.starts_to_settle as f64)),
        (
            "starts_while_settled",
            J::Num(g.starts_while_settled as f64),
        ),
        ("kill_to_its_leases_led_ms", dist_json(&takeover)),
        ("kills", J::Arr(kills.collect())),
        ("rolling_restart", J::Arr(roll.collect())),
        ("server_restarts", J::Arr(restarts.collect())),
        ("terms", J::Num(g.terms as f64)),
        ("worst_overlap_ms", J::Num(ms(g.overlap_ns))),
        (
            "tokens_out_of_order",
            J::Arr(g.out_of_order.iter().map(|x| s(x)).collect()),
        ),
        (
            "slow_kill_logs",
            J::Arr(g.slow_logs.iter().map(|x| s(x)).collect()),
        ),
    ])
}

fn json(r: &Results) -> J {
    let (p, iv, m) = (&r.plan, &r.plan.intervals, &r.machine);
    let msj = |d: Duration| J::Num(d.as_secs_f64() * 1e3);
    let cells = r.cells.iter().map(|c| {
        J::Obj(vec![
            ("scenario", s(c.scenario.name())),
            ("driver", s(c.driver.name())),
            ("design", s(c.design.name())),
            ("gap_ms", dist_json(&gaps(c))),
            (
                "no_failover_within_window",
                J::Num(c.reps.iter().filter(|x| x.gap_ns.is_none()).count() as f64),
            ),
            ("reps", reps_json(&c.reps)),
        ])
    });
    let costs = r.costs.iter().map(|c| {
        J::Obj(vec![
            ("design", s(c.design.name())),
            ("driver", s(c.driver.name())),
            ("role", s(c.role.name())),
            ("leases", J::Num(c.leases as f64)),
            (
                "statements_per_s",
                c.statements.map_or(J::Null, |x| J::Num(x.0)),
            ),
            (
                "statements_between_flushes",
                c.statements.map_or(J::Null, |x| J::Bool(x.1)),
            ),
            ("server_cpu_ms_per_s_schedstat", J::Num(c.server_cpu.0)),
            ("server_cpu_ms_per_s_utime_stime", J::Num(c.server_cpu.1)),
            ("client_cpu_ms_per_s_schedstat", J::Num(c.client_cpu.0)),
            ("client_cpu_ms_per_s_utime_stime", J::Num(c.client_cpu.1)),
            ("client_vmrss_kib", J::Num(c.client_rss_kib as f64)),
            ("window_s", J::Num(c.window_s)),
        ])
    });
    let heartbeat = r.heartbeat.iter().map(|h| {
        let us: Vec<f64> = h.times_ns.iter().map(|&t| t as f64 / 1e3).collect();
        J::Obj(vec![
            ("statement", s(h.statement)),
            ("keys", J::Num(h.keys as f64)),
            ("keys_of_another_session", J::Num(h.others as f64)),
            ("us", dist_json(&us)),
        ])
    });
    J::Obj(vec![
        ("mode", s(if p.quick { "quick" } else { "full" })),
        ("command", s(&p.command)),
        ("metrics_feature", J::Bool(crate::METRICS)),
        (
            "machine",
            J::Obj(vec![
                ("nproc", J::Num(m.nproc as f64)),
                ("cpu", s(&m.cpu)),
                ("postgresql", s(&m.postgres)),
                ("date", s(&m.date)),
                ("load_average_at_start", s(&m.load)),
            ]),
        ),
        (
            "intervals_ms",
            J::Obj(vec![
                ("retry", msj(iv.retry)),
                ("heartbeat", msj(iv.heartbeat)),
                ("query_timeout", msj(iv.query_timeout)),
                ("guard_margin", msj(iv.guard_margin)),
                ("guard_timeout", msj(iv.guard_timeout())),
                ("window", msj(iv.window())),
            ]),
        ),
        ("reps", J::Num(p.reps as f64)),
        ("slow_reps", J::Num(p.slow_reps as f64)),
        ("takeover_reps", J::Num(p.takeover_reps as f64)),
        ("lock_delay_reps", J::Num(p.delay_reps as f64)),
        ("herd_reps", J::Num(p.herd_reps as f64)),
        ("group_reps", J::Num(p.group_reps as f64)),
        ("group_restarts", J::Num(p.group_restarts as f64)),
        ("failover", J::Arr(cells.collect())),
        (
            "takeover",
            r.takeover.as_ref().map_or(J::Null, takeover_json),
        ),
        ("groups", J::Arr(r.groups.iter().map(groups_json).collect())),
        ("database_and_client_cost", J::Arr(costs.collect())),
        ("heartbeat", J::Arr(heartbeat.collect())),
        ("failover_seconds", J::Num(r.failover_secs)),
        ("takeover_seconds", J::Num(r.takeover_secs)),
        ("total_seconds", J::Num(r.total_secs)),
    ])
}

// ---- SVG ----

/// A strip plot: one row per scenario, driver and design, every repetition a dot on a
/// log-scale time axis, the median a bar; no failover within the window is an arrow at
/// the window.
fn svg(r: &Results) -> String {
    const LEFT: f64 = 210.0;
    const PLOT: f64 = 620.0;
    const ROW: f64 = 16.0;
    const TOP: f64 = 50.0;
    let window = ms(r.plan.intervals.window().as_nanos() as u64);
    let all: Vec<f64> = r.cells.iter().flat_map(gaps).filter(|&g| g > 0.0).collect();
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .min(window)
        .log10()
        .floor();
    let hi = all
        .iter()
        .copied()
        .fold(window, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let x = |v: f64| LEFT + (v.max(1e-3).log10() - lo) / (hi - lo) * PLOT;
    let mut rows = Vec::new();
    for sc in Scenario::ALL {
        for driver in DRIVERS {
            for design in Design::BOTH {
                if let Some(c) = cell(r, sc, driver, design) {
                    rows.push(c);
                }
            }
        }
    }
    let height = TOP + ROW * rows.len() as f64 + 40.0;
    let width = LEFT + PLOT + 170.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"18\" font-size=\"14\">lease failover gap ({} mode; retry {}, \
         heartbeat {}, query timeout {}): each dot one repetition, bar = median</text>\n\
         <text x=\"10\" y=\"36\"><tspan fill=\"#1f77b4\">● default (guard + NOTIFY)</tspan>  \
         <tspan fill=\"#e6550d\">● reference (--no-guard --no-notify --no-wait)</tspan>  \
         ▶ = no failover within the window</text>",
        if r.plan.quick { "quick" } else { "full" },
        secs(r.plan.intervals.retry),
        secs(r.plan.intervals.heartbeat),
        secs(r.plan.intervals.query_timeout)
    );
    let bottom = TOP + ROW * rows.len() as f64;
    let mut decade = lo;
    while decade <= hi {
        let v = 10f64.powf(decade);
        let label = if v >= 1000.0 {
            format!("{} s", v / 1000.0)
        } else {
            format!("{v} ms")
        };
        let _ = writeln!(
            o,
            "<line x1=\"{0:.1}\" y1=\"{TOP}\" x2=\"{0:.1}\" y2=\"{bottom}\" stroke=\"#ddd\"/>\
             <text x=\"{0:.1}\" y=\"{1}\" text-anchor=\"middle\">{label}</text>",
            x(v),
            bottom + 14.0
        );
        decade += 1.0;
    }
    let _ = writeln!(
        o,
        "<line x1=\"{0:.1}\" y1=\"{TOP}\" x2=\"{0:.1}\" y2=\"{bottom}\" stroke=\"#999\" \
         stroke-dasharray=\"4 3\"/><text x=\"{0:.1}\" y=\"{1}\" text-anchor=\"middle\" \
         fill=\"#666\">window {2}</text>",
        x(window),
        bottom + 28.0,
        secs(r.plan.intervals.window())
    );
    for (i, c) in rows.iter().enumerate() {
        let y = TOP + ROW * i as f64 + ROW / 2.0;
        let color = match c.design {
            Design::Default => "#1f77b4",
            Design::Reference => "#e6550d",
        };
        if i % 4 == 0 {
            let _ = writeln!(
                o,
                "<line x1=\"10\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#bbb\"/>",
                y - ROW / 2.0,
                LEFT + PLOT
            );
        }
        let _ = writeln!(
            o,
            "<text x=\"10\" y=\"{:.1}\" fill=\"{color}\">{} · {} · {}</text>",
            y + 4.0,
            c.scenario.name(),
            c.driver.name(),
            c.design.name()
        );
        for g in gaps(c) {
            let _ = writeln!(
                o,
                "<circle cx=\"{:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{color}\" fill-opacity=\"0.55\"/>",
                x(g)
            );
        }
        if let Some(d) = dist(&gaps(c)) {
            let _ = writeln!(
                o,
                "<line x1=\"{0:.1}\" y1=\"{1:.1}\" x2=\"{0:.1}\" y2=\"{2:.1}\" stroke=\"black\" \
                 stroke-width=\"2\"/>",
                x(d.median),
                y - 6.0,
                y + 6.0
            );
        }
        let none = c.reps.iter().filter(|r| r.gap_ns.is_none()).count();
        if none > 0 {
            let xw = x(window);
            let _ = writeln!(
                o,
                "<path d=\"M{:.1} {:.1} l8 5 l-8 5 z\" fill=\"{color}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{none}/{}: none within {}</text>",
                xw,
                y - 5.0,
                LEFT + PLOT + 10.0,
                y + 4.0,
                c.reps.len(),
                secs(r.plan.intervals.window())
            );
        }
    }
    o.push_str("</svg>\n");
    o
}
