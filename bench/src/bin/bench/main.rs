//! `bench`: the failover, takeover and cost benchmark of `lease`.
//!
//! ```text
//! cargo run --release -p lease-bench --bin bench -- [--quick] [--reps N] [--herd N]
//!     [--herd-reps N] [--group-reps N] [--out DIR] [--only PHASE[,PHASE...]]
//! ```
//!
//! (`--help` says what each option does.)
//!
//! Starts an ephemeral PostgreSQL server ([`Cluster`]), runs `replica` processes (the
//! binary next to this one, built on demand) for both drivers and measures:
//! - in two configurations (the defaults, and a "reference design" close to the Go
//!   package: `--no-guard --no-notify --no-wait`), the failover gap after a graceful
//!   release, SIGKILL, `pg_terminate_backend`, a partition, a freeze (SIGSTOP) and a
//!   server restart, and how long old and new jobs overlapped ([`failover`]);
//! - at the library defaults, instant takeover: SIGKILL of the holder → the standby's
//!   job start, a herd of standbys on one key (ten; `--herd N`), and `pg_terminate_backend` of the
//!   holder at lock-delays 0, 5 and 20 ms for `replica` processes and for `lease run`
//!   (the lease-cli binary, built on demand like `replica`) ([`takeover`]);
//! - statements/s and server CPU per locker holding or standing by for 1, 100, 1,000
//!   leases, the heartbeat's duration against the number of keys held, and the client
//!   process's CPU and memory at rest ([`cost`]);
//! - a lease group of three `replica` processes sharing 12 leases: settling at 4/4/4,
//!   SIGKILL of a member → its leases led again by the others, its restart, a rolling
//!   restart and how often each lease moved, server restarts → every lease led again,
//!   overlap and tokens over every term, and the sessions per process ([`groups`]).
//!
//! `--only` with a comma-separated list of `failover`, `takeover`, `groups` and `cost`
//! runs those phases only (the report then leaves the others' sections out). Built with `--features metrics`,
//! the bench builds its replicas with the drivers' `metrics` feature and a Prometheus
//! recorder installed (the report's header says which): run it both ways to see what the
//! feature costs a client.
//!
//! Writes `DIR/results.md`, `DIR/results.json` and `DIR/failover.svg` ([`report`]), and
//! for a groups-phase kill slower than [`groups::SLOW_KILL`] the members' log lines
//! around it in `DIR/slow/`.
//!
//! `bench --stamp-child` ([`STAMP_CHILD`]) is not for people: it is the command the
//! takeover phase runs under `lease run` ([`takeover::stamp_child`]).

mod cost;
mod duel;
mod failover;
mod groups;
mod pg;
mod report;
mod takeover;

use lease_proto::ServerWait;
use lease_tests::scenario::{Driver, Node, ReplicaConfig};
use lease_tests::Cluster;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// Built with the `metrics` feature: the replicas record the drivers' metrics.
pub const METRICS: bool = cfg!(feature = "metrics");

/// Errors are readable sentences; the bench prints them and exits 1.
pub type R<T> = Result<T, String>;

/// The database of the failover scenarios.
pub const FAILOVER_DB: &str = "bench_failover";

pub const DRIVERS: [Driver; 2] = [Driver::Tokio, Driver::Smol];

/// The two configurations compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Design {
    /// Library defaults: server guard, NOTIFY handover and waiting on the server on.
    Default,
    /// As close to the Go package as the options allow: `--no-guard --no-notify --no-wait`.
    Reference,
}

impl Design {
    pub const BOTH: [Design; 2] = [Design::Default, Design::Reference];

    pub fn name(self) -> &'static str {
        match self {
            Design::Default => "default",
            Design::Reference => "reference",
        }
    }

    /// Server guard, NOTIFY handover and waiting on the server on?
    pub fn additions(self) -> bool {
        self == Design::Default
    }
}

/// The lease timing every replica of a run uses.
#[derive(Clone, Copy, Debug)]
pub struct Intervals {
    pub retry: Duration,
    pub heartbeat: Duration,
    pub query_timeout: Duration,
    pub guard_margin: Duration,
}

impl Intervals {
    /// `idle_session_timeout` with the guard on: heartbeat + query timeout + margin.
    pub fn guard_timeout(&self) -> Duration {
        self.heartbeat + self.query_timeout + self.guard_margin
    }

    /// How long after a fault the bench waits for a new leader: the slowest expected
    /// failover (server guard, then one poll) plus half a poll, at least 1 s, of slack.
    pub fn window(&self) -> Duration {
        self.guard_timeout() + self.retry + (self.retry / 2).max(Duration::from_secs(1))
    }
}

/// A `replica` of `design` with intervals `iv`; its job does nothing (no tick lines)
/// until cancelled.
pub fn replica(
    iv: &Intervals,
    driver: Driver,
    design: Design,
    url: &str,
    lease: &str,
    leases: usize,
) -> ReplicaConfig {
    let mut rc = ReplicaConfig::new(driver, url, lease);
    rc.leases = leases;
    rc.retry = iv.retry;
    rc.heartbeat = iv.heartbeat;
    rc.query_timeout = iv.query_timeout;
    rc.guard_margin = iv.guard_margin;
    rc.guard = design.additions();
    rc.notify = design.additions();
    rc.server_wait = if design.additions() {
        ServerWait::IdleAndWatch
    } else {
        ServerWait::Off
    };
    rc.tick = Duration::ZERO;
    rc.app_name = Some(format!("bench-{lease}"));
    rc
}

/// UTC seconds since midnight of `t`, as the logs' times of day read.
pub fn seconds_of_day(t: std::time::SystemTime) -> f64 {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (since.as_micros() % 86_400_000_000) as f64 / 1e6
}

/// The seconds since midnight a log line's time of day reads, `HH:MM:SS.fraction` at
/// bytes `at` of `line` (the server's `2026-12-03 08:23:42.789 UTC`: `11..23`; a
/// replica's `2026-12-03T08:23:42.789012Z`: `11..26`).
pub fn line_seconds_of_day(line: &str, at: std::ops::Range<usize>) -> Option<f64> {
    let t: Vec<f64> = (line.get(at)?.split(':'))
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    Some(t.first()? * 3600.0 + t.get(1)? * 60.0 + t.get(2)?)
}

/// `what` failed with `error`; the last output lines of `nodes` explain it.
pub fn failed(what: &str, error: impl std::fmt::Display, nodes: &[&Node]) -> String {
    let mut msg = format!("{what}: {error}");
    for node in nodes {
        msg.push('\n');
        msg.push_str(&node.tail());
    }
    msg
}

/// The phases of a run, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The failover scenarios ([`failover`]).
    Failover,
    /// Instant takeover, the herd and the lock-delay study ([`takeover`]).
    Takeover,
    /// A lease group of three members ([`groups`]).
    Groups,
    /// The heartbeat timing and the database and client cost ([`cost`]).
    Cost,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Failover, Phase::Takeover, Phase::Groups, Phase::Cost];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Failover => "failover",
            Phase::Takeover => "takeover",
            Phase::Cost => "cost",
            Phase::Groups => "groups",
        }
    }
}

/// The first argument that makes this binary the stamping child of `lease run`.
pub const STAMP_CHILD: &str = "--stamp-child";

/// The programs a run starts.
#[derive(Clone, Debug)]
pub struct Bins {
    /// `replica`.
    pub replica: PathBuf,
    /// `lease` (lease-cli), built only when the takeover phase runs.
    pub lease: Option<PathBuf>,
    /// This binary: the child `lease run` runs (`bench --stamp-child`).
    pub bench: PathBuf,
}

/// Everything the command line decides.
#[derive(Clone, Debug)]
pub struct Plan {
    pub quick: bool,
    /// Run only these phases (`--only`, in the usual order whatever the list's);
    /// `None`: all.
    pub only: Option<Vec<Phase>>,
    pub intervals: Intervals,
    /// Repetitions of the fast failover scenarios (graceful, kill, terminate).
    pub reps: usize,
    /// Repetitions of the slow ones (partition, freeze, restart).
    pub slow_reps: usize,
    /// Takeover phase: repetitions of the kill per driver.
    pub takeover_reps: usize,
    /// Takeover phase: repetitions of the terminate per lock-delay and contender.
    pub delay_reps: usize,
    /// Takeover phase: repetitions of the herd per driver.
    pub herd_reps: usize,
    /// Takeover phase: standbys in the herd.
    pub herd: usize,
    /// Groups phase: SIGKILLs of a member per driver.
    pub group_reps: usize,
    /// Groups phase: server restarts per driver.
    pub group_restarts: usize,
    /// Length of each cost measurement window.
    pub cost_window: Duration,
    /// Timed heartbeats per lease count.
    pub heartbeat_reps: usize,
    pub out: PathBuf,
    pub command: String,
}

const USAGE: &str = concat!(
    "usage: bench [--quick] [--reps N] [--herd N] [--herd-reps N] [--group-reps N]\n",
    "             [--out DIR]\n",
    "             [--only PHASE[,PHASE...]]\n",
    "  --quick    short intervals (retry 200 ms, heartbeat 200 ms, query timeout 500 ms,\n",
    "             guard margin 200 ms) and few repetitions\n",
    "  --reps N   repetitions: of the fast failover scenarios (default 8; the slow ones,\n",
    "             partition, freeze, restart, get N / 3 rounded up) and of the takeover\n",
    "             phase's kill (default 40, with --quick 10; its pg_terminate_backend\n",
    "             per lock-delay gets N / 2 rounded up, its herd N / 8 rounded up, the\n",
    "             groups phase's SIGKILL of a member N / 2 rounded up)\n",
    "  --herd N   standbys in the takeover phase's herd (default 10)\n",
    "  --herd-reps N\n",
    "             repetitions of the herd per driver (default: --reps' N / 8 rounded up)\n",
    "  --group-reps N\n",
    "             SIGKILLs of a group member per driver (default: --reps' N / 2 rounded\n",
    "             up); the group's server restarts: a third of them, rounded up\n",
    "  --out DIR  where results.md, results.json and failover.svg go (default bench/);\n",
    "             a slow kill of the groups phase leaves its logs in DIR/slow/\n",
    "  --only PHASE[,PHASE...]\n",
    "             run only these phases (a comma-separated list; they run in the usual\n",
    "             order): failover (the failover scenarios); takeover (kill -9, a herd of\n",
    "             ten, pg_terminate_backend at lock-delays 0, 5, 20 ms, also with lease\n",
    "             run); groups (a lease group of three processes and 12 leases: settle,\n",
    "             kill -9 of a member, its restart, a rolling restart, server restarts,\n",
    "             sessions per process); cost (the heartbeat timing and the database and\n",
    "             client cost). The report leaves the other phases out; without failover\n",
    "             scenarios no failover.svg is written",
);

/// The positive number after option `name`.
fn positive(name: &str, value: Option<&String>) -> R<usize> {
    let v = value.ok_or(format!("{name} needs a number"))?;
    (v.parse().ok().filter(|&n: &usize| n > 0)).ok_or(format!("{name}: not a positive number: {v}"))
}

/// The plan, or `None` after `--help`.
fn parse_args() -> R<Option<Plan>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut quick, mut reps, mut out) = (false, None, PathBuf::from("bench"));
    let mut only = None;
    let mut herd = None;
    let mut herd_reps = None;
    let mut group_reps = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--reps" => reps = Some(positive(arg, it.next())?),
            "--herd" => {
                let v = it.next().ok_or("--herd needs a number")?;
                herd = Some(
                    v.parse()
                        .ok()
                        .filter(|&n: &usize| (1..=500).contains(&n))
                        .ok_or(format!("--herd: not a number from 1 to 500: {v}"))?,
                );
            }
            "--herd-reps" => herd_reps = Some(positive(arg, it.next())?),
            "--group-reps" => group_reps = Some(positive(arg, it.next())?),
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a directory")?),
            "--only" => {
                let list = it
                    .next()
                    .ok_or("--only needs failover, takeover, cost or groups")?;
                let mut phases = Vec::new();
                for name in list.split(',') {
                    let phase =
                        Phase::ALL
                            .into_iter()
                            .find(|p| p.name() == name)
                            .ok_or(format!(
                                "--only: failover, takeover, cost or groups, not {name:?}"
                            ))?;
                    if !phases.contains(&phase) {
                        phases.push(phase);
                    }
                }
                only = Some(phases);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    let ms = Duration::from_millis;
    let intervals = if quick {
        Intervals {
            retry: ms(200),
            heartbeat: ms(200),
            query_timeout: ms(500),
            guard_margin: ms(200),
        }
    } else {
        Intervals {
            retry: lease_proto::limits::DEFAULT_RETRY_INTERVAL,
            heartbeat: lease_proto::limits::DEFAULT_HEARTBEAT_INTERVAL,
            query_timeout: lease_proto::limits::DEFAULT_QUERY_TIMEOUT,
            guard_margin: lease_proto::limits::DEFAULT_GUARD_MARGIN,
        }
    };
    let mut command = String::from(if METRICS {
        "cargo run --release -p lease-bench --features metrics --bin bench --"
    } else {
        "cargo run --release -p lease-bench --bin bench --"
    });
    for a in &args {
        command.push(' ');
        command.push_str(a);
    }
    let fast = reps.unwrap_or(8);
    let takeover = reps.unwrap_or(if quick { 10 } else { 40 });
    Ok(Some(Plan {
        quick,
        only,
        intervals,
        reps: fast,
        slow_reps: fast.div_ceil(3),
        takeover_reps: takeover,
        delay_reps: takeover.div_ceil(2),
        herd_reps: herd_reps.unwrap_or(takeover.div_ceil(8)),
        herd: herd.unwrap_or(crate::takeover::HERD),
        group_reps: group_reps.unwrap_or(takeover.div_ceil(2)),
        group_restarts: group_reps.unwrap_or(takeover.div_ceil(2)).div_ceil(3),
        cost_window: if quick { ms(3_000) } else { ms(15_000) },
        heartbeat_reps: if quick { 300 } else { 2_000 },
        out,
        command,
    }))
}

/// Builds binary `bin` of package `package` as this binary was built. The replica measured
/// is built with the drivers' metrics (and a recorder) or without, as this binary was.
fn build(package: &str, bin: &str) -> R<PathBuf> {
    let features: &[&str] = if METRICS && package == "lease-tests" {
        &["metrics"]
    } else {
        &[]
    };
    lease_bench::build_sibling(package, bin, features)
}

/// The machine, for the report header.
#[derive(Clone, Debug)]
pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub postgres: String,
    pub date: String,
    /// `/proc/loadavg`'s 1-minute load when the run started (other work on the machine).
    pub load: String,
}

fn machine(cluster: &Cluster) -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    Machine {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu,
        postgres: cluster
            .sql("SHOW server_version")
            .unwrap_or_else(|e| format!("unknown ({e})")),
        date,
        load: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_owned))
            .unwrap_or_default(),
    }
}

fn run(plan: &Plan) -> R<()> {
    let began = Instant::now();
    let runs = |phase: Phase| plan.only.as_ref().is_none_or(|only| only.contains(&phase));
    let bins = Bins {
        replica: build("lease-tests", "replica")?,
        lease: if runs(Phase::Takeover) {
            Some(build("lease-cli", "lease")?)
        } else {
            None
        },
        bench: std::env::current_exe().map_err(|e| format!("locating the bench binary: {e}"))?,
    };
    eprintln!("bench: starting an ephemeral PostgreSQL server");
    let mut cluster = Cluster::start().map_err(|e| format!("starting PostgreSQL: {e}"))?;
    // Autovacuum workers commit transactions in the databases they visit, which would
    // count as statements of the locker measured there.
    cluster
        .sql("ALTER SYSTEM SET autovacuum = off")
        .and_then(|_| cluster.sql("SELECT pg_reload_conf()"))
        .and_then(|_| cluster.create_database(FAILOVER_DB))
        .map_err(|e| format!("preparing the server: {e}"))?;
    let machine = machine(&cluster);
    let iv = plan.intervals;
    eprintln!(
        "bench: {} mode, retry {:?}, heartbeat {:?}, query timeout {:?}, guard margin {:?}, \
         window {:?}, {} / {} failover reps, {} / {} / {} takeover reps (kill / terminate / \
         herd)",
        if plan.quick { "quick" } else { "full" },
        iv.retry,
        iv.heartbeat,
        iv.query_timeout,
        iv.guard_margin,
        iv.window(),
        plan.reps,
        plan.slow_reps,
        plan.takeover_reps,
        plan.delay_reps,
        plan.herd_reps
    );
    let mut bench = duel::Bench::new(&mut cluster, &bins, iv)?;
    let cells = if runs(Phase::Failover) {
        failover::run_all(&mut bench, plan)?
    } else {
        Vec::new()
    };
    let failover_secs = began.elapsed().as_secs_f64();
    let takeover = if runs(Phase::Takeover) {
        Some(takeover::run_all(&mut bench, plan)?)
    } else {
        None
    };
    let takeover_secs = began.elapsed().as_secs_f64() - failover_secs;
    let groups = if runs(Phase::Groups) {
        groups::run_all(&mut bench, plan)?
    } else {
        Vec::new()
    };
    drop(bench);
    let (heartbeat, costs) = if runs(Phase::Cost) {
        eprintln!("bench: heartbeat duration against lease count");
        let heartbeat = cost::heartbeat(&cluster, plan.heartbeat_reps)?;
        (heartbeat, cost::run_all(&cluster, &bins.replica, plan)?)
    } else {
        (Vec::new(), Vec::new())
    };
    let results = report::Results {
        plan: plan.clone(),
        machine,
        cells,
        takeover,
        groups,
        heartbeat,
        costs,
        failover_secs,
        takeover_secs,
        total_secs: began.elapsed().as_secs_f64(),
    };
    report::write(&results)
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(STAMP_CHILD) {
        return takeover::stamp_child();
    }
    let plan = match parse_args() {
        Ok(Some(plan)) => plan,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&plan) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}
