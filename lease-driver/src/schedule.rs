//! Schedules (feature `schedule`): [`Locker::schedule`] runs a job at each due
//! time of a [`Schedule`], on the replica that holds the schedule's lease, on
//! the database server's clock. The rules (due times, overlap, catch-up, a
//! takeover) are lease-proto's [`lease_proto::schedule`]; their guide is
//! docs/schedules.md of the repository.

use std::convert::Infallible;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::shared::lock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use event_listener::Event;
use lease_proto::schedule::{Action, Estimate, Planner, CLOCK_SAMPLES};
pub use lease_proto::schedule::{CatchUp, Missed, Overlap, Policy, Spec, SpecError};
use lease_proto::{LeaseId, NameError, Reason, SessionError};
use tokio_postgres::config::TargetSessionAttrs;
use tracing::Instrument;

use crate::runtime::Runtime;
use crate::{Config, Lease, Locker, RunError};

/// When a scheduled job is due, and what its leader does when runs overlap,
/// are late or were missed: lease-proto's [`Spec`] and [`Policy`]
/// (docs/schedules.md has every rule).
#[derive(Debug, Clone)]
pub struct Schedule {
    spec: Spec,
    policy: Policy,
}

impl Schedule {
    /// Every multiple of `period` since the Unix epoch, on the server's clock
    /// (`every 15m` is due at :00, :15, :30 and :45 UTC), from 1 s to 365 days.
    ///
    /// # Errors
    /// A period out of that range.
    pub fn every(period: Duration) -> Result<Schedule, SpecError> {
        Spec::every(period).map(Schedule::new)
    }

    /// When the cron expression `expr` (five fields, or six with seconds
    /// first) matches the wall time of the IANA zone `zone` (`None`: UTC),
    /// with the daylight saving time rules of docs/schedules.md.
    ///
    /// # Errors
    /// An expression or zone that does not parse.
    pub fn cron(expr: &str, zone: Option<&str>) -> Result<Schedule, SpecError> {
        Spec::cron(expr, zone).map(Schedule::new)
    }

    /// The due times of `spec`, with the default policy: no jitter, an
    /// overlapping due time skipped, no catch-up.
    pub fn new(spec: Spec) -> Schedule {
        Schedule {
            spec,
            policy: Policy::default(),
        }
    }

    /// Each run starts a fixed delay under `max` after its due time, the
    /// same on every replica ([`lease_proto::schedule::jitter`]). Keep it
    /// shorter than the shortest gap between due times.
    ///
    /// # Errors
    /// A jitter not shorter than an `every` period, or above a day
    /// ([`Policy::check`]).
    pub fn jitter(mut self, max: Duration) -> Result<Schedule, SpecError> {
        self.policy.jitter = max;
        self.policy.check(&self.spec)?;
        Ok(self)
    }

    /// What a due time does while the previous run still goes (default:
    /// [`Overlap::Skip`]). With [`Overlap::Replace`] the running job's
    /// [`Occurrence::stopped`] resolves with [`Stopped::Replaced`]; the next
    /// run starts once it returned.
    pub fn overlap(mut self, overlap: Overlap) -> Schedule {
        self.policy.overlap = overlap;
        self
    }

    /// What a new leader runs of the due times in `window` before its grant
    /// (default: none). Without a state table a window is at-least-once for
    /// the due times it covers: the old leader may have run them.
    ///
    /// # Errors
    /// A window above 366 days, or one that covers more than
    /// [`MAX_CATCH_UP_SCAN`](lease_proto::schedule::MAX_CATCH_UP_SCAN) due
    /// times of an `every` period ([`Policy::check`]).
    pub fn catch_up(mut self, window: Duration, policy: CatchUp) -> Result<Schedule, SpecError> {
        self.policy.catch_up_window = window;
        self.policy.catch_up = policy;
        self.policy.check(&self.spec)?;
        Ok(self)
    }

    /// The due times.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// One due time's run, handed to the job of [`Locker::schedule`].
#[derive(Clone)]
#[must_use = "an Occurrence tells the job when it was due and whether it must stop"]
pub struct Occurrence {
    name: Arc<str>,
    due: SystemTime,
    start: SystemTime,
    lease: Lease,
    replaced: Arc<Replaced>,
}

impl Occurrence {
    /// The due time, on the database server's clock.
    pub fn due(&self) -> SystemTime {
        self.due
    }

    /// When it was to start: the due time plus its jitter.
    pub fn start(&self) -> SystemTime {
        self.start
    }

    /// The run's identity, `NAME@<due time as Unix seconds>`: the same as
    /// `lease run`'s `LEASE_RUN_ID`. Pass it to what the job writes to, to
    /// make a run idempotent.
    pub fn id(&self) -> String {
        run_id(&self.name, self.due)
    }

    /// The lease the run holds: its fencing token, its validity.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Whether the job must stop: its lease was cancelled, or the next due
    /// time replaces it ([`Overlap::Replace`]).
    pub fn is_stopped(&self) -> bool {
        self.lease.is_cancelled() || self.replaced.is_set()
    }

    /// Resolves when the job must stop, with why; it should then return
    /// promptly.
    ///
    /// # Cancel safety
    /// Cancel-safe: a later call resolves the same way.
    pub async fn stopped(&self) -> Stopped {
        let mut cancelled = pin!(self.lease.cancelled());
        loop {
            let listener = self.replaced.event.listen();
            if self.replaced.is_set() {
                return Stopped::Replaced;
            }
            let mut listener = pin!(listener);
            let reason = poll_fn(|cx| {
                if let Poll::Ready(reason) = cancelled.as_mut().poll(cx) {
                    return Poll::Ready(Some(reason));
                }
                listener.as_mut().poll(cx).map(|()| None)
            })
            .await;
            if let Some(reason) = reason {
                return Stopped::Lease(reason);
            }
        }
    }
}

impl fmt::Debug for Occurrence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Occurrence")
            .field("id", &self.id())
            .field("due", &utc(self.due))
            .field("lease", &self.lease)
            .finish()
    }
}

/// Why a scheduled job must stop ([`Occurrence::stopped`]).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// Its lease was cancelled (lost, shut down, closed).
    Lease(Reason),
    /// The next due time replaces it ([`Overlap::Replace`]).
    Replaced,
}

/// The replace signal of one run.
#[derive(Default)]
struct Replaced {
    set: AtomicBool,
    event: Event,
}

impl Replaced {
    fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.event.notify(usize::MAX);
    }
}

impl<A> Locker<A> {
    /// Runs `job` at each due time of `schedule`, on the one replica that
    /// holds the lease `name`; every other replica's `schedule` of `name`
    /// stands by and takes the schedule over when the holder goes. Runs until
    /// the locker is closed (or the future dropped); see
    /// [`Locker::schedule_until`].
    ///
    /// Due times are on the database server's clock: the leader reads
    /// `clock_timestamp()` on a short connection of its own (never the lease
    /// session, which still writes nothing), the quickest of five round
    /// trips, every 10 s or sooner, and starts a run only on a reading within
    /// ±50 ms ([`lease_proto::schedule::Estimate`]). The hosts' clocks play
    /// no part. Each call of `job` gets an [`Occurrence`]: the due time, the
    /// run id (`NAME@<due as Unix seconds>`) and the [`Lease`]. The job must
    /// return promptly once [`Occurrence::stopped`] resolves. Its error is
    /// logged (`WARN`, with the run id) and ends neither the lease nor the
    /// schedule; a due time that does not run is logged once with why
    /// ([`Missed`]).
    ///
    /// **At most once, and its window.** Without a state table a new leader
    /// knows nothing of what the old one ran: it leaves every due time up to
    /// 100 ms after its grant to the old leader, so a due time starts at most
    /// once across a takeover, and one whose start falls between the old
    /// leader's last confirmed moment and the new grant (plus 100 ms) runs
    /// nowhere (tens of milliseconds after a crash or a graceful stop, the
    /// failover time after a frozen leader). A catch-up window
    /// ([`Schedule::catch_up`]) runs such due times after all,
    /// at-least-once. The durable at-most-once (a fenced claim of each due
    /// time in a state table, across crashes, deploys and frozen leaders) is
    /// `lease run --state-table` for now: the rules, and this window, are in
    /// `docs/schedules.md` of the repository ("At a takeover", "From Rust").
    ///
    /// # Errors
    /// As [`Locker::run`], but never [`RunError::Job`]: a bad name, a
    /// refusal, a configuration error, a stopped driver.
    ///
    /// # Cancel safety
    /// As [`Locker::run`]: dropping the future drops a running job and
    /// releases the key.
    #[must_use = "the schedule does nothing unless awaited or spawned"]
    pub fn schedule<F, Fut, E>(
        &self,
        name: &str,
        schedule: Schedule,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<Infallible>>>
    where
        F: FnMut(Occurrence) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        self.schedule_until(name, schedule, std::future::pending(), job)
    }

    /// [`Locker::schedule`] with a graceful shutdown signal: when `shutdown`
    /// resolves, a running job's lease is cancelled, the schedule waits for
    /// it to return, releases the key (a standby takes the schedule over at
    /// once) and returns `Ok(())`.
    ///
    /// # Errors
    /// As [`Locker::schedule`].
    ///
    /// # Cancel safety
    /// As [`Locker::schedule`].
    #[must_use = "the schedule does nothing unless awaited or spawned"]
    pub fn schedule_until<S, F, Fut, E>(
        &self,
        name: &str,
        schedule: Schedule,
        shutdown: S,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<Infallible>>>
    where
        S: Future<Output = ()>,
        F: FnMut(Occurrence) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        run_schedule(self.clone(), LeaseId::named(name), schedule, shutdown, job)
    }
}

/// What every term of a schedule's leadership shares.
struct Ctx<F> {
    name: Arc<str>,
    planner: Mutex<Planner>,
    job: Mutex<F>,
    runtime: Arc<dyn Runtime>,
    config: Config,
    read_timeout: Duration,
    clock: Arc<ServerClock>,
}

pub(crate) async fn run_schedule<A, S, F, Fut, E>(
    locker: Locker<A>,
    lease: Result<LeaseId, NameError>,
    schedule: Schedule,
    shutdown: S,
    job: F,
) -> Result<(), RunError<Infallible>>
where
    S: Future<Output = ()>,
    F: FnMut(Occurrence) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: fmt::Display,
{
    let lease = lease.map_err(RunError::Name)?;
    let name: Arc<str> = Arc::from(lease.name());
    let read_timeout = locker.inner().lock().machine.options().query_timeout;
    let ctx = Ctx {
        planner: Mutex::new(Planner::new(&name, schedule.spec, schedule.policy)),
        name,
        job: Mutex::new(job),
        runtime: locker.handle.runtime.clone(),
        config: locker.handle.config.clone(),
        read_timeout,
        clock: locker.handle.clock.clone(),
    };
    let ctx = &ctx;
    // Fused: a run may have polled the signal to its end (a shutdown during
    // the release of a lease given up), and a future is not polled again.
    let mut shutdown = pin!(shutdown);
    let mut fired = false;
    let mut shutdown = pin!(poll_fn(move |cx| {
        fired = fired || shutdown.as_mut().poll(cx).is_ready();
        if fired {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }));
    loop {
        let term = shutdown.as_mut();
        let run = crate::run::run(locker.clone(), Ok(lease.clone()), term, |lease| {
            lead(lease, ctx)
        });
        match run.await {
            Ok(()) => return Ok(()),
            Err(RunError::Job(LeadEnd::Unsupported(e))) => return Err(RunError::Config(e)),
            Err(RunError::Job(LeadEnd::ClockUnavailable)) => {
                // The lease is released: a replica that can read the clock
                // may lead. This one contends again after a pause.
                let mut pause = ctx.runtime.timer(ctx.runtime.now() + CLOCK_GIVE_UP);
                let stopped = poll_fn(|cx| {
                    if shutdown.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(true);
                    }
                    pause.as_mut().poll(cx).map(|()| false)
                })
                .await;
                if stopped {
                    return Ok(());
                }
            }
            Err(e) => return Err(not_the_job(e)),
        }
    }
}

/// A run's end that is not its job's (a schedule's job errors are logged).
fn not_the_job(e: RunError<LeadEnd>) -> RunError<Infallible> {
    e.map_job(|end| match end {
        LeadEnd::Unsupported(e) => RunError::Config(e),
        LeadEnd::ClockUnavailable => RunError::DriverStopped,
    })
}

/// How long a leader holds a schedule's lease without a usable reading of
/// the server's clock (no run can start) before it gives the lease up, so
/// that a replica that can read it leads; and how long it then waits before
/// it contends again.
const CLOCK_GIVE_UP: Duration = Duration::from_secs(30);

/// Why a term of leadership ended other than by the lease.
#[derive(Debug)]
enum LeadEnd {
    /// This runtime's sessions cannot read the server's clock
    /// ([`Session::server_time_micros`](crate::Session::server_time_micros)).
    Unsupported(SessionError),
    /// No usable reading for [`CLOCK_GIVE_UP`]: the lease is given up.
    ClockUnavailable,
}

impl fmt::Display for LeadEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeadEnd::Unsupported(e) => write!(f, "{e}"),
            LeadEnd::ClockUnavailable => f.write_str("the server's clock could not be read"),
        }
    }
}

/// The server's clock as one locker knows it, shared by all its schedules:
/// the best reading, whether a read is in flight, when to read next. A read
/// is a connection of its own, so one read serves every schedule the locker
/// leads (a thousand schedules read the clock as often as one does).
#[derive(Default)]
pub(crate) struct ServerClock {
    state: Mutex<ClockState>,
}

#[derive(Default)]
struct ClockState {
    best: Option<Estimate>,
    /// When the next read is due (`None`: at once).
    next_read: Option<Instant>,
    /// A leader is reading (see [`ReadClaim`]).
    reading: bool,
    /// The last read failed or was too imprecise (logged once per streak).
    failing: bool,
    /// Since when no reading has been usable (`None`: the last one is).
    unusable_since: Option<Instant>,
    /// The runtime's sessions cannot read the clock at all.
    unsupported: Option<SessionError>,
    /// Leaders waiting for the read in flight.
    waiters: Vec<Waker>,
}

impl ServerClock {
    /// The best reading, and when the next read is due unless one is in
    /// flight (then `cx` is woken when it ends).
    fn look(&self, cx: &Context<'_>) -> Seen {
        let mut s = lock(&self.state);
        if s.reading && !s.waiters.iter().any(|w| w.will_wake(cx.waker())) {
            s.waiters.push(cx.waker().clone());
        }
        Seen {
            best: s.best,
            next_read: (!s.reading).then_some(s.next_read),
            unusable_since: s.unusable_since,
            unsupported: s.unsupported.clone(),
        }
    }

    /// Claims the next read for the caller, if it is due and nobody reads.
    fn claim(self: &Arc<Self>, now: Instant) -> Option<ReadClaim> {
        let mut s = lock(&self.state);
        if s.reading || s.next_read.is_some_and(|t| now < t) {
            return None;
        }
        s.reading = true;
        Some(ReadClaim(Some(self.clone())))
    }

    /// A read ended: the better reading is kept, the next read planned, and
    /// the leaders waiting for it woken.
    fn read(&self, now: Instant, result: Result<Estimate, SessionError>, name: &str) {
        let mut s = lock(&self.state);
        let wait = match result {
            Ok(e) => {
                let chosen = s.best.map_or(e, |b| b.better(e, now));
                s.best = Some(chosen);
                let good = chosen.time_at(now).is_some();
                if !good && !s.failing {
                    tracing::warn!(
                        lease = name,
                        "the server's clock cannot be read within {} ms (a slow round trip): \
                         no run starts until it can",
                        lease_proto::schedule::MAX_CLOCK_ERROR.as_millis()
                    );
                }
                s.failing = !good;
                if good {
                    s.unusable_since = None;
                } else {
                    s.unusable_since.get_or_insert(now);
                }
                if good {
                    chosen.next_read()
                } else {
                    Duration::from_secs(1)
                }
            }
            Err(e) if e.code.as_deref() == Some(crate::runtime::UNSUPPORTED) => {
                tracing::error!(lease = name, "{e}: a schedule cannot run on this runtime");
                s.unsupported = Some(e);
                Duration::from_secs(3600)
            }
            Err(e) => {
                s.unusable_since.get_or_insert(now);
                if !s.failing {
                    tracing::warn!(
                        lease = name,
                        "cannot read the server's clock ({e}): no run starts until it can"
                    );
                }
                s.failing = true;
                Duration::from_secs(1)
            }
        };
        s.next_read = Some(now + wait);
        s.reading = false;
        s.waiters.drain(..).for_each(Waker::wake);
    }
}

/// What a leader reads of the shared clock ([`ServerClock::look`]).
struct Seen {
    best: Option<Estimate>,
    /// When the next read is due (`None`: one is in flight; `Some(None)`: at once).
    next_read: Option<Option<Instant>>,
    unusable_since: Option<Instant>,
    unsupported: Option<SessionError>,
}

/// The read one leader makes for all; dropped unfinished (its lease was
/// lost), the read is free again for another leader.
struct ReadClaim(Option<Arc<ServerClock>>);

impl ReadClaim {
    fn done(mut self, now: Instant, result: Result<Estimate, SessionError>, name: &str) {
        if let Some(clock) = self.0.take() {
            clock.read(now, result, name);
        }
    }
}

impl Drop for ReadClaim {
    fn drop(&mut self) {
        if let Some(clock) = self.0.take() {
            let mut s = lock(&clock.state);
            s.reading = false;
            s.waiters.drain(..).for_each(Waker::wake);
        }
    }
}

/// The job's run of one due time.
struct Running<Fut> {
    occurrence: lease_proto::schedule::Occurrence,
    replaced: Arc<Replaced>,
    future: Pin<Box<tracing::instrument::Instrumented<Fut>>>,
}

/// The schedule while its lease is held: the job at each due time, as the
/// [`Planner`] decides. Returns when the lease is cancelled (and a running
/// job returned): the planner resigns.
async fn lead<F, Fut, E>(lease: Lease, ctx: &Ctx<F>) -> Result<(), LeadEnd>
where
    F: FnMut(Occurrence) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: fmt::Display,
{
    if lease.is_cancelled() {
        return Ok(());
    }
    let rt = &ctx.runtime;
    let name = &*ctx.name;
    // This leader's read of the shared clock, when it makes it.
    let mut reading: Option<(ReadClaim, crate::BoxFuture<Result<Estimate, SessionError>>)> = None;
    let mut granted = false;
    let mut lost = false;
    let mut running: Option<Running<Fut>> = None;
    let mut cancelled = pin!(lease.cancelled());
    // A leader gives the lease up after holding it this long without a
    // usable reading, however old the locker's streak of unusable ones (an
    // outage that cost the lease): it has its own reads first.
    let since = rt.now();
    let mut timer = rt.timer(since);
    poll_fn(|cx| loop {
        let now = rt.now();
        if let Some((_, read)) = reading.as_mut() {
            if let Poll::Ready(result) = read.as_mut().poll(cx) {
                let (claim, _) = reading.take().expect("just polled");
                claim.done(now, result, name);
                continue;
            }
        } else if !lost {
            if let Some(claim) = ctx.clock.claim(now) {
                let read = read_clock(rt.clone(), ctx.config.clone(), ctx.read_timeout);
                reading = Some((claim, Box::pin(read)));
                continue;
            }
        }
        if !lost && cancelled.as_mut().poll(cx).is_ready() {
            lost = true;
            // Another leader of this locker reads the clock from now on.
            reading = None;
        }
        let seen = ctx.clock.look(cx);
        let (best, next_read) = (seen.best, seen.next_read);
        if running.is_none() {
            if let Some(e) = seen.unsupported {
                return Poll::Ready(Err(LeadEnd::Unsupported(e)));
            }
            if seen
                .unusable_since
                .is_some_and(|t| now >= t.max(since) + CLOCK_GIVE_UP)
            {
                tracing::error!(
                    lease = name,
                    "no usable reading of the server's clock for {} s: giving the lease up, so \
                     that a replica that can read it leads",
                    CLOCK_GIVE_UP.as_secs()
                );
                // As at any end of a lead: the due times from here are the
                // next leader's.
                resign(&mut lock(&ctx.planner), name);
                return Poll::Ready(Err(LeadEnd::ClockUnavailable));
            }
        }
        if let Some(run) = running.as_mut() {
            if let Poll::Ready(result) = run.future.as_mut().poll(cx) {
                let o = run.occurrence;
                let replaced = run.replaced.is_set();
                running = None;
                lock(&ctx.planner).finished(o.due);
                let id = run_id(name, o.due);
                match result {
                    Ok(()) if replaced => {
                        tracing::info!(lease = name, run_id = id, "due {}: replaced", utc(o.due))
                    }
                    Ok(()) => tracing::info!(lease = name, run_id = id, "due {}: done", utc(o.due)),
                    Err(e) => tracing::warn!(
                        lease = name,
                        run_id = id,
                        "due {}: the job failed: {e}",
                        utc(o.due)
                    ),
                }
                continue;
            }
        }
        if lost {
            if running.is_none() {
                resign(&mut lock(&ctx.planner), name);
                return Poll::Ready(Ok(()));
            }
            // The job sees its lease cancelled: wait for it to return.
            return Poll::Pending;
        }
        let server_now = best.and_then(|e| e.time_at(now));
        let mut planner = lock(&ctx.planner);
        if let (false, Some(t)) = (granted, server_now) {
            // Due times up to the grant (and the margin after it) are the
            // old leader's, or the catch-up window's.
            planner.lead(t);
            granted = true;
            if let Some(next) = planner.wake_at() {
                tracing::info!(
                    lease = name,
                    "leading the schedule: next due time {}",
                    utc(next)
                );
            } else {
                tracing::warn!(
                    lease = name,
                    "leading the schedule: no due time ahead (the expression matches no later date): \
                     nothing will run"
                );
            }
        }
        let mut started = false;
        if let (true, Some(t)) = (granted, server_now) {
            while let Some(action) = planner.poll(t) {
                match action {
                    Action::Start(o) if !lease.is_valid() => {
                        planner.finished(o.due);
                        missed(name, o, Missed::LeaseLost);
                    }
                    Action::Start(o) => {
                        let replaced = Arc::new(Replaced::default());
                        let occurrence = Occurrence {
                            name: ctx.name.clone(),
                            due: o.due,
                            start: o.start,
                            lease: lease.clone(),
                            replaced: replaced.clone(),
                        };
                        let id = occurrence.id();
                        tracing::info!(lease = name, run_id = id, "due {}: starting", utc(o.due));
                        let span = tracing::info_span!("due", run_id = id);
                        let future = span.in_scope(|| (lock(&ctx.job))(occurrence));
                        running = Some(Running {
                            occurrence: o,
                            replaced,
                            future: Box::pin(future.instrument(span)),
                        });
                        started = true;
                    }
                    Action::Skip(o, why) => missed(name, o, why),
                    Action::Stop(o) => {
                        if let Some(run) = running.as_ref().filter(|r| r.occurrence.due == o.due) {
                            run.replaced.set();
                        }
                    }
                }
            }
        }
        // The next start, or the next read of the clock.
        let start = match (best, server_now, planner.wake_at()) {
            (Some(e), Some(_), Some(w)) => Some(e.instant_of(w)),
            _ => None,
        };
        drop(planner);
        if started {
            continue;
        }
        // A read in flight (this leader's or another's) wakes this one.
        let read = match (&reading, next_read) {
            (None, Some(next)) => Some(next.unwrap_or(now)),
            _ => None,
        };
        let Some(wake) = [start, read].into_iter().flatten().min() else {
            return Poll::Pending;
        };
        timer.as_mut().reset(wake);
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
    })
    .await
}

/// The lease is gone: nothing more starts; what waited is logged as missed.
fn resign(planner: &mut Planner, name: &str) {
    planner.resign();
    // What resigning decided does not depend on the time.
    while let Some(action) = planner.poll(UNIX_EPOCH) {
        if let Action::Skip(o, why) = action {
            missed(name, o, why);
        }
    }
}

/// One line per due time that does not run.
fn missed(name: &str, o: lease_proto::schedule::Occurrence, why: Missed) {
    tracing::warn!(
        lease = name,
        run_id = run_id(name, o.due),
        reason = why.label(),
        "due {}: not run: {why}",
        utc(o.due)
    );
}

/// `NAME@<due time as Unix seconds>` (`lease run`'s `LEASE_RUN_ID`).
fn run_id(name: &str, due: SystemTime) -> String {
    let secs = due.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{name}@{secs}")
}

/// A server time as RFC 3339 in UTC (`2026-12-06T03:00:00Z`).
fn utc(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map_or_else(|_| "?".to_owned(), |ts| ts.to_string())
}

/// Reads the server's clock over a connection of its own, opened and closed
/// here within `timeout`: the first host of the configuration's list that
/// opens and is a primary, the quickest of [`CLOCK_SAMPLES`] reads.
async fn read_clock(
    runtime: Arc<dyn Runtime>,
    config: Config,
    timeout: Duration,
) -> Result<Estimate, SessionError> {
    let deadline = runtime.now() + timeout;
    let work = async {
        let mut last = None;
        let hosts = crate::hosts::split(&config, crate::shared::seed());
        let several = hosts.len() > 1;
        for mut host in hosts {
            let primary = several
                || matches!(
                    host.get_target_session_attrs(),
                    TargetSessionAttrs::ReadWrite
                );
            host.target_session_attrs(TargetSessionAttrs::Any);
            match read_host(&*runtime, host, primary).await {
                Ok(e) => return Ok(e),
                Err(e) if e.code.as_deref() == Some(crate::runtime::UNSUPPORTED) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| SessionError::other("no host")))
    };
    let mut work = pin!(work);
    let mut timer = runtime.timer(deadline);
    poll_fn(|cx| {
        if let Poll::Ready(r) = work.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        timer.as_mut().poll(cx).map(|()| {
            Err(SessionError::other(format!(
                "reading the server's clock timed out after {} ms",
                timeout.as_millis()
            )))
        })
    })
    .await
}

/// [`read_clock`] on one host.
async fn read_host(
    runtime: &dyn Runtime,
    host: Config,
    primary: bool,
) -> Result<Estimate, SessionError> {
    let mut session = runtime.connect(host).await?;
    if primary {
        let in_recovery = session.in_recovery();
        if crate::hosts::alone(&mut *session, in_recovery).await? {
            return Err(crate::runtime::not_a_primary());
        }
    }
    let mut best: Option<Estimate> = None;
    for _ in 0..CLOCK_SAMPLES {
        let sent = runtime.now();
        let read = session.server_time_micros();
        let micros = crate::hosts::alone(&mut *session, read).await?;
        let estimate = Estimate::from_micros(sent, runtime.now(), micros);
        if best.is_none_or(|b| estimate.read_error() < b.read_error()) {
            best = Some(estimate);
        }
    }
    best.ok_or_else(|| SessionError::other("no clock read"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    fn look(clock: &ServerClock) -> Seen {
        clock.look(&Context::from_waker(Waker::noop()))
    }

    #[test]
    fn one_read_at_a_time_and_what_it_leaves() {
        let clock = Arc::new(ServerClock::default());
        let t0 = Instant::now();
        let claim = clock.claim(t0).expect("due at once");
        assert!(clock.claim(t0).is_none(), "one read at a time");
        assert!(look(&clock).next_read.is_none(), "a read is in flight");
        drop(claim);
        // A claim dropped unfinished (its lease lost) frees the read.
        let claim = clock.claim(t0).expect("free again");
        let ms = Duration::from_millis;
        let good = Estimate::from_micros(t0, t0 + ms(2), 1_800_000_000_000_000);
        claim.done(t0 + ms(2), Ok(good), "x");
        let seen = look(&clock);
        assert!(seen.best.is_some() && seen.unusable_since.is_none());
        assert!(clock.claim(t0 + ms(3)).is_none(), "not due again yet");
        // Failures: unusable from the first one on, the reading kept.
        let later = t0 + CLOCK_GIVE_UP;
        let claim = clock.claim(later).expect("due");
        claim.done(later, Err(SessionError::other("refused")), "x");
        assert_eq!(look(&clock).unusable_since, Some(later));
        // A runtime that cannot read the clock at all says so.
        let unsupported = SessionError::server(crate::runtime::UNSUPPORTED, "no clock here");
        let at = later + ms(1_000);
        clock
            .claim(at)
            .expect("due")
            .done(at, Err(unsupported.clone()), "x");
        assert_eq!(look(&clock).unsupported, Some(unsupported));
    }
}
