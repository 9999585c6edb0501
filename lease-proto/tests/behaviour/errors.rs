//! Errors a user can see: configuration errors at connect, before and after
//! the first ready session; network errors; the last error in the status.

use crate::common::*;
use lease_proto::limits::*;
use lease_proto::sim::Command;
use lease_proto::sim::Harness;
use lease_proto::*;

fn wrong_password() -> SessionError {
    SessionError::server(
        "28P01",
        "password authentication failed for user \"nobody\"",
    )
}

fn refused() -> SessionError {
    SessionError::other("error connecting to server: Connection refused (os error 111)")
}

fn connect_fails(h: &mut Harness, error: SessionError) -> Vec<Command> {
    let session = h.session().expect("a connection attempt");
    h.input(Input::SessionEnded {
        session,
        error: Some(error),
    })
}

fn connect_failed_event(h: &Harness) -> Option<(SessionError, bool, bool)> {
    h.events().iter().find_map(|e| match e {
        Event::ConnectFailed {
            error,
            configuration,
            retried,
            ..
        } => Some((error.clone(), *configuration, *retried)),
        _ => None,
    })
}

#[test]
fn the_classification_names_configuration_errors() {
    for code in [
        "28P01", "28000", "3D000", "42501", "0A000", "22023", "42704",
    ] {
        assert!(SessionError::server(code, "x").is_configuration(), "{code}");
    }
    for code in ["57P01", "57P03", "53300", "08006", "08P01", "XX000"] {
        assert!(
            !SessionError::server(code, "x").is_configuration(),
            "{code}"
        );
    }
    assert!(!refused().is_configuration());
    assert!(
        SessionError::config("error performing TLS handshake: invalid peer certificate")
            .is_configuration()
    );
}

#[test]
fn a_configuration_error_before_the_first_session_finishes_every_run() {
    let mut h = Harness::new(opts(), 1).unwrap();
    let a = h.run(lease("a"));
    let b = h.run(lease("b"));
    let cmds = connect_fails(&mut h, wrong_password());
    for run in [a, b] {
        assert!(
            has(&cmds, |c| matches!(
                c,
                Command::FinishRun { run: r, outcome: Outcome::Config(e) }
                    if *r == run && e == &wrong_password()
            )),
            "{cmds:?}"
        );
    }
    let (error, configuration, retried) = connect_failed_event(&h).expect("an event");
    assert_eq!(error, wrong_password());
    assert!(configuration && !retried);
    // Never "session lost" for a session that never opened.
    assert!(!h
        .events()
        .iter()
        .any(|e| matches!(e, Event::SessionLost { .. })));
    let status = h.machine().status();
    let last = status.last_error.expect("the last error");
    assert_eq!(last.error, wrong_password());
    assert!(last.connecting);
    assert_eq!(last.at, h.now());
    // Nothing more is asked for; the machine stays usable (a later run
    // connects again, after the backoff).
    assert_eq!(h.machine().poll_timeout(), None);
    let c = h.run(lease("c"));
    let cmds = h.advance(opts().retry_interval);
    assert!(has(&cmds, |c| matches!(c, Command::OpenSession { .. })));
    let cmds = connect_fails(&mut h, wrong_password());
    assert!(has(&cmds, |cmd| matches!(
        cmd,
        Command::FinishRun { run, outcome: Outcome::Config(_) } if *run == c
    )));
}

#[test]
fn a_configuration_error_after_a_ready_session_is_retried_loudly() {
    let mut h = Harness::new(opts(), 1).unwrap();
    let run = h.run(lease("a"));
    h.connect(7);
    h.win(900);
    let session = h.session().unwrap();
    h.input(Input::SessionEnded {
        session,
        error: Some(SessionError::server("57P01", "terminating connection")),
    });
    // The lost job returns: the run stands by again and needs a session.
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    for attempt in 1..=3u32 {
        let cmds = h.advance(opts().retry_interval * 2);
        assert!(
            has(&cmds, |c| matches!(c, Command::OpenSession { .. })),
            "attempt {attempt}: {cmds:?}"
        );
        let cmds = connect_fails(&mut h, wrong_password());
        assert!(!has(&cmds, |c| matches!(c, Command::FinishRun { .. })));
        let (error, configuration, retried) = connect_failed_event(&h).expect("an event");
        assert_eq!(error, wrong_password());
        assert!(configuration && retried);
        let status = h.machine().status();
        assert!(
            // The session's loss counted as the first failure.
            matches!(status.session, SessionState::Backoff { failures, .. } if failures == attempt + 1),
            "{status:?}"
        );
        assert_eq!(status.last_error.unwrap().error, wrong_password());
    }
    // The password is fixed: the run leads again.
    h.advance(opts().retry_interval * 2);
    h.connect(8);
    let cmds = h.win(950);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::StartJob { run: r, token: 950, .. } if *r == run
    )));
}

#[test]
fn a_network_error_is_retried_and_named() {
    let mut h = Harness::new(opts(), 1).unwrap();
    h.run(lease("a"));
    for attempt in 1..=3u32 {
        let cmds = connect_fails(&mut h, refused());
        assert!(!has(&cmds, |c| matches!(c, Command::FinishRun { .. })));
        let (error, configuration, retried) = connect_failed_event(&h).expect("an event");
        assert!(error.message.contains("Connection refused"));
        assert!(!configuration && retried);
        assert!(!h
            .events()
            .iter()
            .any(|e| matches!(e, Event::SessionLost { .. })));
        let status = h.machine().status();
        assert!(
            matches!(status.session, SessionState::Backoff { failures, .. } if failures == attempt)
        );
        assert_eq!(status.last_error.unwrap().error, refused());
        let cmds = h.advance(opts().retry_interval * 2);
        assert!(has(&cmds, |c| matches!(c, Command::OpenSession { .. })));
    }
}

#[test]
fn a_connection_attempt_that_times_out_says_so() {
    let mut h = Harness::new(opts(), 1).unwrap();
    h.run(lease("a"));
    h.advance(opts().query_timeout);
    let (error, configuration, retried) = connect_failed_event(&h).expect("an event");
    assert_eq!(error.message, "connection attempt timed out after 500 ms");
    assert!(!configuration && retried);
    assert!(h.machine().status().last_error.is_some());
}

#[test]
fn a_server_too_old_says_which_version_lease_needs() {
    let text = |found, needed| Refusal::ServerTooOld { found, needed }.to_string();
    assert_eq!(
        text(Some(130_023), MIN_SERVER_VERSION_GUARD),
        "PostgreSQL 13.23 is not supported: lease needs PostgreSQL 14 or newer \
         (PostgreSQL 13 with the server guard off)"
    );
    assert_eq!(
        text(Some(120_005), MIN_SERVER_VERSION),
        "PostgreSQL 12.5 is not supported: lease needs PostgreSQL 13 or newer"
    );
    assert_eq!(
        text(Some(90_624), MIN_SERVER_VERSION_GUARD),
        "PostgreSQL 9.6.24 is not supported: lease needs PostgreSQL 14 or newer"
    );
    assert!(text(None, MIN_SERVER_VERSION_GUARD).starts_with(
        "PostgreSQL older than 14 is not supported (the server does not know \
         idle_session_timeout"
    ));
}
