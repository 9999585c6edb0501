//! [`Locker::try_run`]: a job that runs only if its lease is won in time, and at
//! most once.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Mutex;

use crate::shared::lock;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use lease_proto::{LeaseId, LeaseState, NameError, SessionError, SessionState};

use crate::{Lease, Locker, RunError};

/// How a [`Locker::try_run`] ended without an error: the job ran, or why it
/// did not.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tried {
    /// The lease was won in time and the job ran (once) and returned `Ok`,
    /// whether it completed or returned early because its lease was
    /// cancelled (lost, shut down, closed: the job's [`Lease::cancelled`]
    /// said which).
    Ran,
    /// The lease was not won in time (another session holds it): the job did
    /// not run. `holder_pid`: the holder's backend pid as the last try saw it
    /// in `pg_locks`; `None` when no try was answered, when `pg_locks` did
    /// not show the holder, or when the win came too late to start the job
    /// in time (still in its [`Options::lock_delay`](crate::Options::lock_delay)
    /// at the deadline: the key was released). Look the pid up in
    /// `pg_stat_activity` (or `lease status NAME`) to name the holder.
    Held {
        /// The holder's backend pid, if a try saw it.
        holder_pid: Option<i64>,
    },
    /// No session could be opened in time (the server down or unreachable):
    /// the job did not run. `last_error`: the last connection error, if any.
    /// A configuration error (a wrong password) is
    /// [`RunError::Config`] instead, as for [`Locker::run`].
    Unreachable {
        /// The error of the last failed connection attempt.
        last_error: Option<SessionError>,
    },
    /// The shutdown signal ([`Locker::try_run_until`]) resolved, or the
    /// locker was closed, before the lease was won: the job did not run.
    Shutdown,
}

impl Tried {
    /// Whether the job ran.
    pub fn ran(&self) -> bool {
        matches!(self, Tried::Ran)
    }
}

/// How often a try with no wait reads the locker's state for its first
/// answered try (a holder seen, or a failed connection).
const FIRST_TRY_POLL: Duration = Duration::from_millis(5);

impl<A> Locker<A> {
    /// Runs `job` once if the lease `name` is won within `wait`, and returns
    /// without running it otherwise: `Ok(`[`Tried::Ran`]`)`, or
    /// `Ok(`[`Tried::Held`]`)` (with the holder's backend pid when a try saw
    /// it), `Ok(`[`Tried::Unreachable`]`)`. For a job that every replica
    /// starts at the same time (cron, CI) and that must run on one of them.
    ///
    /// `wait`: how long to contend, from the first poll of the returned
    /// future. [`Duration::ZERO`]: the first try decides (it gives up as soon
    /// as a try finds another holder, or a connection attempt fails before
    /// any session opened; at the latest after two
    /// [`Options::query_timeout`](crate::Options::query_timeout)s, one
    /// connection and one try).
    ///
    /// A win whose start is still held back at the deadline (a try that won
    /// during [`Options::lock_delay`](crate::Options::lock_delay)) does not
    /// run the job: the key is released. The job runs at most once: when its
    /// lease is lost while it runs, it is cancelled as under [`Locker::run`],
    /// and once it returned, the run ends (it does not stand by again). Its
    /// error is [`RunError::Job`], whether or not the lease was still held.
    ///
    /// # Errors
    /// As [`Locker::run`]: the job's error, a bad name, a refusal, a
    /// configuration error, a stopped driver.
    ///
    /// # Cancel safety
    /// As [`Locker::run`]: dropping the future drops the job and releases
    /// the key; [`Locker::try_run_until`]'s shutdown is the graceful way.
    #[must_use = "the run does nothing unless awaited or spawned"]
    pub fn try_run<F, Fut, E>(
        &self,
        name: &str,
        wait: Duration,
        job: F,
    ) -> impl Future<Output = Result<Tried, RunError<E>>>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        self.try_run_until(name, wait, std::future::pending(), job)
    }

    /// [`Locker::try_run`] with a graceful shutdown signal: before the win,
    /// the try ends at once with [`Tried::Shutdown`]; while the job runs, its
    /// lease is cancelled and the run waits for it to return
    /// ([`Tried::Ran`]).
    ///
    /// # Errors
    /// As [`Locker::try_run`].
    ///
    /// # Cancel safety
    /// As [`Locker::try_run`].
    #[must_use = "the run does nothing unless awaited or spawned"]
    pub fn try_run_until<S, F, Fut, E>(
        &self,
        name: &str,
        wait: Duration,
        shutdown: S,
        job: F,
    ) -> impl Future<Output = Result<Tried, RunError<E>>>
    where
        S: Future<Output = ()>,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        try_run(self.clone(), LeaseId::named(name), wait, shutdown, job)
    }

    /// [`Locker::try_run_until`] for any [`LeaseId`] (a raw key shared with
    /// other code: [`LeaseId::raw`]). Pass `std::future::pending()` for no
    /// shutdown signal.
    ///
    /// # Errors
    /// As [`Locker::try_run`].
    ///
    /// # Cancel safety
    /// As [`Locker::try_run`].
    #[must_use = "the run does nothing unless awaited or spawned"]
    pub fn try_run_lease<S, F, Fut, E>(
        &self,
        lease: LeaseId,
        wait: Duration,
        shutdown: S,
        job: F,
    ) -> impl Future<Output = Result<Tried, RunError<E>>>
    where
        S: Future<Output = ()>,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        try_run(self.clone(), Ok(lease), wait, shutdown, job)
    }
}

/// Where a try stands.
enum Phase {
    /// The job may still start.
    Deciding,
    /// The job was called.
    Started,
    /// The job returned: the run ends (it does not stand by again).
    Done,
    /// Decided without running the job.
    NotRun(Tried),
}

/// Shared by the run's shutdown signal and the job's wrapper (both polled by
/// the run future: one task).
struct State<F, E> {
    phase: Phase,
    job: Option<F>,
    /// The job's error (kept here: a run whose lease was lost drops it).
    error: Option<E>,
    /// The run future's task, woken when the job returned.
    waker: Option<Waker>,
}

/// The body of [`Locker::try_run_lease`]: [`Locker::run_lease`] with a
/// shutdown signal that ends the run at the deadline (before the job started)
/// or once the job returned, and a job that starts once, only while
/// deciding.
async fn try_run<A, S, F, Fut, E>(
    locker: Locker<A>,
    lease: Result<LeaseId, NameError>,
    wait: Duration,
    shutdown: S,
    job: F,
) -> Result<Tried, RunError<E>>
where
    S: Future<Output = ()>,
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let lease = lease.map_err(RunError::Name)?;
    let key = lease.key();
    let runtime = locker.handle.runtime.clone();
    let inner = locker.inner().clone();
    let query_timeout = inner.lock().machine.options().query_timeout;
    let state = Mutex::new(State {
        phase: Phase::Deciding,
        job: Some(job),
        error: None,
        waker: None,
    });
    let state = &state;
    let mut user_shutdown = pin!(shutdown);
    let mut timer: Option<(Instant, Pin<Box<dyn crate::Timer>>)> = None;
    let mut had_session = false;
    let stop = poll_fn(move |cx| {
        let mut st = lock(state);
        if matches!(st.phase, Phase::Done | Phase::NotRun(_)) {
            return Poll::Ready(());
        }
        if user_shutdown.as_mut().poll(cx).is_ready() {
            if matches!(st.phase, Phase::Deciding) {
                st.phase = Phase::NotRun(Tried::Shutdown);
            }
            return Poll::Ready(());
        }
        if matches!(st.phase, Phase::Deciding) {
            let now = runtime.now();
            let (deadline, timer) = match &mut timer {
                Some((deadline, timer)) => (*deadline, timer),
                None => {
                    let wait = if wait.is_zero() {
                        2 * query_timeout
                    } else {
                        wait
                    };
                    // `Duration::MAX` (wait for ever) and its like: a year.
                    let year = Duration::from_secs(365 * 86_400);
                    let deadline = (now.checked_add(wait)).unwrap_or_else(|| now + year);
                    let t = timer.insert((deadline, runtime.timer(deadline)));
                    (deadline, &mut t.1)
                }
            };
            loop {
                let now = runtime.now();
                if let Some(tried) = decide(&inner, key, wait, now >= deadline, &mut had_session) {
                    st.phase = Phase::NotRun(tried);
                    return Poll::Ready(());
                }
                let next = if wait.is_zero() {
                    (now + FIRST_TRY_POLL).min(deadline)
                } else {
                    deadline
                };
                timer.as_mut().reset(next);
                if timer.as_mut().poll(cx).is_pending() {
                    break;
                }
            }
        }
        st.waker = Some(cx.waker().clone());
        Poll::Pending
    });
    let run = locker.run_lease(lease, stop, move |lease: Lease| {
        let job = {
            let mut st = lock(state);
            // A lease cancelled before the job starts (lost at once) is no
            // start: the try goes on.
            if matches!(st.phase, Phase::Deciding) && !lease.is_cancelled() {
                st.phase = Phase::Started;
                st.job.take()
            } else {
                None
            }
        };
        async move {
            let Some(job) = job else {
                return Ok(());
            };
            let result = job(lease).await;
            let mut st = lock(state);
            st.phase = Phase::Done;
            let failed = result.err().map(|e| st.error = Some(e)).is_some();
            if let Some(waker) = st.waker.take() {
                waker.wake();
            }
            if failed {
                Err(())
            } else {
                Ok(())
            }
        }
    });
    let result = run.await;
    let mut st = lock(state);
    if let Some(e) = st.error.take() {
        return Err(RunError::Job(e));
    }
    match result {
        Ok(()) => Ok(match std::mem::replace(&mut st.phase, Phase::Done) {
            Phase::Started | Phase::Done => Tried::Ran,
            Phase::NotRun(tried) => tried,
            // Ended before a decision: the locker was closed.
            Phase::Deciding => Tried::Shutdown,
        }),
        // The job's error was taken above.
        Err(e) => Err(e.map_job(|()| RunError::DriverStopped)),
    }
}

/// Whether a try still deciding gives up now, and why; `deadline`: its wait
/// is over. Without a wait, the first answered try decides: a holder seen,
/// or a connection attempt that failed before any session (a configuration
/// error ends the run by itself, as [`RunError::Config`]).
fn decide(
    inner: &crate::shared::Inner,
    key: i64,
    wait: Duration,
    deadline: bool,
    had_session: &mut bool,
) -> Option<Tried> {
    let status = inner.lock().machine.status();
    let holder = status.leases.iter().find_map(|l| match l.state {
        LeaseState::Standby { holder_pid } if l.lease.key() == key => holder_pid,
        _ => None,
    });
    let last_error = status.last_error.map(|e| e.error);
    match status.session {
        SessionState::Ready { .. } => *had_session = true,
        SessionState::Backoff { .. }
            if wait.is_zero()
                && !*had_session
                && !last_error
                    .as_ref()
                    .is_some_and(SessionError::is_configuration) =>
        {
            return Some(Tried::Unreachable { last_error });
        }
        _ => {}
    }
    if wait.is_zero() && holder.is_some() {
        return Some(Tried::Held { holder_pid: holder });
    }
    if deadline {
        let tried = if *had_session || holder.is_some() {
            Tried::Held { holder_pid: holder }
        } else {
            Tried::Unreachable { last_error }
        };
        return Some(tried);
    }
    None
}
