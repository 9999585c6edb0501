//! A hand-over asked for (`lease handover NAME --to PID`, the payload
//! `lease_proto::server::handover_request_payload`): the holder hands the lease over
//! gracefully, and no locker but the named one tries it within the window after the
//! release, so the named one takes it at the release's notification.

use crate::common::*;
use lease_proto::server::*;
use lease_proto::sim::{Command, Harness};
use lease_proto::*;

fn request(h: &mut Harness, name: &str, to: i64) -> Vec<Command> {
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload: handover_request_payload(key(name), to),
        sender_pid: 555,
    })
}

fn release_notification(h: &mut Harness, name: &str, holder: i64) -> Vec<Command> {
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload: release_payload(key(name)),
        sender_pid: holder,
    })
}

/// Answers every statement but tries for `d`; returns the tries' keys.
fn tries_within(h: &mut Harness, d: std::time::Duration) -> Vec<Vec<i64>> {
    let end = h.now() + d;
    let mut tries = Vec::new();
    while h.now() < end {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::TryLock { keys, .. }) => {
                tries.push(keys);
                h.lose(Some(99));
            }
            Some(Statement::Heartbeat | Statement::Verify) => {
                h.heartbeat(7, &[]);
            }
            Some(Statement::Take { .. }) => {
                h.held_all_along(7);
            }
            _ => {
                h.advance(ms(5));
            }
        }
    }
    tries
}

/// The holder asked to hand over to backend 99: its job is cancelled (handed over), the
/// key released once the job returned, and it does not try the key again within the
/// window (two query timeouts, 1 s here) after the release; then it does.
#[test]
fn the_holder_hands_over_and_leaves_the_key_to_the_named_backend() {
    let mut h = harness(polling());
    let run = started(&mut h, "a", 900);
    let cmds = request(&mut h, "a", 99);
    assert!(handed_over(&cmds), "{cmds:?}");
    handed_over_job_returns(&mut h, run);
    let window = opts().query_timeout * 2;
    let tries = tries_within(&mut h, window - ms(10));
    assert!(
        tries.iter().all(|k| !k.contains(&key("a"))),
        "tried within the window: {tries:?}"
    );
    let tries = tries_within(&mut h, opts().retry_interval * 2);
    assert!(
        tries.iter().any(|k| k.contains(&key("a"))),
        "never tried after the window: {tries:?}"
    );
}

/// A standby not named leaves the key alone after the holder's release; the named one
/// (its own backend, 7) tries at the release's notification.
#[test]
fn only_the_named_standby_tries_at_the_release() {
    for (to, tries_at_once) in [(98, false), (7, true)] {
        let mut h = harness(polling());
        h.run(lease("a"));
        h.connect(7);
        h.lose(Some(99));
        assert!(h.in_flight().is_none());
        request(&mut h, "a", to);
        h.advance(ms(20));
        release_notification(&mut h, "a", 99);
        let tried = matches!(h.in_flight(), Some((_, Statement::TryLock { .. })));
        assert_eq!(tried, tries_at_once, "asked for {to}: {:?}", h.in_flight());
        if !tried {
            let tries = tries_within(&mut h, opts().query_timeout * 2 - ms(30));
            assert!(
                tries.iter().all(|k| !k.contains(&key("a"))),
                "tried within the window: {tries:?}"
            );
        }
    }
}
