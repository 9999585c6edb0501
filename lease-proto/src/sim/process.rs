//! Processes: each runs one [`Machine`] under a simulated driver that follows
//! the drain rule, with jobs that return by themselves or when cancelled, a
//! clock whose rate drifts within a bound, freezes (nothing runs, the clock
//! goes on), crashes (the kernel closes the socket) and restarts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::net::{ToClient, ToServer};
use super::{DriverBug, Ev, Sim, TraceEvent, Violation};
use crate::{
    server::HANDOVER_CHANNEL, Input, JobExit, LeaseId, Machine, Outcome, Output, QueryId,
    RunCommand, RunId, SessionCommand, SessionId, Statement,
};

/// Wake-ups in a row that find the next deadline already due before the
/// simulator calls the process stalled.
const MAX_WAKEUPS_DUE_AT_ONCE: u32 = 64;
/// A timer this close to now counts as due at once (the simulated driver
/// arms timers 1 ns past the deadline, and clock-rate conversion rounds).
const DUE_AT_ONCE: Duration = Duration::from_micros(1);

/// A running job.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) id: u64,
    pub(super) key: i64,
    /// Set when the process saw CancelJob for it.
    pub(super) cancelled: bool,
    /// Set when the (buggy) driver already reported it.
    pub(super) reported: bool,
    /// Its process was frozen past the job's validity: on resume it acts
    /// until it has stopped, and no core can prevent that (a pause no client
    /// can beat;
    /// the fencing token is the remedy). Strong safety does not count it;
    /// the overlap measure does.
    pub(super) stale: bool,
}

/// One process: its machine, clock, connection and jobs.
#[derive(Debug)]
pub(super) struct Proc {
    pub(super) machine: Machine,
    pub(super) incarnation: u32,
    pub(super) alive: bool,
    pub(super) frozen: bool,
    /// Events that arrived while frozen, in order.
    pub(super) deferred: VecDeque<Ev>,
    /// Clock rate against virtual time.
    pub(super) rate: f64,
    pub(super) conn: Option<(SessionId, u64)>,
    /// The watch session's connection, if open.
    pub(super) watch: Option<(SessionId, u64)>,
    /// The startup settings of the last session opened (the watch session
    /// connects with them too).
    settings: Vec<(&'static str, String)>,
    /// Generation of the one armed timer; older timer events are stale.
    pub(super) timer_gen: u64,
    /// Consecutive drains whose next timer was due at once.
    due_at_once: u32,
    /// Set once the process was found stalled: no timer is armed any more.
    stalled: bool,
    pub(super) runs: BTreeMap<RunId, String>,
    pub(super) jobs: BTreeMap<RunId, Job>,
    pub(super) finished: BTreeSet<RunId>,
    /// Runs whose future the embedder dropped ([`Fault::Abandon`](super::Fault::Abandon)):
    /// the driver starts no job of theirs any more.
    pub(super) abandoned: BTreeSet<RunId>,
    /// Run → the outcome the contract expects when its job returns by itself.
    pub(super) expect: BTreeMap<RunId, Outcome>,
    /// The lease session was doubtful after the last input (see
    /// [`SimConfig::stop_as_lease_run`](super::SimConfig::stop_as_lease_run)).
    doubtful: bool,
}

impl Proc {
    pub(super) fn new(machine: Machine, rate: f64) -> Proc {
        Proc {
            machine,
            incarnation: 0,
            alive: true,
            frozen: false,
            deferred: VecDeque::new(),
            rate,
            conn: None,
            watch: None,
            settings: Vec::new(),
            timer_gen: 0,
            due_at_once: 0,
            stalled: false,
            runs: BTreeMap::new(),
            jobs: BTreeMap::new(),
            finished: BTreeSet::new(),
            abandoned: BTreeSet::new(),
            expect: BTreeMap::new(),
            doubtful: false,
        }
    }

    /// A crash: nothing of the process survives but its machine, replaced on
    /// restart. Returns the connections the kernel closes.
    pub(super) fn crash(&mut self) -> Vec<u64> {
        self.alive = false;
        self.frozen = false;
        self.deferred.clear();
        self.jobs.clear();
        let watch = self.watch.take().map(|(_, conn)| conn);
        self.conn
            .take()
            .map(|(_, conn)| conn)
            .into_iter()
            .chain(watch)
            .collect()
    }

    /// A restart with a fresh machine.
    pub(super) fn restart(&mut self, machine: Machine) {
        self.machine = machine;
        self.incarnation += 1;
        self.alive = true;
        self.conn = None;
        self.watch = None;
        self.runs.clear();
        self.finished.clear();
        self.expect.clear();
        self.abandoned.clear();
        self.due_at_once = 0;
        self.stalled = false;
    }
}

impl Sim {
    /// Process `p`'s clock now.
    pub(super) fn local(&self, p: usize) -> Instant {
        self.base + self.now.mul_f64(self.procs[p].rate)
    }

    /// The instant the simulated driver hands process `p`'s machine: its
    /// clock, unless the driver's clock is stuck.
    fn driver_now(&self, p: usize) -> Instant {
        if self.cfg.bug == Some(DriverBug::FrozenClock) {
            self.base
        } else {
            self.local(p)
        }
    }

    /// Starts one run per configured lease on process `p`, now or after its
    /// delay in [`SimConfig::run_after`](super::SimConfig::run_after).
    pub(super) fn start_runs(&mut self, p: usize) {
        // A process of `lease_subset` runs only the first n leases.
        let n = (self.cfg.lease_subset.get(p).copied().flatten())
            .map_or(self.cfg.leases.len(), |n| n.min(self.cfg.leases.len()));
        for i in 0..n {
            let after = (self.cfg.run_after.get(p))
                .and_then(|v| v.get(i).copied())
                .unwrap_or_default();
            if after.is_zero() {
                self.start_run(p, i);
            } else {
                let incarnation = self.procs[p].incarnation;
                let ev = Ev::StartRun {
                    p,
                    incarnation,
                    lease: i,
                };
                self.queue.push(self.now + after, ev);
            }
        }
        self.drain(p);
    }

    /// Starts the run of lease number `i` on process `p` (the caller drains).
    pub(super) fn start_run(&mut self, p: usize, i: usize) {
        let now = self.driver_now(p);
        let name = self.cfg.leases[i].clone();
        let mut lease = LeaseId::named(name.clone()).expect("valid lease name");
        if let Some(group) = &self.cfg.group {
            lease = lease.in_group(crate::GroupId::named(group).expect("valid group name"));
        }
        match self.procs[p].machine.run(now, lease) {
            Ok(run) => {
                self.procs[p].runs.insert(run, name);
            }
            Err(error) => self.violation(Violation::RunRejected {
                at: self.now,
                process: p,
                lease: name,
                error,
            }),
        }
    }

    /// Feeds one input to process `p`'s machine, then drains it.
    pub(super) fn input(&mut self, p: usize, input: Input) {
        let now = self.driver_now(p);
        self.procs[p].machine.handle_input(now, input);
        self.drain(p);
        self.watch_doubtful_session(p);
    }

    /// `lease run` watches a session the machine gave up on (doubtful) while
    /// a cancelled command still runs: when it ends, the server has freed
    /// the keys, and the command is killed within half the lock delay, as
    /// after any end of the session.
    fn watch_doubtful_session(&mut self, p: usize) {
        if !self.cfg.stop_as_lease_run
            || self.cfg.bug == Some(DriverBug::FatalReplyKeepsKey)
            || self.cfg.mutation == Some(super::Mutation::FatalReplyIsStatementFailure)
        {
            return;
        }
        let doubtful = matches!(
            self.procs[p].machine.status().session,
            crate::SessionState::Doubtful { .. }
        );
        let ended = std::mem::replace(&mut self.procs[p].doubtful, doubtful) && !doubtful;
        if !ended {
            return;
        }
        let kill = self.now + self.procs[p].machine.options().lock_delay / 2;
        let incarnation = self.procs[p].incarnation;
        let cancelled: Vec<(RunId, u64)> = (self.procs[p].jobs.iter())
            .filter(|(_, j)| j.cancelled)
            .map(|(run, j)| (*run, j.id))
            .collect();
        for (run, job) in cancelled {
            let ev = Ev::JobExit {
                p,
                incarnation,
                run,
                exit: JobExit::Ok,
                job,
            };
            self.queue.push(kill, ev);
        }
    }

    /// The simulated driver: executes every command of process `p`'s machine
    /// by the drain rule (every output, in the order given), then arms its
    /// one timer.
    pub(super) fn drain(&mut self, p: usize) {
        while let Some(output) = self.procs[p].machine.poll_output() {
            match output {
                Output::Run(cmd) => self.run_command(p, cmd),
                Output::Session(cmd) => self.session_command(p, cmd),
                Output::Event(e) => self.trace(Some(p), TraceEvent::Machine(e)),
            }
        }
        self.arm_timer(p);
    }

    /// Arms process `p`'s one timer at its machine's deadline, converted to
    /// virtual time through its clock rate; a deadline that stays due wake-up
    /// after wake-up is a stall, reported once, after which no timer is armed.
    fn arm_timer(&mut self, p: usize) {
        let proc_ = &mut self.procs[p];
        proc_.timer_gen += 1;
        if proc_.stalled {
            return;
        }
        let Some(t) = proc_.machine.poll_timeout() else {
            proc_.due_at_once = 0;
            return;
        };
        let local = t.saturating_duration_since(self.base);
        let real = local.div_f64(proc_.rate) + Duration::from_nanos(1);
        let at = real.max(self.now);
        if at <= self.now + DUE_AT_ONCE {
            proc_.due_at_once += 1;
        } else {
            proc_.due_at_once = 0;
        }
        if proc_.due_at_once >= MAX_WAKEUPS_DUE_AT_ONCE {
            proc_.stalled = true;
            let wakeups = proc_.due_at_once;
            self.violation(Violation::Stalled {
                at: self.now,
                process: p,
                wakeups,
            });
            return;
        }
        let gen = proc_.timer_gen;
        self.queue.push(at, Ev::Deadline(p, gen));
    }

    /// Opens a connection of process `p`: the next connection id, sent to
    /// the server with `settings` as its startup settings; returns the id.
    fn connect(&mut self, p: usize, settings: Vec<(&'static str, String)>) -> u64 {
        self.next_conn += 1;
        let conn = self.next_conn;
        self.send(p, Ev::AtServer(p, ToServer::Connect { conn, settings }));
        conn
    }

    /// Sends process `p`'s `statement` on `slot`, the session and connection
    /// it names (the lease session's or the watch session's); a statement
    /// for a connection not open is dropped, as a closed socket drops it.
    fn query_on(
        &mut self,
        p: usize,
        slot: Option<(SessionId, u64)>,
        query: QueryId,
        statement: Statement,
    ) {
        let Some((_, conn)) = slot else {
            return;
        };
        let msg = ToServer::Query {
            conn,
            query,
            statement,
        };
        self.send(p, Ev::AtServer(p, msg));
    }

    fn session_command(&mut self, p: usize, cmd: SessionCommand) {
        match cmd {
            SessionCommand::Open { session, params } => {
                let settings = params.startup_settings;
                self.procs[p].settings = settings.clone();
                let conn = self.connect(p, settings);
                self.procs[p].conn = Some((session, conn));
            }
            SessionCommand::Query { query, statement } => {
                if let Statement::Release { keys, .. } = &statement {
                    for key in keys {
                        let running = self.procs[p].jobs.values().any(|j| j.key == *key);
                        if running {
                            self.violation(Violation::ReleaseWhileJobRuns {
                                at: self.now,
                                process: p,
                                key: *key,
                            });
                        }
                    }
                }
                self.query_on(p, self.procs[p].conn, query, statement);
            }
            SessionCommand::Probe { query, statement } => {
                let Some((_, conn)) = self.procs[p].conn else {
                    return;
                };
                let msg = ToServer::Probe {
                    conn,
                    query,
                    statement,
                };
                self.send(p, Ev::AtServer(p, msg));
            }
            SessionCommand::OpenWatch { session } => {
                let settings = self.procs[p].settings.clone();
                let conn = self.connect(p, settings);
                self.procs[p].watch = Some((session, conn));
            }
            SessionCommand::WatchQuery {
                session,
                query,
                statement,
            } => {
                if !matches!(statement, Statement::Wait { .. }) {
                    self.violation(Violation::WatchNotAWait {
                        at: self.now,
                        process: p,
                        statement: format!("{statement:?}"),
                    });
                }
                let watch = self.procs[p].watch.filter(|(s, _)| *s == session);
                self.query_on(p, watch, query, statement);
            }
            SessionCommand::CloseWatch { session } => {
                if self.cfg.bug == Some(DriverBug::IgnoreCloseSession) {
                    return;
                }
                if let Some((_, conn)) = self.procs[p].watch.filter(|(s, _)| *s == session) {
                    self.procs[p].watch = None;
                    self.send(p, Ev::AtServer(p, ToServer::Close { conn }));
                }
            }
            SessionCommand::Close { .. } => {
                if self.cfg.bug == Some(DriverBug::IgnoreCloseSession) {
                    return;
                }
                if let Some((_, conn)) = self.procs[p].conn.take() {
                    self.send(p, Ev::AtServer(p, ToServer::Close { conn }));
                }
            }
        }
    }

    fn run_command(&mut self, p: usize, cmd: RunCommand) {
        match cmd {
            RunCommand::StartJob {
                run,
                lease,
                token,
                valid_until,
            } => {
                if self.procs[p].abandoned.contains(&run) {
                    // The run's future is gone: the real driver has no slot
                    // to start a job in.
                    let at = self.now;
                    self.violation(Violation::DroppedRunStarted {
                        at,
                        process: p,
                        run,
                    });
                    return;
                }
                self.next_job += 1;
                let id = self.next_job;
                let key = lease.key();
                let job = Job {
                    id,
                    key,
                    cancelled: false,
                    reported: false,
                    stale: false,
                };
                self.procs[p].jobs.insert(run, job);
                self.procs[p].expect.remove(&run);
                let name = lease.name().to_string();
                *self.report.acquisitions.entry(name.clone()).or_default() += 1;
                let valid_for = valid_until.saturating_duration_since(self.local(p));
                self.trace(
                    Some(p),
                    TraceEvent::JobStarted {
                        run,
                        lease: name,
                        token,
                        valid_for,
                    },
                );
                if self.chance(self.cfg.job_exit_probability) {
                    let after = self.uniform(self.cfg.job_lifetime);
                    let exit = if self.chance(0.5) {
                        JobExit::Ok
                    } else {
                        JobExit::Failed
                    };
                    let incarnation = self.procs[p].incarnation;
                    let ev = Ev::JobExit {
                        p,
                        incarnation,
                        run,
                        exit,
                        job: id,
                    };
                    self.queue.push(self.now + after, ev);
                }
            }
            RunCommand::CancelJob { run, reason } => {
                if reason == crate::Reason::HandedOver {
                    self.report.handoffs += 1;
                }
                let incarnation = self.procs[p].incarnation;
                let spread = self
                    .cfg
                    .job_reaction
                    .saturating_sub(self.cfg.job_reaction_min);
                let mut react = self.cfg.job_reaction_min + self.uniform(spread);
                if self.cfg.stop_as_lease_run && self.key_may_be_free(&reason) {
                    // `lease run`'s kill within half the lock delay.
                    react = react.min(self.procs[p].machine.options().lock_delay / 2);
                }
                let Some(j) = self.procs[p].jobs.get_mut(&run) else {
                    return;
                };
                if j.cancelled {
                    return;
                }
                j.cancelled = true;
                let id = j.id;
                self.trace(Some(p), TraceEvent::JobCancelled { run, reason });
                let ev = Ev::JobExit {
                    p,
                    incarnation,
                    run,
                    exit: JobExit::Ok,
                    job: id,
                };
                self.queue.push(self.now + react, ev);
                if self.cfg.bug == Some(DriverBug::ReportExitEarly) {
                    if let Some(j) = self.procs[p].jobs.get_mut(&run) {
                        j.reported = true;
                    }
                    let now = self.driver_now(p);
                    let exit = Input::JobExited {
                        run,
                        exit: JobExit::Ok,
                    };
                    self.procs[p].machine.handle_input(now, exit);
                }
            }
            RunCommand::Finish { run, outcome } => {
                let Some(name) = self.procs[p].runs.get(&run).cloned() else {
                    self.violation(Violation::UnknownRunFinished {
                        at: self.now,
                        process: p,
                        run,
                    });
                    return;
                };
                let at = self.now;
                if !self.procs[p].finished.insert(run) {
                    self.violation(Violation::FinishedTwice {
                        at,
                        process: p,
                        run,
                    });
                }
                if self.procs[p].jobs.get(&run).is_some_and(|j| !j.reported) {
                    self.violation(Violation::FinishedWhileJobRuns {
                        at,
                        process: p,
                        run,
                    });
                }
                let expected = self.procs[p].expect.get(&run).cloned();
                // A job that returned by itself but lost its lease first is
                // restarted, so its expectation is cleared on restart.
                let dropped = self.procs[p].abandoned.contains(&run);
                let allowed = super::checks::outcome_allowed;
                if !allowed(&outcome, expected.as_ref(), self.closing, dropped) {
                    self.violation(Violation::ContractOutcome {
                        at,
                        process: p,
                        lease: name.clone(),
                        got: outcome.clone(),
                        expected: if dropped {
                            Some(Outcome::Abandoned)
                        } else {
                            expected
                        },
                    });
                }
                self.trace(
                    Some(p),
                    TraceEvent::RunFinished {
                        run,
                        lease: name.clone(),
                        outcome: outcome.clone(),
                    },
                );
                self.report.outcomes[p].push((name, outcome));
            }
        }
    }

    /// `lease run`'s reading of a loss (see [`SimConfig::stop_as_lease_run`](super::SimConfig::stop_as_lease_run)),
    /// or its broken variant [`DriverBug::FatalReplyKeepsKey`].
    fn key_may_be_free(&self, reason: &crate::Reason) -> bool {
        let old_reading = self.cfg.bug == Some(DriverBug::FatalReplyKeepsKey)
            || self.cfg.mutation == Some(super::Mutation::FatalReplyIsStatementFailure);
        if old_reading && matches!(reason, crate::Reason::QueryFailed(_)) {
            return false;
        }
        reason.key_may_be_free()
    }

    /// [`Fault::Abandon`](super::Fault::Abandon): the embedder of `p` drops
    /// its run of lease number `lease`, and the job future with it.
    pub(super) fn abandon(&mut self, p: usize, lease: usize) {
        if self.cfg.leases.is_empty() || !self.procs[p].alive || self.procs[p].frozen {
            return;
        }
        let name = self.cfg.leases[lease % self.cfg.leases.len()].clone();
        let proc_ = &mut self.procs[p];
        let Some(run) = (proc_.runs.iter())
            .find(|(run, n)| **n == name && !proc_.finished.contains(*run))
            .map(|(run, _)| *run)
        else {
            return;
        };
        if !proc_.abandoned.insert(run) {
            return;
        }
        proc_.jobs.remove(&run);
        let exit = JobExit::Abandoned;
        self.trace_job_exit(p, run, name, exit);
        self.input(p, Input::JobExited { run, exit });
    }

    /// Traces the exit of process `p`'s job of `run`, under the lease `lease`.
    fn trace_job_exit(&mut self, p: usize, run: RunId, lease: String, exit: JobExit) {
        self.trace(Some(p), TraceEvent::JobExited { run, lease, exit });
    }

    /// A job's exit (by itself or after its cancellation) arrives at `p`.
    pub(super) fn job_exit(
        &mut self,
        p: usize,
        incarnation: u32,
        run: RunId,
        exit: JobExit,
        job: u64,
    ) {
        let proc_ = &mut self.procs[p];
        if !proc_.alive || proc_.incarnation != incarnation {
            return;
        }
        if proc_.jobs.get(&run).map(|j| j.id) != Some(job) {
            return;
        }
        let Some(j) = proc_.jobs.remove(&run) else {
            return;
        };
        let name = proc_.runs.get(&run).cloned().unwrap_or_default();
        if !j.cancelled {
            // Returned by itself while leading: the contract's outcome.
            let outcome = if exit == JobExit::Ok {
                Outcome::Completed
            } else {
                Outcome::Failed
            };
            proc_.expect.insert(run, outcome);
        }
        self.trace_job_exit(p, run, name, exit);
        if j.reported || self.cfg.bug == Some(DriverBug::LoseJobExits) {
            return;
        }
        self.input(p, Input::JobExited { run, exit });
    }

    /// A message arrives at process `p` from the server.
    pub(super) fn at_client(&mut self, p: usize, msg: ToClient) {
        if !self.procs[p].alive {
            return;
        }
        if let Some((session, watch)) = self.procs[p].watch {
            if msg.conn() == watch {
                return self.at_watch(p, session, watch, msg);
            }
        }
        let Some((session, conn)) = self.procs[p].conn else {
            return;
        };
        let input = match msg {
            ToClient::Connected { conn: c } if c == conn => Input::SessionOpened { session },
            ToClient::Failed { conn: c, error } | ToClient::Ended { conn: c, error }
                if c == conn =>
            {
                ended(&mut self.procs[p].conn, session, error)
            }
            ToClient::Reply {
                conn: c,
                query,
                result,
            } if c == conn => match self.take_arrived_end(p, conn) {
                // The driver reads the session's end before any reply it
                // has not fed yet, and drops that reply (as `lease-driver`
                // does: its connection is polled before its query): a
                // reply the server sent just before it ended the session
                // (a "won" of a try answered before a terminate) must not
                // start a job on a session already known to be gone.
                Some(error) => ended(&mut self.procs[p].conn, session, error),
                None => Input::Reply { query, result },
            },
            ToClient::Notify {
                conn: c,
                payload,
                sender_pid,
            } if c == conn => Input::Notification {
                channel: HANDOVER_CHANNEL.to_string(),
                payload,
                sender_pid,
            },
            _ => return,
        };
        self.input(p, input);
    }

    /// A message for the watch session `conn` of process `p`.
    fn at_watch(&mut self, p: usize, session: SessionId, conn: u64, msg: ToClient) {
        let input = match msg {
            ToClient::Connected { .. } => Input::SessionOpened { session },
            ToClient::Failed { error, .. } | ToClient::Ended { error, .. } => {
                ended(&mut self.procs[p].watch, session, error)
            }
            ToClient::Reply { query, result, .. } => match self.take_arrived_end(p, conn) {
                Some(error) => ended(&mut self.procs[p].watch, session, error),
                None => Input::Reply { query, result },
            },
            ToClient::Notify { .. } => return,
        };
        self.input(p, input);
    }

    /// The end of session `conn` if it has already arrived at process `p`
    /// (due now, or deferred while `p` was frozen), taken out of the queue.
    fn take_arrived_end(&mut self, p: usize, conn: u64) -> Option<crate::SessionError> {
        let is_end = |ev: &Ev| matches!(ev, Ev::AtClient(q, ToClient::Ended { conn: c, .. }) if *q == p && *c == conn);
        let deferred = &mut self.procs[p].deferred;
        let ev = match deferred.iter().position(is_end) {
            Some(i) => deferred.remove(i),
            None => self.queue.take_due(self.now, is_end),
        }?;
        match ev {
            Ev::AtClient(_, ToClient::Ended { error, .. }) => Some(error),
            _ => None,
        }
    }
}

/// The end of a session or watch session of a process, from its connection
/// `slot` (`Proc::conn` or `Proc::watch`): the slot is emptied, and the input
/// reports the end with `error`.
fn ended(
    slot: &mut Option<(SessionId, u64)>,
    session: SessionId,
    error: crate::SessionError,
) -> Input {
    *slot = None;
    Input::SessionEnded {
        session,
        error: Some(error),
    }
}
