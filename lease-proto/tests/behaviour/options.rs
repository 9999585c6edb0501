//! [`Options::validate`](lease_proto::Options::validate) refuses absurd timing options.

use crate::common::*;
use lease_proto::*;
use std::time::Duration;

/// Absurd timing options are refused. The rule chosen here:
///
/// - `query_timeout >= 10 ms`: the query timeout also bounds connecting plus
///   the setup statement, which no loaded host reliably does faster; below it
///   a runner times out forever and never leads;
/// - `heartbeat_interval <= 100 * query_timeout`: a query timeout that small
///   against the heartbeat is a unit mistake (`1h` / `1ms`), not a tuning.
///
/// Options at the boundary (10 ms, and exactly 100 x) stay valid.
#[test]
fn absurd_timing_options_are_refused() {
    let o = |heartbeat: Duration, query_timeout: Duration| {
        let mut o = Options::default();
        o.heartbeat_interval = heartbeat;
        o.query_timeout = query_timeout;
        o
    };
    let hour = Duration::from_secs(3_600);
    let s = Duration::from_secs;
    let bad = [
        ("heartbeat 1h, query timeout 1ms", o(hour, ms(1))),
        ("heartbeat 50ms, query timeout 5ms", o(ms(50), ms(5))),
        ("heartbeat 200s, query timeout 1s (200x)", o(s(200), s(1))),
    ];
    let good = [
        ("defaults", Options::default()),
        ("heartbeat 1s, query timeout 10ms (100x)", o(s(1), ms(10))),
        ("heartbeat 100ms, query timeout 1s", o(ms(100), s(1))),
    ];
    for (what, opts) in &good {
        assert_eq!(opts.validate(), Ok(()), "{what} must stay valid");
    }
    let accepted: Vec<&str> = bad
        .iter()
        .filter(|(_, opts)| opts.validate().is_ok())
        .map(|(what, _)| *what)
        .collect();
    assert!(
        accepted.is_empty(),
        "Options::validate accepted absurd settings: {accepted:?}"
    );
}
