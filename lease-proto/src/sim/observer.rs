//! The rules every driver relies on, as a checker: [`Observer`], its
//! [`ObserverViolation`]s, and [`drain`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use crate::{
    Event, Input, JobExit, LeaseId, Machine, Outcome, Output, QueryId, RunCommand, RunId,
    SessionCommand, SessionId, Statement,
};

/// A driver rule the observed machine broke.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObserverViolation {
    /// A query was sent with no session open.
    QueryWithoutSession {
        /// The query.
        query: QueryId,
    },
    /// A query was sent while another was in flight on the session.
    QueryInFlight {
        /// The query sent.
        query: QueryId,
        /// The query still in flight.
        in_flight: QueryId,
    },
    /// A try of a key whose job runs: the re-entrant lock would stack.
    ReentrantTry {
        /// The advisory key.
        key: i64,
    },
    /// An unlock of a key whose job runs.
    ReleaseWhileJobRuns {
        /// The advisory key.
        key: i64,
    },
    /// A job started for a run whose job already runs.
    JobStartedTwice {
        /// The run.
        run: RunId,
    },
    /// A job started for a run the driver reported dropped
    /// (`JobExited { exit: Abandoned }`): nobody would run it, so its key
    /// would be held for nothing.
    AbandonedRunStarted {
        /// The run.
        run: RunId,
    },
    /// A job started with no session open.
    JobWithoutSession {
        /// The run.
        run: RunId,
    },
    /// A cancel of a run whose job does not run.
    CancelWithoutJob {
        /// The run.
        run: RunId,
    },
    /// A run finished twice.
    FinishedTwice {
        /// The run.
        run: RunId,
    },
    /// A run finished while its job runs.
    FinishedWhileJobRuns {
        /// The run.
        run: RunId,
    },
    /// A run the machine never accepted finished.
    UnknownRunFinished {
        /// The run.
        run: RunId,
    },
    /// [`Machine::poll_timeout`] returned a deadline before the latest `now`.
    DeadlineInPast {
        /// How far before.
        by: Duration,
    },
    /// A statement other than a [`Statement::Wait`] on the watch session,
    /// or a watch session opened without the session: the watch session
    /// never acquires (nor unlocks).
    WatchNotAWait {
        /// The query, if the breach was a statement.
        query: Option<QueryId>,
    },
}

impl fmt::Display for ObserverViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObserverViolation::QueryWithoutSession { query } => {
                write!(f, "query {query:?} without a session")
            }
            ObserverViolation::QueryInFlight { query, in_flight } => {
                write!(f, "query {query:?} sent while {in_flight:?} is in flight")
            }
            ObserverViolation::ReentrantTry { key } => {
                write!(f, "try of key {key} whose job runs: re-entrant lock")
            }
            ObserverViolation::ReleaseWhileJobRuns { key } => {
                write!(f, "unlock of key {key} while its job runs")
            }
            ObserverViolation::JobStartedTwice { run } => {
                write!(f, "job of {run:?} started twice")
            }
            ObserverViolation::AbandonedRunStarted { run } => {
                write!(f, "job of {run:?} started after the run was dropped")
            }
            ObserverViolation::JobWithoutSession { run } => {
                write!(f, "job of {run:?} started without a session")
            }
            ObserverViolation::CancelWithoutJob { run } => {
                write!(f, "cancel of {run:?} whose job does not run")
            }
            ObserverViolation::FinishedTwice { run } => write!(f, "{run:?} finished twice"),
            ObserverViolation::FinishedWhileJobRuns { run } => {
                write!(f, "{run:?} finished while its job runs")
            }
            ObserverViolation::UnknownRunFinished { run } => {
                write!(f, "unknown {run:?} finished")
            }
            ObserverViolation::DeadlineInPast { by } => {
                write!(f, "poll_timeout {by:?} in the past")
            }
            ObserverViolation::WatchNotAWait { query: Some(query) } => {
                write!(f, "query {query:?} on the watch session is not a wait")
            }
            ObserverViolation::WatchNotAWait { query: None } => {
                f.write_str("a watch session opened without the session")
            }
        }
    }
}

impl std::error::Error for ObserverViolation {}

/// The rules every driver relies on, as a checker any driver author can use.
///
/// An observer watches one [`Machine`]'s inputs and commands and returns
/// an [`ObserverViolation`] when a rule breaks, whatever the inputs:
///
/// - at most one statement in flight per session, and none without a session;
/// - the watch session opens only beside the session, and carries nothing but
///   [`Statement::Wait`]s (it never acquires);
/// - no try of a key whose job runs (advisory locks are re-entrant: a second
///   grant would stack);
/// - no unlock of a key whose job runs;
/// - a job started only on a session, only when none runs for its run, and
///   never for a run the driver reported dropped (`JobExit::Abandoned`);
/// - a cancel only for a running job;
/// - every run finished at most once, never while its job runs, and only runs
///   the machine accepted;
/// - [`Machine::poll_timeout`] never before the latest `now` handed in (a
///   driver would spin).
///
/// Feed it every input before the machine gets it, every accepted run, and
/// every command in the order the drain rule polls them (run commands, then
/// session commands). [`drain`] does the polling and checking in one call;
/// [`Harness`](super::Harness) adds a manual clock and reply helpers on top.
///
/// ```
/// use std::time::{Duration, Instant};
/// use lease_proto::sim::{drain, Command, Observer};
/// use lease_proto::{Input, LeaseId, Machine, Options};
///
/// let mut machine = Machine::new(Options::default(), 1)?;
/// let mut observer = Observer::new();
/// let now = Instant::now();
/// let run = machine.run(now, LeaseId::named("nightly-report")?)?;
/// observer.run_started(run);
/// let (commands, _events) = drain(&mut machine, &mut observer)?;
/// let Some(Command::OpenSession { session, .. }) = commands.first().cloned() else {
///     panic!("{commands:?}")
/// };
/// // The driver connected: feed the input through the observer first.
/// let opened = Input::SessionOpened { session };
/// observer.input(&opened);
/// machine.handle_input(now + Duration::from_millis(3), opened);
/// let (commands, _) = drain(&mut machine, &mut observer)?;
/// assert!(matches!(commands[0], Command::Query { .. }));
/// observer.check_timeout(now + Duration::from_millis(3), machine.poll_timeout())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The fuzz targets, the property tests and [`Harness`](super::Harness)
/// feed arbitrary inputs through it.
#[derive(Debug, Default)]
pub struct Observer {
    session: Option<SessionId>,
    inflight: Option<QueryId>,
    /// The watch session and its statement in flight.
    watch: Option<SessionId>,
    watch_inflight: Option<QueryId>,
    jobs: BTreeMap<RunId, i64>,
    finished: BTreeSet<RunId>,
    /// Runs the driver reported dropped.
    abandoned: BTreeSet<RunId>,
    started: BTreeSet<RunId>,
    latest: Option<Instant>,
}

impl Observer {
    /// A fresh observer, for a fresh machine.
    pub fn new() -> Observer {
        Observer::default()
    }

    /// Records an input about to be fed. Inputs the machine will ignore
    /// (stale ids, jobs not running) are fine.
    pub fn input(&mut self, input: &Input) {
        match input {
            Input::JobExited { run, exit } => {
                self.jobs.remove(run);
                // A run the machine accepted and did not finish: an exit of
                // an unknown run is ignored.
                let live = self.started.contains(run) && !self.finished.contains(run);
                if *exit == JobExit::Abandoned && live {
                    self.abandoned.insert(*run);
                }
            }
            Input::Reply { query, .. } if self.inflight == Some(*query) => self.inflight = None,
            Input::Reply { query, .. } if self.watch_inflight == Some(*query) => {
                self.watch_inflight = None
            }
            Input::SessionEnded { session, .. } if self.session == Some(*session) => {
                self.session = None;
                self.inflight = None;
            }
            Input::SessionEnded { session, .. } if self.watch == Some(*session) => {
                self.watch = None;
                self.watch_inflight = None;
            }
            _ => {}
        }
    }

    /// Records a run the machine accepted.
    pub fn run_started(&mut self, run: RunId) {
        self.started.insert(run);
    }

    /// Checks one session command against the rules. Feed the commands of
    /// one step by the drain rule: run commands first.
    ///
    /// # Errors
    /// The broken rule.
    pub fn session_command(&mut self, c: &SessionCommand) -> Result<(), ObserverViolation> {
        match c {
            SessionCommand::Open { session, .. } => {
                self.session = Some(*session);
                self.inflight = None;
            }
            SessionCommand::Close { session } => {
                if self.session == Some(*session) {
                    self.session = None;
                    self.inflight = None;
                }
            }
            SessionCommand::OpenWatch { session } => {
                if self.session.is_none() {
                    return Err(ObserverViolation::WatchNotAWait { query: None });
                }
                self.watch = Some(*session);
                self.watch_inflight = None;
            }
            SessionCommand::CloseWatch { session } => {
                if self.watch == Some(*session) {
                    self.watch = None;
                    self.watch_inflight = None;
                }
            }
            SessionCommand::WatchQuery {
                session,
                query,
                statement,
            } => {
                one_in_flight(self.watch == Some(*session), self.watch_inflight, *query)?;
                if !matches!(statement, Statement::Wait { .. }) {
                    let query = Some(*query);
                    return Err(ObserverViolation::WatchNotAWait { query });
                }
                self.watch_inflight = Some(*query);
            }
            SessionCommand::Probe { query, .. } => {
                one_in_flight(self.session.is_some(), self.inflight, *query)?;
                self.inflight = Some(*query);
            }
            SessionCommand::Query { query, statement } => {
                one_in_flight(self.session.is_some(), self.inflight, *query)?;
                self.inflight = Some(*query);
                let running = |k: &i64| self.jobs.values().any(|j| j == k);
                match statement {
                    Statement::TryLock { keys, .. } => {
                        if let Some(&key) = keys.iter().find(|k| running(k)) {
                            return Err(ObserverViolation::ReentrantTry { key });
                        }
                    }
                    Statement::Release { keys, .. } => {
                        if let Some(&key) = keys.iter().find(|k| running(k)) {
                            return Err(ObserverViolation::ReleaseWhileJobRuns { key });
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Checks one run command against the rules.
    ///
    /// # Errors
    /// The broken rule.
    pub fn run_command(&mut self, c: &RunCommand) -> Result<(), ObserverViolation> {
        match c {
            RunCommand::StartJob { run, lease, .. } => {
                if self.abandoned.contains(run) {
                    return Err(ObserverViolation::AbandonedRunStarted { run: *run });
                }
                if self.jobs.insert(*run, lease.key()).is_some() {
                    return Err(ObserverViolation::JobStartedTwice { run: *run });
                }
                if self.session.is_none() {
                    return Err(ObserverViolation::JobWithoutSession { run: *run });
                }
            }
            RunCommand::CancelJob { run, .. } => {
                if !self.jobs.contains_key(run) {
                    return Err(ObserverViolation::CancelWithoutJob { run: *run });
                }
            }
            RunCommand::Finish { run, .. } => {
                if !self.finished.insert(*run) {
                    return Err(ObserverViolation::FinishedTwice { run: *run });
                }
                if self.jobs.contains_key(run) {
                    return Err(ObserverViolation::FinishedWhileJobRuns { run: *run });
                }
                if !self.started.contains(run) {
                    return Err(ObserverViolation::UnknownRunFinished { run: *run });
                }
            }
        }
        Ok(())
    }

    /// Checks the machine's next deadline against `now`, the instant the
    /// last input was fed at (the latest `now` seen counts: a driver that
    /// hands in an older instant is not told to sleep into the past).
    ///
    /// # Errors
    /// [`ObserverViolation::DeadlineInPast`].
    pub fn check_timeout(
        &mut self,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Result<(), ObserverViolation> {
        let latest = self.latest.map_or(now, |l| l.max(now));
        self.latest = Some(latest);
        match deadline {
            Some(d) if d < latest => Err(ObserverViolation::DeadlineInPast { by: latest - d }),
            _ => Ok(()),
        }
    }
}

/// The rule for a statement `query` sent on a session (the session or the
/// watch session): the session is `open`, and `in_flight` (its statement in
/// flight) is none.
fn one_in_flight(
    open: bool,
    in_flight: Option<QueryId>,
    query: QueryId,
) -> Result<(), ObserverViolation> {
    if !open {
        return Err(ObserverViolation::QueryWithoutSession { query });
    }
    match in_flight {
        Some(in_flight) => Err(ObserverViolation::QueryInFlight { query, in_flight }),
        None => Ok(()),
    }
}

/// One command of the machine, from either queue, as a flat value: what a
/// hand-driven test or a fuzz target records of one step.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// [`SessionCommand::Open`].
    OpenSession {
        /// The session.
        session: SessionId,
        /// Its parameters.
        params: crate::SessionParams,
    },
    /// [`SessionCommand::Query`].
    Query {
        /// The query.
        query: QueryId,
        /// The statement.
        statement: Statement,
    },
    /// [`SessionCommand::Probe`].
    Probe {
        /// The query.
        query: QueryId,
        /// The statement.
        statement: Statement,
    },
    /// [`SessionCommand::Close`].
    CloseSession {
        /// The session.
        session: SessionId,
    },
    /// [`SessionCommand::OpenWatch`].
    OpenWatch {
        /// The watch session.
        session: SessionId,
    },
    /// [`SessionCommand::WatchQuery`].
    WatchQuery {
        /// The watch session.
        session: SessionId,
        /// The query.
        query: QueryId,
        /// The statement.
        statement: Statement,
    },
    /// [`SessionCommand::CloseWatch`].
    CloseWatch {
        /// The watch session.
        session: SessionId,
    },
    /// [`RunCommand::StartJob`].
    StartJob {
        /// The run.
        run: RunId,
        /// Its lease.
        lease: LeaseId,
        /// The fencing token.
        token: i64,
        /// Until when it is valid.
        valid_until: Instant,
    },
    /// [`RunCommand::CancelJob`].
    CancelJob {
        /// The run.
        run: RunId,
        /// Why.
        reason: crate::Reason,
    },
    /// [`RunCommand::Finish`].
    FinishRun {
        /// The run.
        run: RunId,
        /// How it ended.
        outcome: Outcome,
    },
}

impl From<SessionCommand> for Command {
    fn from(c: SessionCommand) -> Command {
        match c {
            SessionCommand::Open { session, params } => Command::OpenSession { session, params },
            SessionCommand::Query { query, statement } => Command::Query { query, statement },
            SessionCommand::Probe { query, statement } => Command::Probe { query, statement },
            SessionCommand::Close { session } => Command::CloseSession { session },
            SessionCommand::OpenWatch { session } => Command::OpenWatch { session },
            SessionCommand::WatchQuery {
                session,
                query,
                statement,
            } => Command::WatchQuery {
                session,
                query,
                statement,
            },
            SessionCommand::CloseWatch { session } => Command::CloseWatch { session },
        }
    }
}

impl From<RunCommand> for Command {
    fn from(c: RunCommand) -> Command {
        match c {
            RunCommand::StartJob {
                run,
                lease,
                token,
                valid_until,
            } => Command::StartJob {
                run,
                lease,
                token,
                valid_until,
            },
            RunCommand::CancelJob { run, reason } => Command::CancelJob { run, reason },
            RunCommand::Finish { run, outcome } => Command::FinishRun { run, outcome },
        }
    }
}

/// Drains `machine`'s output by the drain rule (commands in the order given;
/// events are returned apart), checking each command with `observer`.
///
/// # Errors
/// The first rule the observer saw broken.
pub fn drain(
    machine: &mut Machine,
    observer: &mut Observer,
) -> Result<(Vec<Command>, Vec<Event>), ObserverViolation> {
    let mut commands = Vec::new();
    let mut events = Vec::new();
    while let Some(output) = machine.poll_output() {
        match output {
            Output::Run(c) => {
                observer.run_command(&c)?;
                commands.push(c.into());
            }
            Output::Session(c) => {
                observer.session_command(&c)?;
                commands.push(c.into());
            }
            Output::Event(e) => events.push(e),
        }
    }
    Ok((commands, events))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn start(run: RunId) -> RunCommand {
        RunCommand::StartJob {
            run,
            lease: LeaseId::named("job").expect("a valid name"),
            token: 1,
            valid_until: Instant::now(),
        }
    }

    /// A start for a run the driver reported dropped breaks the rule; an exit of a run
    /// the machine never accepted marks nothing.
    #[test]
    fn a_dropped_runs_start_is_a_violation() {
        let mut o = Observer::new();
        let (dropped, unknown) = (RunId(0), RunId(1));
        o.run_started(dropped);
        for run in [dropped, unknown] {
            o.input(&Input::JobExited {
                run,
                exit: JobExit::Abandoned,
            });
        }
        o.run_started(unknown);
        assert_eq!(
            o.run_command(&start(dropped)),
            Err(ObserverViolation::AbandonedRunStarted { run: dropped })
        );
        // (No session is open here: that rule is another one.)
        assert_eq!(
            o.run_command(&start(unknown)),
            Err(ObserverViolation::JobWithoutSession { run: unknown })
        );
    }
}
