//! The candidate policy, hand-driven: an observer (`Role::Observer`) never tries a
//! key, never waits for one and never joins a group; a standby of a higher priority
//! (`Role::Candidate`) asks the holder once, and a holder of a lower priority hands
//! the lease over to it, one of an equal or higher priority does not. The rules:
//! `Machine::observes` and `Machine::preference_requested`; docs/library.md,
//! "Observers and priorities".

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::server::*;
use lease_proto::sim::{Command, Harness};
use lease_proto::*;
use std::time::Duration;

fn observer(server_wait: ServerWait) -> Options {
    let mut o = opts();
    o.server_wait = server_wait;
    o.role = Role::Observer;
    o
}

fn with_priority(o: Options, priority: u32) -> Options {
    let mut o = o;
    o.role = Role::Candidate { priority };
    o
}

fn prefer_payload(name: &str, pid: i64, priority: u32) -> String {
    format!("prefer {} {pid} {priority}", key(name))
}

fn notify(h: &mut Harness, payload: String, sender_pid: i64) -> Vec<Command> {
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload,
        sender_pid,
    })
}

/// Answers every statement for `d` as a server where `holder` holds every key (`None`:
/// every key free) would, this session being backend 7; returns every statement sent.
fn answer_for(h: &mut Harness, d: Duration, holder: Option<i64>) -> Vec<Statement> {
    let end = h.now() + d;
    let mut sent = Vec::new();
    while h.now() < end {
        let Some((_, statement)) = h.in_flight().cloned() else {
            h.advance(ms(5));
            continue;
        };
        sent.push(statement.clone());
        match statement {
            Statement::TryLock { .. } => {
                match holder {
                    Some(_) => h.lose(holder),
                    None => h.win(1000 + sent.len() as i64),
                };
            }
            Statement::Heartbeat
            | Statement::Verify
            | Statement::Prefer { .. }
            | Statement::CheckHandover { .. } => {
                let reply = HeartbeatReply {
                    backend_pid: Some(7),
                    nonce: h.nonce(),
                    server_clock_us: None,
                };
                h.reply(reply.to_rows());
            }
            Statement::Take { timeout_ms, .. } => {
                // Blocks to its lock timeout, the key held all along.
                h.advance(ms(timeout_ms));
                h.held_all_along(7);
            }
            Statement::Members { keys, .. } => {
                let reply = MembersReply {
                    backend_pid: Some(7),
                    nonce: h.nonce(),
                    holders: keys.into_iter().map(|k| (k, holder)).collect(),
                    ..MembersReply::default()
                };
                h.reply(reply.to_rows());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    sent
}

/// An observer's run, its key free all along, waiting on the server allowed or not: it
/// sends no try and no wait over ten retry intervals, only reads of the key's holder
/// (`pg_locks`, joining no group), and its run stands by.
#[test]
fn an_observer_never_tries_even_a_free_key() {
    for wait in [ServerWait::IdleAndWatch, ServerWait::Off] {
        let mut h = harness(observer(wait));
        let run = h.run(lease("a"));
        h.connect(7);
        let sent = answer_for(&mut h, opts().retry_interval * 10, None);
        let looks = (sent.iter())
            .filter(|s| matches!(s, Statement::Members { join, groups, .. } if join.is_empty() && groups.is_empty()))
            .count();
        assert!(looks >= 5, "wait {wait:?}: {sent:?}");
        assert!(
            sent.iter()
                .all(|s| !matches!(s, Statement::TryLock { .. } | Statement::Take { .. })),
            "wait {wait:?}: an observer tried or waited: {sent:?}"
        );
        let status = h.machine().status();
        assert_eq!(status.leases[0].run, run);
        assert_eq!(
            status.leases[0].state,
            LeaseState::Standby { holder_pid: None }
        );
    }
}

/// An observer learns the holder from its read, and its run reports it, without trying.
#[test]
fn an_observer_reports_the_holder_it_reads() {
    let mut h = harness(observer(ServerWait::IdleAndWatch));
    h.run(lease("a"));
    h.connect(7);
    let sent = answer_for(&mut h, opts().retry_interval * 3, Some(4242));
    assert!(sent
        .iter()
        .all(|s| !matches!(s, Statement::TryLock { .. } | Statement::Take { .. })));
    assert_eq!(
        h.machine().status().leases[0].state,
        LeaseState::Standby {
            holder_pid: Some(4242)
        }
    );
}

/// An observer's run in a lease group joins no group and reads no membership: it counts
/// in no member's share.
#[test]
fn an_observer_does_not_join_its_group() {
    let mut h = harness(observer(ServerWait::IdleAndWatch));
    let group = GroupId::named("g").expect("a group name");
    h.run(LeaseId::named("a").expect("a name").in_group(group));
    h.connect(7);
    let sent = answer_for(&mut h, opts().retry_interval * 10, None);
    assert!(!sent.is_empty());
    for s in &sent {
        match s {
            Statement::Members {
                join,
                groups,
                announce,
                leave,
                claims,
                ..
            } => assert!(
                join.is_empty()
                    && groups.is_empty()
                    && announce.is_empty()
                    && leave.is_empty()
                    && claims.is_empty(),
                "{s:?}"
            ),
            Statement::Heartbeat => {}
            other => panic!("an observer sent {other:?}"),
        }
    }
}

/// A standby of priority 2 whose try finds the key held by backend 99 asks it once, at
/// once (before anything else); the same holder again within a validity window: no new
/// request; a new holder: a new request. A standby of priority 0 never asks.
#[test]
fn a_standby_with_a_priority_asks_the_holder_once() {
    let mut h = harness(with_priority(opts(), 2));
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert_eq!(
        h.statement(),
        Statement::Prefer {
            key: key("a"),
            priority: 2,
        }
    );
    let window = opts().heartbeat_interval + opts().query_timeout;
    let sent = answer_for(&mut h, window - ms(50), Some(99));
    let asked = |sent: &[Statement]| {
        (sent.iter())
            .filter(|s| matches!(s, Statement::Prefer { .. }))
            .count()
    };
    assert_eq!(asked(&sent), 1, "{sent:?}");
    let sent = answer_for(&mut h, opts().retry_interval * 2, Some(98));
    assert!(asked(&sent) >= 1, "a new holder was not asked: {sent:?}");

    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    let sent = answer_for(&mut h, opts().retry_interval * 5, Some(99));
    assert_eq!(asked(&sent), 0, "{sent:?}");
}

/// A standby that asked and still finds the same holder asks it again less and less often
/// (after a validity window, then two, then every four) for as long as the holder does not
/// hand over (a refused ask interrupts nothing); once that holder has announced three
/// hand-overs to it (it could not take the key in the reservation window, as on a slow
/// link), it asks that holder no more, so the holder's job is interrupted a bounded number
/// of times, never every few seconds for good.
#[test]
fn a_standby_asks_again_less_often_and_stops_after_three_hand_overs() {
    let mut h = harness(with_priority(opts(), 2));
    h.run(lease("a"));
    h.connect(7);
    let window = opts().validity_window();
    let count = |sent: &[Statement]| {
        (sent.iter())
            .filter(|s| matches!(s, Statement::Prefer { .. }))
            .count()
    };
    let sent = answer_for(&mut h, window * 20, Some(99));
    // At 0, 1, 3, 7, 11, 15 and 19 windows.
    assert!((6..=8).contains(&count(&sent)), "{sent:?}");
    for _ in 0..3 {
        notify(&mut h, handover_request_payload(key("a"), 7), 99);
    }
    let sent = answer_for(&mut h, window * 20, Some(99));
    assert_eq!(count(&sent), 0, "{sent:?}");
}

/// A holder of priority 0 asked by backend 99 of priority 1 hands the lease over as a
/// `to` request does: once a check finds 99 (or a watch session whose wait names 99)
/// waiting for the key, the job is cancelled, the key released once it returned, and not
/// tried again within the window after the release.
#[test]
fn a_lower_priority_holder_hands_over_to_a_preferred_standby() {
    let mut h = harness(polling());
    let run = started(&mut h, "a", 900);
    let cmds = notify(&mut h, prefer_payload("a", 99, 1), 99);
    assert!(!handed_over(&cmds), "handed over before a check: {cmds:?}");
    assert_eq!(
        h.statement(),
        Statement::CheckHandover {
            asks: vec![(key("a"), 99)]
        }
    );
    let cmds = h.check_answered(7, &[(1, 99)]);
    assert!(handed_over(&cmds), "{cmds:?}");
    handed_over_job_returns(&mut h, run);
    let window = opts().query_timeout * 2;
    let sent = answer_for(&mut h, window - ms(10), Some(99));
    assert!(
        sent.iter()
            .all(|s| !matches!(s, Statement::TryLock { keys, .. } if keys.contains(&key("a")))),
        "tried within the window: {sent:?}"
    );
}

/// A holder of an equal or higher priority ignores the request; so does any holder for a
/// request whose named backend is not its sender.
#[test]
fn an_equal_or_higher_priority_holder_ignores_a_preference() {
    for (own, asked, sender) in [(1, 1, 99), (2, 1, 99), (0, 1, 555)] {
        let mut h = harness(with_priority(polling(), own));
        started(&mut h, "a", 900);
        let cmds = notify(&mut h, prefer_payload("a", 99, asked), sender);
        assert!(
            !handed_over(&cmds) && h.in_flight().is_none(),
            "own {own}, asked {asked} by {sender}: {cmds:?}"
        );
        assert!(matches!(
            h.machine().status().leases[0].state,
            LeaseState::Leading { .. }
        ));
    }
}

/// The old payloads mean what they did for a locker with a priority: `to <key> <pid>`
/// hands over whatever the holder's priority (an operator's request), and a malformed
/// `prefer` is ignored, never taken for a release or a request.
#[test]
fn old_payloads_are_unaffected_by_priorities() {
    let mut h = harness(with_priority(polling(), 7));
    started(&mut h, "a", 900);
    for payload in [
        format!("prefer {} 99", key("a")),
        format!("prefer {} 99 x", key("a")),
        format!("prefer {} 99 8 1", key("a")),
    ] {
        let cmds = notify(&mut h, payload.clone(), 99);
        assert!(!handed_over(&cmds), "{payload}: {cmds:?}");
        assert!(h.in_flight().is_none(), "{payload}: {:?}", h.in_flight());
    }
    notify(&mut h, handover_request_payload(key("a"), 99), 555);
    let cmds = h.check_answered(7, &[(1, 99)]);
    assert!(handed_over(&cmds), "{cmds:?}");
}

/// An observer has no priority to refuse (`Role::Observer` carries none); a candidate's
/// priority above `MAX_PRIORITY` (the rank of a `lease handover --to` request) is refused
/// with one line, and `MAX_PRIORITY` itself is valid.
#[test]
fn a_priority_above_the_highest_is_refused() {
    let observer = observer(ServerWait::IdleAndWatch);
    assert_eq!(observer.role.priority(), None);
    observer.validate().unwrap();
    with_priority(opts(), limits::MAX_PRIORITY)
        .validate()
        .unwrap();
    let e = with_priority(opts(), u32::MAX).validate().unwrap_err();
    assert_eq!(e, OptionsError::PriorityTooHigh(u32::MAX));
    assert_eq!(
        e.to_string(),
        "priority 4294967295 is above the highest, 4294967294 (the one above it ranks a requested hand-over)"
    );
}
