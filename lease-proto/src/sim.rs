//! A deterministic simulator: processes running [`Machine`]s, a PostgreSQL
//! server, the network between them, and their faults, in virtual time.
//!
//! Everything is driven by one seed: the same [`SimConfig`] and fault schedule
//! give the same run, event for event. A ten-minute scenario runs in
//! milliseconds. The simulator checks, as it goes, the properties the machine
//! promises and records every breach in [`Report::violations`]:
//!
//! - strong safety: no instant at which two live processes hold a lease for
//!   the same key that is valid by their own clock (a job running with
//!   `now < valid_until`);
//! - release after exit: an unlock is never sent for a key whose job still runs;
//! - contract: every run finishes exactly once, with the outcome the contract
//!   gives;
//! - no leaks: once every run has returned, the server holds no lock.
//!
//! It also measures overlap (time two processes both lead a key, validity
//! aside), leadership gaps and statement counts, for bounded checks.
//!
//! The server model: sessions, re-entrant advisory locks (one database),
//! `pg_locks`, `idle_session_timeout`, `pg_terminate_backend`, restarts,
//! `LISTEN/NOTIFY`, hot-standby mode and a transaction pooler that moves
//! statements between backends. The network model: per-process links with
//! latency and jitter, FIFO delivery, latency spikes, and black-hole
//! partitions that hold bytes until they heal (TCP ends stay open). Processes
//! can freeze (nothing runs, clocks go on), crash (the kernel closes the
//! socket), restart, and have clocks whose rate drifts within a bound.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::{
    DbError, Input, JobExit, LeaseId, Machine, Options, Outcome, QueryId, RunCommand, RunId,
    SessionCommand, SessionId, Statement, HANDOVER_CHANNEL,
};

/// A fault to inject at a point in virtual time.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Black-hole the link of `process` in both directions for `duration`:
    /// bytes wait and flow again on healing; neither side sees anything.
    Partition {
        /// The process.
        process: usize,
        /// How long.
        duration: Duration,
    },
    /// Stop `process` for `duration` (SIGSTOP, a paused VM): nothing runs,
    /// its clock goes on, the kernel keeps its connection open.
    Freeze {
        /// The process.
        process: usize,
        /// How long.
        duration: Duration,
    },
    /// Add `extra` one-way latency on the link of `process` for `duration`.
    Delay {
        /// The process.
        process: usize,
        /// Added one-way latency.
        extra: Duration,
        /// How long.
        duration: Duration,
    },
    /// Make every server reply take `extra` longer for `duration`.
    SlowServer {
        /// Added processing time.
        extra: Duration,
        /// How long.
        duration: Duration,
    },
    /// Kill `process` (SIGKILL): its kernel closes the socket. It starts
    /// again, with new runs for the same leases, after `restart_after` if given.
    Crash {
        /// The process.
        process: usize,
        /// When it comes back, if at all.
        restart_after: Option<Duration>,
    },
    /// `pg_terminate_backend` on the session of `process`.
    Terminate {
        /// The process.
        process: usize,
    },
    /// Restart the server: every session ends; connections fail for `downtime`.
    ServerRestart {
        /// How long the server is down.
        downtime: Duration,
    },
}

impl Fault {
    /// Whether the server ends a session actively in this fault (then the
    /// bounded, not the strong, safety property applies).
    pub fn server_ends_sessions(&self) -> bool {
        matches!(self, Fault::Terminate { .. } | Fault::ServerRestart { .. })
    }

    /// When the fault's effect is over, from its start (crashes without
    /// restart never end; `None`).
    pub fn duration(&self) -> Option<Duration> {
        match self {
            Fault::Partition { duration, .. }
            | Fault::Freeze { duration, .. }
            | Fault::Delay { duration, .. }
            | Fault::SlowServer { duration, .. } => Some(*duration),
            Fault::Crash { restart_after, .. } => *restart_after,
            Fault::Terminate { .. } => Some(Duration::ZERO),
            Fault::ServerRestart { downtime } => Some(*downtime),
        }
    }
}

/// Deliberate driver bugs, to show that the checks catch them (and for users
/// who test their own driver logic against the simulator's expectations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverBug {
    /// Report a job's exit as soon as it is cancelled, while it still runs.
    ReportExitEarly,
    /// Never report job exits.
    LoseJobExits,
    /// Ignore `CloseSession`: the connection stays open.
    IgnoreCloseSession,
}

/// How the server behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// `server_version_num` reported.
    pub version: i64,
    /// A hot standby: `pg_is_in_recovery()` is true.
    pub standby: bool,
    /// A transaction pooler in between: statements run on alternating backends,
    /// startup options are dropped (or rejected, with `pooler_rejects_options`).
    pub pooler: bool,
    /// The pooler rejects the `options` startup parameter.
    pub pooler_rejects_options: bool,
    /// The server ends any session silent for this long, whatever the session
    /// asked for (a DBA's `idle_session_timeout`, or TCP keepalives).
    pub silent_session_kill: Option<Duration>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            version: 150_000,
            standby: false,
            pooler: false,
            pooler_rejects_options: false,
            silent_session_kill: None,
        }
    }
}

/// A simulation's setup.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seed of everything random (latency jitter, job behaviour, machine seeds).
    pub seed: u64,
    /// Number of processes; each runs one machine.
    pub processes: usize,
    /// Lease names every process runs (one run each, started at time 0).
    pub leases: Vec<String>,
    /// Options of every machine.
    pub options: Options,
    /// Base one-way latency of every link.
    pub latency: Duration,
    /// Up to this much is added to each message's latency (FIFO is kept).
    pub jitter: Duration,
    /// Clock-rate drift bound: each process's clock runs at a rate drawn from
    /// `[1 - drift, 1 + drift]` (the server's at 1).
    pub drift: f64,
    /// A cancelled job returns within this long (uniformly drawn).
    pub job_reaction: Duration,
    /// Each started job returns by itself (Ok or Err, even odds) with this
    /// probability, after up to `job_lifetime`.
    pub job_exit_probability: f64,
    /// Longest self-terminating job.
    pub job_lifetime: Duration,
    /// The server.
    pub server: ServerConfig,
    /// A deliberate driver bug, if any.
    pub bug: Option<DriverBug>,
    /// Keep the full trace (else only the last 400 lines).
    pub full_trace: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            processes: 3,
            leases: vec!["job".into()],
            options: Options {
                retry_interval: Duration::from_millis(200),
                heartbeat_interval: Duration::from_millis(200),
                query_timeout: Duration::from_millis(500),
                guard_margin: Duration::from_millis(200),
                ..Options::default()
            },
            latency: Duration::from_micros(500),
            jitter: Duration::from_micros(500),
            drift: 0.0,
            job_reaction: Duration::from_millis(5),
            job_exit_probability: 0.0,
            job_lifetime: Duration::from_secs(2),
            server: ServerConfig::default(),
            bug: None,
            full_trace: false,
        }
    }
}

/// One line of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceLine {
    /// Virtual time since the start.
    pub at: Duration,
    /// The process, if any (`None`: server or fault).
    pub process: Option<usize>,
    /// What happened.
    pub what: String,
}

/// What a simulation found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every property breach, with its time.
    pub violations: Vec<String>,
    /// Per key name: the longest stretch two processes both had a running job
    /// with a lease they had not yet seen cancelled (validity aside).
    pub max_overlap: BTreeMap<String, Duration>,
    /// Per key name: acquisitions (job starts).
    pub acquisitions: BTreeMap<String, u32>,
    /// Statements sent, per process.
    pub statements: Vec<u64>,
    /// Runs finished, with their outcome, per process (all incarnations).
    pub outcomes: Vec<Vec<(String, Outcome)>>,
    /// The trace (the last 400 lines unless `full_trace`).
    pub trace: Vec<TraceLine>,
}

impl Report {
    /// The trace as readable text: `time  process  event`.
    pub fn trace_text(&self) -> String {
        let mut s = String::new();
        for l in &self.trace {
            let p = l.process.map_or("  -".into(), |p| format!("p{p:<2}"));
            let _ = writeln!(s, "{:>10.3}ms {p} {}", l.at.as_secs_f64() * 1e3, l.what);
        }
        s
    }
}

// ---- internals ----------------------------------------------------------

#[derive(Debug, Clone)]
enum ToServer {
    Connect {
        conn: u64,
        settings: Vec<(&'static str, String)>,
    },
    Query {
        conn: u64,
        query: QueryId,
        statement: Statement,
    },
    Close {
        conn: u64,
    },
}

#[derive(Debug, Clone)]
enum ToClient {
    Connected {
        conn: u64,
    },
    Failed {
        conn: u64,
        error: DbError,
    },
    Reply {
        conn: u64,
        query: QueryId,
        result: Result<Vec<crate::Row>, DbError>,
    },
    Notify {
        conn: u64,
        payload: String,
    },
    Ended {
        conn: u64,
        error: DbError,
    },
}

#[derive(Debug, Clone)]
enum Ev {
    AtServer(usize, ToServer),
    AtClient(usize, ToClient),
    Timer(usize, u64),
    JobExit {
        p: usize,
        incarnation: u32,
        run: RunId,
        exit: JobExit,
        job: u64,
    },
    IdleCheck(u64),
    FaultStart(Fault),
    Heal(Heal),
    Close,
}

#[derive(Debug, Clone)]
enum Heal {
    Partition(usize),
    Freeze(usize),
    Delay(usize, Duration),
    Slow(Duration),
    Restart(usize),
    ServerUp,
}

struct Link {
    partitions: u32,
    extra: Duration,
    held: Vec<Ev>,
    last_to_server: Duration,
    last_to_client: Duration,
}

struct Job {
    id: u64,
    key: i64,
    /// Set when the process saw CancelJob for it.
    cancelled: bool,
    /// Set when the (buggy) driver already reported it.
    reported: bool,
}

struct Proc {
    machine: Machine,
    incarnation: u32,
    alive: bool,
    frozen: bool,
    deferred: VecDeque<Ev>,
    rate: f64,
    conn: Option<(SessionId, u64)>,
    timer_gen: u64,
    runs: BTreeMap<RunId, String>,
    jobs: BTreeMap<RunId, Job>,
    finished: BTreeSet<RunId>,
    /// Run → the outcome the contract expects when its job returns by itself.
    expect: BTreeMap<RunId, Outcome>,
}

struct SrvSession {
    p: usize,
    pid: i64,
    idle_timeout: Option<Duration>,
    busy_until: Duration,
    listening: bool,
    statements: u64,
}

struct Server {
    up: bool,
    sessions: BTreeMap<u64, SrvSession>,
    /// key → (owner conn, re-entrancy count)
    locks: BTreeMap<i64, (u64, u32)>,
    next_pid: i64,
    next_xid: i64,
    slow: Duration,
}

/// A running simulation.
pub struct Sim {
    cfg: SimConfig,
    base: Instant,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    events: BTreeMap<u64, Ev>,
    rng: u64,
    procs: Vec<Proc>,
    links: Vec<Link>,
    server: Server,
    next_conn: u64,
    next_job: u64,
    report: Report,
    /// key → (process, job id) pairs currently overlapping, since when.
    overlap_since: BTreeMap<i64, Duration>,
    closing: bool,
    key_names: BTreeMap<i64, String>,
}

fn rand(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Sim {
    /// A simulation with this setup, starting at virtual time zero. Processes
    /// start their runs at once. `base` is the `Instant` virtual time zero
    /// maps to (any instant will do: `Instant::now()`).
    ///
    /// # Panics
    /// If `cfg.options` are invalid or `cfg.processes` is zero: a test-setup
    /// mistake.
    pub fn new(cfg: SimConfig, base: Instant) -> Sim {
        assert!(cfg.processes > 0, "a simulation needs a process");
        cfg.options.validate().expect("valid options");
        let mut rng = cfg.seed ^ 0x5eed;
        let mut procs = Vec::new();
        let mut links = Vec::new();
        for _ in 0..cfg.processes {
            let u = (rand(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
            let rate = 1.0 + cfg.drift * (2.0 * u - 1.0);
            procs.push(Proc {
                machine: Machine::new(cfg.options.clone(), rand(&mut rng)).expect("valid"),
                incarnation: 0,
                alive: true,
                frozen: false,
                deferred: VecDeque::new(),
                rate,
                conn: None,
                timer_gen: 0,
                runs: BTreeMap::new(),
                jobs: BTreeMap::new(),
                finished: BTreeSet::new(),
                expect: BTreeMap::new(),
            });
            links.push(Link {
                partitions: 0,
                extra: Duration::ZERO,
                held: Vec::new(),
                last_to_server: Duration::ZERO,
                last_to_client: Duration::ZERO,
            });
        }
        let key_names = cfg
            .leases
            .iter()
            .map(|n| (crate::key_for_name(n), n.clone()))
            .collect();
        let n = cfg.processes;
        let mut sim = Sim {
            cfg,
            base,
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            rng,
            procs,
            links,
            server: Server {
                up: true,
                sessions: BTreeMap::new(),
                locks: BTreeMap::new(),
                next_pid: 1000,
                next_xid: 700,
                slow: Duration::ZERO,
            },
            next_conn: 0,
            next_job: 0,
            report: Report {
                statements: vec![0; n],
                outcomes: vec![Vec::new(); n],
                ..Report::default()
            },
            overlap_since: BTreeMap::new(),
            closing: false,
            key_names,
        };
        for p in 0..n {
            sim.start_runs(p);
        }
        sim
    }

    /// Schedules a fault at virtual time `at`.
    pub fn schedule(&mut self, at: Duration, fault: Fault) {
        self.push(at, Ev::FaultStart(fault));
    }

    /// Runs until virtual time `until` (events at exactly `until` included).
    pub fn run_until(&mut self, until: Duration) {
        while let Some(&Reverse((t, seq))) = self.queue.peek() {
            if t > until {
                break;
            }
            self.queue.pop();
            let ev = self.events.remove(&seq).expect("queued event");
            self.now = t;
            self.dispatch(ev);
            self.check_safety();
        }
        self.now = self.now.max(until);
    }

    /// Heals everything at `at` (ends partitions, freezes, delays; restarts
    /// crashed processes; brings the server up), closes every machine, runs
    /// until `at + settle`, then checks the contract and leak properties.
    pub fn finish(mut self, at: Duration, settle: Duration) -> Report {
        self.run_until(at);
        for p in 0..self.procs.len() {
            while self.links[p].partitions > 0 {
                self.heal(Heal::Partition(p));
            }
            if self.procs[p].frozen {
                self.heal(Heal::Freeze(p));
            }
            self.links[p].extra = Duration::ZERO;
        }
        self.server.slow = Duration::ZERO;
        self.server.up = true;
        self.push(self.now, Ev::Close);
        self.run_until(at + settle);
        for (p, proc_) in self.procs.iter().enumerate() {
            if !proc_.alive {
                continue;
            }
            for (run, name) in &proc_.runs {
                if !proc_.finished.contains(run) {
                    self.report.violations.push(format!(
                        "contract: run {run:?} ({name}) of p{p} never finished"
                    ));
                }
            }
        }
        let held: Vec<i64> = self.server.locks.keys().copied().collect();
        if !held.is_empty()
            && self
                .procs
                .iter()
                .all(|p| !p.alive || p.finished.len() == p.runs.len())
        {
            self.report.violations.push(format!(
                "leak: every run returned but the server still holds {held:?}"
            ));
        }
        self.report
    }

    /// The report so far.
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Virtual time now.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Whether `process` leads `lease` now with a valid lease by its clock.
    pub fn leads(&self, process: usize, lease: &str) -> bool {
        let key = crate::key_for_name(lease);
        self.valid_leaders(key).contains(&process)
    }

    /// The statements the server has executed for `process` (all sessions).
    pub fn statements(&self, process: usize) -> u64 {
        self.report.statements[process]
    }

    /// The advisory keys the server holds now.
    pub fn server_locks(&self) -> Vec<i64> {
        self.server.locks.keys().copied().collect()
    }

    // ---- plumbing ------------------------------------------------------

    fn push(&mut self, at: Duration, ev: Ev) {
        self.seq += 1;
        self.events.insert(self.seq, ev);
        self.queue.push(Reverse((at, self.seq)));
    }

    fn trace(&mut self, process: Option<usize>, what: String) {
        self.report.trace.push(TraceLine {
            at: self.now,
            process,
            what,
        });
        if !self.cfg.full_trace && self.report.trace.len() > 800 {
            self.report.trace.drain(..400);
        }
    }

    fn violation(&mut self, what: String) {
        let line = format!("at {:.3}ms: {what}", self.now.as_secs_f64() * 1e3);
        self.trace(None, format!("VIOLATION {what}"));
        if self.report.violations.len() < 50 {
            self.report.violations.push(line);
        }
    }

    fn uniform(&mut self, max: Duration) -> Duration {
        if max.is_zero() {
            return max;
        }
        let n = max.as_nanos() as u64;
        Duration::from_nanos(rand(&mut self.rng) % (n + 1))
    }

    fn chance(&mut self, p: f64) -> bool {
        ((rand(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn local(&self, p: usize) -> Instant {
        self.base + self.now.mul_f64(self.procs[p].rate)
    }

    fn send(&mut self, p: usize, ev: Ev) {
        let latency = self.cfg.latency + self.links[p].extra + self.uniform(self.cfg.jitter);
        if self.links[p].partitions > 0 {
            self.links[p].held.push(ev);
            return;
        }
        let last = match ev {
            Ev::AtServer(..) => &mut self.links[p].last_to_server,
            _ => &mut self.links[p].last_to_client,
        };
        let at = (self.now + latency).max(*last);
        *last = at;
        self.push(at, ev);
    }

    fn start_runs(&mut self, p: usize) {
        let now = self.local(p);
        let names = self.cfg.leases.clone();
        for name in names {
            let lease = LeaseId::named(name.clone()).expect("valid lease name");
            match self.procs[p].machine.run(now, lease) {
                Ok(run) => {
                    self.procs[p].runs.insert(run, name);
                }
                Err(e) => self.violation(format!("p{p} could not start run {name}: {e}")),
            }
        }
        self.drain(p);
    }

    // ---- events -----------------------------------------------------------

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::AtServer(p, msg) => self.at_server(p, msg),
            Ev::AtClient(p, _) | Ev::Timer(p, _) | Ev::JobExit { p, .. }
                if self.procs[p].frozen =>
            {
                self.procs[p].deferred.push_back(ev);
            }
            Ev::AtClient(p, msg) => self.at_client(p, msg),
            Ev::Timer(p, gen) => {
                if self.procs[p].alive && gen == self.procs[p].timer_gen {
                    self.input(p, Input::Tick);
                }
            }
            Ev::JobExit {
                p,
                incarnation,
                run,
                exit,
                job,
            } => {
                let proc_ = &mut self.procs[p];
                if !proc_.alive || proc_.incarnation != incarnation {
                    return;
                }
                if proc_.jobs.get(&run).map(|j| j.id) != Some(job) {
                    return;
                }
                let j = proc_.jobs.remove(&run).expect("checked");
                let name = proc_.runs.get(&run).cloned().unwrap_or_default();
                if !j.cancelled {
                    // Returned by itself while leading: the contract's outcome.
                    let outcome = if exit == JobExit::Ok {
                        Outcome::Completed
                    } else {
                        Outcome::Failed
                    };
                    proc_.expect.insert(run, outcome);
                }
                self.trace(Some(p), format!("job {name} exits {exit:?}"));
                if j.reported || self.cfg.bug == Some(DriverBug::LoseJobExits) {
                    return;
                }
                self.input(p, Input::JobExited { run, exit });
            }
            Ev::IdleCheck(conn) => {
                let kill = self.server.sessions.get(&conn).and_then(|s| {
                    let limit = match (s.idle_timeout, self.cfg.server.silent_session_kill) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }?;
                    (s.busy_until + limit <= self.now).then_some(())
                });
                if kill.is_some() {
                    self.end_session(
                        conn,
                        "57P05",
                        "terminating connection due to idle-session timeout",
                    );
                }
            }
            Ev::FaultStart(f) => self.fault(f),
            Ev::Heal(h) => self.heal(h),
            Ev::Close => {
                self.closing = true;
                for p in 0..self.procs.len() {
                    if self.procs[p].alive {
                        self.input(p, Input::Close);
                    }
                }
            }
        }
    }

    fn input(&mut self, p: usize, input: Input) {
        let now = self.local(p);
        self.procs[p].machine.handle_input(now, input);
        self.drain(p);
    }

    /// The simulated driver: executes every command of process `p`'s machine
    /// by the drain rule (run commands, then session commands, then events,
    /// until all are empty), then arms its one timer.
    fn drain(&mut self, p: usize) {
        loop {
            let mut idle = true;
            while let Some(cmd) = self.procs[p].machine.poll_run() {
                self.run_command(p, cmd);
                idle = false;
            }
            while let Some(cmd) = self.procs[p].machine.poll_session() {
                self.session_command(p, cmd);
                idle = false;
            }
            while let Some(e) = self.procs[p].machine.poll_event() {
                self.trace(Some(p), format!("{e:?}"));
                idle = false;
            }
            if idle {
                break;
            }
        }
        // Arm the one timer.
        let proc_ = &mut self.procs[p];
        proc_.timer_gen += 1;
        if let Some(t) = proc_.machine.poll_timeout() {
            let local = t.saturating_duration_since(self.base);
            let real = local.div_f64(proc_.rate) + Duration::from_nanos(1);
            let gen = proc_.timer_gen;
            self.push(real.max(self.now), Ev::Timer(p, gen));
        }
    }

    fn session_command(&mut self, p: usize, cmd: SessionCommand) {
        match cmd {
            SessionCommand::Open { session, params } => {
                self.next_conn += 1;
                let conn = self.next_conn;
                self.procs[p].conn = Some((session, conn));
                let settings = params.startup_settings;
                self.send(p, Ev::AtServer(p, ToServer::Connect { conn, settings }));
            }
            SessionCommand::Query { query, statement } => {
                if let Statement::Release { keys, .. } = &statement {
                    for key in keys {
                        let running = self.procs[p].jobs.values().any(|j| j.key == *key);
                        if running {
                            self.violation(format!(
                                "p{p} releases key {key} while its job still runs"
                            ));
                        }
                    }
                }
                let Some((_, conn)) = self.procs[p].conn else {
                    return;
                };
                self.send(
                    p,
                    Ev::AtServer(
                        p,
                        ToServer::Query {
                            conn,
                            query,
                            statement,
                        },
                    ),
                );
            }
            SessionCommand::Close { .. } => {
                if self.cfg.bug == Some(DriverBug::IgnoreCloseSession) {
                    return;
                }
                if let Some((_, conn)) = self.procs[p].conn.take() {
                    self.send(p, Ev::AtServer(p, ToServer::Close { conn }));
                }
            }
        }
    }

    fn run_command(&mut self, p: usize, cmd: RunCommand) {
        match cmd {
            RunCommand::StartJob {
                run,
                lease,
                token,
                valid_until,
            } => {
                self.next_job += 1;
                let id = self.next_job;
                let key = lease.key();
                self.procs[p].jobs.insert(
                    run,
                    Job {
                        id,
                        key,
                        cancelled: false,
                        reported: false,
                    },
                );
                self.procs[p].expect.remove(&run);
                *self
                    .report
                    .acquisitions
                    .entry(lease.name().to_string())
                    .or_default() += 1;
                let v = valid_until.saturating_duration_since(self.local(p));
                self.trace(
                    Some(p),
                    format!(
                        "job {} starts, token {token}, valid {:.1}ms",
                        lease.name(),
                        v.as_secs_f64() * 1e3
                    ),
                );
                if self.chance(self.cfg.job_exit_probability) {
                    let after = self.uniform(self.cfg.job_lifetime);
                    let exit = if self.chance(0.5) {
                        JobExit::Ok
                    } else {
                        JobExit::Failed
                    };
                    let incarnation = self.procs[p].incarnation;
                    self.push(
                        self.now + after,
                        Ev::JobExit {
                            p,
                            incarnation,
                            run,
                            exit,
                            job: id,
                        },
                    );
                }
            }
            RunCommand::CancelJob { run, reason } => {
                let incarnation = self.procs[p].incarnation;
                let react = self.uniform(self.cfg.job_reaction);
                let bug = self.cfg.bug;
                if let Some(j) = self.procs[p].jobs.get_mut(&run) {
                    if !j.cancelled {
                        j.cancelled = true;
                        let id = j.id;
                        self.trace(Some(p), format!("job of {run:?} cancelled: {reason}"));
                        self.push(
                            self.now + react,
                            Ev::JobExit {
                                p,
                                incarnation,
                                run,
                                exit: JobExit::Ok,
                                job: id,
                            },
                        );
                        if bug == Some(DriverBug::ReportExitEarly) {
                            if let Some(j) = self.procs[p].jobs.get_mut(&run) {
                                j.reported = true;
                            }
                            let now = self.local(p);
                            self.procs[p].machine.handle_input(
                                now,
                                Input::JobExited {
                                    run,
                                    exit: JobExit::Ok,
                                },
                            );
                        }
                    }
                }
            }
            RunCommand::Finish { run, outcome } => {
                let name = self.procs[p].runs.get(&run).cloned();
                let Some(name) = name else {
                    self.violation(format!("p{p} finished unknown run {run:?}"));
                    return;
                };
                if !self.procs[p].finished.insert(run) {
                    self.violation(format!("p{p} finished run {run:?} twice"));
                }
                if self.procs[p].jobs.contains_key(&run) && !self.procs[p].jobs[&run].reported {
                    self.violation(format!("p{p} finished run {run:?} while its job runs"));
                }
                let expected = self.procs[p].expect.get(&run).cloned();
                let ok = match (&outcome, &expected) {
                    (Outcome::Completed | Outcome::Failed, Some(e)) => outcome == *e,
                    (Outcome::Completed | Outcome::Failed, None) => false,
                    (Outcome::Closed, _) => self.closing,
                    (Outcome::Refused(_), _) => true,
                    (Outcome::Cancelled | Outcome::Abandoned, _) => false,
                };
                // A job that returned by itself but lost its lease first is
                // restarted, so its expectation is cleared on restart.
                if !ok {
                    self.violation(format!(
                        "p{p} run {name} finished {outcome:?}, contract expects {expected:?}"
                    ));
                }
                self.trace(Some(p), format!("run {name} finished: {outcome:?}"));
                self.report.outcomes[p].push((name, outcome));
            }
        }
    }

    fn at_client(&mut self, p: usize, msg: ToClient) {
        if !self.procs[p].alive {
            return;
        }
        let Some((session, conn)) = self.procs[p].conn else {
            return;
        };
        let input = match msg {
            ToClient::Connected { conn: c } if c == conn => Input::SessionOpened { session },
            ToClient::Failed { conn: c, error } | ToClient::Ended { conn: c, error }
                if c == conn =>
            {
                self.procs[p].conn = None;
                Input::SessionLost {
                    session,
                    error: Some(error),
                }
            }
            ToClient::Reply {
                conn: c,
                query,
                result,
            } if c == conn => Input::Reply { query, result },
            ToClient::Notify { conn: c, payload } if c == conn => Input::Notification {
                channel: HANDOVER_CHANNEL.to_string(),
                payload,
            },
            _ => return,
        };
        self.input(p, input);
    }

    fn at_server(&mut self, p: usize, msg: ToServer) {
        match msg {
            ToServer::Connect { conn, settings } => {
                let refuse = |m: &str| ToClient::Failed {
                    conn,
                    error: DbError {
                        code: Some("08006".into()),
                        message: m.into(),
                    },
                };
                if !self.server.up {
                    return self.send(p, Ev::AtClient(p, refuse("connection refused")));
                }
                if self.cfg.server.pooler
                    && self.cfg.server.pooler_rejects_options
                    && !settings.is_empty()
                {
                    let e = ToClient::Failed {
                        conn,
                        error: DbError {
                            code: Some("08P01".into()),
                            message: "unsupported startup parameter: options".into(),
                        },
                    };
                    return self.send(p, Ev::AtClient(p, e));
                }
                let idle_timeout = if self.cfg.server.pooler {
                    None
                } else {
                    settings
                        .iter()
                        .find(|(n, _)| *n == "idle_session_timeout")
                        .and_then(|(_, v)| v.parse::<u64>().ok())
                        .filter(|ms| *ms > 0)
                        .map(Duration::from_millis)
                };
                self.server.next_pid += 1;
                let pid = self.server.next_pid;
                self.server.sessions.insert(
                    conn,
                    SrvSession {
                        p,
                        pid,
                        idle_timeout,
                        busy_until: self.now,
                        listening: false,
                        statements: 0,
                    },
                );
                self.arm_idle(conn);
                self.send(p, Ev::AtClient(p, ToClient::Connected { conn }));
            }
            ToServer::Close { conn } => {
                if self.server.sessions.contains_key(&conn) {
                    self.end_session_quietly(conn);
                }
            }
            ToServer::Query {
                conn,
                query,
                statement,
            } => {
                let Some(s) = self.server.sessions.get_mut(&conn) else {
                    return;
                };
                s.statements += 1;
                let stmt_no = s.statements;
                let done = self.now.max(s.busy_until) + self.server.slow;
                s.busy_until = done;
                self.report.statements[p] += 1;
                let result = self.execute(conn, stmt_no, &statement);
                self.arm_idle(conn);
                let reply = ToClient::Reply {
                    conn,
                    query,
                    result,
                };
                // The reply leaves when the statement is done.
                let latency =
                    self.cfg.latency + self.links[p].extra + self.uniform(self.cfg.jitter);
                let ev = Ev::AtClient(p, reply);
                if self.links[p].partitions > 0 {
                    self.links[p].held.push(ev);
                } else {
                    let at = (done + latency).max(self.links[p].last_to_client);
                    self.links[p].last_to_client = at;
                    self.push(at, ev);
                }
            }
        }
    }

    fn execute(
        &mut self,
        conn: u64,
        stmt_no: u64,
        statement: &Statement,
    ) -> Result<Vec<crate::Row>, DbError> {
        let pooler = self.cfg.server.pooler;
        let s = &self.server.sessions[&conn];
        let pid = if pooler {
            s.pid + (stmt_no % 2) as i64 * 7919
        } else {
            s.pid
        };
        Ok(match statement {
            Statement::Setup => {
                let ist = s.idle_timeout.map_or(0, |d| d.as_millis() as i64);
                vec![
                    vec![Some(1), Some(self.cfg.server.version)],
                    vec![Some(2), Some(i64::from(self.cfg.server.standby))],
                    vec![Some(3), Some(pid)],
                    vec![Some(4), Some(ist)],
                ]
            }
            Statement::Listen => {
                if self.cfg.server.standby {
                    return Err(DbError {
                        code: Some("25006".into()),
                        message: "cannot execute LISTEN during recovery".into(),
                    });
                }
                self.server
                    .sessions
                    .get_mut(&conn)
                    .expect("exists")
                    .listening = true;
                vec![]
            }
            Statement::TryLock { keys } => {
                let mut rows = Vec::new();
                let mut won = Vec::new();
                let mut lost = Vec::new();
                for &k in keys {
                    match self.server.locks.get_mut(&k) {
                        None => {
                            self.server.locks.insert(k, (conn, 1));
                            won.push(k);
                        }
                        Some((owner, count)) if *owner == conn => {
                            *count += 1;
                            won.push(k);
                        }
                        Some((owner, _)) => lost.push((k, *owner)),
                    }
                }
                if !won.is_empty() {
                    self.server.next_xid += 1;
                }
                let xid = self.server.next_xid;
                for k in won {
                    rows.push(vec![Some(k), Some(xid), None]);
                }
                for (k, owner) in lost {
                    let holder = self.server.sessions.get(&owner).map(|s| s.pid);
                    rows.push(vec![Some(k), None, holder]);
                }
                rows
            }
            Statement::Heartbeat => {
                let mut rows = vec![vec![Some(0), Some(pid)]];
                for (k, (owner, _)) in &self.server.locks {
                    if *owner == conn {
                        rows.push(vec![Some(1), Some(*k)]);
                    }
                }
                rows
            }
            Statement::Release { keys, notify } => {
                let mut rows = Vec::new();
                for &k in keys {
                    let held = matches!(self.server.locks.get(&k), Some((o, _)) if *o == conn);
                    if held {
                        let (_, count) = self.server.locks.get_mut(&k).expect("held");
                        *count -= 1;
                        if *count == 0 {
                            self.server.locks.remove(&k);
                        }
                        if *notify {
                            self.notify_all(k);
                        }
                    }
                    rows.push(vec![Some(k), Some(i64::from(held))]);
                }
                rows
            }
        })
    }

    fn notify_all(&mut self, key: i64) {
        let listeners: Vec<(u64, usize)> = self
            .server
            .sessions
            .iter()
            .filter(|(_, s)| s.listening)
            .map(|(c, s)| (*c, s.p))
            .collect();
        for (conn, p) in listeners {
            self.send(
                p,
                Ev::AtClient(
                    p,
                    ToClient::Notify {
                        conn,
                        payload: key.to_string(),
                    },
                ),
            );
        }
    }

    fn arm_idle(&mut self, conn: u64) {
        let Some(s) = self.server.sessions.get(&conn) else {
            return;
        };
        let limit = match (s.idle_timeout, self.cfg.server.silent_session_kill) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(limit) = limit {
            let at = s.busy_until + limit;
            self.push(at, Ev::IdleCheck(conn));
        }
    }

    fn end_session_quietly(&mut self, conn: u64) {
        if let Some(s) = self.server.sessions.remove(&conn) {
            self.server.locks.retain(|_, (owner, _)| *owner != conn);
            self.trace(Some(s.p), format!("server: session pid {} ended", s.pid));
        }
    }

    fn end_session(&mut self, conn: u64, code: &str, message: &str) {
        if let Some(p) = self.server.sessions.get(&conn).map(|s| s.p) {
            self.end_session_quietly(conn);
            self.trace(Some(p), format!("server: {message}"));
            let error = DbError {
                code: Some(code.into()),
                message: message.into(),
            };
            self.send(p, Ev::AtClient(p, ToClient::Ended { conn, error }));
        }
    }

    fn fault(&mut self, f: Fault) {
        self.trace(None, format!("FAULT {f:?}"));
        match f {
            Fault::Partition { process, duration } => {
                self.links[process].partitions += 1;
                self.push(self.now + duration, Ev::Heal(Heal::Partition(process)));
            }
            Fault::Freeze { process, duration } => {
                if !self.procs[process].frozen {
                    self.procs[process].frozen = true;
                    self.push(self.now + duration, Ev::Heal(Heal::Freeze(process)));
                }
            }
            Fault::Delay {
                process,
                extra,
                duration,
            } => {
                self.links[process].extra += extra;
                self.push(self.now + duration, Ev::Heal(Heal::Delay(process, extra)));
            }
            Fault::SlowServer { extra, duration } => {
                self.server.slow += extra;
                self.push(self.now + duration, Ev::Heal(Heal::Slow(extra)));
            }
            Fault::Crash {
                process,
                restart_after,
            } => {
                let proc_ = &mut self.procs[process];
                if !proc_.alive {
                    return;
                }
                proc_.alive = false;
                proc_.frozen = false;
                proc_.deferred.clear();
                proc_.jobs.clear();
                if let Some((_, conn)) = proc_.conn.take() {
                    // The kernel closes the socket of a killed process.
                    self.send(process, Ev::AtServer(process, ToServer::Close { conn }));
                }
                if let Some(after) = restart_after {
                    self.push(self.now + after, Ev::Heal(Heal::Restart(process)));
                }
            }
            Fault::Terminate { process } => {
                let conns: Vec<u64> = self
                    .server
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.p == process)
                    .map(|(c, _)| *c)
                    .collect();
                for c in conns {
                    self.end_session(
                        c,
                        "57P01",
                        "terminating connection due to administrator command",
                    );
                }
            }
            Fault::ServerRestart { downtime } => {
                let conns: Vec<u64> = self.server.sessions.keys().copied().collect();
                for c in conns {
                    self.end_session(
                        c,
                        "57P01",
                        "terminating connection due to administrator command",
                    );
                }
                self.server.up = false;
                self.push(self.now + downtime, Ev::Heal(Heal::ServerUp));
            }
        }
    }

    fn heal(&mut self, h: Heal) {
        match h {
            Heal::Partition(p) => {
                if self.links[p].partitions == 0 {
                    return;
                }
                self.links[p].partitions -= 1;
                if self.links[p].partitions == 0 {
                    self.trace(Some(p), "partition healed".into());
                    for ev in std::mem::take(&mut self.links[p].held) {
                        self.send(p, ev);
                    }
                }
            }
            Heal::Freeze(p) => {
                if !self.procs[p].frozen {
                    return;
                }
                self.procs[p].frozen = false;
                self.trace(Some(p), "resumed".into());
                if !self.procs[p].alive {
                    return;
                }
                // First the clock: the machine checks its deadlines.
                self.input(p, Input::Tick);
                while let Some(ev) = self.procs[p].deferred.pop_front() {
                    self.dispatch(ev);
                }
            }
            Heal::Delay(p, extra) => {
                self.links[p].extra = self.links[p].extra.saturating_sub(extra)
            }
            Heal::Slow(extra) => self.server.slow = self.server.slow.saturating_sub(extra),
            Heal::Restart(p) => {
                if self.procs[p].alive || self.closing {
                    return;
                }
                let seed = rand(&mut self.rng);
                let proc_ = &mut self.procs[p];
                proc_.machine = Machine::new(self.cfg.options.clone(), seed).expect("valid");
                proc_.incarnation += 1;
                proc_.alive = true;
                proc_.conn = None;
                proc_.runs.clear();
                proc_.finished.clear();
                proc_.expect.clear();
                self.trace(Some(p), "restarted".into());
                self.start_runs(p);
            }
            Heal::ServerUp => self.server.up = true,
        }
    }

    // ---- properties ---------------------------------------------------------

    /// Processes with a running, uncancelled job whose lease is valid by
    /// their own clock now.
    fn valid_leaders(&self, key: i64) -> Vec<usize> {
        (0..self.procs.len())
            .filter(|p| self.leading_keys(*p, true).any(|k| k == key))
            .collect()
    }

    /// Keys process `p` acts on: a running, uncancelled job, the process alive
    /// and (with `by_validity`) the lease valid by its own clock, or (without)
    /// the process not frozen.
    fn leading_keys(&self, p: usize, by_validity: bool) -> impl Iterator<Item = i64> + '_ {
        let proc_ = &self.procs[p];
        let now = self.local(p);
        let active = proc_.alive && (by_validity || !proc_.frozen);
        proc_
            .jobs
            .iter()
            .filter(move |(run, j)| {
                active && !j.cancelled && (!by_validity || proc_.machine.is_valid(**run, now))
            })
            .map(|(_, j)| j.key)
    }

    fn check_safety(&mut self) {
        let mut valid: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        let mut acting: BTreeMap<i64, usize> = BTreeMap::new();
        for p in 0..self.procs.len() {
            for k in self.leading_keys(p, true) {
                valid.entry(k).or_default().push(p);
            }
            for k in self.leading_keys(p, false) {
                *acting.entry(k).or_default() += 1;
            }
        }
        for (key, leaders) in valid {
            if leaders.len() > 1 {
                let name = self.key_names.get(&key).cloned().unwrap_or_default();
                self.violation(format!(
                    "safety: {leaders:?} all hold a valid lease on {name}"
                ));
            }
        }
        // Overlap: two processes act on a key (running, uncancelled job, not
        // frozen), validity aside.
        for (key, n) in &acting {
            if *n > 1 {
                self.overlap_since.entry(*key).or_insert(self.now);
            }
        }
        let ended: Vec<i64> = self
            .overlap_since
            .keys()
            .filter(|k| acting.get(k).copied().unwrap_or(0) < 2)
            .copied()
            .collect();
        for key in ended {
            let since = self.overlap_since.remove(&key).expect("present");
            let name = self.key_names.get(&key).cloned().unwrap_or_default();
            let m = self.report.max_overlap.entry(name).or_default();
            *m = (*m).max(self.now - since);
        }
    }
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("now", &self.now)
            .field("processes", &self.procs.len())
            .finish()
    }
}

/// When the last fault of a schedule is over, or `None` if one never ends.
pub fn faults_end(schedule: &[(Duration, Fault)]) -> Option<Duration> {
    schedule.iter().try_fold(Duration::ZERO, |end, (at, f)| {
        Some(end.max(*at + f.duration()?))
    })
}

/// Watches one machine's inputs and outputs and checks the rules every driver
/// relies on, whatever the inputs: at most one statement in flight per
/// session; no try of a key the machine holds (re-entrant stacking); no unlock
/// of a key whose job runs; a job started only on a session and only when
/// none runs for that run; a cancel only for a running job; every run
/// finished at most once, never while its job runs. The fuzz targets and the
/// property tests feed arbitrary inputs through it.
#[derive(Debug, Default)]
pub struct Observer {
    session: Option<SessionId>,
    inflight: Option<QueryId>,
    jobs: BTreeMap<RunId, i64>,
    finished: BTreeSet<RunId>,
    started: BTreeSet<RunId>,
}

impl Observer {
    /// A fresh observer, for a fresh machine.
    pub fn new() -> Observer {
        Observer::default()
    }

    /// Records an input about to be fed. Inputs the machine will ignore
    /// (stale ids, jobs not running) are fine.
    pub fn input(&mut self, input: &Input) {
        match input {
            Input::JobExited { run, .. } => {
                self.jobs.remove(run);
            }
            Input::Reply { query, .. } if self.inflight == Some(*query) => self.inflight = None,
            Input::SessionLost { session, .. } if self.session == Some(*session) => {
                self.session = None;
                self.inflight = None;
            }
            _ => {}
        }
    }

    /// Records a run the machine accepted.
    pub fn run_started(&mut self, run: RunId) {
        self.started.insert(run);
    }

    /// Checks one session command against the rules. Feed the commands of
    /// one step by the drain rule: run commands first.
    ///
    /// # Errors
    /// A description of the broken rule.
    pub fn session_command(&mut self, c: &SessionCommand) -> Result<(), String> {
        match c {
            SessionCommand::Open { session, .. } => {
                self.session = Some(*session);
                self.inflight = None;
            }
            SessionCommand::Close { session } => {
                if self.session == Some(*session) {
                    self.session = None;
                    self.inflight = None;
                }
            }
            SessionCommand::Query { query, statement } => {
                if self.session.is_none() {
                    return Err(format!("query {query:?} without a session"));
                }
                if let Some(q) = self.inflight {
                    return Err(format!("query {query:?} sent while {q:?} is in flight"));
                }
                self.inflight = Some(*query);
                match statement {
                    Statement::TryLock { keys } => {
                        for k in keys {
                            if self.jobs.values().any(|j| j == k) {
                                return Err(format!(
                                    "try of key {k} whose job runs: re-entrant lock"
                                ));
                            }
                        }
                    }
                    Statement::Release { keys, .. } => {
                        for k in keys {
                            if self.jobs.values().any(|j| j == k) {
                                return Err(format!("unlock of key {k} while its job runs"));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Checks one run command against the rules.
    ///
    /// # Errors
    /// A description of the broken rule.
    pub fn run_command(&mut self, c: &RunCommand) -> Result<(), String> {
        match c {
            RunCommand::StartJob { run, lease, .. } => {
                if self.jobs.insert(*run, lease.key()).is_some() {
                    return Err(format!("job of {run:?} started twice"));
                }
                if self.session.is_none() {
                    return Err(format!("job of {run:?} started without a session"));
                }
            }
            RunCommand::CancelJob { run, .. } => {
                if !self.jobs.contains_key(run) {
                    return Err(format!("cancel of {run:?} whose job does not run"));
                }
            }
            RunCommand::Finish { run, .. } => {
                if !self.finished.insert(*run) {
                    return Err(format!("{run:?} finished twice"));
                }
                if self.jobs.contains_key(run) {
                    return Err(format!("{run:?} finished while its job runs"));
                }
                if !self.started.contains(run) {
                    return Err(format!("unknown {run:?} finished"));
                }
            }
        }
        Ok(())
    }
}

/// One command of the machine, from either queue, as a flat value: what a
/// hand-driven test or a fuzz target records of one step.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// [`SessionCommand::Open`].
    OpenSession {
        /// The session.
        session: SessionId,
        /// Its parameters.
        params: crate::SessionParams,
    },
    /// [`SessionCommand::Query`].
    Query {
        /// The query.
        query: QueryId,
        /// The statement.
        statement: Statement,
    },
    /// [`SessionCommand::Close`].
    CloseSession {
        /// The session.
        session: SessionId,
    },
    /// [`RunCommand::StartJob`].
    StartJob {
        /// The run.
        run: RunId,
        /// Its lease.
        lease: LeaseId,
        /// The fencing token.
        token: i64,
        /// Until when it is valid.
        valid_until: Instant,
    },
    /// [`RunCommand::CancelJob`].
    CancelJob {
        /// The run.
        run: RunId,
        /// Why.
        reason: crate::Reason,
    },
    /// [`RunCommand::Finish`].
    FinishRun {
        /// The run.
        run: RunId,
        /// How it ended.
        outcome: Outcome,
    },
}

impl From<SessionCommand> for Command {
    fn from(c: SessionCommand) -> Command {
        match c {
            SessionCommand::Open { session, params } => Command::OpenSession { session, params },
            SessionCommand::Query { query, statement } => Command::Query { query, statement },
            SessionCommand::Close { session } => Command::CloseSession { session },
        }
    }
}

impl From<RunCommand> for Command {
    fn from(c: RunCommand) -> Command {
        match c {
            RunCommand::StartJob {
                run,
                lease,
                token,
                valid_until,
            } => Command::StartJob {
                run,
                lease,
                token,
                valid_until,
            },
            RunCommand::CancelJob { run, reason } => Command::CancelJob { run, reason },
            RunCommand::Finish { run, outcome } => Command::FinishRun { run, outcome },
        }
    }
}

/// Drains every queue of `machine` by the drain rule (run commands, then
/// session commands; events are returned apart), checking each command with
/// `observer`.
///
/// # Errors
/// The first rule the observer saw broken.
pub fn drain(
    machine: &mut Machine,
    observer: &mut Observer,
) -> Result<(Vec<Command>, Vec<crate::Event>), String> {
    let mut commands = Vec::new();
    while let Some(c) = machine.poll_run() {
        observer.run_command(&c)?;
        commands.push(c.into());
    }
    while let Some(c) = machine.poll_session() {
        observer.session_command(&c)?;
        commands.push(c.into());
    }
    let mut events = Vec::new();
    while let Some(e) = machine.poll_event() {
        events.push(e);
    }
    Ok((commands, events))
}
