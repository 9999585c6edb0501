//! Failover gap and overlap, scenario by scenario.
//!
//! One repetition: replica "old" starts and wins the lease (through a [`FaultProxy`] for
//! the partition), replica "new" starts and stands by; once "new" has tried the lease
//! once, the bench waits a random fraction of the retry interval (so that the fault falls
//! at a random phase of the standby's polling and of the holder's heartbeat), injects the
//! fault at `t0` and waits up to [`Intervals::window`] for the first `start` of any replica
//! after `t0`. Every repetition uses a lease name of its own and fresh processes.

use crate::pg::Pg;
use crate::{failed, replica, Design, Intervals, Plan, DRIVERS, FAILOVER_DB, R};
use lease_tests::scenario::{overlap, Driver, Event, Node, TRY_PREFIX, WAIT_PREFIX};
use lease_tests::{monotonic_nanos, Cluster, FaultProxy, Mode};
use std::net::SocketAddr;
use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Graceful,
    Kill,
    Terminate,
    Partition,
    Freeze,
    Restart,
}

impl Scenario {
    pub const ALL: [Scenario; 6] = [
        Scenario::Graceful,
        Scenario::Kill,
        Scenario::Terminate,
        Scenario::Partition,
        Scenario::Freeze,
        Scenario::Restart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Graceful => "graceful",
            Scenario::Kill => "kill",
            Scenario::Terminate => "terminate",
            Scenario::Partition => "partition",
            Scenario::Freeze => "freeze",
            Scenario::Restart => "restart",
        }
    }

    /// What the fault is, for the report.
    pub fn what(self) -> &'static str {
        match self {
            Scenario::Graceful => "SIGTERM to the holder: graceful release",
            Scenario::Kill => "SIGKILL to the holder",
            Scenario::Terminate => "pg_terminate_backend of the holder's backend",
            Scenario::Partition => "the holder's proxy black-holes all traffic",
            Scenario::Freeze => "SIGSTOP to the holder",
            Scenario::Restart => "server restart (fast shutdown, start)",
        }
    }

    /// Scenarios whose repetitions take long (guard timeout or a server restart).
    pub fn slow(self) -> bool {
        matches!(
            self,
            Scenario::Partition | Scenario::Freeze | Scenario::Restart
        )
    }
}

/// One repetition's outcome.
#[derive(Clone, Debug)]
pub struct Rep {
    /// First `start` after the fault minus the fault instant; `None`: none within the window.
    pub gap_ns: Option<u64>,
    /// Longest time an old job and a new job of different replicas ran at once.
    pub overlap_ns: u64,
    /// The first job after the fault ran on the old holder (it reconnected and won again).
    pub old_won: bool,
}

/// The repetitions of one scenario, driver and design.
#[derive(Clone, Debug)]
pub struct Cell {
    pub scenario: Scenario,
    pub driver: Driver,
    pub design: Design,
    pub reps: Vec<Rep>,
}

struct Bench<'a> {
    cluster: &'a mut Cluster,
    admin: Pg,
    bin: &'a Path,
    iv: Intervals,
    rng: u64,
}

pub fn run_all(cluster: &mut Cluster, bin: &Path, plan: &Plan) -> R<Vec<Cell>> {
    let admin = Pg::connect(cluster.port(), "postgres", "bench-admin")?;
    let mut bench = Bench {
        cluster,
        admin,
        bin,
        iv: plan.intervals,
        rng: monotonic_nanos() | 1,
    };
    let mut cells = Vec::new();
    for scenario in Scenario::ALL {
        for driver in DRIVERS {
            for design in Design::BOTH {
                let n = if scenario.slow() {
                    plan.slow_reps
                } else {
                    plan.reps
                };
                let mut reps = Vec::with_capacity(n);
                for i in 0..n {
                    let lease = format!(
                        "{}-{}-{}-{i}",
                        scenario.name(),
                        driver.name(),
                        design.name()
                    );
                    reps.push(bench.rep(scenario, driver, design, &lease)?);
                }
                let gaps: Vec<String> = reps
                    .iter()
                    .map(|r| {
                        r.gap_ns
                            .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6))
                    })
                    .collect();
                eprintln!(
                    "bench: {:<9} {:<5} {:<9} gaps ms [{}]",
                    scenario.name(),
                    driver.name(),
                    design.name(),
                    gaps.join(" ")
                );
                cells.push(Cell {
                    scenario,
                    driver,
                    design,
                    reps,
                });
            }
        }
    }
    Ok(cells)
}

impl Bench<'_> {
    /// Uniform in [0, 1) (xorshift64*).
    fn random(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn spawn(
        &self,
        url: &str,
        design: Design,
        driver: Driver,
        lease: &str,
        label: &str,
    ) -> R<Node> {
        replica(&self.iv, driver, design, url, lease, 1)
            .spawn(self.bin, label)
            .map_err(|e| format!("spawning replica {label}: {e}"))
    }

    fn rep(&mut self, scenario: Scenario, driver: Driver, design: Design, lease: &str) -> R<Rep> {
        let iv = self.iv;
        let setup = Duration::from_secs(30) + 2 * iv.retry;
        let upstream = SocketAddr::from(([127, 0, 0, 1], self.cluster.port()));
        let proxy = match scenario {
            Scenario::Partition => Some(FaultProxy::start(upstream).map_err(|e| e.to_string())?),
            _ => None,
        };
        let direct = self.cluster.url(FAILOVER_DB);
        let via = proxy.as_ref().map_or(direct.clone(), |p| {
            format!("postgres://postgres@127.0.0.1:{}/{FAILOVER_DB}", p.port())
        });
        let mut old = self.spawn(&via, design, driver, lease, "old")?;
        old.wait_start(0, setup)
            .map_err(|e| failed("the first replica did not start its job", e, &[&old]))?;
        let (old_backend, _) = old
            .wait_pid(0, setup)
            .map_err(|e| failed("the first replica printed no backend pid", e, &[&old]))?;
        let new = self.spawn(&direct, design, driver, lease, "new")?;
        let (new_backend, _) = new
            .wait_pid(0, setup)
            .map_err(|e| failed("the standby printed no backend pid", e, &[&new]))?;
        wait_tried(&self.admin, new_backend, setup)
            .map_err(|e| failed("the standby did not stand by", e, &[&new]))?;
        sleep(iv.retry.mul_f64(self.random()));

        let t0 = monotonic_nanos();
        let fault = match scenario {
            Scenario::Graceful => old.replica().sigterm().map_err(|e| e.to_string()),
            Scenario::Kill => old.kill9().map(drop).map_err(|e| e.to_string()),
            Scenario::Terminate => self
                .admin
                .one(&format!("SELECT pg_terminate_backend({old_backend})"))
                .map(drop),
            Scenario::Partition => {
                if let Some(p) = &proxy {
                    p.set_mode(Mode::BlackHole);
                }
                Ok(())
            }
            Scenario::Freeze => old.replica().sigstop().map_err(|e| e.to_string()),
            Scenario::Restart => self
                .cluster
                .restart()
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    self.admin = Pg::connect(self.cluster.port(), "postgres", "bench-admin")?;
                    Ok(())
                }),
        };
        fault.map_err(|e| failed(&format!("injecting {}", scenario.name()), e, &[&old, &new]))?;

        // The window runs from the end of the injection (a restart takes a while).
        let deadline = monotonic_nanos() + iv.window().as_nanos() as u64;
        let first = loop {
            if let Some(found) = first_start(&[&old, &new], t0) {
                break Some(found);
            }
            if monotonic_nanos() >= deadline {
                break None;
            }
            sleep(Duration::from_millis(5));
        };
        // Wait for the old job's end to be printed (the frozen one prints nothing: its
        // last valid_until bounds it), so that its term has its real end.
        if scenario != Scenario::Freeze {
            let deadline = monotonic_nanos() + 2_000_000_000;
            while old.terms().iter().any(|t| t.start < t0 && t.end.is_none())
                && monotonic_nanos() < deadline
            {
                sleep(Duration::from_millis(5));
            }
        }
        Ok(Rep {
            gap_ns: first.map(|(_, t)| t - t0),
            overlap_ns: worst_overlap(&old, &new),
            old_won: first.is_some_and(|(who, _)| who == 0),
        })
    }
}

/// Waits until backend `pid` has sent a standby try: its session is set up (and
/// listening, with notifications on) and it stands by.
pub fn wait_tried(admin: &Pg, pid: i32, timeout: Duration) -> R<()> {
    let deadline = monotonic_nanos() + timeout.as_nanos() as u64;
    let sql = format!("SELECT query FROM pg_stat_activity WHERE pid = {pid}");
    loop {
        let rows = admin.rows(&sql)?;
        let query = rows.first().and_then(|r| r.first().cloned().flatten());
        // A try, or the wait on the server that follows a try that lost.
        let stands_by = |q: &str| q.starts_with(TRY_PREFIX) || q.starts_with(WAIT_PREFIX);
        if query.as_deref().is_some_and(stands_by) {
            return Ok(());
        }
        if monotonic_nanos() > deadline {
            return Err(format!(
                "backend {pid} sent no standby try within {timeout:?} (last: {query:?})"
            ));
        }
        sleep(Duration::from_millis(5));
    }
}

/// The earliest `start` at or after `t0` among `nodes`: (index of the node, time).
fn first_start(nodes: &[&Node], t0: u64) -> Option<(usize, u64)> {
    nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            node.events().into_iter().find_map(|e| match e {
                Event::Start { t, .. } if t >= t0 => Some((i, t)),
                _ => None,
            })
        })
        .min_by_key(|&(_, t)| t)
}

/// The longest overlap between a job of `a` and a job of `b`. A job runs from its `start`
/// to its `cancel` or `stop`, the kill, or its last printed `valid_until`, whichever is
/// first (a frozen job does nothing, and checks validity before it acts on resume).
fn worst_overlap(a: &Node, b: &Node) -> u64 {
    let now = monotonic_nanos();
    let (ta, tb) = (a.terms(), b.terms());
    ta.iter()
        .flat_map(|x| tb.iter().map(move |y| (x, y)))
        .map(|(x, y)| overlap((x.start, x.valid_end(now)), (y.start, y.valid_end(now))))
        .max()
        .unwrap_or(0)
}
