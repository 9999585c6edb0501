//! The public snapshot of the machine: [`Machine::status`](super::Machine::status).

use std::time::Instant;

use crate::io::{Refusal, RunId, SessionError};
use crate::key::LeaseId;

/// The state of the session, for [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionState {
    /// No session, none needed.
    Idle,
    /// Waiting before the next connection attempt.
    Backoff {
        /// When the next attempt starts.
        until: Instant,
        /// Consecutive failures so far.
        failures: u32,
    },
    /// Connecting.
    Connecting,
    /// Connected; setup statements run.
    SettingUp,
    /// In use.
    Ready {
        /// The server's backend pid.
        backend_pid: i64,
    },
    /// Given up on by the machine (a statement timed out, failed or broke
    /// its rules, or a validity ended) while cancelled jobs on it still run:
    /// its leases are lost and nothing is sent on it, but it stays open,
    /// holding its locks, until those jobs have returned or `close_by`, the
    /// first moment the server could free its keys anyway (send time of its
    /// last statement plus `idle_session_timeout`). Then it is closed and a
    /// new session opens.
    Doubtful {
        /// When it is closed at the latest.
        close_by: Instant,
    },
    /// The setup was refused; see [`Refusal`].
    Refused(Refusal),
}

/// What one run is doing, for [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseState {
    /// Waiting for the lease (or for a try's answer).
    Standby {
        /// The holder's backend pid the last try of this standby saw, when
        /// `pg_locks` showed it; `None` before the first answered try.
        holder_pid: Option<i64>,
    },
    /// Leading: the job runs.
    Leading {
        /// The fencing token.
        token: i64,
        /// When it was acquired (the reply's arrival).
        since: Instant,
        /// Until when it is valid unless confirmed again.
        valid_until: Instant,
    },
    /// The job was cancelled (the lease is lost, or the run shuts down);
    /// waiting for it to return.
    Stopping,
    /// The job returned; the lease is being released.
    Releasing,
}

/// One run in [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The run.
    pub run: RunId,
    /// Its lease.
    pub lease: LeaseId,
    /// What it does.
    pub state: LeaseState,
}

/// The last error that failed a connection attempt or ended a session, for
/// [`Status::last_error`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastError {
    /// When the machine learnt of it.
    pub at: Instant,
    /// What it was: the driver's or the server's error, or the machine's own
    /// words for a timeout or a broken rule.
    pub error: SessionError,
    /// Whether it came from a connection attempt (the session never opened)
    /// rather than ending an open session.
    pub connecting: bool,
}

/// A snapshot of the machine, from [`Machine::status`](super::Machine::status).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The session.
    pub session: SessionState,
    /// Every run, in run order.
    pub leases: Vec<LeaseStatus>,
    /// The last error that failed a connection attempt or ended a session,
    /// and when; `None` before any. Kept after the next session is ready
    /// (compare `at` with the time of the [`SessionState::Ready`] you saw):
    /// while [`SessionState::Backoff`] counts failures, this says why.
    pub last_error: Option<LastError>,
}
