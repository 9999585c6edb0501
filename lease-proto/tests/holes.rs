//! Issue 11, reproduced first: machine-level tests of holes 3 and 4 that fail
//! on the code they were written against (marked `#[ignore]` until fixed; run
//! them with `cargo test -p lease-proto --test holes -- --include-ignored`).
//! The hole 3 tests pass since the doubtful-session rule (machine/doubtful.rs).
//!
//! Hole 3: when the machine gives up on its session itself (a statement that
//! does not answer, a failed or malformed reply, validity expiry), it must
//! keep the session, and so its locks, until every cancelled job on it has
//! returned, or until the latest moment the server could free the key anyway
//! (the guard: send time of the last statement + `idle_session_timeout`).
//!
//! Hole 4: absurd timing options must be refused by [`Options::validate`].

use std::time::{Duration, Instant};

use lease_proto::reply::*;
use lease_proto::sim::Command;
use lease_proto::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
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
        while let Some(c) = self.m.poll_run() {
            all.push(c.into());
        }
        while let Some(c) = self.m.poll_session() {
            all.push(c.into());
        }
        while self.m.poll_event().is_some() {}
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
        let cmds = self.reply(Ok([session].into_iter().chain(wins).collect()));
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
fn opts(query_timeout: u64, validity: Option<u64>) -> Options {
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
fn hole3_query_timeout_keeps_the_session_until_the_job_exits() {
    let mut h = H::new(opts(300, Some(1_000)));
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
fn hole3_failed_heartbeat_keeps_the_session_until_the_job_exits() {
    let mut h = H::new(opts(500, None));
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
fn hole3_malformed_heartbeat_keeps_the_session_until_the_job_exits() {
    let mut h = H::new(opts(500, None));
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
fn hole3_validity_expiry_keeps_the_session_until_the_job_exits() {
    let mut h = H::new(opts(1_000, Some(500)));
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

/// Absurd timing options are refused. The rule chosen here:
///
/// - `query_timeout >= 10 ms`: the query timeout also bounds connecting plus
///   the setup statement, which no loaded host reliably does faster; below it
///   a runner times out forever and never leads;
/// - `heartbeat_interval <= 100 * query_timeout`: a query timeout that small
///   against the heartbeat is a unit mistake (`1h` / `1ms`), not a tuning.
///
/// Options at the boundary (10 ms, and exactly 100 x) stay valid.
#[test]
fn hole4_absurd_timing_options_are_refused() {
    let o = |heartbeat: Duration, query_timeout: Duration| {
        let mut o = Options::default();
        o.heartbeat_interval = heartbeat;
        o.query_timeout = query_timeout;
        o
    };
    let hour = Duration::from_secs(3_600);
    let s = Duration::from_secs;
    let bad = [
        ("heartbeat 1h, query timeout 1ms", o(hour, ms(1))),
        ("heartbeat 50ms, query timeout 5ms", o(ms(50), ms(5))),
        ("heartbeat 200s, query timeout 1s (200x)", o(s(200), s(1))),
    ];
    let good = [
        ("defaults", Options::default()),
        ("heartbeat 1s, query timeout 10ms (100x)", o(s(1), ms(10))),
        ("heartbeat 100ms, query timeout 1s", o(ms(100), s(1))),
    ];
    for (what, opts) in &good {
        assert_eq!(opts.validate(), Ok(()), "{what} must stay valid");
    }
    let accepted: Vec<&str> = bad
        .iter()
        .filter(|(_, opts)| opts.validate().is_ok())
        .map(|(what, _)| *what)
        .collect();
    assert!(
        accepted.is_empty(),
        "Options::validate accepted absurd settings: {accepted:?}"
    );
}
