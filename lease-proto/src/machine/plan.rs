//! What the session sends next: the obligations (a verify owed, a try owed
//! now) and the heartbeat's turn (never twice in a row while a try is due;
//! every [`VERIFY_EVERY`]th one a verify). The order itself is the
//! machine's `next_statement`: verification, then releases, then the
//! heartbeat, then the standby try, then a wait on the server.

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

/// The obligations and turns of the statements to come.
#[derive(Debug, Default)]
pub(super) struct SendPlan {
    /// An obligation, not a state: a try's outcome is unknown (it failed, or
    /// its reply broke the rules), so the next statement on this session is
    /// a verify (a heartbeat that reads `pg_locks`), before any release or
    /// try. It holds whatever statement is in flight, and ends with the
    /// verify's reply or the session.
    verify: bool,
    /// An obligation, not a state: try the standbys at the next chance,
    /// without waiting for [`Deadline::Retry`](super::Deadline::Retry) (a new run,
    /// a session just ready, a handover notification). Kept apart from the
    /// retry deadline, which it must not move.
    try_now: bool,
    /// The last statement chosen was a heartbeat: a due try goes first next,
    /// so a round trip longer than the heartbeat interval cannot starve the
    /// standbys (the heartbeat is due again at every reply).
    heartbeat_last: bool,
    /// Heartbeats since the last verify (see [`VERIFY_EVERY`]).
    unverified: u32,
}

/// A heartbeat's kind, on its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Beat {
    /// The steady heartbeat: the same live session answers.
    Heartbeat,
    /// The periodic verify: what `pg_locks` shows the session holds.
    Verify,
}

impl SendPlan {
    /// A try's outcome is unknown: verify first.
    pub(super) fn owe_verify(&mut self) {
        self.verify = true;
    }

    pub(super) fn verify_owed(&self) -> bool {
        self.verify
    }

    /// A verify answered.
    pub(super) fn verified(&mut self) {
        self.verify = false;
        self.unverified = 0;
    }

    /// Try the standbys at the next chance.
    pub(super) fn try_soon(&mut self) {
        self.try_now = true;
    }

    pub(super) fn try_owed(&self) -> bool {
        self.try_now
    }

    /// The try goes out (or had nothing to try).
    pub(super) fn tried(&mut self) {
        self.try_now = false;
    }

    /// Whether the heartbeat may go before a due try: not twice in a row
    /// while standbys wait for one.
    pub(super) fn heartbeat_may_go(&self, try_due: bool, standbys_wait: bool) -> bool {
        !(try_due && self.heartbeat_last && standbys_wait)
    }

    /// The heartbeat's turn: which one it is.
    pub(super) fn heartbeat(&mut self) -> Beat {
        self.heartbeat_last = true;
        self.unverified += 1;
        if self.unverified >= VERIFY_EVERY {
            Beat::Verify
        } else {
            Beat::Heartbeat
        }
    }

    /// Anything but a heartbeat was chosen (or nothing).
    pub(super) fn not_heartbeat(&mut self) {
        self.heartbeat_last = false;
    }

    /// What ends with any session, and with a session given up on.
    pub(super) fn session_down(&mut self) {
        self.verify = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verify_every_th_heartbeat_is_a_verify() {
        let mut plan = SendPlan::default();
        let beats: Vec<Beat> = (0..2 * VERIFY_EVERY).map(|_| plan.heartbeat()).collect();
        let verifies = beats.iter().filter(|b| **b == Beat::Verify).count();
        assert_eq!(beats[VERIFY_EVERY as usize - 1], Beat::Verify);
        // Without an answered verify, every later turn stays a verify.
        assert_eq!(verifies, VERIFY_EVERY as usize + 1);
        plan.verified();
        assert_eq!(plan.heartbeat(), Beat::Heartbeat);
    }

    #[test]
    fn a_verify_owed_holds_until_answered_or_the_session_ends() {
        let mut plan = SendPlan::default();
        assert!(!plan.verify_owed());
        plan.owe_verify();
        plan.heartbeat();
        plan.tried();
        assert!(plan.verify_owed(), "only a verify's answer pays it");
        plan.verified();
        assert!(!plan.verify_owed());
        plan.owe_verify();
        plan.session_down();
        assert!(
            !plan.verify_owed(),
            "nothing is owed to a session that ended"
        );
    }

    #[test]
    fn the_heartbeat_never_goes_twice_in_a_row_before_a_due_try() {
        let mut plan = SendPlan::default();
        assert!(plan.heartbeat_may_go(true, true));
        plan.heartbeat();
        assert!(!plan.heartbeat_may_go(true, true), "the try goes first");
        assert!(plan.heartbeat_may_go(false, true), "no try due");
        assert!(plan.heartbeat_may_go(true, false), "no standby waits");
        plan.not_heartbeat();
        assert!(plan.heartbeat_may_go(true, true));
    }

    #[test]
    fn a_try_owed_is_paid_by_the_try() {
        let mut plan = SendPlan::default();
        plan.try_soon();
        assert!(plan.try_owed());
        plan.heartbeat();
        assert!(plan.try_owed(), "a heartbeat does not pay it");
        plan.tried();
        assert!(!plan.try_owed());
    }
}
