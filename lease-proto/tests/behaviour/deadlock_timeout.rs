//! In the simulator: a standby's wait that lasted the server's `deadlock_timeout` would run
//! the deadlock detector and, with `log_lock_waits = on`, write "still waiting" to the
//! server log (again every 250 ms until it ended). The wait stays below it, in chunks;
//! these tests count the lock waits that reached it
//! ([`Report::lock_waits_past_deadlock_timeout`](lease_proto::sim::Report)) and
//! measure the cost in statements per retry interval.

use crate::common::*;
use lease_proto::sim::Fault;
use lease_proto::sim::ServerConfig;
use lease_proto::sim::Sim;
use lease_proto::sim::SimConfig;
use lease_proto::Options;
use std::time::Duration;
use std::time::Instant;

/// Two processes, one lease, the library's defaults but a 3 s retry interval (a
/// standby at rest then needs no heartbeats: its statements are its waits and tries);
/// the server's `deadlock_timeout` and whether the wait ignores it (the statement
/// before the fix).
fn cfg(deadlock_timeout: Duration, broken: bool) -> SimConfig {
    SimConfig {
        processes: 2,
        options: {
            let mut o = Options::default();
            o.retry_interval = ms(3000);
            o
        },
        server: ServerConfig {
            deadlock_timeout,
            wait_ignores_deadlock_timeout: broken,
            ..ServerConfig::default()
        },
        ..SimConfig::default()
    }
}

/// Runs 30 s with one holder and one standby: the standby's statements per
/// retry interval (after the first 2 s), the lock waits that reached
/// `deadlock_timeout`, and how long the standby took to lead after the
/// holder crashed at 30 s.
fn standby_at_rest(cfg: SimConfig) -> (f64, u64, Duration) {
    let retry = cfg.options.retry_interval;
    let mut sim = Sim::new(cfg, Instant::now());
    sim.run_until(ms(2000));
    let holder = (0..2).find(|p| sim.leads(*p, "job")).expect("a holder");
    let standby = 1 - holder;
    let before = sim.statements(standby);
    sim.run_until(ms(30_000));
    let statements = sim.statements(standby) - before;
    let per_retry = statements as f64 * retry.as_secs_f64() / 28.0;
    sim.schedule(
        ms(30_000),
        Fault::Crash {
            process: holder,
            restart_after: None,
        },
    );
    let mut t = ms(30_000);
    while !sim.leads(standby, "job") && t < ms(40_000) {
        t += Duration::from_micros(200);
        sim.run_until(t);
    }
    let took = t - ms(30_000);
    let r = sim.finish(ms(41_000), ms(2000));
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    (per_retry, r.lock_waits_past_deadlock_timeout, took)
}

#[test]
fn a_waiting_standby_stays_below_deadlock_timeout() {
    let (per_retry, logged, took) = standby_at_rest(cfg(ms(1000), false));
    eprintln!(
        "FIGURE deadlock_timeout 1 s, retry 3 s: {per_retry:.2} statements per retry interval, \
         {logged} lock waits reached deadlock_timeout, takeover {took:?} after a holder crash"
    );
    assert_eq!(logged, 0, "lock waits reached deadlock_timeout");
    // ceil(3000 / 900) = 4 waits per retry interval.
    assert!(
        per_retry <= 4.2,
        "{per_retry} statements per retry interval"
    );
    assert!(took < ms(100), "takeover took {took:?}");
}

/// The cost at the library's defaults (retry 5 s): ceil(5000 / 900) = 6 waits
/// per retry interval instead of 1.
#[test]
fn the_cost_at_the_library_defaults() {
    let mut c = cfg(ms(1000), false);
    c.options.retry_interval = lease_proto::limits::DEFAULT_RETRY_INTERVAL;
    let (per_retry, logged, took) = standby_at_rest(c.clone());
    c.server.wait_ignores_deadlock_timeout = true;
    let (before, _, _) = standby_at_rest(c);
    eprintln!(
        "FIGURE defaults (retry 5 s), deadlock_timeout 1 s: {per_retry:.2} statements per retry \
         interval ({before:.2} before the fix), {logged} lock waits reached deadlock_timeout, \
         takeover {took:?}"
    );
    assert_eq!(logged, 0);
    assert!(
        per_retry <= 6.2,
        "{per_retry} statements per retry interval"
    );
}

/// The broken variant, the wait before the fix: one lock wait per retry
/// interval reaches `deadlock_timeout` (each one logged with `log_lock_waits`).
#[test]
fn broken_waits_past_deadlock_timeout_are_counted() {
    let (per_retry, logged, _) = standby_at_rest(cfg(ms(1000), true));
    eprintln!(
        "FIGURE broken: {per_retry:.2} statements per retry interval, {logged} lock waits \
         reached deadlock_timeout"
    );
    assert!(logged >= 8, "{logged} lock waits reached deadlock_timeout");
}

/// A `deadlock_timeout` so short that no wait is worth sending below it: the
/// standby polls (one try per retry interval after one wait that learned it),
/// never spins.
#[test]
fn under_a_tiny_deadlock_timeout_the_standby_polls() {
    let (per_retry, logged, took) = standby_at_rest(cfg(ms(5), false));
    eprintln!(
        "FIGURE deadlock_timeout 5 ms, retry 3 s: {per_retry:.2} statements per retry interval, \
         {logged} lock waits reached deadlock_timeout, takeover {took:?}"
    );
    assert_eq!(logged, 0);
    assert!(
        per_retry <= 1.5,
        "{per_retry} statements per retry interval"
    );
}
