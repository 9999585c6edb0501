//! The Run contract, step by step, with the machine driven by hand: a job starts after the
//! win, its end releases the key, closing and dropping cancel and release, a lost session
//! cancels at once, a failed try is verified.

use crate::common::*;
use lease_proto::limits::*;
use lease_proto::sim::Command;
use lease_proto::*;
use std::time::Duration;

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
        |c| matches!(c, Command::Query { statement: Statement::Release { keys, notify: true, .. }, .. } if keys == &vec![key("a")])
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
    // From the try's send time: the win was answered at once and held back
    // for the lock delay.
    let sent = h.now() - opts().lock_delay;
    assert_eq!(valid_until, sent + opts().validity_window());
    // The heartbeat is sent (an interval after the try) and never answered;
    // the process was frozen past the deadline.
    h.advance(ms(200) - opts().lock_delay);
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
    // The session is kept (formerly: CloseSession at this tick), with its
    // lock, while the cancelled job runs, until the guard deadline: the
    // heartbeat's send time (+200 ms) + idle_session_timeout (900 ms).
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
    // The doubtful session stays open, holding the key, until the job has
    // returned; then it is closed and a new one opens after a backoff.
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

/// A drop decides the run's outcome in every state: dropped after its job returned by
/// itself and before the release's reply, the run ends `Abandoned`, not `Completed`.
#[test]
fn a_run_dropped_after_its_job_returned_ends_abandoned() {
    let mut h = harness(opts());
    let run = started(&mut h, "a", 900);
    job_returns_then_run_dropped_mid_release(&mut h, run);
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
