//! Every deadline of the machine in one table.

use std::time::Instant;

/// A deadline of the machine: which one [`Machine::poll_timeout`] stands
/// for, from [`Machine::timeout_reason`].
///
/// [`Machine::poll_timeout`]: crate::Machine::poll_timeout
/// [`Machine::timeout_reason`]: crate::Machine::timeout_reason
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Deadline {
    /// A connection attempt gives up (the query timeout after
    /// [`SessionCommand::Open`](crate::SessionCommand::Open)).
    Connect,
    /// The statement in flight times out; the session is given up on (see
    /// [`Deadline::DeferredClose`]).
    Query,
    /// The earliest lease validity ends; every job is cancelled and the
    /// session given up on (closed once the jobs returned, see
    /// [`Deadline::DeferredClose`]).
    Validity,
    /// A session the machine gave up on while jobs on it still ran is closed
    /// at the latest now: the send time of its last statement plus
    /// [`Options::guard_timeout`](crate::Options::guard_timeout), the moment
    /// the server could free its keys anyway. Earlier if every job returned.
    DeferredClose,
    /// The lock delay of a try's reply that won a key ends: its job starts
    /// (see [`Options::lock_delay`](crate::Options::lock_delay)).
    LockDelay,
    /// The next heartbeat is due.
    Heartbeat,
    /// The next standby try is due.
    Retry,
    /// The next connection attempt after a failure is due.
    Backoff,
    /// The watch session's connection attempt or wait times out (the query
    /// timeout, after the wait's lock timeout): it is closed, which costs
    /// speed only (see [`ServerWait::IdleAndWatch`](crate::ServerWait::IdleAndWatch)).
    Watch,
    /// A hand-over asked of this holder is due for a check beside the
    /// heartbeats (see `handover`).
    Check,
}

impl Deadline {
    /// Every timer, in the order ties are broken.
    pub(crate) const ALL: [Deadline; 10] = [
        Deadline::Connect,
        Deadline::Query,
        Deadline::Validity,
        Deadline::DeferredClose,
        Deadline::LockDelay,
        Deadline::Heartbeat,
        Deadline::Retry,
        Deadline::Backoff,
        Deadline::Watch,
        Deadline::Check,
    ];
}

/// One optional deadline per [`Deadline`], and the latest time fed in.
/// Entries are set and stopped where the state they time changes; the pump
/// acts on the expired ones.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DeadlineTable {
    at: [Option<Instant>; Deadline::ALL.len()],
    /// The latest time fed in (time never goes backwards inside).
    now: Option<Instant>,
}

impl DeadlineTable {
    /// The time an input brings: `now`, unless an earlier input brought a
    /// later one (time never goes backwards inside the machine).
    pub(crate) fn clock(&mut self, now: Instant) -> Instant {
        let now = self.now.map_or(now, |t| t.max(now));
        self.now = Some(now);
        now
    }

    pub(crate) fn get(&self, timer: Deadline) -> Option<Instant> {
        self.at[timer as usize]
    }

    pub(crate) fn set(&mut self, timer: Deadline, at: Instant) {
        self.at[timer as usize] = Some(at);
    }

    pub(crate) fn put(&mut self, timer: Deadline, at: Option<Instant>) {
        self.at[timer as usize] = at;
    }

    pub(crate) fn stop(&mut self, timer: Deadline) {
        self.at[timer as usize] = None;
    }

    /// Set and due at `now`.
    pub(crate) fn expired(&self, timer: Deadline, now: Instant) -> bool {
        self.get(timer).is_some_and(|at| at <= now)
    }

    /// The earliest deadline among the timers `armed` accepts, first in
    /// [`Deadline::ALL`] order on ties.
    pub(crate) fn next(&self, armed: impl Fn(Deadline) -> bool) -> Option<(Deadline, Instant)> {
        Deadline::ALL
            .into_iter()
            .filter_map(|t| Some((t, self.get(t)?)))
            .filter(|(t, _)| armed(*t))
            .min_by_key(|(_, at)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_discriminant_order() {
        for (i, t) in Deadline::ALL.into_iter().enumerate() {
            assert_eq!(t as usize, i);
        }
    }

    #[test]
    fn next_is_the_earliest_armed_deadline() {
        let t = Instant::now();
        let mut table = DeadlineTable::default();
        assert_eq!(table.next(|_| true), None);
        table.set(Deadline::Heartbeat, t);
        table.set(Deadline::Validity, t);
        table.set(Deadline::Backoff, t - std::time::Duration::from_secs(1));
        assert_eq!(
            table.next(|_| true),
            Some((Deadline::Backoff, table.get(Deadline::Backoff).unwrap()))
        );
        assert_eq!(
            table.next(|x| x != Deadline::Backoff),
            Some((Deadline::Validity, t))
        );
        table.stop(Deadline::Validity);
        assert!(table.expired(Deadline::Heartbeat, t));
        assert!(!table.expired(Deadline::Validity, t));
    }

    #[test]
    fn time_never_goes_backwards() {
        let t = Instant::now();
        let second = std::time::Duration::from_secs(1);
        let mut table = DeadlineTable::default();
        assert_eq!(table.clock(t), t);
        assert_eq!(table.clock(t - second), t);
        assert_eq!(table.clock(t + second), t + second);
    }
}
