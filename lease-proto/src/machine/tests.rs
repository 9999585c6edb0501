//! The dispatch's own tests: the deadline `Machine::timeout_reason` names
//! as a session comes up and a lease is won, and what a standby's status shows.

use std::time::Duration;

use super::*;
use crate::sql::{SetupReply, Statement, TryReply};

/// A PostgreSQL 17 primary's setup reply, backend 7, with what `opts` asked for.
fn setup_rows(opts: &Options, nonce: i64) -> Vec<crate::sql::Row> {
    SetupReply {
        server_version: 170_000,
        in_recovery: false,
        backend_pid: 7,
        idle_session_timeout_ms: Some(opts.guard_timeout().as_millis() as i64),
        tcp_settings: opts.tcp_settings().map(|(_, v)| Some(v)),
        unix_socket: false,
        search_path_catalog: true,
        nonce: Some(nonce),
        promotion: Default::default(),
        server_clock_us: None,
    }
    .to_rows()
}

fn query(m: &mut Machine) -> (QueryId, Statement) {
    let mut last = None;
    while let Some(o) = m.poll_output() {
        if let Output::Session(SessionCommand::Query { query, statement }) = o {
            last = Some((query, statement));
        }
    }
    last.expect("a statement was sent")
}

/// The last statement sent, which must be a try: its query, its keys and
/// the session it names, as a [`TryReply`] carries it back.
fn try_query(m: &mut Machine) -> (QueryId, Vec<i64>, (i64, Option<i64>)) {
    let (
        q,
        Statement::TryLock {
            keys,
            backend_pid,
            nonce,
        },
    ) = query(m)
    else {
        panic!("expected a try");
    };
    (q, keys, (backend_pid, Some(nonce)))
}

#[test]
fn the_timeout_reason_follows_the_state() {
    let opts = Options::default();
    let t = Instant::now();
    let mut m = Machine::new(opts.clone(), 1).unwrap();
    assert_eq!(m.timeout_reason(), None);
    m.run(t, LeaseId::named("a").unwrap()).unwrap();
    assert_eq!(m.timeout_reason(), Some(Deadline::Connect));
    assert_eq!(m.poll_timeout(), Some(t + opts.query_timeout));
    m.handle_input(
        t,
        Input::SessionOpened {
            session: SessionId(0),
        },
    );
    assert_eq!(m.timeout_reason(), Some(Deadline::Query));
    let (q, Statement::Setup { nonce, .. }) = query(&mut m) else {
        panic!("expected the setup");
    };
    let result = Ok(setup_rows(&opts, nonce));
    m.handle_input(t, Input::Reply { query: q, result });
    let (q, listen) = query(&mut m);
    assert_eq!(listen, Statement::Listen);
    m.handle_input(
        t,
        Input::Reply {
            query: q,
            result: Ok(vec![]),
        },
    );
    let (q, keys, session) = try_query(&mut m);
    let won = TryReply {
        won: vec![(keys[0], 99)],
        session: Some(session),
        ..TryReply::default()
    };
    let result = Ok(won.to_rows());
    m.handle_input(t, Input::Reply { query: q, result });
    // Won: the job starts after the lock delay.
    assert_eq!(m.timeout_reason(), Some(Deadline::LockDelay));
    assert_eq!(m.poll_timeout(), Some(t + opts.lock_delay));
    m.handle_input(t + opts.lock_delay, Input::Tick);
    // Leading, nothing in flight: the heartbeat comes before validity ends.
    assert_eq!(m.timeout_reason(), Some(Deadline::Heartbeat));
    assert_eq!(m.poll_timeout(), Some(t + opts.heartbeat_interval));
    m.handle_input(
        t,
        Input::SessionEnded {
            session: SessionId(0),
            error: None,
        },
    );
    // The run still needs the session (its job is stopping: not yet).
    assert_eq!(m.timeout_reason(), None);
    let run = RunId(0);
    m.handle_input(
        t,
        Input::JobExited {
            run,
            exit: JobExit::Ok,
        },
    );
    assert_eq!(m.timeout_reason(), Some(Deadline::Backoff));
    assert!(matches!(m.status().session, SessionState::Backoff { .. }));
}

#[test]
fn a_standby_shows_the_holder_its_last_try_saw() {
    let opts = Options {
        notify_handover: false,
        ..Options::default()
    };
    let t = Instant::now();
    let mut m = Machine::new(opts.clone(), 1).unwrap();
    m.run(t, LeaseId::named("a").unwrap()).unwrap();
    m.handle_input(
        t,
        Input::SessionOpened {
            session: SessionId(0),
        },
    );
    let (q, Statement::Setup { nonce, .. }) = query(&mut m) else {
        panic!("expected the setup");
    };
    m.handle_input(
        t,
        Input::Reply {
            query: q,
            result: Ok(setup_rows(&opts, nonce)),
        },
    );
    let standby = |m: &Machine| m.status().leases[0].state.clone();
    assert_eq!(standby(&m), LeaseState::Standby { holder_pid: None });
    let (q, keys, session) = try_query(&mut m);
    let held = TryReply {
        not_won: vec![(keys[0], Some(4242))],
        session: Some(session),
        ..TryReply::default()
    };
    m.handle_input(
        t,
        Input::Reply {
            query: q,
            result: Ok(held.to_rows()),
        },
    );
    assert_eq!(
        standby(&m),
        LeaseState::Standby {
            holder_pid: Some(4242)
        }
    );
    // Holding nothing, it waits on the server for the key until the
    // retry deadline, instead of sitting idle, and takes it there.
    let (_, wait) = query(&mut m);
    let Statement::Take {
        key, timeout_ms, ..
    } = wait
    else {
        panic!("expected a take, got {wait:?}");
    };
    assert_eq!(key, keys[0]);
    let retry = opts.retry_interval.as_millis() as u64;
    assert!(
        (retry * 4 / 5..=retry).contains(&timeout_ms),
        "the wait ends by the (jittered) retry deadline: {timeout_ms} ms"
    );
    assert_eq!(m.timeout_reason(), Some(Deadline::Query));
    // Its query timer allows for the block: the lock timeout (timed by
    // the server's clock: stretched by the drift bound) plus the query
    // timeout (the statement's text rounds the former down to ms).
    let at = m.poll_timeout().unwrap() - opts.query_timeout;
    let block = Duration::from_millis(timeout_ms).mul_f64(1.0 + opts.drift_bound());
    assert!(t + block <= at && at < t + block + Duration::from_millis(2));
}
