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
use lease_proto::sim::{ServerConfig, Violation, PROMOTION_CHECKPOINT};
use lease_proto::{Event, JobExit, Reason};

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
    /// The first `from` of those steps go in time order, with no choice (a
    /// warm-up: the start, until a holder is established); 0 by default.
    pub from: usize,
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
    /// Changes to the simulator's setup of [`Model::config`] (several
    /// leases, a group, an observer, a pooler, slow jobs).
    pub setup: fn(&mut SimConfig),
    /// Bounded failover, an always-property: every lease is led again
    /// within this long after the last fault ended (from the start if none),
    /// and is never unled longer than that afterwards, to the horizon.
    /// `None`: not checked.
    pub failover: Option<Duration>,
    /// Fair share in a lease group, an always-property: from this long
    /// after the last fault ended to the horizon, after every event, every
    /// lease is led and each live member leads `⌊K/N⌋` or `⌈K/N⌉` of the K
    /// keys. `None`: not checked.
    pub fair_share: Option<Duration>,
    /// Keep a visited set of states (see [`explore_within`]).
    pub visited: bool,
}

/// The bounded-failover bound of the default setup: a retry interval (a
/// standby's poll, a reconnect in the fast window), the lock delay, and 20
/// one-way latencies (a reconnect, setup, try and hold round trips):
/// 200 + 20 + 20 ms.
pub const FAILOVER: Duration = Duration::from_millis(240);

/// The lease every process runs.
pub const LEASE: &str = "job";

pub mod schedules;
pub mod variants;

impl Model {
    /// `processes` processes, up to `budget` faults from
    /// [`Model::fault_menu`], choices among the first `steps` steps.
    pub fn new(processes: usize, budget: usize, steps: usize) -> Model {
        Model {
            processes,
            faults: Model::fault_menu(processes),
            budget,
            steps,
            from: 0,
            window: Duration::ZERO,
            horizon: Duration::from_secs(4),
            settle: Duration::from_secs(2),
            mutation: None,
            setup: |_| {},
            failover: Some(FAILOVER),
            fair_share: None,
            visited: false,
        }
    }

    /// Named setups of the broken variants' and holes' configurations.
    pub fn with(mut self, setup: fn(&mut SimConfig)) -> Model {
        self.setup = setup;
        self
    }

    /// Every process's faults, then the server's: a freeze shorter than
    /// the guard margin and one past the lease's validity, a crash (back
    /// after 1 s), a partition past the validity, `pg_terminate_backend`
    /// (twice: as the seed draws the order in which the driver reads the
    /// FATAL answer to a statement in flight and the end, and with the
    /// FATAL answer first); a server restart; a promotion while the primary
    /// is frozen; a forged handover notification; a hand-over request to
    /// process 1 and one to a backend that does not exist; a forged
    /// preference (`prefer`) naming process 1's backend.
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
                Fault::TerminateFatalFirst { process },
            ]);
        }
        faults.extend([
            Fault::ServerRestart {
                downtime: Duration::from_millis(300),
            },
            Fault::PromoteFrozenPrimary { lag: 0 },
            Fault::ForgedNotify { lease: 0 },
            Fault::RequestHandover { lease: 0, to: 1 },
            Fault::RequestHandoverToPid {
                lease: 0,
                pid: 99_999,
            },
            Fault::ForgedPrefer {
                lease: 0,
                waiter: 1,
                priority: 5,
            },
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

    /// A hand-over request each way and the drop of process 0's run future:
    /// what probes a run dropped while its job stops for a hand-over or
    /// while its key is released.
    pub fn abandon_menu() -> Vec<Fault> {
        vec![
            Fault::RequestHandover { lease: 0, to: 1 },
            Fault::RequestHandover { lease: 0, to: 0 },
            Fault::Abandon {
                process: 0,
                lease: 0,
            },
        ]
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
        let mut cfg = SimConfig {
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
        };
        (self.setup)(&mut cfg);
        cfg
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
    /// The faults injected, with their instants.
    pub faults: Vec<(Duration, Fault)>,
    /// Breaches of the checker's own properties (bounded failover, an
    /// observer that leads), found on the report.
    pub failures: Vec<String>,
    /// The run reached a state explored before, at the same step with the
    /// same faults left, and stopped there: what follows was checked then.
    pub pruned: bool,
}

impl Run {
    /// The breaches found.
    pub fn violations(&self) -> &[Violation] {
        &self.report.violations
    }

    /// Whether the run broke a property (the simulator's or the checker's).
    pub fn failed(&self) -> bool {
        !self.report.violations.is_empty() || !self.failures.is_empty()
    }

    /// The first breach, in a word: the violation's kind or the checker
    /// property's name.
    pub fn breach(&self) -> Option<String> {
        if let Some(v) = self.report.violations.first() {
            let text = format!("{v:?}");
            let end = text.find([' ', '{', '(']).unwrap_or(text.len());
            return Some(text[..end].to_string());
        }
        let f = self.failures.first()?;
        Some(f[..f.find(':').unwrap_or(f.len())].to_string())
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

    /// The choices that differ from time order, as `(step, option)` pairs
    /// ([`sparse`] makes the schedule again).
    pub fn choices(&self) -> Vec<(usize, u16)> {
        (self.schedule.iter().enumerate())
            .filter(|(_, c)| **c != 0)
            .map(|(i, c)| (i, *c))
            .collect()
    }

    /// A readable counterexample: the choices that differ from time order,
    /// the violations, then the simulator's trace.
    pub fn text(&self) -> String {
        let mut out = format!(
            "schedule {}\nchoices {:?}:\n",
            self.schedule_text(),
            self.choices()
        );
        for (i, (at, what)) in self.steps.iter().enumerate() {
            if self.schedule[i] != 0 {
                out += &format!(
                    "  step {i:>3} at {at:>10.3?}: {what} (option {})\n",
                    self.schedule[i]
                );
            }
        }
        out += &format!(
            "violations: {:#?}\nproperties: {:#?}\ntrace:\n{}",
            self.report.violations,
            self.failures,
            self.report.trace_text()
        );
        out
    }
}

/// Whether one schedule may inject both faults: not a fault in which the
/// server ends sessions (a terminate, a restart, a promotion that ends
/// them) with one that keeps a process from hearing the server (a freeze,
/// a partition, a slow link). A holder that cannot hear the server learns
/// of its session's end only when it hears again, after the lock delay:
/// no client can beat that, and strong safety is promised only while the
/// holder hears the server (`docs/guarantees.md`, its conditions).
pub fn compatible(a: &Fault, b: &Fault) -> bool {
    let silences = |f: &Fault| {
        matches!(
            f,
            Fault::Freeze { .. } | Fault::Partition { .. } | Fault::Delay { .. }
        )
    };
    !(a.server_ends_sessions() && silences(b) || b.server_ends_sessions() && silences(a))
}

/// The schedule that takes option `c` at step `i` for each `(i, c)` of
/// `choices`, and option 0 everywhere else.
pub fn sparse(choices: &[(usize, u16)]) -> Schedule {
    let len = choices.iter().map(|(i, _)| i + 1).max().unwrap_or(0);
    let mut schedule = vec![0; len];
    for (i, c) in choices {
        schedule[*i] = *c;
    }
    schedule
}

/// Runs `model` following `schedule` (option 0 past its end), to the
/// horizon and the end checks, or until the first violation.
pub fn replay(model: &Model, schedule: &[u16]) -> Run {
    try_replay(model, schedule).unwrap_or_else(|e| panic!("{e}"))
}

/// [`replay`], or why `schedule` is not one of `model`'s (a step has fewer
/// options than it takes: the correct code's run may differ there from the
/// broken variant's).
pub fn try_replay(model: &Model, schedule: &[u16]) -> Result<Run, String> {
    replay_visiting(model, schedule, None)
}

/// Virtual time zero of every run: one instant, so that the machines'
/// instants of two runs compare (the visited set's fingerprints).
fn base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// [`try_replay`], stopping at a state of `visited` past the schedule's
/// given prefix (and adding the states it reaches).
fn replay_visiting(
    model: &Model,
    schedule: &[u16],
    mut visited: Option<&mut std::collections::HashSet<u128>>,
) -> Result<Run, String> {
    let cfg = model.config();
    let mut sim = Sim::new(cfg.clone(), base());
    let mut used = vec![false; model.faults.len()];
    let mut budget = model.budget;
    let mut run = Run {
        schedule: Vec::new(),
        arity: Vec::new(),
        steps: Vec::new(),
        report: Report::default(),
        faults: Vec::new(),
        failures: Vec::new(),
        pruned: false,
    };
    let mut led = Leadership::new(&cfg);
    // The instants the share was not fair, with what it was.
    let mut unfair: Vec<(Duration, String)> = Vec::new();
    // After every step: who leads, and (in a group) whether the share is fair.
    let fair_share = model.fair_share.is_some();
    let observe = |sim: &Sim, led: &mut Leadership, unfair: &mut Vec<(Duration, String)>| {
        led.sample(sim);
        if fair_share {
            unfair.extend(unfair_share(sim, &cfg).map(|w| (sim.now(), w)));
        }
    };
    for step in 0..model.steps {
        let ready = sim.ready(model.window);
        let Some(next) = ready.first().cloned() else {
            break;
        };
        if next.at > model.horizon {
            break;
        }
        let mut options: Vec<Choice> = if step < model.from {
            vec![Choice::Deliver(next.clone())]
        } else {
            persistent(ready).into_iter().map(Choice::Deliver).collect()
        };
        if budget > 0 && step >= model.from {
            let unused = (0..model.faults.len()).filter(|i| !used[*i]);
            let fits =
                |i: &usize| (run.faults.iter()).all(|(_, f)| compatible(f, &model.faults[*i]));
            options.extend(unused.filter(fits).map(Choice::Inject));
        }
        let c = schedule.get(step).copied().unwrap_or(0);
        let Some(choice) = options.get(usize::from(c)).cloned() else {
            return Err(format!(
                "schedule {schedule:?}: step {step} has {} options",
                options.len()
            ));
        };
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
                let at = next.at.max(sim.now());
                run.steps.push((at, format!("inject {fault:?}")));
                run.faults.push((at, fault.clone()));
                sim.inject_fault(next.at, fault);
                used[i] = true;
                budget -= 1;
            }
        }
        if !sim.report().violations.is_empty() {
            run.report = sim.report().clone();
            return Ok(run);
        }
        observe(&sim, &mut led, &mut unfair);
        // A state explored before, with the same choices left and the same
        // history the properties read: its subtree was checked then.
        if let Some(visited) = visited.as_deref_mut() {
            if step + 1 >= schedule.len() && step + 1 >= model.from && step + 1 < model.steps {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (step, &used, budget, &led.unled_since, &led.gaps).hash(&mut h);
                format!("{:?}{unfair:?}", run.faults).hash(&mut h);
                let key = sim.fingerprint() ^ u128::from(h.finish());
                if !visited.insert(key) {
                    run.pruned = true;
                    return Ok(run);
                }
            }
        }
    }
    // On in time order to the horizon, watching who leads.
    while sim.step_next(model.horizon) {
        if !sim.report().violations.is_empty() {
            run.report = sim.report().clone();
            return Ok(run);
        }
        observe(&sim, &mut led, &mut unfair);
    }
    if let Some(bound) = model.failover {
        run.failures
            .extend(led.failover(&cfg, &run.faults, model.horizon, bound));
    }
    if let (Some(bound), Some(calm)) = (model.fair_share, calm_from(&cfg, &run.faults)) {
        let late = unfair.into_iter().find(|(at, _)| *at >= calm + bound);
        run.failures.extend(late.map(|(at, what)| {
            format!(
                "UnfairShare: {what} at {at:?}, {:?} after the last fault ended at {calm:?} \
                 (bound {bound:?})",
                at - calm
            )
        }));
    }
    run.report = sim.finish(model.horizon, model.settle);
    run.failures.extend(observer_led(&cfg, &run.report));
    run.failures.extend(pooler_led(&cfg, &run.report));
    run.failures
        .extend(handover_missed(&run.faults, &run.report));
    Ok(run)
}

/// Behind a transaction pooler that runs every client on one server
/// connection, no client ever starts a job (its locks would sit on a
/// backend other clients share).
fn pooler_led(cfg: &SimConfig, report: &Report) -> Option<String> {
    if !(cfg.server.pooler && cfg.server.pooler_one_backend) {
        return None;
    }
    let led = (report.trace.iter()).find(|l| matches!(l.event, TraceEvent::JobStarted { .. }))?;
    Some(format!(
        "LedBehindPooler: p{} at {:?}: {}",
        led.process.unwrap_or(usize::MAX),
        led.at,
        led.event
    ))
}

/// When the last of `faults` ended (`None`: one never ends). A promotion
/// ends with its hold: its checkpoint, a second (the history file's whole
/// seconds) and [`Options::promotion_hold`](lease_proto::Options::promotion_hold)
/// after it. A hand-over request, when another fault (not a request) is
/// injected too, ends with the reservation it may start: two query
/// timeouts, in which only the named backend may take the key (a fault that
/// ends that backend's session leaves the key unled until then, as
/// documented).
fn calm_from(cfg: &SimConfig, faults: &[(Duration, Fault)]) -> Option<Duration> {
    let request = |f: &Fault| {
        matches!(
            f,
            Fault::RequestHandover { .. }
                | Fault::RequestHandoverToPid { .. }
                | Fault::ForgedPrefer { .. }
        )
    };
    let other_fault = faults.iter().any(|(_, f)| !request(f));
    let mut calm = Duration::ZERO;
    for (at, fault) in faults {
        let end = match fault {
            Fault::Promote { .. } | Fault::PromoteFrozenPrimary { .. } => {
                PROMOTION_CHECKPOINT + Duration::from_secs(1) + cfg.options.promotion_hold()
            }
            f if request(f) && other_fault => cfg.options.query_timeout * 2,
            other => other.duration()?,
        };
        calm = calm.max(*at + end);
    }
    Some(calm)
}

/// Whether the share is unfair now (see [`Model::fair_share`]): what it is.
fn unfair_share(sim: &Sim, cfg: &SimConfig) -> Option<String> {
    let live: Vec<usize> = (0..cfg.processes).filter(|p| sim.is_alive(*p)).collect();
    if live.is_empty() {
        return None;
    }
    let (k, n) = (cfg.leases.len(), live.len());
    let led = (cfg.leases.iter()).all(|l| live.iter().any(|p| sim.leads(*p, l)));
    let counts: Vec<usize> = (live.iter())
        .map(|p| (cfg.leases.iter()).filter(|l| sim.leads(*p, l)).count())
        .collect();
    let fair = counts.iter().all(|c| *c == k / n || *c == k.div_ceil(n));
    (!(led && fair))
        .then(|| format!("{k} keys over the live processes {live:?} came out {counts:?}"))
}

/// A requested hand-over goes to the named process: after a holder handed a
/// lease over at a request ([`Fault::RequestHandover`]), the next job of
/// that lease starts on the named process, when no other fault came in
/// between.
fn handover_missed(faults: &[(Duration, Fault)], report: &Report) -> Option<String> {
    let [(_, Fault::RequestHandover { to, .. })] = faults else {
        return None;
    };
    let mut handed = None;
    for line in &report.trace {
        match &line.event {
            TraceEvent::Machine(Event::HandedOver {
                requested: true, ..
            }) => handed = Some(line.at),
            TraceEvent::JobStarted { .. } if handed.is_some() => {
                return (line.process != Some(*to)).then(|| {
                    format!(
                        "HandoverMissed: handed over at {:?} at a request for p{to}, and p{} \
                         started the next job at {:?}",
                        handed.unwrap_or_default(),
                        line.process.unwrap_or(usize::MAX),
                        line.at
                    )
                });
            }
            _ => {}
        }
    }
    None
}

/// Who leads each lease, sampled after every event: the stretches of
/// time no live process led it.
struct Leadership {
    leases: Vec<String>,
    processes: usize,
    /// Per lease: since when nobody leads it (`Some(ZERO)` at the start).
    unled_since: Vec<Option<Duration>>,
    /// Per lease: every stretch nobody led it, `(from, to)`.
    gaps: Vec<Vec<(Duration, Duration)>>,
}

impl Leadership {
    fn new(cfg: &SimConfig) -> Leadership {
        Leadership {
            leases: cfg.leases.clone(),
            processes: cfg.processes,
            unled_since: vec![Some(Duration::ZERO); cfg.leases.len()],
            gaps: vec![Vec::new(); cfg.leases.len()],
        }
    }

    fn sample(&mut self, sim: &Sim) {
        let now = sim.now();
        for (i, lease) in self.leases.iter().enumerate() {
            let led = (0..self.processes).any(|p| sim.is_alive(p) && sim.leads(p, lease));
            match (led, self.unled_since[i]) {
                (true, Some(from)) => {
                    self.gaps[i].push((from, now));
                    self.unled_since[i] = None;
                }
                (false, None) => self.unled_since[i] = Some(now),
                _ => {}
            }
        }
    }

    /// Bounded failover: after the last of `faults` ended (the start if
    /// none), no lease stays unled longer than `bound`, to `horizon`.
    /// Nothing is asserted after a fault that never ends.
    fn failover(
        &self,
        cfg: &SimConfig,
        faults: &[(Duration, Fault)],
        horizon: Duration,
        bound: Duration,
    ) -> Vec<String> {
        let Some(calm) = calm_from(cfg, faults) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, lease) in self.leases.iter().enumerate() {
            let open = self.unled_since[i].map(|from| (from, horizon));
            for (from, to) in self.gaps[i].iter().copied().chain(open) {
                let counted = from.max(calm);
                if to > counted && to - counted > bound {
                    let until = if to == horizon && open == Some((from, to)) {
                        "the horizon".to_string()
                    } else {
                        format!("{to:?}")
                    };
                    out.push(format!(
                        "NoFailover: lease {lease} unled from {from:?} to {until}, {:?} after the last \
                         fault ended at {calm:?}, above the bound of {bound:?}",
                        to - counted
                    ));
                    break;
                }
            }
        }
        out
    }
}

/// An observer ([`lease_proto::Role::Observer`]) never acquires a key
/// nor starts a job.
fn observer_led(cfg: &SimConfig, report: &Report) -> Vec<String> {
    let observer = |p: usize| {
        cfg.process_options
            .get(p)
            .and_then(|o| o.as_ref())
            .is_some_and(|o| o.role.is_observer())
    };
    let led = report.trace.iter().find(|l| {
        l.process.is_some_and(observer)
            && matches!(
                l.event,
                TraceEvent::JobStarted { .. } | TraceEvent::Machine(Event::Acquired { .. })
            )
    });
    led.map(|l| {
        format!(
            "ObserverLed: p{} at {:?}: {}",
            l.process.unwrap_or(0),
            l.at,
            l.event
        )
    })
    .into_iter()
    .collect()
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
    /// A job was cancelled at its lease's validity end
    /// ([`Reason::ValidityExpired`]).
    pub validity_cancel: bool,
    /// A lease group member handed a lease over to the member that owns it
    /// in the group's share (not at a request).
    pub rebalance: bool,
    /// A run's future was dropped after its job returned and before the run
    /// finished: while its key was released.
    pub drop_while_releasing: bool,
}

impl Reached {
    /// What `report`'s trace shows.
    pub fn of(report: &Report) -> Reached {
        use std::collections::BTreeMap;
        /// Per lease: its last holder, and how that one's lease ended: by a
        /// release (graceful) or a hand-over, or not (yet) at all.
        #[derive(Default)]
        struct Lease {
            holder: Option<usize>,
            handed_over: bool,
            released: bool,
        }
        let mut reached = Reached::default();
        let mut leases: BTreeMap<String, Lease> = BTreeMap::new();
        // (process, run) -> lease name.
        let mut runs = BTreeMap::new();
        // Runs whose job returned, not started again nor finished since.
        let mut returned = std::collections::BTreeSet::new();
        for line in &report.trace {
            match &line.event {
                TraceEvent::JobExited { run, exit, .. } => {
                    if *exit != JobExit::Abandoned {
                        returned.insert((line.process, *run));
                    } else if returned.contains(&(line.process, *run)) {
                        reached.drop_while_releasing = true;
                    }
                }
                TraceEvent::RunFinished { run, .. } => {
                    returned.remove(&(line.process, *run));
                }
                TraceEvent::JobStarted { run, lease, .. } => {
                    returned.remove(&(line.process, *run));
                    runs.insert((line.process, *run), lease.clone());
                    let l = leases.entry(lease.clone()).or_default();
                    let p = line.process;
                    if l.holder.is_some() && l.holder != p {
                        reached.takeover = true;
                        if l.handed_over {
                            reached.handover = true;
                        } else if l.released {
                            reached.graceful_release = true;
                        } else {
                            reached.lock_delay_win = true;
                        }
                    }
                    *l = Lease {
                        holder: p,
                        ..Lease::default()
                    };
                }
                TraceEvent::JobCancelled { run, reason } => {
                    if *reason == Reason::ValidityExpired {
                        reached.validity_cancel = true;
                    }
                    let lease = runs.get(&(line.process, *run));
                    let l = lease.and_then(|name| leases.get_mut(name));
                    if let Some(l) = l.filter(|l| l.holder == line.process) {
                        l.handed_over |= *reason == Reason::HandedOver;
                    }
                }
                TraceEvent::Machine(Event::Released { lease, .. }) => {
                    if let Some(l) = leases.get_mut(lease.name()) {
                        if l.holder == line.process {
                            l.released = true;
                        }
                    }
                }
                TraceEvent::Machine(Event::HandedOver {
                    requested: false, ..
                }) => reached.rebalance = true,
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
            validity_cancel: self.validity_cancel || other.validity_cancel,
            rebalance: self.rebalance || other.rebalance,
            drop_while_releasing: self.drop_while_releasing || other.drop_while_releasing,
        }
    }
}

/// What an exploration found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Schedules run to their end (or their first violation).
    pub schedules: u64,
    /// Runs stopped at a state visited before ([`Model::visited`]).
    pub pruned: u64,
    /// States in the visited set.
    pub states: u64,
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
    /// Every schedule of the bound was explored (not stopped at a
    /// counterexample, a limit or a time budget).
    pub complete: bool,
}

/// Explores every schedule of `model` depth-first, stopping at the first
/// counterexample if `stop_at_first`, or after `limit` schedules.
pub fn explore(model: &Model, stop_at_first: bool, limit: Option<u64>) -> Outcome {
    explore_within(model, stop_at_first, limit, None)
}

/// [`explore`], stopping after `budget` of wall time if given
/// ([`Outcome::complete`] says whether it explored every schedule).
pub fn explore_within(
    model: &Model,
    stop_at_first: bool,
    limit: Option<u64>,
    budget: Option<Duration>,
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    let mut prefix: Schedule = Vec::new();
    let mut visited = model.visited.then(std::collections::HashSet::new);
    loop {
        let run =
            replay_visiting(model, &prefix, visited.as_mut()).unwrap_or_else(|e| panic!("{e}"));
        if run.pruned {
            out.pruned += 1;
        } else {
            out.schedules += 1;
        }
        // The nodes this run adds below the prefix it was asked for.
        out.prefixes += (run.schedule.len() + 1).saturating_sub(prefix.len().max(1)) as u64;
        out.depth = out.depth.max(run.schedule.len());
        out.reached = out.reached.or(Reached::of(&run.report));
        let failed = run.failed();
        // The next sibling of the deepest choice that has one left.
        let mut next = run.schedule.clone();
        let arity = run.arity.clone();
        if failed && out.counterexample.is_none() {
            out.counterexample = Some(run);
        }
        while let Some(last) = next.pop() {
            if last + 1 < arity[next.len()] {
                next.push(last + 1);
                break;
            }
        }
        if next.is_empty() {
            out.complete = true;
            break;
        }
        if (failed && stop_at_first)
            || limit.is_some_and(|l| out.schedules >= l)
            || budget.is_some_and(|b| start.elapsed() >= b)
        {
            break;
        }
        prefix = next;
    }
    out.elapsed = start.elapsed();
    out.states = visited.map_or(0, |v| v.len() as u64);
    out
}
