//! What the machine asks its driver to do, drained by
//! [`Machine::poll_output`](crate::Machine::poll_output): the order rule, in
//! one place.
//!
//! Rules push what they decide as they decide it; [`Outputs::pop`] hands it
//! out in the order the driver must carry it out:
//!
//! 1. **Run commands** (start or cancel a job, finish a run) first. A job
//!    won on a session is started before any session command of the same
//!    step could close that session, and a cancellation reaches the job
//!    before the statement that follows it is sent.
//! 2. **Session commands** (open, query, close) next, in the order decided.
//! 3. **Events** (logs, metrics) last: they ask for no action.
//!
//! A run command a driver's own handling causes (a job that exits at once,
//! reported as an input) is again handed out before the session commands
//! still queued. A driver has one loop, `while let Some(o) =
//! machine.poll_output()`, and cannot get the order wrong.

use std::collections::VecDeque;

use crate::io::{Event, Output, RunCommand, SessionCommand};

/// The queued outputs, one queue per class (see the module's doc).
#[derive(Debug, Default)]
pub(super) struct Outputs {
    run: VecDeque<RunCommand>,
    session: VecDeque<SessionCommand>,
    events: VecDeque<Event>,
}

impl Outputs {
    pub(super) fn run(&mut self, c: RunCommand) {
        self.run.push_back(c);
    }

    pub(super) fn session(&mut self, c: SessionCommand) {
        self.session.push_back(c);
    }

    pub(super) fn event(&mut self, e: Event) {
        self.events.push_back(e);
    }

    /// No command is queued (events may be).
    pub(super) fn no_commands(&self) -> bool {
        self.run.is_empty() && self.session.is_empty()
    }

    /// The next output by the order rule, or `None`.
    pub(super) fn pop(&mut self) -> Option<Output> {
        if let Some(c) = self.run.pop_front() {
            return Some(Output::Run(c));
        }
        if let Some(c) = self.session.pop_front() {
            return Some(Output::Session(c));
        }
        self.events.pop_front().map(Output::Event)
    }
}

#[cfg(test)]
impl Outputs {
    /// Takes the queued run commands and events (the run table's tests).
    pub(super) fn take_runs_and_events(&mut self) -> (Vec<RunCommand>, Vec<Event>) {
        (
            self.run.drain(..).collect(),
            self.events.drain(..).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{Outcome, RunId, SessionId};

    #[test]
    fn runs_come_before_sessions_and_sessions_before_events() {
        let mut o = Outputs::default();
        let event = Event::SessionOpening {
            session: SessionId(1),
            failures: 0,
        };
        o.event(event.clone());
        o.session(SessionCommand::Close {
            session: SessionId(1),
        });
        o.run(RunCommand::Finish {
            run: RunId(1),
            outcome: Outcome::Closed,
        });
        o.run(RunCommand::Finish {
            run: RunId(2),
            outcome: Outcome::Closed,
        });
        let order: Vec<&str> = std::iter::from_fn(|| o.pop())
            .map(|out| match out {
                Output::Run(RunCommand::Finish { run: RunId(1), .. }) => "run 1",
                Output::Run(_) => "run 2",
                Output::Session(_) => "session",
                Output::Event(_) => "event",
            })
            .collect();
        assert_eq!(order, ["run 1", "run 2", "session", "event"]);
    }
}
