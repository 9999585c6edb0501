//! A hand-driven machine for tests: one [`Machine`], an [`Observer`] that
//! checks every step, and a manual clock.

use std::time::{Duration, Instant};

use super::server::reply;
use super::{drain, Command, Observer, ObserverViolation};
use crate::{
    reply::Row, Deadline, Event, Input, LeaseId, Machine, Options, OptionsError, QueryId, RunId,
    RunRejected, SessionError, SessionId, Statement,
};

/// One [`Machine`] driven by hand, as a test (or a fuzz target) drives it:
/// every input goes through an [`Observer`] first, every step is drained by
/// the drain rule and checked, and [`Machine::poll_timeout`] is checked
/// against the clock after every step. The clock is manual: it moves only by
/// [`advance`](Harness::advance) or [`set_now`](Harness::set_now).
///
/// Each step returns its commands as flat [`Command`]s. The fallible core is
/// [`step`](Harness::step) and [`start`](Harness::start); the other helpers
/// are test assertions that panic, with the broken rule, when the observer
/// objects or the step they answer is not there.
///
/// ```
/// use lease_proto::sim::{Command, Harness};
/// use lease_proto::{LeaseId, Options, Outcome};
///
/// let mut h = Harness::new(Options::default(), 1)?;
/// let run = h.run(LeaseId::named("nightly-report")?);
/// h.connect(7); // open the session, answer setup and LISTEN from backend 7
/// let cmds = h.win(900); // the try in flight wins, with fencing token 900
/// assert!(cmds.iter().any(|c| matches!(c, Command::StartJob { token: 900, .. })));
/// assert!(h.machine().is_valid(run, h.now()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Harness {
    machine: Machine,
    observer: Observer,
    now: Instant,
    session: Option<SessionId>,
    in_flight: Option<(QueryId, Statement)>,
    last_query: Option<(QueryId, Statement)>,
    events: Vec<Event>,
    /// The nonce of the last setup answered by [`Harness::connect`].
    nonce: Option<i64>,
    /// The query in flight is a [`Command::Probe`] (on a second connection).
    probing: bool,
}

impl Harness {
    /// A fresh machine with these options and jitter seed, its clock at
    /// `Instant::now()`.
    ///
    /// # Errors
    /// The options are invalid.
    pub fn new(options: Options, seed: u64) -> Result<Harness, OptionsError> {
        Harness::with_machine(Machine::new(options, seed)?)
    }

    /// As [`Harness::new`], with a deliberate bug planted in the machine
    /// (a broken-variant test).
    ///
    /// # Errors
    /// The options are invalid.
    #[doc(hidden)]
    pub fn with_mutation(
        options: Options,
        seed: u64,
        mutation: Option<super::Mutation>,
    ) -> Result<Harness, OptionsError> {
        let knobs = crate::machine::Knobs {
            mutation,
            ..Default::default()
        };
        Harness::with_machine(Machine::with_knobs(options, seed, knobs)?)
    }

    fn with_machine(machine: Machine) -> Result<Harness, OptionsError> {
        Ok(Harness {
            machine,
            observer: Observer::new(),
            nonce: None,
            probing: false,
            now: Instant::now(),
            session: None,
            in_flight: None,
            last_query: None,
            events: Vec::new(),
        })
    }

    /// The machine.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The machine, to drive it past the harness (what it does then is not
    /// checked).
    pub fn machine_mut(&mut self) -> &mut Machine {
        &mut self.machine
    }

    /// The observer.
    pub fn observer(&self) -> &Observer {
        &self.observer
    }

    /// The instant the next input is fed at.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Sets the instant the next input is fed at (an older one than before
    /// is allowed: a driver may hand in a `now` taken earlier).
    pub fn set_now(&mut self, now: Instant) {
        self.now = now;
    }

    /// The last session the machine asked to open.
    pub fn session(&self) -> Option<SessionId> {
        self.session
    }

    /// The query in flight: sent, on the session still open, not yet answered.
    pub fn in_flight(&self) -> Option<&(QueryId, Statement)> {
        self.in_flight.as_ref()
    }

    /// The last query sent, answered or not.
    pub fn last_query(&self) -> Option<&(QueryId, Statement)> {
        self.last_query.as_ref()
    }

    /// The events of the last step.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// [`Machine::run`] now; an accepted run is recorded with the observer.
    /// Nothing is drained: the next step does.
    ///
    /// # Errors
    /// The machine refused the run.
    pub fn start(&mut self, lease: LeaseId) -> Result<RunId, RunRejected> {
        let run = self.machine.run(self.now, lease)?;
        self.observer.run_started(run);
        Ok(run)
    }

    /// One step: feeds `input` (if any) through the observer to the machine
    /// now, drains every command by the drain rule through the observer, and
    /// checks the next deadline is not in the past. Returns the commands.
    ///
    /// # Errors
    /// The first rule the observer saw broken.
    pub fn step(&mut self, input: Option<Input>) -> Result<Vec<Command>, ObserverViolation> {
        if let Some(input) = input {
            self.observer.input(&input);
            match &input {
                Input::Reply { query, .. }
                    if self.in_flight.as_ref().is_some_and(|(q, _)| q == query) =>
                {
                    self.in_flight = None;
                }
                Input::SessionEnded { session, .. } if self.session == Some(*session) => {
                    self.in_flight = None;
                }
                _ => {}
            }
            self.machine.handle_input(self.now, input);
        }
        let (commands, events) = drain(&mut self.machine, &mut self.observer)?;
        self.events = events;
        for c in &commands {
            match c {
                Command::OpenSession { session, .. } => {
                    self.session = Some(*session);
                    self.in_flight = None;
                }
                Command::CloseSession { session } if self.session == Some(*session) => {
                    self.in_flight = None;
                }
                Command::Query { query, statement } => {
                    self.in_flight = Some((*query, statement.clone()));
                    self.last_query = self.in_flight.clone();
                    self.probing = false;
                }
                Command::Probe { query, statement } => {
                    self.in_flight = Some((*query, statement.clone()));
                    self.last_query = self.in_flight.clone();
                    self.probing = true;
                }
                _ => {}
            }
        }
        self.observer
            .check_timeout(self.now, self.machine.poll_timeout())?;
        Ok(commands)
    }

    fn checked(&mut self, input: Option<Input>) -> Vec<Command> {
        self.step(input).unwrap_or_else(|v| panic!("observer: {v}"))
    }

    /// Starts a run and drains.
    ///
    /// # Panics
    /// The machine refused the run, or the observer objects.
    pub fn run(&mut self, lease: LeaseId) -> RunId {
        let run = self
            .start(lease)
            .unwrap_or_else(|e| panic!("run refused: {e}"));
        self.checked(None);
        run
    }

    /// Feeds one input now and drains.
    ///
    /// # Panics
    /// The observer objects.
    pub fn input(&mut self, input: Input) -> Vec<Command> {
        self.checked(Some(input))
    }

    /// Drains without an input.
    ///
    /// # Panics
    /// The observer objects.
    pub fn drain(&mut self) -> Vec<Command> {
        self.checked(None)
    }

    /// Moves the clock forward by `d` and ticks.
    ///
    /// # Panics
    /// The observer objects.
    pub fn advance(&mut self, d: Duration) -> Vec<Command> {
        self.now += d;
        self.input(Input::Tick)
    }

    /// Whether the query in flight is a [`Command::Probe`] (a statement on a
    /// second connection).
    pub fn probing(&self) -> bool {
        self.in_flight.is_some() && self.probing
    }

    /// The statement in flight.
    ///
    /// # Panics
    /// No query is in flight.
    pub fn statement(&self) -> Statement {
        match &self.in_flight {
            Some((_, s)) => s.clone(),
            None => panic!("no query in flight"),
        }
    }

    fn answer(&mut self, result: Result<Vec<Row>, SessionError>) -> Vec<Command> {
        let Some((query, _)) = self.in_flight.take() else {
            panic!("no query in flight")
        };
        self.input(Input::Reply { query, result })
    }

    /// Answers the query in flight with these rows.
    ///
    /// # Panics
    /// No query is in flight, or the observer objects.
    pub fn reply(&mut self, rows: Vec<Row>) -> Vec<Command> {
        self.answer(Ok(rows))
    }

    /// Fails the query in flight with this error.
    ///
    /// # Panics
    /// No query is in flight, or the observer objects.
    pub fn fail(&mut self, error: SessionError) -> Vec<Command> {
        self.answer(Err(error))
    }

    /// Opens the session asked for and answers its setup only (PostgreSQL 15,
    /// a primary, backend `pid`, the guard the session asked for): next in
    /// flight is the pooler probe ([`Harness::probing`]) or LISTEN. Returns
    /// the nonce the setup set.
    ///
    /// # Panics
    /// No session was asked for, the statement is not the setup, or the
    /// observer objects.
    pub fn setup(&mut self, pid: i64) -> i64 {
        let Some(session) = self.session else {
            panic!("no session asked for")
        };
        self.input(Input::SessionOpened { session });
        let Statement::Setup { nonce, .. } = self.statement() else {
            panic!("expected the setup, got {:?}", self.statement())
        };
        self.nonce = Some(nonce);
        let opts = self.machine.options();
        let ist = opts.guard_timeout().as_millis() as i64;
        let tcp = opts.tcp_settings().map(|(_, v)| Some(v));
        // Not promoted, no server clock.
        let promotion = Default::default();
        self.reply(reply::setup(
            150_000,
            false,
            pid,
            ist,
            tcp,
            Some(nonce),
            promotion,
            None,
        ));
        nonce
    }

    /// Opens the session asked for and answers setup (PostgreSQL 15, a
    /// primary, backend `pid`, the guard the session asked for), the pooler
    /// probe if one follows (a backend of its own: `pid + 1`, no nonce) and
    /// LISTEN. Returns the commands after LISTEN's reply.
    ///
    /// # Panics
    /// No session was asked for, the statements are not setup then LISTEN, or
    /// the observer objects.
    pub fn connect(&mut self, pid: i64) -> Vec<Command> {
        self.setup(pid);
        if self.probing {
            // Behind a pooler that rejected the startup options: the second
            // connection gets a backend of its own.
            self.reply(reply::heartbeat(pid + 1, None));
        }
        assert_eq!(self.statement(), Statement::Listen);
        self.reply(vec![])
    }

    /// The nonce the last setup answered by [`Harness::connect`] set
    /// (answer heartbeats built by hand with it).
    pub fn nonce(&self) -> Option<i64> {
        self.nonce
    }

    /// The first row of a try's reply: the session [`Harness::connect`] set
    /// up (build try replies by hand starting with it).
    pub fn try_session_row(&self) -> Vec<Row> {
        match self.statement() {
            Statement::TryLock {
                backend_pid, nonce, ..
            } => vec![reply::try_session(backend_pid, Some(nonce))],
            s => panic!("expected a try, got {s:?}"),
        }
    }

    /// The keys of the try in flight.
    ///
    /// # Panics
    /// The query in flight is not a try.
    pub fn try_keys(&self) -> Vec<i64> {
        match self.statement() {
            Statement::TryLock { keys, .. } => keys,
            s => panic!("expected a try, got {s:?}"),
        }
    }

    /// Answers the try in flight: every key won, with fencing token `token`.
    /// A win the machine holds back for [`Options::lock_delay`] (no graceful
    /// release came) is waited out: the clock moves to the delay's end, and
    /// the commands of both steps are returned. [`Harness::win_held`] stops
    /// before.
    ///
    /// # Panics
    /// The query in flight is not a try, or the observer objects.
    pub fn win(&mut self, token: i64) -> Vec<Command> {
        let mut cmds = self.win_held(token);
        if self.machine.timeout_reason() == Some(Deadline::LockDelay) {
            let at = self.machine.poll_timeout().expect("the lock delay's end");
            cmds.extend(self.advance(at.saturating_duration_since(self.now)));
        }
        cmds
    }

    /// Answers the try in flight: every key won, with fencing token `token`,
    /// and no more: a win held back for the lock delay stays held.
    ///
    /// # Panics
    /// The query in flight is not a try, or the observer objects.
    pub fn win_held(&mut self, token: i64) -> Vec<Command> {
        let mut rows = self.try_session_row();
        rows.extend(
            self.try_keys()
                .into_iter()
                .map(|k| reply::try_won(k, token)),
        );
        self.reply(rows)
    }

    /// Answers the try in flight: every key held by backend `holder`.
    ///
    /// # Panics
    /// The query in flight is not a try, or the observer objects.
    pub fn lose(&mut self, holder: Option<i64>) -> Vec<Command> {
        let mut rows = self.try_session_row();
        rows.extend(
            self.try_keys()
                .into_iter()
                .map(|k| reply::try_held(k, holder)),
        );
        self.reply(rows)
    }

    /// Answers the heartbeat or verify in flight: backend `pid`, holding
    /// `keys` (which only a verify's reply lists).
    ///
    /// # Panics
    /// The query in flight is neither, or the observer objects.
    pub fn heartbeat(&mut self, pid: i64, keys: &[i64]) -> Vec<Command> {
        let nonce = self.nonce;
        match self.statement() {
            Statement::Heartbeat => self.reply(reply::heartbeat(pid, nonce)),
            Statement::Verify => self.reply(reply::verify(pid, nonce, keys.iter().copied())),
            Statement::CheckHandover { .. } => self.check_answered(pid, &[]),
            other => panic!("expected a heartbeat or verify, got {other:?}"),
        }
    }

    /// Answers the hand-over check in flight ([`Statement::CheckHandover`]):
    /// backend `pid`; the asks of `waiting` (1-based, in the order asked) are
    /// confirmed, each with the backend found waiting.
    ///
    /// # Panics
    /// The query in flight is not a check, or the observer objects.
    pub fn check_answered(&mut self, pid: i64, waiting: &[(i64, i64)]) -> Vec<Command> {
        let Statement::CheckHandover { .. } = self.statement() else {
            panic!("expected a hand-over check, got {:?}", self.statement());
        };
        let rows = crate::reply::CheckReply {
            session: crate::reply::HeartbeatReply {
                backend_pid: Some(pid),
                nonce: self.nonce,
                server_clock_us: None,
            },
            waiting: waiting.iter().copied().collect(),
        }
        .to_rows();
        self.reply(rows)
    }

    /// Answers the take in flight (a standby's wait that takes its key,
    /// [`Statement::Take`]): the key was freed and taken, with fencing token
    /// `token`. As [`Harness::win`], a win held back for the lock delay is
    /// waited out.
    ///
    /// # Panics
    /// The query in flight is not a take, or the observer objects.
    pub fn taken(&mut self, token: i64) -> Vec<Command> {
        let mut cmds = self.taken_held(token);
        if self.machine.timeout_reason() == Some(Deadline::LockDelay) {
            let at = self.machine.poll_timeout().expect("the lock delay's end");
            cmds.extend(self.advance(at.saturating_duration_since(self.now)));
        }
        cmds
    }

    /// Answers the wait in flight as the statement does at its lock
    /// timeout: the key stayed held (session rows of backend `pid`).
    ///
    /// # Panics
    /// The query in flight is not a wait, or the observer objects.
    pub fn held_all_along(&mut self, pid: i64) -> Vec<Command> {
        let (Statement::Wait { .. } | Statement::Take { .. }) = self.statement() else {
            panic!("expected a wait, got {:?}", self.statement())
        };
        let nonce = self.nonce;
        self.reply(reply::wait(pid, nonce, false, Some(1000)))
    }

    /// Answers the take in flight: the key was freed and taken, with fencing
    /// token `token`, and no more: a win held back for the lock delay stays
    /// held ([`Harness::taken`] waits it out).
    ///
    /// # Panics
    /// The query in flight is not a take, or the observer objects.
    pub fn taken_held(&mut self, token: i64) -> Vec<Command> {
        let Statement::Take { backend_pid, .. } = self.statement() else {
            panic!("expected a take, got {:?}", self.statement())
        };
        let nonce = self.nonce;
        self.reply(reply::taken(backend_pid, nonce, token, Some(1000)))
    }

    /// Answers the release in flight: every key was held and is unlocked.
    ///
    /// # Panics
    /// The query in flight is not a release, or the observer objects.
    pub fn released(&mut self) -> Vec<Command> {
        let Statement::Release { keys, .. } = self.statement() else {
            panic!("expected a release, got {:?}", self.statement())
        };
        let rows = keys.into_iter().map(|k| reply::release(k, true)).collect();
        self.reply(rows)
    }
}
