//! What happens to the session: opening, replies, loss, refusal, closing.

use std::time::Instant;

use super::state::{InFlight, Release, RunState, Session, Stage, StandbyStep, Stopping, Up, What};
use super::{LastError, Machine, Phase, Timer, MIN_SERVER_VERSION, MIN_SERVER_VERSION_GUARD};
use crate::io::*;
use crate::sql::{HeartbeatReply, Row, SetupReply, Statement, TryReply, VerifyReply};

impl Machine {
    /// Asks the driver for a new connection.
    pub(super) fn open(&mut self, now: Instant) {
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
        self.session = Session::Connecting { id };
        self.timers.stop(Timer::Backoff);
        self.timers
            .set(Timer::Connect, now + self.opts.query_timeout);
    }

    pub(super) fn session_opened(&mut self, now: Instant, session: SessionId) {
        if !matches!(self.session, Session::Connecting { id } if id == session) {
            return;
        }
        self.timers.stop(Timer::Connect);
        let nonce = self.nonce(session);
        self.session = Session::Up(Up {
            id: session,
            nonce,
            stage: Stage::SettingUp,
            inflight: None,
        });
        self.send(now, What::Setup);
    }

    pub(super) fn session_lost(
        &mut self,
        now: Instant,
        session: SessionId,
        error: Option<DbError>,
    ) {
        if self.session_id() != Some(session) {
            return;
        }
        // PostgreSQL 13 and older do not know the server guard's setting.
        if let Some(refusal) = error.as_ref().and_then(guard_unsupported) {
            return self.refuse(now, refusal);
        }
        match error.as_ref().and_then(startup_refusal) {
            // A session-mode pooler: the settings go into the setup statement
            // (verified there like startup options); try again at once.
            Some(_) if !self.settings_by_statement => {
                self.settings_by_statement = true;
                self.event(Event::StartupOptionsRejected {
                    session,
                    error: error.clone().unwrap_or_else(|| DbError::other("")),
                });
                self.lose_session(now, Reason::SessionLost(error), false);
                self.failures = 0;
                self.timers.stop(Timer::Backoff);
                self.session = Session::Idle;
            }
            Some(refusal) => self.refuse(now, refusal),
            None => {
                let connecting = matches!(self.session, Session::Connecting { .. });
                let config = error.clone().filter(DbError::is_configuration);
                self.lose_session(now, Reason::SessionLost(error), false);
                match config {
                    // Never had a session: the configuration is wrong, not
                    // the network. Say so to every run instead of retrying
                    // in silence.
                    Some(e) if connecting && !self.ever_ready => {
                        let ids: Vec<RunId> = self.runs.keys().copied().collect();
                        for id in ids {
                            self.stop_run(
                                id,
                                Outcome::Config(e.clone()),
                                Reason::SessionLost(Some(e.clone())),
                            );
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    pub(super) fn reply(
        &mut self,
        now: Instant,
        query: QueryId,
        result: Result<Vec<Row>, DbError>,
    ) {
        let Session::Up(up) = &mut self.session else {
            return;
        };
        let Some(q) = up.inflight.take_if(|q| q.id == query) else {
            return;
        };
        #[cfg(feature = "sim")] // Test-only: `Options::mutation`; `sent` otherwise.
        let q = InFlight {
            sent: self.opts.confirm_time(q.sent, now),
            ..q
        };
        self.timers.stop(Timer::Query);
        match (q.what, result) {
            (What::Setup, Ok(rows)) => match SetupReply::parse(&rows) {
                Ok(setup) => self.setup_done(now, setup),
                Err(e) => self.lose_session(now, malformed(e), true),
            },
            (What::Probe, Ok(rows)) => match HeartbeatReply::parse(&rows) {
                Ok(probe) => self.probe_done(now, probe),
                Err(e) => self.lose_session(now, malformed(e), true),
            },
            // The settings by statement (behind a pooler): the same as at startup.
            (What::Setup, Err(error)) if guard_unsupported(&error).is_some() => {
                let refusal = guard_unsupported(&error).expect("just matched");
                self.refuse(now, refusal)
            }
            (What::Listen, Ok(_)) => {
                if let Session::Up(up) = &mut self.session {
                    if let Stage::Listening { backend_pid } = up.stage {
                        up.stage = Stage::Ready { backend_pid };
                    }
                    self.try_now = true;
                }
            }
            (What::Try(keys), Ok(rows)) => {
                let reply = TryReply::parse(&keys, &rows);
                self.try_done(now, q.sent, &keys, reply)
            }
            (What::Try(keys), Err(error)) => {
                // "Maybe acquired": the statement may have taken some locks.
                self.event(Event::TryFailed { error });
                self.try_back(&keys);
                self.verify = true;
                let retry = now + self.jittered_retry();
                self.timers.set(Timer::Retry, retry);
            }
            (What::Heartbeat, Ok(rows)) => match HeartbeatReply::parse(&rows) {
                Ok(heartbeat) => self.heartbeat_done(now, q.sent, heartbeat),
                Err(e) => self.lose_session(now, malformed(e), true),
            },
            (What::Verify, Ok(rows)) => match VerifyReply::parse(&rows) {
                Ok(verify) => self.verify_done(now, q.sent, verify),
                Err(e) => self.lose_session(now, malformed(e), true),
            },
            (What::Wait { key, chunk, .. }, result) => self.wait_done(now, key, chunk, result),
            // The rows do not matter: see `ReleaseReply`.
            (What::Release(keys), Ok(_)) => {
                for key in keys {
                    let Some(&id) = self.keys.get(&key) else {
                        continue;
                    };
                    if let Some(RunState::Releasing {
                        outcome,
                        release: Release::Sent,
                    }) = self.runs.get(&id).map(|r| &r.state)
                    {
                        let outcome = outcome.clone();
                        self.released(id, outcome);
                    }
                }
            }
            // A probe that failed proves nothing: the session is not used;
            // the next one probes again after a backoff.
            (
                What::Setup
                | What::Probe
                | What::Listen
                | What::Heartbeat
                | What::Verify
                | What::Release(_),
                Err(error),
            ) => {
                // State on the server unknown: drop the session, which releases everything.
                self.lose_session(now, Reason::QueryFailed(error), true)
            }
        }
    }

    fn setup_done(&mut self, now: Instant, setup: SetupReply) {
        let needed = if self.opts.server_guard {
            MIN_SERVER_VERSION_GUARD
        } else {
            MIN_SERVER_VERSION
        };
        if setup.server_version < needed {
            let found = Some(setup.server_version);
            return self.refuse(now, Refusal::ServerTooOld { found, needed });
        }
        if setup.in_recovery {
            // Often a failover in progress: not final. Back off and try again
            // (the driver's host list may lead elsewhere next time).
            let Some(session) = self.session_id() else {
                return;
            };
            self.event(Event::InRecovery { session });
            return self.lose_session(now, Reason::InRecovery, true);
        }
        let Session::Up(up) = &self.session else {
            return;
        };
        if setup.nonce != Some(up.nonce) {
            let detail = format!(
                "{} is {}, {} was set",
                crate::sql::NONCE_SETTING,
                setup.nonce.map_or("unset".into(), |n| n.to_string()),
                up.nonce
            );
            return self.refuse(now, Refusal::StartupOptionsIgnored { detail });
        }
        if !setup.search_path_catalog {
            let detail = format!(
                "search_path is not {}, as was asked for",
                crate::sql::SEARCH_PATH
            );
            return self.refuse(now, Refusal::StartupOptionsIgnored { detail });
        }
        if self.opts.server_guard {
            let expected = self.opts.guard_timeout().as_millis() as i64;
            let found = setup.idle_session_timeout_ms;
            if found != Some(expected) {
                let detail = format!(
                    "idle_session_timeout is {} ms, {expected} ms was asked for",
                    found.map_or("unknown".into(), |f| f.to_string())
                );
                return self.refuse(now, Refusal::StartupOptionsIgnored { detail });
            }
        }
        // Over a Unix socket the server ignores (and reads back 0 for) TCP
        // settings; there is no TCP connection to give up on.
        if !setup.unix_socket && !self.tcp_settings_off {
            let asked = self.opts.tcp_settings();
            for ((name, expected), found) in asked.iter().zip(setup.tcp_settings) {
                if found != Some(*expected) {
                    let detail = format!(
                        "{name} is {}, {expected} was asked for",
                        found.map_or("unknown".into(), |f| f.to_string())
                    );
                    return self.refuse(now, Refusal::StartupOptionsIgnored { detail });
                }
            }
        }
        // A newly promoted primary: the old primary's holders may still act.
        #[cfg(feature = "sim")] // Test-only: the broken variant.
        let setup = SetupReply {
            promotion: match self.opts.mutation {
                Some(crate::options::Mutation::IgnorePromotion) => Default::default(),
                _ => setup.promotion,
            },
            ..setup
        };
        if let Some(hold) = setup.promotion.hold(self.opts.promotion_hold()) {
            self.promotion_hold = Some(now + hold);
            if let Some(session) = self.session_id() {
                self.event(Event::PromotionHold { session, hold });
            }
        }
        let (backend_pid, server_version) = (setup.backend_pid, setup.server_version);
        let probe = self.settings_by_statement && self.probes_for_pooler();
        let Session::Up(up) = &mut self.session else {
            return;
        };
        if probe {
            // Behind a pooler: is it a transaction pooler? See `probe_done`.
            up.stage = Stage::Probing {
                backend_pid,
                server_version,
            };
            return self.send(now, What::Probe);
        }
        self.session_ready(now, backend_pid, server_version);
    }

    /// Whether a setup whose settings went by statement is followed by the
    /// pooler probe (always, but under the test-only mutation).
    fn probes_for_pooler(&self) -> bool {
        #[cfg(feature = "sim")]
        if self.opts.mutation == Some(crate::sim::Mutation::NoPoolerProbe) {
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
        let Session::Up(up) = &self.session else {
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
        let Session::Up(up) = &mut self.session else {
            return;
        };
        let session = up.id;
        let listen = self.opts.notify_handover;
        up.stage = if listen {
            Stage::Listening { backend_pid }
        } else {
            Stage::Ready { backend_pid }
        };
        self.failures = 0;
        self.ever_ready = true;
        self.event(Event::SessionReady {
            session,
            backend_pid,
            server_version,
        });
        self.timers
            .set(Timer::Heartbeat, now + self.opts.heartbeat_interval);
        if listen {
            self.send(now, What::Listen);
        } else {
            self.try_now = true;
        }
    }

    fn try_done(&mut self, now: Instant, sent: Instant, tried: &[i64], reply: TryReply) {
        let Session::Up(up) = &self.session else {
            return;
        };
        let (nonce, pid) = (up.nonce, up.stage.backend_pid());
        match reply.session {
            None => {
                let e = DbError::other("malformed try reply: no session row");
                return self.lose_session(now, Reason::QueryFailed(e), true);
            }
            Some((found, _)) if Some(found) != pid => {
                let was = pid.unwrap_or(0);
                return self.refuse(now, Refusal::BackendChanged { was, now: found });
            }
            Some((_, found)) if found != Some(nonce) => {
                return self.refuse(now, shared(nonce, found));
            }
            Some(_) => {}
        }
        // This session never tries a key it holds (orphans aside): if its
        // own backend holds one, another client does.
        let own = (reply.not_won.iter())
            .find(|(key, holder)| *holder == pid && !self.orphans.contains(key));
        if let Some((key, _)) = own {
            let detail = format!("key {key} is held by this session's own backend");
            return self.refuse(now, Refusal::BackendShared { detail });
        }
        self.after_wake_try(!reply.won.is_empty());
        for &(key, token) in &reply.won {
            self.won(now, sent, key, token);
        }
        for &(key, holder) in &reply.not_won {
            self.not_won(key, holder);
        }
        let unanswered = reply.unanswered(tried);
        if reply.untrusted || !unanswered.is_empty() {
            // A key without an answer may have been taken: verify.
            self.try_back(&unanswered);
            self.verify = true;
        }
        let retry = now + self.jittered_retry();
        self.timers.set(Timer::Retry, retry);
    }

    /// Whether the session that answered a heartbeat, verify or wait is
    /// this one (same backend pid, same nonce); refuses the locker if not.
    pub(super) fn same_session(&mut self, now: Instant, reply: &HeartbeatReply) -> bool {
        let (expected, nonce) = match &self.session {
            Session::Up(up) => (up.stage.backend_pid(), up.nonce),
            _ => return false,
        };
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
            self.refuse(now, shared(nonce, reply.nonce));
            return false;
        }
        true
    }

    /// The steady heartbeat: the same live session answered, so it still
    /// holds every key it held when the statement was sent (a live session
    /// loses a session-level advisory lock only by its own unlock, which the
    /// machine sends only as a [`Statement::Release`] that ends the run or
    /// the session, or by ending). Every held lease is confirmed from `sent`.
    fn heartbeat_done(&mut self, now: Instant, sent: Instant, reply: HeartbeatReply) {
        if !self.same_session(now, &reply) {
            return;
        }
        for r in self.runs.values_mut() {
            if let RunState::Leading(h) | RunState::Stopping(Stopping::Held { held: h, .. }) =
                &mut r.state
            {
                h.confirmed = sent;
            }
        }
        self.update_validity();
        self.heartbeat_again(now, sent);
    }

    /// The verify: what the session holds according to `pg_locks`. A held
    /// lease not in it is lost; a key in it that no run holds is unlocked.
    fn verify_done(&mut self, now: Instant, sent: Instant, reply: VerifyReply) {
        if !self.same_session(now, &reply.session) {
            return;
        }
        self.verify = false;
        self.unverified_heartbeats = 0;
        let held = reply.held;
        let mut lost = Vec::new();
        for (id, r) in &mut self.runs {
            let in_reply = held.contains(&r.lease.key());
            match &mut r.state {
                RunState::Leading(h) | RunState::Stopping(Stopping::Held { held: h, .. })
                    if in_reply =>
                {
                    h.confirmed = sent
                }
                RunState::Leading(_) | RunState::Stopping(Stopping::Held { .. }) => lost.push(*id),
                _ => {}
            }
        }
        self.update_validity();
        for id in lost {
            self.lose_lease(id, Reason::NotHeld);
        }
        for key in held {
            let state = (self.keys.get(&key))
                .and_then(|id| self.runs.get(id))
                .map(|r| &r.state);
            match state {
                Some(
                    RunState::Leading(_)
                    | RunState::Stopping(Stopping::Held { .. })
                    | RunState::Releasing { .. },
                ) => continue,
                // Held, but its run lost it and its cancelled job still runs:
                // unlock only after the job has returned.
                Some(RunState::Stopping(Stopping::Lost { .. })) => {
                    self.held_lost.insert(key);
                    continue;
                }
                Some(RunState::Standby(_)) | None => {}
            }
            if self.orphans.insert(key) {
                self.event(Event::UnknownKeyReleased { key });
            }
        }
        self.heartbeat_again(now, sent);
    }

    /// The next heartbeat is due a heartbeat interval after `sent`.
    fn heartbeat_again(&mut self, now: Instant, sent: Instant) {
        let next = (sent + self.opts.heartbeat_interval).max(now);
        self.timers.set(Timer::Heartbeat, next);
    }

    /// The session is gone (or is being closed by us): every lease on it is lost.
    /// With `close`, the machine gives up on it itself: if jobs on it still
    /// run, it is kept open instead (see `doubtful`) and closed later.
    pub(super) fn lose_session(&mut self, now: Instant, reason: Reason, close: bool) {
        let Some(session) = self.session_id() else {
            return;
        };
        if close && self.keep_doubtful(now, session, &reason) {
            return;
        }
        if close {
            self.session_command(SessionCommand::Close { session });
        }
        let connecting = matches!(self.session, Session::Connecting { .. });
        if let Some(error) = reason_error(&reason, connecting, self.opts.query_timeout) {
            // A refusal is final and has its own event: not a failed attempt to retry.
            if connecting && !matches!(reason, Reason::Refused(_)) {
                self.event(Event::ConnectFailed {
                    session,
                    error: error.clone(),
                    configuration: error.is_configuration(),
                    failures: self.failures.saturating_add(1),
                    retried: self.ever_ready || !error.is_configuration(),
                });
            }
            self.last_error = Some(LastError {
                at: now,
                error,
                connecting,
            });
        }
        // A doubtful session's loss was reported when the machine gave up
        // on it; a session that never opened was not lost.
        if !matches!(self.session, Session::Doubtful { .. }) && !connecting {
            self.event(Event::SessionLost {
                session,
                reason: reason.clone(),
            });
        }
        let ids: Vec<RunId> = self.runs.keys().copied().collect();
        for id in ids {
            let Some(r) = self.runs.get_mut(&id) else {
                continue;
            };
            match &mut r.state {
                RunState::Standby(standby) => standby.step = StandbyStep::Waiting,
                RunState::Leading(_) | RunState::Stopping(Stopping::Held { .. }) => {
                    self.lose_lease(id, reason.clone())
                }
                // The session's end released the key.
                RunState::Releasing { outcome, .. } => {
                    let outcome = outcome.clone();
                    self.released(id, outcome);
                }
                RunState::Stopping(Stopping::Lost { .. }) => {}
            }
        }
        self.session_down();
        self.failures = self.failures.saturating_add(1);
        self.session = Session::Backoff;
        let backoff = now + self.backoff();
        self.timers.set(Timer::Backoff, backoff);
    }

    pub(super) fn refuse(&mut self, now: Instant, refusal: Refusal) {
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

    /// Closes the session because no run needs it.
    pub(super) fn close_idle(&mut self, session: SessionId) {
        self.session_command(SessionCommand::Close { session });
        self.event(Event::SessionIdle { session });
        self.session_down();
        self.session = Session::Idle;
        self.failures = 0;
        self.timers.stop(Timer::Backoff);
    }

    /// Closes a session that holds nothing and blocks in a wait, for a new
    /// one that opens at once (see `wait`).
    pub(super) fn close_for_new_session(&mut self, session: SessionId) {
        self.session_command(SessionCommand::Close { session });
        self.session_down();
        self.session = Session::Idle;
        self.timers.stop(Timer::Backoff);
    }

    /// What ends with any session.
    fn session_down(&mut self) {
        self.orphans.clear();
        self.held_lost.clear();
        self.verify = false;
        self.woken = false;
        self.waits_off = false;
        self.wait_notified = None;
        self.wait_limit = None;
        self.promotion_hold = None;
        self.timers.stop(Timer::Connect);
        self.timers.stop(Timer::Query);
        self.timers.stop(Timer::Heartbeat);
        self.timers.stop(Timer::DeferredClose);
    }

    /// Sends a statement on the session that is up.
    pub(super) fn send(&mut self, now: Instant, what: What) {
        let id = QueryId(self.next_query);
        self.next_query += 1;
        let nonce = match &self.session {
            Session::Up(up) => up.nonce,
            _ => 0,
        };
        let statement = match &what {
            What::Setup => Statement::Setup {
                nonce,
                settings: if self.settings_by_statement {
                    self.settings()
                } else {
                    Vec::new()
                },
            },
            What::Listen => Statement::Listen,
            // The backend pid and the nonce, read on the second connection.
            What::Probe => Statement::Heartbeat,
            What::Try(keys) => Statement::TryLock {
                keys: keys.clone(),
                backend_pid: match &self.session {
                    Session::Up(up) => up.stage.backend_pid().unwrap_or(0),
                    _ => 0,
                },
                nonce,
            },
            What::Heartbeat => Statement::Heartbeat,
            What::Verify => Statement::Verify,
            What::Wait { key, timeout, .. } => Statement::Wait {
                key: *key,
                timeout_ms: timeout.as_millis().max(1) as u64,
            },
            What::Release(keys) => Statement::Release {
                keys: keys.clone(),
                notify: self.opts.notify_handover,
            },
        };
        // A wait blocks by design, up to its lock timeout.
        let blocks = match &what {
            What::Wait { timeout, .. } => *timeout,
            _ => std::time::Duration::ZERO,
        };
        let deadline = now + blocks + self.opts.query_timeout;
        let Session::Up(up) = &mut self.session else {
            return;
        };
        let probe = matches!(what, What::Probe);
        up.inflight = Some(InFlight {
            id,
            sent: now,
            what,
        });
        self.timers.set(Timer::Query, deadline);
        self.last_sent = Some(now);
        self.session_command(if probe {
            SessionCommand::Probe {
                query: id,
                statement,
            }
        } else {
            SessionCommand::Query {
                query: id,
                statement,
            }
        });
    }

    pub(super) fn session_id(&self) -> Option<SessionId> {
        match &self.session {
            Session::Idle | Session::Backoff => None,
            Session::Connecting { id } => Some(*id),
            Session::Up(up) => Some(up.id),
            Session::Doubtful { id, .. } => Some(*id),
        }
    }

    /// The settings of every lease session, as `(name, value)`.
    fn settings(&self) -> Vec<(&'static str, String)> {
        // Nothing of the role's own may shadow a name of the statements. (No
        // `synchronous_commit`: no statement writes WAL, fencing tokens come
        // from the server's clock; see `Statement::TryLock`.)
        let mut settings = vec![("search_path", crate::sql::SEARCH_PATH.to_string())];
        if self.opts.server_guard {
            let ms = self.opts.guard_timeout().as_millis();
            settings.push(("idle_session_timeout", format!("{ms}")));
        }
        // The server must not give up on a silent client before the guard.
        if !self.tcp_settings_off {
            for (name, value) in self.opts.tcp_settings() {
                settings.push((name, value.to_string()));
            }
        }
        settings
    }

    fn session_params(&self) -> SessionParams {
        let startup_settings = if self.settings_by_statement {
            Vec::new()
        } else {
            self.settings()
        };
        SessionParams { startup_settings }
    }
}

/// A reply that breaks its statement's rules: the session's state is unknown.
fn malformed(e: crate::sql::ReplyError) -> Reason {
    Reason::QueryFailed(DbError::other(e.to_string()))
}

/// The error a session loss (or a failed connection attempt) records as the
/// last error; `None` for the machine's own choices (shutdown, close).
fn reason_error(
    reason: &Reason,
    connecting: bool,
    timeout: std::time::Duration,
) -> Option<DbError> {
    Some(match reason {
        Reason::SessionLost(Some(e)) | Reason::QueryFailed(e) => e.clone(),
        Reason::SessionLost(None) if connecting => {
            DbError::other("the connection closed during startup")
        }
        Reason::QueryTimeout if connecting => DbError::other(format!(
            "connection attempt timed out after {} ms",
            timeout.as_millis()
        )),
        Reason::Shutdown | Reason::Closed => return None,
        other => DbError::other(other.to_string()),
    })
}

/// Another nonce than this session's was read back.
fn shared(nonce: i64, found: Option<i64>) -> Refusal {
    let found = found.map_or("unset".into(), |n| n.to_string());
    Refusal::BackendShared {
        detail: format!("{} is {found}, {nonce} was set", crate::sql::NONCE_SETTING),
    }
}

/// The server rejected the server guard's `idle_session_timeout` as an unknown setting
/// (SQLSTATE 42704, in the startup packet or in the setup's `set_config`): it is older than
/// PostgreSQL 14, which brought the setting. Final, like the setup's version check.
fn guard_unsupported(e: &DbError) -> Option<Refusal> {
    (e.code.as_deref() == Some("42704") && e.message.contains("\"idle_session_timeout\""))
        .then_some(Refusal::ServerTooOld {
            found: None,
            needed: super::MIN_SERVER_VERSION_GUARD,
        })
}

/// Connection errors that mean "a pooler rejected our startup options".
fn startup_refusal(e: &DbError) -> Option<Refusal> {
    e.message
        .contains("unsupported startup parameter")
        .then(|| Refusal::StartupOptionsIgnored {
            detail: e.message.clone(),
        })
}
