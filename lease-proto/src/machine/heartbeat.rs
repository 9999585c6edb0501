//! The steady proof of the session: a heartbeat's or a verify's reply
//! confirms every held lease from its statement's send time, once the
//! same backend with the same nonce answered it (the check every reply
//! that proves the session passes: `Up::same_backend`); the next heartbeat
//! is due an interval after that send. It confirms the runs, reads the
//! server's clock and refuses the locker on a changed backend, so it is an
//! `impl Machine` block.

use std::time::Instant;

use super::deadline::Deadline;
use super::Machine;
use crate::sql::{HeartbeatReply, VerifyReply};

impl Machine {
    /// Whether the session that answered a heartbeat, verify or wait is
    /// this one (same backend pid, same nonce); refuses the locker if not.
    pub(super) fn same_session(&mut self, now: Instant, reply: &HeartbeatReply) -> bool {
        let Some(up) = self.session.up() else {
            return false;
        };
        match up.same_backend(reply) {
            Ok(()) => true,
            Err(refusal) => {
                self.refuse(now, refusal);
                false
            }
        }
    }

    /// The steady heartbeat: the same live session answered, so it still
    /// holds every key it held when the statement was sent (a live session
    /// loses a session-level advisory lock only by its own unlock, which the
    /// machine sends only as a [`Statement::Release`](crate::Statement::Release)
    /// that ends the run or the session, or by ending). Every held lease is
    /// confirmed from `sent`.
    pub(super) fn heartbeat_done(&mut self, now: Instant, sent: Instant, reply: HeartbeatReply) {
        if !self.same_session(now, &reply) {
            return;
        }
        self.server_clock_read(sent, now, reply.server_clock_us);
        self.runs.confirm_all(sent);
        self.heartbeat_again(now, sent);
    }

    /// The verify: what the session holds according to `pg_locks`. A held
    /// lease not in it is lost; a key in it that no run holds is unlocked.
    pub(super) fn verify_done(&mut self, now: Instant, sent: Instant, reply: VerifyReply) {
        if !self.same_session(now, &reply.session) {
            return;
        }
        self.server_clock_read(sent, now, reply.session.server_clock_us);
        self.plan.verified();
        self.runs.verified(sent, reply.held, &mut self.out);
        self.heartbeat_again(now, sent);
    }

    /// A reading of the server's clock by a statement of the session that is
    /// up (the rule: the `clock` module); a step back is reported.
    pub(super) fn server_clock_read(
        &mut self,
        sent: Instant,
        now: Instant,
        server_us: Option<i64>,
    ) {
        let session = self.session.up().map(|up| up.id);
        let stepped = (self.server_clock).read(&self.opts, session, (sent, now), server_us);
        if let Some(event) = stepped {
            self.out.event(event);
        }
    }

    /// The next heartbeat is due a heartbeat interval after `sent`.
    pub(super) fn heartbeat_again(&mut self, now: Instant, sent: Instant) {
        let next = (sent + self.opts.heartbeat_interval).max(now);
        self.timers.set(Deadline::Heartbeat, next);
    }
}
