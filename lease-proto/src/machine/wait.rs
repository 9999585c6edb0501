//! Waiting on the server: how a standby takes a key the moment the server
//! frees it, instead of at its next poll.
//!
//! The rule, in one place:
//!
//! - **When.** While the session holds nothing and owes nothing (every run
//!   is a standby, nothing to release or verify) and a try of a wanted key
//!   answered "held", the idle session sends a [`Statement::Take`](crate::Statement::Take)
//!   for one wanted key instead of sitting idle until [`Deadline::Retry`](super::Deadline::Retry):
//!   a wait that takes the key. Its `lock_timeout` ends it at the retry
//!   deadline, so the periodic try of every other wanted key still goes on
//!   time; a locker that holds a lease does not wait on its session (it must
//!   stay free for heartbeats) but on its watch session, whose waits never
//!   take anything (see `watch`); and one behind a pooler that rejected the
//!   startup options polls (a blocked statement would hold one of its
//!   server connections for the whole wait, starving its other clients).
//! - **Which key.** One at a time, rotating: each wait takes the next wanted
//!   key after the last one waited for. With one wanted key the wait is
//!   instant takeover; with *n*, a key is waited for one retry interval in
//!   *n* and polled every retry interval otherwise.
//! - **Taken** (the key was freed): the server grants the key to the first
//!   session in its queue at the release, in the releasing backend, so the
//!   statement answers one round trip after the release with the key won
//!   and its fencing token, read after the grant; no try follows. The run is
//!   in the take as in a try, and the win is a try's win sent when the take
//!   was: it counts from the take's send time (so no take waits longer than
//!   half of what the validity window leaves beside the lock delay) and its
//!   job starts after
//!   [`Options::lock_delay`](crate::Options::lock_delay) unless the release
//!   was graceful (the rule: `Machine::try_answered`), and never before
//!   [`TAKE_NOTICES`]: the notifications the session got while it blocked
//!   come right behind the reply. A key reserved meanwhile for another
//!   backend (a hand-over asked for, among those notifications) is released
//!   at once without a job (`Machine::try_done`), and the backend it is
//!   reserved for tries at that release. The other
//!   sessions in the key's queue go on waiting, behind the new holder: a
//!   release wakes no other standby, and a poller's try loses to the queue
//!   (PostgreSQL queues a request behind conflicting waiters). A reply that
//!   fails leaves the key maybe taken: the session verifies, as after a
//!   failed try.
//! - **Below `deadlock_timeout`.** No wait blocks as long as the server's
//!   `deadlock_timeout` (1 s by default; any role can read it): one that
//!   does runs the deadlock detector and, with `log_lock_waits = on`,
//!   writes "still waiting" to the server log, again every client
//!   connection check, until it ends. The statement cuts
//!   its lock timeout to [`wait_limit_ms`](crate::server::wait_limit_ms) of the
//!   session's `deadlock_timeout` and reports the value; the machine sizes
//!   its waits by it, so a standby waits out a retry interval in chunks of
//!   at most that (a wait ended by the cut, before the retry deadline, is
//!   followed at once by the next one for the same key). Under a
//!   `deadlock_timeout` so short that the limit is below [`MIN_WAIT`], the
//!   standby polls instead.
//! - **Timed out** (the key was held the whole time; the statement catches
//!   its lock timeout, SQLSTATE 55P03, and says so in its reply): at the
//!   retry deadline, that counts as a try of that key; with one wanted key
//!   the retry deadline moves a whole retry interval on (no jitter: waits
//!   do not poll in lockstep), so an idle standby sends one statement per
//!   retry interval, or one per chunk (`ceil(retry / limit)`, 6 at a 5 s
//!   retry under the default 1 s `deadlock_timeout`).
//! - **No spin.** A take answers at once only when it does not queue
//!   (crowded, below), when it wins, or when the checks before it fail
//!   (another backend or nonce, which refuses the locker, or the key held by
//!   this backend already: another client's, behind a transaction pooler,
//!   which refuses it too). A take that fails otherwise turns waiting off for the
//!   rest of the session: the poll is the fallback, so a misbehaving wait
//!   costs speed, never correctness.
//! - **No herd.** A take does not queue behind [`HERD_WAITERS`] waiters of
//!   its key with smaller backend pids (it counts them in `pg_locks` first);
//!   it answers "crowded" and its standby polls that key until its next
//!   periodic try, when it looks again. The waiters settle on the standbys
//!   with the smallest pids (those never give way, so waits that look at
//!   the same moment cannot all give way), so the statements a standby
//!   sends do not grow with the standbys; a release wakes one of them. A
//!   standby named for a hand-over (see `handover`) waits for that key
//!   first and queues however many wait, until the ask's window ends.
//! - **Interrupted.** Anything that needs the session while a take blocks it
//!   (a new run, a notification for another key, no run left) closes the
//!   session at once (PostgreSQL delivers a notification to a session only
//!   between transactions, so one for another key comes after the take's
//!   reply, or from a driver that reads another connection's); the take's run stands by again, and
//!   whatever the take may have been granted goes with the session. Holding
//!   nothing else, that loses nothing, and a new session opens at once when
//!   one is needed. Notifications interrupt at most [`WAKE_BUDGET`] times
//!   between two periodic tries, since any client may send them; past that
//!   their key is tried at the periodic try, as the keys not waited for are.
//!   The server ends the orphaned wait at its next client connection check
//!   ([`WAIT_CONNECTION_CHECK_MS`](crate::server::WAIT_CONNECTION_CHECK_MS), Linux
//!   servers), or by its `lock_timeout`.

use std::time::{Duration, Instant};

/// The most takes a handover notification for another key interrupts (a
/// reconnect each) between two periodic tries; also the watch session's
/// wakes in a row whose following try won nothing before it waits no more
/// until the next periodic try (see `watch`).
pub const WAKE_BUDGET: u32 = 3;

/// How many sessions may wait on the server for one key before a standby's
/// wait for it does not queue and the standby polls the key instead, until
/// its next periodic try (see `wait`, "No herd").
pub const HERD_WAITERS: u32 = 2;

/// The least a take's win is held back before its job starts, whatever the
/// lock delay (see `wait`, "Taken"): the notifications its session got
/// while it blocked come right behind its reply, a hand-over asked for
/// meanwhile among them, and are read by then.
pub const TAKE_NOTICES: Duration = Duration::from_millis(1);

/// Shortest wait worth sending: with less left before the retry deadline,
/// the try is as good.
pub const MIN_WAIT: Duration = Duration::from_millis(20);

/// The standby's waits on the server, across sessions: the rule above, by
/// the state it needs. The machine asks it for the next wait
/// ([`ServerWait::next`]) and tells it what a wait, a try and a notification
/// came to.
#[derive(Debug, Default)]
pub(super) struct ServerWait {
    /// The last key waited for, so the next wait takes the next one.
    cursor: Option<i64>,
    /// A wait failed otherwise than by its lock timeout: this session polls.
    off: bool,
    /// A wait found [`HERD_WAITERS`] sessions waiting for its key already:
    /// no wait until the next periodic try.
    crowded: bool,
    /// The longest wait the session's `deadlock_timeout` allows
    /// ([`wait_limit_ms`](crate::server::wait_limit_ms)), from the last wait's
    /// reply; `None` before one answered on this session.
    limit: Option<Duration>,
    /// Waits interrupted by a notification for another key since the last
    /// periodic try (see [`WAKE_BUDGET`]).
    interrupts: u32,
    /// A key this standby is named for (see `handover`), until when: waited
    /// for first, crowd or not.
    named: Option<(i64, Instant)>,
}

/// What a wait's answer took from [`ServerWait`]: the cursor before it,
/// given back for a chunk.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answered {
    cursor: Option<i64>,
}

/// What the reply of a wait that answered on this session, its key not
/// freed, came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotFreed {
    /// Cut short below `deadlock_timeout` before the retry deadline: the same
    /// key's wait goes on.
    Chunk,
    /// Ended by its lock timeout at the retry deadline: the key was held all
    /// along, as good as a try of it that lost.
    HeldAllAlong,
}

impl ServerWait {
    /// Whether waits are off for now: turned off on this session, or the
    /// last one found its key crowded.
    pub(super) fn paused(&self, now: Instant) -> bool {
        self.off || (self.crowded && self.named_key(now).is_none())
    }

    /// The key this standby is named for at `now`, if any.
    fn named_key(&self, now: Instant) -> Option<i64> {
        self.named.filter(|&(_, until)| until > now).map(|(k, _)| k)
    }

    /// This standby is named for a hand-over of `key` until `until` (see
    /// `handover`): it waits for it first, however many wait.
    pub(super) fn named(&mut self, key: i64, until: Instant) {
        self.named = Some((key, until));
    }

    /// The wait to send now among the `wanted` keys, with `retry` the retry
    /// deadline: the key, its `lock_timeout`, whether that was cut below
    /// the retry deadline (a chunk), and whether it is the key this standby
    /// is named for (it queues behind any crowd). The caller checked that
    /// waiting is allowed at all ([`ServerWait::paused`] among it).
    pub(super) fn next(
        &self,
        now: Instant,
        wanted: &[i64],
        retry: Option<Instant>,
    ) -> Option<(i64, Duration, bool, bool)> {
        if let Some((named, until)) = self.named.filter(|&(k, u)| u > now && wanted.contains(&k)) {
            // Queued until the ask's window ends, retry or not: the
            // holder's checks must find it (see `handover`).
            let left = until - now;
            let left = self.limit.map_or(left, |l| l.min(left));
            return (left >= MIN_WAIT).then_some((named, left, true, true));
        }
        let until_retry = retry?.checked_duration_since(now)?;
        // Below the server's deadlock_timeout (the statement cuts it there
        // too): a wait until the retry deadline goes in such chunks.
        let left = self.limit.map_or(until_retry, |l| l.min(until_retry));
        let chunk = left < until_retry;
        if left < MIN_WAIT {
            return None;
        }
        if self.crowded {
            return None;
        }
        // In key order (runs are kept in run order): the least wanted key
        // after the last one waited for, else the least.
        let after = self.cursor;
        let key = (wanted.iter().copied())
            .filter(|k| after.is_some_and(|a| *k > a))
            .min()
            .or_else(|| wanted.iter().copied().min())?;
        Some((key, left, chunk, false))
    }

    /// A wait for `key` answered (in any way): it is the last one waited
    /// for; the notification read during it, if any, is taken.
    pub(super) fn answered(&mut self, key: i64) -> Answered {
        Answered {
            cursor: self.cursor.replace(key),
        }
    }

    /// A wait's reply from this session told the server's
    /// `deadlock_timeout`: later waits stay below it.
    pub(super) fn limit_from(&mut self, deadlock_timeout_ms: Option<i64>) {
        if let Some(d) = deadlock_timeout_ms {
            let limit = crate::sql::wait_limit_ms(d).max(0) as u64;
            self.limit = Some(Duration::from_millis(limit));
        }
    }

    /// A wait's reply from this session: its key was not freed.
    pub(super) fn not_freed(&mut self, answered: Answered, chunk: bool) -> NotFreed {
        if chunk {
            self.cursor = answered.cursor;
            return NotFreed::Chunk;
        }
        NotFreed::HeldAllAlong
    }

    /// A wait failed otherwise than by its lock timeout: no more waits on
    /// this session.
    pub(super) fn failed(&mut self) {
        self.off = true;
    }

    /// The periodic try: waiting may start over.
    pub(super) fn periodic_try(&mut self) {
        self.interrupts = 0;
        self.crowded = false;
    }

    /// A wait's reply from this session: its key has [`HERD_WAITERS`]
    /// waiters already; it did not queue.
    pub(super) fn crowded(&mut self) {
        self.crowded = true;
    }

    /// A handover notification for `key` from the holder the standby saw
    /// (`wanted`: its standby is not in the try in flight), while a wait for
    /// `waited` blocks, if one does. Returns whether the standbys try at the
    /// next chance. During a wait for that key, the wake follows (the
    /// notification only marks the release graceful, see `runs`); during a wait
    /// for another key, it interrupts the wait (a reconnect), at most
    /// [`WAKE_BUDGET`] times per periodic try, after which the key waits for
    /// the periodic try.
    pub(super) fn notified(&mut self, key: i64, waited: Option<i64>, wanted: bool) -> bool {
        match waited {
            Some(waited) if waited == key => false,
            Some(_) if self.interrupts >= WAKE_BUDGET => false,
            Some(_) if wanted => {
                self.interrupts += 1;
                true
            }
            _ => wanted,
        }
    }

    /// What ends with any session.
    pub(super) fn session_down(&mut self) {
        self.off = false;
        self.crowded = false;
        self.limit = None;
        self.named = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn waits_rotate_over_the_wanted_keys_until_the_retry_deadline() {
        let mut w = ServerWait::default();
        let now = Instant::now();
        let retry = Some(now + 5 * S);
        let wanted = [30, 10, 20];
        let mut order = Vec::new();
        for _ in 0..4 {
            let (key, left, chunk, named) = w.next(now, &wanted, retry).unwrap();
            assert_eq!((left, chunk, named), (5 * S, false, false));
            order.push(key);
            w.answered(key);
        }
        assert_eq!(order, [10, 20, 30, 10]);
        assert_eq!(w.next(now, &[], retry), None, "nothing wanted");
        assert_eq!(w.next(now, &wanted, None), None, "no retry deadline");
        let nearly = now + 5 * S - MIN_WAIT / 2;
        assert_eq!(w.next(nearly, &wanted, retry), None, "too short to wait");
    }

    #[test]
    fn a_wait_goes_in_chunks_below_deadlock_timeout_and_a_chunk_keeps_its_key() {
        let mut w = ServerWait::default();
        let now = Instant::now();
        w.limit_from(Some(1000));
        let limit = Duration::from_millis(900);
        let (key, left, chunk, _) = w.next(now, &[1, 2], Some(now + 5 * S)).unwrap();
        assert_eq!((key, left, chunk), (1, limit, true));
        let answered = w.answered(key);
        assert_eq!(w.not_freed(answered, true), NotFreed::Chunk);
        assert_eq!(
            w.next(now, &[1, 2], Some(now + 5 * S)).unwrap().0,
            1,
            "same key again"
        );
        let answered = w.answered(1);
        assert_eq!(w.not_freed(answered, false), NotFreed::HeldAllAlong);
        assert_eq!(w.next(now, &[1, 2], Some(now + 5 * S)).unwrap().0, 2);
        // A deadlock_timeout so short that the limit is below MIN_WAIT: poll.
        w.limit_from(Some(29));
        assert_eq!(w.next(now, &[1, 2], Some(now + 5 * S)), None);
        w.limit_from(Some(30));
        assert!(w.next(now, &[1, 2], Some(now + 5 * S)).is_some());
    }

    #[test]
    fn a_crowded_or_failed_wait_pauses_waiting_until_the_periodic_try_or_the_session() {
        let now = Instant::now();
        let retry = Some(now + 5 * S);
        let mut w = ServerWait::default();
        w.crowded();
        assert!(w.paused(now) && w.next(now, &[1], retry).is_none());
        w.periodic_try();
        assert!(!w.paused(now) && w.next(now, &[1], retry).is_some());
        w.failed();
        w.periodic_try();
        assert!(
            w.paused(now),
            "a failed wait turns waiting off for the session"
        );
        w.session_down();
        assert!(!w.paused(now));
    }

    #[test]
    fn a_named_standby_queues_for_its_key_whatever_the_crowd_until_the_ask_ends() {
        let now = Instant::now();
        let mut w = ServerWait::default();
        w.crowded();
        let until = now + 3 * S;
        w.named(7, until);
        assert!(!w.paused(now));
        // Even past the retry deadline, and without one.
        assert_eq!(w.next(now, &[1, 7], None), Some((7, 3 * S, true, true)));
        w.limit_from(Some(1000));
        assert_eq!(
            w.next(now, &[1, 7], None),
            Some((7, Duration::from_millis(900), true, true))
        );
        assert_eq!(w.next(now, &[1], None), None, "7 not wanted: no named wait");
        assert!(w.paused(until), "the ask ended: crowded again");
    }

    #[test]
    fn notifications_interrupt_a_wait_for_another_key_at_most_the_budget() {
        let mut w = ServerWait::default();
        assert!(w.notified(5, None, true), "no wait: try at once");
        assert!(!w.notified(5, None, false), "not wanted");
        assert!(
            !w.notified(5, Some(5), true),
            "the wait for that key wakes by itself"
        );
        for _ in 0..WAKE_BUDGET {
            assert!(w.notified(5, Some(6), true));
        }
        assert!(!w.notified(5, Some(6), true), "budget spent");
        w.periodic_try();
        assert!(w.notified(5, Some(6), true));
    }
}
