//! A run future: contends through the core and polls the job inside itself.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use lease_proto::RunRejected;
use lease_proto::{Input, JobExit, LeaseId, NameError, Outcome, Reason, RunId};

use tracing::instrument::{Instrument, Instrumented};

use crate::cancel::Cancel;
use crate::shared::Inner;
use crate::{Locker, RunError};

/// The lease a job runs under, handed to each call of the job.
///
/// Cheap to clone; `Send + Sync`. One `Lease` belongs to one acquisition: if
/// the lease is lost and won again, the job is called again with a new one.
#[derive(Clone)]
#[must_use = "a Lease tells the job whether it may act: check `is_valid` or await `cancelled`"]
pub struct Lease {
    inner: Arc<Inner>,
    run: RunId,
    id: LeaseId,
    token: i64,
    cancel: Arc<Cancel>,
}

impl Lease {
    /// The lease name (`key:<key>` for raw keys).
    pub fn name(&self) -> &str {
        self.id.name()
    }

    /// The advisory-lock key.
    pub fn key(&self) -> i64 {
        self.id.key()
    }

    /// The fencing token of this acquisition: larger than every earlier
    /// acquisition's for this key on this server. Pass it to the systems the
    /// job writes to, so that they can reject a stale leader.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Until when the lease is valid unless the locker confirms it again; the
    /// job must not act past it. `None` once the lease is cancelled or lost.
    pub fn valid_until(&self) -> Option<Instant> {
        let s = self.inner.lock();
        if self.is_cancelled() {
            return None;
        }
        s.machine.valid_until(self.run)
    }

    /// Whether the lease is held and valid now. Check it before each action
    /// that must not overlap another replica's.
    pub fn is_valid(&self) -> bool {
        let s = self.inner.lock();
        !self.is_cancelled() && s.machine.is_valid(self.run, self.inner.now())
    }

    /// Whether the job was asked to stop: the lease was lost, or shutdown or
    /// close was asked, or the run is over.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.reason().is_some()
    }

    /// Resolves when the job must stop, with why ([`Reason::Closed`] if the
    /// run is already over). The job should then return promptly: the key is
    /// released only after it has.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future loses nothing (use it in `select!`
    /// freely); a later call resolves with the same reason.
    pub async fn cancelled(&self) -> Reason {
        self.cancel.wait().await
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name())
            .field("key", &self.key())
            .field("token", &self.token)
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// Tells the core a dropped run was abandoned (after the job future, which is
/// declared later, was dropped); the driver then releases its key.
struct Guard<'a> {
    inner: &'a Inner,
    run: RunId,
    finished: bool,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let mut s = self.inner.lock();
        s.slots.remove(&self.run);
        if !self.finished {
            let exit = JobExit::Abandoned;
            s.input(Input::JobExited {
                run: self.run,
                exit,
            });
        }
    }
}

/// The body of [`Locker::run_lease`](crate::Locker::run_lease). Holds a
/// `Locker` clone: the driver outlives every run.
pub(crate) async fn run<A, S, F, Fut, E>(
    locker: Locker<A>,
    lease: Result<LeaseId, NameError>,
    shutdown: S,
    mut job: F,
) -> Result<(), RunError<E>>
where
    S: Future<Output = ()>,
    F: FnMut(Lease) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let lease = lease.map_err(RunError::Name)?;
    let inner = locker.inner();
    let run = inner.lock().register(lease).map_err(|e| match e {
        RunRejected::AlreadyRunning(lease) => RunError::AlreadyRunning(lease),
        RunRejected::TooManyLeases { cap } => RunError::TooManyLeases { cap },
        RunRejected::Refused(refusal) => RunError::Refused(refusal),
        RunRejected::GroupWithoutNotify(lease) => RunError::GroupWithoutNotify(lease),
    })?;
    let mut guard = Guard {
        inner,
        run,
        finished: false,
    };
    let mut shutdown = pin!(Some(shutdown));
    let mut current = pin!(None::<Instrumented<Fut>>);
    let mut error = None;
    let outcome = poll_fn(|cx| loop {
        if let Some(signal) = shutdown.as_mut().as_pin_mut() {
            if signal.poll(cx).is_ready() {
                shutdown.set(None);
                inner.input(Input::Shutdown { run });
            }
        }
        if let Some(job) = current.as_mut().as_pin_mut() {
            if let Poll::Ready(result) = job.poll(cx) {
                current.set(None);
                let exit = match result {
                    Ok(()) => JobExit::Ok,
                    Err(e) => {
                        error = Some(e);
                        JobExit::Failed
                    }
                };
                inner.input(Input::JobExited { run, exit });
            }
        }
        let mut s = inner.lock();
        let driver_gone = s.driver_gone;
        let Some(slot) = s.slots.get_mut(&run) else {
            return Poll::Ready(None);
        };
        if let Some(outcome) = slot.outcome.take() {
            return Poll::Ready(Some(outcome));
        }
        if let Some(start) = slot.start.take() {
            drop(s);
            // A start whose lease is already cancelled (this run's shutdown
            // signal, a loss, a close: all before this poll) or that no
            // driver keeps valid is no start: the job is not called, and the
            // core hears that it returned at once.
            if driver_gone {
                continue;
            }
            if start.cancel.reason().is_some() {
                inner.input(Input::JobExited {
                    run,
                    exit: JobExit::Ok,
                });
                continue;
            }
            let (id, token, cancel) = (start.lease, start.token, start.cancel);
            let span = job_span(run, &id, token);
            let lease = Lease {
                inner: inner.clone(),
                run,
                id,
                token,
                cancel,
            };
            // The span is entered for the call, every poll and the drop.
            let future = span.in_scope(|| job(lease));
            current.set(Some(future.instrument(span)));
            continue;
        }
        // Nobody will finish this run: return once the job has.
        if driver_gone && current.is_none() {
            return Poll::Ready(None);
        }
        slot.waker = Some(cx.waker().clone());
        return Poll::Pending;
    })
    .await;
    guard.finished = outcome.is_some();
    match outcome {
        None => Err(RunError::DriverStopped),
        Some(Outcome::Failed) => error.map_or(Ok(()), |e| Err(RunError::Job(e))),
        Some(Outcome::Refused(refusal)) => Err(RunError::Refused(refusal)),
        Some(Outcome::Config(error)) => Err(RunError::Config(error)),
        Some(Outcome::Completed | Outcome::Cancelled | Outcome::Closed | Outcome::Abandoned) => {
            Ok(())
        }
    }
}

/// The span every log line of a job carries: `job{lease=… key=… run=… token=…}`.
fn job_span(run: RunId, lease: &LeaseId, token: i64) -> tracing::Span {
    tracing::info_span!(
        "job",
        lease = lease.name(),
        key = lease.key(),
        run = run.0,
        token
    )
}
