//! The watchdog's clock: `CLOCK_MONOTONIC`, system-wide, so the runner and
//! its watchdog (two processes) agree on a deadline given in nanoseconds.

use std::time::{Duration, Instant};

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub(crate) fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// `at` on `CLOCK_MONOTONIC`, in nanoseconds: the clock of the watchdog's
/// deadlines, system-wide, so another process (the command, a tool it
/// runs) can compare it with its own reading of that clock.
///
/// `std::time::Instant` is `CLOCK_MONOTONIC` on Linux, so this only moves
/// the origin. The clock is read before the `Instant`, so any error makes
/// the result early, never late.
pub fn monotonic_nanos(at: Instant) -> u64 {
    let mono = now();
    let now = Instant::now();
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match at.checked_duration_since(now) {
        Some(ahead) => mono.saturating_add(nanos(ahead)),
        None => mono.saturating_sub(nanos(now - at)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_map_onto_the_monotonic_clock() {
        let at = Instant::now();
        let mono = now();
        let later = monotonic_nanos(at + Duration::from_secs(2));
        let diff = later as i128 - (mono as i128 + 2_000_000_000);
        assert!(diff.abs() < 5_000_000, "off by {diff} ns");
        let earlier = monotonic_nanos(at - Duration::from_millis(1));
        assert!(earlier < mono);
    }
}
