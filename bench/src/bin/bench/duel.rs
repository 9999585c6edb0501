//! One repetition of a fault between a holder and its standby: the step the failover
//! scenarios ([`crate::failover`]) and the takeover and lock-delay measurements
//! ([`crate::takeover`]) share.
//!
//! Contender "old" starts and wins the lease (through a [`FaultProxy`] for the partition),
//! contender "new" starts and stands by; once "new" has sent a try (or the wait on the
//! server that follows a lost try), the bench waits a random fraction of a span the caller
//! picks (so that the fault falls at a random phase of the standby's polling or waiting
//! and of the holder's heartbeat), injects the fault at `t0`, waits up to
//! [`Intervals::window`] for the first `start` of either after `t0`, then for the old
//! job's end. A contender is a `replica` process or `lease run` with the bench's stamping
//! child ([`Contender`]); every repetition uses a lease name of its own and fresh
//! processes.

use crate::pg::Pg;
use crate::{failed, replica, Bins, Design, Intervals, FAILOVER_DB, R, STAMP_CHILD};
use lease_tests::scenario::{overlap, Driver, Event, Node, Term, TRY_PREFIX, WAIT_PREFIX};
use lease_tests::{monotonic_nanos, Cluster, FaultProxy, Mode, Replica};
use std::net::SocketAddr;
use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

/// The fault a duel injects into the holder.
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

/// What runs on each side of a repetition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// A `replica` process of `design`; `lock_delay` `None`: the library default.
    Replica {
        driver: Driver,
        design: Design,
        lock_delay: Option<Duration>,
    },
    /// `lease run` (the lease-cli binary) at the bench's intervals with `--lock-delay`,
    /// running the bench's stamping child ([`crate::takeover::stamp_child`]): it prints
    /// `start` when it runs and `stop` the moment SIGTERM arrives, then exits.
    Cli { lock_delay: Duration },
}

impl Contender {
    /// `tokio`, `smol` or `lease run`.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Replica { driver, .. } => driver.name(),
            Contender::Cli { .. } => "lease run",
        }
    }

    /// The `application_name` of its lease session.
    pub fn app_name(self, lease: &str) -> String {
        match self {
            // As `crate::replica` sets it.
            Contender::Replica { .. } => format!("bench-{lease}"),
            // `lease run --identity bench` (as `spawn` starts it).
            Contender::Cli { .. } => format!("lease:{lease}@bench"),
        }
    }

    /// Spawns it; `polled`: a `replica`'s status poller on (its `pid` and `valid`
    /// lines), else off (`--status-poll 0`).
    fn spawn(
        self,
        bins: &Bins,
        iv: &Intervals,
        (url, lease, label): (&str, &str, &str),
        polled: bool,
    ) -> R<Node> {
        match self {
            Contender::Replica {
                driver,
                design,
                lock_delay,
            } => {
                let mut rc = replica(iv, driver, design, url, lease, 1);
                rc.lock_delay = lock_delay;
                if !polled {
                    rc.status_poll = Duration::ZERO;
                }
                rc.spawn(&bins.replica, label)
                    .map_err(|e| format!("spawning replica {label}: {e}"))
            }
            Contender::Cli { lock_delay } => {
                let lease_bin = (bins.lease.as_ref()).ok_or("the lease binary was not built")?;
                let ms = |d: Duration| format!("{}ms", d.as_millis());
                let mut cmd = Command::new(lease_bin);
                cmd.arg("run")
                    .args(["--database-url", url])
                    .args(["--retry-interval", &ms(iv.retry)])
                    .args(["--heartbeat-interval", &ms(iv.heartbeat)])
                    .args(["--query-timeout", &ms(iv.query_timeout)])
                    .args(["--guard-margin", &ms(iv.guard_margin)])
                    .args(["--lock-delay", &ms(lock_delay)])
                    .args(["--identity", "bench"])
                    .args([lease, "--"])
                    .arg(&bins.bench)
                    .arg(STAMP_CHILD);
                // Nothing from the environment fills in the connection or the log.
                for var in ["DATABASE_URL", "PGAPPNAME", "PGOPTIONS", "LEASE_LOG"] {
                    cmd.env_remove(var);
                }
                let process =
                    Replica::spawn(cmd).map_err(|e| format!("spawning lease run {label}: {e}"))?;
                Ok(Node::adopt(process, format!("{label}(lease run)")))
            }
        }
    }
}

/// One repetition's outcome.
#[derive(Clone, Debug)]
pub struct Rep {
    /// First `start` after the fault minus the fault instant; `None`: none within the window.
    pub gap_ns: Option<u64>,
    /// Longest time an old job and a new job of different contenders ran at once.
    pub overlap_ns: u64,
    /// The first job after the fault ran on the old holder (it reconnected and won again).
    pub old_won: bool,
    /// The old job's end minus the fault instant; `None`: no end seen (a frozen job
    /// without a `valid` line).
    pub old_end_ns: Option<u64>,
    /// When the standby's job came first after the fault: the old job's end minus the
    /// new job's start (negative: a gap between them, positive: an overlap).
    pub handover_ns: Option<i64>,
}

/// The server, the admin session and the binaries every repetition uses.
pub struct Bench<'a> {
    pub cluster: &'a mut Cluster,
    pub admin: Pg,
    pub bins: &'a Bins,
    pub iv: Intervals,
    rng: u64,
}

impl<'a> Bench<'a> {
    pub fn new(cluster: &'a mut Cluster, bins: &'a Bins, iv: Intervals) -> R<Bench<'a>> {
        Ok(Bench {
            admin: Pg::connect(cluster.port(), "postgres", "bench-admin")?,
            cluster,
            bins,
            iv,
            rng: monotonic_nanos() | 1,
        })
    }

    /// Uniform in [0, 1) (xorshift64*).
    pub fn random(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Spawns `who` for `lease` on database `url`.
    pub fn spawn(&self, who: Contender, url: &str, lease: &str, label: &str) -> R<Node> {
        who.spawn(self.bins, &self.iv, (url, lease, label), true)
    }

    /// [`Bench::spawn`] without the `replica`'s status poller: no `pid` or `valid`
    /// lines, and no wake-up every 20 ms (a herd of a hundred such pollers loads a
    /// small machine as no standby of a real fleet does).
    pub fn spawn_unpolled(&self, who: Contender, url: &str, lease: &str, label: &str) -> R<Node> {
        who.spawn(self.bins, &self.iv, (url, lease, label), false)
    }

    /// Time to start a contender and see it lead or stand by.
    pub fn setup_timeout(&self) -> Duration {
        Duration::from_secs(30) + 2 * self.iv.retry
    }

    /// Restarts the server (fast shutdown, start); returns once it accepts connections,
    /// with the admin session open again.
    pub fn restart_server(&mut self) -> R<()> {
        self.cluster.restart().map_err(|e| e.to_string())?;
        self.admin = Pg::connect(self.cluster.port(), "postgres", "bench-admin")?;
        Ok(())
    }

    /// One repetition of `scenario` between two `who`s on `lease`; the fault falls a
    /// random fraction of `phase` after the standby stands by.
    pub fn rep(
        &mut self,
        scenario: Scenario,
        who: Contender,
        lease: &str,
        phase: Duration,
    ) -> R<Rep> {
        let iv = self.iv;
        let setup = self.setup_timeout();
        let upstream = SocketAddr::from(([127, 0, 0, 1], self.cluster.port()));
        let proxy = match scenario {
            Scenario::Partition => Some(FaultProxy::start(upstream).map_err(|e| e.to_string())?),
            _ => None,
        };
        let direct = self.cluster.url(FAILOVER_DB);
        let via = proxy.as_ref().map_or(direct.clone(), |p| {
            format!("postgres://postgres@127.0.0.1:{}/{FAILOVER_DB}", p.port())
        });
        let mut old = self.spawn(who, &via, lease, "old")?;
        old.wait_start(0, setup)
            .map_err(|e| failed("the first contender did not start its job", e, &[&old]))?;
        let old_backend = holder(&self.admin, lease, setup)
            .map_err(|e| failed("the first contender holds no key", e, &[&old]))?;
        let new = self.spawn(who, &direct, lease, "new")?;
        let standby = format!(
            "application_name = '{}' AND pid <> {old_backend}",
            who.app_name(lease)
        );
        wait_standing_by(&self.admin, &standby, setup)
            .map_err(|e| failed("the standby did not stand by", e, &[&new]))?;
        sleep(phase.mul_f64(self.random()));

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
            Scenario::Restart => self.restart_server(),
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
        let old_end = (old.terms().iter())
            .find(|t| t.start < t0)
            .and_then(job_end);
        let new_won = first.filter(|&(who, _)| who == 1);
        Ok(Rep {
            gap_ns: first.map(|(_, t)| t - t0),
            overlap_ns: worst_overlap(&old, &new),
            old_won: first.is_some_and(|(who, _)| who == 0),
            old_end_ns: old_end.map(|e| e.saturating_sub(t0)),
            handover_ns: old_end
                .zip(new_won)
                .map(|(end, (_, start))| end as i64 - start as i64),
        })
    }
}

/// The backend holding `lease`'s key, once one does (waits up to `timeout`).
pub fn holder(admin: &Pg, lease: &str, timeout: Duration) -> R<i32> {
    let sql = format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
         AND {} = {}",
        lease_proto::server::ADVISORY_KEY_SQL,
        lease_proto::key_for_name(lease)
    );
    let deadline = monotonic_nanos() + timeout.as_nanos() as u64;
    loop {
        let found = admin.rows(&sql)?.into_iter().next();
        if let Some(pid) = found.and_then(|r| r.into_iter().next().flatten()?.parse().ok()) {
            return Ok(pid);
        }
        if monotonic_nanos() > deadline {
            return Err(format!("nobody held {lease} within {timeout:?}"));
        }
        sleep(Duration::from_millis(5));
    }
}

/// Waits until backend `pid` has sent a standby try: its session is set up (and
/// listening, with notifications on) and it stands by.
pub fn wait_tried(admin: &Pg, pid: i32, timeout: Duration) -> R<()> {
    wait_standing_by(admin, &format!("pid = {pid}"), timeout).map(drop)
}

/// Waits until a backend that `pg_stat_activity` condition `which` selects has sent a
/// standby try, or the wait on the server that follows a try that lost; returns its pid.
pub fn wait_standing_by(admin: &Pg, which: &str, timeout: Duration) -> R<i32> {
    let deadline = monotonic_nanos() + timeout.as_nanos() as u64;
    let sql = format!("SELECT pid, query FROM pg_stat_activity WHERE {which}");
    let stands_by = |q: &str| q.starts_with(TRY_PREFIX) || q.starts_with(WAIT_PREFIX);
    loop {
        let rows = admin.rows(&sql)?;
        let found = rows.iter().find_map(|r| match &r[..] {
            [Some(pid), Some(q)] if stands_by(q) => pid.parse().ok(),
            _ => None,
        });
        if let Some(pid) = found {
            return Ok(pid);
        }
        if monotonic_nanos() > deadline {
            let last: Vec<_> = rows
                .iter()
                .filter_map(|r| r.get(1).cloned().flatten())
                .collect();
            return Err(format!(
                "no backend where {which} sent a standby try within {timeout:?} (last: {last:?})"
            ));
        }
        sleep(Duration::from_millis(5));
    }
}

/// The earliest `start` at or after `t0` among `nodes`: (index of the node, time).
pub fn first_start(nodes: &[&Node], t0: u64) -> Option<(usize, u64)> {
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

/// Where a job stopped acting: its `cancel` or `stop` (or its process's kill), or its
/// last printed `valid_until` if earlier; `None` while neither is known.
fn job_end(term: &Term) -> Option<u64> {
    match (term.end, term.valid_until) {
        (Some(end), valid) => Some(valid.map_or(end, |v| v.min(end))),
        (None, valid) => valid,
    }
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
