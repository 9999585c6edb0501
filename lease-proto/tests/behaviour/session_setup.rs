//! What a session asks of the server at setup and what it refuses: the guard, rejected
//! startup options, a `search_path` other than `pg_catalog`, a hot standby.

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::sim::Command;
use lease_proto::*;

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
    let nonce = open_until_setup(&mut h);
    let cmds = h.reply(
        SetupReply {
            in_recovery: true,
            ..setup_reply(&o, nonce)
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

/// A session whose `search_path` does not read back as `pg_catalog`
/// (startup options dropped on the way) is refused, not used.
#[test]
fn a_search_path_other_than_pg_catalog_is_refused() {
    let o = opts();
    let mut h = harness(o.clone());
    h.run(lease("a"));
    let nonce = open_until_setup(&mut h);
    let cmds = h.reply(
        SetupReply {
            search_path_catalog: false,
            ..setup_reply(&o, nonce)
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
    while let Some(o) = h2.machine_mut().poll_output() {
        if let Output::Session(SessionCommand::Open { params, .. }) = o {
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
