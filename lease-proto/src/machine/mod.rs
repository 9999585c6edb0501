//! The lease state machine, split by concern:
//!
//! - this file: the [`Machine`] and its public methods, by class;
//! - `state`: the internal states of a run and of the session, named as
//!   their public [`Status`] counterparts;
//! - `runs`: what happens to runs (start, win, loss, job exit, release);
//! - `session`: what happens to the session (open, replies, loss, refusal);
//! - `pump`: after every input, acting on deadlines and picking the next
//!   statement;
//! - `timer`: the one deadline table behind [`Machine::poll_timeout`];
//! - `wait`: standbys waiting on the server for a key to be freed;
//! - `doubtful`: a session given up on while its cancelled jobs still run;
//! - `status`: the public snapshot.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use crate::io::*;
use crate::key::LeaseId;
use crate::options::{Options, OptionsError};
use crate::sql::HANDOVER_CHANNEL;

mod doubtful;
mod pump;
mod runs;
mod session;
mod state;
mod status;
mod timer;
mod wait;

use state::{Phase, Run, RunState, Session, Standby};
use timer::TimerTable;

pub use status::{LastError, LeaseState, LeaseStatus, SessionState, Status};
pub use timer::Timer;
pub use wait::{MIN_WAIT, WAKE_BUDGET};

/// Least `server_version_num` without the server guard (`pg_current_xact_id`).
pub const MIN_SERVER_VERSION: i64 = 130_000;
/// Least `server_version_num` with the server guard (`idle_session_timeout`).
pub const MIN_SERVER_VERSION_GUARD: i64 = 140_000;
/// First reconnect delay; it doubles per consecutive failure up to the retry
/// interval, and each delay is jittered to between half and all of it.
pub const RECONNECT_BASE: Duration = Duration::from_millis(50);
/// Every this many heartbeats, the heartbeat sent is a
/// [`Statement::Verify`](crate::Statement::Verify) (a read of `pg_locks`).
/// The steady heartbeat proves the session is the same live one, which is
/// enough unless a client that is not a lease client shares the backend
/// (a transaction pooler with one server connection) and unlocks the keys
/// (`pg_advisory_unlock_all()`): nothing else shows that. The periodic
/// verify bounds how long a holder keeps leading then (to this many
/// heartbeat intervals, 1 min with the defaults), while the median
/// heartbeat stays independent of the locks on the server.
pub const VERIFY_EVERY: u32 = 12;

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
/// 3. **Timer**: [`Machine::poll_timeout`], read after draining: when to feed
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
///   the server could free its keys anyway ([`Timer::DeferredClose`]). Nothing is sent on it
///   meanwhile and late replies are ignored; no run acquires on it; a new
///   session opens only once it is closed ([`SessionState::Doubtful`]). The
///   same deadline applies without the server guard, so that a job that
///   ignores its cancellation cannot keep the standbys without a session.
///   A session ended by the server or the connection ([`Input::SessionLost`])
///   is gone at once;
/// - a key held by the session is never locked again (no re-entrant stacking),
///   and any key found held without the machine's knowledge is unlocked;
/// - a standby that holds nothing waits on the server for a wanted key and
///   tries the moment it is freed (after [`Options::lock_delay`] unless a
///   handover notification came); a wait never acquires, the try after it
///   does (see `wait` for the rule);
/// - one statement per heartbeat and one per standby tick (a try, or a
///   wait that ends by its lock timeout), however many leases, plus one
///   wait per tick for a standby of several; at most one statement in
///   flight.
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
    /// Every deadline; see [`Timer`].
    timers: TimerTable,
    /// Consecutive failed connection attempts.
    failures: u32,
    /// A session of this machine passed setup at least once: from then on
    /// configuration errors at connect are retried, not final for runs.
    ever_ready: bool,
    /// The last error that failed a connection attempt or ended a session,
    /// and when ([`Status::last_error`]).
    last_error: Option<LastError>,
    /// Keys to unlock at the next release: held without a run that holds them.
    orphans: BTreeSet<i64>,
    /// Keys found held whose run lost them (stopping): unlocked once its job
    /// returned.
    held_lost: BTreeSet<i64>,
    /// An obligation, not a state: a try's outcome is unknown (it failed, or
    /// its reply broke the rules), so the next statement on this session is
    /// a verify (a heartbeat that reads `pg_locks`), before any release or
    /// try. It holds whatever statement is in flight, and ends with the
    /// verify's reply or the session.
    verify: bool,
    /// An obligation, not a state: try the standbys at the next chance,
    /// without waiting for [`Timer::Retry`] (a new run, a session just
    /// ready, a handover notification). Kept apart from the retry deadline,
    /// which it must not move.
    try_now: bool,
    /// A pooler rejected the `options` startup parameter: later sessions
    /// connect without startup options and the setup applies the settings
    /// by statement (and verifies them like any other session's).
    settings_by_statement: bool,
    /// The simulator's broken variant: no TCP settings set or verified.
    tcp_settings_off: bool,
    /// The last statement chosen by the pump was a heartbeat: a due try goes
    /// first next, so a round trip longer than the heartbeat interval cannot
    /// starve the standbys (the heartbeat is due again at every reply).
    heartbeat_last: bool,
    /// Heartbeats since the last verify (see [`VERIFY_EVERY`]).
    unverified_heartbeats: u32,
    /// Send time of the last statement, on any session: a doubtful
    /// session's [`Timer::DeferredClose`] counts from it.
    last_sent: Option<Instant>,
    /// Waiting on the server (see `wait`): the last key waited for, so the
    /// next wait takes the next one.
    wait_cursor: Option<i64>,
    /// The last wait was woken (its key freed) and no try has answered since.
    woken: bool,
    /// Wakes in a row whose following try won nothing (see [`WAKE_BUDGET`]).
    wake_losses: u32,
    /// A wait failed otherwise than by its lock timeout: this session polls.
    waits_off: bool,
    /// When a handover notification for the key of the wait in flight
    /// arrived. Either the release that is waking the wait (the driver reads
    /// notifications ahead of the reply it waits for): the wake follows
    /// within moments, and the try goes at once; or an older release, after
    /// which someone else took the key: the wake comes later, from another
    /// end of that holder, and gets the lock delay. Ends with the wait.
    wait_notified: Option<Instant>,
    /// Waits interrupted by a notification for another key since the last
    /// periodic try (see [`WAKE_BUDGET`]).
    notify_interrupts: u32,
    /// The session's server was promoted recently: no try (nor wait) before
    /// this instant (see `PromotionState::hold`). Ends with the session.
    promotion_hold: Option<Instant>,
    /// Test knob: the old behaviour (issue 11 hole 3), closing a session
    /// given up on at once while its cancelled jobs still run.
    close_doubtful_at_once: bool,
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
            session: Session::Idle,
            timers: TimerTable::default(),
            failures: 0,
            ever_ready: false,
            last_error: None,
            orphans: BTreeSet::new(),
            held_lost: BTreeSet::new(),
            verify: false,
            try_now: false,
            settings_by_statement: false,
            tcp_settings_off: false,
            heartbeat_last: false,
            unverified_heartbeats: 0,
            last_sent: None,
            close_doubtful_at_once: false,
            wait_cursor: None,
            promotion_hold: None,
            woken: false,
            wake_losses: 0,
            waits_off: false,
            wait_notified: None,
            notify_interrupts: 0,
            session_out: VecDeque::new(),
            run_out: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// The simulator's broken variant of issue 11 hole 1: sessions neither
    /// set nor verify the server-side TCP settings.
    #[cfg(feature = "sim")]
    pub(crate) fn without_tcp_settings(&mut self) {
        self.tcp_settings_off = true;
    }

    // ---- inputs -------------------------------------------------------

    /// Input: starts contending for `lease`. The run ends with exactly one
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
                state: RunState::Standby(Standby::new()),
            },
        );
        self.try_now = true;
        self.pump(now);
        Ok(id)
    }

    /// Input: feeds one input at time `now`. Never panics, whatever the
    /// input: inputs naming unknown runs, sessions or queries are ignored.
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
            Input::SessionLost { session, error } => self.session_lost(now, session, error),
            Input::Reply { query, result } => self.reply(now, query, result),
            Input::Notification { channel, payload } => {
                if channel == HANDOVER_CHANNEL {
                    if let Ok(key) = payload.trim().parse::<i64>() {
                        self.handover_notified(now, key);
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
        self.run_out.pop_front()
    }

    /// Output 2: the next command for the connection (open, query, close),
    /// or `None`. Drain it after every input, after [`Machine::poll_run`].
    #[must_use]
    pub fn poll_session(&mut self) -> Option<SessionCommand> {
        self.session_out.pop_front()
    }

    /// Output 3: the next event for logs and metrics, or `None`. Events never
    /// ask for an action; a driver may drop them.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- timer --------------------------------------------------------

    /// Timer: when to feed [`Input::Tick`] next, if no other input comes
    /// first. `None`: nothing is scheduled. Only deadlines that can make
    /// progress count (no heartbeat or retry while a statement is in flight,
    /// no backoff when no run needs the session), so a driver never spins.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_timer().map(|(_, at)| at)
    }

    /// Timer: which deadline [`Machine::poll_timeout`] is (the first in
    /// [`Timer`] order on ties), or `None` when nothing is scheduled. For
    /// logs, metrics and tests; a driver does not need it.
    #[must_use]
    pub fn timeout_reason(&self) -> Option<Timer> {
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
        match &self.runs.get(&run)?.state {
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
            && self.session_out.is_empty()
            && self.run_out.is_empty()
    }

    /// Test knob, for broken-variant tests only: restores the behaviour of
    /// issue 11 hole 3, closing a session the machine gives up on at once,
    /// while its cancelled jobs may still run. Never use it otherwise.
    #[cfg(feature = "sim")]
    #[doc(hidden)]
    pub fn close_doubtful_sessions_at_once(&mut self) {
        self.close_doubtful_at_once = true;
    }

    // ---- output queues ------------------------------------------------

    fn session_command(&mut self, c: SessionCommand) {
        self.session_out.push_back(c);
    }

    fn run_command(&mut self, c: RunCommand) {
        self.run_out.push_back(c);
    }

    fn event(&mut self, e: Event) {
        self.events.push_back(e);
    }

    /// Time never goes backwards inside the machine.
    fn clock(&mut self, now: Instant) -> Instant {
        let now = self.now.map_or(now, |t| t.max(now));
        self.now = Some(now);
        now
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
        assert_eq!(m.timeout_reason(), Some(Timer::Connect));
        assert_eq!(m.poll_timeout(), Some(t + opts.query_timeout));
        m.handle_input(
            t,
            Input::SessionOpened {
                session: SessionId(0),
            },
        );
        assert_eq!(m.timeout_reason(), Some(Timer::Query));
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
        // Leading, nothing in flight: the heartbeat comes before validity ends.
        assert_eq!(m.timeout_reason(), Some(Timer::Heartbeat));
        assert_eq!(m.poll_timeout(), Some(t + opts.heartbeat_interval));
        m.handle_input(
            t,
            Input::SessionLost {
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
        assert_eq!(m.timeout_reason(), Some(Timer::Backoff));
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
        // retry deadline, instead of sitting idle.
        let (_, wait) = query(&mut m);
        let Statement::Wait { key, timeout_ms } = wait else {
            panic!("expected a wait, got {wait:?}");
        };
        assert_eq!(key, keys[0]);
        let retry = opts.retry_interval.as_millis() as u64;
        assert!(
            (retry * 4 / 5..=retry).contains(&timeout_ms),
            "the wait ends by the (jittered) retry deadline: {timeout_ms} ms"
        );
        assert_eq!(m.timeout_reason(), Some(Timer::Query));
        // Its query timer allows for the block: the lock timeout plus the
        // query timeout (the statement's text rounds the former down to ms).
        let at = m.poll_timeout().unwrap() - opts.query_timeout;
        let ms = Duration::from_millis(timeout_ms);
        assert!(t + ms <= at && at < t + ms + Duration::from_millis(1));
    }
}
