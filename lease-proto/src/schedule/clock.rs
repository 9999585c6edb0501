//! [`Estimate`]: the database server's clock as a leader reads it, and how its
//! error grows with age. Pure: the reads (and this host's clock) are the
//! driver's; the rules are here, for `lease run --every`/`--cron` and the
//! library's `Locker::schedule` alike.

use super::{CLOCK_DRIFT, MAX_CLOCK_ERROR};
pub use crate::sql::SERVER_TIME_SQL;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Reads of [`SERVER_TIME_SQL`] per estimate; the quickest round trip wins.
pub const CLOCK_SAMPLES: usize = 5;

/// How old an estimate may get before the server's clock is read again (its
/// error then grows by 5 ms at most, at [`CLOCK_DRIFT`]).
pub const CLOCK_REFRESH: Duration = Duration::from_secs(10);

/// The server's time at a moment of this host's monotonic clock: one read of
/// [`SERVER_TIME_SQL`], placed at the middle of its round trip, so its error
/// is at most half the round trip; as it ages, the error grows by
/// [`CLOCK_DRIFT`] of its age (the two clocks' rates may differ). A leader
/// starts a run only on an estimate within [`MAX_CLOCK_ERROR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    local: Instant,
    server: SystemTime,
    /// Half the round trip of the read.
    error: Duration,
}

impl Estimate {
    /// The estimate of one read: sent at `sent`, answered at `received` (this
    /// host's monotonic clock) with the server's time `server`.
    pub fn from_read(sent: Instant, received: Instant, server: SystemTime) -> Estimate {
        let half = received.saturating_duration_since(sent) / 2;
        Estimate {
            local: sent + half,
            server,
            error: half,
        }
    }

    /// [`Estimate::from_read`] of [`SERVER_TIME_SQL`]'s value (microseconds
    /// since the Unix epoch).
    pub fn from_micros(sent: Instant, received: Instant, micros: i64) -> Estimate {
        let server = UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(0));
        Estimate::from_read(sent, received, server)
    }

    /// Its error when it was read: half the round trip.
    pub fn read_error(&self) -> Duration {
        self.error
    }

    /// The server's time at `at` (this host's monotonic clock), and its error.
    pub fn at(&self, at: Instant) -> (SystemTime, Duration) {
        let (time, age) = if at >= self.local {
            let age = at - self.local;
            (self.server + age, age)
        } else {
            let age = self.local - at;
            (self.server - age, age)
        };
        (time, self.error + age.mul_f64(CLOCK_DRIFT))
    }

    /// The server's time at `at`, if its error is within [`MAX_CLOCK_ERROR`].
    pub fn time_at(&self, at: Instant) -> Option<SystemTime> {
        let (time, error) = self.at(at);
        (error <= MAX_CLOCK_ERROR).then_some(time)
    }

    /// When this host's monotonic clock shows server time `t` (its reading's
    /// moment, if `t` is that far past).
    pub fn instant_of(&self, t: SystemTime) -> Instant {
        match t.duration_since(self.server) {
            Ok(ahead) => self.local + ahead,
            Err(e) => self.local.checked_sub(e.duration()).unwrap_or(self.local),
        }
    }

    /// The more certain of `self` and `other` at `at`.
    pub fn better(self, other: Estimate, at: Instant) -> Estimate {
        if other.at(at).1 < self.at(at).1 {
            other
        } else {
            self
        }
    }

    /// When to read the clock again: every [`CLOCK_REFRESH`], sooner when the
    /// error would reach [`MAX_CLOCK_ERROR`] before (halfway there), at least
    /// a second apart.
    pub fn next_read(&self) -> Duration {
        let room = MAX_CLOCK_ERROR.saturating_sub(self.error);
        let lasts = Duration::from_secs_f64(room.as_secs_f64() / CLOCK_DRIFT);
        (lasts / 2).clamp(Duration::from_secs(1), CLOCK_REFRESH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_grows_with_age() {
        let sent = Instant::now();
        let server = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let e = Estimate::from_read(sent, sent + Duration::from_millis(4), server);
        let local = sent + Duration::from_millis(2);
        assert_eq!(e.read_error(), Duration::from_millis(2));
        let (t, err) = e.at(local + Duration::from_secs(10));
        assert_eq!(t, server + Duration::from_secs(10));
        assert_eq!(err, Duration::from_millis(7));
        assert_eq!(
            e.instant_of(server + Duration::from_secs(3)),
            local + Duration::from_secs(3)
        );
        assert!(e.time_at(local + Duration::from_secs(100)).is_none());
        assert_eq!(e.next_read(), CLOCK_REFRESH);
        let slow = Estimate::from_read(sent, sent + Duration::from_millis(96), server);
        assert_eq!(slow.next_read(), Duration::from_secs(2));
        assert_eq!(e.better(slow, local), e);
        assert_eq!(slow.better(e, local), e);
    }
}
