//! The session's life, from open to close, in one place: how a session
//! opens, what its setup must pass (the checks themselves: `session`), the
//! pooler probe behind a pooler, when it is ready, and how it ends: lost
//! (the server or the connection ended it), given up on (kept as doubtful
//! while cancelled jobs run, see `doubtful`), refused for good, or closed
//! because no run needs it (when: `pump`). It combines the session, the
//! connector, the runs, the deadlines and every component's
//! `session_down`, so it is an `impl Machine` block. The machine's
//! [`Phase`] lives here too: a refusal ends it for good.

use std::time::Instant;

use super::deadline::Deadline;
use super::doubtful;
#[cfg(feature = "sim")]
use super::knobs::Mutation;
use super::session::{self, check_setup, InFlight, Session, SetupProblem, Stage, Up, What};
use super::status::LastError;
use super::{Machine, Phase};
use crate::io::{Event, Outcome, Reason, Refusal, SessionCommand, SessionError, SessionId};
use crate::sql::{HeartbeatReply, SetupReply};

impl Machine {
    /// Asks the driver for a new connection.
    pub(super) fn open(&mut self, now: Instant) {
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

    pub(super) fn session_opened(&mut self, now: Instant, session: SessionId) {
        if !matches!(self.session, Session::Connecting { id } if id == session) {
            return;
        }
        self.timers.stop(Deadline::Connect);
        let nonce = self.connector.nonce(session);
        self.session = Session::Up(Up::new(session, nonce));
        self.send(now, What::Setup);
    }

    pub(super) fn session_lost(
        &mut self,
        now: Instant,
        session: SessionId,
        error: Option<SessionError>,
    ) {
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
    pub(super) fn lose_session(&mut self, now: Instant, reason: Reason, close: bool) {
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
    pub(super) fn close_doubtful_when_done(&mut self, now: Instant) {
        let Session::Doubtful { reason, .. } = &self.session else {
            return;
        };
        if self.runs.any_job_running() && !self.timers.expired(Deadline::DeferredClose, now) {
            return;
        }
        let reason = reason.clone();
        self.lose_session(now, reason, true);
    }

    pub(super) fn refuse(&mut self, now: Instant, refusal: Refusal) {
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
    pub(super) fn close_idle(&mut self, session: SessionId) {
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
    pub(super) fn close_for_new_session(&mut self, session: SessionId) {
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
    pub(super) fn send(&mut self, now: Instant, what: What) {
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

    pub(super) fn setup_done(&mut self, now: Instant, sent: Instant, setup: SetupReply) {
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
    pub(super) fn probe_done(&mut self, now: Instant, reply: HeartbeatReply) {
        match self.session.up().and_then(|up| up.probe_verdict(&reply)) {
            None => {}
            Some(Err(refusal)) => self.refuse(now, refusal),
            Some(Ok((backend_pid, server_version))) => {
                self.session_ready(now, backend_pid, server_version)
            }
        }
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

    /// The `LISTEN` answered: the session is ready, and the standbys try.
    pub(super) fn listening(&mut self) {
        if let Some(up) = self.session.up_mut() {
            if let Stage::Listening { backend_pid } = up.stage {
                up.stage = Stage::Ready { backend_pid };
            }
            self.plan.try_soon();
        }
    }
}
