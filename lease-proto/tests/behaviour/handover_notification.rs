//! Who may skip the lock delay: any role may `NOTIFY lease_handover_v1, '<key>'`, and only
//! the holder's own notification (the sender pid the standby saw holding the key) counts as
//! a graceful release. Each test drives one machine by hand; each fails with
//! [`Mutation::NotifyFromAnyone`] (the code that took every handover notification for a
//! graceful release, run by `old_code_fails_every_test_here`).

use crate::common::*;
use lease_proto::server::*;
use lease_proto::sim::Mutation;
use lease_proto::sim::{Command, Harness};
use lease_proto::*;
use std::time::Duration;

fn opts() -> Options {
    let mut o = Options::default();
    o.retry_interval = ms(200);
    o.heartbeat_interval = ms(200);
    o.query_timeout = ms(500);
    o.guard_margin = ms(200);
    o.lock_delay = ms(20);
    o
}

fn key() -> i64 {
    LeaseId::named("a").unwrap().key()
}

fn notify(h: &mut Harness, sender_pid: i64) {
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload: release_payload(key()),
        sender_pid,
    });
}

/// Whether the standby tried at once (a try in flight).
fn tried_at_once(h: &Harness) -> bool {
    matches!(h.in_flight(), Some((_, Statement::TryLock { .. })))
}

/// After a wake: the try goes at once; whether its win starts the job at
/// once, not after the lock delay.
fn started_at_once(h: &mut Harness) -> bool {
    assert!(
        tried_at_once(h),
        "no try after the wake: {:?}",
        h.in_flight()
    );
    let cmds = h.win_held(900);
    cmds.iter().any(|c| matches!(c, Command::StartJob { .. }))
}

/// The standby waits behind holder 99; a client that is not a lease client
/// (backend 997) notifies just before 99's session is terminated: the wake
/// gets the lock delay.
fn forged_before_a_terminate(mutation: Option<Mutation>) -> bool {
    let mut h = Harness::with_mutation(opts(), 1, mutation).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    h.advance(ms(50));
    notify(&mut h, 997);
    h.advance(Duration::from_micros(500));
    h.wake(7);
    started_at_once(&mut h)
}

/// A herd: 99 released gracefully, this standby's woken try lost to 98 and
/// it waits again behind 98; 99's notification, delivered late (at 99's
/// commit), arrives now, and 98's session is terminated a moment later: the
/// wake gets the lock delay.
fn late_from_an_earlier_holder(mutation: Option<Mutation>) -> bool {
    let mut h = Harness::with_mutation(opts(), 1, mutation).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(50));
    h.wake(7);
    assert_eq!(h.try_keys(), vec![key()]);
    h.lose(Some(98));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    h.advance(ms(1));
    notify(&mut h, 99);
    h.advance(ms(2));
    h.wake(7);
    started_at_once(&mut h)
}

/// The holder's own notification still cuts the delay short.
fn from_the_holder(mutation: Option<Mutation>) -> bool {
    let mut h = Harness::with_mutation(opts(), 1, mutation).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(50));
    notify(&mut h, 99);
    h.wake(7);
    started_at_once(&mut h)
}

/// A polling standby (waiting on the server off) tries at a notification
/// only from the holder it saw: a forged one sent just before the holder's
/// terminate would otherwise make its try land right after the key is
/// freed, without any delay.
fn polling_standby_at_a_forged_notification(mutation: Option<Mutation>) -> bool {
    let o = {
        let mut o = opts();
        o.wait_on_server = false;
        o
    };
    let mut h = Harness::with_mutation(o, 1, mutation).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    assert!(h.in_flight().is_none());
    h.advance(ms(50));
    notify(&mut h, 997);
    tried_at_once(&h)
}

#[test]
fn a_forged_notification_does_not_skip_the_lock_delay() {
    assert!(!forged_before_a_terminate(None), "started at once");
}

#[test]
fn a_late_notification_from_an_earlier_holder_does_not_skip_the_lock_delay() {
    assert!(!late_from_an_earlier_holder(None), "started at once");
}

#[test]
fn the_holders_own_notification_skips_the_lock_delay() {
    assert!(from_the_holder(None), "waited the lock delay");
    assert!(from_the_holder(Some(Mutation::NotifyFromAnyone)));
}

#[test]
fn a_forged_notification_does_not_make_a_polling_standby_try() {
    assert!(
        !polling_standby_at_a_forged_notification(None),
        "tried at once"
    );
}

/// The broken variant is the code before the fix: every test above fails
/// with it.
#[test]
fn old_code_fails_every_test_here() {
    let old = Some(Mutation::NotifyFromAnyone);
    assert!(forged_before_a_terminate(old));
    assert!(late_from_an_earlier_holder(old));
    assert!(polling_standby_at_a_forged_notification(old));
}

/// The holder's own notification, delivered late (PostgreSQL sends it at its commit, and
/// a busy server or network holds it up): meanwhile another standby took the key and its
/// session was terminated. The notification still comes from the holder this standby saw,
/// but the release it reports is older than the lock delay before this standby's grant
/// (on the server's clock, the fencing token's): the win gets the lock delay. The
/// widened property `the_lock_delay_holds_against_forged_and_late_notifications` found it
/// (a notification 33 ms late; two leaders for 5 ms).
#[test]
fn a_late_notification_of_the_seen_holder_does_not_skip_the_lock_delay() {
    let mut h = Harness::new(opts(), 1).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(40));
    notify(&mut h, 99);
    h.wake(7);
    assert!(tried_at_once(&h));
    // Granted 30 ms after the release the notification reports: not that release's.
    let cmds = h.win_held(RELEASED_AT + 30_000);
    assert!(
        !cmds.iter().any(|c| matches!(c, Command::StartJob { .. })),
        "started at once: {cmds:?}"
    );
    // Granted within the lock delay of it: graceful.
    let mut h = Harness::new(opts(), 1).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(40));
    notify(&mut h, 99);
    h.wake(7);
    assert!(started_at_once(&mut h));
}
