//! A standby's wait on the server (`Statement::Wait`): once per retry interval at rest,
//! woken by the server or a notification, the lock delay, the wake budget, falling back to
//! polling; and a client that is not a lease client holding the key shared, stale and
//! foreign notifications, several wanted keys.

use crate::common::*;
use lease_proto::limits::*;
use lease_proto::server::*;
use lease_proto::sim::Command;
use lease_proto::sim::Harness;
use lease_proto::*;
use std::time::Duration;

/// Waiting on the server, an idle standby sends one statement per retry
/// interval: after its first try, only waits, each ended by its lock timeout
/// a whole retry interval after the last (no jitter) and counting as that
/// interval's try.
#[test]
fn a_standby_at_rest_waits_once_per_retry_interval() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    let sent = standby_at_rest(&mut h, ms(10_000));
    assert!(matches!(sent[0], Statement::TryLock { .. }), "{sent:?}");
    assert!(
        sent[1..]
            .iter()
            .all(|s| matches!(s, Statement::Wait { key, .. } if *key == lease("a").key())),
        "{sent:?}"
    );
    // 10 s at 200 ms: the first try, a wait to its jittered deadline, then
    // one wait per 200 ms (each answered 0-1 ms late here).
    assert!((49..=52).contains(&sent.len()), "{}", sent.len());
}

/// Woken, a standby tries at once; a win starts its job after the lock delay
/// unless a handover notification from the holder its last try saw says the
/// release was graceful (before the win, or while it is held back); a try that
/// loses sends it back to waiting within the same step.
#[test]
fn a_woken_standby_tries_at_once_and_starts_after_the_lock_delay_or_a_notification() {
    let o = {
        let mut o = opts();
        o.lock_delay = ms(20);
        o
    };
    let starts = |cmds: &[Command]| has(cmds, |c| matches!(c, Command::StartJob { .. }));
    let mut h = harness(o.clone());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    // Freed without a notification (the holder's session ended): the try at
    // once, its win held back for the lock delay.
    h.advance(ms(50));
    h.wake(7);
    assert_eq!(h.try_keys(), vec![key("a")]);
    assert!(!starts(&h.win_held(900)));
    assert!(!starts(&h.advance(ms(19))));
    assert!(starts(&h.advance(ms(1))));
    assert!(h.machine().is_valid(RunId(0), h.now()));

    // Someone else won: back to waiting at once. Freed by a graceful release
    // whose notification came first: the job starts with the win.
    let mut h = harness(o.clone());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(10));
    h.wake(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    h.advance(ms(10));
    notify(&mut h, "a");
    h.wake(7);
    assert!(starts(&h.win_held(901)));

    // The notification that comes while the win is held back ends the delay.
    let mut h = harness(o);
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(10));
    h.wake(7);
    assert!(!starts(&h.win_held(902)));
    h.advance(ms(5));
    assert!(starts(&notify(&mut h, "a")));
}

/// Wakes whose try loses (a lock the wait does not conflict with, a herd
/// that keeps colliding) stop the waiting after `WAKE_BUDGET` in a row: the
/// standby polls until its next periodic try, never spins.
#[test]
fn wakes_that_keep_losing_fall_back_to_polling() {
    let o = {
        let mut o = opts();
        o.lock_delay = Duration::ZERO;
        o
    };
    let mut h = harness(o);
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    for _ in 0..lease_proto::limits::WAKE_BUDGET {
        h.advance(ms(1));
        h.wake(7);
        h.advance(ms(1));
        h.lose(Some(99));
    }
    assert!(h.in_flight().is_none(), "{:?}", h.in_flight());
    // The periodic try comes at its deadline, then waiting starts over.
    h.advance(ms(200));
    assert_eq!(h.try_keys(), vec![key("a")]);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
}

/// A new run while a wait blocks the session closes the session (holding
/// nothing) and opens a new one at once, so the new run tries without
/// waiting out the lock timeout.
#[test]
fn a_new_run_interrupts_a_wait() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    let first = h.session().unwrap();
    h.run(lease("b"));
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::WaitInterrupted { session } if *session == first)));
    let second = h.session().unwrap();
    assert_ne!(first, second);
    h.connect(8);
    let mut keys = h.try_keys();
    keys.sort();
    let mut want = vec![key("a"), key("b")];
    want.sort();
    assert_eq!(keys, want);
}

/// Shutting down the only standby while its wait blocks the session closes
/// the session at once: nothing waits out the lock timeout.
#[test]
fn a_shutdown_during_a_wait_closes_the_session_at_once() {
    let mut h = harness(opts());
    let run = h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    let session = h.session().unwrap();
    let cmds = h.input(Input::Shutdown { run });
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Cancelled,
            ..
        }
    )));
    assert!(
        has(
            &cmds,
            |c| matches!(c, Command::CloseSession { session: s } if *s == session)
        ),
        "{cmds:?}"
    );
    assert_eq!(h.machine().poll_timeout(), None);
}

/// A wait that fails otherwise than by its lock timeout turns waiting off
/// for the session: the standby tries at once and polls from then on.
#[test]
fn a_failed_wait_falls_back_to_polling() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    h.fail(boom("57014"));
    assert_eq!(h.try_keys(), vec![key("a")]);
    h.lose(Some(99));
    assert!(h.in_flight().is_none());
    let sent = standby_at_rest(&mut h, ms(2_000));
    assert!(
        sent.iter().all(|s| matches!(s, Statement::TryLock { .. })),
        "{sent:?}"
    );
}

#[test]
fn a_standby_at_rest_sends_only_its_tries() {
    let mut h = harness(polling());
    h.run(lease("a"));
    h.connect(7);
    let sent = standby_at_rest(&mut h, ms(10_000));
    assert!(sent.iter().all(|s| matches!(s, Statement::TryLock { .. })));
    // One try per jittered retry wait (200 ms, down by up to 20 %).
    assert!((50..=64).contains(&sent.len()), "{}", sent.len());
    // Once it leads, it heartbeats an interval after the winning try (its
    // job started a lock delay after the win).
    h.advance(ms(200));
    let won = h.now();
    h.win(900);
    h.advance(ms(199) - (h.now() - won));
    assert!(h.in_flight().is_none());
    h.advance(ms(1));
    assert_eq!(h.statement(), Statement::Heartbeat);
    assert_eq!(h.now(), won + ms(200));
}

#[test]
fn a_notification_triggers_an_immediate_try() {
    let mut h = harness(polling());
    h.run(lease("a"));
    h.connect(7);
    assert_eq!(h.try_keys(), vec![key("a")]);
    h.lose(Some(99));
    assert!(h.in_flight().is_none());
    let cmds = h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload: release_payload(key("a")),
        sender_pid: 99,
    });
    assert!(has(&cmds, |c| matches!(
        c,
        Command::Query {
            statement: Statement::TryLock { .. },
            ..
        }
    )));
}

/// A client that is not a lease client holds the key SHARED
/// (`pg_advisory_lock_shared`): every wait is granted at once, every try
/// after it loses. With the default lock delay the woken try is sent by the
/// retry timer, which counted as "the periodic try" and reset the wake
/// budget, so the standby spun: a wait and a try every lock delay.
#[test]
fn a_shared_holder_does_not_make_a_standby_spin_at_the_default_lock_delay() {
    let o = opts();
    assert!(!o.lock_delay.is_zero(), "the default has a lock delay");
    let mut h = Harness::new(o.clone(), 1).unwrap();
    h.run(lease("a"));
    h.connect(7);
    let start = h.now();
    let end = start + ms(2_000);
    let (mut waits, mut tries) = (0u32, 0u32);
    while h.now() < end {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::TryLock { .. }) => {
                tries += 1;
                h.advance(ms(1));
                h.lose(Some(99));
            }
            Some(Statement::Wait { .. }) => {
                waits += 1;
                h.advance(ms(1));
                h.wake(7);
            }
            Some(s @ (Statement::Heartbeat | Statement::Verify)) => {
                h.advance(ms(1));
                let _ = s;
                h.heartbeat(7, &[]);
            }
            Some(s) => panic!("{s:?}"),
            None => {
                h.advance(ms(1));
            }
        }
    }
    let per_interval = f64::from(waits + tries) / 10.0;
    println!(
        "2 s, retry 200 ms, lock delay {:?}: {waits} waits, {tries} tries ({per_interval:.1} statements per retry interval)",
        o.lock_delay
    );
    // At most WAKE_BUDGET wakes (a wait and a try each) plus the periodic
    // try per retry interval.
    let bound = 10 * (2 * WAKE_BUDGET + 2);
    assert!(
        waits + tries <= bound,
        "{waits} waits + {tries} tries in 2 s > {bound}: the standby spins"
    );
}

/// Several wanted keys: each wait takes "the next wanted key after the
/// last one waited for". The runs were scanned in run order, not key order,
/// so with runs started as (lowest, highest, middle) key the middle key was
/// never waited for: it was only polled, against the documented one
/// interval in n.
#[test]
fn rotation_waits_for_every_wanted_key() {
    let mut names = ["a", "b", "c"];
    names.sort_by_key(|n| lease(n).key());
    // Start them as lowest, highest, middle.
    let order = [names[0], names[2], names[1]];
    let mut h = Harness::new(opts(), 1).unwrap();
    for n in order {
        h.run(lease(n));
    }
    h.connect(7);
    let end = h.now() + ms(4_000);
    let mut waited = Vec::new();
    while h.now() < end {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::TryLock { .. }) => {
                h.advance(ms(1));
                h.lose(Some(99));
            }
            Some(Statement::Wait {
                key, timeout_ms, ..
            }) => {
                waited.push(key);
                h.advance(ms(timeout_ms));
                h.held_all_along(7);
            }
            Some(Statement::Heartbeat | Statement::Verify) => {
                h.advance(ms(1));
                h.heartbeat(7, &[]);
            }
            Some(s) => panic!("{s:?}"),
            None => {
                h.advance(ms(1));
            }
        }
    }
    let count = |n: &str| waited.iter().filter(|k| **k == lease(n).key()).count();
    println!(
        "4 s, retry 200 ms, runs started {order:?}: waits per key {:?}",
        order.map(count)
    );
    for n in order {
        assert!(
            count(n) >= waited.len() / 3 - 1,
            "key of {n:?} waited for {} times of {}",
            count(n),
            waited.len()
        );
    }
}

/// The cause in the simulator: a client that is not a lease client holds
/// the key SHARED for the whole run (`ServerConfig::foreign_shared_keys`).
/// Nobody may lead, and no process may send more than the wake budget
/// allows: per retry interval, `WAKE_BUDGET` wakes (a wait and a try each)
/// and the periodic try. Before the fix each process sent a wait and a try
/// every lock delay.
#[test]
fn simulated_shared_holder_costs_a_bounded_number_of_statements() {
    use lease_proto::sim::{ServerConfig, Sim, SimConfig};
    let c = SimConfig {
        server: ServerConfig {
            foreign_shared_keys: vec![lease("job").key()],
            ..ServerConfig::default()
        },
        ..SimConfig::default()
    };
    let retry = c.options.retry_interval;
    let mut sim = Sim::new(c, std::time::Instant::now());
    let run = ms(10_000);
    sim.run_until(run);
    assert!((0..3).all(|p| !sim.leads(p, "job")));
    let r = sim.finish(run, ms(1000));
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    let intervals = (run.as_millis() / retry.as_millis()) as u64;
    let per_interval: Vec<f64> = (r.statements.iter())
        .map(|s| *s as f64 / intervals as f64)
        .collect();
    println!(
        "statements per process per retry interval (foreign shared holder): {per_interval:.1?}"
    );
    // Setup, LISTEN and the first try once; then the bound per interval, and
    // the periodic try may fall early (jitter).
    let bound = 2 * u64::from(WAKE_BUDGET) + 2;
    for s in &r.statements {
        assert!(
            *s <= 3 + bound * (intervals + 1),
            "{s} statements in {intervals} retry intervals: a spin"
        );
    }
}

/// A handover notification for lease `name` from backend 99, the holder the
/// tries saw.
fn notify(h: &mut Harness, name: &str) -> Vec<Command> {
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload: release_payload(lease(name).key()),
        sender_pid: 99,
    })
}

/// A handover notification that reaches a standby while its wait blocks on
/// the server is one of two things: the graceful release that is waking
/// this very wait (the driver reads the connection's notifications before
/// the reply of the statement it is waiting for, so it comes just ahead of
/// the wake), or a release older than the wait, after which another
/// standby took the key (the wait stays queued behind it). The machine took
/// both for the former and set "try at once" for good: when the key was
/// later freed by the server ending that other holder's session (no
/// notification), the standby started without the lock delay, against the
/// documented rule.
#[test]
fn a_stale_notification_does_not_cut_a_later_lock_delay_short() {
    let o = {
        let mut o = opts();
        o.lock_delay = ms(20);
        o
    };
    let mut h = Harness::new(o, 1).unwrap();
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    // 99 released gracefully before this wait reached the server; 98 won
    // meanwhile and the wait queues behind 98. The notification arrives now.
    h.advance(ms(1));
    notify(&mut h, "a");
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    // 98's session is terminated 100 ms later: the wait wakes, no
    // notification; the try goes at once and its win gets the lock delay.
    h.advance(ms(100));
    h.wake(7);
    assert_eq!(h.try_keys(), vec![lease("a").key()]);
    let starts = |cmds: &[Command]| has(cmds, |c| matches!(c, Command::StartJob { .. }));
    assert!(
        !starts(&h.win_held(900)),
        "started at once, without the lock delay"
    );
    assert!(!starts(&h.advance(ms(19))));
    assert!(starts(&h.advance(ms(1))));
}

/// The notification of the graceful release that wakes the wait comes just
/// ahead of the wake: the standby tries at once, on the same session. With
/// several wanted keys the machine took it for "a notification for another
/// key" and closed the session for a new one (a reconnect on a graceful
/// handover, and an orphaned backend).
#[test]
fn the_notification_of_the_release_that_wakes_a_wait_keeps_the_session() {
    let o = {
        let mut o = opts();
        o.lock_delay = ms(20);
        o
    };
    let mut h = Harness::new(o, 1).unwrap();
    h.run(lease("a"));
    h.run(lease("b"));
    h.connect(7);
    h.lose(Some(99));
    let Statement::Wait { key, .. } = h.statement() else {
        panic!("expected a wait, got {:?}", h.statement());
    };
    let waited = if key == lease("a").key() { "a" } else { "b" };
    let session = h.session();
    h.advance(ms(50));
    notify(&mut h, waited);
    assert_eq!(h.session(), session, "the session was closed for a new one");
    h.wake(7);
    assert_eq!(h.session(), session);
    let mut keys = h.try_keys();
    keys.sort();
    let mut want = vec![lease("a").key(), lease("b").key()];
    want.sort();
    assert_eq!(keys, want, "the try goes at once");
}

/// The wait catches its lock timeout and says so in its reply (no `ERROR` in
/// the server's log): a standby at rest still sends one wait per retry
/// interval, each counting as that interval's try.
#[test]
fn a_wait_that_answers_held_counts_as_the_intervals_try() {
    let mut h = Harness::new(opts(), 1).unwrap();
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    let end = h.now() + ms(10_000);
    let mut waits = 0;
    while h.now() < end {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::Wait { timeout_ms, .. }) => {
                waits += 1;
                h.advance(ms(timeout_ms));
                h.held_all_along(7);
            }
            Some(s) => panic!("only waits at rest, got {s:?}"),
            None => {
                h.advance(ms(1));
            }
        }
    }
    assert!((50..=64).contains(&waits), "{waits}");
    assert!(h.session().is_some());
}

/// A standby of two keys waits on one; every handover notification for the
/// other key closed its session for a new one (a reconnect: TCP, startup,
/// setup, LISTEN, try, wait). Notifications come as often as that other key
/// changes hands, or as often as any client sends `NOTIFY` on the channel
/// (any client may), so the reconnects had no bound. Now at most
/// `WAKE_BUDGET` per retry interval; past it the key is tried at the
/// periodic try, as the keys not waited for are.
#[test]
fn notifications_for_another_key_reconnect_a_bounded_number_of_times() {
    let mut h = Harness::new(opts(), 1).unwrap();
    h.run(lease("a"));
    h.run(lease("b"));
    h.connect(7);
    h.lose(Some(99));
    let mut sessions = 1;
    let end = h.now() + ms(1_000);
    let mut pid = 7;
    while h.now() < end {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::Wait { key, .. }) => {
                h.advance(ms(20));
                let other = if key == lease("a").key() { "b" } else { "a" };
                let before = h.session();
                notify(&mut h, other);
                if h.session() != before {
                    sessions += 1;
                    pid += 1;
                    h.connect(pid);
                }
                if matches!(h.in_flight(), Some((_, Statement::Wait { .. }))) {
                    // Not interrupted: the wait ends by its lock timeout.
                    let Some((_, Statement::Wait { timeout_ms, .. })) = h.in_flight().cloned()
                    else {
                        unreachable!()
                    };
                    h.advance(ms(timeout_ms.saturating_sub(20)));
                    if matches!(h.in_flight(), Some((_, Statement::Wait { .. }))) {
                        h.held_all_along(pid);
                    }
                }
            }
            Some(Statement::TryLock { .. }) => {
                h.advance(ms(1));
                h.lose(Some(99));
            }
            Some(s) => panic!("{s:?}"),
            None => {
                h.advance(ms(1));
            }
        }
    }
    println!("1 s, retry 200 ms, a notification for the other key 20 ms into each wait: {sessions} sessions");
    let bound = 1 + 6 * WAKE_BUDGET;
    assert!(
        sessions <= bound,
        "{sessions} sessions in 1 s (bound {bound})"
    );
}
