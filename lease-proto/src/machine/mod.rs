//! The lease state machine: one dispatch over owned sub-states.
//!
//! [`Machine`] keeps what ties the concerns together (options, phase, the
//! session, the output queues) and routes every input to the
//! sub-state that owns its rule; each sub-state is a type with its state
//! and its methods, and nothing else touches its fields:
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
//!   place);
//! - `doubtful`: the rule for a session given up on while its cancelled jobs
//!   still run;
//! - `groups`: the [`Groups`], lease groups' membership (read from the
//!   server) and shares, what a member may try and what it hands over;
//! - `deadline`: the one [`DeadlineTable`] behind [`Machine::poll_timeout`],
//!   with the latest time fed in (time never goes backwards);
//! - `status`: the public snapshot's types.
//!
//! The dispatch below reads in the order of the machine's classes: inputs,
//! outputs, timer, queries, then what the inputs do (session, replies,
//! runs), then the pump that acts on deadlines and sends what is due.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use crate::io::*;
use crate::key::LeaseId;
use crate::options::{Options, OptionsError};
use crate::sql::{
    CheckReply, HeartbeatReply, MembersReply, Notice, ReleaseNotice, Row, SetupReply, TryReply,
    VerifyReply, WaitReply, HANDOVER_CHANNEL,
};

mod clock;
mod deadline;
mod doubtful;
mod groups;
mod handover;
mod jitter;
mod knobs;
mod plan;
mod runs;
mod session;
mod status;
mod wait;
mod watch;

use deadline::DeadlineTable;
use groups::Groups;
use handover::Asks;
pub use handover::{CHECK_BURST, CHECK_EVERY, MAX_ASKS_PER_KEY};
pub(crate) use knobs::Knobs;
#[cfg(feature = "sim")]
pub use knobs::Mutation;
use plan::{Beat, SendPlan};
use runs::{RunState, RunTable};
pub use runs::{ASK_AGAIN_CAP, MAX_ASKS};
use session::{check_setup, Connector, InFlight, Session, SetupProblem, Stage, Up, What};
use wait::{NotFreed, ServerWait};
use watch::Watch;

pub use deadline::Deadline;
pub use groups::assign as group_share;
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
/// 2. **Outputs**, drained after every input until all three are empty, in
///    this order: [`Machine::poll_run`] (start and cancel jobs, finish runs),
///    [`Machine::poll_session`] (open, query, close), [`Machine::poll_event`]
///    (logs and metrics). Draining is what makes the machine act: an output
///    left queued is an action not taken.
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

/// How a try's reply came (see `Machine::try_answered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// A try of the standby's own: a poll, a new session's first try, a
    /// notification's.
    Poll,
    /// A try after the watch session's wake.
    Wake,
    /// A take (a wait that takes its key).
    Take,
}

/// Whether the machine takes new work.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Open,
    /// [`Input::Close`] came: runs are stopped, new ones finish at once.
    Closing,
    /// Final: the setup cannot give mutual exclusion.
    Refused(Refusal),
}

/// The three output queues, drained by [`Machine::poll_run`],
/// [`Machine::poll_session`] and [`Machine::poll_event`].
#[derive(Debug, Default)]
struct Outputs {
    run: VecDeque<RunCommand>,
    session: VecDeque<SessionCommand>,
    events: VecDeque<Event>,
}

impl Outputs {
    fn run(&mut self, c: RunCommand) {
        self.run.push_back(c);
    }

    fn session(&mut self, c: SessionCommand) {
        self.session.push_back(c);
    }

    fn event(&mut self, e: Event) {
        self.events.push_back(e);
    }
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
                self.watch_opened(session)
            }
            Input::SessionEnded { session, error } if self.watch.owns(session) => {
                self.watch_ended(session, error)
            }
            Input::Reply { query, result } if self.watch.owns_query(query) => {
                self.watch_reply(now, query, result)
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

    // ---- outputs, in poll order ------------------------------------------

    /// Output 1: the next command for the run futures (start, cancel,
    /// finish), or `None`. Drain it after every input, before
    /// [`Machine::poll_session`]: within one step a job is always started
    /// before a session command could close the session it was won on.
    #[must_use]
    pub fn poll_run(&mut self) -> Option<RunCommand> {
        self.out.run.pop_front()
    }

    /// Output 2: the next command for the connection (open, query, close),
    /// or `None`. Drain it after every input, after [`Machine::poll_run`].
    #[must_use]
    pub fn poll_session(&mut self) -> Option<SessionCommand> {
        self.out.session.pop_front()
    }

    /// Output 3: the next event for logs and metrics, or `None`. Events never
    /// ask for an action; a driver may drop them.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
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
            && self.out.session.is_empty()
            && self.out.run.is_empty()
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

    // ---- the session --------------------------------------------------

    /// Asks the driver for a new connection.
    fn open(&mut self, now: Instant) {
        let id = self.connector.next_session();
        self.out.event(Event::SessionOpening {
            session: id,
            failures: self.connector.failures(),
        });
        self.out.session(SessionCommand::Open {
            session: id,
            params: self.connector.params(&self.opts, &self.knobs),
        });
        self.session = Session::Connecting { id };
        self.timers.stop(Deadline::Backoff);
        self.timers
            .set(Deadline::Connect, now + self.opts.query_timeout);
    }

    fn session_opened(&mut self, now: Instant, session: SessionId) {
        if !matches!(self.session, Session::Connecting { id } if id == session) {
            return;
        }
        self.timers.stop(Deadline::Connect);
        let nonce = self.connector.nonce(session);
        self.session = Session::Up(Up::new(session, nonce));
        self.send(now, What::Setup);
    }

    fn session_lost(&mut self, now: Instant, session: SessionId, error: Option<SessionError>) {
        if self.session.id() != Some(session) {
            return;
        }
        // PostgreSQL 13 and older do not know the server guard's setting.
        if let Some(refusal) = error.as_ref().and_then(session::guard_unsupported) {
            return self.refuse(now, refusal);
        }
        match error.as_ref().and_then(session::startup_refusal) {
            // A session-mode pooler: the settings go into the setup statement
            // (verified there like startup options); try again at once.
            Some(_) if !self.connector.settings_by_statement() => {
                self.connector.fall_back_to_statements();
                self.out.event(Event::StartupOptionsRejected {
                    session,
                    error: error.clone().unwrap_or_else(|| SessionError::other("")),
                });
                self.lose_session(now, Reason::SessionEnded(error), false);
                self.connector.clear_failures();
                self.timers.stop(Deadline::Backoff);
                self.session = Session::Idle;
            }
            Some(refusal) => self.refuse(now, refusal),
            None => {
                let connecting = matches!(self.session, Session::Connecting { .. });
                let config = error.clone().filter(SessionError::is_configuration);
                self.lose_session(now, Reason::SessionEnded(error), false);
                // Never had a session: the configuration is wrong, not the
                // network. Say so to every run instead of retrying in silence.
                if let Some(e) = config.filter(|_| connecting && !self.connector.ever_ready()) {
                    for id in self.runs.ids() {
                        let reason = Reason::SessionEnded(Some(e.clone()));
                        (self.runs).stop(id, Outcome::Config(e.clone()), reason, &mut self.out);
                    }
                }
            }
        }
    }

    /// The session is gone (or is being closed by us): every lease on it is lost.
    /// With `close`, the machine gives up on it itself: if jobs on it still
    /// run, it is kept open instead (see `doubtful`) and closed later.
    fn lose_session(&mut self, now: Instant, reason: Reason, close: bool) {
        let Some(session) = self.session.id() else {
            return;
        };
        if close && self.keep_doubtful(now, session, &reason) {
            return;
        }
        if close {
            self.out.session(SessionCommand::Close { session });
        }
        let connecting = matches!(self.session, Session::Connecting { .. });
        if let Some(error) = session::reason_error(&reason, connecting, self.opts.query_timeout) {
            // A refusal is final and has its own event: not a failed attempt to retry.
            if connecting && !matches!(reason, Reason::Refused(_)) {
                self.out.event(Event::ConnectFailed {
                    session,
                    error: error.clone(),
                    configuration: error.is_configuration(),
                    failures: self.connector.failures().saturating_add(1),
                    retried: self.connector.ever_ready() || !error.is_configuration(),
                });
            }
            self.connector.record_error(LastError {
                at: now,
                error,
                connecting,
            });
        }
        // A doubtful session's loss was reported when the machine gave up
        // on it; a session that never opened was not lost.
        if !matches!(self.session, Session::Doubtful { .. }) && !connecting {
            self.out.event(Event::SessionLost {
                session,
                reason: reason.clone(),
            });
        }
        self.runs.session_gone(&reason, &mut self.out);
        self.session_down();
        self.connector.failed(now, &reason);
        #[cfg(feature = "sim")] // The broken variant: the doubling backoff alone.
        if self.knobs.mutation == Some(Mutation::NoFastReconnect) {
            self.connector.end_fast_window();
        }
        self.session = Session::Backoff;
        let backoff = self.connector.backoff(&self.opts, now);
        self.timers.set(Deadline::Backoff, now + backoff);
    }

    /// The machine gives up on `session` for `reason`. Returns whether the
    /// session is kept as doubtful (see `doubtful`); if not, the caller
    /// closes it at once.
    fn keep_doubtful(&mut self, now: Instant, session: SessionId, reason: &Reason) -> bool {
        let Some(close_by) = doubtful::keep_until(
            &self.knobs,
            &self.session,
            self.runs.any_job_running(),
            self.connector.last_sent(),
            now,
            self.opts.guard_timeout(),
        ) else {
            return false;
        };
        self.out.event(Event::SessionLost {
            session,
            reason: reason.clone(),
        });
        self.session = Session::Doubtful {
            id: session,
            reason: reason.clone(),
        };
        self.plan.session_down();
        self.timers.stop(Deadline::Query);
        self.timers.stop(Deadline::LockDelay);
        self.timers.stop(Deadline::Heartbeat);
        self.timers.set(Deadline::DeferredClose, close_by);
        // A try in flight is never answered now; standbys wait for the next
        // session.
        self.runs.doubt_session(reason, &mut self.out);
        true
    }

    /// Closes the doubtful session once no job is left running or its
    /// deadline has passed. Called by the pump after every input.
    fn close_doubtful_when_done(&mut self, now: Instant) {
        let Session::Doubtful { reason, .. } = &self.session else {
            return;
        };
        if self.runs.any_job_running() && !self.timers.expired(Deadline::DeferredClose, now) {
            return;
        }
        let reason = reason.clone();
        self.lose_session(now, reason, true);
    }

    fn refuse(&mut self, now: Instant, refusal: Refusal) {
        self.out.event(Event::Refused {
            refusal: refusal.clone(),
        });
        self.phase = Phase::Refused(refusal.clone());
        self.lose_session(now, Reason::Refused(refusal.clone()), true);
        for id in self.runs.ids() {
            let (outcome, reason) = (
                Outcome::Refused(refusal.clone()),
                Reason::Refused(refusal.clone()),
            );
            self.runs.stop(id, outcome, reason, &mut self.out);
        }
    }

    /// Closes the session because no run needs it.
    fn close_idle(&mut self, session: SessionId) {
        self.out.session(SessionCommand::Close { session });
        self.out.event(Event::SessionIdle { session });
        self.session_down();
        self.connector.closed();
        self.session = Session::Idle;
        self.connector.clear_failures();
        self.timers.stop(Deadline::Backoff);
    }

    /// Closes a session that holds nothing and blocks in a wait, for a new
    /// one that opens at once (see `wait`).
    fn close_for_new_session(&mut self, session: SessionId) {
        self.out.session(SessionCommand::Close { session });
        self.session_down();
        self.connector.closed();
        self.session = Session::Idle;
        self.timers.stop(Deadline::Backoff);
    }

    /// What ends with any session (the caller replaces it).
    fn session_down(&mut self) {
        self.runs.session_down();
        self.groups.session_down();
        self.asks.session_down();
        self.plan.session_down();
        self.wait.session_down();
        self.watch.session_down();
        self.timers.stop(Deadline::Connect);
        self.timers.stop(Deadline::Query);
        self.timers.stop(Deadline::LockDelay);
        self.timers.stop(Deadline::Heartbeat);
        self.timers.stop(Deadline::DeferredClose);
    }

    /// Sends a statement on the session that is up.
    fn send(&mut self, now: Instant, what: What) {
        let settings = match what {
            What::Setup => self.connector.setup_settings(&self.opts, &self.knobs),
            _ => Vec::new(),
        };
        let Some(up) = self.session.up_mut() else {
            return;
        };
        let statement = what.statement(up, settings, self.opts.notify_handover);
        let query = self.connector.next_query(now);
        let blocks = what.blocks();
        // A wait blocks on the server's clock; this one may run faster by
        // up to the drift bound, and must not time the wait out before it.
        let blocks = blocks.mul_f64(1.0 + self.opts.drift_bound());
        self.timers
            .set(Deadline::Query, now + blocks + self.opts.query_timeout);
        let probe = matches!(what, What::PoolerProbe);
        up.inflight = Some(InFlight {
            id: query,
            sent: now,
            what,
        });
        self.out.session(if probe {
            SessionCommand::Probe { query, statement }
        } else {
            SessionCommand::Query { query, statement }
        });
    }

    // ---- replies ------------------------------------------------------

    /// A reply: routed by what its statement was, to the sub-state that owns
    /// its rule.
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
            Some(Mutation::ConfirmAtArrival) => InFlight { sent: now, ..q },
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
            (What::Listen, Ok(_)) => {
                if let Some(up) = self.session.up_mut() {
                    if let Stage::Listening { backend_pid } = up.stage {
                        up.stage = Stage::Ready { backend_pid };
                    }
                    self.plan.try_soon();
                }
            }
            (What::Try(keys), Ok(rows)) => {
                let via = if self.watch.woken() {
                    Via::Wake
                } else {
                    Via::Poll
                };
                let reply = TryReply::parse(&keys, &rows);
                self.try_answered(now, (q.id, q.sent), keys, reply, via)
            }
            (What::Try(keys), Err(error)) => {
                // "Maybe acquired": the statement may have taken some locks.
                self.out.event(Event::TryFailed { error });
                self.runs.try_back(&keys);
                self.plan.owe_verify();
                let retry = now + self.connector.retry_delay(self.opts.retry_interval);
                self.timers.set(Deadline::Retry, retry);
            }
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

    fn setup_done(&mut self, now: Instant, sent: Instant, setup: SetupReply) {
        let Some(up) = self.session.up() else {
            return;
        };
        let session = up.id;
        match check_setup(&self.opts, &self.knobs, up.nonce, &setup) {
            Ok(()) => {}
            Err(SetupProblem::Refuse(refusal)) => return self.refuse(now, refusal),
            // Often a failover in progress: not final. Back off and try again
            // (the driver's host list may lead elsewhere next time).
            Err(SetupProblem::InRecovery) => {
                self.out.event(Event::InRecovery { session });
                return self.lose_session(now, Reason::InRecovery, true);
            }
        }
        self.server_clock_read(sent, now, setup.server_clock_us);
        // A newly promoted primary: the old primary's holders may still act.
        #[cfg(feature = "sim")] // Test-only: the broken variant.
        let setup = SetupReply {
            promotion: match self.knobs.mutation {
                Some(Mutation::IgnorePromotion) => Default::default(),
                Some(Mutation::HoldOnlySinceStart) if !setup.promotion.promoted() => {
                    Default::default()
                }
                Some(Mutation::HoldOnlySinceStart) => crate::reply::PromotionState {
                    history_age_ms: None,
                    ..setup.promotion
                },
                _ => setup.promotion,
            },
            ..setup
        };
        let hold = setup.promotion.hold(self.opts.promotion_hold());
        let (backend_pid, server_version) = (setup.backend_pid, setup.server_version);
        let probe = self.connector.settings_by_statement() && self.probes_for_pooler();
        let Some(up) = self.session.up_mut() else {
            return;
        };
        if let Some(hold) = hold {
            up.promotion_hold = Some(now + hold);
            self.out.event(Event::PromotionHold { session, hold });
        }
        if probe {
            // Behind a pooler: is it a transaction pooler? See `probe_done`.
            up.stage = Stage::Probing {
                backend_pid,
                server_version,
            };
            return self.send(now, What::PoolerProbe);
        }
        self.session_ready(now, backend_pid, server_version);
    }

    /// Whether a setup whose settings went by statement is followed by the
    /// pooler probe (always, but under the test-only mutation).
    fn probes_for_pooler(&self) -> bool {
        #[cfg(feature = "sim")]
        if self.knobs.mutation == Some(Mutation::NoPoolerProbe) {
            return false;
        }
        true
    }

    /// The pooler probe's answer: the backend pid and the nonce a second
    /// connection through the same pooler read while this session was idle.
    /// A session-mode pooler gives it a server connection of its own (nonce
    /// unset); a transaction-mode pooler hands it the server connection this
    /// session's setup just returned to the pool, where this session's nonce
    /// is set (its locks would be there too, for every client to take or
    /// free). The nonce is random per session: reading it back is decisive.
    /// Another backend (a busy pool) proves nothing either way; the pid and
    /// nonce checks of every later statement refuse a pooler that moves
    /// this session's statements between backends.
    fn probe_done(&mut self, now: Instant, reply: HeartbeatReply) {
        let Some(up) = self.session.up() else {
            return;
        };
        let Stage::Probing {
            backend_pid,
            server_version,
        } = up.stage
        else {
            return;
        };
        if reply.nonce == Some(up.nonce) {
            let pid = reply
                .backend_pid
                .map_or("unknown".into(), |p| p.to_string());
            let detail = format!(
                "it read {} {} on backend pid {pid}; this session's pid is {backend_pid}",
                crate::sql::NONCE_SETTING,
                up.nonce
            );
            return self.refuse(now, Refusal::TransactionPooler { detail });
        }
        self.session_ready(now, backend_pid, server_version);
    }

    /// Every check of the setup passed: the session is in use.
    fn session_ready(&mut self, now: Instant, backend_pid: i64, server_version: i64) {
        let Some(up) = self.session.up_mut() else {
            return;
        };
        let session = up.id;
        let listen = self.opts.notify_handover;
        up.stage = if listen {
            Stage::Listening { backend_pid }
        } else {
            Stage::Ready { backend_pid }
        };
        self.connector.ready();
        self.out.event(Event::SessionReady {
            session,
            backend_pid,
            server_version,
        });
        self.timers
            .set(Deadline::Heartbeat, now + self.opts.heartbeat_interval);
        if listen {
            self.send(now, What::Listen);
        } else {
            self.plan.try_soon();
        }
    }

    /// A try's reply (`via`: what the statement was). The lock delay, in
    /// one place: a key the try won
    /// starts its job [`Options::lock_delay`] after the reply, unless a
    /// handover notification from the holder its standby's last try saw
    /// said the release was graceful (at most the lock delay before the try
    /// was sent, or meanwhile: the rest of the delay is skipped then). The
    /// win may come moments after the server ended the holder's session
    /// (`pg_terminate_backend`, a reset connection), which the old holder
    /// learns at about the same moment: its job may still be stopping. So
    /// the reply is held back, its statement still in flight (as if the
    /// server had answered that much later: a session that ends meanwhile
    /// loses the win with it), whether the try followed a wake (a standby's
    /// wait or the watch session), a poll, or a new session's first try.
    fn try_answered(
        &mut self,
        now: Instant,
        (query, sent): (QueryId, Instant),
        keys: Vec<i64>,
        reply: TryReply,
        via: Via,
    ) {
        let delay = self.opts.lock_delay;
        #[cfg(feature = "sim")] // The broken variant: no lock delay after a poll.
        let delay = match self.knobs.mutation {
            Some(Mutation::LockDelayOnlyAfterWakes) if via == Via::Poll => Duration::ZERO,
            _ => delay,
        };
        let me = self.session.up().and_then(|up| up.stage.backend_pid());
        let ignored = self.grantee_ignored();
        let needs = !delay.is_zero()
            && (self.runs).any_win_needs_lock_delay(&reply.won, (sent, me), delay, ignored);
        // A take's win waits for the notifications behind its reply.
        let delay = match (needs, via) {
            (true, _) => delay,
            (false, Via::Take) if !reply.won.is_empty() => TAKE_NOTICES,
            (false, _) => return self.try_done(now, sent, &keys, reply),
        };
        let Some(up) = self.session.up_mut() else {
            return;
        };
        up.inflight = Some(InFlight {
            id: query,
            sent,
            what: What::Try(keys),
        });
        up.held_back = Some(Box::new(reply));
        self.timers.set(Deadline::LockDelay, now + delay);
    }

    /// The lock delay of a held-back try reply ended: the reply is taken as
    /// arriving now.
    fn lock_delay_over(&mut self, now: Instant) {
        self.timers.stop(Deadline::LockDelay);
        let Some(up) = self.session.up_mut() else {
            return;
        };
        let Some(reply) = up.held_back.take() else {
            return;
        };
        let Some(InFlight {
            sent,
            what: What::Try(keys),
            ..
        }) = up.inflight.take_if(|q| matches!(q.what, What::Try(_)))
        else {
            return;
        };
        self.try_done(now, sent, &keys, *reply)
    }

    /// A graceful release was notified: a held-back try reply whose every
    /// win is now graceful goes on at once.
    fn lock_delay_over_if_graceful(&mut self, now: Instant) {
        let Some(up) = self.session.up() else {
            return;
        };
        let (
            Some(reply),
            Some(InFlight {
                sent,
                what: What::Try(_),
                ..
            }),
        ) = (&up.held_back, &up.inflight)
        else {
            return;
        };
        let me = up.stage.backend_pid();
        let (delay, ignored) = (self.opts.lock_delay, self.grantee_ignored());
        if !(self.runs).any_win_needs_lock_delay(&reply.won, (*sent, me), delay, ignored) {
            self.lock_delay_over(now);
        }
    }

    /// The broken variant [`Mutation::IgnoreGrantee`]: a release's
    /// notification counts as graceful for a take's win whoever the release
    /// granted the key to.
    fn grantee_ignored(&self) -> bool {
        #[cfg(feature = "sim")]
        return self.knobs.mutation == Some(Mutation::IgnoreGrantee);
        #[cfg(not(feature = "sim"))]
        false
    }

    fn try_done(&mut self, now: Instant, sent: Instant, tried: &[i64], reply: TryReply) {
        let Some(up) = self.session.up() else {
            return;
        };
        let (nonce, pid) = (up.nonce, up.stage.backend_pid());
        match reply.session {
            None => {
                let e = SessionError::other("malformed try reply: no session row");
                return self.lose_session(now, Reason::QueryFailed(e), true);
            }
            Some((found, _)) if Some(found) != pid => {
                let was = pid.unwrap_or(0);
                return self.refuse(now, Refusal::BackendChanged { was, now: found });
            }
            Some((_, found)) if found != Some(nonce) => {
                return self.refuse(now, session::shared(nonce, found));
            }
            Some(_) => {}
        }
        // This session never tries a key it holds (orphans aside): if its
        // own backend holds one, another client does.
        let own = (reply.not_won.iter())
            .find(|(key, holder)| *holder == pid && !self.runs.is_orphan(*key));
        if let Some((key, _)) = own {
            let detail = format!("key {key} is held by this session's own backend");
            return self.refuse(now, Refusal::BackendShared { detail });
        }
        let window = self.opts.validity_window();
        if !reply.won.is_empty() && now >= sent + window {
            // Answered (or its lock delay ended) after its validity: the
            // process was frozen meanwhile, and the server may have ended
            // the session for it. No job starts on a lease already expired.
            return self.lose_session(now, Reason::ValidityExpired, true);
        }
        // Its session row (same backend, same nonce) proves the session as
        // a heartbeat does, and a try unlocks nothing: every held lease is
        // confirmed from its send time. Else a holder's heartbeat that waits
        // behind its periodic try lets its leases expire without a fault.
        self.runs.confirm_all(sent);
        let seen = (self.watch.woken_key())
            .and_then(|key| reply.not_won.iter().find(|(k, _)| *k == key))
            .map(|&(_, holder)| holder);
        self.watch_try_answered(!reply.won.is_empty(), seen);
        let me = self.own_backends();
        for &won in &reply.won {
            #[cfg(feature = "sim")] // The broken variant: a reserved win kept.
            let keeps = self.knobs.mutation == Some(Mutation::KeepReservedWin);
            #[cfg(not(feature = "sim"))]
            let keeps = false;
            let reserved = self.runs.reserved_for_other(won.0, &me, now);
            if let Some(to) = reserved.filter(|_| !keeps) {
                // A hand-over to `to` was asked for while the try (or the
                // take) was in flight: the key is `to`'s, so its job does
                // not start (see `handover`).
                let window = self.opts.handover_window();
                self.runs.decline(won.0, now, window);
                self.out.event(Event::WinDeclined {
                    key: won.0,
                    to_pid: to,
                });
                continue;
            }
            self.runs.won(now, sent, won, window, &mut self.out);
            if let Some(group) = self.runs.group_of(won.0) {
                self.groups.won_keys_of(group);
                self.plan.try_soon();
            }
        }
        for &(key, holder) in &reply.not_won {
            self.runs.not_won(key, holder, &mut self.out);
        }
        let unanswered = reply.unanswered(tried);
        if reply.untrusted || !unanswered.is_empty() {
            // A key without an answer may have been taken: verify.
            self.runs.try_back(&unanswered);
            self.plan.owe_verify();
        }
        let retry = now + self.connector.retry_delay(self.opts.retry_interval);
        self.timers.set(Deadline::Retry, retry);
    }

    /// Whether the session that answered a heartbeat, verify or wait is
    /// this one (same backend pid, same nonce); refuses the locker if not.
    fn same_session(&mut self, now: Instant, reply: &HeartbeatReply) -> bool {
        let Some(up) = self.session.up() else {
            return false;
        };
        let (expected, nonce) = (up.stage.backend_pid(), up.nonce);
        let pid = reply.backend_pid;
        if pid.is_none() || pid != expected {
            let refusal = Refusal::BackendChanged {
                was: expected.unwrap_or(0),
                now: pid.unwrap_or(0),
            };
            self.refuse(now, refusal);
            return false;
        }
        if reply.nonce != Some(nonce) {
            self.refuse(now, session::shared(nonce, reply.nonce));
            return false;
        }
        true
    }

    /// The steady heartbeat: the same live session answered, so it still
    /// holds every key it held when the statement was sent (a live session
    /// loses a session-level advisory lock only by its own unlock, which the
    /// machine sends only as a [`Statement::Release`](crate::Statement::Release)
    /// that ends the run or the session, or by ending). Every held lease is
    /// confirmed from `sent`.
    fn heartbeat_done(&mut self, now: Instant, sent: Instant, reply: HeartbeatReply) {
        if !self.same_session(now, &reply) {
            return;
        }
        self.server_clock_read(sent, now, reply.server_clock_us);
        self.runs.confirm_all(sent);
        self.heartbeat_again(now, sent);
    }

    /// The verify: what the session holds according to `pg_locks`. A held
    /// lease not in it is lost; a key in it that no run holds is unlocked.
    fn verify_done(&mut self, now: Instant, sent: Instant, reply: VerifyReply) {
        if !self.same_session(now, &reply.session) {
            return;
        }
        self.server_clock_read(sent, now, reply.session.server_clock_us);
        self.plan.verified();
        self.runs.verified(sent, reply.held, &mut self.out);
        self.heartbeat_again(now, sent);
    }

    /// The next heartbeat is due a heartbeat interval after `sent`.
    fn heartbeat_again(&mut self, now: Instant, sent: Instant) {
        let next = (sent + self.opts.heartbeat_interval).max(now);
        self.timers.set(Deadline::Heartbeat, next);
    }

    /// A take's reply (a standby's wait that takes its key, sent as
    /// `query` at `sent`): taken, timed out, crowded, or failed (see `wait`).
    fn wait_done(
        &mut self,
        now: Instant,
        (query, sent): (QueryId, Instant),
        (key, chunk): (i64, bool),
        result: Result<Vec<Row>, SessionError>,
    ) {
        let answered = self.wait.answered(key);
        if !self.runs.holding() {
            self.timers
                .set(Deadline::Heartbeat, now + self.opts.heartbeat_interval);
        }
        let rows = match result {
            Ok(rows) => rows,
            Err(error) => {
                // Maybe taken, as after a failed try: verify first.
                self.out.event(Event::WaitFailed { error });
                self.wait.failed();
                self.runs.try_back(&[key]);
                self.plan.owe_verify();
                return self.plan.try_soon();
            }
        };
        let reply = match WaitReply::parse(&rows) {
            Ok(reply @ WaitReply { freed: Some(_), .. }) => reply,
            Ok(WaitReply { freed: None, .. }) => {
                let e = SessionError::other("malformed wait reply: no outcome row");
                return self.lose_session(now, Reason::QueryFailed(e), true);
            }
            Err(e) => return self.lose_session(now, session::malformed(e), true),
        };
        if !self.same_session(now, &reply.session) {
            return;
        }
        self.wait.limit_from(reply.deadlock_timeout_ms);
        if reply.held_here {
            // Another client's lock on this backend (a transaction pooler),
            // as a try finds it (see `try_done`).
            let detail = format!("key {key} is held by this session's own backend");
            return self.refuse(now, Refusal::BackendShared { detail });
        }
        if reply.freed == Some(true) {
            // Taken: the win of a try sent when the take was, with its lock
            // delay (see `wait`, "Taken").
            let (Some(token), Some(backend_pid)) = (reply.token, reply.session.backend_pid) else {
                let e = SessionError::other("malformed wait reply: a take without its token");
                return self.lose_session(now, Reason::QueryFailed(e), true);
            };
            self.out.event(Event::KeyTaken { key });
            // The win counts from the take's send time: the next heartbeat is
            // due an interval after that, as after a try (at once, if the
            // take blocked that long).
            let next = (sent + self.opts.heartbeat_interval).max(now);
            self.timers.set(Deadline::Heartbeat, next);
            let won = TryReply {
                won: vec![(key, token)],
                not_won: Vec::new(),
                untrusted: false,
                session: Some((backend_pid, reply.session.nonce)),
            };
            return self.try_answered(now, (query, sent), vec![key], won, Via::Take);
        }
        self.runs.try_back(&[key]);
        if reply.crowded {
            // Enough standbys wait for the key: this one polls it until
            // its next periodic try (see `wait`, "No herd").
            self.wait.crowded();
            return;
        }
        // Cut short below deadlock_timeout: the same key's wait goes on.
        // Ended at the retry deadline: as good as a try of this key that
        // lost. Not jittered: jitter spreads the polls of replicas started
        // together, and waits on the server do not poll.
        let held_all_along = self.wait.not_freed(answered, chunk) == NotFreed::HeldAllAlong;
        if held_all_along && self.runs.standbys() <= 1 {
            let retry = now + self.opts.retry_interval;
            self.timers.set(Deadline::Retry, retry);
        }
    }

    /// A handover notification for `key` from backend `sender`: a graceful
    /// release, if `sender` is the holder this standby last saw; then a
    /// standby that wants it tries at once (see `wait` for a wait in flight).
    ///
    /// From any other backend it is ignored: any role may `NOTIFY` on the
    /// channel (a forged one sent just before the holder's session is
    /// terminated would skip the lock delay), and a late one from an
    /// earlier holder may reach a standby that lost the herd and waits
    /// again behind the new holder.
    fn handover_notified(&mut self, now: Instant, release: ReleaseNotice, sender: i64) {
        let ReleaseNotice {
            key,
            at,
            grantee,
            reserved,
        } = release;
        let Some((wanted, holder)) = self.runs.standby_of(key) else {
            return;
        };
        let me = self.own_backends();
        if let Some(holder) = holder {
            #[cfg(feature = "sim")]
            let anyone = self.knobs.mutation == Some(Mutation::NotifyFromAnyone);
            #[cfg(not(feature = "sim"))]
            let anyone = false;
            if holder != Some(sender) && !anyone {
                self.out.event(Event::NotificationIgnored {
                    key,
                    sender_pid: sender,
                    holder_pid: holder,
                });
                // A key handed over to this backend may come by way of
                // another standby, whose take won it and released it at once
                // (`try_done`): any release of it is worth a try now (its win
                // still waits out the lock delay).
                let named = reserved.is_some_and(|r| me.contains(&r));
                if wanted && (named || self.runs.reserved_for(key, &me, now)) {
                    self.plan.try_soon();
                }
                return;
            }
            // The holder's release names the backend it handed the key to
            // (see `handover`): only that one tries it for the window; one
            // that names nobody ends a reservation.
            match reserved {
                Some(to) => {
                    let until = now + self.opts.handover_window();
                    self.runs.reserve(key, to, (now, until), u32::MAX);
                }
                None if holder.is_some() => self.runs.unreserve(key),
                None => {}
            }
        }
        self.runs.released_gracefully(key, now, (at, grantee));
        self.lock_delay_over_if_graceful(now);
        if (self.wait).notified(key, self.session.waiting_for(), wanted) {
            self.plan.try_soon();
        }
    }

    /// Member `by` of a lease group claims `key` (see `groups`): the
    /// locker that leads it hands it over if its own share gives it to
    /// `by` (a holder whose share differs, as when members run different
    /// key sets, keeps it), once per key and claimant while the membership
    /// holds. A claim counts only from the backend it names (the statement
    /// sends `pg_backend_pid()`) and never for this session itself: anyone
    /// who may `NOTIFY` could otherwise make a holder drop its keys.
    fn group_claimed(&mut self, key: i64, by: i64, sender: i64) {
        let me = self.session.up().and_then(|up| up.stage.backend_pid());
        if sender != by || me == Some(by) {
            return;
        }
        if !self.runs.leading_keys().contains(&key) || !self.groups.claim(key, by) {
            return;
        }
        self.hand_over(key, by, false);
    }

    /// The lease of `key`, if a run of it leads, handed over to backend
    /// `to` ([`RunTable::hand_over`]: its job cancelled with
    /// [`Reason::HandedOver`], the key released once the job returned) with
    /// its [`Event::HandedOver`]; `requested`: a hand-over request asked
    /// for it, not the group's share. Nothing when no run of `key` leads.
    fn hand_over(&mut self, key: i64, to: i64, requested: bool) {
        if let Some((run, lease)) = self.runs.hand_over(key, &mut self.out) {
            (self.out).event(Event::HandedOver {
                run,
                lease,
                to,
                requested,
            });
        }
    }

    /// Whether this locker observes: its runs never try a key, never wait
    /// for one on the server (nor on the watch session), and never join a
    /// lease group; an observer's standby reads who holds its keys
    /// ([`What::Look`], a `pg_locks` read that joins nothing) at each of
    /// its retries instead of trying them ([`Options::observer`]).
    fn observes(&self) -> bool {
        self.opts.observer
    }

    /// An observer's read of its keys' holders answered: it proves the
    /// session as a heartbeat does; each standby records the holder.
    fn look_done(&mut self, now: Instant, sent: Instant, reply: &MembersReply) {
        let session = HeartbeatReply {
            backend_pid: reply.backend_pid,
            nonce: reply.nonce,
            server_clock_us: None,
        };
        if !self.same_session(now, &session) {
            return;
        }
        self.runs.confirm_all(sent);
        self.heartbeat_again(now, sent);
        for &(key, holder) in &reply.holders {
            self.runs.holder_seen(key, holder, &mut self.out);
        }
        let retry = now + self.connector.retry_delay(self.opts.retry_interval);
        self.timers.set(Deadline::Retry, retry);
    }

    /// The groups this locker is a member of, with the keys it runs in
    /// each: none for an observer (see [`Machine::observes`]).
    fn group_keys(&self) -> BTreeMap<u32, BTreeSet<i64>> {
        if self.observes() {
            return BTreeMap::new();
        }
        self.runs.group_keys()
    }

    /// A group's membership read answered (see `groups`): it proves the
    /// session as a heartbeat does (same backend, same nonce), so every held
    /// lease is confirmed from `sent`; the shares are computed again,
    /// hand-offs decided are carried out, and the try follows at once.
    fn members_done(
        &mut self,
        now: Instant,
        sent: Instant,
        read: &groups::Read,
        reply: &MembersReply,
    ) {
        let session = HeartbeatReply {
            backend_pid: reply.backend_pid,
            nonce: reply.nonce,
            server_clock_us: None,
        };
        if !self.same_session(now, &session) {
            return;
        }
        let Some(me) = reply.backend_pid else {
            return;
        };
        self.runs.confirm_all(sent);
        self.heartbeat_again(now, sent);
        let wanted = self.group_keys();
        let held = self.runs.leading_keys();
        let bound = groups::free_bound(&self.opts);
        let before: BTreeMap<u32, BTreeSet<i64>> = (self.groups.members())
            .map(|(g, m)| (g, m.clone()))
            .collect();
        (self.groups).read_done(now, bound, me, read, reply, &wanted, &held);
        self.membership_events(&before);
        for key in self.groups.take_handoffs() {
            match self.groups.owner_of(key) {
                Some(to) => self.hand_over(key, to, false),
                None => {
                    self.runs.hand_over(key, &mut self.out);
                }
            }
        }
        for &(key, holder) in &reply.holders {
            self.runs.holder_seen(key, holder, &mut self.out);
        }
        let retry = now + self.connector.retry_delay(self.opts.retry_interval);
        self.timers.set(Deadline::Retry, retry);
        self.plan.try_soon();
    }

    /// After a membership read: [`Event::GroupMembers`] for each group whose
    /// members are not those of the read before (`before`).
    fn membership_events(&mut self, before: &BTreeMap<u32, BTreeSet<i64>>) {
        let empty = BTreeSet::new();
        for (gid, now) in self.groups.members() {
            let was = before.get(&gid).unwrap_or(&empty);
            if was == now {
                continue;
            }
            let group = (self.runs.iter())
                .find_map(|(_, r)| r.lease.group().filter(|g| g.id() == gid).cloned());
            let Some(group) = group else {
                continue;
            };
            self.out.event(Event::GroupMembers {
                group,
                members: now.iter().copied().collect(),
                joined: now.difference(was).copied().collect(),
                left: was.difference(now).copied().collect(),
            });
        }
    }

    /// A member announced that it joined `group`: read the membership at
    /// the next chance (not during a wait, which it would cut short).
    fn join_announced(&mut self, group: u32) {
        if self.session.waiting_for().is_none() && self.groups.join_announced(group) {
            self.plan.try_soon();
        }
    }

    // ---- the pump -----------------------------------------------------

    /// After every input: enforce deadlines against `now`, then start what
    /// is due. The validity timer is the earliest validity end of a held
    /// key, read from the runs before and after.
    fn pump(&mut self, now: Instant) {
        self.sync_validity();
        self.watch_due(now);
        self.act(now);
        self.watch_step(now);
        self.sync_validity();
    }

    fn sync_validity(&mut self) {
        let end = self.runs.earliest_validity_end(self.opts.validity_window());
        self.timers.put(Deadline::Validity, end);
    }

    fn act(&mut self, now: Instant) {
        // Check the clock rather than trust that a timer fired.
        if self.timers.expired(Deadline::Validity, now) {
            self.lose_session(now, Reason::ValidityExpired, true);
        }
        if self.timers.expired(Deadline::Connect, now) || self.timers.expired(Deadline::Query, now)
        {
            let reason = if self.session.probing() {
                session::probe_unanswered(self.opts.query_timeout)
            } else {
                Reason::QueryTimeout
            };
            self.lose_session(now, reason, true);
        }
        if self.timers.expired(Deadline::LockDelay, now) {
            self.lock_delay_over(now);
        }
        self.close_doubtful_when_done(now);
        self.interrupt_wait_if_needed();
        let needed = self.needs_session();
        match &self.session {
            Session::Idle => {
                if needed {
                    self.open(now);
                }
            }
            Session::Backoff => {
                let waiting = self.timers.get(Deadline::Backoff).is_some_and(|t| t > now);
                if needed && !waiting {
                    self.open(now);
                }
            }
            Session::Connecting { id } => {
                if !needed {
                    let id = *id;
                    self.close_idle(id);
                }
            }
            // Nothing is sent on it; it closes by itself (above).
            Session::Doubtful { .. } => {}
            Session::Up(up) => {
                if up.inflight.is_some() {
                    return;
                }
                if !needed && !self.runs.has_orphans() {
                    let id = up.id;
                    return self.close_idle(id);
                }
                if !matches!(up.stage, Stage::Ready { .. }) {
                    return;
                }
                if let Some(what) = self.next_statement(now) {
                    self.send(now, what);
                }
            }
        }
    }

    /// While a wait blocks the session: closes the session if something
    /// else needs it (see `wait`).
    fn interrupt_wait_if_needed(&mut self) {
        let (Some(waited), Some(id)) = (self.session.waiting_for(), self.session.id()) else {
            return;
        };
        let other_wanted = self.runs.other_waiting(waited);
        let needed = self.needs_session();
        if needed && !(self.plan.try_owed() && other_wanted) && self.phase == Phase::Open {
            return;
        }
        self.out.event(Event::WaitInterrupted { session: id });
        if needed {
            self.close_for_new_session(id);
        } else {
            self.close_idle(id);
        }
    }

    /// Picks the next statement on the ready, idle session: verification,
    /// then releases, then the heartbeat, then the standby try, then a wait
    /// on the server (`wait`).
    fn next_statement(&mut self, now: Instant) -> Option<What> {
        if self.plan.verify_owed() {
            return Some(What::Verify);
        }
        // A member leaves the groups none of its runs wants any more (and
        // announces it) before it releases their keys (see `groups`).
        if let Some(leave) = self.groups.leaving(&self.group_keys()) {
            return Some(What::Members(leave));
        }
        let release = (self.runs).take_release(now, self.opts.handover_window());
        if !release.is_empty() {
            let recent = self.opts.query_timeout;
            let reserved = self.runs.reservations(&release, now, recent);
            return Some(What::Release {
                keys: release,
                reserved,
            });
        }
        // Asks that ended unconfirmed, or whose key this locker no longer
        // leads (see `handover`).
        let leading: Vec<i64> = self.runs.leading_keys().into_iter().collect();
        for (key, to) in self.asks.expire(now, &leading) {
            self.out.event(Event::HandoverRefused { key, to });
        }
        let holding = self.runs.holding();
        // On a newly promoted primary nothing is tried (nor waited for: a
        // wait would be granted at once, the key being free there) before
        // the hold ends; the retry deadline wakes the machine then.
        let up = self.session.up_mut()?;
        let held = up.promotion_hold.filter(|&until| until > now);
        if held.is_none() && up.promotion_hold.take().is_some() {
            self.out.event(Event::PromotionHoldEnded { session: up.id });
        }
        let heartbeat_due =
            self.heartbeat_needed() && self.timers.expired(Deadline::Heartbeat, now);
        let retry_due = self.timers.get(Deadline::Retry).is_none_or(|t| t <= now);
        let try_due =
            (self.plan.try_owed() || retry_due) && self.phase == Phase::Open && held.is_none();
        // Heartbeat first, but never twice in a row while a try is due. A
        // locker holding nothing heartbeats only to keep its session alive,
        // and a try does that too: it goes instead.
        let heartbeat_first = holding || !try_due;
        if heartbeat_due
            && heartbeat_first
            && self.plan.heartbeat_may_go(try_due, self.runs.any_waiting())
        {
            return Some(match self.plan.heartbeat() {
                Beat::Verify => What::Verify,
                // While asks stand, the heartbeat checks them (see `handover`).
                Beat::Heartbeat if self.asks.any() => {
                    What::Check(self.asks.take_check(now, self.opts.heartbeat_interval))
                }
                Beat::Heartbeat => What::Heartbeat,
            });
        }
        let every = self.opts.heartbeat_interval;
        if let Some(at) = self.asks.next_check(now, every) {
            // An ask's turn (see `handover`): a check, which is a heartbeat
            // too; else the machine wakes for it.
            if at <= now {
                self.asks.spend(now, every);
                return Some(What::Check(self.asks.take_check(now, every)));
            }
            self.timers.set(Deadline::Check, at);
        } else {
            self.timers.stop(Deadline::Check);
        }
        self.plan.not_heartbeat();
        if let Some(until) = held {
            if self.timers.get(Deadline::Retry).is_none_or(|t| t < until) {
                self.timers.set(Deadline::Retry, until);
            }
            return None;
        }
        if self.phase == Phase::Open && self.opts.priority > 0 {
            // A standby that saw a holder asks it (see `preference_requested`).
            let me = self.session.up().and_then(|up| up.stage.backend_pid());
            let again = self.opts.validity_window();
            if let Some(key) = self.runs.take_preference(now, me, again) {
                // It queues for the key: on its lease session, or on its
                // watch session while it holds another lease (which names
                // the lease session, see `handover`).
                let priority = self.opts.priority;
                let until = now + handover::ask_window(&self.opts);
                self.wait.named(key, until);
                self.watch.prefer(key, until);
                return Some(What::Prefer { key, priority });
            }
        }
        #[cfg(feature = "sim")] // The broken variant: an observer that tries.
        let observes = self.observes() && self.knobs.mutation != Some(Mutation::ObserverTries);
        #[cfg(not(feature = "sim"))]
        let observes = self.observes();
        if try_due && observes {
            // An observer reads who holds its keys instead of trying them.
            self.plan.tried();
            let keys = self.runs.take_look();
            if keys.is_empty() {
                return None;
            }
            return Some(What::Look(keys));
        }
        if try_due {
            // The periodic try (for a group member, the read before it, on
            // whose reply the retry deadline moves on): waiting may start
            // over, and a rested watch session opens again. Not the try
            // after a wake's lock delay, which the retry deadline also
            // sends: it must count against the wake budget.
            if retry_due {
                self.wait.periodic_try();
            }
            if retry_due && !self.watch.woken() {
                self.watch.periodic_try();
            }
            // A group member reads the membership first (see `groups`).
            let wanted = self.group_keys();
            if self.groups.read_owed(&wanted) {
                return Some(What::Members(self.groups.read(&wanted)));
            }
            let woke = self.watch.woken();
            if woke && self.groups.announcing() {
                // The member that woke (it watched the one gone, and found
                // the departure first) announces it before its try: a try
                // that wins holds its reply back for the lock delay, and the
                // others would learn of the departure that much later, then
                // wait out their own lock delay: two in a row. The others'
                // announcements (every survivor's read finds the departure)
                // go after their tries, off the takeover's path: before, they
                // cost every survivor another read first.
                return Some(What::Members(self.groups.read(&wanted)));
            }
            let me = self.session.up().and_then(|up| up.stage.backend_pid());
            let own = self.own_backends();
            let bound = groups::free_bound(&self.opts);
            let groups = &self.groups;
            #[cfg(feature = "sim")] // The broken variant: every key as if owned.
            let ignore_share = self.knobs.mutation == Some(Mutation::IgnoreShare);
            #[cfg(not(feature = "sim"))]
            let ignore_share = false;
            let keys = self.runs.take_try(now, &own, |lease| {
                ignore_share
                    || (lease.group())
                        .is_none_or(|g| groups.may_try(g.id(), lease.key(), me, now, bound))
            });
            let announce = self.groups.tried();
            self.plan.tried();
            if announce {
                // A departure or a claim to announce: read again at once.
                self.plan.try_soon();
            }
            if keys.is_empty() && !wanted.is_empty() {
                // A group member that may try nothing after a wake: as a
                // try that won nothing (the watch session waits again).
                self.watch_try_answered(false, None);
            }
            if keys.is_empty() && retry_due {
                // Every waiting key is reserved for another backend (a
                // hand-over asked for): the next periodic try.
                let retry = now + self.connector.retry_delay(self.opts.retry_interval);
                self.timers.set(Deadline::Retry, retry);
            }
            if announce && keys.is_empty() {
                // Nothing to try: the announcing read goes now (else it
                // would wait for the next input, a heartbeat later).
                return Some(What::Members(self.groups.read(&wanted)));
            }
            if !keys.is_empty() {
                if !holding {
                    // The try proves the session alive as a heartbeat does
                    // (it checks the backend pid and the nonce), and a key
                    // it wins counts from its send time: the next heartbeat
                    // is due an interval after it.
                    let next = now + self.opts.heartbeat_interval;
                    self.timers.set(Deadline::Heartbeat, next);
                }
                return Some(What::Try(keys));
            }
        }
        let (key, timeout, chunk, named) = self.next_wait(now)?;
        // The wait takes the key (see `wait`, "Taken"): its run is in it as
        // in a try.
        if !self.runs.take_wait(key) {
            return None;
        }
        Some(What::Take {
            key,
            timeout,
            chunk,
            named,
        })
    }

    /// The wait to send now, if any (see `wait` for when).
    fn next_wait(&self, now: Instant) -> Option<(i64, Duration, bool, bool)> {
        if !self.opts.wait_on_server
            // Behind a pooler (it rejected the startup options), a blocked
            // statement would hold a pooled server connection all along.
            || self.connector.settings_by_statement()
            // A lease-group member's session is its membership (the member
            // id is its backend pid): a wait, which the machine interrupts by
            // replacing the session, would change it (see `groups`).
            || self.groups.active(&self.group_keys())
            // An observer never queues on a key (see `Machine::observes`).
            || self.observes()
            || self.phase != Phase::Open
            || self.wait.paused(now)
            || self.plan.verify_owed()
        {
            return None;
        }
        let wanted = self.runs.wait_candidates(&self.own_backends())?;
        // A take's win counts from its send time, and its job starts a lock
        // delay after its reply (see `wait`, "Taken"): it waits half of what
        // the validity window leaves beside the lock delay at most, so that
        // much is left for the reply.
        let longest = self
            .opts
            .validity_window()
            .saturating_sub(self.opts.lock_delay)
            / 2;
        let (key, timeout, chunk, named) =
            (self.wait).next(now, &wanted, self.timers.get(Deadline::Retry))?;
        if timeout > longest {
            return (longest >= MIN_WAIT).then_some((key, longest, true, named));
        }
        Some((key, timeout, chunk, named))
    }

    /// Whether heartbeats are due at all. A locker holding nothing needs no
    /// confirmation, only a session kept from looking idle to the server
    /// guard (`idle_session_timeout`): its tries do that when the longest
    /// gap between two tries' send times, a query timeout (a reply later
    /// than that ends the session) plus a retry interval (jittered down,
    /// never up), is shorter than the guard. With the defaults (5 s + 10 s
    /// against 16 s) a standby sends its tries and nothing else; otherwise
    /// it also heartbeats, each try pushing the heartbeat back.
    fn heartbeat_needed(&self) -> bool {
        // A hold after a promotion is longer than the guard: heartbeats keep
        // the session from looking idle meanwhile.
        self.runs.holding()
            || self
                .session
                .up()
                .is_some_and(|up| up.promotion_hold.is_some())
            || self.opts.retry_interval + self.opts.query_timeout >= self.opts.guard_timeout()
    }

    /// Whether any run needs the session: a standby, a leader, or a release.
    fn needs_session(&self) -> bool {
        !matches!(self.phase, Phase::Refused(_))
            && self.runs.need_session(self.phase == Phase::Open)
    }

    /// The earliest deadline that can make progress, and which one it is.
    fn next_timer(&self) -> Option<(Deadline, Instant)> {
        // Only a ready session with nothing in flight sends.
        let idle_ready = self.session.idle_ready();
        self.timers.next(|timer| match timer {
            Deadline::Connect | Deadline::Query | Deadline::Validity | Deadline::LockDelay => true,
            Deadline::DeferredClose => matches!(self.session, Session::Doubtful { .. }),
            Deadline::Heartbeat => idle_ready && self.heartbeat_needed(),
            Deadline::Retry => {
                // A group member reads (and so tries) periodically, waiting
                // runs or not, while it takes new work.
                let reads = self.phase == Phase::Open && self.groups.active(&self.group_keys());
                idle_ready && (self.runs.any_waiting() || reads)
            }
            Deadline::Backoff => matches!(self.session, Session::Backoff) && self.needs_session(),
            Deadline::Watch => true,
            Deadline::Check => idle_ready,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{SetupReply, Statement, TryReply};

    /// A PostgreSQL 17 primary's setup reply, backend 7, with what `opts` asked for.
    fn setup_rows(opts: &Options, nonce: i64) -> Vec<crate::sql::Row> {
        SetupReply {
            server_version: 170_000,
            in_recovery: false,
            backend_pid: 7,
            idle_session_timeout_ms: Some(opts.guard_timeout().as_millis() as i64),
            tcp_settings: opts.tcp_settings().map(|(_, v)| Some(v)),
            unix_socket: false,
            search_path_catalog: true,
            nonce: Some(nonce),
            promotion: Default::default(),
            server_clock_us: None,
        }
        .to_rows()
    }

    fn query(m: &mut Machine) -> (QueryId, Statement) {
        while m.poll_run().is_some() || m.poll_event().is_some() {}
        let mut last = None;
        while let Some(c) = m.poll_session() {
            if let SessionCommand::Query { query, statement } = c {
                last = Some((query, statement));
            }
        }
        last.expect("a statement was sent")
    }

    #[test]
    fn the_timeout_reason_follows_the_state() {
        let opts = Options::default();
        let t = Instant::now();
        let mut m = Machine::new(opts.clone(), 1).unwrap();
        assert_eq!(m.timeout_reason(), None);
        m.run(t, LeaseId::named("a").unwrap()).unwrap();
        assert_eq!(m.timeout_reason(), Some(Deadline::Connect));
        assert_eq!(m.poll_timeout(), Some(t + opts.query_timeout));
        m.handle_input(
            t,
            Input::SessionOpened {
                session: SessionId(0),
            },
        );
        assert_eq!(m.timeout_reason(), Some(Deadline::Query));
        let (q, Statement::Setup { nonce, .. }) = query(&mut m) else {
            panic!("expected the setup");
        };
        let result = Ok(setup_rows(&opts, nonce));
        m.handle_input(t, Input::Reply { query: q, result });
        let (q, listen) = query(&mut m);
        assert_eq!(listen, Statement::Listen);
        m.handle_input(
            t,
            Input::Reply {
                query: q,
                result: Ok(vec![]),
            },
        );
        let (
            q,
            Statement::TryLock {
                keys,
                backend_pid,
                nonce,
            },
        ) = query(&mut m)
        else {
            panic!("expected a try");
        };
        let won = TryReply {
            won: vec![(keys[0], 99)],
            session: Some((backend_pid, Some(nonce))),
            ..TryReply::default()
        };
        let result = Ok(won.to_rows());
        m.handle_input(t, Input::Reply { query: q, result });
        // Won: the job starts after the lock delay.
        assert_eq!(m.timeout_reason(), Some(Deadline::LockDelay));
        assert_eq!(m.poll_timeout(), Some(t + opts.lock_delay));
        m.handle_input(t + opts.lock_delay, Input::Tick);
        // Leading, nothing in flight: the heartbeat comes before validity ends.
        assert_eq!(m.timeout_reason(), Some(Deadline::Heartbeat));
        assert_eq!(m.poll_timeout(), Some(t + opts.heartbeat_interval));
        m.handle_input(
            t,
            Input::SessionEnded {
                session: SessionId(0),
                error: None,
            },
        );
        // The run still needs the session (its job is stopping: not yet).
        assert_eq!(m.timeout_reason(), None);
        let run = RunId(0);
        m.handle_input(
            t,
            Input::JobExited {
                run,
                exit: JobExit::Ok,
            },
        );
        assert_eq!(m.timeout_reason(), Some(Deadline::Backoff));
        assert!(matches!(m.status().session, SessionState::Backoff { .. }));
    }

    #[test]
    fn a_standby_shows_the_holder_its_last_try_saw() {
        let opts = Options {
            notify_handover: false,
            ..Options::default()
        };
        let t = Instant::now();
        let mut m = Machine::new(opts.clone(), 1).unwrap();
        m.run(t, LeaseId::named("a").unwrap()).unwrap();
        m.handle_input(
            t,
            Input::SessionOpened {
                session: SessionId(0),
            },
        );
        let (q, Statement::Setup { nonce, .. }) = query(&mut m) else {
            panic!("expected the setup");
        };
        m.handle_input(
            t,
            Input::Reply {
                query: q,
                result: Ok(setup_rows(&opts, nonce)),
            },
        );
        let standby = |m: &Machine| m.status().leases[0].state.clone();
        assert_eq!(standby(&m), LeaseState::Standby { holder_pid: None });
        let (
            q,
            Statement::TryLock {
                keys,
                backend_pid,
                nonce,
            },
        ) = query(&mut m)
        else {
            panic!("expected a try");
        };
        let held = TryReply {
            not_won: vec![(keys[0], Some(4242))],
            session: Some((backend_pid, Some(nonce))),
            ..TryReply::default()
        };
        m.handle_input(
            t,
            Input::Reply {
                query: q,
                result: Ok(held.to_rows()),
            },
        );
        assert_eq!(
            standby(&m),
            LeaseState::Standby {
                holder_pid: Some(4242)
            }
        );
        // Holding nothing, it waits on the server for the key until the
        // retry deadline, instead of sitting idle, and takes it there.
        let (_, wait) = query(&mut m);
        let Statement::Take {
            key, timeout_ms, ..
        } = wait
        else {
            panic!("expected a take, got {wait:?}");
        };
        assert_eq!(key, keys[0]);
        let retry = opts.retry_interval.as_millis() as u64;
        assert!(
            (retry * 4 / 5..=retry).contains(&timeout_ms),
            "the wait ends by the (jittered) retry deadline: {timeout_ms} ms"
        );
        assert_eq!(m.timeout_reason(), Some(Deadline::Query));
        // Its query timer allows for the block: the lock timeout (timed by
        // the server's clock: stretched by the drift bound) plus the query
        // timeout (the statement's text rounds the former down to ms).
        let at = m.poll_timeout().unwrap() - opts.query_timeout;
        let block = Duration::from_millis(timeout_ms).mul_f64(1.0 + opts.drift_bound());
        assert!(t + block <= at && at < t + block + Duration::from_millis(2));
    }
}
