//! The pump: after every input, act on expired deadlines, then start what
//! is due. Also the timer predicates and the jitter.

use std::time::{Duration, Instant};

use super::state::{Release, RunState, Session, Stage, StandbyStep, Stopping, What};
use super::{Machine, Phase, Timer, RECONNECT_BASE, VERIFY_EVERY};
use crate::io::{Reason, SessionId};
use crate::options::RETRY_JITTER;

impl Machine {
    /// After every input: enforce deadlines against `now`, then start what is due.
    pub(super) fn pump(&mut self, now: Instant) {
        debug_assert_eq!(
            self.timers.get(Timer::Validity),
            self.earliest_validity_end(),
            "the validity timer is updated wherever a held key changes"
        );
        // Check the clock rather than trust that a timer fired.
        if self.timers.expired(Timer::Validity, now) {
            self.lose_session(now, Reason::ValidityExpired, true);
        }
        if self.timers.expired(Timer::Connect, now) || self.timers.expired(Timer::Query, now) {
            self.lose_session(now, Reason::QueryTimeout, true);
        }
        self.close_doubtful_when_done(now);
        self.interrupt_wait_if_needed();
        let needed = self.needs_session();
        match &self.session {
            Session::Idle => {
                if needed {
                    self.open(now);
                }
            }
            Session::Backoff => {
                let waiting = self.timers.get(Timer::Backoff).is_some_and(|t| t > now);
                if needed && !waiting {
                    self.open(now);
                }
            }
            Session::Connecting { id } => {
                if !needed {
                    let id = *id;
                    self.close_idle(id);
                }
            }
            // Nothing is sent on it; it closes by itself (above).
            Session::Doubtful { .. } => {}
            Session::Up(up) => {
                if up.inflight.is_some() {
                    return;
                }
                if !needed && self.orphans.is_empty() {
                    let id = up.id;
                    return self.close_idle(id);
                }
                if !matches!(up.stage, Stage::Ready { .. }) {
                    return;
                }
                if let Some(what) = self.next_statement(now) {
                    self.send(now, what);
                }
            }
        }
    }

    /// Picks the next statement: verification, then releases, then the
    /// heartbeat, then the standby try, then a wait on the server (`wait`).
    fn next_statement(&mut self, now: Instant) -> Option<What> {
        if self.verify {
            return Some(What::Verify);
        }
        let mut release: Vec<i64> = std::mem::take(&mut self.orphans).into_iter().collect();
        for r in self.runs.values_mut() {
            if let RunState::Releasing { release: step, .. } = &mut r.state {
                if *step == Release::Queued {
                    *step = Release::Sent;
                    release.push(r.lease.key());
                }
            }
        }
        if !release.is_empty() {
            return Some(What::Release(release));
        }
        let holding = self.holding();
        // On a newly promoted primary nothing is tried (nor waited for: a
        // wait would be granted at once, the key being free there) before
        // the hold ends; the retry deadline wakes the machine then.
        let held = self.promotion_hold.filter(|&until| until > now);
        if held.is_none() {
            self.promotion_hold = None;
        }
        let heartbeat_due = self.heartbeat_needed() && self.timers.expired(Timer::Heartbeat, now);
        let retry_due = self.timers.get(Timer::Retry).is_none_or(|t| t <= now);
        let try_due = (self.try_now || retry_due) && self.phase == Phase::Open && held.is_none();
        // Heartbeat first, but never twice in a row while a try is due. A
        // locker holding nothing heartbeats only to keep its session alive,
        // and a try does that too: it goes instead.
        let heartbeat_first = holding || !try_due;
        if heartbeat_due
            && heartbeat_first
            && !(try_due && self.heartbeat_last && self.any_waiting())
        {
            self.heartbeat_last = true;
            self.unverified_heartbeats += 1;
            if self.unverified_heartbeats >= VERIFY_EVERY {
                return Some(What::Verify);
            }
            return Some(What::Heartbeat);
        }
        self.heartbeat_last = false;
        if let Some(until) = held {
            if self.timers.get(Timer::Retry).is_none_or(|t| t < until) {
                self.timers.set(Timer::Retry, until);
            }
            return None;
        }
        if try_due {
            let mut keys = Vec::new();
            for r in self.runs.values_mut() {
                if let RunState::Standby(standby) = &mut r.state {
                    if standby.step == StandbyStep::Waiting {
                        standby.step = StandbyStep::Trying;
                        keys.push(r.lease.key());
                    }
                }
            }
            self.try_now = false;
            if retry_due && !self.woken {
                // The periodic try: waiting may start over. Not the try
                // after a wake's lock delay, which the retry deadline also
                // sends: it must count against the wake budget.
                self.wake_losses = 0;
                self.notify_interrupts = 0;
            }
            if !keys.is_empty() {
                if !holding {
                    // The try proves the session alive as a heartbeat does
                    // (it checks the backend pid and the nonce), and a key
                    // it wins counts from its send time: the next heartbeat
                    // is due an interval after it.
                    let next = now + self.opts.heartbeat_interval;
                    self.timers.set(Timer::Heartbeat, next);
                }
                return Some(What::Try(keys));
            }
        }
        let (key, timeout) = self.next_wait(now)?;
        Some(What::Wait { key, timeout })
    }

    /// Whether the session holds a lease whose validity heartbeats renew.
    pub(super) fn holding(&self) -> bool {
        self.runs.values().any(|r| r.state.held().is_some())
    }

    /// Whether heartbeats are due at all. A locker holding nothing needs no
    /// confirmation, only a session kept from looking idle to the server
    /// guard (`idle_session_timeout`): its tries do that when the longest
    /// gap between two tries' send times, a query timeout (a reply later
    /// than that ends the session) plus a retry interval (jittered down,
    /// never up), is shorter than the guard. With the defaults (5 s + 10 s
    /// against 16 s) a standby sends its tries and nothing else; otherwise
    /// it also heartbeats, each try pushing the heartbeat back.
    fn heartbeat_needed(&self) -> bool {
        // A hold after a promotion is longer than the guard: heartbeats keep
        // the session from looking idle meanwhile.
        self.holding()
            || self.promotion_hold.is_some()
            || self.opts.retry_interval + self.opts.query_timeout >= self.opts.guard_timeout()
    }

    /// Whether any run needs the session: a standby, a leader, or a release.
    pub(super) fn needs_session(&self) -> bool {
        !matches!(self.phase, Phase::Refused(_))
            && self.runs.values().any(|r| match &r.state {
                RunState::Stopping(Stopping::Lost { .. }) => false,
                RunState::Standby(s) if s.step == StandbyStep::Waiting => self.phase == Phase::Open,
                RunState::Standby(_)
                | RunState::Leading(_)
                | RunState::Stopping(Stopping::Held { .. })
                | RunState::Releasing { .. } => true,
            })
    }

    /// The earliest deadline that can make progress, and which one it is.
    pub(super) fn next_timer(&self) -> Option<(Timer, Instant)> {
        let idle_ready = matches!(
            &self.session,
            Session::Up(up) if up.inflight.is_none() && matches!(up.stage, Stage::Ready { .. })
        );
        self.timers.next(|timer| match timer {
            Timer::Connect | Timer::Query | Timer::Validity => true,
            Timer::DeferredClose => matches!(self.session, Session::Doubtful { .. }),
            // Only a ready session with nothing in flight sends.
            Timer::Heartbeat => idle_ready && self.heartbeat_needed(),
            Timer::Retry => idle_ready && self.any_waiting(),
            Timer::Backoff => matches!(self.session, Session::Backoff) && self.needs_session(),
        })
    }

    /// Uniform in [0, 1).
    fn random(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (mix(self.rng) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A session's nonce: a function of the jitter state and the session,
    /// drawn without advancing the jitter sequence. Non-negative, so it reads
    /// back as the same `int8` text.
    pub(super) fn nonce(&self, session: SessionId) -> i64 {
        let z = mix(self.rng ^ mix(session.0.wrapping_add(0x6c65_6173_655f_6e6f)));
        (z >> 1) as i64
    }

    pub(super) fn jittered_retry(&mut self) -> Duration {
        let f = 1.0 - RETRY_JITTER * self.random();
        self.opts.retry_interval.mul_f64(f)
    }

    pub(super) fn backoff(&mut self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(20);
        let d = RECONNECT_BASE
            .saturating_mul(1 << exp)
            .min(self.opts.retry_interval);
        d.mul_f64(0.5 + 0.5 * self.random())
    }
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
