//! The lease state machine. Every rule of the protocol lives in this file.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use crate::io::*;
use crate::key::LeaseId;
use crate::options::{Options, OptionsError, RETRY_JITTER};
use crate::sql::{setup_tag, Row, Statement, HANDOVER_CHANNEL};

/// Least `server_version_num` without the server guard (`pg_current_xact_id`).
pub const MIN_SERVER_VERSION: i64 = 130_000;
/// Least `server_version_num` with the server guard (`idle_session_timeout`).
pub const MIN_SERVER_VERSION_GUARD: i64 = 140_000;
/// First reconnect delay; it doubles per consecutive failure up to the retry
/// interval, and each delay is jittered to between half and all of it.
pub const RECONNECT_BASE: Duration = Duration::from_millis(50);

/// Why [`Machine::run`] refused a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
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
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::AlreadyRunning(l) => {
                write!(f, "lease {l} is already running on this locker")
            }
            RunError::TooManyLeases { cap } => write!(
                f,
                "this locker already runs {cap} leases (max_leases); the server's lock table is shared by every session"
            ),
            RunError::Refused(r) => write!(f, "{r}"),
        }
    }
}

impl std::error::Error for RunError {}

/// The state of the session, for [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    /// No session, none needed.
    Idle,
    /// Waiting before the next connection attempt.
    Backoff {
        /// When the next attempt starts.
        until: Instant,
        /// Consecutive failures so far.
        failures: u32,
    },
    /// Connecting.
    Connecting,
    /// Connected; setup statements run.
    SettingUp,
    /// In use.
    Ready {
        /// The server's backend pid.
        backend_pid: i64,
    },
    /// The setup was refused; see [`Refusal`].
    Refused(Refusal),
}

/// What one run is doing, for [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Waiting for the lease (or for a try's answer).
    Standby,
    /// Leading: the job runs.
    Leading {
        /// The fencing token.
        token: i64,
        /// When it was acquired (the reply's arrival).
        since: Instant,
        /// Until when it is valid unless confirmed again.
        valid_until: Instant,
    },
    /// The lease is lost or shutting down; waiting for the job to return.
    Stopping,
    /// The job returned; the lease is being released.
    Releasing,
}

/// One run in [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The run.
    pub run: RunId,
    /// Its lease.
    pub lease: LeaseId,
    /// What it does.
    pub state: LeaseState,
}

/// A snapshot of the machine, from [`Machine::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The session.
    pub session: SessionState,
    /// Every run, in run order.
    pub leases: Vec<LeaseStatus>,
}

#[derive(Debug)]
enum RunState {
    /// Standby: not held, no job.
    Wanting,
    /// In the try statement in flight.
    Trying,
    /// Held; the job runs (or was cancelled for shutdown/close: `cancelled`).
    Leading {
        token: i64,
        since: Instant,
        /// Send time of the last statement that confirmed the key.
        confirmed: Instant,
        cancelled: bool,
    },
    /// Lost; the job was cancelled; waiting for it to return. Not held.
    Draining,
    /// The job returned; the key is held until the unlock answers.
    Releasing { outcome: Outcome, sent: bool },
}

#[derive(Debug)]
struct Run {
    lease: LeaseId,
    state: RunState,
    /// Set once the run must end when its job returns: shutdown, close or
    /// refusal; the outcome it ends with.
    stop: Option<Outcome>,
    /// The holder reported in the last `Waiting` event.
    reported_holder: Option<Option<i64>>,
}

#[derive(Debug)]
enum What {
    Setup,
    Listen,
    Try(Vec<i64>),
    Heartbeat,
    Release(Vec<i64>),
}

#[derive(Debug)]
struct InFlight {
    id: QueryId,
    sent: Instant,
    deadline: Instant,
    what: What,
}

#[derive(Debug)]
enum Session {
    /// No connection. `retry_at`: earliest next attempt (`None`: at once).
    Down {
        retry_at: Option<Instant>,
    },
    Opening {
        id: SessionId,
        deadline: Instant,
    },
    Up(Up),
}

#[derive(Debug)]
struct Up {
    id: SessionId,
    /// Backend pid, once the setup statement answered.
    pid: Option<i64>,
    /// Setup (and LISTEN) done.
    ready: bool,
    inflight: Option<InFlight>,
    heartbeat_at: Instant,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Open,
    Closing,
    Refused(Refusal),
}

/// The sans-IO lease state machine: one database session, many leases.
///
/// Feed it inputs with the current time ([`Machine::run`],
/// [`Machine::handle_input`]); after every input drain
/// [`Machine::poll_output`] until it returns `None`, then wait until
/// [`Machine::poll_timeout`] (or the next input) and feed [`Input::Tick`].
/// It never reads a clock, sleeps, spawns or does I/O; randomness (retry
/// jitter) comes from the seed given to [`Machine::new`].
///
/// Guarantees (see the crate docs for the bounds):
/// - a job is started only after the server granted its key to this session,
///   and cancelled as soon as the machine learns, or suspects, that the key is
///   lost: session loss, statement timeout, failed verification, a heartbeat
///   that does not show the key, or the lease's validity deadline passing;
/// - a key is unlocked only after its job has returned;
/// - a key held by the session is never locked again (no re-entrant stacking),
///   and any key found held without the machine's knowledge is unlocked;
/// - one statement per heartbeat and one per standby tick, however many
///   leases; at most one statement in flight.
#[derive(Debug)]
pub struct Machine {
    opts: Options,
    rng: u64,
    now: Option<Instant>,
    phase: Phase,
    runs: BTreeMap<RunId, Run>,
    keys: BTreeMap<i64, RunId>,
    next_run: u64,
    next_session: u64,
    next_query: u64,
    session: Session,
    failures: u32,
    /// Keys to unlock at the next release: held without a run that holds them.
    orphans: BTreeSet<i64>,
    /// Keys found held whose run is draining: unlocked once its job returned.
    held_draining: BTreeSet<i64>,
    verify: bool,
    try_now: bool,
    retry_at: Option<Instant>,
    session_out: VecDeque<SessionCommand>,
    run_out: VecDeque<RunCommand>,
    events: VecDeque<Event>,
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
            rng: seed,
            now: None,
            phase: Phase::Open,
            runs: BTreeMap::new(),
            keys: BTreeMap::new(),
            next_run: 0,
            next_session: 0,
            next_query: 0,
            session: Session::Down { retry_at: None },
            failures: 0,
            orphans: BTreeSet::new(),
            held_draining: BTreeSet::new(),
            verify: false,
            try_now: false,
            retry_at: None,
            session_out: VecDeque::new(),
            run_out: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Starts contending for `lease`. The run ends with exactly one
    /// [`RunCommand::Finish`]. After [`Input::Close`] the run is accepted and
    /// finishes at once with [`Outcome::Closed`].
    ///
    /// # Errors
    /// [`RunError::AlreadyRunning`] if a run of this machine has the same key,
    /// [`RunError::TooManyLeases`] past [`Options::max_leases`],
    /// [`RunError::Refused`] after a refused setup.
    pub fn run(&mut self, now: Instant, lease: LeaseId) -> Result<RunId, RunError> {
        let now = self.clock(now);
        if let Phase::Refused(r) = &self.phase {
            return Err(RunError::Refused(r.clone()));
        }
        if self.keys.contains_key(&lease.key()) {
            return Err(RunError::AlreadyRunning(lease));
        }
        if self.runs.len() >= self.opts.max_leases {
            return Err(RunError::TooManyLeases {
                cap: self.opts.max_leases,
            });
        }
        let id = RunId(self.next_run);
        self.next_run += 1;
        if self.phase == Phase::Closing {
            self.run_command(RunCommand::Finish {
                run: id,
                outcome: Outcome::Closed,
            });
            return Ok(id);
        }
        self.keys.insert(lease.key(), id);
        self.runs.insert(
            id,
            Run {
                lease,
                state: RunState::Wanting,
                stop: None,
                reported_holder: None,
            },
        );
        self.try_now = true;
        self.pump(now);
        Ok(id)
    }

    /// Feeds one input at time `now`. Never panics, whatever the input:
    /// inputs naming unknown runs, sessions or queries are ignored.
    pub fn handle_input(&mut self, now: Instant, input: Input) {
        let now = self.clock(now);
        match input {
            Input::JobExited { run, exit } => self.job_exited(run, exit),
            Input::Shutdown { run } => self.stop_run(run, Outcome::Cancelled, Reason::Shutdown),
            Input::Close => {
                if self.phase == Phase::Open {
                    self.phase = Phase::Closing;
                }
                let ids: Vec<RunId> = self.runs.keys().copied().collect();
                for id in ids {
                    self.stop_run(id, Outcome::Closed, Reason::Closed);
                }
            }
            Input::SessionOpened { session } => self.session_opened(now, session),
            Input::SessionLost { session, error } => {
                if self.session_id() == Some(session) {
                    if let Some(refusal) = error.as_ref().and_then(startup_refusal) {
                        self.refuse(now, refusal);
                    } else {
                        self.lose_session(now, Reason::SessionLost(error), false);
                    }
                }
            }
            Input::Reply { query, result } => self.reply(now, query, result),
            Input::Notification { channel, payload } => {
                if channel == HANDOVER_CHANNEL {
                    if let Ok(key) = payload.trim().parse::<i64>() {
                        if let Some(run) = self.keys.get(&key).and_then(|id| self.runs.get(id)) {
                            if matches!(run.state, RunState::Wanting) {
                                self.try_now = true;
                            }
                        }
                    }
                }
            }
            Input::Tick => {}
        }
        self.pump(now);
    }

    /// The next command for the run futures (start, cancel, finish), or
    /// `None`. Drain it after every input, before [`Machine::poll_session`]:
    /// within one step a job is always started before a session command could
    /// close the session it was won on.
    #[must_use]
    pub fn poll_run(&mut self) -> Option<RunCommand> {
        self.run_out.pop_front()
    }

    /// The next command for the connection (open, query, close), or `None`.
    /// Drain it after every input, after [`Machine::poll_run`].
    #[must_use]
    pub fn poll_session(&mut self) -> Option<SessionCommand> {
        self.session_out.pop_front()
    }

    /// The next event for logs and metrics, or `None`. Events never ask for
    /// an action; a driver may drop them.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When to feed [`Input::Tick`] next, if no other input comes first.
    /// `None`: nothing is scheduled. Only deadlines that will make progress
    /// are returned, so a driver never spins.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.earliest_validity_end();
        let mut at = |x: Instant| t = Some(t.map_or(x, |t: Instant| t.min(x)));
        match &self.session {
            Session::Down { retry_at } => {
                if self.needs_session() {
                    if let Some(r) = retry_at {
                        at(*r);
                    }
                }
            }
            Session::Opening { deadline, .. } => at(*deadline),
            Session::Up(up) => match &up.inflight {
                Some(q) => at(q.deadline),
                None if up.ready => {
                    at(up.heartbeat_at);
                    if let Some(r) = self.retry_at {
                        if self.any_wanting() {
                            at(r);
                        }
                    }
                }
                None => {}
            },
        }
        t
    }

    /// Until when the lease of `run` is valid, if it leads: the send time of
    /// the last statement that confirmed it plus the validity window. A job
    /// must not act past it.
    pub fn valid_until(&self, run: RunId) -> Option<Instant> {
        match self.runs.get(&run)?.state {
            RunState::Leading {
                confirmed,
                cancelled: false,
                ..
            } => Some(confirmed + self.opts.validity_window()),
            _ => None,
        }
    }

    /// Whether `run` leads with a lease still valid at `now`.
    pub fn is_valid(&self, run: RunId, now: Instant) -> bool {
        self.valid_until(run).is_some_and(|v| now < v)
    }

    /// Whether the machine is done for good: it was closed (or refused its
    /// setup, see [`Refusal`]), no run is left and the session is closed. A
    /// driver may stop then; later runs are answered by [`Machine::run`]
    /// itself (finished `Closed`, or refused) without a driver.
    pub fn is_closed(&self) -> bool {
        self.phase != Phase::Open
            && self.runs.is_empty()
            && matches!(self.session, Session::Down { .. })
            && self.session_out.is_empty()
            && self.run_out.is_empty()
    }

    /// A snapshot of the session and every run.
    pub fn status(&self) -> Status {
        let session = match (&self.phase, &self.session) {
            (Phase::Refused(r), _) => SessionState::Refused(r.clone()),
            (_, Session::Down { retry_at: Some(t) }) if self.needs_session() => {
                SessionState::Backoff {
                    until: *t,
                    failures: self.failures,
                }
            }
            (_, Session::Down { .. }) => SessionState::Idle,
            (_, Session::Opening { .. }) => SessionState::Connecting,
            (_, Session::Up(up)) => match (up.ready, up.pid) {
                (true, Some(pid)) => SessionState::Ready { backend_pid: pid },
                _ => SessionState::SettingUp,
            },
        };
        let leases = self
            .runs
            .iter()
            .map(|(id, r)| LeaseStatus {
                run: *id,
                lease: r.lease.clone(),
                state: match &r.state {
                    RunState::Wanting | RunState::Trying => LeaseState::Standby,
                    RunState::Leading {
                        token,
                        since,
                        confirmed,
                        cancelled: false,
                    } => LeaseState::Leading {
                        token: *token,
                        since: *since,
                        valid_until: *confirmed + self.opts.validity_window(),
                    },
                    RunState::Leading { .. } | RunState::Draining => LeaseState::Stopping,
                    RunState::Releasing { .. } => LeaseState::Releasing,
                },
            })
            .collect();
        Status { session, leases }
    }

    // ---- inputs -------------------------------------------------------

    /// Time never goes backwards inside the machine.
    fn clock(&mut self, now: Instant) -> Instant {
        let now = self.now.map_or(now, |t| t.max(now));
        self.now = Some(now);
        now
    }

    fn job_exited(&mut self, id: RunId, exit: JobExit) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        match run.state {
            RunState::Leading { .. } => {
                let outcome = match (exit, run.stop.clone()) {
                    (JobExit::Abandoned, _) => Outcome::Abandoned,
                    (_, Some(stop)) => stop,
                    (JobExit::Ok, None) => Outcome::Completed,
                    (JobExit::Failed, None) => Outcome::Failed,
                };
                run.state = RunState::Releasing {
                    outcome,
                    sent: false,
                };
            }
            RunState::Draining => {
                let key = run.lease.key();
                match (exit, run.stop.clone()) {
                    (JobExit::Abandoned, _) => self.finish(id, Outcome::Abandoned),
                    (_, Some(stop)) => self.finish(id, stop),
                    // Lost, and the job returned: contend again, restart on the next win.
                    (_, None) => run.state = RunState::Wanting,
                }
                // Found held again while the job ran: unlock it now (releases
                // go before tries, so it is never locked twice).
                if self.held_draining.remove(&key) {
                    self.orphans.insert(key);
                }
            }
            RunState::Wanting | RunState::Trying if exit == JobExit::Abandoned => {
                self.finish(id, Outcome::Abandoned)
            }
            _ => {}
        }
    }

    /// Shutdown, close or refusal of one run.
    fn stop_run(&mut self, id: RunId, outcome: Outcome, reason: Reason) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if run.stop.is_none() {
            run.stop = Some(outcome.clone());
        }
        match &mut run.state {
            // A try in flight that wins for a finished run leaves an unknown
            // key: the reply handler unlocks it.
            RunState::Wanting | RunState::Trying => self.finish(id, outcome),
            RunState::Leading { cancelled, .. } if !*cancelled => {
                *cancelled = true;
                self.run_command(RunCommand::CancelJob { run: id, reason });
            }
            _ => {}
        }
    }

    fn session_opened(&mut self, now: Instant, session: SessionId) {
        if !matches!(self.session, Session::Opening { id, .. } if id == session) {
            return;
        }
        self.session = Session::Up(Up {
            id: session,
            pid: None,
            ready: false,
            inflight: None,
            heartbeat_at: now,
        });
        self.send(now, What::Setup);
    }

    fn reply(&mut self, now: Instant, query: QueryId, result: Result<Vec<Row>, DbError>) {
        let Session::Up(up) = &mut self.session else {
            return;
        };
        if up.inflight.as_ref().map(|q| q.id) != Some(query) {
            return;
        }
        let q = up.inflight.take().expect("checked above");
        match (q.what, result) {
            (What::Setup, Ok(rows)) => self.setup_done(now, &rows),
            (What::Listen, Ok(_)) => {
                if let Session::Up(up) = &mut self.session {
                    up.ready = true;
                    self.try_now = true;
                }
            }
            (What::Try(keys), Ok(rows)) => self.try_done(now, q.sent, keys, &rows),
            (What::Try(keys), Err(error)) => {
                // "Maybe acquired": the statement may have taken some locks.
                self.event(Event::TryFailed { error });
                self.try_back(&keys);
                self.verify = true;
                self.retry_at = Some(now + self.jittered_retry());
            }
            (What::Heartbeat, Ok(rows)) => self.heartbeat_done(now, q.sent, &rows),
            (What::Release(keys), Ok(_)) => {
                for key in keys {
                    if let Some(&id) = self.keys.get(&key) {
                        if let Some(Run {
                            state:
                                RunState::Releasing {
                                    outcome,
                                    sent: true,
                                },
                            ..
                        }) = self.runs.get(&id)
                        {
                            let outcome = outcome.clone();
                            self.released(id, outcome);
                        }
                    }
                }
            }
            (What::Setup | What::Listen | What::Heartbeat | What::Release(_), Err(error)) => {
                // State on the server unknown: drop the session, which releases everything.
                self.lose_session(now, Reason::QueryFailed(error), true)
            }
        }
    }

    fn setup_done(&mut self, now: Instant, rows: &[Row]) {
        let get = |tag: i64| {
            rows.iter()
                .find(|r| r.len() == 2 && r[0] == Some(tag))
                .and_then(|r| r[1])
        };
        let (Some(version), Some(recovery), Some(pid)) = (
            get(setup_tag::SERVER_VERSION),
            get(setup_tag::IN_RECOVERY),
            get(setup_tag::BACKEND_PID),
        ) else {
            let e = DbError::other("malformed setup reply");
            return self.lose_session(now, Reason::QueryFailed(e), true);
        };
        let needed = if self.opts.server_guard {
            MIN_SERVER_VERSION_GUARD
        } else {
            MIN_SERVER_VERSION
        };
        if version < needed {
            return self.refuse(
                now,
                Refusal::ServerTooOld {
                    found: version,
                    needed,
                },
            );
        }
        if recovery != 0 {
            return self.refuse(now, Refusal::Standby);
        }
        if self.opts.server_guard {
            let expected = self.opts.guard_timeout().as_millis() as i64;
            let found = get(setup_tag::IDLE_SESSION_TIMEOUT_MS);
            if found != Some(expected) {
                let detail = format!(
                    "idle_session_timeout is {} ms, {expected} ms was asked for",
                    found.map_or("unknown".into(), |f| f.to_string())
                );
                return self.refuse(now, Refusal::StartupOptionsIgnored { detail });
            }
        }
        self.failures = 0;
        self.event(Event::SessionReady {
            session: self.session_id().expect("session is up"),
            backend_pid: pid,
            server_version: version,
        });
        let listen = self.opts.notify_handover;
        if let Session::Up(up) = &mut self.session {
            up.pid = Some(pid);
            up.heartbeat_at = now + self.opts.heartbeat_interval;
            up.ready = !listen;
        }
        if listen {
            self.send(now, What::Listen);
        } else {
            self.try_now = true;
        }
    }

    fn try_done(&mut self, now: Instant, sent: Instant, keys: Vec<i64>, rows: &[Row]) {
        let tried: BTreeSet<i64> = keys.iter().copied().collect();
        let mut answered = BTreeSet::new();
        let mut malformed = false;
        for row in rows {
            match row.as_slice() {
                // Only one answer per key tried counts; anything else means
                // the reply cannot be trusted: verify.
                [Some(key), ..] if !tried.contains(key) || !answered.insert(*key) => {
                    malformed = true
                }
                [Some(key), Some(token), _] => self.won(now, sent, *key, *token),
                [Some(key), None, holder] => self.not_won(*key, *holder),
                _ => malformed = true,
            }
        }
        let unanswered: Vec<i64> = keys.into_iter().filter(|k| !answered.contains(k)).collect();
        if malformed || !unanswered.is_empty() {
            // A key without an answer may have been taken: verify.
            self.try_back(&unanswered);
            self.verify = true;
        }
        self.retry_at = Some(now + self.jittered_retry());
    }

    fn won(&mut self, now: Instant, sent: Instant, key: i64, token: i64) {
        let validity = self.opts.validity_window();
        let run = self.keys.get(&key).copied();
        match run.and_then(|id| self.runs.get_mut(&id).map(|r| (id, r))) {
            Some((id, r)) if matches!(r.state, RunState::Trying) => {
                r.state = RunState::Leading {
                    token,
                    since: now,
                    confirmed: sent,
                    cancelled: false,
                };
                r.reported_holder = None;
                let lease = r.lease.clone();
                self.event(Event::Acquired {
                    run: id,
                    lease: lease.clone(),
                    token,
                });
                self.run_command(RunCommand::StartJob {
                    run: id,
                    lease,
                    token,
                    valid_until: sent + validity,
                });
            }
            // Won for a run that is gone (shut down or closed while trying):
            // unlock it.
            _ => {
                self.orphans.insert(key);
            }
        }
    }

    fn not_won(&mut self, key: i64, holder: Option<i64>) {
        let Some(&id) = self.keys.get(&key) else {
            return;
        };
        let Some(r) = self.runs.get_mut(&id) else {
            return;
        };
        if matches!(r.state, RunState::Trying) {
            r.state = RunState::Wanting;
            if r.reported_holder != Some(holder) {
                r.reported_holder = Some(holder);
                let lease = r.lease.clone();
                self.event(Event::Waiting {
                    run: id,
                    lease,
                    holder_pid: holder,
                });
            }
        }
    }

    /// Runs whose try got no usable answer go back to standby.
    fn try_back(&mut self, keys: &[i64]) {
        for key in keys {
            if let Some(r) = self.keys.get(key).and_then(|id| self.runs.get_mut(id)) {
                if matches!(r.state, RunState::Trying) {
                    r.state = RunState::Wanting;
                }
            }
        }
    }

    fn heartbeat_done(&mut self, now: Instant, sent: Instant, rows: &[Row]) {
        let mut pid = None;
        let mut held = BTreeSet::new();
        for row in rows {
            match row.as_slice() {
                [Some(0), Some(p)] => pid = Some(*p),
                [Some(1), Some(k)] => {
                    held.insert(*k);
                }
                _ => {
                    let e = DbError::other("malformed heartbeat reply");
                    return self.lose_session(now, Reason::QueryFailed(e), true);
                }
            }
        }
        let expected = match &self.session {
            Session::Up(up) => up.pid,
            _ => None,
        };
        if pid.is_none() || pid != expected {
            let refusal = Refusal::BackendChanged {
                was: expected.unwrap_or(0),
                now: pid.unwrap_or(0),
            };
            return self.refuse(now, refusal);
        }
        self.verify = false;
        let mut lost = Vec::new();
        for (id, r) in &mut self.runs {
            match &mut r.state {
                RunState::Leading { confirmed, .. } if held.contains(&r.lease.key()) => {
                    *confirmed = sent
                }
                RunState::Leading { .. } => lost.push(*id),
                _ => {}
            }
        }
        for id in lost {
            self.lose_lease(id, Reason::NotHeld);
        }
        for key in held {
            let state = self
                .keys
                .get(&key)
                .and_then(|id| self.runs.get(id))
                .map(|r| &r.state);
            match state {
                Some(RunState::Leading { .. } | RunState::Releasing { .. }) => continue,
                // Held, but its run lost it and its cancelled job still runs:
                // unlock only after the job has returned.
                Some(RunState::Draining) => {
                    self.held_draining.insert(key);
                    continue;
                }
                _ => {}
            }
            if self.orphans.insert(key) {
                self.event(Event::UnknownKeyReleased { key });
            }
        }
        if let Session::Up(up) = &mut self.session {
            up.heartbeat_at = (sent + self.opts.heartbeat_interval).max(now);
        }
    }

    // ---- state changes ------------------------------------------------

    fn lose_lease(&mut self, id: RunId, reason: Reason) {
        let Some(r) = self.runs.get_mut(&id) else {
            return;
        };
        if let RunState::Leading { cancelled, .. } = r.state {
            r.state = RunState::Draining;
            let lease = r.lease.clone();
            self.event(Event::Lost {
                run: id,
                lease,
                reason: reason.clone(),
            });
            if !cancelled {
                self.run_command(RunCommand::CancelJob { run: id, reason });
            }
        }
    }

    /// The session is gone (or is being closed by us): every lease on it is lost.
    fn lose_session(&mut self, now: Instant, reason: Reason, close: bool) {
        let Some(session) = self.session_id() else {
            return;
        };
        if close {
            self.session_command(SessionCommand::Close { session });
        }
        self.event(Event::SessionLost {
            session,
            reason: reason.clone(),
        });
        let ids: Vec<RunId> = self.runs.keys().copied().collect();
        for id in ids {
            let Some(r) = self.runs.get_mut(&id) else {
                continue;
            };
            match &r.state {
                RunState::Trying => r.state = RunState::Wanting,
                RunState::Leading { .. } => self.lose_lease(id, reason.clone()),
                // The session's end released the key.
                RunState::Releasing { outcome, .. } => {
                    let outcome = outcome.clone();
                    self.released(id, outcome);
                }
                RunState::Wanting | RunState::Draining => {}
            }
        }
        self.orphans.clear();
        self.held_draining.clear();
        self.verify = false;
        self.failures = self.failures.saturating_add(1);
        let retry_at = now + self.backoff();
        self.session = Session::Down {
            retry_at: Some(retry_at),
        };
    }

    fn refuse(&mut self, now: Instant, refusal: Refusal) {
        self.event(Event::Refused {
            refusal: refusal.clone(),
        });
        self.phase = Phase::Refused(refusal.clone());
        self.lose_session(now, Reason::Refused(refusal.clone()), true);
        let ids: Vec<RunId> = self.runs.keys().copied().collect();
        for id in ids {
            self.stop_run(
                id,
                Outcome::Refused(refusal.clone()),
                Reason::Refused(refusal.clone()),
            );
        }
    }

    fn released(&mut self, id: RunId, outcome: Outcome) {
        if let Some(r) = self.runs.get(&id) {
            let lease = r.lease.clone();
            self.event(Event::Released { run: id, lease });
            self.finish(id, outcome);
        }
    }

    fn finish(&mut self, id: RunId, outcome: Outcome) {
        if let Some(r) = self.runs.remove(&id) {
            self.keys.remove(&r.lease.key());
            self.run_command(RunCommand::Finish { run: id, outcome });
        }
    }

    // ---- the pump: what to do next -------------------------------------

    /// After every input: enforce deadlines against `now`, then start what is due.
    fn pump(&mut self, now: Instant) {
        // Check the clock rather than trust that a timer fired.
        if self.earliest_validity_end().is_some_and(|v| v <= now) {
            self.lose_session(now, Reason::ValidityExpired, true);
        }
        let timed_out = match &self.session {
            Session::Opening { deadline, .. } => *deadline <= now,
            Session::Up(up) => up.inflight.as_ref().is_some_and(|q| q.deadline <= now),
            Session::Down { .. } => false,
        };
        if timed_out {
            self.lose_session(now, Reason::QueryTimeout, true);
        }
        let needed = self.needs_session();
        match &mut self.session {
            Session::Down { retry_at } => {
                if needed && retry_at.is_none_or(|t| t <= now) {
                    let id = SessionId(self.next_session);
                    self.next_session += 1;
                    self.event(Event::SessionOpening {
                        session: id,
                        failures: self.failures,
                    });
                    self.session_command(SessionCommand::Open {
                        session: id,
                        params: self.session_params(),
                    });
                    self.session = Session::Opening {
                        id,
                        deadline: now + self.opts.query_timeout,
                    };
                }
            }
            Session::Opening { id, .. } => {
                if !needed {
                    let id = *id;
                    self.close_idle(id);
                }
            }
            Session::Up(up) => {
                if up.inflight.is_some() {
                    return;
                }
                if !needed && self.orphans.is_empty() {
                    let id = up.id;
                    return self.close_idle(id);
                }
                if !up.ready {
                    return;
                }
                let heartbeat_at = up.heartbeat_at;
                if let Some(what) = self.next_statement(now, heartbeat_at) {
                    self.send(now, what);
                }
            }
        }
    }

    /// Picks the next statement: verification, then releases, then the
    /// heartbeat, then the standby try.
    fn next_statement(&mut self, now: Instant, heartbeat_at: Instant) -> Option<What> {
        if self.verify {
            return Some(What::Heartbeat);
        }
        let mut release: Vec<i64> = std::mem::take(&mut self.orphans).into_iter().collect();
        for r in self.runs.values_mut() {
            if let RunState::Releasing { sent, .. } = &mut r.state {
                if !*sent {
                    *sent = true;
                    release.push(r.lease.key());
                }
            }
        }
        if !release.is_empty() {
            return Some(What::Release(release));
        }
        if heartbeat_at <= now {
            return Some(What::Heartbeat);
        }
        let due = self.try_now || self.retry_at.is_none_or(|t| t <= now);
        if due && self.phase == Phase::Open {
            let mut keys = Vec::new();
            for r in self.runs.values_mut() {
                if matches!(r.state, RunState::Wanting) {
                    r.state = RunState::Trying;
                    keys.push(r.lease.key());
                }
            }
            self.try_now = false;
            if !keys.is_empty() {
                return Some(What::Try(keys));
            }
        }
        None
    }

    /// Sends a statement on the session that is up.
    fn send(&mut self, now: Instant, what: What) {
        let id = QueryId(self.next_query);
        self.next_query += 1;
        let statement = match &what {
            What::Setup => Statement::Setup,
            What::Listen => Statement::Listen,
            What::Try(keys) => Statement::TryLock { keys: keys.clone() },
            What::Heartbeat => Statement::Heartbeat,
            What::Release(keys) => Statement::Release {
                keys: keys.clone(),
                notify: self.opts.notify_handover,
            },
        };
        let deadline = now + self.opts.query_timeout;
        let Session::Up(up) = &mut self.session else {
            return;
        };
        up.inflight = Some(InFlight {
            id,
            sent: now,
            deadline,
            what,
        });
        self.session_command(SessionCommand::Query {
            query: id,
            statement,
        });
    }

    fn close_idle(&mut self, session: SessionId) {
        self.session_command(SessionCommand::Close { session });
        self.event(Event::SessionIdle { session });
        self.session = Session::Down { retry_at: None };
        self.failures = 0;
        self.orphans.clear();
        self.held_draining.clear();
        self.verify = false;
    }

    // ---- helpers ------------------------------------------------------

    fn session_command(&mut self, c: SessionCommand) {
        self.session_out.push_back(c);
    }

    fn run_command(&mut self, c: RunCommand) {
        self.run_out.push_back(c);
    }

    fn event(&mut self, e: Event) {
        self.events.push_back(e);
    }

    fn session_id(&self) -> Option<SessionId> {
        match &self.session {
            Session::Down { .. } => None,
            Session::Opening { id, .. } => Some(*id),
            Session::Up(up) => Some(up.id),
        }
    }

    fn session_params(&self) -> SessionParams {
        // Fencing tokens are transaction ids: make the transaction that takes
        // them durable before its reply, so a server crash cannot hand the
        // same or a smaller id to the next holder.
        let mut startup_settings = vec![("synchronous_commit", "on".to_string())];
        if self.opts.server_guard {
            let ms = self.opts.guard_timeout().as_millis();
            startup_settings.push(("idle_session_timeout", format!("{ms}")));
        }
        SessionParams { startup_settings }
    }

    /// Whether any run needs the session: a standby, a leader, or a release.
    fn needs_session(&self) -> bool {
        !matches!(self.phase, Phase::Refused(_))
            && self.runs.values().any(|r| match r.state {
                RunState::Draining => false,
                RunState::Wanting => self.phase == Phase::Open,
                RunState::Trying | RunState::Leading { .. } | RunState::Releasing { .. } => true,
            })
    }

    fn any_wanting(&self) -> bool {
        self.runs
            .values()
            .any(|r| matches!(r.state, RunState::Wanting))
    }

    fn earliest_validity_end(&self) -> Option<Instant> {
        self.runs
            .values()
            .filter_map(|r| match r.state {
                RunState::Leading { confirmed, .. } => Some(confirmed),
                _ => None,
            })
            .min()
            .map(|c| c + self.opts.validity_window())
    }

    /// SplitMix64: uniform in [0, 1).
    fn random(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn jittered_retry(&mut self) -> Duration {
        let f = 1.0 - RETRY_JITTER * self.random();
        self.opts.retry_interval.mul_f64(f)
    }

    fn backoff(&mut self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(20);
        let d = RECONNECT_BASE
            .saturating_mul(1 << exp)
            .min(self.opts.retry_interval);
        d.mul_f64(0.5 + 0.5 * self.random())
    }
}

/// Connection errors that mean "a pooler rejected our startup options".
fn startup_refusal(e: &DbError) -> Option<Refusal> {
    e.message
        .contains("unsupported startup parameter")
        .then(|| Refusal::StartupOptionsIgnored {
            detail: e.message.clone(),
        })
}
