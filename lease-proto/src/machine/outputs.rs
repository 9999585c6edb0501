//! The machine's three output queues, drained by `Machine::poll_run`,
//! `Machine::poll_session` and `Machine::poll_event`: what a rule decides to
//! do goes through them, in the order it was decided.

use std::collections::VecDeque;

use crate::io::{Event, RunCommand, SessionCommand};

/// The three output queues (see the module's doc).
#[derive(Debug, Default)]
pub(super) struct Outputs {
    pub(super) run: VecDeque<RunCommand>,
    pub(super) session: VecDeque<SessionCommand>,
    pub(super) events: VecDeque<Event>,
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
}
