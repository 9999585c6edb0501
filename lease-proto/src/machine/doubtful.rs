//! The one rule for a session the machine gives up on itself (issue 11,
//! hole 3): keep it, and so its locks, until every job on it has returned.
//!
//! When a statement times out, fails or breaks its rules, or a lease's
//! validity ends, the machine no longer trusts the session: every lease on
//! it is lost and every job cancelled at once. But closing the connection
//! then would let the server free the keys while a cancelled job may still
//! act. Keeping the session open costs nothing: its locks still exclude
//! every other session. So the session becomes *doubtful*
//! ([`Session::Doubtful`]):
//!
//! - its leases are lost (jobs cancelled at once, as for any lost session);
//! - nothing is sent on it, and a statement in flight is ignored when it
//!   answers: the session is never treated as healthy again;
//! - no run acquires on it (no try is sent), and a new session for the
//!   standbys opens only after it is closed;
//! - it is closed as soon as no cancelled job is left running, and at the
//!   latest at [`Timer::DeferredClose`]: the send time of its last statement
//!   plus [`Options::guard_timeout`](crate::Options::guard_timeout)
//!   (`idle_session_timeout`), the first moment the server could free its
//!   keys anyway. A job that outlives that deadline is not protected by the
//!   session either way.
//!
//! Without the server guard the server would never free the keys of a
//! silent session, so waiting longer would be possible; the machine still
//! closes at the same deadline, so that a job that ignores its cancellation
//! cannot keep the machine's standbys (other keys) without a session for
//! ever. The promise is the same with and without the guard: a cancelled job
//! that returns within the guard margin of its lease's validity end is never
//! seen beside another holder.
//!
//! A session ended by the server or the connection
//! ([`Input::SessionLost`](crate::Input::SessionLost)) is gone at once: it is
//! never doubtful. Neither is one that holds no job: it is closed at once.

use std::time::Instant;

use super::state::{RunState, Session, Stage, StandbyStep};
use super::{Machine, Timer};
use crate::io::{Event, Reason, RunId, SessionId};

impl Machine {
    /// The machine gives up on `session` for `reason`. Returns whether the
    /// session is kept as doubtful; if not, the caller closes it at once.
    pub(super) fn keep_doubtful(
        &mut self,
        now: Instant,
        session: SessionId,
        reason: &Reason,
    ) -> bool {
        if self.close_doubtful_at_once {
            return false;
        }
        // Only a ready session can hold keys for jobs.
        let Session::Up(up) = &self.session else {
            return false;
        };
        if !matches!(up.stage, Stage::Ready { .. }) || !self.any_job_running() {
            return false;
        }
        let close_by = self.last_sent.unwrap_or(now) + self.opts.guard_timeout();
        if close_by <= now {
            // Past the deadline already (the process was frozen): the server
            // may have freed the keys; keeping the session protects nothing.
            return false;
        }
        self.event(Event::SessionLost {
            session,
            reason: reason.clone(),
        });
        self.session = Session::Doubtful {
            id: session,
            reason: reason.clone(),
        };
        self.verify = false;
        self.timers.stop(Timer::Query);
        self.timers.stop(Timer::Heartbeat);
        self.timers.set(Timer::DeferredClose, close_by);
        let ids: Vec<_> = self.runs.keys().copied().collect();
        for id in ids {
            // A try in flight is never answered now; standbys wait for the
            // next session.
            self.try_back_run(id);
            self.lose_lease(id, reason.clone());
        }
        true
    }

    /// Closes the doubtful session once no job is left running or its
    /// deadline has passed. Called by the pump after every input.
    pub(super) fn close_doubtful_when_done(&mut self, now: Instant) {
        let Session::Doubtful { reason, .. } = &self.session else {
            return;
        };
        if self.any_job_running() && !self.timers.expired(Timer::DeferredClose, now) {
            return;
        }
        let reason = reason.clone();
        self.lose_session(now, reason, true);
    }

    /// Whether a job has not returned: leading, or cancelled and stopping.
    fn any_job_running(&self) -> bool {
        self.runs
            .values()
            .any(|r| matches!(r.state, RunState::Leading(_) | RunState::Stopping(_)))
    }

    /// Sets `id` back to waiting if it is a standby in the try in flight.
    fn try_back_run(&mut self, id: RunId) {
        if let Some(r) = self.runs.get_mut(&id) {
            if let RunState::Standby(standby) = &mut r.state {
                standby.step = StandbyStep::Waiting;
            }
        }
    }
}
