//! Poolers seen by the machine: a changed backend pid is refused, the pooler probe refuses
//! a shared backend, and behind a pooler a standby polls instead of waiting.

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::sim::Command;
use lease_proto::*;

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
        server_clock_us: None,
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

/// A probe that gets no answer within the query timeout (behind a session pool whose
/// every server connection is taken, the probe's second connection waits for one that
/// never frees): the session is given up with an error that names the pool, not "a
/// statement timed out", and the locker tries again later, not refused.
#[test]
fn a_probe_that_gets_no_answer_names_a_full_session_pool() {
    let mut h = harness(opts());
    h.run(lease("a"));
    h.input(Input::SessionEnded {
        session: SessionId(0),
        error: Some(SessionError {
            code: Some("08P01".into()),
            message: "unsupported startup parameter: options".into(),
            config: false,
        }),
    });
    h.setup(7);
    assert!(h.probing(), "no probe after the setup: {:?}", h.in_flight());
    h.advance(opts().query_timeout + ms(1));
    let last = h.machine().status().last_error.map(|e| e.error.to_string());
    let last = last.unwrap_or_default();
    assert!(
        last.contains("pooler probe") && last.contains("no free server connection"),
        "{last}"
    );
    // Not refused: a new run is still taken.
    assert!(h.start(LeaseId::named("b").unwrap()).is_ok());
}
