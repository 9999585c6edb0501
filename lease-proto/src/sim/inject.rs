//! Statement faults ([`Fault::FlakyStatements`](super::Fault::FlakyStatements)):
//! a statement that fails after it ran in part, in whole or not at all, and
//! a reply that breaks its statement's rules. The server model asks
//! [`Sim::inject`] before it runs each statement, runs what [`Injected::ran`]
//! leaves of it, and sends what [`Injected::reply`] makes of its result.

use super::{rand, Sim};
use crate::{reply::Row, SessionError, Statement};

/// One statement fault in force.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Flaky {
    /// Probability that a statement fails.
    pub(super) error: f64,
    /// Probability that a reply is malformed.
    pub(super) malformed: f64,
}

/// What happens to one statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Injected {
    /// Nothing: it runs and answers.
    Nothing,
    /// It runs its first `ran` keys (a try or an unlock; any other statement
    /// runs if `ran > 0`), then answers with an error.
    Error {
        /// Keys (or statements) that ran before the error.
        ran: usize,
    },
    /// It runs in whole; its reply keeps only its first `kept` rows and gets
    /// a row of no valid shape.
    Malformed {
        /// Rows kept.
        kept: usize,
    },
}

impl Sim {
    /// Draws what happens to `statement` under the statement faults in force.
    pub(super) fn inject(&mut self, statement: &Statement) -> Injected {
        if self.flaky.is_empty() {
            return Injected::Nothing;
        }
        let either = |f: fn(&Flaky) -> f64, all: &[Flaky]| {
            1.0 - all
                .iter()
                .map(|x| 1.0 - f(x).clamp(0.0, 1.0))
                .product::<f64>()
        };
        let error = either(|f| f.error, &self.flaky);
        let malformed = either(|f| f.malformed, &self.flaky);
        let keys = match statement {
            Statement::TryLock { keys, .. } | Statement::Release { keys, .. } => keys.len(),
            Statement::Members { join, .. } => join.len().max(1),
            Statement::Setup { .. }
            | Statement::Listen
            | Statement::Heartbeat
            | Statement::Verify
            | Statement::Prefer { .. }
            | Statement::CheckHandover { .. }
            | Statement::Wait { .. }
            | Statement::Take { .. } => 1,
        };
        if self.chance(error) {
            let ran = self.below(keys);
            Injected::Error { ran }
        } else if self.chance(malformed) {
            let kept = self.below(keys + 1);
            Injected::Malformed { kept }
        } else {
            Injected::Nothing
        }
    }

    /// Uniform in `0..=n`.
    fn below(&mut self, n: usize) -> usize {
        (rand(&mut self.rng) % (n as u64 + 1)) as usize
    }
}

impl Injected {
    /// What of `statement` runs on the server. A statement that fails
    /// before it did anything runs as a heartbeat, which changes nothing
    /// and costs the server what a statement does.
    pub(super) fn ran(self, statement: Statement) -> Statement {
        let Injected::Error { ran } = self else {
            return statement;
        };
        match statement {
            Statement::TryLock {
                mut keys,
                backend_pid,
                nonce,
            } if ran > 0 => {
                keys.truncate(ran);
                Statement::TryLock {
                    keys,
                    backend_pid,
                    nonce,
                }
            }
            Statement::Release {
                mut keys,
                notify,
                reserved,
            } if ran > 0 => {
                keys.truncate(ran);
                Statement::Release {
                    keys,
                    notify,
                    reserved,
                }
            }
            // The joins ran, in part: no read answers.
            Statement::Members {
                mut join, notify, ..
            } if ran > 0 => {
                join.truncate(ran);
                Statement::Members {
                    join,
                    leave: Vec::new(),
                    groups: Vec::new(),
                    keys: Vec::new(),
                    notify,
                    announce: Vec::new(),
                    claims: Vec::new(),
                }
            }
            // Its notification is sent at commit: a failed one sends none.
            Statement::Prefer { .. } => Statement::Heartbeat,
            other if ran > 0 => other,
            _ => Statement::Heartbeat,
        }
    }

    /// The reply the client gets, and the keys whose release notifies (none
    /// for a failed statement: `NOTIFY` is transactional).
    pub(super) fn reply(
        self,
        statement: &Statement,
        result: Result<Vec<Row>, SessionError>,
        notify: Vec<String>,
    ) -> (Result<Vec<Row>, SessionError>, Vec<String>) {
        match self {
            Injected::Nothing => (result, notify),
            Injected::Error { .. } => (Err(error_for(statement)), Vec::new()),
            Injected::Malformed { kept } => {
                let result = result.map(|mut rows| {
                    rows.truncate(kept);
                    // No statement's reply has a row like this one.
                    rows.push(vec![None, None, None, None]);
                    rows
                });
                (result, notify)
            }
        }
    }
}

/// The error a failed statement answers with.
fn error_for(statement: &Statement) -> SessionError {
    match statement {
        Statement::TryLock { .. } | Statement::Release { .. } => SessionError {
            code: Some("53200".into()),
            message: "out of shared memory (HINT: You might need to increase \
                      max_locks_per_transaction.)"
                .into(),
            config: false,
        },
        Statement::Setup { .. }
        | Statement::Listen
        | Statement::Heartbeat
        | Statement::Verify
        | Statement::Members { .. }
        | Statement::Prefer { .. }
        | Statement::CheckHandover { .. }
        | Statement::Wait { .. }
        | Statement::Take { .. } => SessionError {
            code: Some("57014".into()),
            message: "canceling statement due to user request".into(),
            config: false,
        },
    }
}
