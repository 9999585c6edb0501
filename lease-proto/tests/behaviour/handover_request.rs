//! A hand-over asked for by name (`lease handover NAME --to PID`, the payload
//! `lease_proto::server::handover_request_payload`; the rule: the machine's `handover`
//! module): the holder checks that the named backend waits for the key before it hands the
//! lease over; a request for a backend that does not wait changes nothing and is refused
//! at the end of its window; repeats change nothing; standbys leave a key alone only when
//! the holder's release names the backend it went to.

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

fn notification(h: &mut Harness, payload: String, sender_pid: i64) -> Vec<Command> {
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload,
        sender_pid,
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
            Some(Statement::Heartbeat | Statement::Verify | Statement::CheckHandover { .. }) => {
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

/// The holder asked to hand over to backend 99 checks first: the check asks whether 99
/// waits for the key; once it does, the job is cancelled (handed over), the key released
/// with a notification that names 99, and the holder leaves the key alone for the window
/// (two query timeouts, 1 s here) after the release; then it tries again.
#[test]
fn the_holder_hands_over_once_a_check_finds_the_named_backend_waiting() {
    let mut h = harness(polling());
    let run = started(&mut h, "a", 900);
    let cmds = request(&mut h, "a", 99);
    assert!(!handed_over(&cmds), "handed over before a check: {cmds:?}");
    assert_eq!(
        h.statement(),
        Statement::CheckHandover {
            asks: vec![(key("a"), 99)]
        }
    );
    let cmds = h.check_answered(7, &[(1, 99)]);
    assert!(handed_over(&cmds), "{cmds:?}");
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert_eq!(
        h.statement(),
        Statement::Release {
            keys: vec![key("a")],
            notify: true,
            reserved: vec![(key("a"), 99, 1)],
        }
    );
    h.released();
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

/// A request for a backend that never waits for the key (a mistyped pid, a forger's
/// flood, repeated every 100 ms) never touches the job: each heartbeat checks it, and
/// the first request is refused once at the end of its window; its repeats neither
/// re-arm it nor add asks.
#[test]
fn a_request_for_a_backend_that_does_not_wait_is_refused_and_repeats_change_nothing() {
    let mut h = harness(polling());
    started(&mut h, "a", 900);
    let t0 = h.now();
    let window = opts().validity_window() * 2 + opts().query_timeout * 2;
    let mut checks = 0;
    let mut refused = 0;
    let count = |h: &Harness| {
        (h.events().iter())
            .filter(|e| matches!(e, Event::HandoverDeclined { to: 99, .. }))
            .count()
    };
    while h.now() < t0 + window + opts().heartbeat_interval * 2 {
        let cmds = request(&mut h, "a", 99);
        refused += count(&h);
        assert!(!handed_over(&cmds), "{cmds:?}");
        let end = h.now() + ms(100);
        while h.now() < end {
            match h.in_flight().map(|(_, s)| s.clone()) {
                Some(Statement::CheckHandover { asks }) => {
                    assert_eq!(asks, vec![(key("a"), 99)]);
                    checks += 1;
                    let cmds = h.check_answered(7, &[]);
                    assert!(!handed_over(&cmds), "{cmds:?}");
                }
                Some(_) => {
                    h.heartbeat(7, &[key("a")]);
                }
                None => {
                    h.advance(ms(5));
                }
            }
            refused += count(&h);
        }
    }
    // The first ask ends once; a repeat after it is a new ask, still standing.
    assert_eq!(refused, 1);
    assert!(checks >= 2, "checked {checks} times");
    assert!(matches!(
        h.machine().status().leases[0].state,
        LeaseState::Leading { .. }
    ));
}

/// A standby ignores a request itself: only the holder's release names the backend a key
/// went to. Named another (98), it leaves the key alone for the window; named itself (7),
/// it tries at once; a release from a backend that is not the holder it saw reserves
/// nothing.
#[test]
fn only_the_standby_the_holders_release_names_tries_at_the_release() {
    for (sender, to, tries_at_once) in [(99, 98, false), (99, 7, true), (555, 98, true)] {
        let mut h = harness(polling());
        h.run(lease("a"));
        h.connect(7);
        h.lose(Some(99));
        assert!(h.in_flight().is_none());
        request(&mut h, "a", 98);
        assert!(h.in_flight().is_none(), "a standby acted on a request");
        h.advance(ms(20));
        notification(&mut h, release_payload_reserved(key("a"), 0, to), sender);
        if sender != 99 {
            // Not the holder's: not a graceful release either, and no reservation; the
            // next periodic try tries it.
            let tries = tries_within(&mut h, opts().retry_interval * 2);
            assert!(tries.iter().any(|k| k.contains(&key("a"))), "{tries:?}");
            continue;
        }
        let tried = matches!(h.in_flight(), Some((_, Statement::TryLock { .. })));
        assert_eq!(tried, tries_at_once, "named {to}: {:?}", h.in_flight());
        if !tried {
            let tries = tries_within(&mut h, opts().query_timeout * 2 - ms(30));
            assert!(
                tries.iter().all(|k| !k.contains(&key("a"))),
                "tried within the window: {tries:?}"
            );
        }
    }
}

/// A standby named by a request queues for the key whatever the crowd: its next wait
/// takes the key without the herd limit.
#[test]
fn the_named_standby_queues_for_the_key_whatever_the_crowd() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(
        h.statement(),
        Statement::Take { crowd: Some(_), .. }
    ));
    h.held_all_along(7);
    request(&mut h, "a", 7);
    let mut named = false;
    for _ in 0..200 {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::Take { crowd: None, .. }) => {
                named = true;
                break;
            }
            Some(Statement::Take { .. }) => {
                h.held_all_along(7);
            }
            Some(Statement::TryLock { .. }) => {
                h.lose(Some(99));
            }
            Some(_) => {
                h.heartbeat(7, &[]);
            }
            None => {
                h.advance(ms(5));
            }
        }
    }
    assert!(named, "never queued regardless of the crowd");
}

/// Review 5: four requests for backends that never wait (a forger's flood: any role may
/// `NOTIFY`, sent once per ask window) fill the key's asks, and a real request made while
/// they stand (`lease handover a --to 98`, or a preferred standby's `prefer`) is dropped:
/// the standby that does wait is never checked and never gets the lease, for as long as
/// the flood goes on.
#[test]
fn a_flood_of_four_bogus_asks_does_not_crowd_out_a_real_request() {
    let mut h = harness(polling());
    started(&mut h, "a", 900);
    let t0 = h.now();
    let window = opts().validity_window();
    let mut next_flood = t0;
    let mut checked_98 = false;
    let mut handed = false;
    let mut bogus = 10_000;
    while h.now() < t0 + window * 3 && !handed {
        if h.now() >= next_flood {
            for _ in 0..4 {
                bogus += 1;
                request(&mut h, "a", bogus);
            }
            // The real request, right after each round of the flood (a retrying script).
            request(&mut h, "a", 98);
            next_flood = h.now() + window;
        }
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::CheckHandover { asks }) => {
                let at = asks.iter().position(|a| a.1 == 98);
                checked_98 |= at.is_some();
                // 98 waits for the key all along.
                let ordinals: Vec<(i64, i64)> =
                    at.map(|i| (i as i64 + 1, 98)).into_iter().collect();
                let cmds = h.check_answered(7, &ordinals);
                handed |= handed_over(&cmds);
            }
            Some(_) => {
                h.heartbeat(7, &[key("a")]);
            }
            None => {
                h.advance(ms(5));
            }
        }
    }
    assert!(
        checked_98 && handed,
        "in {:?} of a 4-bogus-pid flood (one round per ask window), the real request for a \
         waiting standby was checked: {checked_98}, handed over: {handed}",
        window * 3
    );
}

/// Review 5, cost: at the default options a holder sends one heartbeat per 5 s and no
/// `pg_locks` read (docs/guarantees.md, "one heartbeat statement per interval ... no
/// `pg_locks` read"). One request for a backend that does not exist per ask window (one
/// `NOTIFY` per 15 s, any role) turns every heartbeat into a `pg_locks` read every 50 ms
/// (`CHECK_EVERY`), for good: 100 times the statements, each growing with the locks on the
/// server. The module doc says "a flood costs the holder one heartbeat's worth of
/// `pg_locks` read per heartbeat".
#[test]
fn a_slow_request_flood_does_not_multiply_the_holders_statements() {
    let o = Options::default();
    let mut polling_defaults = o.clone();
    polling_defaults.server_wait = ServerWait::Off;
    let mut h = harness(polling_defaults);
    started(&mut h, "a", 900);
    let t0 = h.now();
    let span = std::time::Duration::from_secs(60);
    let window = o.validity_window();
    let mut next = t0;
    let (mut statements, mut checks) = (0u32, 0u32);
    let mut bogus = 50_000;
    while h.now() < t0 + span {
        if h.now() >= next {
            bogus += 1;
            request(&mut h, "a", bogus);
            next = h.now() + window;
        }
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::CheckHandover { .. }) => {
                statements += 1;
                checks += 1;
                h.check_answered(7, &[]);
            }
            Some(Statement::Verify) => {
                statements += 1;
                h.heartbeat(7, &[key("a")]);
            }
            Some(_) => {
                statements += 1;
                h.heartbeat(7, &[]);
            }
            None => {
                h.advance(ms(5));
            }
        }
    }
    let per_interval =
        f64::from(statements) / (span.as_secs_f64() / o.heartbeat_interval.as_secs_f64());
    assert!(
        per_interval <= 2.0,
        "one bogus request per {window:?} for {span:?}: {statements} statements ({checks} of them \
         pg_locks-reading checks), {per_interval:.1} per heartbeat interval ({:?})",
        o.heartbeat_interval
    );
}

/// Review 5: a standby of two leases (`a` and `b`, both held by 99) waits on its lease
/// session. Requests `to a 7` (any role may send them, and the holder's own announcement of
/// a confirmed hand-over is one) call `try_soon`, and a try owed while a wait blocks the
/// session with another key wanted closes the session for a new one: the named standby
/// leaves the key's queue at the very announcement that reserves the key for it (its old
/// backend, 7, is gone when the holder's release looks for it), and a flood of requests
/// reconnects it at the flood's rate, outside the `WAKE_BUDGET` that bounds the
/// reconnects of release notifications.
#[test]
fn requests_naming_a_standby_of_several_leases_do_not_close_its_session() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.run(lease("b"));
    h.connect(7);
    h.lose(Some(99));
    // Named for the very key it waits for.
    let Statement::Take { key: waited, .. } = h.statement() else {
        panic!("{:?}", h.statement())
    };
    let session = h.session();
    let mut interrupted = 0;
    for i in 0..20 {
        // Ten requests from some client, then ten announcements from the holder.
        let sender = if i < 10 { 555 } else { 99 };
        h.input(Input::Notification {
            channel: HANDOVER_CHANNEL.into(),
            payload: handover_request_payload(waited, 7),
            sender_pid: sender,
        });
        interrupted += (h.events().iter())
            .filter(|e| matches!(e, Event::WaitInterrupted { .. }))
            .count();
        if h.session() != session {
            break;
        }
        h.advance(ms(20));
    }
    assert_eq!(
        (interrupted, h.session() == session),
        (0, true),
        "requests naming this standby interrupted its wait and closed its session (the \
         backend the holder checks and names is gone)"
    );
}

/// A run dropped (its future abandoned) after its job returned for a hand-over and before
/// the release's reply finishes with `Abandoned` once the key is released: it never
/// contends again, and never wins a key nobody would run or release (found under load by
/// `a_group_spreads_its_leases_over_two_lockers`: a dropped run of a group re-took its key
/// and held it until its locker was dropped).
#[test]
fn a_run_dropped_while_its_handed_over_key_is_released_finishes_abandoned() {
    let mut h = harness(polling());
    let run = started(&mut h, "a", 900);
    request(&mut h, "a", 99);
    let cmds = h.check_answered(7, &[(1, 99)]);
    assert!(handed_over(&cmds), "{cmds:?}");
    job_returns_then_run_dropped_mid_release(&mut h, run);
    let tries = tries_within(&mut h, opts().query_timeout * 2 + opts().retry_interval * 4);
    assert!(tries.is_empty(), "a dropped run tried again: {tries:?}");
}
