//! The lease state machine: one dispatch over owned components.
//!
//! [`Machine`] keeps what ties the components together (options, phase, the
//! session, the output queues) and routes every input to the component
//! that owns its rule. Each component is a type with its state and its
//! methods, and nothing else touches its fields:
//!
//! - `runs`: the [`RunTable`]: every run by id and key, their states and
//!   transitions, the keys held without a run;
//! - `session`: the [`Session`] (idle, connecting, up, doubtful), the
//!   [`Connector`] that opens one after another (failures, backoff, nonces,
//!   settings by statement, the last error) and the setup's checks;
//! - `jitter`: the [`Jitter`](jitter::Jitter), the machine's one seeded random sequence,
//!   held by the [`Connector`] (backoffs, nonces, and the standby retries);
//! - `plan`: the [`SendPlan`] (a verify or a try owed, the heartbeat's
//!   turn);
//! - `wait`: the [`ServerWait`], standbys waiting on the server for a key
//!   to be freed (the rule, in one place);
//! - `watch`: the [`Watch`] session, a second connection that only waits,
//!   for a locker that holds a lease and wants another (the rule, in one
//!   place): it owns its state and handles its own inputs and replies
//!   through the [`Cx`](cx::Cx) the dispatch lends it;
//! - `doubtful`: the rule for a session given up on while its cancelled jobs
//!   still run;
//! - `membership`: the [`Groups`], lease groups' membership (read from the
//!   server) and shares, what a member may try and what it hands over;
//! - `handover`: hand-overs asked of this holder (the rule), and the
//!   handover channel's release notifications, requests and preferences;
//! - `asks`: the [`Asks`] the hand-over rule keeps;
//! - `clock`: the server's clock against the local one;
//! - `cx`: the [`Cx`](cx::Cx), what a component borrows from the machine to
//!   act (options, run table, deadlines, outputs, ids, send plan);
//! - `deadline`: the one [`DeadlineTable`] behind [`Machine::poll_timeout`],
//!   with the latest time fed in (time never goes backwards);
//! - `outputs`: the queued outputs ([`Outputs`]) and the order
//!   [`Machine::poll_output`] hands them out in;
//! - `knobs`: the simulator's broken variants, all off in production;
//! - `status`: the public snapshot's types.
//!
//! Where a rule combines several components, its handling is an
//! `impl Machine` block in the file named for the rule:
//!
//! - `groups`: lease groups (the protocol, in one place): membership reads,
//!   an observer's reads, claims and join announcements;
//! - `lifecycle`: the session from open to close (setup, pooler probe,
//!   ready, lost, doubtful, refused, closed when idle) and the machine's
//!   [`Phase`];
//! - `heartbeat`: the steady proof of the session: heartbeat and verify
//!   replies, and the same-backend check every such reply passes;
//! - `acquire`: a try's and a take's reply, and the lock delay between a
//!   win and its job;
//! - `pump`: after every input, the deadlines enforced and the next
//!   statement picked (the send order, the waits, which deadline can make
//!   progress).
//!
//! This file holds the dispatch, in the order of the machine's classes:
//! inputs, outputs, timer, queries, then the routing of replies.

use std::fmt;
use std::time::Instant;

use crate::io::*;
use crate::key::LeaseId;
use crate::options::{Options, OptionsError};
use crate::sql::{
    CheckReply, HeartbeatReply, MembersReply, Notice, Row, SetupReply, VerifyReply,
    HANDOVER_CHANNEL,
};

mod acquire;
mod asks;
mod clock;
mod cx;
mod deadline;
mod doubtful;
mod groups;
mod handover;
mod heartbeat;
mod jitter;
mod knobs;
mod lifecycle;
mod membership;
mod outputs;
mod plan;
mod pump;
mod runs;
mod session;
mod status;
#[cfg(test)]
mod tests;
mod wait;
mod watch;

use asks::Asks;
pub use asks::{CHECK_BURST, CHECK_EVERY, MAX_ASKS_PER_KEY};
use deadline::DeadlineTable;
pub(crate) use knobs::Knobs;
#[cfg(feature = "sim")]
pub use knobs::Mutation;
use membership::Groups;
use outputs::Outputs;
use plan::SendPlan;
use runs::{RunState, RunTable};
pub use runs::{ASK_AGAIN_CAP, MAX_ASKS};
use session::{Connector, Session, Stage, What};
use wait::ServerWait;
use watch::{LeaseSide, Watch};

pub use deadline::Deadline;
pub use membership::assign as group_share;
pub use plan::VERIFY_EVERY;
pub use session::{
    FAST_RECONNECT_CAP, FAST_RECONNECT_WINDOW, MIN_SERVER_VERSION, MIN_SERVER_VERSION_GUARD,
    RECONNECT_BASE,
};
pub use status::{LastError, LeaseState, LeaseStatus, SessionState, Status};
pub use wait::{HERD_WAITERS, MIN_WAIT, TAKE_NOTICES, WAKE_BUDGET};

/// Why [`Machine::run`] refused a run. Exhaustive on purpose, as
/// [`Outcome`] is: a driver maps each case for its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunRejected {
    /// This machine already runs a lease with that key. Advisory locks are
    /// re-entrant within a session, so two runs would both believe they lead.
    AlreadyRunning(LeaseId),
    /// The machine already has [`Options::max_leases`] runs.
    TooManyLeases {
        /// The cap in force.
        cap: usize,
    },
    /// The machine refused its setup earlier; see [`Refusal`].
    Refused(Refusal),
    /// A run in a lease group ([`LeaseId::in_group`]) on a machine without
    /// [`Options::notify_handover`]: a group needs the handover channel (see
    /// the crate's `docs/library.md`, "Lease groups").
    GroupWithoutNotify(LeaseId),
}

impl fmt::Display for RunRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunRejected::AlreadyRunning(l) => {
                write!(f, "lease {l} is already running on this locker")
            }
            RunRejected::TooManyLeases { cap } => write!(
                f,
                "this locker already runs {cap} leases (max_leases); the server's lock table is shared by every session"
            ),
            RunRejected::Refused(r) => write!(f, "{r}"),
            RunRejected::GroupWithoutNotify(l) => write!(
                f,
                "lease {l} is in lease group {}, and a lease group needs handover notifications (notify_handover is off)",
                l.group().map_or("", |g| g.name())
            ),
        }
    }
}

impl std::error::Error for RunRejected {}

/// Whether the machine takes new work (the rules: the `lifecycle` module).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Phase {
    Open,
    /// [`Input::Close`](crate::Input::Close) came: runs are stopped, new
    /// ones finish at once.
    Closing,
    /// Final: the setup cannot give mutual exclusion.
    Refused(Refusal),
}

/// The sans-IO lease state machine: one database session, many leases.
///
/// It never reads a clock, sleeps, spawns or does I/O; randomness (retry
/// jitter) comes from the seed given to [`Machine::new`]. Its methods come in
/// four classes, used in this order by a driver's loop (see the crate docs for
/// the whole loop, compiled):
///
/// 1. **Inputs**, each with the current time: [`Machine::run`] (a new run)
///    and [`Machine::handle_input`] (everything else: replies, job exits,
///    session events, notifications, [`Input::Tick`]). Time never goes
///    backwards inside the machine: an earlier `now` counts as the latest.
/// 2. **Output**: [`Machine::poll_output`], drained after every input until
///    it is `None`: run commands (start and cancel jobs, finish runs),
///    session commands (open, query, close) and events (logs and metrics),
///    in the order they must be carried out. Draining is what makes the
///    machine act: an output left queued is an action not taken.
/// 3. **Deadline**: [`Machine::poll_timeout`], read after draining: when to feed
///    [`Input::Tick`] if no other input comes first;
///    [`Machine::timeout_reason`] says which deadline that is. One timer is
///    enough for a driver: the machine owns every deadline (connect, query,
///    validity, deferred close, heartbeat, retry, backoff) in one table.
/// 4. **Queries**, at any time, changing nothing: [`Machine::status`],
///    [`Machine::valid_until`], [`Machine::is_valid`], [`Machine::is_closed`],
///    [`Machine::options`].
///
/// Guarantees (see the crate docs for the bounds):
/// - a job is started only after the server granted its key to this session,
///   and cancelled as soon as the machine learns, or suspects, that the key is
///   lost: session loss, statement timeout, failed verification, a heartbeat
///   that does not show the key, or the lease's validity deadline passing;
/// - a key is unlocked only after its job has returned;
/// - a session the machine gives up on itself (a statement times out, fails
///   or breaks its rules, or a validity ends) is *doubtful*: every lease on
///   it is lost and every job cancelled at once, but the session stays open,
///   holding its locks, until every cancelled job has returned, or at the
///   latest until the send time of its last statement plus
///   [`Options::guard_timeout`] (`idle_session_timeout`), the first moment
///   the server could free its keys anyway ([`Deadline::DeferredClose`]). Nothing is sent on it
///   meanwhile and late replies are ignored; no run acquires on it; a new
///   session opens only once it is closed ([`SessionState::Doubtful`]). The
///   same deadline applies without the server guard, so that a job that
///   ignores its cancellation cannot keep the standbys without a session.
///   A session ended by the server or the connection ([`Input::SessionEnded`])
///   is gone at once;
/// - a key held by the session is never locked again (no re-entrant stacking),
///   and any key found held without the machine's knowledge is unlocked;
/// - a job starts [`Options::lock_delay`] after its try won the key, unless
///   a handover notification from the holder its standby's last try saw
///   said the release was graceful (see `Machine::try_answered`);
/// - a standby that holds nothing waits on the server for a wanted key and
///   takes it there the moment it is freed (a take: a try that waits); no
///   wait lasts the server's `deadlock_timeout` (see `wait` for the rule);
///   a locker that holds a lease and wants another waits on its watch
///   session, a second connection that sends nothing but waits, which never
///   acquire (see `watch`);
/// - one statement per heartbeat and one per standby tick (a try, or a
///   wait that ends by its lock timeout), however many leases, plus one
///   wait per tick for a standby of several; a lease-group member sends a
///   membership read before each try (see `groups`); at most one statement
///   in flight on the session, and one wait on the watch session.
#[derive(Debug)]
pub struct Machine {
    opts: Options,
    /// The simulator's broken variants; all off in production.
    knobs: Knobs,
    phase: Phase,
    runs: RunTable,
    session: Session,
    connector: Connector,
    plan: SendPlan,
    wait: ServerWait,
    watch: Watch,
    /// Lease groups: membership and shares (see `groups`).
    groups: Groups,
    /// Hand-overs asked of this holder by name (see `handover`).
    asks: Asks,
    /// The server's clock against the local one (see `clock`).
    server_clock: clock::ServerClock,
    /// Every deadline (see [`Deadline`]) and the latest time fed in.
    timers: DeadlineTable,
    out: Outputs,
}

impl Machine {
    /// A machine with these options; `seed` drives retry and backoff jitter
    /// (give each process a different one).
    ///
    /// # Errors
    /// [`OptionsError`] when the options are inconsistent.
    pub fn new(opts: Options, seed: u64) -> Result<Machine, OptionsError> {
        opts.validate()?;
        Ok(Machine {
            opts,
            knobs: Knobs::default(),
            phase: Phase::Open,
            runs: RunTable::default(),
            session: Session::Idle,
            connector: Connector::new(seed),
            plan: SendPlan::default(),
            wait: ServerWait::default(),
            watch: Watch::default(),
            groups: Groups::default(),
            asks: Asks::default(),
            server_clock: Default::default(),
            timers: DeadlineTable::default(),
            out: Outputs::default(),
        })
    }

    /// A machine with the simulator's broken variants (`knobs`).
    #[cfg(feature = "sim")]
    pub(crate) fn with_knobs(
        opts: Options,
        seed: u64,
        knobs: Knobs,
    ) -> Result<Machine, OptionsError> {
        let mut machine = Machine::new(opts, seed)?;
        machine.knobs = knobs;
        Ok(machine)
    }

    // ---- inputs -------------------------------------------------------

    /// Input: starts contending for `lease`. The run ends with exactly one
    /// [`RunCommand::Finish`]. After [`Input::Close`] the run is accepted and
    /// finishes at once with [`Outcome::Closed`].
    ///
    /// # Errors
    /// [`RunRejected::AlreadyRunning`] if a run of this machine has the same key,
    /// [`RunRejected::TooManyLeases`] past [`Options::max_leases`],
    /// [`RunRejected::Refused`] after a refused setup,
    /// [`RunRejected::GroupWithoutNotify`] for a lease of a group without
    /// [`Options::notify_handover`].
    pub fn run(&mut self, now: Instant, lease: LeaseId) -> Result<RunId, RunRejected> {
        let now = self.timers.clock(now);
        if let Phase::Refused(r) = &self.phase {
            return Err(RunRejected::Refused(r.clone()));
        }
        if lease.group().is_some() && !self.opts.notify_handover {
            return Err(RunRejected::GroupWithoutNotify(lease));
        }
        if self.runs.has_key(lease.key()) {
            return Err(RunRejected::AlreadyRunning(lease));
        }
        if self.runs.len() >= self.opts.max_leases {
            return Err(RunRejected::TooManyLeases {
                cap: self.opts.max_leases,
            });
        }
        let id = self.runs.next_id();
        if self.phase == Phase::Closing {
            self.out.run(RunCommand::Finish {
                run: id,
                outcome: Outcome::Closed,
            });
            return Ok(id);
        }
        self.runs.insert(id, lease);
        self.plan.try_soon();
        self.pump(now);
        Ok(id)
    }

    /// Input: feeds one input at time `now`. Never panics, whatever the
    /// input: inputs naming unknown runs, sessions or queries are ignored.
    pub fn handle_input(&mut self, now: Instant, input: Input) {
        let now = self.timers.clock(now);
        match input {
            Input::JobExited { run, exit } => self.runs.job_exited(run, exit, &mut self.out),
            Input::Shutdown { run } => {
                (self.runs).stop(run, Outcome::Cancelled, Reason::Shutdown, &mut self.out)
            }
            Input::Close => {
                if self.phase == Phase::Open {
                    self.phase = Phase::Closing;
                }
                for id in self.runs.ids() {
                    (self.runs).stop(id, Outcome::Closed, Reason::Closed, &mut self.out);
                }
            }
            Input::SessionOpened { session } if self.watch.owns(session) => {
                self.watch.opened(session)
            }
            Input::SessionEnded { session, error } if self.watch.owns(session) => {
                let (watch, mut cx) = self.watch_cx();
                watch.ended(&mut cx, session, error)
            }
            Input::Reply { query, result } if self.watch.owns_query(query) => {
                let (watch, mut cx) = self.watch_cx();
                watch.reply(&mut cx, now, query, result)
            }
            Input::SessionOpened { session } => self.session_opened(now, session),
            Input::SessionEnded { session, error } => self.session_lost(now, session, error),
            Input::Reply { query, result } => self.reply(now, query, result),
            Input::Notification {
                channel,
                payload,
                sender_pid,
            } => {
                if channel == HANDOVER_CHANNEL {
                    match Notice::parse(&payload) {
                        Some(Notice::Release(release)) => {
                            self.handover_notified(now, release, sender_pid)
                        }
                        Some(Notice::Group(group)) => self.join_announced(group),
                        Some(Notice::Request { key, pid }) => {
                            self.handover_requested(now, key, pid, sender_pid)
                        }
                        Some(Notice::Claim { key, pid }) => {
                            self.group_claimed(key, pid, sender_pid)
                        }
                        Some(Notice::Prefer(asked)) => {
                            self.preference_requested(now, asked, sender_pid)
                        }
                        None => {}
                    }
                }
            }
            Input::Tick => {}
        }
        self.pump(now);
    }

    // ---- output -------------------------------------------------------

    /// Output: the next thing to do (a run command, a session command or an
    /// event), or `None`. Drain it after every input until it is `None`,
    /// carrying each out as it comes: the queue hands them out in the order
    /// they must be carried out (the rule: the `outputs` module). Draining is
    /// what makes the machine act: an output left queued is an action not
    /// taken.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop()
    }

    // ---- timer --------------------------------------------------------

    /// Deadline: when to feed [`Input::Tick`] next, if no other input comes
    /// first. `None`: nothing is scheduled. Only deadlines that can make
    /// progress count (no heartbeat or retry while a statement is in flight,
    /// no backoff when no run needs the session), so a driver never spins.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_timer().map(|(_, at)| at)
    }

    /// Deadline: which deadline [`Machine::poll_timeout`] is (the first in
    /// [`Deadline`] order on ties), or `None` when nothing is scheduled. For
    /// logs, metrics and tests; a driver does not need it.
    #[must_use]
    pub fn timeout_reason(&self) -> Option<Deadline> {
        self.next_timer().map(|(timer, _)| timer)
    }

    // ---- queries ------------------------------------------------------

    /// Query: the options in force.
    #[must_use]
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Query: until when the lease of `run` is valid, if it leads: the send
    /// time of the last statement that confirmed it plus the validity window.
    /// A job must not act past it.
    #[must_use]
    pub fn valid_until(&self, run: RunId) -> Option<Instant> {
        match &self.runs.get(run)?.state {
            RunState::Leading(held) => Some(held.confirmed + self.opts.validity_window()),
            _ => None,
        }
    }

    /// Query: whether `run` leads with a lease still valid at `now`.
    #[must_use]
    pub fn is_valid(&self, run: RunId, now: Instant) -> bool {
        self.valid_until(run).is_some_and(|v| now < v)
    }

    /// Query: whether the machine is done for good: it was closed (or refused
    /// its setup, see [`Refusal`]), no run is left and the session is closed.
    /// A driver may stop then; later runs are answered by [`Machine::run`]
    /// itself (finished `Closed`, or refused) without a driver.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.phase != Phase::Open
            && self.runs.is_empty()
            && matches!(self.session, Session::Idle | Session::Backoff)
            && self.watch.is_closed()
            && self.out.no_commands()
    }

    /// Query: a snapshot of the session and every run.
    #[must_use]
    pub fn status(&self) -> Status {
        let session = match (&self.phase, &self.session) {
            (Phase::Refused(r), _) => SessionState::Refused(r.clone()),
            (_, Session::Backoff) if self.needs_session() => {
                match self.timers.get(Deadline::Backoff) {
                    Some(until) => SessionState::Backoff {
                        until,
                        failures: self.connector.failures(),
                    },
                    None => SessionState::Idle,
                }
            }
            (_, Session::Idle | Session::Backoff) => SessionState::Idle,
            (_, Session::Connecting { .. }) => SessionState::Connecting,
            (_, Session::Doubtful { .. }) => (self.timers.get(Deadline::DeferredClose))
                .map_or(SessionState::Idle, |close_by| SessionState::Doubtful {
                    close_by,
                }),
            (_, Session::Up(up)) => match up.stage {
                Stage::Ready { backend_pid } => SessionState::Ready { backend_pid },
                Stage::SettingUp | Stage::Probing { .. } | Stage::Listening { .. } => {
                    SessionState::SettingUp
                }
            },
        };
        let leases = (self.runs.iter())
            .map(|(id, r)| LeaseStatus {
                run: *id,
                lease: r.lease.clone(),
                state: match &r.state {
                    RunState::Standby(standby) => LeaseState::Standby {
                        holder_pid: standby.holder.flatten(),
                    },
                    RunState::Leading(held) => LeaseState::Leading {
                        token: held.token,
                        since: held.since,
                        valid_until: held.confirmed + self.opts.validity_window(),
                    },
                    RunState::Stopping(_) => LeaseState::Stopping,
                    RunState::Releasing { .. } => LeaseState::Releasing,
                },
            })
            .collect();
        Status {
            session,
            leases,
            last_error: self.connector.last_error().cloned(),
        }
    }

    // ---- replies ------------------------------------------------------

    /// A reply: routed by what its statement was, to the component or the
    /// rule that owns its handling.
    fn reply(&mut self, now: Instant, query: QueryId, result: Result<Vec<Row>, SessionError>) {
        let Some(up) = self.session.up_mut() else {
            return;
        };
        // A try's answer held back for the lock delay: its statement is
        // answered; a second reply to it is a stale one.
        if up.held_back.is_some() {
            return;
        }
        let Some(q) = up.inflight.take_if(|q| q.id == query) else {
            return;
        };
        #[cfg(feature = "sim")] // The broken variant: confirm from the arrival.
        let q = match self.knobs.mutation {
            Some(Mutation::ConfirmAtArrival) => session::InFlight { sent: now, ..q },
            _ => q,
        };
        self.timers.stop(Deadline::Query);
        match (q.what, result) {
            (What::Setup, Ok(rows)) => match SetupReply::parse(&rows) {
                Ok(setup) => self.setup_done(now, q.sent, setup),
                Err(e) => self.lose_session(now, session::malformed(e), true),
            },
            (What::PoolerProbe, Ok(rows)) => match HeartbeatReply::parse(&rows) {
                Ok(probe) => self.probe_done(now, probe),
                Err(e) => self.lose_session(now, session::malformed(e), true),
            },
            // The settings by statement (behind a pooler): the same as at startup.
            (What::Setup, Err(error)) if session::guard_unsupported(&error).is_some() => {
                let refusal = session::guard_unsupported(&error).expect("just matched");
                self.refuse(now, refusal)
            }
            (What::Listen, Ok(_)) => self.listening(),
            (What::Try(keys), Ok(rows)) => self.try_replied(now, (q.id, q.sent), keys, rows),
            (What::Try(keys), Err(error)) => self.try_failed(now, &keys, error),
            (What::Heartbeat, Ok(rows)) => match HeartbeatReply::parse(&rows) {
                Ok(heartbeat) => self.heartbeat_done(now, q.sent, heartbeat),
                Err(e) => self.lose_session(now, session::malformed(e), true),
            },
            (What::Verify, Ok(rows)) => match VerifyReply::parse(&rows) {
                Ok(verify) => self.verify_done(now, q.sent, verify),
                Err(e) => self.lose_session(now, session::malformed(e), true),
            },
            (What::Take { key, chunk, .. }, result) => {
                self.wait_done(now, (q.id, q.sent), (key, chunk), result)
            }
            (What::Members(read), Ok(rows)) => match MembersReply::parse(&rows) {
                Ok(reply) => self.members_done(now, q.sent, &read, &reply),
                Err(e) => self.lose_session(now, session::malformed(e), true),
            },
            (What::Look(_), Ok(rows)) => match MembersReply::parse(&rows) {
                Ok(reply) => self.look_done(now, q.sent, &reply),
                Err(e) => self.lose_session(now, session::malformed(e), true),
            },
            // A heartbeat that also asked for a hand-over.
            (What::Prefer { .. }, Ok(rows)) => match HeartbeatReply::parse(&rows) {
                Ok(heartbeat) => self.heartbeat_done(now, q.sent, heartbeat),
                Err(e) => self.lose_session(now, session::malformed(e), true),
            },
            // The rows do not matter: see `ReleaseReply`.
            (What::Check(asked), Ok(rows)) => match CheckReply::parse(&rows) {
                Ok(reply) => self.check_done(now, q.sent, &asked, reply),
                Err(e) => self.lose_session(now, session::malformed(e), true),
            },
            (What::Release { keys, .. }, Ok(_)) => self.runs.release_answered(keys, &mut self.out),
            // A probe that failed proves nothing: the session is not used;
            // the next one probes again after a backoff.
            (
                What::Setup
                | What::PoolerProbe
                | What::Listen
                | What::Heartbeat
                | What::Verify
                | What::Members(_)
                | What::Look(_)
                | What::Prefer { .. }
                | What::Check(_)
                | What::Release { .. },
                Err(error),
            ) => {
                // State on the server unknown: drop the session, which releases everything.
                self.lose_session(now, Reason::QueryFailed(error), true)
            }
        }
    }

    /// Whether this locker observes: its runs never try a key, never wait
    /// for one on the server (nor on the watch session), and never join a
    /// lease group; an observer's standby reads who holds its keys
    /// ([`What::Look`], a `pg_locks` read that joins nothing) at each of
    /// its retries instead of trying them ([`Role::Observer`](crate::Role::Observer)).
    fn observes(&self) -> bool {
        self.opts.role.is_observer()
    }

    /// The watch session's component and what it borrows ([`cx::Cx`]).
    fn watch_cx(&mut self) -> (&mut Watch, cx::Cx<'_>) {
        let Machine {
            opts,
            knobs,
            runs,
            connector,
            plan,
            watch,
            timers,
            out,
            ..
        } = self;
        let cx = cx::Cx {
            opts,
            knobs,
            runs,
            timers,
            out,
            connector,
            plan,
        };
        (watch, cx)
    }

    /// What the watch rule reads of the lease session (see `watch`).
    fn lease_side(&self) -> LeaseSide {
        let ready_pid = match self.session.up().map(|up| &up.stage) {
            Some(Stage::Ready { backend_pid }) => Some(*backend_pid),
            _ => None,
        };
        LeaseSide {
            ready_pid,
            may_watch: self.phase == Phase::Open
                && !self.connector.settings_by_statement()
                && !self.observes(),
        }
    }
}
