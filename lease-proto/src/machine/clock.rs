//! The server's clock seen from the locker: a step back is reported (the
//! rule, in one place).
//!
//! Fencing tokens are the server's `clock_timestamp()`; the promise that they
//! grow holds while the clock of the server that grants a key is not behind
//! the clock that made the key's previous token. The setup and the
//! heartbeat (and the verify, which embeds it) answer the server's clock;
//! each reading is compared with this locker's monotonic clock.
//!
//! A reading `s` answered by a statement sent at `sent` and answered at
//! `now` (local times) was made somewhere between the two, so the offset
//! `server - local` then lay in `[s - now, s - sent]`. The machine keeps one
//! base, the highest lower bound `s - now` seen (across sessions: a restart
//! or a failover is where a step shows), less the drift the guarantee
//! allows ([`Options::drift_bound`]) over the time since it was seen. A new
//! reading whose upper bound `s - sent` is below the base by more than the
//! guard margin in force plus that drift allowance proves a step back at
//! least that large, whatever the round trips: a slow reply widens the
//! interval and can only hide a step, never make one. Reported once: the
//! new reading becomes the base.

use std::time::{Duration, Instant};

use crate::io::{Event, SessionId};
use crate::options::Options;

/// A reading the next ones are compared with.
#[derive(Debug, Clone, Copy)]
struct Base {
    /// Lower bound of `server - local` in µs when it was seen.
    offset_us: i64,
    /// When it was seen (local).
    at: Instant,
    /// The session that answered it.
    session: SessionId,
}

/// A step back the clock made (see [`ServerClock::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// How far back, at least.
    pub(crate) back: Duration,
    /// The reading compared with came from an earlier session.
    pub(crate) across_sessions: bool,
}

/// The server's clock against the local one (see the module's doc).
#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    /// The local time µs are counted from: the first send seen.
    origin: Option<Instant>,
    base: Option<Base>,
}

impl ServerClock {
    /// A reading of the server's clock, `server_us` (µs since the epoch),
    /// answered on `session` by a statement sent at `sent` and answered at
    /// `now`: `Some` when it shows a step back beyond the bound.
    pub(crate) fn observe(
        &mut self,
        opts: &Options,
        session: SessionId,
        (sent, now): (Instant, Instant),
        server_us: i64,
    ) -> Option<Step> {
        let origin = *self.origin.get_or_insert(sent);
        let local = |t: Instant| t.saturating_duration_since(origin).as_micros() as i64;
        let low = server_us.saturating_sub(local(now));
        let high = server_us.saturating_sub(local(sent));
        let reading = Base {
            offset_us: low,
            at: now,
            session,
        };
        let Some(base) = self.base else {
            self.base = Some(reading);
            return None;
        };
        let elapsed = now.saturating_duration_since(base.at);
        let drift_us = elapsed.mul_f64(opts.drift_bound()).as_micros() as i64;
        let bound_us = opts.guard_margin_in_force().as_micros() as i64 + drift_us;
        let back_us = base.offset_us.saturating_sub(high);
        if back_us > bound_us {
            self.base = Some(reading);
            return Some(Step {
                // Less the drift allowed: at least this much was a step.
                back: Duration::from_micros((back_us - drift_us) as u64),
                across_sessions: base.session != session,
            });
        }
        // The highest lower bound, less the drift allowed since: a reading
        // above it is the tighter base.
        if low >= base.offset_us.saturating_sub(drift_us) {
            self.base = Some(reading);
        }
        None
    }
}

impl ServerClock {
    /// A reading of the server's clock (`None`: the reply had none) by a
    /// statement of `session`, the session that is up (`None`: none is),
    /// sent at `sent` and answered at `now`: a step back beyond the bound is
    /// the event to report.
    pub(super) fn read(
        &mut self,
        opts: &Options,
        session: Option<SessionId>,
        (sent, now): (Instant, Instant),
        server_us: Option<i64>,
    ) -> Option<Event> {
        let (Some(server_us), Some(session)) = (server_us, session) else {
            return None;
        };
        let Step {
            back,
            across_sessions,
        } = self.observe(opts, session, (sent, now), server_us)?;
        Some(Event::ServerClockStepped {
            session,
            back,
            across_sessions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Options {
        Options::default()
    }

    /// A server clock that steps back by `step_ms` at `step_at_s` (or never),
    /// read by a heartbeat every second whose round trip is `rtt_ms` (the
    /// reading anywhere in it), drifting at `drift`: the steps reported.
    fn run(step: Option<(u64, i64)>, rtt_ms: &[u64], drift: f64) -> Vec<Step> {
        let o = opts();
        let t0 = Instant::now();
        let mut clock = ServerClock::default();
        let mut steps = Vec::new();
        for i in 0..600u64 {
            let sent = t0 + Duration::from_secs(i);
            let rtt = Duration::from_millis(rtt_ms[i as usize % rtt_ms.len()]);
            let now = sent + rtt;
            // The server read its clock somewhere in the round trip.
            let at = sent + rtt.mul_f64((i % 3) as f64 / 2.0);
            let real_us = at.duration_since(t0).as_micros() as i64;
            let mut server_us = 1_700_000_000_000_000 + (real_us as f64 * (1.0 + drift)) as i64;
            if let Some((s, ms)) = step {
                if i >= s {
                    server_us -= ms * 1000;
                }
            }
            let session = SessionId(i / 100);
            steps.extend(clock.observe(&o, session, (sent, now), server_us));
        }
        steps
    }

    #[test]
    fn no_step_no_report_whatever_the_round_trips_and_the_drift() {
        let drift = opts().drift_bound() * 0.99;
        for rtt in [&[1][..], &[1, 900, 5], &[2_000, 1, 3_000, 0]] {
            for d in [0.0, drift, -drift] {
                assert_eq!(run(None, rtt, d), vec![], "rtt {rtt:?} drift {d}");
            }
        }
    }

    #[test]
    fn a_step_back_beyond_the_bound_is_reported_once() {
        for (at, across) in [(250, false), (300, true)] {
            let steps = run(Some((at, 30_000)), &[1, 40, 3], 0.0);
            assert_eq!(steps.len(), 1, "{steps:?}");
            assert_eq!(steps[0].across_sessions, across);
            let back = steps[0].back;
            assert!(
                back <= Duration::from_secs(30) && back > Duration::from_millis(29_900),
                "{back:?}"
            );
        }
    }

    #[test]
    fn a_step_within_the_bound_or_forward_is_not_reported() {
        let margin = opts().guard_margin_in_force().as_millis() as i64;
        assert_eq!(run(Some((250, margin - 50)), &[1], 0.0), vec![]);
        assert_eq!(run(Some((250, -30_000)), &[1], 0.0), vec![]);
    }

    #[test]
    fn a_step_back_after_a_step_forward_is_reported() {
        let o = opts();
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut clock = ServerClock::default();
        let id = SessionId(1);
        assert_eq!(clock.observe(&o, id, (s(0), s(0)), 0), None);
        // Forward by 10 s: the base follows.
        assert_eq!(clock.observe(&o, id, (s(1), s(1)), 11_000_000), None);
        // Back to where it was: 10 s back, reported less the drift the
        // guarantee allows over the second since the base.
        let step = clock.observe(&o, id, (s(2), s(2)), 2_000_000);
        let drift = Duration::from_secs(1).mul_f64(o.drift_bound());
        let back = Duration::from_secs(10) - Duration::from_micros(drift.as_micros() as u64);
        assert_eq!(
            step,
            Some(Step {
                back,
                across_sessions: false
            })
        );
        // Re-based: the readings after it are no news.
        assert_eq!(clock.observe(&o, id, (s(3), s(3)), 3_000_000), None);
    }
}
