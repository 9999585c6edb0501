//! Who may skip the lock delay: any role may `NOTIFY lease_handover_v1, '<key>'`, and only
//! the holder's own notification (the sender pid the standby saw holding the key) counts as
//! a graceful release; for a standby whose wait took the key, only one whose release
//! granted the key to that standby's own backend. Each test drives one machine by hand;
//! each fails with its broken variant: [`Mutation::NotifyFromAnyone`] (the code that took
//! every handover notification for a graceful release, run by
//! `old_code_fails_every_test_here`) or [`Mutation::IgnoreGrantee`].

use crate::common::*;
use lease_proto::server::*;
use lease_proto::sim::Mutation;
use lease_proto::sim::{Command, Harness};
use lease_proto::*;

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

fn notify_payload(h: &mut Harness, sender_pid: i64, payload: String) -> Vec<Command> {
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload,
        sender_pid,
    })
}

fn notify(h: &mut Harness, sender_pid: i64) -> Vec<Command> {
    notify_payload(h, sender_pid, release_payload(key()))
}

/// Whether the standby tried at once (a try in flight).
fn tried_at_once(h: &Harness) -> bool {
    matches!(h.in_flight(), Some((_, Statement::TryLock { .. })))
}

fn started(cmds: &[Command]) -> bool {
    cmds.iter().any(|c| matches!(c, Command::StartJob { .. }))
}

/// The standby (backend 7) takes the key with fencing token `token`, then reads the
/// notification `payload` from `sender` (PostgreSQL delivers it after the take's reply:
/// the session was blocked until then): whether the job started at once, not after the
/// lock delay.
fn taken_then_notified(h: &mut Harness, token: i64, notice: Option<(i64, String)>) -> bool {
    assert!(
        matches!(h.statement(), Statement::Take { .. }),
        "no take in flight: {:?}",
        h.in_flight()
    );
    let mut cmds = h.taken_held(token);
    if let Some((sender, payload)) = notice {
        cmds.extend(notify_payload(h, sender, payload));
    }
    started(&cmds)
}

/// The standby takes the key behind holder 99; a client that is not a lease client
/// (backend 997, who can read the standby's pid in `pg_locks`) notifies a release that
/// names the standby as its grantee, just after 99's session is terminated: the win gets
/// the lock delay.
fn forged_after_a_terminate(mutation: Option<Mutation>) -> bool {
    let mut h = Harness::with_mutation(opts(), 1, mutation).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(50));
    let forged = (997, release_payload_to(key(), 7));
    taken_then_notified(&mut h, 900, Some(forged))
}

/// A queue of two takes: 99 released gracefully and granted the key to 98's take, first
/// in the queue; 98's session is terminated a moment later, and this standby's take
/// (second) is granted then. 99's notification, which this standby's session could read
/// only after its take answered, names 98: the win gets the lock delay, though the
/// notification comes from the holder this standby saw and its token is within the lock
/// delay of the release.
fn granted_to_another_take_first(mutation: Option<Mutation>) -> bool {
    let mut h = Harness::with_mutation(opts(), 1, mutation).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(50));
    let late = (99, release_payload_to(key(), 98));
    taken_then_notified(&mut h, RELEASED_AT + 2_000, Some(late))
}

/// The holder's own notification, naming this standby's backend, still cuts the delay
/// short.
fn from_the_holder(mutation: Option<Mutation>) -> bool {
    let mut h = Harness::with_mutation(opts(), 1, mutation).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(50));
    taken_then_notified(&mut h, 900, Some((99, release_payload_to(key(), 7))))
}

/// A polling standby (waiting on the server off) tries at a notification
/// only from the holder it saw: a forged one sent just before the holder's
/// terminate would otherwise make its try land right after the key is
/// freed, without any delay.
fn polling_standby_at_a_forged_notification(mutation: Option<Mutation>) -> bool {
    let o = {
        let mut o = opts();
        o.server_wait = ServerWait::Off;
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

/// A polling standby: the holder's notification names no grantee (no take was queued),
/// its try wins within the lock delay of the release: the job starts at once.
fn polling_standby_after_the_holders_release(mutation: Option<Mutation>) -> bool {
    let o = {
        let mut o = opts();
        o.server_wait = ServerWait::Off;
        o
    };
    let mut h = Harness::with_mutation(o, 1, mutation).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(50));
    notify(&mut h, 99);
    assert!(tried_at_once(&h), "no try at the notification");
    started(&h.win_held(900))
}

#[test]
fn a_forged_notification_does_not_skip_the_lock_delay() {
    assert!(!forged_after_a_terminate(None), "started at once");
}

#[test]
fn a_release_that_granted_the_key_to_another_take_does_not_skip_the_lock_delay() {
    assert!(!granted_to_another_take_first(None), "started at once");
    assert!(
        granted_to_another_take_first(Some(Mutation::IgnoreGrantee)),
        "the broken variant waited the lock delay"
    );
}

#[test]
fn the_holders_own_notification_skips_the_lock_delay() {
    assert!(from_the_holder(None), "waited the lock delay");
    assert!(from_the_holder(Some(Mutation::NotifyFromAnyone)));
    assert!(polling_standby_after_the_holders_release(None));
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
    assert!(forged_after_a_terminate(old));
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
    // Granted 30 ms after the release the notification reports: not that release's.
    let notice = (99, release_payload_to(key(), 7));
    assert!(
        !taken_then_notified(&mut h, RELEASED_AT + 30_000, Some(notice.clone())),
        "started at once"
    );
    // Granted within the lock delay of it: graceful.
    let mut h = Harness::new(opts(), 1).unwrap();
    h.run(LeaseId::named("a").unwrap());
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(40));
    assert!(taken_then_notified(&mut h, 900, Some(notice)));
}
