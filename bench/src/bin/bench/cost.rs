//! What a locker costs the database and its own process.
//!
//! Every locker runs in a database of its own, holding 1, 100 or 1,000 leases, or standing
//! by for 1, 100 or 1,000 leases that a plain session (which sends nothing meanwhile)
//! holds. Every statement that reads `pg_locks` (heartbeat, standby try) pays for every
//! lock on the server, so the 1-lease lockers (a dozen locks in all) share one window and
//! the others run alone. Over its window the bench reads:
//! - statements: `pg_stat_database.xact_commit` of the locker's database, polled every
//!   50 ms. A backend publishes its counts at most once a second, so the rate is taken
//!   between the first and the last change seen in the window (exact counts at both ends);
//!   with fewer than two changes it falls back to the whole window (marked `~`);
//! - server CPU: the locker's backend's utime+stime (`/proc/PID/stat`, clock ticks) and its
//!   run time in nanoseconds (`/proc/PID/schedstat`), as ms per second;
//! - client CPU and memory: the same for the `replica` process (all its threads), and its
//!   `VmRSS` at the end.
//!
//! The replicas run with `--status-poll 0`: no status poller (which would dominate the
//! client's CPU at rest), hence no `pid` lines; the bench finds each locker's backend in
//! `pg_stat_activity` by its database and `application_name` (`bench-DB`, unique per
//! locker).
//!
//! The heartbeat's duration is timed separately: [`heartbeat`].

use crate::duel::wait_tried;
use crate::pg::Pg;
use crate::{failed, replica, Design, Plan, DRIVERS, FAILOVER_DB, R};
use lease_proto::{key_for_name, Statement};
use lease_tests::monotonic_nanos;
use lease_tests::scenario::{Driver, Node};
use lease_tests::Cluster;
use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

pub const LEASE_COUNTS: [usize; 3] = [1, 100, 1_000];
/// (keys the timed session holds, keys another session holds).
pub const HEARTBEAT_KEYS: [(usize, usize); 6] = [
    (1, 0),
    (10, 0),
    (100, 0),
    (1_000, 0),
    (1, 1_000),
    (1, 4_000),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Hold,
    Standby,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Hold => "holding",
            Role::Standby => "standing by",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Role::Hold => "hold",
            Role::Standby => "standby",
        }
    }
}

/// One locker's costs over the window.
#[derive(Clone, Debug)]
pub struct Cost {
    pub design: Design,
    pub driver: Driver,
    pub role: Role,
    pub leases: usize,
    /// Statements per second, and whether it was taken between two flushes (exact).
    pub statements: Option<(f64, bool)>,
    /// Backend CPU, ms/s: from schedstat, and from utime+stime.
    pub server_cpu: (f64, f64),
    /// `replica` process CPU, ms/s: from schedstat (all threads), and from utime+stime.
    pub client_cpu: (f64, f64),
    pub client_rss_kib: u64,
    pub window_s: f64,
}

/// Round trips of a heartbeat statement on a session holding `keys` keys.
#[derive(Clone, Debug)]
pub struct HeartbeatTiming {
    /// `heartbeat` (backend pid + nonce) or `verify` (that plus `pg_locks`).
    pub statement: &'static str,
    pub keys: usize,
    /// Keys held by another session meanwhile.
    pub others: usize,
    pub times_ns: Vec<u64>,
}

/// Times `Statement::Heartbeat` and `Statement::Verify` `reps` times each on one
/// tokio-postgres session holding `own` advisory keys while another session holds
/// `other` keys, for each pair of [`HEARTBEAT_KEYS`].
pub fn heartbeat(cluster: &Cluster, reps: usize) -> R<Vec<HeartbeatTiming>> {
    let pg = Pg::connect(cluster.port(), FAILOVER_DB, "bench-heartbeat")?;
    let other = Pg::connect(cluster.port(), FAILOVER_DB, "bench-heartbeat-other")?;
    let lock = |pg: &Pg, from: usize, n: usize| -> R<()> {
        let got = pg.one(&format!(
            "SELECT count(*) FROM generate_series({from}, {}) k WHERE pg_try_advisory_lock(k)",
            from + n - 1
        ))?;
        if got != n.to_string() {
            return Err(format!("locking {n} keys for the heartbeat got {got}"));
        }
        Ok(())
    };
    wait_unlocked(&pg)?;
    let statements = [
        ("heartbeat", Statement::Heartbeat.sql(), 0),
        ("verify", Statement::Verify.sql(), 1),
    ];
    for (_, sql, _) in &statements {
        pg.time(sql, 200)?;
    }
    let mut out = Vec::new();
    for (own, others) in HEARTBEAT_KEYS {
        lock(&pg, 1, own)?;
        if others > 0 {
            lock(&other, 1_000_000, others)?;
        }
        for (statement, sql, per_key) in &statements {
            pg.time(sql, reps.min(50))?;
            let (times_ns, rows) = pg.time(sql, reps)?;
            // The pid, nonce and server clock rows, then (verify) one row
            // per key held.
            if rows != 3 + per_key * own {
                return Err(format!(
                    "the {statement} on a session holding {own} keys returned {rows} rows"
                ));
            }
            out.push(HeartbeatTiming {
                statement,
                keys: own,
                others,
                times_ns,
            });
        }
        pg.rows("SELECT pg_advisory_unlock_all()")?;
        other.rows("SELECT pg_advisory_unlock_all()")?;
    }
    Ok(out)
}

fn db_name(design: Design, driver: Driver, role: Role, leases: usize) -> String {
    format!(
        "cost_{}_{}_{}_{leases}",
        design.name(),
        driver.name(),
        role.short()
    )
}

/// One locker to measure: design, driver, role, lease count.
type Spec = (Design, Driver, Role, usize);

/// Measures every locker: the 1-lease ones of both designs and drivers together in one
/// window (a dozen locks in all), each one with 100 or 1,000 leases alone (every
/// statement that reads `pg_locks` pays for every lock on the server, not only its own).
pub fn run_all(cluster: &Cluster, bin: &Path, plan: &Plan) -> R<Vec<Cost>> {
    let mut windows: Vec<Vec<Spec>> = vec![Vec::new()];
    for design in Design::BOTH {
        for driver in DRIVERS {
            for role in [Role::Hold, Role::Standby] {
                windows[0].push((design, driver, role, 1));
            }
        }
    }
    for leases in LEASE_COUNTS.into_iter().filter(|&n| n > 1) {
        for role in [Role::Hold, Role::Standby] {
            for design in Design::BOTH {
                for driver in DRIVERS {
                    windows.push(vec![(design, driver, role, leases)]);
                }
            }
        }
    }
    for &(design, driver, role, leases) in windows.iter().flatten() {
        cluster
            .create_database(&db_name(design, driver, role, leases))
            .map_err(|e| format!("creating a cost database: {e}"))?;
    }
    let admin = Pg::connect(cluster.port(), "postgres", "bench-admin")?;
    eprintln!(
        "bench: database and client cost: {} windows of {:?}",
        windows.len(),
        plan.cost_window
    );
    let mut out = Vec::new();
    for specs in &windows {
        out.extend(measure(cluster, &admin, bin, plan, specs)?);
        wait_unlocked(&admin)?;
    }
    Ok(out)
}

/// Waits (up to 5 s) until no advisory lock is held on the server.
fn wait_unlocked(admin: &Pg) -> R<()> {
    let mut left = String::new();
    for _ in 0..500 {
        left = admin.one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")?;
        if left == "0" {
            return Ok(());
        }
        sleep(Duration::from_millis(10));
    }
    Err(format!("{left} advisory locks outlived their lockers"))
}

/// A locker under measurement.
struct Subject {
    spec: Spec,
    db: String,
    node: Node,
    /// The locker's `application_name`.
    app: String,
    backend: i32,
    /// The session holding the keys a standby waits for.
    _keyholder: Option<Pg>,
}

/// Runs the lockers `specs` at once, each in its database, and measures them over one
/// window.
fn measure(cluster: &Cluster, admin: &Pg, bin: &Path, plan: &Plan, specs: &[Spec]) -> R<Vec<Cost>> {
    let setup = Duration::from_secs(60) + 2 * plan.intervals.retry;
    let mut subjects = Vec::new();
    for &spec in specs {
        let (design, driver, role, leases) = spec;
        let db = db_name(design, driver, role, leases);
        let lease = format!("{}-{leases}", design.name());
        let mut rc = replica(
            &plan.intervals,
            driver,
            design,
            &cluster.url(&db),
            &lease,
            leases,
        );
        // No status poller: at rest only the locker and its runtime run.
        rc.status_poll = Duration::ZERO;
        let app = format!("bench-{db}");
        rc.app_name = Some(app.clone());
        let keyholder = match role {
            Role::Hold => None,
            Role::Standby => {
                let pg = Pg::connect(cluster.port(), &db, "bench-keyholder")?;
                let keys: Vec<String> = rc
                    .names()
                    .iter()
                    .map(|n| key_for_name(n).to_string())
                    .collect();
                let got = pg.one(&format!(
                    "SELECT count(*) FROM unnest('{{{}}}'::int8[]) k WHERE pg_try_advisory_lock(k)",
                    keys.join(",")
                ))?;
                if got != leases.to_string() {
                    return Err(format!("holding {leases} keys in {db} got {got}"));
                }
                Some(pg)
            }
        };
        let node = rc
            .spawn(bin, &db)
            .map_err(|e| format!("spawning a replica: {e}"))?;
        subjects.push(Subject {
            spec,
            db,
            node,
            app,
            backend: 0,
            _keyholder: keyholder,
        });
    }
    for s in &mut subjects {
        let node = &s.node;
        let find = || {
            backend_pid(admin, &s.db, &s.app, setup)
                .map_err(|e| failed("a locker's backend was not found", e, &[node]))
        };
        s.backend = match s.spec.2 {
            Role::Hold => {
                node.wait_starts(s.spec.3, setup)
                    .map_err(|e| failed("a locker did not win its leases", e, &[node]))?;
                find()?
            }
            Role::Standby => {
                let backend = find()?;
                wait_tried(admin, backend, setup)
                    .map_err(|e| failed("a locker did not stand by", e, &[node]))?;
                backend
            }
        };
    }
    // Past the acquisition burst: one more heartbeat and try.
    sleep(plan.intervals.heartbeat.max(plan.intervals.retry) + Duration::from_millis(100));
    for s in &subjects {
        let now = backend_pid(admin, &s.db, &s.app, Duration::ZERO)
            .map_err(|e| failed("a locker's backend was not found", e, &[&s.node]))?;
        if now != s.backend {
            return Err(failed(
                "a locker reconnected before the window",
                format!("backend {} became {now}", s.backend),
                &[&s.node],
            ));
        }
    }

    let cpu_pairs = |subjects: &[Subject]| -> R<Vec<(Cpu, Cpu)>> {
        subjects
            .iter()
            .map(|s| Ok((cpu(s.backend)?, cpu(s.node.replica().pid())?)))
            .collect()
    };
    let t_start = monotonic_nanos();
    let before = cpu_pairs(&subjects)?;
    let mut series: Vec<Vec<(u64, i64)>> = vec![Vec::new(); subjects.len()];
    let end = t_start + plan.cost_window.as_nanos() as u64;
    loop {
        let rows = admin.rows(
            "SELECT datname, xact_commit FROM pg_stat_database WHERE datname LIKE 'cost\\_%'",
        )?;
        let t = monotonic_nanos();
        for (s, points) in subjects.iter().zip(&mut series) {
            let count = rows
                .iter()
                .find(|r| r.first().cloned().flatten().as_deref() == Some(s.db.as_str()))
                .and_then(|r| r.get(1).cloned().flatten()?.parse().ok());
            if let Some(count) = count {
                points.push((t, count));
            }
        }
        if t >= end {
            break;
        }
        sleep(Duration::from_millis(50));
    }
    let after = cpu_pairs(&subjects)?;
    let t_end = monotonic_nanos();
    let secs = (t_end - t_start) as f64 / 1e9;
    let mut out = Vec::new();
    for (i, s) in subjects.iter().enumerate() {
        let (b, a) = (before[i], after[i]);
        let (design, driver, role, leases) = s.spec;
        out.push(Cost {
            design,
            driver,
            role,
            leases,
            statements: statement_rate(&series[i]),
            server_cpu: a.0.minus(b.0, secs),
            client_cpu: a.1.minus(b.1, secs),
            client_rss_kib: rss_kib(s.node.replica().pid())?,
            window_s: secs,
        });
    }
    Ok(out)
}

/// The backend of the one session in database `db` whose `application_name` is `app`,
/// once there is exactly one (waits up to `timeout`).
fn backend_pid(admin: &Pg, db: &str, app: &str, timeout: Duration) -> R<i32> {
    let deadline = monotonic_nanos() + timeout.as_nanos() as u64;
    let sql = format!(
        "SELECT pid FROM pg_stat_activity WHERE datname = '{db}' AND application_name = '{app}'"
    );
    loop {
        let pids: Vec<i32> = admin
            .rows(&sql)?
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten()?.parse().ok())
            .collect();
        if let [pid] = pids[..] {
            return Ok(pid);
        }
        if monotonic_nanos() > deadline {
            return Err(format!(
                "sessions of {app} in {db}: {pids:?}, not exactly one within {timeout:?}"
            ));
        }
        sleep(Duration::from_millis(10));
    }
}

/// Statements per second from `(time, xact_commit)` samples: between the first and the
/// last change when there are two, else over all samples (not exact).
fn statement_rate(series: &[(u64, i64)]) -> Option<(f64, bool)> {
    let changes: Vec<(u64, i64)> = series
        .windows(2)
        .filter(|w| w[1].1 != w[0].1)
        .map(|w| w[1])
        .collect();
    let rate = |a: (u64, i64), b: (u64, i64)| (b.1 - a.1) as f64 / ((b.0 - a.0) as f64 / 1e9);
    match (changes.first(), changes.last()) {
        (Some(&a), Some(&b)) if changes.len() >= 2 => Some((rate(a, b), true)),
        _ => Some((rate(*series.first()?, *series.last()?), false)),
    }
}

/// CPU time of a process so far.
#[derive(Clone, Copy, Debug)]
struct Cpu {
    /// utime + stime, clock ticks.
    ticks: u64,
    /// Run time of all its threads, ns (schedstat).
    ns: u64,
}

impl Cpu {
    /// ms of CPU per second over `secs`: (schedstat, utime+stime).
    fn minus(self, earlier: Cpu, secs: f64) -> (f64, f64) {
        let hz = clock_ticks_per_s() as f64;
        let ns = self.ns.saturating_sub(earlier.ns) as f64 / 1e6 / secs;
        let ticks = self.ticks.saturating_sub(earlier.ticks) as f64 * 1e3 / hz / secs;
        (ns, ticks)
    }
}

/// The unit of utime and stime.
pub fn clock_ticks_per_s() -> i64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1)
}

fn cpu(pid: i32) -> R<Cpu> {
    let read = |path: String| std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"));
    let stat = read(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap_or(0) + 1..]
        .split_whitespace()
        .collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let ticks = field(11)
        .zip(field(12))
        .map(|(u, s)| u + s)
        .ok_or(format!("/proc/{pid}/stat: no utime/stime"))?;
    let mut ns = 0;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| format!("/proc/{pid}/task: {e}"))?;
    for task in tasks.flatten() {
        let text = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        ns += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(Cpu { ticks, ns })
}

fn rss_kib(pid: i32) -> R<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or(format!("/proc/{pid}/status: no VmRSS"))
}
