//! The machine driven by hand: the Run contract step by step, and arbitrary
//! input sequences through the observer.

use std::time::Duration;

use lease_proto::limits::*;
use lease_proto::reply::*;
use lease_proto::server::*;
use lease_proto::sim::{Command, Harness, ObserverViolation};
use lease_proto::*;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn opts() -> Options {
    let mut o = Options::default();
    o.retry_interval = ms(200);
    o.heartbeat_interval = ms(200);
    o.query_timeout = ms(500);
    o.guard_margin = ms(200);
    o
}

fn harness(o: Options) -> Harness {
    Harness::new(o, 1).unwrap()
}

fn lease(name: &str) -> LeaseId {
    LeaseId::named(name).unwrap()
}

fn boom(code: &str) -> SessionError {
    SessionError {
        code: Some(code.into()),
        message: "boom".into(),
        config: false,
    }
}

fn key(name: &str) -> i64 {
    key_for_name(name)
}

fn has(cmds: &[Command], f: impl Fn(&Command) -> bool) -> bool {
    cmds.iter().any(f)
}

fn started(h: &mut Harness, name: &str, token: i64) -> RunId {
    let run = h.run(lease(name));
    h.connect(7);
    let cmds = h.win(token);
    assert!(
        has(
            &cmds,
            |c| matches!(c, Command::StartJob { run: r, token: t, .. } if *r == run && *t == token)
        ),
        "{cmds:?}"
    );
    run
}

#[test]
fn job_ok_releases_after_exit_then_finishes_completed() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    assert!(h.machine().is_valid(run, h.now()));
    // Nothing is released while the job runs.
    let cmds = h.advance(ms(200));
    assert!(!has(&cmds, |c| matches!(
        c,
        Command::Query {
            statement: Statement::Release { .. },
            ..
        }
    )));
    h.heartbeat(7, &[key("a")]);
    let cmds = h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert!(has(
        &cmds,
        |c| matches!(c, Command::Query { statement: Statement::Release { keys, notify: true }, .. } if keys == &vec![key("a")])
    ));
    let cmds = h.released();
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Completed,
            ..
        }
    )));
    // No run left: the session is closed.
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
}

#[test]
fn job_error_releases_and_finishes_failed() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    h.input(Input::JobExited {
        run,
        exit: JobExit::Failed,
    });
    let cmds = h.released();
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Failed,
            ..
        }
    )));
}

#[test]
fn already_running_cap_and_runs_after_close() {
    let mut h = harness({
        let mut o = opts();
        o.max_leases = 2;
        o
    });
    h.run(lease("a"));
    assert!(matches!(
        h.start(LeaseId::named("a").unwrap()),
        Err(RunRejected::AlreadyRunning(_))
    ));
    // Same key under another name is the same lock.
    assert!(matches!(
        h.start(LeaseId::raw(key("a"))),
        Err(RunRejected::AlreadyRunning(_))
    ));
    h.run(lease("b"));
    assert_eq!(
        h.start(LeaseId::named("c").unwrap()),
        Err(RunRejected::TooManyLeases { cap: 2 })
    );
    h.input(Input::Close);
    let r = h.start(LeaseId::named("d").unwrap()).unwrap();
    let cmds = h.drain();
    assert!(has(
        &cmds,
        |c| matches!(c, Command::FinishRun { run, outcome: Outcome::Closed } if *run == r)
    ));
}

#[test]
fn close_cancels_waits_for_the_job_then_releases_and_closes() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    let cmds = h.input(Input::Close);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::Closed,
            ..
        }
    )));
    assert!(!has(&cmds, |c| matches!(
        c,
        Command::CloseSession { .. } | Command::FinishRun { .. }
    )));
    h.input(Input::JobExited {
        run,
        exit: JobExit::Failed,
    });
    let cmds = h.released();
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Closed,
            ..
        }
    )));
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    assert!(h.machine().is_closed());
}

#[test]
fn graceful_shutdown_returns_cancelled_even_if_the_job_errs() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    let cmds = h.input(Input::Shutdown { run });
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::Shutdown,
            ..
        }
    )));
    assert_eq!(
        h.machine().valid_until(run),
        None,
        "a cancelled lease is no longer valid"
    );
    h.input(Input::JobExited {
        run,
        exit: JobExit::Failed,
    });
    let cmds = h.released();
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Cancelled,
            ..
        }
    )));
}

#[test]
fn session_loss_cancels_at_once_and_the_job_restarts_on_the_next_win() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    let s = h.session().unwrap();
    let cmds = h.input(Input::SessionEnded {
        session: s,
        error: Some(SessionError {
            code: Some("57P01".into()),
            message: "terminating".into(),
            config: false,
        }),
    });
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::SessionEnded(_),
            ..
        }
    )));
    assert!(!h.machine().is_valid(run, h.now()));
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    // Reconnect after the backoff, win again: the job starts again with a new token.
    let cmds = h.advance(opts().retry_interval);
    assert!(has(&cmds, |c| matches!(c, Command::OpenSession { .. })));
    h.connect(8);
    let cmds = h.win(950);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::StartJob { token: 950, .. }
    )));
}

#[test]
fn validity_expiry_cancels_without_any_reply() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    let valid_until = h.machine().valid_until(run).unwrap();
    assert_eq!(valid_until, h.now() + opts().validity_window());
    // The heartbeat is sent and never answered; the process was frozen past the deadline.
    h.advance(ms(200));
    assert_eq!(h.statement(), Statement::Heartbeat);
    h.set_now(valid_until);
    let cmds = h.input(Input::Tick);
    assert!(
        has(&cmds, |c| matches!(
            c,
            Command::CancelJob {
                reason: Reason::ValidityExpired,
                ..
            }
        )),
        "{cmds:?}"
    );
    // Issue 11 hole 3 (was: CloseSession at this tick): the session is kept,
    // with its lock, while the cancelled job runs, until the guard deadline:
    // the heartbeat's send time (+200 ms) + idle_session_timeout (900 ms).
    assert!(!has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    let close_by = h.now() - opts().validity_window() + ms(200) + opts().guard_timeout();
    assert_eq!(
        h.machine().status().session,
        SessionState::Doubtful { close_by }
    );
    assert_eq!(h.machine().timeout_reason(), Some(Deadline::DeferredClose));
    assert_eq!(h.machine().poll_timeout(), Some(close_by));
    // A late heartbeat reply is ignored: nothing is sent on the session again.
    let cmds = h.heartbeat(7, &[lease("a").key()]);
    assert!(!has(&cmds, |c| matches!(
        c,
        Command::Query { .. } | Command::StartJob { .. }
    )));
    // Closed as soon as the job has returned.
    let cmds = h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
}

/// Issue 11 hole 3: a cancelled job that never returns keeps the session no
/// longer than the guard deadline, when the server could free the key anyway.
#[test]
fn a_doubtful_session_closes_at_the_guard_deadline() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    h.advance(ms(200));
    assert_eq!(h.statement(), Statement::Heartbeat);
    let close_by = h.now() + opts().guard_timeout();
    let cmds = h.fail(boom("XX000"));
    assert!(has(&cmds, |c| matches!(c, Command::CancelJob { .. })));
    assert!(!has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    h.set_now(close_by - ms(1));
    let cmds = h.input(Input::Tick);
    assert!(!has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    h.set_now(close_by);
    let cmds = h.input(Input::Tick);
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    // The run still waits for its job; no session is needed meanwhile.
    assert_eq!(h.machine().status().session, SessionState::Idle);
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert!(matches!(
        h.machine().status().session,
        SessionState::Backoff { .. }
    ));
}

/// Issue 11 hole 3: while a doubtful session is kept, no run acquires on it
/// and no new session opens; the standby gets a new session once the
/// cancelled job has returned and the doubtful one is closed.
#[test]
fn a_doubtful_session_takes_no_new_work() {
    let mut h = harness(opts());
    let a = started(&mut h, "a", 900);
    h.advance(ms(200));
    h.fail(boom("XX000"));
    let b = h.run(lease("b"));
    let cmds = h.advance(ms(300));
    assert!(
        !has(&cmds, |c| matches!(
            c,
            Command::Query { .. } | Command::OpenSession { .. } | Command::CloseSession { .. }
        )),
        "{cmds:?}"
    );
    assert!(h.in_flight().is_none());
    assert!(matches!(
        h.machine().status().session,
        SessionState::Doubtful { .. }
    ));
    assert_eq!(
        h.machine().status().leases[1].state,
        LeaseState::Standby { holder_pid: None }
    );
    let cmds = h.input(Input::JobExited {
        run: a,
        exit: JobExit::Ok,
    });
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    assert!(!has(&cmds, |c| matches!(c, Command::OpenSession { .. })));
    let cmds = h.advance(RECONNECT_BASE);
    assert!(has(&cmds, |c| matches!(c, Command::OpenSession { .. })));
    h.connect(7);
    // Both contend now: a stands by again since its job returned.
    assert!(h.try_keys().contains(&lease("b").key()));
    assert!(h.try_keys().contains(&lease("a").key()));
    assert!(h.machine().valid_until(b).is_none());
}

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

/// Answers every statement of a standby that holds nothing and wins
/// nothing for `d`; returns the statements sent.
fn standby_at_rest(h: &mut Harness, d: Duration) -> Vec<Statement> {
    let end = h.now() + d;
    let mut sent = Vec::new();
    while h.now() < end {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(s @ Statement::TryLock { .. }) => {
                sent.push(s);
                h.advance(ms(1));
                h.lose(Some(99));
            }
            Some(s @ (Statement::Heartbeat | Statement::Verify)) => {
                sent.push(s);
                h.advance(ms(1));
                h.heartbeat(7, &[]);
            }
            Some(s @ Statement::Wait { timeout_ms, .. }) => {
                sent.push(s);
                h.advance(ms(timeout_ms));
                h.held_all_along(7);
            }
            Some(s) => panic!("{s:?}"),
            None => {
                h.advance(ms(1));
            }
        }
    }
    sent
}

/// A standby that polls (waiting on the server off).
fn polling() -> Options {
    let mut o = opts();
    o.wait_on_server = false;
    o
}

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

/// Woken, a standby tries at once when a handover notification says the
/// release was graceful, and after the lock delay otherwise; a try that
/// loses sends it back to waiting within the same step.
#[test]
fn a_woken_standby_tries_after_the_lock_delay_or_at_a_notification() {
    let o = {
        let mut o = opts();
        o.lock_delay = ms(20);
        o
    };
    let mut h = harness(o);
    h.run(lease("a"));
    h.connect(7);
    h.lose(Some(99));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    // Freed without a notification (the holder's session ended): the lock delay.
    h.advance(ms(50));
    h.wake(7);
    assert!(h.in_flight().is_none(), "{:?}", h.in_flight());
    h.advance(ms(19));
    assert!(h.in_flight().is_none());
    h.advance(ms(1));
    assert_eq!(h.try_keys(), vec![key("a")]);
    // Someone else won: back to waiting at once.
    h.lose(Some(98));
    assert!(matches!(h.statement(), Statement::Wait { .. }));
    // Freed by a graceful release: its notification cuts the delay short.
    h.advance(ms(10));
    h.wake(7);
    assert!(h.in_flight().is_none());
    h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload: key("a").to_string(),
        sender_pid: 98,
    });
    assert_eq!(h.try_keys(), vec![key("a")]);
    h.win(901);
    assert!(h.machine().is_valid(RunId(0), h.now()));
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

/// Behind a pooler (it rejected the startup options), a standby polls: a
/// wait would hold one of the pooler's server connections for its whole
/// length.
#[test]
fn behind_a_pooler_a_standby_polls() {
    let mut h = harness(opts());
    h.run(lease("a"));
    let session = h.session().unwrap();
    h.input(Input::SessionEnded {
        session,
        error: Some(SessionError {
            code: Some("08P01".into()),
            message: "unsupported startup parameter: options".into(),
            config: false,
        }),
    });
    h.connect(7);
    assert_eq!(h.try_keys(), vec![key("a")]);
    h.lose(Some(99));
    assert!(h.in_flight().is_none(), "{:?}", h.in_flight());
    let sent = standby_at_rest(&mut h, ms(1_000));
    assert!(
        sent.iter().all(|s| matches!(s, Statement::TryLock { .. })),
        "{sent:?}"
    );
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
    // Once it leads, it heartbeats an interval after the winning try.
    h.advance(ms(200));
    let won = h.now();
    h.win(900);
    h.advance(ms(199));
    assert!(h.in_flight().is_none());
    h.advance(ms(1));
    assert_eq!(h.statement(), Statement::Heartbeat);
    assert_eq!(h.now(), won + ms(200));
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

#[test]
fn a_failed_try_is_verified_and_unknown_keys_unlocked() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    assert!(matches!(h.statement(), Statement::TryLock { .. }));
    h.fail(boom("53200"));
    // Verification before anything else; the key turned out to be held.
    let cmds = h.heartbeat(7, &[key("a")]);
    assert!(
        has(
            &cmds,
            |c| matches!(c, Command::Query { statement: Statement::Release { keys, .. }, .. } if keys == &vec![key("a")])
        ),
        "{cmds:?}"
    );
    assert!(!has(&cmds, |c| matches!(c, Command::StartJob { .. })));
}

#[test]
fn a_held_key_is_never_tried_again() {
    let mut h = harness(opts());
    started(&mut h, "a", 900);
    h.run(lease("b"));
    h.advance(Duration::ZERO);
    let Statement::TryLock { keys, .. } = h.statement() else {
        panic!("{:?}", h.statement())
    };
    assert_eq!(keys, vec![key("b")]);
}

#[test]
fn a_new_backend_pid_is_refused_as_a_pooler() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    h.advance(ms(200));
    let cmds = h.heartbeat(8, &[key("a")]);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::Refused(Refusal::BackendChanged { was: 7, now: 8 }),
            ..
        }
    )));
    let cmds = h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Refused(_),
            ..
        }
    )));
    assert!(matches!(
        h.start(LeaseId::named("z").unwrap()),
        Err(RunRejected::Refused(_))
    ));
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
        payload: key("a").to_string(),
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

#[test]
fn a_query_timeout_closes_the_session_and_backs_off() {
    // A validity longer than heartbeat + query timeout, so the timeout comes first.
    let mut h = harness({
        let mut o = opts();
        o.validity = Some(ms(2000));
        o
    });
    let run = started(&mut h, "a", 900);
    h.advance(ms(200));
    let cmds = h.advance(opts().query_timeout);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::QueryTimeout,
            ..
        }
    )));
    // Issue 11 hole 3: the session stays open, holding the key, until the
    // job has returned; then it is closed and a new one opens after a backoff.
    assert!(!has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    assert!(matches!(
        h.machine().status().session,
        SessionState::Doubtful { .. }
    ));
    let cmds = h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    assert!(matches!(
        h.machine().status().session,
        SessionState::Backoff { .. }
    ));
    let t = h.machine().poll_timeout().unwrap();
    assert!(
        t > h.now() && t <= h.now() + RECONNECT_BASE,
        "backoff {:?}",
        t - h.now()
    );
}

#[test]
fn dropping_a_run_releases_its_key() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    h.input(Input::JobExited {
        run,
        exit: JobExit::Abandoned,
    });
    let cmds = h.released();
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Abandoned,
            ..
        }
    )));
    let mut h = harness(opts());
    let run = h.run(lease("a"));
    let cmds = h.input(Input::JobExited {
        run,
        exit: JobExit::Abandoned,
    });
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Abandoned,
            ..
        }
    )));
}

#[test]
fn rejected_startup_options_go_into_the_setup_statement() {
    let rejected = || SessionError {
        code: Some("08P01".into()),
        message: "unsupported startup parameter: options".into(),
        config: false,
    };
    let mut h = harness(opts());
    let run = h.run(lease("a"));
    let s = h.session().unwrap();
    let cmds = h.input(Input::SessionEnded {
        session: s,
        error: Some(rejected()),
    });
    // At once, a new session without startup options.
    let reopened = cmds.iter().find_map(|c| match c {
        Command::OpenSession { session, params } => Some((*session, params.clone())),
        _ => None,
    });
    let (s2, params) = reopened.expect("a new session at once");
    assert_ne!(s2, s);
    assert!(params.startup_settings.is_empty(), "{params:?}");
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::StartupOptionsRejected { .. })));
    h.input(Input::SessionOpened { session: s2 });
    let Statement::Setup { settings, .. } = h.statement() else {
        panic!("expected the setup, got {:?}", h.statement())
    };
    let names: Vec<&str> = settings.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "search_path",
            "idle_session_timeout",
            "tcp_user_timeout",
            "tcp_keepalives_idle",
            "tcp_keepalives_interval",
            "tcp_keepalives_count"
        ]
    );
    assert!(Statement::Setup { nonce: 5, settings }
        .sql()
        .contains("set_config('idle_session_timeout', '900', false)"));
    // Rejected again (the user's own options): final.
    let cmds = h.input(Input::SessionEnded {
        session: s2,
        error: Some(rejected()),
    });
    assert!(has(
        &cmds,
        |c| matches!(c, Command::FinishRun { run: r, outcome: Outcome::Refused(Refusal::StartupOptionsIgnored { .. }) } if *r == run)
    ));
}

#[test]
fn a_standby_is_retried_after_a_backoff() {
    let o = opts();
    let mut h = harness(o.clone());
    h.run(lease("a"));
    let s = h.session().unwrap();
    h.input(Input::SessionOpened { session: s });
    let Statement::Setup { nonce, .. } = h.statement() else {
        panic!("expected the setup")
    };
    let cmds = h.reply(
        SetupReply {
            server_version: 150_000,
            in_recovery: true,
            backend_pid: 7,
            idle_session_timeout_ms: Some(o.guard_timeout().as_millis() as i64),
            tcp_settings: o.tcp_settings().map(|(_, v)| Some(v)),
            unix_socket: false,
            search_path_catalog: true,
            nonce: Some(nonce),
            promotion: Default::default(),
        }
        .to_rows(),
    );
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    assert!(!has(&cmds, |c| matches!(c, Command::FinishRun { .. })));
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::InRecovery { .. })));
    let cmds = h.advance(o.retry_interval);
    assert!(
        has(&cmds, |c| matches!(c, Command::OpenSession { .. })),
        "{cmds:?}"
    );
    // The primary, at last: it leads.
    h.connect(8);
    let cmds = h.win(800);
    assert!(has(&cmds, |c| matches!(c, Command::StartJob { .. })));
}

/// Hole 3 of issue 18: a session whose `search_path` does not read back as
/// `pg_catalog` (startup options dropped on the way) is refused, not used.
#[test]
fn a_search_path_other_than_pg_catalog_is_refused() {
    let o = opts();
    let mut h = harness(o.clone());
    h.run(lease("a"));
    let s = h.session().unwrap();
    h.input(Input::SessionOpened { session: s });
    let Statement::Setup { nonce, .. } = h.statement() else {
        panic!("expected the setup")
    };
    let cmds = h.reply(
        SetupReply {
            server_version: 150_000,
            in_recovery: false,
            backend_pid: 7,
            idle_session_timeout_ms: Some(o.guard_timeout().as_millis() as i64),
            tcp_settings: o.tcp_settings().map(|(_, v)| Some(v)),
            unix_socket: false,
            nonce: Some(nonce),
            search_path_catalog: false,
            promotion: Default::default(),
        }
        .to_rows(),
    );
    let refused = cmds.iter().find_map(|c| match c {
        Command::FinishRun {
            outcome: Outcome::Refused(r),
            ..
        } => Some(r.to_string()),
        _ => None,
    });
    let refused = refused.expect("the run is refused");
    assert!(
        refused.contains("search_path is not pg_catalog"),
        "{refused}"
    );
    assert!(!h
        .events()
        .iter()
        .any(|e| matches!(e, Event::SessionReady { .. })));
}

#[test]
fn the_session_asks_for_the_guard() {
    let mut h = harness(opts());
    h.run(lease("a"));
    let m = Machine::new(
        {
            let mut o = opts();
            o.server_guard = false;
            o
        },
        1,
    )
    .unwrap();
    assert_eq!(opts().guard_timeout(), ms(900));
    let _ = m;
    // The first OpenSession carried idle_session_timeout=900.
    let mut h2 = harness(opts());
    h2.start(LeaseId::named("a").unwrap()).unwrap();
    let mut found = false;
    while let Some(o) = h2.machine_mut().poll_session() {
        if let SessionCommand::Open { params, .. } = o {
            assert_eq!(
                params.options_string(),
                "-c search_path=pg_catalog -c idle_session_timeout=900 -c tcp_user_timeout=900 \
                 -c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=10"
            );
            found = true;
        }
    }
    assert!(found);
}

// ---- arbitrary inputs ------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Run(u8),
    Exit(u8, u8),
    Shutdown(u8),
    Close,
    Opened(i8),
    Lost(i8, bool),
    Reply(i8, Vec<Vec<Option<i64>>>),
    Error(i8),
    Notify(u8),
    Advance(u16),
}

fn step() -> impl Strategy<Value = Step> {
    let small_key = prop_oneof![
        Just(None),
        (0..4u8).prop_map(|i| Some(key(&format!("k{i}")))),
        any::<i64>().prop_map(Some),
        (0..5i64).prop_map(Some)
    ];
    let row = proptest::collection::vec(small_key, 0..4);
    prop_oneof![
        (0..4u8).prop_map(Step::Run),
        (0..6u8, 0..3u8).prop_map(|(r, e)| Step::Exit(r, e)),
        (0..6u8).prop_map(Step::Shutdown),
        Just(Step::Close),
        (-1..1i8).prop_map(Step::Opened),
        (-1..1i8, any::<bool>()).prop_map(|(s, e)| Step::Lost(s, e)),
        (-1..1i8, proptest::collection::vec(row, 0..5)).prop_map(|(q, rows)| Step::Reply(q, rows)),
        (-1..1i8).prop_map(Step::Error),
        (0..4u8).prop_map(Step::Notify),
        prop_oneof![Just(0u16), 0..2000u16].prop_map(Step::Advance),
    ]
}

/// Feeds one step; replies to the query in flight are made plausible half of
/// the time (the keys it asked about), arbitrary otherwise. The harness checks
/// every command and that `poll_timeout` is never in the past (a deadline in
/// the past would make a driver spin).
fn feed(h: &mut Harness, s: Step) -> Result<(), ObserverViolation> {
    let near = |id: Option<u64>, d: i8| id.map(|i| i.wrapping_add_signed(i64::from(d)));
    let session = h.session().map(|s| s.0);
    let query = h.last_query().map(|q| q.0 .0);
    let input = match s {
        Step::Run(i) => {
            let _ = h.start(LeaseId::named(format!("k{i}")).unwrap());
            None
        }
        Step::Exit(r, e) => Some(Input::JobExited {
            run: RunId(u64::from(r)),
            exit: [JobExit::Ok, JobExit::Failed, JobExit::Abandoned][e as usize],
        }),
        Step::Shutdown(r) => Some(Input::Shutdown {
            run: RunId(u64::from(r)),
        }),
        Step::Close => Some(Input::Close),
        Step::Opened(d) => near(session, d).map(|s| Input::SessionOpened {
            session: SessionId(s),
        }),
        Step::Lost(d, e) => near(session, d).map(|s| Input::SessionEnded {
            session: SessionId(s),
            error: e.then(|| SessionError::other("x")),
        }),
        Step::Reply(d, rows) => near(query, d).map(|q| Input::Reply {
            query: QueryId(q),
            result: Ok(rows),
        }),
        Step::Error(d) => near(query, d).map(|q| Input::Reply {
            query: QueryId(q),
            result: Err(SessionError::other("x")),
        }),
        Step::Notify(i) => Some(Input::Notification {
            channel: HANDOVER_CHANNEL.into(),
            payload: key(&format!("k{i}")).to_string(),
            sender_pid: 99,
        }),
        Step::Advance(n) => {
            h.set_now(h.now() + ms(u64::from(n)));
            Some(Input::Tick)
        }
    };
    h.step(input)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever arrives, in whatever order: no panic, and every rule the
    /// observer checks holds.
    #[test]
    fn arbitrary_inputs_keep_every_rule(steps in proptest::collection::vec(step(), 0..120)) {
        let mut h = Harness::new(opts(), 3).unwrap();
        for (i, s) in steps.into_iter().enumerate() {
            let d = format!("{s:?}");
            if let Err(e) = feed(&mut h, s) {
                prop_assert!(false, "step {i} ({d}): {e}");
            }
        }
    }
}

/// The startup options rejected (the settings go into the setup): after the setup the
/// machine probes on a second connection. One that reads this session's nonce shares
/// its backend: refused as a transaction pooler (final). One that fails proves nothing:
/// the session is closed and retried, not refused.
#[test]
fn behind_a_pooler_the_probe_refuses_a_shared_backend() {
    let rejected = || Input::SessionEnded {
        session: SessionId(0),
        error: Some(SessionError {
            code: Some("08P01".into()),
            message: "unsupported startup parameter: options".into(),
            config: false,
        }),
    };

    // The probe reads this session's nonce: refused.
    let mut h = harness(opts());
    let run = h.run(lease("a"));
    h.input(rejected());
    let nonce = h.setup(7);
    assert!(h.probing(), "no probe after the setup: {:?}", h.in_flight());
    assert_eq!(h.statement(), Statement::Heartbeat);
    let probe = HeartbeatReply {
        backend_pid: Some(7),
        nonce: Some(nonce),
    };
    let cmds = h.reply(probe.to_rows());
    assert!(
        has(&cmds, |c| matches!(
            c,
            Command::FinishRun {
                run: r,
                outcome: Outcome::Refused(Refusal::TransactionPooler { .. }),
            } if *r == run
        )),
        "{cmds:?}"
    );

    // The probe fails: not refused; the session is closed and opened again later.
    let mut h = harness(opts());
    h.run(lease("a"));
    h.input(rejected());
    h.setup(7);
    assert!(h.probing());
    let cmds = h.fail(boom("53300"));
    assert!(
        has(&cmds, |c| matches!(c, Command::CloseSession { .. })),
        "{cmds:?}"
    );
    assert!(
        !has(&cmds, |c| matches!(c, Command::FinishRun { .. })),
        "{cmds:?}"
    );
}
