//! The session: its states ([`Session`]), the connector that opens one
//! after another ([`Connector`]: ids and nonces, failures and backoff,
//! whether any ever became ready, settings by statement behind a pooler, the
//! last error, the machine's seeded [`Jitter`]), and the rules a new
//! session's setup must pass ([`check_setup`]).

use std::time::{Duration, Instant};

use super::jitter::Jitter;
use super::knobs::Knobs;
use super::status::LastError;
use crate::io::{QueryId, Reason, Refusal, SessionError, SessionId, SessionParams};
use crate::options::Options;
use crate::sql::{HeartbeatReply, SetupReply, Statement, TryReply};

/// Least `server_version_num` without the server guard (`pg_current_xact_id`).
pub const MIN_SERVER_VERSION: i64 = 130_000;
/// Least `server_version_num` with the server guard (`idle_session_timeout`).
pub const MIN_SERVER_VERSION_GUARD: i64 = 140_000;
/// First reconnect delay; it doubles per consecutive failure up to the retry
/// interval (within [`FAST_RECONNECT_WINDOW`], up to [`FAST_RECONNECT_CAP`]),
/// and each delay is jittered to between half and all of it.
pub const RECONNECT_BASE: Duration = Duration::from_millis(50);
/// The most the reconnect delay grows to for [`FAST_RECONNECT_WINDOW`] after
/// a session that had passed its setup ended, while every failure says only
/// that the server is not there (no answer: refused, reset, timed out; or
/// SQLSTATE class 57P: shutting down, starting up, terminated): a
/// restarting server is tried again within this of accepting connections,
/// where the doubling backoff would have grown to about as long as the
/// server was down. A failure the server answered otherwise (a hot
/// standby, too many connections, a configuration error such as a rotated
/// password) ends the window: each such attempt costs the server a backend.
/// Its value keeps the restart bound at the library defaults within 100 ms
/// of the server accepting connections: this cap, then a connection, the
/// setup and a try (about 15 ms on loopback), then the lock delay (20 ms).
/// The cost: up to 33 attempts a second per locker (jittered delays of 30
/// to 60 ms after the first) while the server stays away, at most for the
/// window.
pub const FAST_RECONNECT_CAP: Duration = Duration::from_millis(60);
/// How long [`FAST_RECONNECT_CAP`] holds after a ready session ended; then
/// the delay doubles again from [`RECONNECT_BASE`] up to the retry interval.
pub const FAST_RECONNECT_WINDOW: Duration = Duration::from_secs(20);

/// The session.
#[derive(Debug)]
pub(super) enum Session {
    /// No connection, none asked for yet: the next one may start at once.
    Idle,
    /// No connection after a failure: the next attempt waits for
    /// [`Deadline::Backoff`](super::deadline::Deadline::Backoff).
    Backoff,
    /// [`SessionCommand::Open`](crate::SessionCommand::Open) sent; timed by
    /// [`Deadline::Connect`](super::deadline::Deadline::Connect).
    Connecting { id: SessionId },
    /// Connected.
    Up(Up),
    /// Given up on by the machine (a statement timed out, failed or broke
    /// its rules; a validity ended) while jobs on it had not returned: see
    /// `doubtful`. Nothing is sent on it and its replies are ignored; it is
    /// closed once every job has returned or at
    /// [`Deadline::DeferredClose`](super::deadline::Deadline::DeferredClose).
    Doubtful {
        id: SessionId,
        /// Why the machine gave up on it.
        reason: Reason,
    },
}

impl Session {
    /// The session's id, if there is one.
    pub(super) fn id(&self) -> Option<SessionId> {
        match self {
            Session::Idle | Session::Backoff => None,
            Session::Connecting { id } | Session::Doubtful { id, .. } => Some(*id),
            Session::Up(up) => Some(up.id),
        }
    }

    /// The session, if it is up.
    pub(super) fn up(&self) -> Option<&Up> {
        match self {
            Session::Up(up) => Some(up),
            _ => None,
        }
    }

    pub(super) fn up_mut(&mut self) -> Option<&mut Up> {
        match self {
            Session::Up(up) => Some(up),
            _ => None,
        }
    }

    /// Up, set up, and nothing in flight: the session may send.
    pub(super) fn idle_ready(&self) -> bool {
        self.up()
            .is_some_and(|up| up.inflight.is_none() && matches!(up.stage, Stage::Ready { .. }))
    }

    /// Whether the pooler probe is in flight.
    pub(super) fn probing(&self) -> bool {
        (self.up()).is_some_and(|up| {
            matches!(
                up.inflight.as_ref().map(|q| &q.what),
                Some(What::PoolerProbe)
            )
        })
    }

    /// The key of the wait in flight, if one is.
    pub(super) fn waiting_for(&self) -> Option<i64> {
        match self.up()?.inflight.as_ref().map(|q| &q.what) {
            Some(What::Take { key, .. }) => Some(*key),
            _ => None,
        }
    }

    /// What the pump does with the session after an input (see
    /// `Machine::act`): `needed`, a run needs a session; `backoff_over`, no
    /// backoff holds the next attempt back; `orphans`, keys are held
    /// without a run (the session unlocks them before it closes).
    pub(super) fn next_step(&self, needed: bool, backoff_over: bool, orphans: bool) -> Step {
        match self {
            Session::Idle if needed => Step::Open,
            Session::Backoff if needed && backoff_over => Step::Open,
            Session::Connecting { id } if !needed => Step::CloseIdle(*id),
            Session::Idle | Session::Backoff | Session::Connecting { .. } => Step::Nothing,
            // Nothing is sent on it; it closes by itself (see `doubtful`).
            Session::Doubtful { .. } => Step::Nothing,
            Session::Up(up) if up.inflight.is_some() => Step::Nothing,
            Session::Up(up) if !needed && !orphans => Step::CloseIdle(up.id),
            Session::Up(up) if matches!(up.stage, Stage::Ready { .. }) => Step::Send,
            Session::Up(_) => Step::Nothing,
        }
    }
}

/// What the pump does with the session (see [`Session::next_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing now: the session waits for a reply, its backoff or its setup,
    /// or is doubtful, or no run needs one.
    Nothing,
    /// Ask the driver for a new session.
    Open,
    /// Close the session (connecting or up): no run needs it.
    CloseIdle(SessionId),
    /// The session is ready and idle: send the next statement, if any.
    Send,
}

#[derive(Debug)]
pub(super) struct Up {
    pub(super) id: SessionId,
    /// Set as [`NONCE_SETTING`](crate::sql::NONCE_SETTING) by the setup and
    /// expected back in every heartbeat.
    pub(super) nonce: i64,
    pub(super) stage: Stage,
    /// The statement in flight, timed by [`Deadline::Query`](super::deadline::Deadline::Query).
    pub(super) inflight: Option<InFlight>,
    /// The session's server was promoted recently: no try (nor wait) before
    /// this instant (see `PromotionState::hold`).
    pub(super) promotion_hold: Option<Instant>,
    /// A try's reply that won a key, held back for the lock delay
    /// ([`Deadline::LockDelay`](super::deadline::Deadline::LockDelay)) with its
    /// statement still in flight (see `Machine::try_answered`).
    pub(super) held_back: Option<Box<TryReply>>,
}

impl Up {
    pub(super) fn new(id: SessionId, nonce: i64) -> Up {
        Up {
            id,
            nonce,
            stage: Stage::SettingUp,
            inflight: None,
            promotion_hold: None,
            held_back: None,
        }
    }

    /// The pooler probe's answer (see `Machine::probe_done`): `None` unless
    /// the session is probing; else the backend pid and server version it
    /// goes on with, or the refusal of a transaction pooler (the probe's
    /// second connection read this session's nonce).
    pub(super) fn probe_verdict(
        &self,
        reply: &HeartbeatReply,
    ) -> Option<Result<(i64, i64), Refusal>> {
        let Stage::Probing {
            backend_pid,
            server_version,
        } = self.stage
        else {
            return None;
        };
        if reply.nonce == Some(self.nonce) {
            let pid = reply
                .backend_pid
                .map_or("unknown".into(), |p| p.to_string());
            let detail = format!(
                "it read {} {} on backend pid {pid}; this session's pid is {backend_pid}",
                crate::sql::NONCE_SETTING,
                self.nonce
            );
            return Some(Err(Refusal::TransactionPooler { detail }));
        }
        Some(Ok((backend_pid, server_version)))
    }

    /// Whether the session that answered a try (`session`: the backend pid
    /// and nonce of the reply's session row) is this one; why not, if not:
    /// no session row (a malformed reply), or another backend or nonce (a
    /// [`Reason::Refused`]).
    pub(super) fn same_try_session(
        &self,
        session: Option<(i64, Option<i64>)>,
    ) -> Result<(), Reason> {
        let pid = self.stage.backend_pid();
        match session {
            None => {
                let e = SessionError::other("malformed try reply: no session row");
                Err(Reason::QueryFailed(e))
            }
            Some((found, _)) if Some(found) != pid => {
                let was = pid.unwrap_or(0);
                Err(Reason::Refused(Refusal::BackendChanged { was, now: found }))
            }
            Some((_, found)) if found != Some(self.nonce) => {
                Err(Reason::Refused(shared(self.nonce, found)))
            }
            Some(_) => Ok(()),
        }
    }

    /// Whether the session that answered a heartbeat, verify or wait
    /// (`reply`) is this one: the same backend pid and the same nonce; the
    /// refusal if not.
    pub(super) fn same_backend(&self, reply: &HeartbeatReply) -> Result<(), Refusal> {
        let (expected, nonce) = (self.stage.backend_pid(), self.nonce);
        let pid = reply.backend_pid;
        if pid.is_none() || pid != expected {
            return Err(Refusal::BackendChanged {
                was: expected.unwrap_or(0),
                now: pid.unwrap_or(0),
            });
        }
        if reply.nonce != Some(nonce) {
            return Err(shared(nonce, reply.nonce));
        }
        Ok(())
    }
}

/// How far a connected session got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// The setup statement runs.
    SettingUp,
    /// Setup passed (its settings went by statement: a pooler rejected the
    /// startup options); the pooler probe runs on a second connection.
    Probing {
        backend_pid: i64,
        server_version: i64,
    },
    /// Setup passed; `LISTEN` runs.
    Listening { backend_pid: i64 },
    /// In use: heartbeats, tries and releases.
    Ready { backend_pid: i64 },
}

impl Stage {
    pub(super) fn backend_pid(self) -> Option<i64> {
        match self {
            Stage::SettingUp => None,
            Stage::Probing { backend_pid, .. }
            | Stage::Listening { backend_pid }
            | Stage::Ready { backend_pid } => Some(backend_pid),
        }
    }
}

/// A statement sent and not answered yet.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) id: QueryId,
    pub(super) sent: Instant,
    pub(super) what: What,
}

/// What a statement in flight was, with what its reply needs.
#[derive(Debug)]
pub(super) enum What {
    Setup,
    /// The pooler probe ([`SessionCommand::Probe`](crate::SessionCommand::Probe)):
    /// a heartbeat on a second connection.
    PoolerProbe,
    Listen,
    Try(Vec<i64>),
    Heartbeat,
    Verify,
    /// Unlocks `keys`; `reserved`: those handed over by name (see
    /// `handover`).
    Release {
        keys: Vec<i64>,
        reserved: Vec<(i64, i64, i64)>,
    },
    /// A standby's wait on the server that takes `key` ([`Statement::Take`];
    /// its run is in it as in a try), ended by the server after `timeout`
    /// at the latest.
    Take {
        key: i64,
        timeout: Duration,
        /// Its timeout was cut below the retry deadline by the server's
        /// `deadlock_timeout` (see `wait`): a chunk of the retry interval.
        chunk: bool,
        /// It queues however many wait already (see `handover`).
        named: bool,
    },
    /// A lease group's membership read (see `groups`).
    Members(super::membership::Read),
    /// An observer's read of the holders of `keys` (a
    /// [`Statement::Members`] that joins, leaves and reads no group; see
    /// `Machine::observes`).
    Look(Vec<i64>),
    /// A standby of `priority` asks the holder of `key` to hand it over
    /// (see `Machine::preference_requested`).
    Prefer {
        key: i64,
        priority: u32,
    },
    /// A holder's heartbeat that checks the hand-overs asked of it (see
    /// `handover`).
    Check(Vec<(i64, i64)>),
}

impl What {
    /// The statement to send for this on session `up`; `settings`: the
    /// setup's settings by statement, if they go that way.
    pub(super) fn statement(
        &self,
        up: &Up,
        settings: Vec<(&'static str, String)>,
        notify: bool,
    ) -> Statement {
        let nonce = up.nonce;
        match self {
            What::Setup => Statement::Setup { nonce, settings },
            What::Listen => Statement::Listen,
            // The backend pid and the nonce, read on the second connection.
            What::PoolerProbe => Statement::Heartbeat,
            What::Try(keys) => Statement::TryLock {
                keys: keys.clone(),
                backend_pid: up.stage.backend_pid().unwrap_or(0),
                nonce,
            },
            What::Heartbeat => Statement::Heartbeat,
            What::Verify => Statement::Verify,
            What::Take {
                key,
                timeout,
                named,
                ..
            } => Statement::Take {
                key: *key,
                timeout_ms: timeout.as_millis().max(1) as u64,
                crowd: (!named).then_some(super::wait::HERD_WAITERS),
                backend_pid: up.stage.backend_pid().unwrap_or(0),
                nonce,
            },
            What::Release { keys, reserved } => Statement::Release {
                keys: keys.clone(),
                notify,
                reserved: if notify { reserved.clone() } else { Vec::new() },
            },
            What::Members(read) => Statement::Members {
                join: read.join.clone(),
                leave: read.leave.clone(),
                groups: read.groups.clone(),
                keys: read.keys.clone(),
                notify,
                announce: read.announce.clone(),
                claims: read.claims.clone(),
            },
            What::Look(keys) => Statement::Members {
                join: Vec::new(),
                leave: Vec::new(),
                groups: Vec::new(),
                keys: keys.clone(),
                notify: false,
                announce: Vec::new(),
                claims: Vec::new(),
            },
            What::Prefer { key, priority } => Statement::Prefer {
                key: *key,
                priority: *priority,
            },
            What::Check(asks) => Statement::CheckHandover { asks: asks.clone() },
        }
    }

    /// How long the statement blocks by design: a wait, up to its lock
    /// timeout; nothing else.
    pub(super) fn blocks(&self) -> Duration {
        match self {
            What::Take { timeout, .. } => *timeout,
            _ => Duration::ZERO,
        }
    }
}

/// Opening sessions, one after another: what carries over from one session
/// to the next.
#[derive(Debug)]
pub(super) struct Connector {
    /// The machine's one random sequence: this connector's backoffs and
    /// nonces draw from it, and so do the standby retries
    /// ([`Connector::retry_delay`]), so that the seed fixes every draw.
    jitter: Jitter,
    next_session: u64,
    next_query: u64,
    /// Consecutive failed connection attempts.
    failures: u32,
    /// The session in use passed its setup (cleared when it ends).
    ready_now: bool,
    /// Until when the reconnect delay stays at most [`FAST_RECONNECT_CAP`]:
    /// [`FAST_RECONNECT_WINDOW`] after a session that passed its setup ended.
    fast_until: Option<Instant>,
    /// A session of this machine passed setup at least once: from then on
    /// configuration errors at connect are retried, not final for runs.
    ever_ready: bool,
    /// A pooler rejected the `options` startup parameter: later sessions
    /// connect without startup options and the setup applies the settings
    /// by statement (and verifies them like any other session's).
    settings_by_statement: bool,
    /// The last error that failed a connection attempt or ended a session,
    /// and when ([`Status::last_error`](super::status::Status::last_error)).
    last_error: Option<LastError>,
    /// Send time of the last statement, on any session: a doubtful
    /// session's [`Deadline::DeferredClose`](super::deadline::Deadline::DeferredClose)
    /// counts from it.
    last_sent: Option<Instant>,
}

impl Connector {
    /// A connector whose jitter and nonces come from `seed`.
    pub(super) fn new(seed: u64) -> Connector {
        Connector {
            jitter: Jitter::new(seed),
            next_session: 0,
            next_query: 0,
            failures: 0,
            ready_now: false,
            fast_until: None,
            ever_ready: false,
            settings_by_statement: false,
            last_error: None,
            last_sent: None,
        }
    }

    pub(super) fn next_session(&mut self) -> SessionId {
        let id = SessionId(self.next_session);
        self.next_session += 1;
        id
    }

    /// A statement goes out at `now`: its id.
    pub(super) fn next_query(&mut self, now: Instant) -> QueryId {
        let id = QueryId(self.next_query);
        self.next_query += 1;
        self.last_sent = Some(now);
        id
    }

    /// A statement goes out on the watch session: its id. Not a send time
    /// of the session's (see `last_sent`): the watch session holds nothing.
    pub(super) fn next_watch_query(&mut self) -> QueryId {
        let id = QueryId(self.next_query);
        self.next_query += 1;
        id
    }

    /// The id the next statement will have.
    #[cfg(feature = "sim")]
    pub(super) fn peek_query(&self) -> u64 {
        self.next_query
    }

    pub(super) fn last_sent(&self) -> Option<Instant> {
        self.last_sent
    }

    pub(super) fn failures(&self) -> u32 {
        self.failures
    }

    /// A connection attempt failed or a session ended at `now` for
    /// `reason`: the next waits longer. The end of a session that had passed
    /// its setup opens the window of [`FAST_RECONNECT_CAP`]; a failure the
    /// server answered closes it (see there).
    pub(super) fn failed(&mut self, now: Instant, reason: &Reason) {
        self.failures = self.failures.saturating_add(1);
        if std::mem::take(&mut self.ready_now) {
            self.fast_until = Some(now + FAST_RECONNECT_WINDOW);
            self.failures = 1;
        } else if !server_not_there(reason) {
            self.fast_until = None;
        }
    }

    /// The broken variant without the fast reconnect window.
    #[cfg(feature = "sim")]
    pub(super) fn end_fast_window(&mut self) {
        self.fast_until = None;
    }

    /// The machine closed the session itself, not for a failure: its end
    /// opens no window of [`FAST_RECONNECT_CAP`].
    pub(super) fn closed(&mut self) {
        self.ready_now = false;
    }

    /// No failure to count: the next attempt may go at once.
    pub(super) fn clear_failures(&mut self) {
        self.failures = 0;
    }

    /// A session passed its setup.
    pub(super) fn ready(&mut self) {
        self.failures = 0;
        self.ever_ready = true;
        self.ready_now = true;
        self.fast_until = None;
    }

    pub(super) fn ever_ready(&self) -> bool {
        self.ever_ready
    }

    pub(super) fn settings_by_statement(&self) -> bool {
        self.settings_by_statement
    }

    /// A pooler rejected the startup options: from now on the settings go
    /// by statement.
    pub(super) fn fall_back_to_statements(&mut self) {
        self.settings_by_statement = true;
    }

    pub(super) fn last_error(&self) -> Option<&LastError> {
        self.last_error.as_ref()
    }

    pub(super) fn record_error(&mut self, e: LastError) {
        self.last_error = Some(e);
    }

    /// The delay before the next attempt at `now`: see [`RECONNECT_BASE`]
    /// and [`FAST_RECONNECT_CAP`]; jittered to between half and all of it
    /// (the connector's jitter).
    pub(super) fn backoff(&mut self, opts: &Options, now: Instant) -> Duration {
        let mut cap = opts.retry_interval;
        match self.fast_until {
            Some(until) if now < until => cap = cap.min(FAST_RECONNECT_CAP),
            // The window is over: the doubling starts again from the base.
            Some(_) => {
                self.fast_until = None;
                self.failures = 1;
            }
            None => {}
        }
        let exp = self.failures.saturating_sub(1).min(20);
        let d = RECONNECT_BASE.saturating_mul(1 << exp).min(cap);
        d.mul_f64(0.5 + 0.5 * self.jitter.random())
    }

    /// The nonce of `session`, which this connector opened (see
    /// [`Jitter::nonce`]).
    pub(super) fn nonce(&self, session: SessionId) -> i64 {
        self.jitter.nonce(session)
    }

    /// The delay until the next standby try: the retry interval, jittered
    /// down (see [`Jitter::retry`]). Drawn here, from the one sequence the
    /// backoffs also draw from, so that the seed fixes every draw.
    pub(super) fn retry_delay(&mut self, interval: Duration) -> Duration {
        self.jitter.retry(interval)
    }

    /// What a new session connects with.
    pub(super) fn params(&self, opts: &Options, knobs: &Knobs) -> SessionParams {
        let startup_settings = if self.settings_by_statement {
            Vec::new()
        } else {
            settings(opts, knobs)
        };
        SessionParams { startup_settings }
    }

    /// The settings the setup statement applies itself.
    pub(super) fn setup_settings(
        &self,
        opts: &Options,
        knobs: &Knobs,
    ) -> Vec<(&'static str, String)> {
        if self.settings_by_statement {
            settings(opts, knobs)
        } else {
            Vec::new()
        }
    }
}

/// The settings of every lease session, as `(name, value)`.
fn settings(opts: &Options, knobs: &Knobs) -> Vec<(&'static str, String)> {
    // Nothing of the role's own may shadow a name of the statements. (No
    // `synchronous_commit`: no statement writes WAL, fencing tokens come
    // from the server's clock; see `Statement::TryLock`.)
    let mut settings = vec![("search_path", crate::sql::SEARCH_PATH.to_string())];
    if opts.server_guard {
        let ms = opts.guard_timeout().as_millis();
        settings.push(("idle_session_timeout", format!("{ms}")));
    }
    // The server must not give up on a silent client before the guard.
    if !knobs.tcp_settings_off {
        for (name, value) in opts.tcp_settings() {
            settings.push((name, value.to_string()));
        }
    }
    settings
}

/// Why a setup reply does not let the session be used.
#[derive(Debug)]
pub(super) enum SetupProblem {
    /// Final: the server cannot give mutual exclusion as configured.
    Refuse(Refusal),
    /// A hot standby: often a failover in progress; not final.
    InRecovery,
}

/// The rules a new session's setup reply must pass, in order: the server's
/// version, not in recovery, the session's own nonce and `search_path` read
/// back, the server guard's `idle_session_timeout` and the TCP settings as
/// asked (over a Unix socket the server ignores, and reads back 0 for, TCP
/// settings: there is no TCP connection to give up on).
pub(super) fn check_setup(
    opts: &Options,
    knobs: &Knobs,
    nonce: i64,
    setup: &SetupReply,
) -> Result<(), SetupProblem> {
    let refuse = |detail| {
        Err(SetupProblem::Refuse(Refusal::StartupOptionsIgnored {
            detail,
        }))
    };
    let needed = if opts.server_guard {
        MIN_SERVER_VERSION_GUARD
    } else {
        MIN_SERVER_VERSION
    };
    if setup.server_version < needed {
        let found = Some(setup.server_version);
        return Err(SetupProblem::Refuse(Refusal::ServerTooOld {
            found,
            needed,
        }));
    }
    if setup.in_recovery {
        return Err(SetupProblem::InRecovery);
    }
    if setup.nonce != Some(nonce) {
        return refuse(format!(
            "{} is {}, {} was set",
            crate::sql::NONCE_SETTING,
            setup.nonce.map_or("unset".into(), |n| n.to_string()),
            nonce
        ));
    }
    if !setup.search_path_catalog {
        return refuse(format!(
            "search_path is not {}, as was asked for",
            crate::sql::SEARCH_PATH
        ));
    }
    if opts.server_guard {
        let expected = opts.guard_timeout().as_millis() as i64;
        let found = setup.idle_session_timeout_ms;
        if found != Some(expected) {
            return refuse(format!(
                "idle_session_timeout is {} ms, {expected} ms was asked for",
                found.map_or("unknown".into(), |f| f.to_string())
            ));
        }
    }
    if !setup.unix_socket && !knobs.tcp_settings_off {
        let asked = opts.tcp_settings();
        for ((name, expected), found) in asked.iter().zip(setup.tcp_settings) {
            if found != Some(*expected) {
                return refuse(format!(
                    "{name} is {}, {expected} was asked for",
                    found.map_or("unknown".into(), |f| f.to_string())
                ));
            }
        }
    }
    Ok(())
}

/// A reply that breaks its statement's rules: the session's state is unknown.
pub(super) fn malformed(e: crate::sql::ReplyError) -> Reason {
    Reason::QueryFailed(SessionError::other(e.to_string()))
}

/// The error a session loss (or a failed connection attempt) records as the
/// last error; `None` for the machine's own choices (shutdown, close).
pub(super) fn reason_error(
    reason: &Reason,
    connecting: bool,
    timeout: Duration,
) -> Option<SessionError> {
    Some(match reason {
        Reason::SessionEnded(Some(e)) | Reason::QueryFailed(e) => e.clone(),
        Reason::SessionEnded(None) if connecting => {
            SessionError::other("the connection closed during startup")
        }
        Reason::QueryTimeout if connecting => SessionError::other(format!(
            "connection attempt timed out after {} ms",
            timeout.as_millis()
        )),
        Reason::Shutdown | Reason::Closed => return None,
        other => SessionError::other(other.to_string()),
    })
}

/// The loss of a session whose pooler probe got no answer within the query
/// timeout (`timeout`). Behind a session-mode pool whose every server
/// connection is taken (a `pool_size` no larger than the lease sessions
/// through it: each holds one for good) the probe's second connection waits
/// for one that never frees, every attempt: the error says so, rather than
/// "a statement timed out".
pub(super) fn probe_unanswered(timeout: Duration) -> Reason {
    Reason::QueryFailed(SessionError::other(format!(
        "the pooler probe (a second connection to the same host, once per session behind a \
         pooler) got no answer within {} ms: most likely a session pool with no free server \
         connection, where the probe waits for one (each lease session holds one for good: a \
         pool_size no larger than the lease sessions through it); give the pool at least one \
         server connection more than the lease sessions",
        timeout.as_millis()
    )))
}

/// Another nonce than this session's was read back.
pub(super) fn shared(nonce: i64, found: Option<i64>) -> Refusal {
    let found = found.map_or("unset".into(), |n| n.to_string());
    Refusal::BackendShared {
        detail: format!("{} is {found}, {nonce} was set", crate::sql::NONCE_SETTING),
    }
}

/// The server rejected the server guard's `idle_session_timeout` as an unknown setting
/// (SQLSTATE 42704, in the startup packet or in the setup's `set_config`): it is older than
/// PostgreSQL 14, which brought the setting. Final, like the setup's version check.
pub(super) fn guard_unsupported(e: &SessionError) -> Option<Refusal> {
    (e.code.as_deref() == Some("42704") && e.message.contains("\"idle_session_timeout\""))
        .then_some(Refusal::ServerTooOld {
            found: None,
            needed: MIN_SERVER_VERSION_GUARD,
        })
}

/// Connection errors that mean "a pooler rejected our startup options".
pub(super) fn startup_refusal(e: &SessionError) -> Option<Refusal> {
    e.message
        .contains("unsupported startup parameter")
        .then(|| Refusal::StartupOptionsIgnored {
            detail: e.message.clone(),
        })
}

/// Whether a failure says only that the server is not there yet (or not
/// any more): no answer from it (refused, reset, timed out, closed; or a
/// class 08 SQLSTATE, a connection exception, but 08004 and 08P01), or an
/// "operator intervention" SQLSTATE (class 57P: shutting down, starting up,
/// terminated by an administrator). Anything else the server answered (a
/// hot standby, too many connections, authentication) ends the window of
/// [`FAST_RECONNECT_CAP`]: each such attempt costs the server a backend.
fn server_not_there(reason: &Reason) -> bool {
    match reason {
        Reason::SessionEnded(None) | Reason::QueryTimeout => true,
        Reason::SessionEnded(Some(e)) => match e.code.as_deref() {
            None => !e.is_configuration(),
            // The server rejected the connection (08004) or broke the
            // protocol (08P01): it answered. The rest of class 08 is the
            // connection failing.
            Some("08004" | "08P01") => false,
            Some(code) => code.starts_with("57P") || code.starts_with("08"),
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::promotion::PromotionState;

    fn ended(code: Option<&str>) -> Reason {
        Reason::SessionEnded(code.map(|c| SessionError::server(c, "x")))
    }

    /// `n` backoffs in a row from a connector whose attempts keep failing.
    fn backoffs(c: &mut Connector, opts: &Options, now: Instant, n: usize) -> Vec<Duration> {
        (0..n)
            .map(|_| {
                c.failed(now, &ended(Some("28P01")));
                c.backoff(opts, now)
            })
            .collect()
    }

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_retry_interval_jittered_to_half() {
        let opts = Options::default();
        let now = Instant::now();
        let mut c = Connector::new(1);
        for (i, d) in backoffs(&mut c, &opts, now, 30).into_iter().enumerate() {
            let full = RECONNECT_BASE
                .saturating_mul(1 << i.min(20))
                .min(opts.retry_interval);
            assert!(d >= full / 2 && d <= full, "attempt {i}: {d:?} of {full:?}");
        }
    }

    #[test]
    fn a_ready_session_that_ends_reconnects_fast_until_the_window_ends() {
        let opts = Options::default();
        let now = Instant::now();
        let mut c = Connector::new(2);
        c.ready();
        c.failed(now, &ended(None));
        // The server is not there: it stays fast however often it fails.
        for _ in 0..10 {
            assert!(c.backoff(&opts, now) <= FAST_RECONNECT_CAP);
            c.failed(now, &ended(Some("57P01")));
        }
        // Past the window: doubling from the base again.
        let later = now + FAST_RECONNECT_WINDOW;
        assert!(c.backoff(&opts, later) <= RECONNECT_BASE);
        // A failure the server answered ends the window.
        let mut c = Connector::new(3);
        c.ready();
        c.failed(now, &ended(None));
        c.failed(now, &ended(Some("53300")));
        let ds = backoffs(&mut c, &opts, now, 12);
        assert!(ds.last().unwrap() > &FAST_RECONNECT_CAP, "{ds:?}");
        // The machine's own close opens no window.
        let mut c = Connector::new(4);
        c.ready();
        c.closed();
        c.failed(now, &ended(Some("53300")));
        assert!(backoffs(&mut c, &opts, now, 12).last().unwrap() > &FAST_RECONNECT_CAP);
    }

    #[test]
    fn what_counts_as_a_server_not_there() {
        assert!(server_not_there(&ended(None)));
        assert!(server_not_there(&Reason::QueryTimeout));
        assert!(server_not_there(&ended(Some("57P01"))));
        assert!(server_not_there(&ended(Some("08006"))));
        assert!(!server_not_there(&ended(Some("08004"))));
        assert!(!server_not_there(&ended(Some("08P01"))));
        assert!(!server_not_there(&ended(Some("53300"))));
        assert!(!server_not_there(&Reason::SessionEnded(Some(
            SessionError::config("tls")
        ))));
    }

    #[test]
    fn each_session_and_statement_gets_the_next_id_and_sessions_their_own_nonce() {
        let mut c = Connector::new(5);
        let (a, b) = (c.next_session(), c.next_session());
        assert_eq!((a, b), (SessionId(0), SessionId(1)));
        assert_ne!(c.nonce(a), c.nonce(b));
        assert_eq!(c.nonce(a), Connector::new(5).nonce(a), "the seed fixes it");
        let now = Instant::now();
        assert_eq!(c.next_query(now), QueryId(0));
        assert_eq!(c.next_watch_query(), QueryId(1));
        assert_eq!(
            c.last_sent(),
            Some(now),
            "a watch statement is not a send of the session"
        );
    }

    #[test]
    fn settings_go_at_startup_until_a_pooler_rejects_them_then_by_statement() {
        let (opts, knobs) = (Options::default(), Knobs::default());
        let mut c = Connector::new(6);
        let startup = c.params(&opts, &knobs).startup_settings;
        assert!(startup.iter().any(|(n, _)| *n == "idle_session_timeout"));
        assert!(c.setup_settings(&opts, &knobs).is_empty());
        c.fall_back_to_statements();
        assert!(c.params(&opts, &knobs).startup_settings.is_empty());
        assert_eq!(c.setup_settings(&opts, &knobs), startup);
    }

    fn good_setup(opts: &Options, nonce: i64) -> SetupReply {
        let tcp = opts.tcp_settings();
        SetupReply {
            server_version: 150_000,
            in_recovery: false,
            backend_pid: 100,
            idle_session_timeout_ms: Some(opts.guard_timeout().as_millis() as i64),
            tcp_settings: tcp.map(|(_, v)| Some(v)),
            unix_socket: false,
            nonce: Some(nonce),
            search_path_catalog: true,
            promotion: PromotionState::default(),
            server_clock_us: Some(0),
        }
    }

    fn refused(r: Result<(), SetupProblem>) -> String {
        match r {
            Err(SetupProblem::Refuse(refusal)) => refusal.to_string(),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_setup_passes_only_with_every_setting_as_asked() {
        let (opts, knobs) = (Options::default(), Knobs::default());
        let ok = good_setup(&opts, 9);
        assert!(check_setup(&opts, &knobs, 9, &ok).is_ok());
        let old = SetupReply {
            server_version: MIN_SERVER_VERSION_GUARD - 1,
            ..ok.clone()
        };
        assert!(matches!(
            check_setup(&opts, &knobs, 9, &old),
            Err(SetupProblem::Refuse(Refusal::ServerTooOld { .. }))
        ));
        let standby = SetupReply {
            in_recovery: true,
            ..ok.clone()
        };
        assert!(matches!(
            check_setup(&opts, &knobs, 9, &standby),
            Err(SetupProblem::InRecovery)
        ));
        assert!(refused(check_setup(&opts, &knobs, 8, &ok)).contains("8 was set"));
        let path = SetupReply {
            search_path_catalog: false,
            ..ok.clone()
        };
        assert!(refused(check_setup(&opts, &knobs, 9, &path)).contains("search_path"));
        let guard = SetupReply {
            idle_session_timeout_ms: Some(0),
            ..ok.clone()
        };
        assert!(refused(check_setup(&opts, &knobs, 9, &guard)).contains("idle_session_timeout"));
        let mut tcp = ok.clone();
        tcp.tcp_settings[0] = Some(0);
        assert!(refused(check_setup(&opts, &knobs, 9, &tcp)).contains("tcp_user_timeout"));
        // Over a Unix socket the server ignores the TCP settings.
        let unix = SetupReply {
            unix_socket: true,
            ..tcp
        };
        assert!(check_setup(&opts, &knobs, 9, &unix).is_ok());
    }
}
