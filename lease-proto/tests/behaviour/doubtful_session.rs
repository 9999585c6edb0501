//! The doubtful session (machine/doubtful.rs), driven by hand: when the machine gives up on
//! its session itself (a statement that does not answer, a failed or malformed reply,
//! validity expiry), it keeps the session, and so its locks, until every cancelled job on
//! it has returned, or until the latest moment the server could free the key anyway (the
//! guard: send time of the last statement + `idle_session_timeout`); meanwhile it sends
//! nothing on it and no run acquires on it.

use crate::common::*;
use lease_proto::limits::*;
use lease_proto::reply::*;
use lease_proto::sim::Command;
use lease_proto::*;
use std::time::Duration;
use std::time::Instant;

/// A cancelled job that never returns keeps the session no longer than the
/// guard deadline, when the server could free the key anyway.
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

/// While a doubtful session is kept, no run acquires on it and no new
/// session opens; the standby gets a new session once the cancelled job has
/// returned and the doubtful one is closed.
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

/// Milliseconds of `t` after `t0`, for messages.
fn at(t0: Instant, t: Instant) -> u128 {
    t.saturating_duration_since(t0).as_millis()
}

/// The machine driven by hand, recording the commands it emits.
struct H {
    m: Machine,
    /// When the run started; every time in a message is relative to it.
    t0: Instant,
    t: Instant,
    session: Option<SessionId>,
    /// The statement in flight and its send time.
    query: Option<(QueryId, Statement, Instant)>,
    /// Send time of the last statement the machine sent.
    last_sent: Option<Instant>,
    /// Every command so far, with the time it was emitted.
    log: Vec<(Instant, Command)>,
}

impl H {
    fn new(o: Options) -> H {
        let t = Instant::now();
        H {
            m: Machine::new(o, 1).expect("valid options"),
            t0: t,
            t,
            session: None,
            query: None,
            last_sent: None,
            log: Vec::new(),
        }
    }

    fn drain(&mut self) -> Vec<Command> {
        let mut v = Vec::new();
        let mut all: Vec<Command> = Vec::new();
        while let Some(o) = self.m.poll_output() {
            match o {
                Output::Run(c) => all.push(c.into()),
                Output::Session(c) => all.push(c.into()),
                Output::Event(_) => {}
            }
        }
        for c in all {
            {
                match &c {
                    Command::OpenSession { session, .. } => self.session = Some(*session),
                    Command::Query { query, statement } => {
                        self.query = Some((*query, statement.clone(), self.t));
                        self.last_sent = Some(self.t);
                    }
                    _ => {}
                }
                self.log.push((self.t, c.clone()));
                v.push(c);
            }
        }
        v
    }

    fn input(&mut self, i: Input) -> Vec<Command> {
        self.m.handle_input(self.t, i);
        self.drain()
    }

    fn statement(&self) -> Statement {
        self.query.as_ref().expect("a query in flight").1.clone()
    }

    fn reply(&mut self, result: Result<Vec<Row>, SessionError>) -> Vec<Command> {
        let (query, _, _) = self.query.take().expect("a query in flight");
        self.input(Input::Reply { query, result })
    }

    /// Starts a run, connects, passes setup and LISTEN, and wins the key with
    /// `token`, all at `t0`. Returns the run, which now leads.
    fn lead(&mut self, name: &str, token: i64) -> RunId {
        let run = self
            .m
            .run(self.t, LeaseId::named(name).expect("a valid name"))
            .expect("the run is accepted");
        self.drain();
        let s = self.session.expect("asked to open a session");
        self.input(Input::SessionOpened { session: s });
        let Statement::Setup { nonce, .. } = self.statement() else {
            panic!("expected the setup, got {:?}", self.statement())
        };
        let ist = self.m.options().guard_timeout().as_millis() as i64;
        self.reply(Ok(SetupReply {
            server_version: 150_000,
            in_recovery: false,
            backend_pid: 7,
            idle_session_timeout_ms: Some(ist),
            tcp_settings: self.m.options().tcp_settings().map(|(_, v)| Some(v)),
            unix_socket: false,
            search_path_catalog: true,
            nonce: Some(nonce),
            promotion: Default::default(),
            server_clock_us: None,
        }
        .to_rows()));
        assert_eq!(self.statement(), Statement::Listen);
        self.reply(Ok(vec![]));
        let Statement::TryLock {
            keys,
            backend_pid,
            nonce,
        } = self.statement()
        else {
            panic!("expected a try, got {:?}", self.statement())
        };
        let session = vec![None, Some(backend_pid), Some(nonce)];
        let wins = keys.iter().map(|k| vec![Some(*k), Some(token), None]);
        let mut cmds = self.reply(Ok([session].into_iter().chain(wins).collect()));
        // The win is held back for the lock delay (no graceful release came).
        self.t += self.m.options().lock_delay;
        cmds.extend(self.input(Input::Tick));
        assert!(
            cmds.iter()
                .any(|c| matches!(c, Command::StartJob { run: r, .. } if *r == run)),
            "the run did not lead: {cmds:?}"
        );
        run
    }

    /// Moves time forward to `until` in steps of `step`, feeding ticks and
    /// answering nothing.
    fn tick_until(&mut self, until: Instant, step: Duration) {
        while self.t < until {
            self.t = (self.t + step).min(until);
            self.input(Input::Tick);
        }
    }

    fn first_close(&self) -> Option<Instant> {
        self.log
            .iter()
            .find(|(_, c)| matches!(c, Command::CloseSession { .. }))
            .map(|(t, _)| *t)
    }

    fn cancel(&self, run: RunId) -> Option<(Instant, Reason)> {
        self.log.iter().find_map(|(t, c)| match c {
            Command::CancelJob { run: r, reason } if *r == run => Some((*t, reason.clone())),
            _ => None,
        })
    }
}

/// After the machine has given up on its session (`how`), time runs on with
/// the cancelled job still running. No `CloseSession` may come before the
/// guard deadline: the send time of the last statement plus the
/// `idle_session_timeout` the session was opened with. Then the job exits.
fn assert_session_kept_until_the_job_exits(h: &mut H, run: RunId, how: &str) {
    let (cancelled_at, reason) = h
        .cancel(run)
        .unwrap_or_else(|| panic!("{how}: the job was never cancelled: {:?}", h.log));
    let last_sent = h.last_sent.expect("a statement was sent");
    let guard = h.m.options().guard_timeout();
    let deadline = last_sent + guard;
    // The job ignores the cancellation until well past the deadline.
    h.tick_until(deadline + ms(300), ms(10));
    let close = h.first_close();
    let t0 = h.t0;
    if let Some(close) = close {
        assert!(
            close >= deadline,
            "{how}: CloseSession emitted at +{} ms while the cancelled job (cancelled at +{} ms: \
             {reason}) still runs; the last statement was sent at +{} ms, so the server could \
             free the key no earlier than +{} ms (last send + idle_session_timeout {} ms): the \
             session was closed {} ms too early",
            at(t0, close),
            at(t0, cancelled_at),
            at(t0, last_sent),
            at(t0, deadline),
            guard.as_millis(),
            deadline.saturating_duration_since(close).as_millis(),
        );
    }
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
}

/// Heartbeat 200 ms, margin 200 ms; query timeout and validity per case.
fn timing(query_timeout: u64, validity: Option<u64>) -> Options {
    let mut o = Options::default();
    o.retry_interval = ms(200);
    o.heartbeat_interval = ms(200);
    o.query_timeout = ms(query_timeout);
    o.validity = validity.map(ms);
    o.guard_margin = ms(200);
    o
}

/// The heartbeat is sent at +200 ms and never answered; it times out at
/// +500 ms (validity 1 s, so the timeout comes first). The guard is 1.2 s:
/// the server could free the key from +1400 ms on.
#[test]
fn query_timeout_keeps_the_session_until_the_job_exits() {
    let mut h = H::new(timing(300, Some(1_000)));
    let run = h.lead("a", 900);
    h.tick_until(h.t0 + ms(200), ms(10));
    assert_eq!(h.statement(), Statement::Heartbeat);
    h.tick_until(h.t0 + ms(510), ms(10));
    assert!(
        matches!(h.cancel(run), Some((_, Reason::QueryTimeout))),
        "expected a query-timeout cancellation: {:?}",
        h.log
    );
    assert_session_kept_until_the_job_exits(&mut h, run, "query timeout");
}

/// The heartbeat sent at +200 ms fails at +210 ms. Guard 900 ms: +1100 ms.
#[test]
fn failed_heartbeat_keeps_the_session_until_the_job_exits() {
    let mut h = H::new(timing(500, None));
    let run = h.lead("a", 900);
    h.tick_until(h.t0 + ms(200), ms(10));
    assert_eq!(h.statement(), Statement::Heartbeat);
    h.t += ms(10);
    h.reply(Err(SessionError {
        code: Some("XX000".into()),
        message: "internal error".into(),
        config: false,
    }));
    assert!(
        matches!(h.cancel(run), Some((_, Reason::QueryFailed(_)))),
        "expected a query-failed cancellation: {:?}",
        h.log
    );
    assert_session_kept_until_the_job_exits(&mut h, run, "failed heartbeat");
}

/// The heartbeat sent at +200 ms gets a malformed row at +210 ms.
#[test]
fn malformed_heartbeat_keeps_the_session_until_the_job_exits() {
    let mut h = H::new(timing(500, None));
    let run = h.lead("a", 900);
    h.tick_until(h.t0 + ms(200), ms(10));
    assert_eq!(h.statement(), Statement::Heartbeat);
    h.t += ms(10);
    h.reply(Ok(vec![
        vec![Some(0), Some(7)],
        vec![Some(5), None, Some(1)],
    ]));
    assert!(
        matches!(h.cancel(run), Some((_, Reason::QueryFailed(_)))),
        "expected a query-failed cancellation: {:?}",
        h.log
    );
    assert_session_kept_until_the_job_exits(&mut h, run, "malformed heartbeat reply");
}

/// Validity 500 ms, query timeout 1 s: the heartbeat sent at +200 ms is still
/// in flight when the validity ends at +500 ms. Guard 700 ms: +900 ms.
#[test]
fn validity_expiry_keeps_the_session_until_the_job_exits() {
    let mut h = H::new(timing(1_000, Some(500)));
    let run = h.lead("a", 900);
    h.tick_until(h.t0 + ms(200), ms(10));
    assert_eq!(h.statement(), Statement::Heartbeat);
    h.tick_until(h.t0 + ms(510), ms(10));
    assert!(
        matches!(h.cancel(run), Some((_, Reason::ValidityExpired))),
        "expected a validity-expiry cancellation: {:?}",
        h.log
    );
    assert_session_kept_until_the_job_exits(&mut h, run, "validity expiry");
}
