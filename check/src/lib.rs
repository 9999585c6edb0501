//! Exhaustive exploration, within stated bounds, of the schedules of the
//! production [`Machine`](lease_proto::Machine)s in the simulator
//! (`lease_proto::sim`): a stateless model checker.
//!
//! The simulator is deterministic given its choices, so the checker makes
//! them explicit. At each step of a run it lists the options:
//!
//! - which ready event is delivered next: the head of each FIFO channel (a
//!   link's direction, a timer, a job's return) due within
//!   [`Model::window`] of the next one ([`Sim::ready`]). Events of
//!   different actors (the server, each process) at the same instant
//!   commute, so among those only the first actor's are branched on (a
//!   persistent set, DPOR-lite); a fault's start or end is ordered with
//!   everything;
//! - while the fault budget lasts, each fault of [`Model::faults`] not
//!   used yet, injected at the next event's instant, before it.
//!
//! A schedule is the sequence of option indices ([`Schedule`]); the checker
//! enumerates every schedule depth-first by replaying from the start with a
//! prefix and taking the first option after it (CHESS-style), then moves to
//! the next sibling of the deepest choice with one left. Choices are made
//! among the first [`Model::steps`] steps; after them the simulator runs
//! in time order to [`Model::horizon`], closes every machine and settles
//! ([`Sim::finish`]), so the end checks (every run finished, no lock
//! leaked) run on every schedule too. Every violation the simulator checks
//! ([`Violation`]) is a counterexample: its schedule replays it
//! ([`replay`]) and its trace shows it ([`Run::text`]).
//!
//! What the bounds mean, the figures and what is abstracted:
//! `docs/checker.md`.

use std::time::{Duration, Instant};

use lease_proto::sim::{Actor, Fault, Mutation, Ready, Report, Sim, SimConfig, TraceEvent};
use lease_proto::sim::{ServerConfig, Violation};
use lease_proto::{Event, Reason};

/// A schedule: at each step, the index of the option taken (see the crate
/// docs); steps past its end take option 0 (the event the simulator's own
/// time order delivers first).
pub type Schedule = Vec<u16>;

/// The configuration explored and its bounds.
#[derive(Debug, Clone)]
pub struct Model {
    /// Processes, each running one machine with one run of the one lease.
    pub processes: usize,
    /// The faults a schedule may inject (each at most once).
    pub faults: Vec<Fault>,
    /// How many of them one schedule injects at most.
    pub budget: usize,
    /// Choices (event order, faults) are made among the first `steps` steps
    /// of a run (a delivered event or an injected fault is a step).
    pub steps: usize,
    /// Events due within this long of the next one are candidates to go
    /// first (0: exact ties only); an event delivered after a later one
    /// arrives that much late.
    pub window: Duration,
    /// The runs go to this virtual time, then close and settle.
    pub horizon: Duration,
    /// How long the closing machines have to finish.
    pub settle: Duration,
    /// A broken variant planted in every machine.
    pub mutation: Option<Mutation>,
}

/// The lease every process runs.
pub const LEASE: &str = "job";

impl Model {
    /// `processes` processes, up to `budget` faults from
    /// [`Model::fault_menu`], choices among the first `steps` steps.
    pub fn new(processes: usize, budget: usize, steps: usize) -> Model {
        Model {
            processes,
            faults: Model::fault_menu(processes),
            budget,
            steps,
            window: Duration::ZERO,
            horizon: Duration::from_secs(4),
            settle: Duration::from_secs(2),
            mutation: None,
        }
    }

    /// Every process's faults, then the server's: a freeze shorter than
    /// the guard margin and one past the lease's validity, a crash (back
    /// after 1 s), a partition past the validity, `pg_terminate_backend`;
    /// a server restart; a forged handover notification; a hand-over
    /// request to process 1.
    pub fn fault_menu(processes: usize) -> Vec<Fault> {
        let mut faults = Vec::new();
        for process in 0..processes {
            faults.extend([
                Fault::Freeze {
                    process,
                    duration: Duration::from_millis(100),
                },
                Fault::Freeze {
                    process,
                    duration: Duration::from_secs(2),
                },
                Fault::Crash {
                    process,
                    restart_after: Some(Duration::from_secs(1)),
                },
                Fault::Partition {
                    process,
                    duration: Duration::from_secs(2),
                },
                Fault::Terminate { process },
            ]);
        }
        faults.extend([
            Fault::ServerRestart {
                downtime: Duration::from_millis(300),
            },
            Fault::ForgedNotify { lease: 0 },
            Fault::RequestHandover { lease: 0, to: 1 },
        ]);
        faults
    }

    /// Terminates of every process's session and a forged handover
    /// notification: the faults that race the lock delay.
    pub fn lock_delay_menu(processes: usize) -> Vec<Fault> {
        let mut faults: Vec<Fault> = (0..processes)
            .map(|process| Fault::Terminate { process })
            .collect();
        faults.push(Fault::ForgedNotify { lease: 0 });
        faults
    }

    /// Per process: a link that turns slow (150 ms more each way, for 5 s:
    /// a round trip longer than the guard margin, shorter than the query
    /// timeout) and a partition past the validity: what probes the guard
    /// margin.
    pub fn slow_then_silent_menu(processes: usize) -> Vec<Fault> {
        let mut faults = Vec::new();
        for process in 0..processes {
            faults.push(Fault::Delay {
                process,
                extra: Duration::from_millis(150),
                duration: Duration::from_secs(5),
            });
            faults.push(Fault::Partition {
                process,
                duration: Duration::from_secs(2),
            });
        }
        faults
    }

    /// The simulator's setup: fixed latency (1 ms, no jitter), no drift,
    /// jobs that stop 10 ms after their cancellation, a 20 ms lock delay (so
    /// strong safety must hold under terminates too), the full trace.
    pub fn config(&self) -> SimConfig {
        let mut options = SimConfig::default().options;
        options.lock_delay = Duration::from_millis(20);
        SimConfig {
            seed: 1,
            processes: self.processes,
            leases: vec![LEASE.into()],
            options,
            latency: Duration::from_millis(1),
            jitter: Duration::ZERO,
            drift: 0.0,
            job_reaction: Duration::from_millis(10),
            job_reaction_min: Duration::from_millis(10),
            job_exit_probability: 0.0,
            mutation: self.mutation,
            server: ServerConfig::default(),
            full_trace: true,
            ..SimConfig::default()
        }
    }
}

/// One option at a step.
#[derive(Debug, Clone)]
enum Choice {
    Deliver(Ready),
    Inject(usize),
}

/// One explored schedule.
#[derive(Debug, Clone)]
pub struct Run {
    /// The option taken at each step where the checker chose.
    pub schedule: Schedule,
    /// How many options each of those steps had.
    pub arity: Vec<u16>,
    /// What each of those steps did, with its virtual time.
    pub steps: Vec<(Duration, String)>,
    /// The simulator's report (violations, full trace).
    pub report: Report,
}

impl Run {
    /// The breaches found.
    pub fn violations(&self) -> &[Violation] {
        &self.report.violations
    }

    /// The schedule as text, to paste into a regression test.
    pub fn schedule_text(&self) -> String {
        let last = self
            .schedule
            .iter()
            .rposition(|c| *c != 0)
            .map_or(0, |i| i + 1);
        format!("{:?}", &self.schedule[..last])
    }

    /// A readable counterexample: the choices that differ from time order,
    /// the violations, then the simulator's trace.
    pub fn text(&self) -> String {
        let mut out = format!("schedule {}\nchoices:\n", self.schedule_text());
        for (i, (at, what)) in self.steps.iter().enumerate() {
            if self.schedule[i] != 0 {
                out += &format!(
                    "  step {i:>3} at {at:>10.3?}: {what} (option {})\n",
                    self.schedule[i]
                );
            }
        }
        out += &format!(
            "violations: {:#?}\ntrace:\n{}",
            self.report.violations,
            self.report.trace_text()
        );
        out
    }
}

/// Runs `model` following `schedule` (option 0 past its end), to the
/// horizon and the end checks, or until the first violation.
pub fn replay(model: &Model, schedule: &[u16]) -> Run {
    let mut sim = Sim::new(model.config(), Instant::now());
    let mut used = vec![false; model.faults.len()];
    let mut budget = model.budget;
    let mut run = Run {
        schedule: Vec::new(),
        arity: Vec::new(),
        steps: Vec::new(),
        report: Report::default(),
    };
    for step in 0..model.steps {
        let ready = sim.ready(model.window);
        let Some(next) = ready.first().cloned() else {
            break;
        };
        if next.at > model.horizon {
            break;
        }
        let mut options: Vec<Choice> = persistent(ready).into_iter().map(Choice::Deliver).collect();
        if budget > 0 {
            let unused = (0..model.faults.len()).filter(|i| !used[*i]);
            options.extend(unused.map(Choice::Inject));
        }
        let c = schedule.get(step).copied().unwrap_or(0);
        let choice = options.get(usize::from(c)).cloned().unwrap_or_else(|| {
            panic!(
                "schedule {schedule:?}: step {step} has {} options",
                options.len()
            )
        });
        run.schedule.push(c);
        run.arity
            .push(u16::try_from(options.len()).expect("few options"));
        match choice {
            Choice::Deliver(r) => {
                run.steps.push((r.at.max(sim.now()), r.label.clone()));
                sim.step(&r);
            }
            Choice::Inject(i) => {
                let fault = model.faults[i].clone();
                run.steps
                    .push((next.at.max(sim.now()), format!("inject {fault:?}")));
                sim.inject_fault(next.at, fault);
                used[i] = true;
                budget -= 1;
            }
        }
        if !sim.report().violations.is_empty() {
            run.report = sim.report().clone();
            return run;
        }
    }
    run.report = sim.finish(model.horizon, model.settle);
    run
}

/// The events worth branching on among `ready`: those of the first one's
/// actor at its instant and every later one in the window; all of them if
/// a fault's start or end is among them.
fn persistent(ready: Vec<Ready>) -> Vec<Ready> {
    let Some(first) = ready.first().cloned() else {
        return ready;
    };
    let tied = |r: &Ready| r.at == first.at;
    if ready.iter().any(|r| tied(r) && r.actor == Actor::Global) {
        return ready;
    }
    ready
        .into_iter()
        .filter(|r| !tied(r) || r.actor == first.actor)
        .collect()
}

/// The paths a model must be able to reach ("sometimes" properties).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reached {
    /// A job started on one process after one on another (a takeover or a
    /// hand-over).
    pub takeover: bool,
    /// A takeover after the holder's session ended without its release
    /// (its key freed by the server): the new job waits the lock delay.
    pub lock_delay_win: bool,
    /// A holder handed its lease over at a request
    /// ([`Reason::HandedOver`]), and another process started the job.
    pub handover: bool,
    /// The holder released gracefully and another process started the job.
    pub graceful_release: bool,
}

impl Reached {
    /// What `report`'s trace shows.
    pub fn of(report: &Report) -> Reached {
        let mut reached = Reached::default();
        let mut holder: Option<usize> = None;
        // How the last holder's lease ended: by a release (graceful) or a
        // hand-over, or not (yet) at all.
        let mut handed_over = false;
        let mut released = false;
        for line in &report.trace {
            match &line.event {
                TraceEvent::JobStarted { .. } => {
                    let p = line.process;
                    if holder.is_some() && holder != p {
                        reached.takeover = true;
                        if handed_over {
                            reached.handover = true;
                        } else if released {
                            reached.graceful_release = true;
                        } else {
                            reached.lock_delay_win = true;
                        }
                    }
                    holder = p;
                    handed_over = false;
                    released = false;
                }
                TraceEvent::JobCancelled {
                    reason: Reason::HandedOver,
                    ..
                } if line.process == holder => handed_over = true,
                TraceEvent::Machine(Event::Released { .. }) if line.process == holder => {
                    released = true
                }
                _ => {}
            }
        }
        reached
    }

    /// Both.
    pub fn or(self, other: Reached) -> Reached {
        Reached {
            takeover: self.takeover || other.takeover,
            lock_delay_win: self.lock_delay_win || other.lock_delay_win,
            handover: self.handover || other.handover,
            graceful_release: self.graceful_release || other.graceful_release,
        }
    }
}

/// What an exploration found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Schedules run to their end (or their first violation).
    pub schedules: u64,
    /// Distinct prefixes of choices (nodes of the schedule tree).
    pub prefixes: u64,
    /// The longest schedule, in steps.
    pub depth: usize,
    /// Paths reached on some schedule.
    pub reached: Reached,
    /// The first counterexample, if any.
    pub counterexample: Option<Run>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Explores every schedule of `model` depth-first, stopping at the first
/// counterexample if `stop_at_first`, or after `limit` schedules.
pub fn explore(model: &Model, stop_at_first: bool, limit: Option<u64>) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    let mut prefix: Schedule = Vec::new();
    loop {
        let run = replay(model, &prefix);
        out.schedules += 1;
        // The nodes this run adds below the prefix it was asked for.
        out.prefixes += (run.schedule.len() + 1).saturating_sub(prefix.len().max(1)) as u64;
        out.depth = out.depth.max(run.schedule.len());
        out.reached = out.reached.or(Reached::of(&run.report));
        let failed = !run.report.violations.is_empty();
        // The next sibling of the deepest choice that has one left.
        let mut next = run.schedule.clone();
        let arity = run.arity.clone();
        if failed && out.counterexample.is_none() {
            out.counterexample = Some(run);
        }
        if (failed && stop_at_first) || limit.is_some_and(|l| out.schedules >= l) {
            break;
        }
        while let Some(last) = next.pop() {
            if last + 1 < arity[next.len()] {
                next.push(last + 1);
                break;
            }
        }
        if next.is_empty() {
            break;
        }
        prefix = next;
    }
    out.elapsed = start.elapsed();
    out
}
