//! The database server's clock, as `lease run --every`/`--cron` reads it: due
//! times are on the server's clock, never on this host's.
//!
//! An estimate comes from a short-lived connection of its own (never the lease
//! session): the quickest of [`CLOCK_SAMPLES`] reads of `clock_timestamp()`. The
//! rules (its error, how it ages, when to read again) are lease-proto's
//! [`Estimate`], which the library's `Locker::schedule` uses too; this module
//! only reads.

use crate::conn::{self, Target};
use lease_proto::schedule::{CLOCK_SAMPLES, SERVER_TIME_SQL};
use std::time::{Duration, Instant, SystemTime};

pub use lease_proto::schedule::Estimate;

/// An estimate's server time now, if its error is within the bound.
pub trait Now {
    /// [`Estimate::time_at`] now.
    fn now(&self) -> Option<SystemTime>;
}

impl Now for Estimate {
    fn now(&self) -> Option<SystemTime> {
        self.time_at(Instant::now())
    }
}

/// When to read the clock again after `e` ([`Estimate::next_read`]).
pub fn next_read(e: &Estimate) -> Duration {
    e.next_read()
}

/// Reads the server's clock over a connection of its own, opened and closed
/// here, within `timeout`.
pub async fn read(target: &Target, timeout: Duration) -> Result<Estimate, String> {
    let work = async {
        let (client, connection) = conn::connect(target, timeout).await?;
        let mut best: Option<Estimate> = None;
        for _ in 0..CLOCK_SAMPLES {
            let sent = Instant::now();
            let rows = client
                .simple_query(SERVER_TIME_SQL)
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
            let estimate = Estimate::from_micros(sent, received, micros);
            if best.is_none_or(|b| estimate.read_error() < b.read_error()) {
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
