//! The holder's heartbeat: the steady heartbeat confirms without reading `pg_locks`,
//! every twelfth is a verify that reads it, and a standby with a long retry interval
//! still keeps its session alive.

use crate::common::*;
use lease_proto::limits::*;
use lease_proto::sim::Command;
use lease_proto::*;
use std::time::Duration;

#[test]
fn the_steady_heartbeat_confirms_without_reading_pg_locks() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    h.advance(ms(200));
    assert_eq!(h.statement(), Statement::Heartbeat);
    assert!(!h.statement().sql().contains("pg_locks"));
    let sent = h.now();
    h.advance(ms(5));
    let cmds = h.heartbeat(7, &[]);
    assert!(!has(&cmds, |c| matches!(c, Command::CancelJob { .. })));
    let validity = opts().validity_window();
    assert_eq!(h.machine().valid_until(run), Some(sent + validity));
}

#[test]
fn a_verify_without_the_key_cancels_the_job() {
    let mut h = harness(opts());
    started(&mut h, "a", 900);
    h.run(lease("b"));
    h.advance(Duration::ZERO);
    assert!(matches!(h.statement(), Statement::TryLock { .. }));
    h.fail(boom("53200"));
    assert_eq!(h.statement(), Statement::Verify);
    let cmds = h.heartbeat(7, &[]);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::NotHeld,
            ..
        }
    )));
}

/// Every `VERIFY_EVERY`th heartbeat reads `pg_locks`: a key freed behind the
/// session's back (a foreign client on a shared pooled backend) is found
/// within that many heartbeat intervals.
#[test]
fn every_twelfth_heartbeat_is_a_verify() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    let mut kinds = Vec::new();
    for _ in 0..2 * VERIFY_EVERY {
        h.advance(ms(200));
        let s = h.statement();
        kinds.push(matches!(s, Statement::Verify));
        h.heartbeat(7, &[key("a")]);
    }
    let verifies: Vec<usize> = (kinds.iter().enumerate())
        .filter_map(|(i, v)| v.then_some(i + 1))
        .collect();
    let n = VERIFY_EVERY as usize;
    assert_eq!(verifies, vec![n, 2 * n]);
    assert!(h.machine().is_valid(run, h.now()));
    // One that no longer shows the key cancels the job.
    for _ in 1..VERIFY_EVERY {
        h.advance(ms(200));
        assert_eq!(h.statement(), Statement::Heartbeat);
        h.heartbeat(7, &[]);
    }
    h.advance(ms(200));
    assert_eq!(h.statement(), Statement::Verify);
    let cmds = h.heartbeat(7, &[]);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::NotHeld,
            ..
        }
    )));
}

/// With a retry interval so long that tries alone would let the server
/// guard end the session (retry + query timeout not below the guard), a
/// standby keeps heartbeating in between, each try pushing the heartbeat
/// back.
#[test]
fn a_standby_with_a_long_retry_still_keeps_its_session_alive() {
    let o = {
        let mut o = polling();
        o.retry_interval = ms(2000);
        o
    };
    assert!(o.retry_interval + o.query_timeout >= o.guard_timeout());
    let mut h = harness(o.clone());
    h.run(lease("a"));
    h.connect(7);
    let sent = standby_at_rest(&mut h, ms(10_000));
    let tries = sent
        .iter()
        .filter(|s| matches!(s, Statement::TryLock { .. }))
        .count();
    let heartbeats = sent.len() - tries;
    assert!((5..=7).contains(&tries), "{sent:?}");
    assert!(heartbeats >= 30, "{sent:?}");
    assert!(!h
        .events()
        .iter()
        .any(|e| matches!(e, Event::SessionLost { .. })));
}

/// A holder's try (for another lease it wants) proves the session as a
/// heartbeat does: its answer confirms the held lease from the try's send
/// time. Else the heartbeat that comes due while the try is in flight goes
/// only after its reply, and the lease may expire before that heartbeat's
/// own reply, without a fault (a simulated ring of holders lost its own lease
/// that way 111 ms after another holder's crash:
/// `instant_takeover_of_a_holders_wanted_lease_after_a_late_heartbeat`).
#[test]
fn a_holders_try_confirms_its_leases_as_a_heartbeat_does() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    h.advance(ms(150));
    h.run(lease("b"));
    h.advance(Duration::ZERO);
    assert!(matches!(h.statement(), Statement::TryLock { .. }));
    let sent = h.now();
    // Answered after the heartbeat came due (200 ms after the win): the
    // heartbeat goes next, and the lease counts from the try.
    h.advance(ms(80));
    h.lose(Some(8));
    assert_eq!(h.statement(), Statement::Heartbeat);
    let validity = opts().validity_window();
    assert_eq!(h.machine().valid_until(run), Some(sent + validity));
}
