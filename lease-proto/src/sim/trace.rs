//! The typed trace: what happened, to whom, when.
//!
//! Every line is a [`TraceLine`] holding a [`TraceEvent`] value, so tests
//! assert on fields (`matches!(l.event, TraceEvent::JobExited { .. })`);
//! [`Report::trace_text`](super::Report::trace_text) renders the lines for
//! failure output.

use std::fmt;
use std::time::Duration;

use super::{Fault, Violation};
use crate::{Event, JobExit, Outcome, Reason, RunId};

/// One line of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceLine {
    /// Virtual time since the start.
    pub at: Duration,
    /// The process, if any (`None`: server or fault).
    pub process: Option<usize>,
    /// What happened.
    pub event: TraceEvent,
}

/// What happened at one point of a simulation.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TraceEvent {
    /// The process's machine emitted this event.
    Machine(Event),
    /// The simulated driver started a job.
    JobStarted {
        /// The run.
        run: RunId,
        /// The lease name.
        lease: String,
        /// The fencing token.
        token: i64,
        /// How long the lease is valid from now, by the process's clock.
        valid_for: Duration,
    },
    /// A job returned (by itself, or after its cancellation).
    JobExited {
        /// The run.
        run: RunId,
        /// The lease name.
        lease: String,
        /// How it returned.
        exit: JobExit,
    },
    /// The driver cancelled a job.
    JobCancelled {
        /// The run.
        run: RunId,
        /// Why.
        reason: Reason,
    },
    /// A run finished.
    RunFinished {
        /// The run.
        run: RunId,
        /// The lease name.
        lease: String,
        /// How.
        outcome: Outcome,
    },
    /// The server ended a session (on close, kill, terminate or restart):
    /// its locks are gone.
    SessionEnded {
        /// The backend pid.
        pid: i64,
    },
    /// The server ended a session actively and told the client.
    SessionKilled {
        /// The SQLSTATE sent.
        code: String,
        /// The message sent.
        message: String,
    },
    /// A scheduled fault began.
    Fault(Fault),
    /// The process's link works again; held bytes flow.
    PartitionHealed,
    /// The frozen process runs again.
    Resumed,
    /// The crashed process started again.
    Restarted,
    /// A property was broken.
    Violation(Violation),
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceEvent::Machine(e) => write!(f, "{e:?}"),
            TraceEvent::JobStarted {
                lease,
                token,
                valid_for,
                ..
            } => write!(
                f,
                "job {lease} starts, token {token}, valid {:.1}ms",
                valid_for.as_secs_f64() * 1e3
            ),
            TraceEvent::JobExited { lease, exit, .. } => write!(f, "job {lease} exits {exit:?}"),
            TraceEvent::JobCancelled { run, reason } => {
                write!(f, "job of {run:?} cancelled: {reason}")
            }
            TraceEvent::RunFinished { lease, outcome, .. } => {
                write!(f, "run {lease} finished: {outcome:?}")
            }
            TraceEvent::SessionEnded { pid } => write!(f, "server: session pid {pid} ended"),
            TraceEvent::SessionKilled { message, .. } => write!(f, "server: {message}"),
            TraceEvent::Fault(fault) => write!(f, "FAULT {fault:?}"),
            TraceEvent::PartitionHealed => f.write_str("partition healed"),
            TraceEvent::Resumed => f.write_str("resumed"),
            TraceEvent::Restarted => f.write_str("restarted"),
            TraceEvent::Violation(v) => write!(f, "VIOLATION {}", v.what()),
        }
    }
}

/// Renders lines as `time  process  event`, one a line.
pub(super) fn render(lines: &[TraceLine]) -> String {
    use fmt::Write as _;
    let mut s = String::new();
    for l in lines {
        let p = l.process.map_or("  -".into(), |p| format!("p{p:<2}"));
        let _ = writeln!(s, "{:>10.3}ms {p} {}", l.at.as_secs_f64() * 1e3, l.event);
    }
    s
}
