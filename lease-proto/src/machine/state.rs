//! The internal states of a run and of the session. The top-level names are
//! those of the public [`LeaseState`](super::LeaseState) and
//! [`SessionState`](super::SessionState); where one public state covers
//! several internal ones, the internal ones are its sub-states.

use std::time::Instant;

use crate::io::{Outcome, QueryId, Reason, Refusal, SessionId};
use crate::key::LeaseId;

/// Whether the machine takes new work.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Phase {
    Open,
    /// [`Input::Close`](crate::Input::Close) came: runs are stopped, new ones
    /// finish at once.
    Closing,
    /// Final: the setup cannot give mutual exclusion.
    Refused(Refusal),
}

#[derive(Debug)]
pub(super) struct Run {
    pub(super) lease: LeaseId,
    pub(super) state: RunState,
}

/// What one run is doing.
#[derive(Debug)]
pub(super) enum RunState {
    /// Not held, no job.
    Standby(Standby),
    /// Held; the job runs.
    Leading(Held),
    /// The job was cancelled; waiting for it to return.
    Stopping(Stopping),
    /// The job returned; the key is held until the unlock answers.
    Releasing {
        /// What the run finishes with once released.
        outcome: Outcome,
        release: Release,
    },
}

impl RunState {
    /// In standby and not in the try in flight: the next try includes it.
    pub(super) fn is_waiting(&self) -> bool {
        matches!(
            self,
            RunState::Standby(Standby {
                step: StandbyStep::Waiting,
                ..
            })
        )
    }

    /// In standby and in the try in flight.
    pub(super) fn is_trying(&self) -> bool {
        matches!(
            self,
            RunState::Standby(Standby {
                step: StandbyStep::Trying,
                ..
            })
        )
    }

    /// The key's confirmation, while the session holds it for this run and
    /// its job has not returned.
    pub(super) fn held(&self) -> Option<&Held> {
        match self {
            RunState::Leading(held) | RunState::Stopping(Stopping::Held { held, .. }) => Some(held),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub(super) struct Standby {
    pub(super) step: StandbyStep,
    /// The holder the last answered try of this standby reported (`None`:
    /// no try answered yet; `Some(None)`: `pg_locks` did not show it).
    pub(super) holder: Option<Option<i64>>,
}

impl Standby {
    pub(super) fn new() -> Standby {
        Standby {
            step: StandbyStep::Waiting,
            holder: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StandbyStep {
    /// The next try includes this key.
    Waiting,
    /// In the try in flight.
    Trying,
}

/// A key the session holds for a run.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) token: i64,
    /// The reply's arrival.
    pub(super) since: Instant,
    /// Send time of the last statement that confirmed the key.
    pub(super) confirmed: Instant,
}

#[derive(Debug)]
pub(super) enum Stopping {
    /// Shutdown, close or refusal while leading: the key is still held (and
    /// confirmed by heartbeats, and timed by its validity) until the job
    /// returns; then it is released and the run finishes with `outcome`.
    Held { held: Held, outcome: Outcome },
    /// The lease was lost: the key is not held. When the job returns the run
    /// finishes with `outcome`, or stands by again if there is none.
    Lost { outcome: Option<Outcome> },
}

/// The unlock of a releasing run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    /// Goes into the next release statement.
    Queued,
    /// In the release statement in flight.
    Sent,
}

/// The session.
#[derive(Debug)]
pub(super) enum Session {
    /// No connection, none asked for yet: the next one may start at once.
    Idle,
    /// No connection after a failure: the next attempt waits for
    /// [`Timer::Backoff`](super::Timer::Backoff).
    Backoff,
    /// [`SessionCommand::Open`](crate::SessionCommand::Open) sent; timed by
    /// [`Timer::Connect`](super::Timer::Connect).
    Connecting { id: SessionId },
    /// Connected.
    Up(Up),
    /// Given up on by the machine (a statement timed out, failed or broke
    /// its rules; a validity ended) while jobs on it had not returned: see
    /// `doubtful`. Nothing is sent on it and its replies are ignored; it is
    /// closed once every job has returned or at
    /// [`Timer::DeferredClose`](super::Timer::DeferredClose).
    Doubtful {
        id: SessionId,
        /// Why the machine gave up on it.
        reason: Reason,
    },
}

#[derive(Debug)]
pub(super) struct Up {
    pub(super) id: SessionId,
    /// Set as [`NONCE_SETTING`](crate::sql::NONCE_SETTING) by the setup and
    /// expected back in every heartbeat.
    pub(super) nonce: i64,
    pub(super) stage: Stage,
    /// The statement in flight, timed by [`Timer::Query`](super::Timer::Query).
    pub(super) inflight: Option<InFlight>,
}

/// How far a connected session got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// The setup statement runs.
    SettingUp,
    /// Setup passed (its settings went by statement: a pooler rejected the
    /// startup options); the pooler probe runs on a second connection.
    Probing {
        backend_pid: i64,
        server_version: i64,
    },
    /// Setup passed; `LISTEN` runs.
    Listening { backend_pid: i64 },
    /// In use: heartbeats, tries and releases.
    Ready { backend_pid: i64 },
}

impl Stage {
    pub(super) fn backend_pid(self) -> Option<i64> {
        match self {
            Stage::SettingUp => None,
            Stage::Probing { backend_pid, .. }
            | Stage::Listening { backend_pid }
            | Stage::Ready { backend_pid } => Some(backend_pid),
        }
    }
}

/// A statement sent and not answered yet.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) id: QueryId,
    pub(super) sent: Instant,
    pub(super) what: What,
}

/// What a statement in flight was, with what its reply needs.
#[derive(Debug)]
pub(super) enum What {
    Setup,
    /// The pooler probe ([`SessionCommand::Probe`](crate::SessionCommand::Probe)).
    Probe,
    Listen,
    Try(Vec<i64>),
    Heartbeat,
    Verify,
    Release(Vec<i64>),
    /// A [`Statement::Wait`](crate::Statement::Wait) for `key`, ended by the
    /// server after `timeout` at the latest.
    Wait {
        key: i64,
        timeout: std::time::Duration,
        /// Its timeout was cut below the retry deadline by the server's
        /// `deadlock_timeout` (see `wait`): a chunk of the retry interval.
        chunk: bool,
    },
}
