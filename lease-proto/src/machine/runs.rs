//! What happens to runs: job exits, stops, wins, losses, releases.

use std::time::Instant;

use super::state::{Held, Release, RunState, Standby, StandbyStep, Stopping};
use super::{Machine, Timer};
use crate::io::*;

impl Machine {
    pub(super) fn job_exited(&mut self, id: RunId, exit: JobExit) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let key = run.lease.key();
        match &run.state {
            RunState::Leading(_) | RunState::Stopping(Stopping::Held { .. }) => {
                let outcome = match (exit, &run.state) {
                    (JobExit::Abandoned, _) => Outcome::Abandoned,
                    (_, RunState::Stopping(Stopping::Held { outcome, .. })) => outcome.clone(),
                    (JobExit::Ok, _) => Outcome::Completed,
                    (JobExit::Failed, _) => Outcome::Failed,
                };
                run.state = RunState::Releasing {
                    outcome,
                    release: Release::Queued,
                };
                self.update_validity();
            }
            RunState::Stopping(Stopping::Lost { outcome }) => {
                match (exit, outcome.clone()) {
                    (JobExit::Abandoned, _) => self.finish(id, Outcome::Abandoned),
                    (_, Some(outcome)) => self.finish(id, outcome),
                    // Lost, and the job returned: contend again, restart on the next win.
                    (_, None) => run.state = RunState::Standby(Standby::new()),
                }
                // Found held again while the job ran: unlock it now (releases
                // go before tries, so it is never locked twice).
                if self.held_lost.remove(&key) {
                    self.orphans.insert(key);
                }
            }
            RunState::Standby(_) if exit == JobExit::Abandoned => {
                self.finish(id, Outcome::Abandoned)
            }
            RunState::Standby(_) | RunState::Releasing { .. } => {}
        }
    }

    /// Shutdown, close or refusal of one run: it ends with `outcome` once its
    /// job (if any) returned. The first stop of a run decides its outcome.
    pub(super) fn stop_run(&mut self, id: RunId, outcome: Outcome, reason: Reason) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        match &mut run.state {
            // A try in flight that wins for a finished run leaves an unknown
            // key: the reply handler unlocks it.
            RunState::Standby(_) => self.finish(id, outcome),
            RunState::Leading(held) => {
                let held = held.clone();
                run.state = RunState::Stopping(Stopping::Held { held, outcome });
                self.run_command(RunCommand::CancelJob { run: id, reason });
            }
            RunState::Stopping(Stopping::Lost { outcome: then }) => {
                then.get_or_insert(outcome);
            }
            RunState::Stopping(Stopping::Held { .. }) | RunState::Releasing { .. } => {}
        }
    }

    /// A try won `key` with `token`; the try was sent at `sent`.
    pub(super) fn won(&mut self, now: Instant, sent: Instant, key: i64, token: i64) {
        let validity = self.opts.validity_window();
        let run = self.keys.get(&key).copied();
        match run.and_then(|id| self.runs.get_mut(&id).map(|r| (id, r))) {
            Some((id, r)) if r.state.is_trying() => {
                r.state = RunState::Leading(Held {
                    token,
                    since: now,
                    confirmed: sent,
                });
                let lease = r.lease.clone();
                self.event(Event::Acquired {
                    run: id,
                    lease: lease.clone(),
                    token,
                });
                self.run_command(RunCommand::StartJob {
                    run: id,
                    lease,
                    token,
                    valid_until: sent + validity,
                });
                self.update_validity();
            }
            // Won for a run that is gone (shut down or closed while trying):
            // unlock it.
            _ => {
                self.orphans.insert(key);
            }
        }
    }

    /// A try did not win `key`; `holder` is who holds it, if `pg_locks` said.
    pub(super) fn not_won(&mut self, key: i64, holder: Option<i64>) {
        let Some(&id) = self.keys.get(&key) else {
            return;
        };
        let Some(r) = self.runs.get_mut(&id) else {
            return;
        };
        if let RunState::Standby(standby) = &mut r.state {
            if standby.step == StandbyStep::Trying {
                standby.step = StandbyStep::Waiting;
                if standby.holder != Some(holder) {
                    standby.holder = Some(holder);
                    let lease = r.lease.clone();
                    self.event(Event::Waiting {
                        run: id,
                        lease,
                        holder_pid: holder,
                    });
                }
            }
        }
    }

    /// Runs whose try got no usable answer go back to waiting.
    pub(super) fn try_back(&mut self, keys: &[i64]) {
        for key in keys {
            if let Some(r) = self.keys.get(key).and_then(|id| self.runs.get_mut(id)) {
                if let RunState::Standby(standby) = &mut r.state {
                    standby.step = StandbyStep::Waiting;
                }
            }
        }
    }

    /// The key of `id` is lost (or suspected lost): its job is cancelled,
    /// unless a stop cancelled it already.
    pub(super) fn lose_lease(&mut self, id: RunId, reason: Reason) {
        let Some(r) = self.runs.get_mut(&id) else {
            return;
        };
        let cancel = match &r.state {
            RunState::Leading(_) => {
                r.state = RunState::Stopping(Stopping::Lost { outcome: None });
                true
            }
            RunState::Stopping(Stopping::Held { outcome, .. }) => {
                let outcome = Some(outcome.clone());
                r.state = RunState::Stopping(Stopping::Lost { outcome });
                false
            }
            _ => return,
        };
        let lease = r.lease.clone();
        self.event(Event::Lost {
            run: id,
            lease,
            reason: reason.clone(),
        });
        if cancel {
            self.run_command(RunCommand::CancelJob { run: id, reason });
        }
        self.update_validity();
    }

    pub(super) fn released(&mut self, id: RunId, outcome: Outcome) {
        if let Some(r) = self.runs.get(&id) {
            let lease = r.lease.clone();
            self.event(Event::Released { run: id, lease });
            self.finish(id, outcome);
        }
    }

    pub(super) fn finish(&mut self, id: RunId, outcome: Outcome) {
        if let Some(r) = self.runs.remove(&id) {
            self.keys.remove(&r.lease.key());
            self.run_command(RunCommand::Finish { run: id, outcome });
        }
    }

    /// Sets [`Timer::Validity`] to the earliest validity end of a key held
    /// for a job that has not returned. Called wherever such a key is won,
    /// confirmed, lost or released.
    pub(super) fn update_validity(&mut self) {
        let end = self.earliest_validity_end();
        self.timers.put(Timer::Validity, end);
    }

    pub(super) fn earliest_validity_end(&self) -> Option<Instant> {
        let confirmed = self.runs.values().filter_map(|r| r.state.held());
        let earliest = confirmed.map(|held| held.confirmed).min()?;
        Some(earliest + self.opts.validity_window())
    }

    pub(super) fn any_waiting(&self) -> bool {
        self.runs.values().any(|r| r.state.is_waiting())
    }
}
