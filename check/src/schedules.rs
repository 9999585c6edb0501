//! Schedules: every interleaving, within bounds, of the production
//! [`Planner`]s of two replicas of one schedule as leadership moves between
//! them, on the server's time in whole milliseconds.
//!
//! The state is both planners, who leads (and since when), the running job of
//! each, the state table's record (when the model has one) and the time. The
//! actions, at each step:
//!
//! - **wake**: time moves to the leader's next wake (its reading of the
//!   server's clock is off by its clock error), and it polls;
//! - **finish**: the leader's running job ends;
//! - **takeover**: the leader's lease ends and, after a gap from
//!   [`ScheduleModel::gaps`], the other replica leads, reading the server's
//!   clock with an error from [`ScheduleModel::errors`] (each error is
//!   also its reading's error for the rest of its term).
//!
//! The properties: no due time starts on both replicas (with a table, a
//! start needs the claim the state table would give: a due time later than
//! the record's, by the newest leader); one run at a time on each; and, as a
//! "sometimes" property, a takeover at a due time is reached. Depth-first
//! over every action sequence to [`ScheduleModel::steps`] steps.

use lease_proto::schedule::{Action, Occurrence, Planner, Policy, Record, Spec};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A configuration of the schedule model and its bounds.
#[derive(Debug, Clone)]
pub struct ScheduleModel {
    /// `--every`, in milliseconds.
    pub period_ms: u64,
    /// The policy both replicas run.
    pub policy: Policy,
    /// Whether starts are claimed in a state table first.
    pub table: bool,
    /// The readings' errors a new leader may have, in milliseconds.
    pub errors: Vec<i64>,
    /// The gaps between one lease's end and the next grant, in milliseconds.
    pub gaps: Vec<u64>,
    /// Steps per action sequence.
    pub steps: usize,
}

/// What an exploration found.
#[derive(Debug, Clone, Default)]
pub struct ScheduleOutcome {
    /// Action sequences explored to the end.
    pub sequences: u64,
    /// Starts seen, over all sequences.
    pub starts: u64,
    /// Takeovers within a period of a due time.
    pub takeovers_at_due_times: u64,
    /// The first counterexample: the actions, and what broke.
    pub counterexample: Option<(Vec<String>, String)>,
}

#[derive(Clone)]
struct World {
    planners: [Planner; 2],
    /// The clock error of each replica's readings (ms).
    error: [i64; 2],
    leader: Option<usize>,
    now: SystemTime,
    running: [Option<Occurrence>; 2],
    started: Vec<(SystemTime, usize)>,
    record: Option<Record>,
    /// The replica whose token is newest in the table (the last to lead).
    newest: usize,
}

impl World {
    fn reading(&self, who: usize, t: SystemTime) -> SystemTime {
        shift(t, self.error[who])
    }

    /// Polls the leader at the true time `self.now`.
    fn poll(&mut self, model: &ScheduleModel) -> Result<(), String> {
        let Some(who) = self.leader else {
            return Ok(());
        };
        let at = self.reading(who, self.now);
        for _ in 0..1_000 {
            let Some(action) = self.planners[who].poll(at) else {
                return Ok(());
            };
            match action {
                Action::Start(o) => {
                    let claimed = !model.table
                        || (self.newest == who && self.record.is_none_or(|r| o.due > r.due));
                    if !claimed {
                        self.planners[who].finished(o.due);
                        continue;
                    }
                    if self.running[who].is_some() {
                        return Err(format!("p{who} started {o:?} beside another run"));
                    }
                    if let Some((_, other)) = self.started.iter().find(|(d, _)| *d == o.due) {
                        return Err(format!("{o:?} started on p{who} and on p{other}"));
                    }
                    self.started.push((o.due, who));
                    self.running[who] = Some(o);
                    if model.table {
                        self.record = Some(Record {
                            due: o.due,
                            finished: false,
                            started: true,
                        });
                    }
                }
                Action::Stop(o) => {
                    if self.running[who] != Some(o) {
                        return Err(format!("p{who} stopped {o:?}, which does not run"));
                    }
                }
                Action::Skip(..) => {}
            }
        }
        Err(format!("p{who}'s planner never ran out of actions"))
    }

    fn finish(&mut self, who: usize) {
        if let Some(o) = self.running[who].take() {
            self.planners[who].finished(o.due);
            if let Some(r) = self.record.as_mut().filter(|r| r.due == o.due) {
                r.finished = true;
            }
        }
    }
}

fn shift(t: SystemTime, ms: i64) -> SystemTime {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms < 0 {
        t - d
    } else {
        t + d
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Wake,
    Finish,
    Takeover { gap: u64, error: i64 },
}

impl ScheduleModel {
    fn options(&self) -> Vec<Step> {
        let mut out = vec![Step::Wake, Step::Finish];
        for &gap in &self.gaps {
            for &error in &self.errors {
                out.push(Step::Takeover { gap, error });
            }
        }
        out
    }

    fn apply(&self, w: &mut World, step: Step) -> Result<bool, String> {
        match step {
            Step::Wake => {
                let Some(who) = w.leader else {
                    return Ok(false);
                };
                // The true time at which its reading shows its next wake.
                let Some(wake) = w.planners[who].wake_at() else {
                    return Ok(false);
                };
                let at = shift(wake, -w.error[who]);
                if at > w.now {
                    w.now = at;
                }
                w.poll(self)?;
                Ok(true)
            }
            Step::Finish => {
                let Some(who) = w.leader else {
                    return Ok(false);
                };
                if w.running[who].is_none() {
                    return Ok(false);
                }
                w.finish(who);
                w.poll(self)?;
                Ok(true)
            }
            Step::Takeover { gap, error } => {
                let old = w.leader.unwrap_or(1);
                if w.leader.is_some() {
                    w.planners[old].resign();
                    // Its job stops with the lease.
                    w.finish(old);
                    let at = w.reading(old, w.now);
                    while w.planners[old].poll(at).is_some() {}
                }
                let new = 1 - old;
                w.now += Duration::from_millis(gap);
                w.error[new] = error;
                w.leader = Some(new);
                w.newest = new;
                let at = w.reading(new, w.now);
                if self.table {
                    w.planners[new].lead_recorded(at, w.record, false);
                } else {
                    w.planners[new].lead(at);
                }
                w.poll(self)?;
                Ok(true)
            }
        }
    }

    /// Every action sequence to [`ScheduleModel::steps`] steps.
    pub fn explore(&self) -> ScheduleOutcome {
        let spec = Spec::every(Duration::from_millis(self.period_ms)).expect("a period");
        // 30 ms before a due time, the first replica leads.
        let start = UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 - 30);
        let mut first = Planner::new("checked", spec.clone(), self.policy);
        first.lead(start);
        let world = World {
            planners: [first, Planner::new("checked", spec, self.policy)],
            error: [0, 0],
            leader: Some(0),
            now: start,
            running: [None, None],
            started: Vec::new(),
            record: None,
            newest: 0,
        };
        let mut out = ScheduleOutcome::default();
        let mut path = Vec::new();
        self.dfs(world, &mut path, &mut out);
        out
    }

    fn dfs(&self, w: World, path: &mut Vec<String>, out: &mut ScheduleOutcome) {
        if out.counterexample.is_some() {
            return;
        }
        if path.len() == self.steps {
            out.sequences += 1;
            out.starts += w.started.len() as u64;
            return;
        }
        let mut moved = false;
        for step in self.options() {
            let mut next = w.clone();
            let near_due = matches!(step, Step::Takeover { .. }) && {
                let p = self.period_ms as u128;
                let ms = w
                    .now
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis();
                let to_due = p - ms % p;
                to_due <= 100 || ms % p <= 100
            };
            path.push(format!("{step:?}"));
            match self.apply(&mut next, step) {
                Ok(true) => {
                    moved = true;
                    if near_due {
                        out.takeovers_at_due_times += 1;
                    }
                    self.dfs(next, path, out);
                }
                Ok(false) => {}
                Err(e) => {
                    out.counterexample = Some((path.clone(), e));
                    path.pop();
                    return;
                }
            }
            path.pop();
        }
        if !moved {
            out.sequences += 1;
            out.starts += w.started.len() as u64;
        }
    }
}
