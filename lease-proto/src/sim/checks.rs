//! The properties the simulator checks as it runs, and their breaches as
//! [`Violation`] values.
//!
//! - strong safety ([`Violation::TwoLeaders`]): no instant at which two live
//!   processes may act on the same key. A job may act from its start until
//!   it has returned, cancelled or not (jobs take time to stop:
//!   [`SimConfig::job_reaction`](super::SimConfig::job_reaction)); while its
//!   process is frozen, only as long as its lease is valid by the process's
//!   clock. Not counted: a job whose process was frozen past its validity,
//!   which acts on resume until it has stopped, a limit no core can beat
//!   (the fencing token is the remedy);
//! - release after exit ([`Violation::ReleaseWhileJobRuns`]);
//! - the watch session never acquires: it sends nothing but waits
//!   ([`Violation::WatchNotAWait`]);
//! - the run contract: every run finishes exactly once
//!   ([`Violation::NeverFinished`], [`Violation::FinishedTwice`]), never while
//!   its job runs, with the outcome the contract gives
//!   ([`Violation::ContractOutcome`]); a dropped run never starts a job again
//!   ([`Violation::DroppedRunStarted`]);
//! - no leaks ([`Violation::LockLeaked`]);
//! - fencing tokens: every acquisition's token is above every earlier one
//!   of its lease ([`Violation::TokenNotIncreasing`]), across server crashes
//!   and promotions, in the order the server granted them (not the order
//!   jobs start: a holder that hears of its grant late starts after a later
//!   grant's job, with the smaller token, which is what fences it out);
//! - progress: the simulated driver never spins on a deadline that does not
//!   move ([`Violation::Stalled`]).
//!
//! Overlap (the same two processes acting on a key, validity aside) is
//! measured here too, into [`Report::max_overlap`](super::Report::max_overlap).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::{Sim, TraceEvent};
use crate::{Outcome, RunId, RunRejected};

/// A property breach found by the simulator.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Violation {
    /// Strong safety: these processes all had a job on `lease` that may act
    /// (started and not yet returned, cancelled or not; see the module docs),
    /// at the same instant.
    TwoLeaders {
        /// When.
        at: Duration,
        /// The lease name.
        lease: String,
        /// The processes (two or more).
        processes: Vec<usize>,
    },
    /// Release after exit: `process` sent an unlock of `key` while a job
    /// holding it still ran.
    ReleaseWhileJobRuns {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// The advisory key.
        key: i64,
    },
    /// `process` sent a statement other than a wait on its watch session,
    /// which never acquires (nor unlocks).
    WatchNotAWait {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// The statement, as `Debug` text.
        statement: String,
    },
    /// The machine rejected one of the simulation's runs ([`RunRejected`]).
    RunRejected {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// The lease name.
        lease: String,
        /// Why.
        error: RunRejected,
    },
    /// A run the process never started was finished.
    UnknownRunFinished {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// The run.
        run: RunId,
    },
    /// A run was finished twice.
    FinishedTwice {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// The run.
        run: RunId,
    },
    /// A job was started for a run whose future the embedder dropped
    /// ([`Fault::Abandon`](super::Fault::Abandon)): the driver has nowhere
    /// to start it, so its key is held for nothing.
    DroppedRunStarted {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// The run.
        run: RunId,
    },
    /// A run was finished while its job still ran.
    FinishedWhileJobRuns {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// The run.
        run: RunId,
    },
    /// A run finished with an outcome the contract does not give.
    ContractOutcome {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// The lease name.
        lease: String,
        /// The outcome the run finished with.
        got: Outcome,
        /// The outcome the contract gives: `Abandoned` for a run whose
        /// future was dropped, else that of the job that returned by itself
        /// while leading, if one did.
        expected: Option<Outcome>,
    },
    /// A run of a live process never finished, though the simulation closed
    /// every machine and settled.
    NeverFinished {
        /// The process.
        process: usize,
        /// The run.
        run: RunId,
        /// The lease name.
        lease: String,
    },
    /// Every run returned but the server still holds these keys.
    LockLeaked {
        /// The advisory keys held.
        keys: Vec<i64>,
    },
    /// A fencing token not above every token granted earlier for its lease
    /// (across every process, session, server crash and promotion), checked
    /// when the server grants it.
    TokenNotIncreasing {
        /// When the server granted it.
        at: Duration,
        /// The process whose try was granted it.
        process: usize,
        /// The lease name.
        lease: String,
        /// The token.
        token: i64,
        /// The largest earlier token of the lease.
        previous: i64,
    },
    /// The process's deadline did not move after the driver woke at it, tick
    /// after tick at the same instant: a real driver would spin there. The
    /// simulator stops arming that process's timer.
    Stalled {
        /// When.
        at: Duration,
        /// The process.
        process: usize,
        /// How many wake-ups in a row found the next deadline already due.
        wakeups: u32,
    },
}

impl Violation {
    /// When it happened, for breaches found while running (`None` for the
    /// checks made at the end).
    pub fn at(&self) -> Option<Duration> {
        match self {
            Violation::TwoLeaders { at, .. }
            | Violation::ReleaseWhileJobRuns { at, .. }
            | Violation::WatchNotAWait { at, .. }
            | Violation::RunRejected { at, .. }
            | Violation::UnknownRunFinished { at, .. }
            | Violation::FinishedTwice { at, .. }
            | Violation::DroppedRunStarted { at, .. }
            | Violation::FinishedWhileJobRuns { at, .. }
            | Violation::ContractOutcome { at, .. }
            | Violation::Stalled { at, .. }
            | Violation::TokenNotIncreasing { at, .. } => Some(*at),
            Violation::NeverFinished { .. } | Violation::LockLeaked { .. } => None,
        }
    }

    /// Whether this is a breach of strong safety, the property that only
    /// holds while the server does not end sessions itself
    /// ([`Fault::server_ends_sessions`](super::Fault::server_ends_sessions)).
    pub fn is_safety(&self) -> bool {
        matches!(self, Violation::TwoLeaders { .. })
    }

    /// The breach without its time.
    pub(super) fn what(&self) -> String {
        match self {
            Violation::TwoLeaders {
                lease, processes, ..
            } => format!("safety: {processes:?} all have a job acting on {lease}"),
            Violation::ReleaseWhileJobRuns { process, key, .. } => {
                format!("p{process} releases key {key} while its job still runs")
            }
            Violation::WatchNotAWait {
                process, statement, ..
            } => format!("p{process} sent {statement} on its watch session, which only waits"),
            Violation::RunRejected {
                process,
                lease,
                error,
                ..
            } => format!("p{process} could not start run {lease}: {error}"),
            Violation::UnknownRunFinished { process, run, .. } => {
                format!("p{process} finished unknown run {run:?}")
            }
            Violation::FinishedTwice { process, run, .. } => {
                format!("p{process} finished run {run:?} twice")
            }
            Violation::DroppedRunStarted { process, run, .. } => {
                format!("p{process} started a job for run {run:?}, whose future was dropped")
            }
            Violation::FinishedWhileJobRuns { process, run, .. } => {
                format!("p{process} finished run {run:?} while its job runs")
            }
            Violation::ContractOutcome {
                process,
                lease,
                got,
                expected,
                ..
            } => format!("p{process} run {lease} finished {got:?}, contract expects {expected:?}"),
            Violation::NeverFinished {
                process,
                run,
                lease,
            } => format!("contract: run {run:?} ({lease}) of p{process} never finished"),
            Violation::LockLeaked { keys } => {
                format!("leak: every run returned but the server still holds {keys:?}")
            }
            Violation::TokenNotIncreasing {
                process,
                lease,
                token,
                previous,
                ..
            } => format!(
                "p{process} granted {lease} with token {token}, not above the earlier {previous}"
            ),
            Violation::Stalled {
                process, wakeups, ..
            } => format!(
                "p{process} stalled: {wakeups} wake-ups in a row found its next deadline already due"
            ),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at() {
            Some(at) => write!(f, "at {:.3}ms: {}", at.as_secs_f64() * 1e3, self.what()),
            None => f.write_str(&self.what()),
        }
    }
}

impl std::error::Error for Violation {}

/// The outcome the contract gives a run, from the outcome the job's own
/// return (if it returned by itself while leading) asks for. A run whose
/// future was `dropped` ends `Abandoned`, whatever came before the drop.
pub(super) fn outcome_allowed(
    got: &Outcome,
    expected: Option<&Outcome>,
    closing: bool,
    dropped: bool,
) -> bool {
    if dropped {
        return *got == Outcome::Abandoned;
    }
    match (got, expected) {
        (Outcome::Completed | Outcome::Failed, Some(e)) => got == e,
        (Outcome::Completed | Outcome::Failed, None) => false,
        (Outcome::Closed, _) => closing,
        (Outcome::Refused(_), _) => true,
        // The simulated setups are configured right: a configuration error
        // there is a bug (a transient error classified as configuration).
        (Outcome::Config(_), _) => false,
        (Outcome::Cancelled | Outcome::Abandoned, _) => false,
    }
}

/// Which of a process's jobs count.
#[derive(Debug, Clone, Copy)]
enum Acting {
    /// Uncancelled, with a lease valid by the process's clock: a leader.
    ValidLease,
    /// May act, for strong safety: not returned, not stale, and while the
    /// process is frozen only with a valid lease.
    MayAct,
    /// Not returned and not frozen, for the overlap measure.
    Running,
}

impl Sim {
    /// Records a breach: in the trace, and in the report (the first 50).
    /// The token check of a grant by the server (see
    /// [`Violation::TokenNotIncreasing`]).
    pub(super) fn check_token(&mut self, process: usize, lease: &str, token: i64) {
        let previous = self.max_token.get(lease).copied();
        if let Some(previous) = previous.filter(|p| token <= *p) {
            self.violation(Violation::TokenNotIncreasing {
                at: self.now,
                process,
                lease: lease.to_string(),
                token,
                previous,
            });
        }
        let max = previous.map_or(token, |p| p.max(token));
        self.max_token.insert(lease.to_string(), max);
    }

    pub(super) fn violation(&mut self, v: Violation) {
        self.trace(None, TraceEvent::Violation(v.clone()));
        if self.report.violations.len() < 50 {
            self.report.violations.push(v);
        }
    }

    /// Processes with a running, uncancelled job whose lease is valid by
    /// their own clock now.
    pub(super) fn valid_leaders(&self, key: i64) -> Vec<usize> {
        (0..self.procs.len())
            .filter(|p| self.job_keys(*p, Acting::ValidLease).any(|k| k == key))
            .collect()
    }

    /// Keys process `p` has a job on, in the sense of `acting`.
    fn job_keys(&self, p: usize, acting: Acting) -> impl Iterator<Item = i64> + '_ {
        let proc_ = &self.procs[p];
        let now = self.local(p);
        let valid =
            move |run: &RunId, cancelled: bool| !cancelled && proc_.machine.is_valid(*run, now);
        proc_
            .jobs
            .iter()
            .filter(move |(run, j)| {
                proc_.alive
                    && match acting {
                        Acting::ValidLease => valid(run, j.cancelled),
                        Acting::MayAct if proc_.frozen => !j.stale && valid(run, j.cancelled),
                        Acting::MayAct => !j.stale,
                        Acting::Running => !proc_.frozen,
                    }
            })
            .map(|(_, j)| j.key)
    }

    /// Strong safety now, and the overlap measure.
    pub(super) fn check_safety(&mut self) {
        let mut may_act: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        let mut running: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for p in 0..self.procs.len() {
            for k in self.job_keys(p, Acting::MayAct) {
                may_act.entry(k).or_default().push(p);
            }
            for k in self.job_keys(p, Acting::Running) {
                running.entry(k).or_default().push(p);
            }
        }
        for (key, leaders) in may_act {
            if leaders.len() > 1 {
                let lease = self.key_names.get(&key).cloned().unwrap_or_default();
                self.violation(Violation::TwoLeaders {
                    at: self.now,
                    lease,
                    processes: leaders,
                });
            }
        }
        // Overlap: two processes have a job on a key that has not returned
        // (cancelled or not), neither frozen, validity aside; measured per
        // pair of processes (a stale holder acts at most its validity window
        // past its last confirmation, whoever else leads meanwhile).
        let both = |key: &i64, a: usize, b: usize| {
            running
                .get(key)
                .is_some_and(|ps| ps.contains(&a) && ps.contains(&b))
        };
        for (key, ps) in &running {
            for (i, &a) in ps.iter().enumerate() {
                for &b in &ps[i + 1..] {
                    self.overlap_since.entry((*key, a, b)).or_insert(self.now);
                }
            }
        }
        let ended: Vec<(i64, usize, usize)> = (self.overlap_since.keys())
            .filter(|(k, a, b)| !both(k, *a, *b))
            .copied()
            .collect();
        for pair in ended {
            let Some(since) = self.overlap_since.remove(&pair) else {
                continue;
            };
            let name = self.key_names.get(&pair.0).cloned().unwrap_or_default();
            let m = self.report.max_overlap.entry(name).or_default();
            *m = (*m).max(self.now - since);
        }
    }

    /// The checks at the end: every run of a live process finished; no lock
    /// left once every run returned.
    pub(super) fn check_end(&mut self) {
        for (p, proc_) in self.procs.iter().enumerate() {
            if !proc_.alive {
                continue;
            }
            for (run, name) in &proc_.runs {
                if !proc_.finished.contains(run) {
                    self.report.violations.push(Violation::NeverFinished {
                        process: p,
                        run: *run,
                        lease: name.clone(),
                    });
                }
            }
        }
        let held = self.server.held_keys();
        if !held.is_empty()
            && self
                .procs
                .iter()
                .all(|p| !p.alive || p.finished.len() == p.runs.len())
        {
            self.report
                .violations
                .push(Violation::LockLeaked { keys: held });
        }
    }
}
