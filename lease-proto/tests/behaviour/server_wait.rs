//! A standby's wait on the server that takes its key (`Statement::Take`): once per retry
//! interval at rest, the win when the key is freed, the lock delay, falling back to
//! polling; and a client that is not a lease client holding the key shared, stale and
//! foreign notifications, several wanted keys, a hand-over asked for meanwhile.

use crate::common::*;
use lease_proto::limits::*;
use lease_proto::reply::{HeartbeatReply, WaitReply};
use lease_proto::server::*;
use lease_proto::sim::Mutation;
use lease_proto::sim::{Command, Harness};
use lease_proto::*;

/// Waiting on the server, an idle standby sends one statement per retry
/// interval: after its first try, only takes, each ended by its lock timeout
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
            .all(|s| matches!(s, Statement::Take { key, .. } if *key == lease("a").key())),
        "{sent:?}"
    );
    // 10 s at 200 ms: the first try, a take to its jittered deadline, then
    // one take per 200 ms (each answered 0-1 ms late here).
    assert!((49..=52).contains(&sent.len()), "{}", sent.len());
}

/// A take that wins starts its job after the lock delay, with no try after it, unless a
/// handover notification from the holder its last try saw, naming this backend as the
/// one the release granted the key to, says the release was graceful (it arrives after
/// the take's reply, the session blocked until then; the held-back win goes on then).
#[test]
fn a_take_that_wins_starts_after_the_lock_delay_or_the_holders_notification() {
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
    assert!(matches!(h.statement(), Statement::Take { .. }));
    // Freed without a notification (the holder's session ended): held back
    // for the lock delay, nothing sent meanwhile.
    h.advance(ms(50));
    let mut cmds = h.taken_held(900);
    assert!(has_event(
        &h,
        |e| matches!(e, Event::KeyTaken { key } if *key == lease("a").key())
    ));
    cmds.extend(h.advance(ms(19)));
    assert!(!starts(&cmds));
    assert!(
        !has(&cmds, |c| matches!(c, Command::Query { .. })),
        "a statement after the take: {cmds:?}"
    );
    assert!(starts(&h.advance(ms(1))));
    assert!(h.machine().is_valid(RunId(0), h.now()));

    // The holder's notification naming this backend ends the delay.
    let mut h = harness(o);
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    h.advance(ms(10));
    assert!(!starts(&h.taken_held(902)));
    h.advance(ms(5));
    assert!(starts(&notify_to(&mut h, "a", Some(7))));
}

fn has_event(h: &Harness, f: impl Fn(&Event) -> bool) -> bool {
    h.events().iter().any(f)
}

/// A take that finds its key with `HERD_WAITERS` waiters already does not queue: the
/// standby polls until its next periodic try, then takes again.
#[test]
fn a_crowded_take_falls_back_to_polling_until_the_periodic_try() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    let Statement::Take { crowd, .. } = h.statement() else {
        panic!("expected a take, got {:?}", h.statement());
    };
    assert_eq!(crowd, Some(HERD_WAITERS));
    let crowded = WaitReply {
        session: HeartbeatReply {
            backend_pid: Some(7),
            nonce: h.nonce(),
            server_clock_us: None,
        },
        freed: Some(false),
        crowded: true,
        deadlock_timeout_ms: Some(1000),
        ..WaitReply::default()
    };
    h.reply(crowded.to_rows());
    assert!(h.in_flight().is_none(), "{:?}", h.in_flight());
    // The periodic try comes at its deadline, then a take again.
    h.advance(ms(200));
    assert_eq!(h.try_keys(), vec![key("a")]);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Take { .. }));
}

/// A take that finds its key held by its own backend already (another client's lock
/// behind a transaction pooler) refuses the locker, as a try that finds it does.
#[test]
fn a_take_that_finds_the_key_held_here_refuses_the_locker() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    let here = WaitReply {
        session: HeartbeatReply {
            backend_pid: Some(7),
            nonce: h.nonce(),
            server_clock_us: None,
        },
        freed: Some(false),
        held_here: true,
        deadlock_timeout_ms: Some(1000),
        ..WaitReply::default()
    };
    let cmds = h.reply(here.to_rows());
    assert!(
        has(&cmds, |c| matches!(
            c,
            Command::FinishRun {
                outcome: Outcome::Refused(_),
                ..
            }
        )),
        "{cmds:?}"
    );
}

/// A key the holder handed over to another backend, released while the take blocked
/// (the release's notification read after the take's reply, the session blocked until
/// then, or before it by another
/// session of the driver): the key the take won is released at once, without a job, so
/// the named backend gets it. The broken variant keeps it and starts the job.
#[test]
fn a_take_that_wins_a_key_handed_over_to_another_backend_releases_it() {
    for (request_first, mutation) in [
        (false, None),
        (true, None),
        (false, Some(Mutation::KeepReservedWin)),
    ] {
        let mut h = Harness::with_mutation(opts(), 1, mutation).unwrap();
        h.run(lease("a"));
        h.connect(7);
        h.lose(Some(99));
        assert!(matches!(h.statement(), Statement::Take { .. }));
        h.advance(ms(10));
        // The holder's release, naming 55 as the backend it handed the key to.
        let request = |h: &mut Harness| {
            h.input(Input::Notification {
                channel: HANDOVER_CHANNEL.into(),
                payload: release_payload_reserved(key("a"), 7, 55),
                sender_pid: 99,
            })
        };
        let mut cmds = Vec::new();
        let mut declined = false;
        let mut step = |h: &mut Harness, c: Vec<Command>| {
            declined |= has_event(h, |e| matches!(e, Event::WinDeclined { to_pid: 55, .. }));
            cmds.extend(c);
        };
        if request_first {
            let c = request(&mut h);
            step(&mut h, c);
        }
        let c = h.taken_held(900);
        step(&mut h, c);
        if !request_first {
            let c = request(&mut h);
            step(&mut h, c);
        }
        let c = h.advance(opts().lock_delay);
        step(&mut h, c);
        let started = has(&cmds, |c| matches!(c, Command::StartJob { .. }));
        if mutation.is_some() {
            assert!(started, "the broken variant did not start: {cmds:?}");
            continue;
        }
        assert!(
            !started,
            "started a job on a key handed over to 55: {cmds:?}"
        );
        assert!(declined, "{:?}", h.events());
        assert_eq!(
            h.statement(),
            Statement::Release {
                keys: vec![key("a")],
                notify: true,
                // Passed on: 55 is named again if it still waits.
                reserved: vec![(key("a"), 55, 1)],
            }
        );
    }
}

/// A new run while a take blocks the session closes the session (holding
/// nothing else: whatever the take may have been granted goes with it) and
/// opens a new one at once, so the new run tries without waiting out the lock
/// timeout, with the taking run beside it.
#[test]
fn a_new_run_interrupts_a_wait() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Take { .. }));
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

/// Shutting down the only standby while its take blocks the session closes
/// the session at once: nothing waits out the lock timeout.
#[test]
fn a_shutdown_during_a_wait_closes_the_session_at_once() {
    let mut h = harness(opts());
    let run = h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Take { .. }));
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

/// A take that fails otherwise than by its lock timeout turns waiting off
/// for the session: it may have taken the key, so the session verifies
/// first, then the standby tries and polls from then on.
#[test]
fn a_failed_take_verifies_then_falls_back_to_polling() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Take { .. }));
    h.fail(boom("57014"));
    assert_eq!(h.statement(), Statement::Verify);
    h.heartbeat(7, &[]);
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
/// (`pg_advisory_lock_shared`). A shared wait was granted at once and every
/// try after it lost (with the default lock delay the standby once spun: a
/// wait and a try every lock delay); a take blocks behind the shared lock to
/// its lock timeout, as behind a holder: one statement per retry interval.
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
            Some(Statement::Take { timeout_ms, .. }) => {
                waits += 1;
                h.advance(ms(timeout_ms));
                h.held_all_along(7);
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
    // A take per retry interval, and the first try.
    let bound = 10 + 2;
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
            Some(Statement::Take {
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
/// Nobody may lead, and no process sends more than a few statements per
/// retry interval: its takes block to their lock timeouts (in chunks below
/// `deadlock_timeout`), with the periodic try. Before a fix each process
/// sent a wait and a try every lock delay.
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
    // Setup, LISTEN and the first try once; then the bound per interval:
    // the chunks of a retry interval below deadlock_timeout, and the
    // periodic try, which may fall early (jitter).
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
    notify_to(h, name, None)
}

/// [`notify`], naming `grantee` as the backend the release granted the key to.
fn notify_to(h: &mut Harness, name: &str, grantee: Option<i64>) -> Vec<Command> {
    let key = lease(name).key();
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload: grantee.map_or_else(|| release_payload(key), |g| release_payload_to(key, g)),
        sender_pid: 99,
    })
}

/// A handover notification that reaches a standby while its take blocks (PostgreSQL
/// holds it until the take's reply; a driver that read it first), or right after: a
/// release before the take reached the server, after which another standby took the key
/// and the take queued behind it. The release named no grantee (or another): when that
/// other holder's session is terminated and the take is granted, no notification
/// follows, and the win gets the lock delay.
#[test]
fn a_stale_notification_does_not_cut_a_later_lock_delay_short() {
    let o = {
        let mut o = opts();
        o.lock_delay = ms(20);
        o
    };
    for (grantee, during) in [
        (None, true),
        (None, false),
        (Some(98), true),
        (Some(98), false),
    ] {
        let mut h = Harness::new(o.clone(), 1).unwrap();
        h.run(lease("a"));
        h.connect(7);
        h.lose(Some(99));
        assert!(matches!(h.statement(), Statement::Take { .. }));
        h.advance(ms(1));
        let mut cmds = Vec::new();
        if during {
            cmds.extend(notify_to(&mut h, "a", grantee));
            assert!(matches!(h.statement(), Statement::Take { .. }));
        }
        // 98's session is terminated: the take is granted, within the lock delay of
        // 99's release on the server's clock.
        h.advance(ms(5));
        cmds.extend(h.taken_held(900));
        if !during {
            cmds.extend(notify_to(&mut h, "a", grantee));
        }
        let starts = |cmds: &[Command]| has(cmds, |c| matches!(c, Command::StartJob { .. }));
        assert!(
            !starts(&cmds),
            "grantee {grantee:?}, during {during}: started at once, without the lock delay"
        );
        assert!(!starts(&h.advance(ms(19))));
        assert!(starts(&h.advance(ms(1))));
    }
}

/// The notification of the graceful release that grants the take its key, read before
/// the take's reply (by a driver that reads the connection's notifications first), keeps
/// the session: with several wanted keys the machine once took it for "a notification
/// for another key" and closed the session for a new one.
#[test]
fn the_notification_of_the_release_that_ends_a_take_keeps_the_session() {
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
    let Statement::Take { key, .. } = h.statement() else {
        panic!("expected a take, got {:?}", h.statement());
    };
    let waited = if key == lease("a").key() { "a" } else { "b" };
    let session = h.session();
    h.advance(ms(50));
    notify_to(&mut h, waited, Some(7));
    assert_eq!(h.session(), session, "the session was closed for a new one");
    // The win goes on once the notifications behind the reply are read.
    let mut cmds = h.taken_held(900);
    cmds.extend(h.advance(TAKE_NOTICES));
    assert_eq!(h.session(), session);
    assert!(
        has(&cmds, |c| matches!(c, Command::StartJob { .. })),
        "the graceful release's win waited the lock delay: {cmds:?}"
    );
}

/// The take catches its lock timeout and says so in its reply (no `ERROR` in
/// the server's log): a standby at rest still sends one take per retry
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
            Some(Statement::Take { timeout_ms, .. }) => {
                waits += 1;
                h.advance(ms(timeout_ms));
                h.held_all_along(7);
            }
            Some(s) => panic!("only takes at rest, got {s:?}"),
            None => {
                h.advance(ms(1));
            }
        }
    }
    assert!((50..=64).contains(&waits), "{waits}");
    assert!(h.session().is_some());
}

/// A standby of two keys takes one; every handover notification for the
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
            Some(Statement::Take { key, .. }) => {
                h.advance(ms(20));
                let other = if key == lease("a").key() { "b" } else { "a" };
                let before = h.session();
                notify(&mut h, other);
                if h.session() != before {
                    sessions += 1;
                    pid += 1;
                    h.connect(pid);
                }
                if matches!(h.in_flight(), Some((_, Statement::Take { .. }))) {
                    // Not interrupted: the take ends by its lock timeout.
                    let Some((_, Statement::Take { timeout_ms, .. })) = h.in_flight().cloned()
                    else {
                        unreachable!()
                    };
                    h.advance(ms(timeout_ms.saturating_sub(20)));
                    if matches!(h.in_flight(), Some((_, Statement::Take { .. }))) {
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
