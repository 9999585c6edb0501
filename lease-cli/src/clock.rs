//! The database server's clock, as `lease run --every`/`--cron` reads it: due
//! times are on the server's clock, never on this host's.
//!
//! An estimate comes from a short-lived connection of its own (never the lease
//! session): the quickest of [`SAMPLES`] reads of `clock_timestamp()`, placed at
//! the middle of its round trip, so its error is at most half the round trip.
//! As it ages, the error grows by [`DRIFT`] of its age (the two clocks' rates may
//! differ). A run starts only on an estimate within [`MAX_CLOCK_ERROR`].

use crate::conn::{self, Target};
use lease_proto::schedule::{CLOCK_DRIFT, MAX_CLOCK_ERROR};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Reads per estimate; the quickest wins.
const SAMPLES: usize = 5;

/// The clock-rate difference assumed between this host and the server (the
/// core's rule, beside [`MAX_CLOCK_ERROR`]).
const DRIFT: f64 = CLOCK_DRIFT;

/// How old an estimate may get before it is read again (its error then grows by
/// 5 ms at most).
pub const REFRESH: Duration = Duration::from_secs(10);

/// The server's time in microseconds since the Unix epoch. Every name
/// schema-qualified (search_path cannot redirect it); writes nothing.
const NOW_SQL: &str = "SELECT (pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) \
                       OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8";

/// The server's time at a moment of this host's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Estimate {
    local: Instant,
    server: SystemTime,
    /// Half the round trip of the read.
    error: Duration,
}

impl Estimate {
    /// The server's time at `at` (this host's monotonic clock), and its error.
    pub fn at(&self, at: Instant) -> (SystemTime, Duration) {
        let (time, age) = if at >= self.local {
            let age = at - self.local;
            (self.server + age, age)
        } else {
            let age = self.local - at;
            (self.server - age, age)
        };
        (time, self.error + age.mul_f64(DRIFT))
    }

    /// The server's time now, if its error is within [`MAX_CLOCK_ERROR`].
    pub fn now(&self) -> Option<SystemTime> {
        let (time, error) = self.at(Instant::now());
        (error <= MAX_CLOCK_ERROR).then_some(time)
    }

    /// When this host's monotonic clock shows server time `t` (now, if past).
    pub fn instant_of(&self, t: SystemTime) -> Instant {
        match t.duration_since(self.server) {
            Ok(ahead) => self.local + ahead,
            Err(e) => self.local.checked_sub(e.duration()).unwrap_or(self.local),
        }
    }
}

/// When to read the clock again after `e`: every [`REFRESH`], sooner when `e`'s
/// error would reach [`MAX_CLOCK_ERROR`] before (halfway there), at least a
/// second apart.
pub fn next_read(e: &Estimate) -> Duration {
    let room = MAX_CLOCK_ERROR.saturating_sub(e.error);
    let lasts = Duration::from_secs_f64(room.as_secs_f64() / DRIFT);
    (lasts / 2).clamp(Duration::from_secs(1), REFRESH)
}

/// Reads the server's clock over a connection of its own, opened and closed
/// here, within `timeout`.
pub async fn read(target: &Target, timeout: Duration) -> Result<Estimate, String> {
    let work = async {
        let (client, connection) = conn::connect(target, timeout).await?;
        let mut best: Option<Estimate> = None;
        for _ in 0..SAMPLES {
            let sent = Instant::now();
            let rows = client
                .simple_query(NOW_SQL)
                .await
                .map_err(|e| conn::error_chain(&e))?;
            let received = Instant::now();
            let micros = rows
                .iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0),
                    _ => None,
                })
                .and_then(|v| v.parse::<i64>().ok())
                .ok_or("the server's clock_timestamp() did not come back as a number")?;
            let server = UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(0));
            let half = (received - sent) / 2;
            let estimate = Estimate {
                local: sent + half,
                server,
                error: half,
            };
            if best.is_none_or(|b| estimate.error < b.error) {
                best = Some(estimate);
            }
        }
        drop(client);
        let _ = tokio::time::timeout(Duration::from_secs(1), connection).await;
        best.ok_or_else(|| "no clock read".to_owned())
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "reading the server's clock timed out after {} ms",
            timeout.as_millis()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_grows_with_age() {
        let local = Instant::now();
        let server = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let e = Estimate {
            local,
            server,
            error: Duration::from_millis(2),
        };
        let (t, err) = e.at(local + Duration::from_secs(10));
        assert_eq!(t, server + Duration::from_secs(10));
        assert_eq!(err, Duration::from_millis(7));
        assert_eq!(
            e.instant_of(server + Duration::from_secs(3)),
            local + Duration::from_secs(3)
        );
        let (_, err) = e.at(local + Duration::from_secs(100));
        assert!(err > MAX_CLOCK_ERROR);
        assert_eq!(next_read(&e), REFRESH);
        let slow = Estimate {
            error: Duration::from_millis(48),
            ..e
        };
        assert_eq!(next_read(&slow), Duration::from_secs(2));
    }
}
