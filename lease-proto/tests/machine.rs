//! The machine driven by hand: the Run contract step by step, and arbitrary
//! input sequences through the observer.

use std::time::{Duration, Instant};

use lease_proto::sim::{drain, Command, Observer};
use lease_proto::*;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn opts() -> Options {
    Options {
        retry_interval: ms(200),
        heartbeat_interval: ms(200),
        query_timeout: ms(500),
        guard_margin: ms(200),
        ..Options::default()
    }
}

struct H {
    m: Machine,
    t: Instant,
    obs: Observer,
    session: Option<SessionId>,
    query: Option<(QueryId, Statement)>,
}

impl H {
    fn new(o: Options) -> H {
        H {
            m: Machine::new(o, 1).unwrap(),
            t: Instant::now(),
            obs: Observer::new(),
            session: None,
            query: None,
        }
    }

    fn run(&mut self, name: &str) -> RunId {
        let id = self.m.run(self.t, LeaseId::named(name).unwrap()).unwrap();
        self.obs.run_started(id);
        self.drain();
        id
    }

    fn input(&mut self, i: Input) -> Vec<Command> {
        self.obs.input(&i);
        self.m.handle_input(self.t, i);
        self.drain()
    }

    fn drain(&mut self) -> Vec<Command> {
        let (v, _) = drain(&mut self.m, &mut self.obs).unwrap();
        for c in &v {
            match c {
                Command::OpenSession { session, .. } => self.session = Some(*session),
                Command::Query { query, statement } => {
                    self.query = Some((*query, statement.clone()))
                }
                _ => {}
            }
        }
        v
    }

    fn advance(&mut self, d: Duration) -> Vec<Command> {
        self.t += d;
        self.input(Input::Tick)
    }

    fn reply(&mut self, rows: Vec<Row>) -> Vec<Command> {
        let (query, _) = self.query.take().expect("a query in flight");
        self.input(Input::Reply {
            query,
            result: Ok(rows),
        })
    }

    fn fail(&mut self, code: &str) -> Vec<Command> {
        let (query, _) = self.query.take().expect("a query in flight");
        self.input(Input::Reply {
            query,
            result: Err(DbError {
                code: Some(code.into()),
                message: "boom".into(),
            }),
        })
    }

    fn statement(&self) -> Statement {
        self.query.as_ref().expect("a query in flight").1.clone()
    }

    /// Connects and passes setup; returns the commands after LISTEN's reply.
    fn connect(&mut self, pid: i64) -> Vec<Command> {
        let s = self.session.expect("asked to open a session");
        self.input(Input::SessionOpened { session: s });
        assert_eq!(self.statement(), Statement::Setup);
        let ist = self.m.options().guard_timeout().as_millis() as i64;
        self.reply(vec![
            vec![Some(1), Some(150_000)],
            vec![Some(2), Some(0)],
            vec![Some(3), Some(pid)],
            vec![Some(4), Some(ist)],
        ]);
        assert_eq!(self.statement(), Statement::Listen);
        self.reply(vec![])
    }

    fn win(&mut self, token: i64) -> Vec<Command> {
        let Statement::TryLock { keys } = self.statement() else {
            panic!("expected a try, got {:?}", self.statement())
        };
        self.reply(
            keys.iter()
                .map(|k| vec![Some(*k), Some(token), None])
                .collect(),
        )
    }

    fn heartbeat(&mut self, pid: i64, keys: &[i64]) -> Vec<Command> {
        assert_eq!(self.statement(), Statement::Heartbeat);
        let mut rows = vec![vec![Some(0), Some(pid)]];
        rows.extend(keys.iter().map(|k| vec![Some(1), Some(*k)]));
        self.reply(rows)
    }
}

fn key(name: &str) -> i64 {
    key_for_name(name)
}

fn has(cmds: &[Command], f: impl Fn(&Command) -> bool) -> bool {
    cmds.iter().any(f)
}

fn started(h: &mut H, name: &str, token: i64) -> RunId {
    let run = h.run(name);
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
    let mut h = H::new(opts());
    let run = started(&mut h, "a", 900);
    assert!(h.m.is_valid(run, h.t));
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
    let cmds = h.reply(vec![vec![Some(key("a")), Some(1)]]);
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
    let mut h = H::new(opts());
    let run = started(&mut h, "a", 900);
    h.input(Input::JobExited {
        run,
        exit: JobExit::Failed,
    });
    let cmds = h.reply(vec![vec![Some(key("a")), Some(1)]]);
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
    let mut h = H::new(Options {
        max_leases: 2,
        ..opts()
    });
    h.run("a");
    assert!(matches!(
        h.m.run(h.t, LeaseId::named("a").unwrap()),
        Err(RunError::AlreadyRunning(_))
    ));
    // Same key under another name is the same lock.
    assert!(matches!(
        h.m.run(h.t, LeaseId::raw(key("a"))),
        Err(RunError::AlreadyRunning(_))
    ));
    h.run("b");
    assert_eq!(
        h.m.run(h.t, LeaseId::named("c").unwrap()),
        Err(RunError::TooManyLeases { cap: 2 })
    );
    h.input(Input::Close);
    let r = h.m.run(h.t, LeaseId::named("d").unwrap()).unwrap();
    h.obs.run_started(r);
    let cmds = h.drain();
    assert!(has(
        &cmds,
        |c| matches!(c, Command::FinishRun { run, outcome: Outcome::Closed } if *run == r)
    ));
}

#[test]
fn close_cancels_waits_for_the_job_then_releases_and_closes() {
    let mut h = H::new(opts());
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
    let cmds = h.reply(vec![vec![Some(key("a")), Some(1)]]);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Closed,
            ..
        }
    )));
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    assert!(h.m.is_closed());
}

#[test]
fn graceful_shutdown_returns_cancelled_even_if_the_job_errs() {
    let mut h = H::new(opts());
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
        h.m.valid_until(run),
        None,
        "a cancelled lease is no longer valid"
    );
    h.input(Input::JobExited {
        run,
        exit: JobExit::Failed,
    });
    let cmds = h.reply(vec![vec![Some(key("a")), Some(1)]]);
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
    let mut h = H::new(opts());
    let run = started(&mut h, "a", 900);
    let s = h.session.unwrap();
    let cmds = h.input(Input::SessionLost {
        session: s,
        error: Some(DbError {
            code: Some("57P01".into()),
            message: "terminating".into(),
        }),
    });
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::SessionLost(_),
            ..
        }
    )));
    assert!(!h.m.is_valid(run, h.t));
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    // Reconnect after the backoff, win again: the job starts again with a new token.
    h.query = None;
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
    let mut h = H::new(opts());
    let run = started(&mut h, "a", 900);
    let valid_until = h.m.valid_until(run).unwrap();
    assert_eq!(valid_until, h.t + opts().validity_window());
    // The heartbeat is sent and never answered; the process was frozen past the deadline.
    h.advance(ms(200));
    assert_eq!(h.statement(), Statement::Heartbeat);
    h.t = valid_until;
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
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
}

#[test]
fn heartbeat_without_the_key_cancels_the_job() {
    let mut h = H::new(opts());
    started(&mut h, "a", 900);
    h.advance(ms(200));
    let cmds = h.heartbeat(7, &[]);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::NotHeld,
            ..
        }
    )));
}

#[test]
fn a_failed_try_is_verified_and_unknown_keys_unlocked() {
    let mut h = H::new(opts());
    h.run("a");
    h.connect(7);
    assert!(matches!(h.statement(), Statement::TryLock { .. }));
    h.fail("53200");
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
    let mut h = H::new(opts());
    started(&mut h, "a", 900);
    h.run("b");
    h.advance(Duration::ZERO);
    let Statement::TryLock { keys } = h.statement() else {
        panic!("{:?}", h.statement())
    };
    assert_eq!(keys, vec![key("b")]);
}

#[test]
fn a_new_backend_pid_is_refused_as_a_pooler() {
    let mut h = H::new(opts());
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
        h.m.run(h.t, LeaseId::named("z").unwrap()),
        Err(RunError::Refused(_))
    ));
}

#[test]
fn a_notification_triggers_an_immediate_try() {
    let mut h = H::new(opts());
    h.run("a");
    h.connect(7);
    let Statement::TryLock { keys } = h.statement() else {
        panic!()
    };
    h.reply(vec![vec![Some(keys[0]), None, Some(99)]]);
    assert!(h.query.is_none());
    let cmds = h.input(Input::Notification {
        channel: HANDOVER_CHANNEL.into(),
        payload: key("a").to_string(),
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
    let mut h = H::new(Options {
        validity: Some(ms(2000)),
        ..opts()
    });
    let run = started(&mut h, "a", 900);
    h.advance(ms(200));
    let cmds = h.advance(opts().query_timeout);
    assert!(has(&cmds, |c| matches!(c, Command::CloseSession { .. })));
    assert!(has(&cmds, |c| matches!(
        c,
        Command::CancelJob {
            reason: Reason::QueryTimeout,
            ..
        }
    )));
    // No session is needed until the job has returned; then it reconnects after a backoff.
    assert_eq!(h.m.status().session, SessionState::Idle);
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert!(matches!(h.m.status().session, SessionState::Backoff { .. }));
    let t = h.m.poll_timeout().unwrap();
    assert!(
        t > h.t && t <= h.t + RECONNECT_BASE,
        "backoff {:?}",
        t - h.t
    );
}

#[test]
fn dropping_a_run_releases_its_key() {
    let mut h = H::new(opts());
    let run = started(&mut h, "a", 900);
    h.input(Input::JobExited {
        run,
        exit: JobExit::Abandoned,
    });
    let cmds = h.reply(vec![vec![Some(key("a")), Some(1)]]);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Abandoned,
            ..
        }
    )));
    let mut h = H::new(opts());
    let run = h.run("a");
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
fn startup_option_rejection_and_standby_are_refused() {
    let mut h = H::new(opts());
    let run = h.run("a");
    let s = h.session.unwrap();
    let cmds = h.input(Input::SessionLost {
        session: s,
        error: Some(DbError {
            code: Some("08P01".into()),
            message: "unsupported startup parameter: options".into(),
        }),
    });
    assert!(has(
        &cmds,
        |c| matches!(c, Command::FinishRun { run: r, outcome: Outcome::Refused(Refusal::StartupOptionsIgnored { .. }) } if *r == run)
    ));
    let mut h = H::new(opts());
    h.run("a");
    h.input(Input::SessionOpened {
        session: h.session.unwrap(),
    });
    let cmds = h.reply(vec![
        vec![Some(1), Some(150_000)],
        vec![Some(2), Some(1)],
        vec![Some(3), Some(7)],
        vec![Some(4), Some(0)],
    ]);
    assert!(has(&cmds, |c| matches!(
        c,
        Command::FinishRun {
            outcome: Outcome::Refused(Refusal::Standby),
            ..
        }
    )));
}

#[test]
fn the_session_asks_for_the_guard() {
    let mut h = H::new(opts());
    h.run("a");
    let m = Machine::new(
        Options {
            server_guard: false,
            ..opts()
        },
        1,
    )
    .unwrap();
    assert_eq!(opts().guard_timeout(), ms(900));
    let _ = m;
    // The first OpenSession carried idle_session_timeout=900.
    let mut h2 = H::new(opts());
    h2.m.run(h2.t, LeaseId::named("a").unwrap()).unwrap();
    let mut found = false;
    while let Some(o) = h2.m.poll_session() {
        if let SessionCommand::Open { params, .. } = o {
            assert_eq!(
                params.options_string(),
                "-c synchronous_commit=on -c idle_session_timeout=900"
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
/// the time (the keys it asked about), arbitrary otherwise.
fn feed(
    m: &mut Machine,
    obs: &mut Observer,
    t: &mut Instant,
    last: &mut (Option<SessionId>, Option<QueryId>),
    s: Step,
) -> Result<(), String> {
    let near = |id: Option<u64>, d: i8| id.map(|i| i.wrapping_add_signed(i64::from(d)));
    let input = match s {
        Step::Run(i) => {
            if let Ok(r) = m.run(*t, LeaseId::named(format!("k{i}")).unwrap()) {
                obs.run_started(r);
            }
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
        Step::Opened(d) => near(last.0.map(|s| s.0), d).map(|s| Input::SessionOpened {
            session: SessionId(s),
        }),
        Step::Lost(d, e) => near(last.0.map(|s| s.0), d).map(|s| Input::SessionLost {
            session: SessionId(s),
            error: e.then(|| DbError::other("x")),
        }),
        Step::Reply(d, rows) => near(last.1.map(|q| q.0), d).map(|q| Input::Reply {
            query: QueryId(q),
            result: Ok(rows),
        }),
        Step::Error(d) => near(last.1.map(|q| q.0), d).map(|q| Input::Reply {
            query: QueryId(q),
            result: Err(DbError::other("x")),
        }),
        Step::Notify(i) => Some(Input::Notification {
            channel: HANDOVER_CHANNEL.into(),
            payload: key(&format!("k{i}")).to_string(),
        }),
        Step::Advance(n) => {
            *t += ms(u64::from(n));
            Some(Input::Tick)
        }
    };
    if let Some(i) = input {
        obs.input(&i);
        m.handle_input(*t, i);
    }
    let (commands, _) = drain(m, obs)?;
    for c in commands {
        match c {
            Command::OpenSession { session, .. } => last.0 = Some(session),
            Command::Query { query, .. } => last.1 = Some(query),
            _ => {}
        }
    }
    if let Some(d) = m.poll_timeout() {
        // A deadline in the past would make a driver spin.
        if d < *t {
            return Err(format!("poll_timeout {:?} in the past", *t - d));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever arrives, in whatever order: no panic, and every rule the
    /// observer checks holds.
    #[test]
    fn arbitrary_inputs_keep_every_rule(steps in proptest::collection::vec(step(), 0..120)) {
        let mut m = Machine::new(opts(), 3).unwrap();
        let mut obs = Observer::new();
        let mut t = Instant::now();
        let mut last = (None, None);
        for (i, s) in steps.into_iter().enumerate() {
            let d = format!("{s:?}");
            if let Err(e) = feed(&mut m, &mut obs, &mut t, &mut last, s) {
                prop_assert!(false, "step {i} ({d}): {e}");
            }
        }
    }
}
