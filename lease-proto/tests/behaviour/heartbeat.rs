//! The holder's heartbeat: the steady heartbeat confirms without reading `pg_locks`,
//! every twelfth is a verify that reads it, and a standby with a long retry interval
//! still keeps its session alive.

use crate::common::*;
use lease_proto::limits::*;
use lease_proto::reply::TryReply;
use lease_proto::sim::{Command, Harness};
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

/// Answers heartbeats and verifies (showing `held`) until a try is in flight.
fn until_try(h: &mut Harness, held: &[i64]) {
    for _ in 0..10_000 {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::TryLock { .. }) => return,
            Some(Statement::Heartbeat | Statement::Verify) => {
                h.advance(ms(1));
                h.heartbeat(7, held);
            }
            Some(s) => panic!("unexpected {s:?}"),
            None => {
                h.advance(ms(10));
            }
        }
    }
    panic!("no try");
}

/// A run lost by a verify that did not show its key, whose key a later verify shows
/// held (a server that contradicts itself): the key stays locked, the session open,
/// until the cancelled job returns; then it is unlocked. Closing the idle session
/// would free the key while the job still runs.
#[test]
fn a_key_a_verify_finds_held_by_a_lost_run_stays_locked_until_its_job_returns() {
    let mut h = harness(polling());
    let a = h.run(lease("a"));
    let b = h.run(lease("b"));
    h.connect(7);
    let (ka, kb) = (key("a"), key("b"));
    // One try of both: a won, b held by another backend.
    let rows = TryReply {
        won: vec![(ka, 900)],
        not_won: vec![(kb, Some(99))],
        untrusted: false,
        session: Some((7, h.nonce())),
    }
    .to_rows();
    h.reply(rows);
    let at = h.machine().poll_timeout().unwrap();
    let cmds = h.advance(at.saturating_duration_since(h.now()));
    assert!(
        has(
            &cmds,
            |c| matches!(c, Command::StartJob { run, .. } if *run == a)
        ),
        "{cmds:?}"
    );
    // b's next try fails: a verify is owed. It does not show a's key: a is lost.
    until_try(&mut h, &[ka]);
    h.fail(boom("XX000"));
    assert_eq!(h.statement(), Statement::Verify);
    let cmds = h.heartbeat(7, &[]);
    assert!(
        has(
            &cmds,
            |c| matches!(c, Command::CancelJob { run, .. } if *run == a)
        ),
        "{cmds:?}"
    );
    // b's next try fails again; this verify shows a's key held.
    until_try(&mut h, &[]);
    h.fail(boom("XX000"));
    assert_eq!(h.statement(), Statement::Verify);
    h.heartbeat(7, &[ka]);
    // b is shut down: no run needs the session but for a's key, held while a's
    // cancelled job runs.
    let cmds = h.input(Input::Shutdown { run: b });
    assert!(
        !has(&cmds, |c| matches!(c, Command::CloseSession { .. })),
        "the session (holding a's key) was closed while a's cancelled job still runs: {cmds:?}"
    );
    // a's job returns: its key is unlocked, then the idle session closes.
    h.input(Input::JobExited {
        run: a,
        exit: JobExit::Ok,
    });
    assert!(
        matches!(h.statement(), Statement::Release { keys, .. } if keys == vec![ka]),
        "{:?}",
        h.statement()
    );
}
