//! A deterministic simulator: processes running [`Machine`]s, a PostgreSQL
//! server, the network between them, and their faults, in virtual time; and
//! the checkers and test harness a driver author can reuse.
//!
//! Everything is driven by one seed: the same [`SimConfig`] and fault schedule
//! give the same run, event for event. A ten-minute scenario runs in
//! milliseconds. The simulator checks, as it goes, the properties the machine
//! promises and records every breach in [`Report::violations`] as a
//! [`Violation`] value (see [`Violation`] for the list): strong
//! safety (a job counts until it has returned: cancelled jobs take
//! [`SimConfig::job_reaction`] to stop), release after exit, the run
//! contract, no leaks, no stall. It also measures overlap (time two
//! processes both have a job on a key that has not returned, validity aside),
//! leadership gaps and statement counts, for bounded checks. What happened is
//! in [`Report::trace`], typed ([`TraceEvent`]), and readable with
//! [`Report::trace_text`].
//!
//! ```
//! use std::time::{Duration, Instant};
//! use lease_proto::sim::{Fault, Sim, SimConfig, Violation};
//!
//! let mut sim = Sim::new(SimConfig::default(), Instant::now());
//! sim.schedule(Duration::from_secs(1), Fault::Terminate { process: 0 });
//! let report = sim.finish(Duration::from_secs(5), Duration::from_secs(2));
//! // Terminate ends a session actively: only strong safety may break.
//! assert!(report.violations.iter().all(Violation::is_safety), "{}", report.trace_text());
//! ```
//!
//! The pieces, by concern:
//! - `net`: the network model — per-process links with latency (a base, each
//!   link's own, [`SimConfig::link_latency`]) and jitter,
//!   FIFO delivery, latency spikes, black-hole partitions that hold bytes until
//!   they heal (TCP ends stay open) — and the delivery queue;
//! - `server`: the PostgreSQL model (also on its own, sans-IO, as [`Postgres`]) — sessions, re-entrant advisory locks (one
//!   database), their queue (a release grants the first waiter: a take, an
//!   exclusive lock wait, or the shared waits ahead of it), `pg_locks`,
//!   `idle_session_timeout`, `pg_terminate_backend` (a shutdown's of every
//!   session at once), restarts, `LISTEN/NOTIFY` (with the sender's backend
//!   pid, delivered to a session blocked in a wait only after its reply, as
//!   between transactions; notifications a non-lease client forges,
//!   [`Fault::ForgedNotify`], requests for a hand-over,
//!   [`Fault::RequestHandover`], and late ones,
//!   [`ServerConfig::notify_delay`]), `deadlock_timeout` (which no wait may
//!   reach), hot-standby mode and a transaction pooler that moves statements
//!   between backends;
//! - `process`: processes, their drifting clocks, freezes (nothing runs,
//!   clocks go on), crashes (the kernel closes the sockets, the watch
//!   session's too) and restarts, runs that start later
//!   ([`SimConfig::run_after`]), and
//!   the simulated driver that follows the drain rule;
//! - `inject`: statement faults ([`Fault::FlakyStatements`]) — errors after
//!   a statement ran in part, in whole or not at all, and malformed replies;
//! - `checks`: the properties above, as [`Violation`]s;
//! - `trace`: the typed trace;
//! - [`Observer`]: the rules every driver relies on, checked on one machine's
//!   inputs and commands, for any driver author; [`Harness`]: a machine, an
//!   observer and a manual clock for hand-driven tests.

mod checks;
mod explore;
mod harness;
mod inject;
mod net;
mod observer;
mod postgres;
mod process;
mod server;
mod trace;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[doc(hidden)]
pub use crate::machine::Mutation;
pub use checks::Violation;
#[doc(hidden)]
pub use explore::{Actor, Ready};
pub use harness::Harness;
pub use observer::{drain, Command, Observer, ObserverViolation};
pub use postgres::{ConnId, Postgres, ServerOutput};
pub use trace::{TraceEvent, TraceLine};

use crate::machine::Knobs;
use crate::{JobExit, Machine, Options, Outcome, QueryId, RunId};
use net::{Direction, Net, Queue, ToClient, ToServer};
use process::Proc;
use server::Server;
pub use server::PROMOTION_CHECKPOINT;

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
    /// The embedder of `process` drops its run of lease number `lease` of
    /// [`SimConfig::leases`] (a `select!` or a timeout around the run
    /// future): the job future goes with it, the driver reports
    /// `JobExited { exit: Abandoned }` and never starts a job of that run
    /// again. The run must finish with [`Outcome::Abandoned`] and release its
    /// key. Nothing happens in a frozen or dead process, or to a run that
    /// finished.
    Abandon {
        /// The process.
        process: usize,
        /// The index of the lease in [`SimConfig::leases`] (modulo their number).
        lease: usize,
    },
    /// `pg_terminate_backend` on the session of `process`.
    Terminate {
        /// The process.
        process: usize,
    },
    /// Arms a `pg_terminate_backend` of the sessions of the next process a
    /// release grants its key to (its take first in the key's queue), `after`
    /// the grant: the first taker of a release loses its session moments
    /// after it was handed the key, as an operator's terminate or a failing
    /// network may do, and the take queued behind it is granted then.
    TerminateNextTaker {
        /// From the grant to the terminate.
        after: Duration,
    },
    /// [`Fault::Terminate`], and if a statement of the session is in flight
    /// on the server, the driver reads the server's FATAL answer to it
    /// ([`SessionError::ends_session`](crate::SessionError::ends_session))
    /// 2 ms before the session's end
    /// (after a plain terminate it reads both at once half the time, as the
    /// seed draws).
    TerminateFatalFirst {
        /// The process.
        process: usize,
    },
    /// `pg_terminate_backend` on the watch session of `process` only (if it
    /// has one open): its lease session and leases stay.
    TerminateWatch {
        /// The process.
        process: usize,
    },
    /// Restart the server: every session ends; connections fail for `downtime`.
    ServerRestart {
        /// How long the server is down.
        downtime: Duration,
    },
    /// Crash the server (`pg_ctl stop -m immediate`, SIGKILL): like a
    /// restart, and every transaction id not flushed to the WAL is handed
    /// out again after it.
    ServerCrash {
        /// How long the server is down.
        downtime: Duration,
    },
    /// Fail over: the primary is lost and an asynchronous replica that
    /// missed the last `lag` transaction ids is promoted (a new timeline).
    /// Every session ends; connections fail for `downtime`. A server that
    /// was a hot standby ([`ServerConfig::standby`]) is a primary afterwards.
    Promote {
        /// Transaction ids the replica had not received.
        lag: u32,
        /// How long no server answers.
        downtime: Duration,
    },
    /// Fail over while the primary is frozen or cut off from every client
    /// (SIGSTOP, a hung host): an asynchronous replica that missed the last
    /// `lag` transaction ids is promoted at once (a new timeline). Every
    /// session open on the old primary stays open and silent: its
    /// statements are never answered, nothing ends it (the old server's
    /// guard does not run), and its locks are not on the promoted server,
    /// whose lock table is empty; new connections reach the promoted server.
    /// Its setup shows the promotion ([`crate::reply::PromotionState`]; its first
    /// checkpoint is done [`PROMOTION_CHECKPOINT`] later). Strong safety
    /// must hold: it is no fault of the server ending sessions.
    PromoteFrozenPrimary {
        /// Transaction ids the replica had not received.
        lag: u32,
    },
    /// For `duration`, each statement the server runs answers, with
    /// probability `error`, with an error after it ran in part or in whole
    /// (or not at all): a try may have taken some of its keys, an unlock
    /// released some, since session-level advisory locks outlive the failed
    /// transaction — as a try that took some locks and then hit `53200 out
    /// of shared memory` does; a failed release sends no notification.
    /// Otherwise, with probability `malformed`, the statement runs and its
    /// reply breaks its statement's rules (rows missing, a row of the wrong
    /// shape). The session stays up either way.
    FlakyStatements {
        /// Probability that a statement fails (0 to 1).
        error: f64,
        /// Probability that a reply is malformed (0 to 1).
        malformed: f64,
        /// How long.
        duration: Duration,
    },
    /// A client that is not a lease client (any role may) sends
    /// `NOTIFY lease_handover_v1, '<key>'` for the key of lease number
    /// `lease` of [`SimConfig::leases`], from its own backend: every
    /// listening session gets it at once. Sent just before a terminate of
    /// the holder, it would skip the lock delay if the machine counted a
    /// notification from anyone as a graceful release.
    ForgedNotify {
        /// The index of the lease in [`SimConfig::leases`] (modulo their number).
        lease: usize,
    },
    /// `lease handover NAME --to PID` for lease number `lease` of
    /// [`SimConfig::leases`] and the backend of the lease session `to` has
    /// now (nothing if it has none): the request's `NOTIFY` from a client of
    /// its own.
    RequestHandover {
        /// The index of the lease in [`SimConfig::leases`] (modulo their number).
        lease: usize,
        /// The process to hand it to.
        to: usize,
    },
    /// `lease handover NAME --to PID` for lease number `lease` of
    /// [`SimConfig::leases`] and backend `pid`, whoever that is (a mistyped
    /// pid, a forger's flood): the request's `NOTIFY` from a client of its
    /// own.
    RequestHandoverToPid {
        /// The index of the lease in [`SimConfig::leases`] (modulo their number).
        lease: usize,
        /// The backend pid the request names.
        pid: i64,
    },
    /// A client that is not a lease client (any role may) sends `prefer
    /// <key> <pid> <priority>` for lease number `lease` of
    /// [`SimConfig::leases`], naming the lease session backend that process
    /// `waiter` has now (a real standby that waits for the key; any role can
    /// read `pg_locks`), from its own backend.
    ForgedPrefer {
        /// The index of the lease in [`SimConfig::leases`] (modulo their number).
        lease: usize,
        /// The process whose backend the payload names.
        waiter: usize,
        /// The priority asked with.
        priority: u32,
    },
    /// For `duration`, every connection attempt fails with `28P01 password
    /// authentication failed` (a rotated password, a dropped role); open
    /// sessions go on. Processes that had a session retry and lead again
    /// afterwards; a process that never had one (started, or restarted by
    /// [`Fault::Crash`], inside the window) finishes its runs with
    /// [`Outcome::Config`], which the checks count
    /// as a violation: do not combine the two.
    AuthFailing {
        /// How long.
        duration: Duration,
    },
    /// A client that is not a lease client (any role may) sends
    /// `NOTIFY lease_handover_v1, '<payload>'` from its own backend, any
    /// payload: a forged group announcement (`group <id>`), a forged claim
    /// (`claim <key> <pid>`), a repeated or malformed one.
    ForgedPayload {
        /// The payload.
        payload: String,
    },
    /// A client that is not a lease client (any role may) takes the member
    /// lock `(group id, pid)` of [`SimConfig::group`] on its own backend,
    /// whose pid is not `pid`, and keeps it: a forged member. The membership
    /// read counts a member lock only when its second half is the holding
    /// backend's pid, so it is no member (it would be one with
    /// [`Mutation::ForgedMemberCounted`]). A server restart ends it.
    ForgedMember {
        /// The pid the lock names.
        pid: i64,
    },
}

impl Fault {
    /// Whether the server ends a session actively in this fault (then the
    /// bounded, not the strong, safety property applies).
    pub fn server_ends_sessions(&self) -> bool {
        matches!(
            self,
            Fault::Terminate { .. }
                | Fault::TerminateFatalFirst { .. }
                | Fault::TerminateNextTaker { .. }
                | Fault::ServerRestart { .. }
                | Fault::ServerCrash { .. }
                | Fault::Promote { .. }
        )
    }

    /// When the fault's effect is over, from its start (crashes without
    /// restart never end; `None`).
    pub fn duration(&self) -> Option<Duration> {
        match self {
            Fault::Partition { duration, .. }
            | Fault::Freeze { duration, .. }
            | Fault::Delay { duration, .. }
            | Fault::SlowServer { duration, .. }
            | Fault::FlakyStatements { duration, .. }
            | Fault::AuthFailing { duration } => Some(*duration),
            Fault::Crash { restart_after, .. } => *restart_after,
            Fault::Terminate { .. }
            | Fault::TerminateFatalFirst { .. }
            | Fault::TerminateNextTaker { .. }
            | Fault::TerminateWatch { .. }
            | Fault::Abandon { .. }
            | Fault::ForgedNotify { .. }
            | Fault::RequestHandover { .. }
            | Fault::RequestHandoverToPid { .. }
            | Fault::ForgedPrefer { .. }
            | Fault::ForgedMember { .. }
            | Fault::ForgedPayload { .. }
            | Fault::PromoteFrozenPrimary { .. } => Some(Duration::ZERO),
            Fault::ServerRestart { downtime }
            | Fault::ServerCrash { downtime }
            | Fault::Promote { downtime, .. } => Some(*downtime),
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
    /// Feed the machine the instant the process started, whatever the time:
    /// a driver whose clock is stuck. Its timer fires, the machine sees no
    /// time pass and returns the same deadline: the simulator reports
    /// [`Violation::Stalled`].
    FrozenClock,
    /// With [`SimConfig::stop_as_lease_run`]: a statement's failure never
    /// frees the key (`lease run` before it read the server's FATAL answer
    /// to a statement in flight, `57P01` on a terminate, as a failed
    /// statement, and killed the command at the lease's deadline), nor does
    /// the end of a session given up on (it did not watch one either).
    FatalReplyKeepsKey,
    /// Not a driver's bug but the machine's broken variant of the TCP
    /// settings: sessions neither set nor verify the server-side TCP settings, so
    /// [`ServerConfig::tcp_give_up`] applies to them.
    NoTcpSettings,
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
    /// A transaction pooler with ONE server connection that every client
    /// shares (same backend pid, same locks, same `lease.nonce`), with every
    /// setting the sessions ask for set by `ALTER ROLE`: setup passes, only
    /// the session nonce and the try's own-backend check can find it. With
    /// [`ServerConfig::pooler`] and [`ServerConfig::pooler_rejects_options`]
    /// too: a pooler that rejects the startup options (the settings go by
    /// statement) and runs every statement on its one backend, where a
    /// second connection of a lone client reads that client's nonce (the
    /// pooler probe, [`SessionCommand::Probe`](crate::SessionCommand::Probe)).
    pub pooler_one_backend: bool,
    /// The server ends any session silent for this long, whatever the session
    /// asked for (a DBA's `idle_session_timeout`, or TCP keepalives).
    pub silent_session_kill: Option<Duration>,
    /// The server's TCP give-up on a client that does not answer (role,
    /// database or server `tcp_keepalives_*` / `tcp_user_timeout`): a session
    /// whose client's link is partitioned is ended this long after its last
    /// statement arrived, unless the session set its own `tcp_user_timeout`
    /// and `tcp_keepalives_idle` (then the larger of those). A client that
    /// is merely frozen still answers (its kernel does): not ended.
    pub tcp_give_up: Option<Duration>,
    /// The broken variant of the fencing token: tokens as the try made them
    /// before the fix, the bare transaction id with no WAL record (never
    /// flushed, so a crash hands it out again) and no timeline bits (a
    /// promoted lagging replica hands out smaller ones).
    pub legacy_tokens: bool,
    /// At every [`Fault::ServerCrash`] and [`Fault::Promote`] the server's
    /// clock, which makes the fencing tokens, comes back this much behind
    /// where it was (an NTP step at boot; a promoted replica on a machine
    /// whose clock is behind the old primary's). Tokens keep increasing
    /// while it is below the time between the last acquisition before and
    /// the first after (the downtime at least); more is the broken variant.
    pub clock_step_back: Duration,
    /// Broken variant: a [`Statement::Wait`](crate::Statement::Wait) that
    /// keeps its shared lock after it returns (a session-level
    /// `pg_advisory_lock_shared` instead of the transaction-level lock that
    /// ends with its statement): the waiter blocks every other session's
    /// exclusive try of the key for as long as it lives.
    pub wait_keeps_shared_lock: bool,
    /// How long after a release the second wait it woke keeps its shared
    /// lock and sends its reply, the third twice that, and so on: the
    /// scheduler runs the woken backends one after another (a busy server's
    /// scheduler; measured on a 2-core machine under a herd of 100: the
    /// first try after a kill -9 came 2 to 14 ms after the holder's backend
    /// was gone). Another session's plain try of the key loses meanwhile,
    /// and a take queued behind such a wait is granted the key then (its
    /// reply leaves when the shared locks before it are gone).
    pub woken_backend_lag: Duration,
    /// Replies of more rows than this do not fit in the server's socket send
    /// buffer (`None`: every reply fits). A backend writing one to a client
    /// whose link is partitioned stays blocked in the write: it is not idle,
    /// so neither `idle_session_timeout` nor a silent-session kill ends it,
    /// and it holds its locks until the partition heals and the write
    /// completes; its idle clock starts then.
    pub send_buffer_rows: Option<usize>,
    /// Keys a client that is not a lease client holds SHARED
    /// (`pg_advisory_lock_shared`) the whole run: every try of them loses
    /// (the holder shown is that client), and a wait for one is granted at
    /// once, as a shared lock does not conflict with a shared wait.
    pub foreign_shared_keys: Vec<i64>,
    /// A graceful release's notification leaves the server this long after
    /// the release (default 0). PostgreSQL unlocks a session-level advisory
    /// lock at once, waking its waiters, but delivers a `NOTIFY` only at
    /// its transaction's commit, which may wait (a WAL flush, a synchronous
    /// standby): the notification may reach a standby after its woken try
    /// lost the herd and it waits again behind the new holder.
    pub notify_delay: Duration,
    /// The session's `deadlock_timeout` (default 1 s, PostgreSQL's): a
    /// [`Statement::Wait`](crate::Statement::Wait) cuts its lock timeout to
    /// [`wait_limit_ms`](crate::server::wait_limit_ms) of it, as the statement does,
    /// and reports it; a lock wait that lasts it is counted in
    /// [`Report::lock_waits_past_deadlock_timeout`].
    pub deadlock_timeout: Duration,
    /// Broken variant: a wait whose lock timeout is not cut below
    /// `deadlock_timeout` and whose reply does not report it (the wait
    /// statement as it once was).
    pub wait_ignores_deadlock_timeout: bool,
    /// The sessions' role may read the current timeline's history file
    /// (`pg_ls_waldir()`: superusers and members of `pg_monitor`): the setup
    /// reads when the server was promoted, also after a restart. Off by
    /// default: a role without privileges, for which a restart of a
    /// promoted server leaves only its timeline and the restart's
    /// checkpoint ([`crate::reply::PromotionState`]).
    pub history_readable: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            version: 150_000,
            standby: false,
            pooler: false,
            pooler_rejects_options: false,
            pooler_one_backend: false,
            silent_session_kill: None,
            tcp_give_up: None,
            legacy_tokens: false,
            clock_step_back: Duration::ZERO,
            wait_keeps_shared_lock: false,
            woken_backend_lag: Duration::ZERO,
            send_buffer_rows: None,
            foreign_shared_keys: Vec::new(),
            notify_delay: Duration::ZERO,
            deadlock_timeout: Duration::from_secs(1),
            wait_ignores_deadlock_timeout: false,
            history_readable: false,
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
    /// Lease names every process runs (one run each, started at time 0
    /// unless `run_after` says later).
    pub leases: Vec<String>,
    /// The lease group every run takes part in (see `docs/library.md`,
    /// "Lease groups"); `None`: no group.
    pub group: Option<String>,
    /// Per process: it runs only the first `n` of [`SimConfig::leases`] (a member
    /// of a lease group that runs another key set); `None`, or a process past the
    /// end: every lease.
    pub lease_subset: Vec<Option<usize>>,
    /// Per process, per lease of `leases` (by index): how long after the
    /// process starts (or restarts) its run of that lease starts; missing
    /// entries start at once. Lets each process of a fleet hold a lease of
    /// its own and want the others'.
    pub run_after: Vec<Vec<Duration>>,
    /// Options of every machine.
    pub options: Options,
    /// Per process: options of its own instead of `options` (an observer, a
    /// preferred process: [`Options::role`]);
    /// `None`, or a process past the end: `options`.
    pub process_options: Vec<Option<Options>>,
    /// Base one-way latency of every link.
    pub latency: Duration,
    /// Up to this much is added to each message's latency (FIFO is kept).
    pub jitter: Duration,
    /// Added one-way latency of each process's link, by process (a replica
    /// in another zone); processes past the end get none.
    pub link_latency: Vec<Duration>,
    /// Clock-rate drift bound: each process's clock runs at a rate drawn from
    /// `[1 - drift, 1 + drift]` (the server's at 1).
    pub drift: f64,
    /// A cancelled job returns within this long (uniformly drawn from
    /// `job_reaction_min..=job_reaction`): jobs take time to stop, and the
    /// strong-safety check counts a cancelled job as running until it has
    /// returned. The machine keeps a session it gives up on until its jobs
    /// returned, at most until the guard deadline, so strong safety holds
    /// while a cancelled job returns within the guard margin (less the drift
    /// allowance) of its lease's validity end.
    pub job_reaction: Duration,
    /// The least time a cancelled job takes to return (default 0; at most
    /// `job_reaction`, which wins if smaller).
    pub job_reaction_min: Duration,
    /// Jobs are stopped as `lease run` stops its command: a cancelled job
    /// whose lease was lost for a reason that may have freed the key on the
    /// server ([`Reason::key_may_be_free`](crate::Reason::key_may_be_free))
    /// is killed within half its lock delay, however long it would take to
    /// return by itself (`job_reaction`: a command that ignores SIGTERM);
    /// so is one still running when a session the machine gave up on
    /// (doubtful) ends.
    /// Off by default: jobs return within `job_reaction` whatever the reason.
    pub stop_as_lease_run: bool,
    /// Broken variant for tests: every machine closes a session it gives up
    /// on at once, while its cancelled jobs may still run (the machine's
    /// behaviour before doubtful sessions were kept). The strong-safety check must catch it.
    #[doc(hidden)]
    pub close_doubtful_at_once: bool,
    /// Broken variant for tests: a deliberate bug planted in every machine
    /// ([`Mutation`]), to show that a property catches it. `None` (the
    /// default) outside such a test.
    #[doc(hidden)]
    pub mutation: Option<Mutation>,
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
            group: None,
            lease_subset: Vec::new(),
            run_after: Vec::new(),
            process_options: Vec::new(),
            options: Options {
                retry_interval: Duration::from_millis(200),
                heartbeat_interval: Duration::from_millis(200),
                query_timeout: Duration::from_millis(500),
                guard_margin: Duration::from_millis(200),
                ..Options::default()
            },
            latency: Duration::from_micros(500),
            jitter: Duration::from_micros(500),
            link_latency: Vec::new(),
            drift: 0.0,
            job_reaction: Duration::from_millis(5),
            job_reaction_min: Duration::ZERO,
            stop_as_lease_run: false,
            close_doubtful_at_once: false,
            mutation: None,
            job_exit_probability: 0.0,
            job_lifetime: Duration::from_secs(2),
            server: ServerConfig::default(),
            bug: None,
            full_trace: false,
        }
    }
}

/// What a simulation found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every property breach (the first 50 found while running, then the
    /// checks at the end).
    pub violations: Vec<Violation>,
    /// Per key name: the longest stretch the same two processes both had a
    /// job that had not returned yet, cancelled or not, while neither was
    /// frozen (validity aside). Per pair: two such overlaps of different
    /// pairs that touch are two stretches, not one.
    pub max_overlap: BTreeMap<String, Duration>,
    /// Per key name: acquisitions (job starts).
    pub acquisitions: BTreeMap<String, u32>,
    /// Statements sent, per process.
    pub statements: Vec<u64>,
    /// Runs finished, with their outcome, per process (all incarnations).
    pub outcomes: Vec<Vec<(String, Outcome)>>,
    /// The trace (the last 400 lines unless `full_trace`).
    pub trace: Vec<TraceLine>,
    /// Lock waits that lasted the server's `deadlock_timeout`
    /// ([`ServerConfig::deadlock_timeout`]): each ran the deadlock detector
    /// and, with `log_lock_waits = on`, wrote "still waiting" to the log.
    pub lock_waits_past_deadlock_timeout: u64,
    /// Jobs cancelled to hand their key over to another member of its lease
    /// group ([`Reason::HandedOver`](crate::Reason::HandedOver)), all processes.
    pub handoffs: u64,
}

impl Report {
    /// The trace as readable text: `time  process  event`, one a line.
    pub fn trace_text(&self) -> String {
        trace::render(&self.trace)
    }
}

// ---- internals ----------------------------------------------------------

/// Everything that waits in the queue.
#[derive(Debug, Clone)]
enum Ev {
    AtServer(usize, ToServer),
    AtClient(usize, ToClient),
    Deadline(usize, u64),
    JobExit {
        p: usize,
        incarnation: u32,
        run: RunId,
        exit: JobExit,
        job: u64,
    },
    IdleCheck(u64),
    TcpCheck(u64),
    /// A run of `run_after` starts, if its process is still that incarnation.
    StartRun {
        p: usize,
        incarnation: u32,
        lease: usize,
    },
    /// A queued wait's lock timeout.
    LockTimeout {
        conn: u64,
        query: QueryId,
    },
    FaultStart(Fault),
    /// A message that leaves the server now for process `p` (a late notification).
    Deliver(usize, ToClient),
    Heal(Heal),
    Close,
}

/// The end of a fault's effect.
#[derive(Debug, Clone)]
enum Heal {
    Partition(usize),
    Freeze(usize),
    Delay(usize, Duration),
    Slow(Duration),
    Flaky(inject::Flaky),
    Restart(usize),
    ServerUp,
    AuthWorks,
}

/// A running simulation.
pub struct Sim {
    /// A terminate whose FATAL answer to a statement in flight the driver
    /// reads first ([`Fault::TerminateFatalFirst`]) is being injected.
    fatal_first: bool,
    cfg: SimConfig,
    base: Instant,
    now: Duration,
    queue: Queue<Ev>,
    rng: u64,
    procs: Vec<Proc>,
    net: Net<Ev>,
    server: Server,
    next_conn: u64,
    next_job: u64,
    report: Report,
    /// key → since when two processes act on it.
    /// Per key and pair of processes (in process order): since when both
    /// have had a job on it.
    overlap_since: BTreeMap<(i64, usize, usize), Duration>,
    closing: bool,
    key_names: BTreeMap<i64, String>,
    /// lease name → the largest fencing token any of its acquisitions had.
    max_token: BTreeMap<String, i64>,
    /// Statement faults in force ([`Fault::FlakyStatements`]).
    flaky: Vec<inject::Flaky>,
    /// An armed [`Fault::TerminateNextTaker`]: its delay.
    terminate_next_taker: Option<Duration>,
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
        for p in 0..cfg.processes {
            let u = (rand(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
            let rate = 1.0 + cfg.drift * (2.0 * u - 1.0);
            let machine = new_machine(&cfg, p, rand(&mut rng));
            procs.push(Proc::new(machine, rate));
        }
        let key_names = cfg
            .leases
            .iter()
            .map(|n| (crate::key_for_name(n), n.clone()))
            .collect();
        let n = cfg.processes;
        let mut sim = Sim {
            base,
            now: Duration::ZERO,
            queue: Queue::new(),
            rng,
            procs,
            net: Net::new(n),
            server: Server::new(cfg.server.clone())
                .counting_forged_members(cfg.mutation == Some(Mutation::ForgedMemberCounted)),
            cfg,
            next_conn: 0,
            next_job: 0,
            max_token: BTreeMap::new(),
            report: Report {
                statements: vec![0; n],
                outcomes: vec![Vec::new(); n],
                ..Report::default()
            },
            overlap_since: BTreeMap::new(),
            closing: false,
            key_names,
            flaky: Vec::new(),
            terminate_next_taker: None,
            fatal_first: false,
        };
        for p in 0..n {
            sim.start_runs(p);
        }
        sim
    }

    /// Schedules a fault at virtual time `at`.
    pub fn schedule(&mut self, at: Duration, fault: Fault) {
        self.queue.push(at, Ev::FaultStart(fault));
    }

    /// Runs until virtual time `until` (events at exactly `until` included).
    pub fn run_until(&mut self, until: Duration) {
        while let Some((t, ev)) = self.queue.pop_until(until) {
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
            while self.net.partitioned(p) {
                self.heal(Heal::Partition(p));
            }
            if self.procs[p].frozen {
                self.heal(Heal::Freeze(p));
            }
            self.net.clear_delay(p);
        }
        self.server.slow = Duration::ZERO;
        self.flaky.clear();
        self.server.up = true;
        self.queue.push(self.now, Ev::Close);
        self.run_until(at + settle);
        self.check_end();
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

    /// Whether `process` runs now: not crashed, or restarted since.
    pub fn is_alive(&self, process: usize) -> bool {
        self.procs[process].alive
    }

    /// The statements the server has executed for `process` (all sessions).
    pub fn statements(&self, process: usize) -> u64 {
        self.report.statements[process]
    }

    /// The backend pid of `process`'s session, while it is ready: its
    /// member id in a lease group.
    pub fn backend_pid(&self, process: usize) -> Option<i64> {
        match self.procs[process].machine.status().session {
            crate::SessionState::Ready { backend_pid } => Some(backend_pid),
            _ => None,
        }
    }

    /// The advisory keys the server holds now.
    pub fn server_locks(&self) -> Vec<i64> {
        self.server.held_keys()
    }

    /// The process whose session holds `lease`'s key on the server now, if
    /// any (it may not lead yet: a win not answered, a frozen client).
    pub fn server_holder(&self, lease: &str) -> Option<usize> {
        let key = crate::key_for_name(lease);
        (self.server.lock_owners().into_iter())
            .find(|(k, _)| *k == key)
            .and_then(|(_, conn)| self.server.process_of(conn?))
    }

    // ---- plumbing ------------------------------------------------------

    fn trace(&mut self, process: Option<usize>, event: TraceEvent) {
        self.report.trace.push(TraceLine {
            at: self.now,
            process,
            event,
        });
        if !self.cfg.full_trace && self.report.trace.len() > 800 {
            self.report.trace.drain(..400);
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

    /// One message's one-way latency on `p`'s link now (base, the link's
    /// own, added by faults, jitter).
    fn link_latency(&mut self, p: usize) -> Duration {
        let own = self.cfg.link_latency.get(p).copied().unwrap_or_default();
        self.cfg.latency + own + self.net.extra(p) + self.uniform(self.cfg.jitter)
    }

    /// Sends a message on `p`'s link now.
    fn send(&mut self, p: usize, ev: Ev) {
        let latency = self.link_latency(p);
        let way = match ev {
            Ev::AtServer(..) => Direction::ToServer,
            _ => Direction::ToClient,
        };
        if let Some((at, ev)) = self.net.send(p, way, self.now, latency, ev) {
            self.queue.push(at, ev);
        }
    }

    // ---- events -----------------------------------------------------------

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::AtServer(p, msg) => self.at_server(p, msg),
            Ev::AtClient(p, _)
            | Ev::Deadline(p, _)
            | Ev::JobExit { p, .. }
            | Ev::StartRun { p, .. }
                if self.procs[p].frozen =>
            {
                self.procs[p].deferred.push_back(ev);
            }
            Ev::AtClient(p, msg) => self.at_client(p, msg),
            Ev::Deadline(p, gen) => {
                if self.procs[p].alive && gen == self.procs[p].timer_gen {
                    self.input(p, crate::Input::Tick);
                }
            }
            Ev::JobExit {
                p,
                incarnation,
                run,
                exit,
                job,
            } => self.job_exit(p, incarnation, run, exit, job),
            Ev::StartRun {
                p,
                incarnation,
                lease,
            } => {
                let proc_ = &self.procs[p];
                if proc_.alive && proc_.incarnation == incarnation && !self.closing {
                    self.start_run(p, lease);
                    self.drain(p);
                }
            }
            Ev::IdleCheck(conn) => self.idle_check(conn),
            Ev::TcpCheck(conn) => self.tcp_check(conn),
            Ev::LockTimeout { conn, query } => self.lock_timeout(conn, query),
            Ev::FaultStart(f) => self.fault(f),
            Ev::Deliver(p, msg) => self.send(p, Ev::AtClient(p, msg)),
            Ev::Heal(h) => self.heal(h),
            Ev::Close => {
                self.closing = true;
                for p in 0..self.procs.len() {
                    if self.procs[p].alive {
                        self.input(p, crate::Input::Close);
                    }
                }
            }
        }
    }

    fn fault(&mut self, f: Fault) {
        self.trace(None, TraceEvent::Fault(f.clone()));
        match f {
            Fault::Partition { process, duration } => {
                self.net.partition(process);
                let ev = Ev::Heal(Heal::Partition(process));
                self.queue.push(self.now + duration, ev);
            }
            Fault::Freeze { process, duration } => {
                if !self.procs[process].frozen {
                    self.procs[process].frozen = true;
                    let ev = Ev::Heal(Heal::Freeze(process));
                    self.queue.push(self.now + duration, ev);
                }
            }
            Fault::Delay {
                process,
                extra,
                duration,
            } => {
                self.net.delay(process, extra);
                let ev = Ev::Heal(Heal::Delay(process, extra));
                self.queue.push(self.now + duration, ev);
            }
            Fault::SlowServer { extra, duration } => {
                self.server.slow += extra;
                self.queue
                    .push(self.now + duration, Ev::Heal(Heal::Slow(extra)));
            }
            Fault::Crash {
                process,
                restart_after,
            } => {
                if !self.procs[process].alive {
                    return;
                }
                // The kernel closes the sockets of a killed process (the
                // session's and the watch session's).
                for conn in self.procs[process].crash() {
                    self.send(process, Ev::AtServer(process, ToServer::Close { conn }));
                }
                if let Some(after) = restart_after {
                    let ev = Ev::Heal(Heal::Restart(process));
                    self.queue.push(self.now + after, ev);
                }
            }
            Fault::FlakyStatements {
                error,
                malformed,
                duration,
            } => {
                let flaky = inject::Flaky { error, malformed };
                self.flaky.push(flaky);
                let ev = Ev::Heal(Heal::Flaky(flaky));
                self.queue.push(self.now + duration, ev);
            }
            Fault::AuthFailing { duration } => {
                self.server.auth_failing += 1;
                self.queue
                    .push(self.now + duration, Ev::Heal(Heal::AuthWorks));
            }
            Fault::Abandon { process, lease } => self.abandon(process, lease),
            Fault::Terminate { process } => self.terminate(Some(process)),
            Fault::TerminateFatalFirst { process } => {
                self.fatal_first = true;
                self.terminate(Some(process));
                self.fatal_first = false;
            }
            Fault::TerminateNextTaker { after } => self.terminate_next_taker = Some(after),
            Fault::TerminateWatch { process } => {
                if let Some((_, conn)) = self.procs.get(process).and_then(|p| p.watch) {
                    self.terminate_session(conn);
                }
            }
            Fault::ForgedNotify { lease } => {
                if !self.cfg.leases.is_empty() {
                    let name = &self.cfg.leases[lease % self.cfg.leases.len()];
                    let key = crate::key_for_name(name);
                    // A forger that knows the payload: the key and a release
                    // moment of now on the server's clock.
                    let at = self.server.clock_now(self.now);
                    let payload = format!("{key} {at}");
                    self.notify_listeners(payload, server::FORGER_PID, Duration::ZERO);
                }
            }
            Fault::RequestHandover { lease, to } => {
                let pid = (self.procs.get(to)).and_then(|_| self.backend_pid(to));
                if let (false, Some(pid)) = (self.cfg.leases.is_empty(), pid) {
                    let name = &self.cfg.leases[lease % self.cfg.leases.len()];
                    let key = crate::key_for_name(name);
                    let payload = crate::server::handover_request_payload(key, pid);
                    self.notify_listeners(payload, server::FORGER_PID, Duration::ZERO);
                }
            }
            Fault::RequestHandoverToPid { lease, pid } => {
                if !self.cfg.leases.is_empty() {
                    let name = &self.cfg.leases[lease % self.cfg.leases.len()];
                    let key = crate::key_for_name(name);
                    let payload = crate::server::handover_request_payload(key, pid);
                    self.notify_listeners(payload, server::FORGER_PID, Duration::ZERO);
                }
            }
            Fault::ForgedPrefer {
                lease,
                waiter,
                priority,
            } => {
                let pid = (self.procs.get(waiter)).and_then(|_| self.backend_pid(waiter));
                if let (false, Some(pid)) = (self.cfg.leases.is_empty(), pid) {
                    let name = &self.cfg.leases[lease % self.cfg.leases.len()];
                    let key = crate::key_for_name(name);
                    let forger = server::FORGER_PID;
                    let payload = format!("prefer {key} {pid} {priority}");
                    self.notify_listeners(payload, forger, Duration::ZERO);
                }
            }
            Fault::ForgedPayload { payload } => {
                self.notify_listeners(payload, server::FORGER_PID, Duration::ZERO);
            }
            Fault::ForgedMember { pid } => {
                if let Some(group) = &self.cfg.group {
                    let group = crate::key::group_id_for_name(group);
                    self.server.forged_members.insert((group, pid));
                }
            }
            Fault::ServerRestart { downtime } => {
                self.terminate(None);
                self.server.restart(self.now);
                self.queue
                    .push(self.now + downtime, Ev::Heal(Heal::ServerUp));
            }
            Fault::ServerCrash { downtime } => {
                self.terminate(None);
                self.server.crash(self.now);
                self.queue
                    .push(self.now + downtime, Ev::Heal(Heal::ServerUp));
            }
            Fault::PromoteFrozenPrimary { lag } => self.server.promote_frozen(lag, self.now),
            Fault::Promote { lag, downtime } => {
                self.terminate(None);
                self.server.promote(lag, self.now);
                self.queue
                    .push(self.now + downtime, Ev::Heal(Heal::ServerUp));
            }
        }
    }

    fn heal(&mut self, h: Heal) {
        match h {
            Heal::Partition(p) => {
                let blocked = self.blocked_writes(p);
                if let Some(held) = self.net.heal(p) {
                    // Blocked writes complete: those backends go idle now.
                    for conn in blocked {
                        self.server.write_done(conn, self.now);
                        self.arm_idle(conn);
                    }
                    self.trace(Some(p), TraceEvent::PartitionHealed);
                    for ev in held {
                        self.send(p, ev);
                    }
                }
            }
            Heal::Freeze(p) => {
                if !self.procs[p].frozen {
                    return;
                }
                self.procs[p].frozen = false;
                self.trace(Some(p), TraceEvent::Resumed);
                if !self.procs[p].alive {
                    return;
                }
                // Jobs whose validity ended while frozen act until they stop.
                let now = self.local(p);
                let proc_ = &mut self.procs[p];
                for (run, j) in &mut proc_.jobs {
                    if !j.cancelled && !proc_.machine.is_valid(*run, now) {
                        j.stale = true;
                    }
                }
                // First the clock: the machine checks its deadlines.
                self.input(p, crate::Input::Tick);
                while let Some(ev) = self.procs[p].deferred.pop_front() {
                    self.dispatch(ev);
                }
            }
            Heal::Delay(p, extra) => self.net.undelay(p, extra),
            Heal::Slow(extra) => self.server.slow = self.server.slow.saturating_sub(extra),
            Heal::Flaky(flaky) => {
                if let Some(i) = self.flaky.iter().position(|f| *f == flaky) {
                    self.flaky.remove(i);
                }
            }
            Heal::Restart(p) => {
                if self.procs[p].alive || self.closing {
                    return;
                }
                let seed = rand(&mut self.rng);
                let machine = new_machine(&self.cfg, p, seed);
                self.procs[p].restart(machine);
                self.trace(Some(p), TraceEvent::Restarted);
                self.start_runs(p);
            }
            Heal::ServerUp => self.server.up = true,
            Heal::AuthWorks => self.server.auth_failing -= 1,
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

/// Process `p`'s machine, with its options and the broken variants and
/// test knobs the configuration asks for.
fn new_machine(cfg: &SimConfig, p: usize, seed: u64) -> Machine {
    let knobs = Knobs {
        tcp_settings_off: cfg.bug == Some(DriverBug::NoTcpSettings),
        close_doubtful_at_once: cfg.close_doubtful_at_once,
        mutation: cfg.mutation,
    };
    let options = (cfg.process_options.get(p).cloned().flatten()).unwrap_or(cfg.options.clone());
    Machine::with_knobs(options, seed, knobs).expect("valid options")
}

/// When the last fault of a schedule is over, or `None` if one never ends.
pub fn faults_end(schedule: &[(Duration, Fault)]) -> Option<Duration> {
    schedule.iter().try_fold(Duration::ZERO, |end, (at, f)| {
        Some(end.max(*at + f.duration()?))
    })
}
