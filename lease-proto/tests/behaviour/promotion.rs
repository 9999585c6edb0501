//! On a newly promoted primary a session tries nothing (and waits for nothing) until
//! `Options::promotion_hold` has passed since the promotion, and heartbeats meanwhile; a
//! server that only ran crash recovery costs nothing.

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::sim::Command;
use lease_proto::sim::Harness;
use lease_proto::*;
use std::time::Duration;

/// Starts a run and answers its setup with `promotion`, then LISTEN; returns the harness,
/// the session's nonce and the events of the setup's reply.
fn set_up(promotion: PromotionState) -> (Harness, i64, Vec<Event>) {
    let o = opts();
    let mut h = Harness::new(o.clone(), 1).unwrap();
    h.run(lease("a"));
    let nonce = open_until_setup(&mut h);
    h.reply(
        SetupReply {
            promotion,
            ..setup_reply(&o, nonce)
        }
        .to_rows(),
    );
    let events = h.events().to_vec();
    assert_eq!(h.statement(), Statement::Listen);
    h.reply(vec![]);
    (h, nonce, events)
}

fn is_try_or_wait(c: &Command) -> bool {
    matches!(
        c,
        Command::Query {
            statement: Statement::TryLock { .. } | Statement::Take { .. },
            ..
        }
    )
}

/// Steps 10 ms at a time until a try is in flight, answering heartbeats; returns how long
/// after `from` the try went and how many heartbeats were answered before it.
fn until_try(h: &mut Harness, nonce: i64, limit: Duration) -> (Duration, usize) {
    let from = h.now();
    let mut heartbeats = 0;
    loop {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::TryLock { .. }) => return (h.now() - from, heartbeats),
            Some(Statement::Heartbeat | Statement::Verify) => {
                heartbeats += 1;
                let reply = HeartbeatReply {
                    backend_pid: Some(7),
                    nonce: Some(nonce),
                    server_clock_us: None,
                };
                let cmds = h.reply(reply.to_rows());
                assert!(!cmds
                    .iter()
                    .any(|c| matches!(c, Command::CloseSession { .. })));
            }
            Some(other) => panic!("unexpected statement {other:?}"),
            None => {
                assert!(h.now() - from < limit, "no try within {limit:?}");
                h.advance(ms(10));
            }
        }
    }
}

#[test]
fn a_pending_promotion_checkpoint_holds_tries_for_the_whole_hold() {
    let hold = opts().promotion_hold();
    let (mut h, nonce, events) = set_up(PromotionState {
        replayed_since_start: true,
        wal_timeline: Some(3),
        checkpoint_timeline: Some(2),
        checkpoint_age_ms: Some(400),
        history_age_ms: None,
    });
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::PromotionHold { hold: d, .. } if *d == hold)),
        "{events:?}"
    );
    let (after, heartbeats) = until_try(&mut h, nonce, hold * 2);
    eprintln!("hold {hold:?}: first try after {after:?}, {heartbeats} heartbeats before it");
    assert!(
        after >= hold,
        "tried {after:?} after the setup, hold {hold:?}"
    );
    assert!(
        after < hold + ms(50),
        "tried {after:?} after the setup, hold {hold:?}"
    );
    // The guard (idle_session_timeout) is shorter than the hold: heartbeats kept the
    // session from looking idle.
    assert!(hold > opts().guard_timeout());
    assert!(
        heartbeats >= 5,
        "{heartbeats} heartbeats during a {hold:?} hold"
    );
    // The hold's end is an event of its own (logged with the host), once, before the try.
    let ended: Vec<&Event> = (h.events().iter())
        .filter(|e| matches!(e, Event::PromotionHoldEnded { .. }))
        .collect();
    assert_eq!(ended.len(), 1, "{:?}", h.events());
    let cmds = h.win(5);
    assert!(cmds.iter().any(|c| matches!(c, Command::StartJob { .. })));
}

#[test]
fn the_checkpoint_after_the_promotion_shortens_the_hold() {
    let hold = opts().promotion_hold();
    // The promotion's checkpoint started in the second that began 1.6 s before the
    // setup read the clock: the promotion was at most 0.6 s before.
    let (mut h, nonce, _) = set_up(PromotionState {
        replayed_since_start: true,
        wal_timeline: Some(2),
        checkpoint_timeline: Some(2),
        checkpoint_age_ms: Some(1_600),
        history_age_ms: None,
    });
    let (after, _) = until_try(&mut h, nonce, hold * 2);
    let expected = hold - ms(600);
    assert!(
        after >= expected && after < expected + ms(50),
        "tried {after:?} after the setup, expected {expected:?}"
    );
}

#[test]
fn nothing_is_held_after_crash_recovery_or_long_after_a_promotion() {
    for (what, promotion) in [
        ("never promoted", PromotionState::default()),
        (
            "crash recovery, never promoted",
            PromotionState {
                replayed_since_start: false,
                wal_timeline: Some(1),
                checkpoint_timeline: Some(1),
                checkpoint_age_ms: Some(100),
                history_age_ms: None,
            },
        ),
        (
            // On timeline 2 without the history file, a crash may follow a
            // promotion: held (`promotion::tests`). Its history file dates
            // the promotion an hour back.
            "crash recovery, promoted an hour ago",
            PromotionState {
                replayed_since_start: false,
                wal_timeline: Some(2),
                checkpoint_timeline: Some(2),
                checkpoint_age_ms: Some(100),
                history_age_ms: Some(3_600_000),
            },
        ),
        (
            "promoted a minute ago",
            PromotionState {
                replayed_since_start: true,
                wal_timeline: Some(2),
                checkpoint_timeline: Some(2),
                checkpoint_age_ms: Some(60_000),
                history_age_ms: None,
            },
        ),
    ] {
        let (h, _, events) = set_up(promotion);
        assert!(
            matches!(h.in_flight(), Some((_, Statement::TryLock { .. }))),
            "{what}: {:?}",
            h.in_flight()
        );
        assert!(!events
            .iter()
            .any(|e| matches!(e, Event::PromotionHold { .. })));
    }
}

#[test]
fn a_new_session_reads_the_hold_again() {
    // The session is lost during the hold: the next one's setup decides alone.
    let (mut h, _, _) = set_up(PromotionState {
        replayed_since_start: true,
        wal_timeline: Some(3),
        checkpoint_timeline: Some(2),
        checkpoint_age_ms: Some(0),
        history_age_ms: None,
    });
    let s = h.session().unwrap();
    let cmds = h.input(Input::SessionEnded {
        session: s,
        error: None,
    });
    assert!(!cmds.iter().any(is_try_or_wait));
    let mut opened = false;
    for _ in 0..100 {
        let cmds = h.advance(ms(10));
        if cmds
            .iter()
            .any(|c| matches!(c, Command::OpenSession { .. }))
        {
            opened = true;
            break;
        }
    }
    assert!(opened, "no new session");
    h.connect(8);
    assert!(
        matches!(h.in_flight(), Some((_, Statement::TryLock { .. }))),
        "{:?}",
        h.in_flight()
    );
}
