//! Schedules: when a scheduled job is due, and what its leader does at each due time.
//!
//! A schedule is a lease: the replica that holds the schedule's lease runs its
//! job at every due time, and a standby takes the lease (and the schedule) over
//! when the holder goes. This module is the pure part, in the server's time
//! (`SystemTime` values read off the database server's clock, never a host's):
//!
//! - [`Spec`]: the due times, a fixed period aligned to the Unix epoch
//!   (`every 15m`) or a cron expression in an IANA time zone;
//! - [`jitter`]: a deterministic delay per due time, so a failover never moves
//!   a start;
//! - [`Planner`]: what the leader does at each due time ([`Action`]): start the
//!   job, skip the due time (and why: [`Missed`]) or stop the running job
//!   ([`Overlap::Replace`]), and which due times a new leader takes over;
//! - [`Estimate`]: the server's clock as a leader reads it (on a connection of
//!   its own: [`SERVER_TIME_SQL`]), and its error as it ages.
//!
//! The rules, their conditions and the at-most-once argument: docs/schedules.md
//! of the repository.

mod clock;
mod planner;
mod spec;

pub use clock::{Estimate, CLOCK_REFRESH, CLOCK_SAMPLES, SERVER_TIME_SQL};
pub use planner::{
    Action, CatchUp, Missed, Occurrence, Overlap, Planner, Policy, Record, MAX_CATCH_UP_SCAN,
    MAX_CATCH_UP_WINDOW, MAX_JITTER,
};
pub use spec::{jitter, Spec, SpecError};

use std::time::Duration;

/// The largest error a leader's estimate of the server's clock may have when it
/// starts a due time (or takes a schedule over). A leader whose estimate is less
/// certain starts nothing until it has a better one. A new leader leaves every
/// due time up to twice this past its grant to the old leader: two estimates,
/// each within this bound, cannot then both claim one due time.
pub const MAX_CLOCK_ERROR: Duration = Duration::from_millis(50);

/// The clock-rate difference a leader assumes between its host and the server when
/// its reading of the server's clock ages: 500 ppm, ten times what an
/// NTP-disciplined clock keeps to. A reading's error grows by this much of its age.
pub const CLOCK_DRIFT: f64 = 0.0005;

/// The shortest period of [`Spec::every`].
pub const MIN_PERIOD: Duration = Duration::from_secs(1);

/// How many missed due times [`CatchUp::All`] runs after a gap, at most; the
/// older ones are skipped ([`Missed::CatchUpCap`]).
pub const MAX_CATCH_UP: usize = 100;
