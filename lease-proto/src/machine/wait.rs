//! Waiting on the server: how a standby learns that a key is free the moment
//! the server frees it, instead of at its next poll.
//!
//! The rule, in one place:
//!
//! - **When.** While the session holds nothing and owes nothing (every run
//!   is a standby, nothing to release or verify) and a try of a wanted key
//!   answered "held", the idle session sends a [`Statement::Wait`] for one
//!   wanted key instead of sitting idle until [`Timer::Retry`]. Its
//!   `lock_timeout` ends it at the retry deadline, so the periodic try of
//!   every other wanted key still goes on time; a locker that holds a lease
//!   polls as before (its session must stay free for heartbeats), and so
//!   does one behind a pooler that rejected the startup options (a blocked
//!   statement would hold one of its server connections for the whole
//!   wait, starving its other clients).
//! - **Which key.** One at a time, rotating: each wait takes the next wanted
//!   key after the last one waited for. With one wanted key the wait is
//!   instant takeover; with *n*, a key is waited for one retry interval in
//!   *n* and polled every retry interval otherwise.
//! - **Woken** (the key was freed): the next statement is a
//!   [`Statement::TryLock`] of every wanted key, at once, or after
//!   [`Options::lock_delay`](crate::Options::lock_delay) unless a handover
//!   notification for a wanted key comes first (a graceful release) from
//!   the holder the standby's last try saw (its sender's backend pid against
//!   the try's `holder_pid`; any other is ignored: any role may `NOTIFY`,
//!   and a late one may come from an earlier holder). One for
//!   the waited key that arrives while the wait blocks counts only if the
//!   wake follows within the lock delay (the driver may read it just ahead
//!   of the wake it belongs to); older, it was another release, after which
//!   someone else took the key. A wait never acquires: the try does, and
//!   its send time confirms the lease as for any try.
//! - **Below `deadlock_timeout`.** No wait blocks as long as the server's
//!   `deadlock_timeout` (1 s by default; any role can read it): one that
//!   does runs the deadlock detector and, with `log_lock_waits = on`,
//!   writes "still waiting" to the server log, again every client
//!   connection check, until it ends (issue 18 hole 8). The statement cuts
//!   its lock timeout to [`wait_limit_ms`](crate::wait_limit_ms) of the
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
//!   retry interval, or one per chunk (`ceil(retry / limit)`, 4 at a 3 s
//!   retry under the default 1 s `deadlock_timeout`).
//! - **No spin.** A wake followed by a try that wins nothing counts; after
//!   [`WAKE_BUDGET`] such wakes in a row the locker waits no more until its
//!   next periodic try (a lock the wait does not conflict with, a herd that
//!   keeps colliding). A wait that fails otherwise turns waiting off for the
//!   rest of the session: the poll is the fallback, so a misbehaving wait
//!   costs speed, never correctness.
//! - **Interrupted.** Anything that needs the session while a wait blocks it
//!   (a new run, a notification for another key, no run left) closes the
//!   session at once; holding nothing, that loses nothing, and a new session
//!   opens at once when one is needed. Notifications interrupt at most
//!   [`WAKE_BUDGET`] times between two periodic tries, since any client may
//!   send them; past that their key is tried at the periodic try, as the
//!   keys not waited for are. The server ends the orphaned
//!   wait at its next client connection check
//!   ([`WAIT_CONNECTION_CHECK_MS`](crate::WAIT_CONNECTION_CHECK_MS), Linux
//!   servers), or by its `lock_timeout`.

use std::time::{Duration, Instant};

use super::state::{RunState, Session, StandbyStep, What};
use super::{Machine, Phase, Timer};
use crate::io::{DbError, Event};
use crate::sql::{Row, WaitReply};

/// Wakes in a row whose following try won nothing before a locker stops
/// waiting until its next periodic try; also the most waits a handover
/// notification for another key interrupts (a reconnect each) between two
/// periodic tries.
pub const WAKE_BUDGET: u32 = 3;
/// Shortest wait worth sending: with less left before the retry deadline,
/// the try is as good.
pub const MIN_WAIT: Duration = Duration::from_millis(20);

impl Machine {
    /// The wait to send now, if any: the key, its `lock_timeout`, and
    /// whether that was cut below the retry deadline (a chunk).
    pub(super) fn next_wait(&self, now: Instant) -> Option<(i64, Duration, bool)> {
        if !self.opts.wait_on_server
            // Behind a pooler (it rejected the startup options), a blocked
            // statement would hold a pooled server connection all along.
            || self.settings_by_statement
            || self.phase != Phase::Open
            || self.waits_off
            || self.woken
            || self.wake_losses >= WAKE_BUDGET
            || self.verify
            || !self.orphans.is_empty()
            || !self.held_lost.is_empty()
        {
            return None;
        }
        let mut wanted = Vec::new();
        for r in self.runs.values() {
            match &r.state {
                RunState::Standby(s) if s.step == StandbyStep::Waiting && s.holder.is_some() => {
                    wanted.push(r.lease.key())
                }
                RunState::Standby(_) => {}
                // Holding or owing something: the session stays free.
                _ => return None,
            }
        }
        let retry = self.timers.get(Timer::Retry)?;
        let until_retry = retry.checked_duration_since(now)?;
        // Below the server's deadlock_timeout (the statement cuts it there
        // too): a wait until the retry deadline goes in such chunks.
        let left = self.wait_limit.map_or(until_retry, |l| l.min(until_retry));
        let chunk = left < until_retry;
        if left < MIN_WAIT {
            return None;
        }
        // In key order (runs are kept in run order): the least wanted key
        // after the last one waited for, else the least.
        let after = self.wait_cursor;
        let key = (wanted.iter().copied())
            .filter(|k| after.is_some_and(|a| *k > a))
            .min()
            .or_else(|| wanted.iter().copied().min())?;
        Some((key, left, chunk))
    }

    /// A wait's reply: woken, timed out, or failed.
    pub(super) fn wait_done(
        &mut self,
        now: Instant,
        key: i64,
        chunk: bool,
        result: Result<Vec<Row>, DbError>,
    ) {
        let cursor = self.wait_cursor.replace(key);
        let notified = self.wait_notified.take();
        if !self.holding() {
            self.timers
                .set(Timer::Heartbeat, now + self.opts.heartbeat_interval);
        }
        match result {
            Ok(rows) => match WaitReply::parse(&rows) {
                Ok(WaitReply {
                    session,
                    freed: Some(freed),
                    deadlock_timeout_ms,
                }) => {
                    if !self.same_session(now, &session) {
                        return;
                    }
                    if let Some(d) = deadlock_timeout_ms {
                        let limit = crate::sql::wait_limit_ms(d).max(0) as u64;
                        self.wait_limit = Some(Duration::from_millis(limit));
                    }
                    if !freed {
                        // Cut short by the deadlock_timeout limit, before the
                        // retry deadline: the same key's wait goes on.
                        // A notification read meanwhile still counts for
                        // the next one (within the lock delay).
                        if chunk {
                            self.wait_cursor = cursor;
                            self.wait_notified = notified;
                            self.wake_losses = 0;
                            return;
                        }
                        return self.held_all_along(now);
                    }
                    self.event(Event::KeyFreed { key });
                    #[cfg(feature = "sim")]
                    if self.opts.mutation == Some(crate::options::Mutation::WakeIsAcquisition) {
                        return self.wake_is_acquisition(now, key);
                    }
                    self.woken = true;
                    let delay = self.opts.lock_delay;
                    // The notification of the release that woke it came
                    // just ahead; an older one is stale (see `wait_notified`).
                    let graceful = notified.is_some_and(|at| now.duration_since(at) <= delay);
                    if delay.is_zero() || graceful {
                        self.try_now = true;
                    } else {
                        // A notification (graceful release) sets `try_now`
                        // meanwhile; the retry deadline is the delay's end.
                        self.timers.set(Timer::Retry, now + delay);
                    }
                }
                Ok(WaitReply { freed: None, .. }) => {
                    let e = DbError::other("malformed wait reply: no outcome row");
                    self.lose_session(now, crate::io::Reason::QueryFailed(e), true)
                }
                Err(e) => {
                    let e = DbError::other(e.to_string());
                    self.lose_session(now, crate::io::Reason::QueryFailed(e), true)
                }
            },
            Err(error) => {
                self.event(Event::WaitFailed { error });
                self.waits_off = true;
                self.try_now = true;
            }
        }
    }

    /// The broken variant [`Mutation::WakeIsAcquisition`](crate::options::Mutation).
    #[cfg(feature = "sim")]
    fn wake_is_acquisition(&mut self, now: Instant, key: i64) {
        let Some(id) = self.keys.get(&key).copied() else {
            return;
        };
        if let Some(RunState::Standby(s)) = self.runs.get_mut(&id).map(|r| &mut r.state) {
            s.step = StandbyStep::Trying;
            let token = i64::MAX / 2 + self.next_query as i64;
            self.won(now, now, key, token);
        }
    }

    /// The wait ended by its lock timeout: the key was held all along, as
    /// good as a try of this key that lost.
    fn held_all_along(&mut self, now: Instant) {
        // Not jittered: jitter spreads the polls of replicas started
        // together, and waits on the server do not poll.
        self.wake_losses = 0;
        if self.wanted_keys() <= 1 {
            let retry = now + self.opts.retry_interval;
            self.timers.set(Timer::Retry, retry);
        }
    }

    /// The try that followed a wake won nothing (`won` false) or something.
    pub(super) fn after_wake_try(&mut self, won: bool) {
        if std::mem::take(&mut self.woken) {
            self.wake_losses = if won { 0 } else { self.wake_losses + 1 };
        }
    }

    /// While a wait blocks the session: closes the session if something
    /// else needs it (see the module docs).
    pub(super) fn interrupt_wait_if_needed(&mut self) {
        let (Some(waited), Some(id)) = (self.waiting_for(), self.session_id()) else {
            return;
        };
        let other_wanted =
            (self.runs.values()).any(|r| r.lease.key() != waited && r.state.is_waiting());
        let needed = self.needs_session();
        if needed && !(self.try_now && other_wanted) && self.phase == Phase::Open {
            return;
        }
        self.event(Event::WaitInterrupted { session: id });
        if needed {
            self.close_for_new_session(id);
        } else {
            self.close_idle(id);
        }
    }

    /// A handover notification for `key` from backend `sender` (a graceful
    /// release, if `sender` is the holder this standby last saw): a standby
    /// that wants it tries at once. During a wait for that key, the wake
    /// follows and the notification only tells it the release was graceful
    /// (see `wait_notified`); during a wait for another key, it interrupts
    /// the wait (a reconnect), at most [`WAKE_BUDGET`] times per periodic
    /// try, after which the key waits for the periodic try.
    ///
    /// From any other backend it is ignored: any role may `NOTIFY` on the
    /// channel (a forged one sent just before the holder's session is
    /// terminated would skip the lock delay), and a late one from an
    /// earlier holder may reach a standby that lost the herd and waits
    /// again behind the new holder.
    pub(super) fn handover_notified(&mut self, now: Instant, key: i64, sender: i64) {
        let Some(run) = (self.keys.get(&key)).and_then(|id| self.runs.get(id)) else {
            return;
        };
        let wanted = run.state.is_waiting();
        if let RunState::Standby(s) = &run.state {
            let holder = s.holder.flatten();
            #[cfg(feature = "sim")]
            let anyone = self.opts.mutation == Some(crate::options::Mutation::NotifyFromAnyone);
            #[cfg(not(feature = "sim"))]
            let anyone = false;
            if holder != Some(sender) && !anyone {
                self.event(Event::NotificationIgnored {
                    key,
                    sender_pid: sender,
                    holder_pid: holder,
                });
                return;
            }
        }
        match self.waiting_for() {
            Some(waited) if waited == key => self.wait_notified = Some(now),
            Some(_) if self.notify_interrupts >= WAKE_BUDGET => {}
            Some(_) if wanted => {
                self.notify_interrupts += 1;
                self.try_now = true;
            }
            _ if wanted => self.try_now = true,
            _ => {}
        }
    }

    /// The key of the wait in flight, if one is.
    pub(super) fn waiting_for(&self) -> Option<i64> {
        let Session::Up(up) = &self.session else {
            return None;
        };
        match up.inflight.as_ref().map(|q| &q.what) {
            Some(What::Wait { key, .. }) => Some(*key),
            _ => None,
        }
    }

    fn wanted_keys(&self) -> usize {
        (self.runs.values())
            .filter(|r| matches!(r.state, RunState::Standby(_)))
            .count()
    }
}
