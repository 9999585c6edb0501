//! Schedules: `lease run --every`/`--cron` (the leader runs COMMAND at each due
//! time: [`lead`]) and `lease schedule next`. The rules themselves (due times,
//! overlap, catch-up, a takeover) are lease-proto's `schedule` module.

use crate::args::{CatchUpArg, DdlArgs, InitArgs, NextArgs, OverlapArg, RunArgs, UnfinishedArg};
use crate::clock::{self, Estimate, Now as _};
use crate::conn::{self, Target};
use crate::job::{self, Ctx, JobEnd};
use crate::log::usage_error;
use crate::state::{self, Fenced, StateError, Table};
use lease_proto::schedule::{
    Action, CatchUp, Missed, Occurrence, Overlap, Planner, Policy, Record, Spec, MAX_CLOCK_ERROR,
};
use lease_tokio::Lease;
use std::cell::RefCell;
use std::future::{pending, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{watch, Notify};

/// `lease run`'s schedule: what `--every`/`--cron` and the options beside them say.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub spec: Spec,
    pub policy: Policy,
    /// `--state-table`, and `--unfinished retry`.
    pub state: Option<(Table, bool)>,
}

/// `--catch-up` with `--state-table` when not given: the claims keep each due time
/// at most once, so a new leader runs what nobody ran in the last hour.
pub const DEFAULT_CATCH_UP_WITH_TABLE: Duration = Duration::from_secs(3600);

/// The schedule of `lease run`'s options, if any; `Err` names the bad option.
pub fn from_args(args: &RunArgs) -> Result<Option<Schedule>, String> {
    let spec = match (&args.every, &args.cron) {
        (Some(period), _) => Spec::every(*period).map_err(|e| format!("--every: {e}"))?,
        (None, Some(expr)) => Spec::cron(expr, args.tz.as_deref()).map_err(cron_error)?,
        (None, None) => return Ok(None),
    };
    let policy = Policy {
        jitter: args.jitter.unwrap_or_default(),
        overlap: match args.overlap {
            OverlapArg::Skip => Overlap::Skip,
            OverlapArg::Queue => Overlap::Queue,
            OverlapArg::Replace => Overlap::Replace,
        },
        catch_up_window: match (args.catch_up, &args.state_table) {
            (Some(window), _) => window,
            (None, Some(_)) => DEFAULT_CATCH_UP_WITH_TABLE,
            (None, None) => Duration::ZERO,
        },
        catch_up: match args.catch_up_policy {
            None | Some(CatchUpArg::Latest) => CatchUp::Latest,
            Some(CatchUpArg::All) => CatchUp::All,
            Some(CatchUpArg::None) => CatchUp::Off,
        },
    };
    if args.catch_up_policy.is_some() && policy.catch_up_window.is_zero() {
        return Err(
            "--catch-up-policy needs a catch-up window: --catch-up WINDOW, or --state-table \
             (whose default window is 1h)"
                .to_owned(),
        );
    }
    // The jitter and the catch-up window: the rule is the core's; the flag
    // is named here.
    policy.check(&spec).map_err(|e| {
        let without_jitter = Policy {
            jitter: Duration::ZERO,
            ..policy
        };
        match without_jitter.check(&spec) {
            Ok(()) => format!("--jitter: {e}"),
            Err(_) => format!("--catch-up: {e}"),
        }
    })?;
    let state = match &args.state_table {
        Some(name) => Some((Table::parse(name)?, args.unfinished == UnfinishedArg::Retry)),
        None => None,
    };
    Ok(Some(Schedule {
        spec,
        policy,
        state,
    }))
}

/// A `Spec::cron` error, named after the flag it is about.
fn cron_error(e: lease_proto::schedule::SpecError) -> String {
    let flag = if e.to_string().starts_with("unknown time zone") {
        "--tz"
    } else {
        "--cron"
    };
    format!("{flag}: {e}")
}

/// A server time as RFC 3339 in UTC (`2026-12-06T03:00:00Z`), as LEASE_DUE.
pub fn utc(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map_or_else(|_| "?".to_owned(), |ts| ts.to_string())
}

/// A run's identity: `NAME@<due time as Unix seconds>` (LEASE_RUN_ID).
pub fn run_id(name: &str, due: SystemTime) -> String {
    let secs = due
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{name}@{secs}")
}

/// `lease schedule next`.
pub fn next(args: NextArgs) -> i32 {
    let spec = match (&args.every, &args.cron) {
        (Some(period), _) => Spec::every(*period).map_err(|e| format!("--every: {e}")),
        (_, Some(expr)) => Spec::cron(expr, args.tz.as_deref()).map_err(cron_error),
        (None, None) => Err("give --every or --cron".to_owned()),
    };
    let spec = match spec {
        Ok(spec) => spec,
        Err(e) => return usage_error(2, &e),
    };
    let from = match &args.from {
        None => SystemTime::now(),
        Some(text) => match text.parse::<jiff::Timestamp>() {
            Ok(ts) => SystemTime::from(ts),
            Err(e) => {
                return usage_error(
                    2,
                    &format!(
                        "--from {text:?}: not an RFC 3339 time ({e}); e.g. 2026-10-24T12:00:00Z"
                    ),
                )
            }
        },
    };
    let jitter = args.jitter.unwrap_or_default();
    let name = args.name.as_deref().unwrap_or("");
    println!("{spec}");
    let mut t = from;
    for _ in 0..args.count {
        let Some(due) = spec.next_after(t) else {
            println!("(no further due time)");
            break;
        };
        let mut line = format!("{}  {}", utc(due), spec.local(due));
        if !jitter.is_zero() {
            let start = due + lease_proto::schedule::jitter(name, due, jitter);
            line.push_str(&format!("  starts {}", utc(start)));
        }
        if let Some(note) = spec.dst_note(due) {
            line.push_str(&format!("  ({note})"));
        }
        println!("{line}");
        t = due;
    }
    0
}

/// The most a clock read may take.
pub const CLOCK_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a run's end is tried to be recorded, in query timeouts.
pub const FINISH_TRIES_FOR: u32 = 10;

/// What a scheduled `lease run` keeps across its terms as leader: the planner
/// (what ran, what is ahead) and where to read the server's clock.
pub struct Runner {
    name: String,
    /// The schedule as its state-table row keeps it (`Spec`'s text).
    spec_text: String,
    planner: RefCell<Planner>,
    target: Target,
    /// `--state-table`, and whether unfinished runs are retried.
    state: Option<(Table, bool)>,
    /// How long a state-table statement may take, connecting included.
    timeout: Duration,
    /// The recorded due time this leader may claim again (unfinished, and
    /// retried or never started), as its takeover found it.
    retry_due: std::cell::Cell<Option<SystemTime>>,
}

impl Runner {
    pub fn new(name: &str, schedule: Schedule, mut target: Target, timeout: Duration) -> Runner {
        // Its connections (clock reads, claims) named apart from the lease session.
        let app = target.config.get_application_name().unwrap_or("lease");
        let app = format!("{app} (schedule)");
        target.config.application_name(app);
        Runner {
            name: name.to_owned(),
            spec_text: schedule.spec.to_string(),
            planner: RefCell::new(Planner::new(name, schedule.spec, schedule.policy)),
            target,
            state: schedule.state,
            timeout,
            retry_due: std::cell::Cell::new(None),
        }
    }

    /// Before contending: a state table that does not exist is a configuration
    /// error (one line; `lease run` exits 1). Any other failure is left to the
    /// reads at each grant.
    pub async fn check(&self) -> Result<(), String> {
        let Some((table, _)) = &self.state else {
            return Ok(());
        };
        let names = [self.name.clone()];
        match state::rows(&self.target, self.timeout, table, &names).await {
            Err(StateError::Missing) => Err(format!(
                "the state table {} does not exist: create it with `lease schedule init \
                 --state-table {}` (or `lease schedule ddl` to see the statement)",
                table.name(),
                table.name()
            )),
            _ => Ok(()),
        }
    }

    /// Takes the schedule over in the state table ([`state::fence`]: no older
    /// leader's claim lands after it) and reads its record; retried every second
    /// until it answers, or the lease is lost (`None`). A newer leader's token
    /// in the row: this lease is stale, wait for its loss (`None`).
    async fn record(&self, lease: &Lease) -> Option<Option<Record>> {
        let (table, retry) = self.state.as_ref()?;
        let mut warned = false;
        loop {
            let fence = state::fence(
                &self.target,
                self.timeout,
                table,
                (&self.name, &self.spec_text),
                lease.token(),
            );
            let result = tokio::select! {
                r = fence => r,
                _ = lease.cancelled() => return None,
            };
            match result {
                Ok(Fenced::Record(record)) => {
                    let again = record.filter(|r| !r.finished && (*retry || !r.started));
                    self.retry_due.set(again.map(|r| r.due));
                    return Some(record);
                }
                Ok(Fenced::Newer) => {
                    tracing::warn!(
                        "the state table {} names a newer leader of this schedule: running \
                         nothing until this lease ends",
                        table.name()
                    );
                    lease.cancelled().await;
                    return None;
                }
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(
                        "cannot take the schedule over in the state table {} ({}): no run \
                         starts until it can",
                        table.name(),
                        conn::redact(&e.to_string())
                    );
                }
                Err(_) => {}
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = lease.cancelled() => return None,
            }
        }
    }

    /// Claims `o` in the state table (always `true` without one); `again`: a
    /// retry after a failed attempt, which takes this leader's own unstarted
    /// claim of `o` (an attempt that landed, its answer lost).
    async fn claim(&self, lease: &Lease, o: Occurrence, again: bool) -> Result<bool, String> {
        let Some((table, _)) = &self.state else {
            return Ok(true);
        };
        let id = run_id(&self.name, o.due);
        state::claim(
            &self.target,
            self.timeout,
            table,
            &self.name,
            (o.due, &id),
            lease.token(),
            (self.retry_due.get(), again),
        )
        .await
        .map_err(|e| conn::redact(&e.to_string()))
    }

    /// Records the end of the run of `o`, or (`ran` false) that it never
    /// started: tried again (200 ms apart, then every second) until it is
    /// recorded, a newer leader holds the row (nothing to record), `hurry`
    /// resolves (a second signal) or [`FINISH_TRIES_FOR`] query timeouts have
    /// passed. The lease is still held meanwhile on a graceful stop (the run
    /// releases it once this job returns), so no new leader reads the row
    /// before it is recorded; after a lost lease the token check keeps a late
    /// record from touching a newer leader's row.
    async fn finish(
        &self,
        lease: &Lease,
        o: Occurrence,
        (outcome, ran): (&str, bool),
        hurry: impl Future<Output = ()>,
    ) {
        let Some((table, _)) = &self.state else {
            return;
        };
        let until = Instant::now() + self.timeout * FINISH_TRIES_FOR;
        let id = run_id(&self.name, o.due);
        let tries = async {
            let mut warned = false;
            for attempt in 0u32.. {
                if attempt > 0 {
                    let pause = if attempt < 5 { 200 } else { 1_000 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                let result = state::finish(
                    &self.target,
                    self.timeout,
                    table,
                    &self.name,
                    (o.due, lease.token()),
                    (outcome, ran),
                )
                .await;
                let e = match result {
                    Ok(_) => {
                        if warned {
                            tracing::info!(
                                run_id = id,
                                "recorded the run's end in the state table {}",
                                table.name()
                            );
                        }
                        return None;
                    }
                    Err(e) => conn::redact(&e.to_string()),
                };
                if Instant::now() >= until {
                    return Some(e);
                }
                if !warned {
                    warned = true;
                    tracing::warn!(
                        run_id = id,
                        "cannot record the run's end in the state table {} yet ({e}): trying \
                         again for up to {} s",
                        table.name(),
                        (self.timeout * FINISH_TRIES_FOR).as_secs()
                    );
                }
            }
            None
        };
        let gave_up = tokio::select! {
            e = tries => e,
            () = hurry => Some("stopping at once (a second signal)".to_owned()),
        };
        if let Some(e) = gave_up {
            let then = if ran {
                "the next leader takes this run as unfinished (with --unfinished retry: runs it \
                 again)"
            } else {
                "the next leader takes this due time as started"
            };
            tracing::warn!(
                run_id = id,
                "cannot record the run's end in the state table {} ({e}): {then}",
                table.name()
            );
        }
    }
}

/// `lease schedule init`.
pub fn init(args: InitArgs) -> i32 {
    let table = match Table::parse(&args.state_table) {
        Ok(t) => t,
        Err(e) => return usage_error(2, &e),
    };
    let target = match conn::resolve(args.conn.database_url.as_deref()) {
        Ok(t) => t,
        Err(e) => return usage_error(2, &e),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(state::init(&target, args.timeout, &table)),
        Err(e) => Err(StateError::Other(format!(
            "cannot start the async runtime: {e}"
        ))),
    };
    match result {
        Ok(said) => {
            println!("{said}");
            0
        }
        Err(e) => {
            eprintln!(
                "lease: cannot create the state table {}: {}",
                table.name(),
                conn::redact(&e.to_string())
            );
            crate::log::EXIT_FAILURE
        }
    }
}

/// `lease schedule ddl`.
pub fn ddl(args: DdlArgs) -> i32 {
    match Table::parse(&args.state_table) {
        Ok(table) => {
            println!("{}", table.ddl());
            0
        }
        Err(e) => usage_error(2, &e),
    }
}

/// The server's clock, read every [`lease_proto::schedule::CLOCK_REFRESH`] on a connection of its own
/// (every second after a failed read) while this replica leads.
struct ClockTask {
    rx: watch::Receiver<Option<Estimate>>,
    task: tokio::task::JoinHandle<()>,
}

impl ClockTask {
    fn start(target: Target) -> ClockTask {
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(async move {
            let mut failing = false;
            let mut best: Option<Estimate> = None;
            loop {
                let wait = match clock::read(&target, CLOCK_READ_TIMEOUT).await {
                    Ok(e) => {
                        // Keep whichever reading is the more certain now.
                        let now = Instant::now();
                        let keep = best.filter(|b| b.at(now).1 < e.at(now).1);
                        let chosen = keep.unwrap_or(e);
                        best = Some(chosen);
                        let good = chosen.now().is_some();
                        if !good && !failing {
                            tracing::warn!(
                                "the server's clock cannot be read within {} ms (a slow round \
                                 trip): no run starts until it can",
                                MAX_CLOCK_ERROR.as_millis()
                            );
                        }
                        failing = !good;
                        if keep.is_none() {
                            let _ = tx.send(Some(e));
                        }
                        if good {
                            clock::next_read(&chosen)
                        } else {
                            Duration::from_secs(1)
                        }
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(
                                "cannot read the server's clock ({}): no run starts until it can",
                                conn::redact(&e)
                            );
                        }
                        failing = true;
                        Duration::from_secs(1)
                    }
                };
                tokio::time::sleep(wait).await;
            }
        });
        ClockTask { rx, task }
    }

    /// The latest estimate.
    fn latest(&self) -> Option<Estimate> {
        *self.rx.borrow()
    }
}

impl Drop for ClockTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type RunFuture<'a> = Pin<Box<dyn Future<Output = (Result<(), JobEnd>, Option<i32>)> + 'a>>;

/// The job of a scheduled `lease run` while it holds the lease: COMMAND at each
/// due time, as [`Planner`] decides, each run as `lease run` runs COMMAND
/// ([`job::run_command`]: its watchdog, kill deadline and stops), with
/// LEASE_DUE and LEASE_RUN_ID; a run's exit status is logged and counted, it
/// does not end the lease. Returns when the lease is lost (the planner resigns)
/// or a run cannot be started (the watchdog: the lease is released).
pub async fn lead(lease: Lease, ctx: &Ctx<'_>, runner: &Runner) -> Result<(), JobEnd> {
    if lease.is_cancelled() {
        return Ok(());
    }
    let clock = ClockTask::start(runner.target.clone());
    let mut rx = clock.rx.clone();
    // The server's time after the grant: due times up to it (and the margin
    // after it) are the old leader's, or the catch-up's.
    let granted = loop {
        if let Some(now) = clock.latest().and_then(|e| e.now()) {
            break now;
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return Ok(()) },
            _ = lease.cancelled() => return Ok(()),
        }
    };
    let name = runner.name.as_str();
    let record = match &runner.state {
        Some((_, retry)) => match runner.record(&lease).await {
            Some(record) => Some((record, *retry)),
            None => return Ok(()),
        },
        None => None,
    };
    {
        let mut planner = runner.planner.borrow_mut();
        match record {
            Some((record, retry)) => planner.lead_recorded(granted, record, retry),
            None => planner.lead(granted),
        }
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
    // Leading from the grant, between runs too: a signal finds this runner
    // leading and stops the schedule through the lease (as a command's stop).
    let _counted = job::Counted::new(ctx.leading);
    // The running one, and what stops it for a replace (one per run: a
    // notification meant for one run never reaches the next).
    let mut run: Option<(Occurrence, Rc<Notify>, RunFuture<'_>)> = None;
    loop {
        let estimate = clock.latest();
        let now = estimate.and_then(|e| e.now());
        if let Some(now) = now {
            loop {
                let action = runner.planner.borrow_mut().poll(now);
                let Some(action) = action else { break };
                match action {
                    Action::Start(o) => {
                        let why = match claim(runner, &lease, o, &clock).await {
                            Claim::Won if lease.is_valid() => None,
                            Claim::Won => {
                                // Claimed, but the lease went meanwhile: recorded
                                // as never started, so the next leader runs it.
                                let hurry = ctx.signals.at_least(2);
                                runner
                                    .finish(&lease, o, ("not started", false), hurry)
                                    .await;
                                Some((Missed::LeaseLost, Missed::LeaseLost.to_string()))
                            }
                            Claim::LeaseLost => {
                                // An attempt that failed may still land (its
                                // COMMIT on its way): recorded as never
                                // started all the same, after it if it does
                                // (the record waits on the row's lock); a
                                // claim that never landed matches nothing.
                                let hurry = ctx.signals.at_least(2);
                                runner
                                    .finish(&lease, o, ("not started", false), hurry)
                                    .await;
                                Some((Missed::LeaseLost, Missed::LeaseLost.to_string()))
                            }
                            Claim::Refused => Some((
                                Missed::NotClaimed,
                                "claimed already in the state table (this due time, a later \
                                 one, or by a newer leader)"
                                    .to_owned(),
                            )),
                            Claim::Failed(e) => Some((
                                Missed::NotClaimed,
                                format!(
                                    "cannot claim it in the state table until the next due \
                                     time ({e})"
                                ),
                            )),
                        };
                        if let Some((reason, text)) = why {
                            runner.planner.borrow_mut().finished(o.due);
                            count_missed(name, reason);
                            missed(name, o, &text);
                            continue;
                        }
                        tracing::info!(
                            lease = name,
                            run_id = run_id(name, o.due),
                            "due {}: starting {}",
                            utc(o.due),
                            ctx.command.get_program().to_string_lossy()
                        );
                        metrics::counter!("lease_schedule_starts_total", "lease" => name.to_owned())
                            .increment(1);
                        let env = [
                            ("LEASE_DUE", utc(o.due)),
                            ("LEASE_RUN_ID", run_id(name, o.due)),
                        ];
                        let replace = Rc::new(Notify::new());
                        let (lease, stop) = (&lease, replace.clone());
                        run = Some((
                            o,
                            replace,
                            Box::pin(async move {
                                job::run_command(lease, ctx, None, &env, Some(&stop)).await
                            }),
                        ));
                    }
                    Action::Skip(o, why) => {
                        count_missed(name, why);
                        missed(name, o, &why.to_string());
                    }
                    Action::Stop(o) => {
                        if let Some((running, stop, _)) = &run {
                            if running.due == o.due {
                                stop.notify_one();
                            }
                        }
                    }
                }
            }
        }
        // Wake for the next start, or sooner to read a better clock.
        let wake = match (estimate, runner.planner.borrow().wake_at()) {
            (Some(e), Some(w)) if now.is_some() => e.instant_of(w),
            _ => Instant::now() + Duration::from_millis(100),
        };
        let running = run.is_some();
        tokio::select! {
            ended = async {
                match run.as_mut() {
                    Some((_, _, f)) => f.as_mut().await,
                    None => pending().await,
                }
            } => {
                let Some((o, _, _)) = run.take() else { continue };
                runner.planner.borrow_mut().finished(o.due);
                let (result, own) = ended;
                let outcome = match (&result, own) {
                    (Ok(()), Some(0)) => "ok",
                    (_, Some(_)) => "failed",
                    _ => "stopped",
                };
                let recorded = match own {
                    Some(0) => "ok".to_owned(),
                    Some(code) => format!("exit {code}"),
                    None => "stopped".to_owned(),
                };
                runner
                    .finish(&lease, o, (&recorded, true), ctx.signals.at_least(2))
                    .await;
                metrics::counter!(
                    "lease_schedule_runs_total",
                    "lease" => name.to_owned(),
                    "outcome" => outcome
                )
                .increment(1);
                match (&result, own) {
                    (_, Some(code)) => tracing::info!(
                        lease = name,
                        run_id = run_id(name, o.due),
                        "due {}: the command exited with status {code}",
                        utc(o.due)
                    ),
                    (Ok(()), None) => tracing::info!(
                        lease = name,
                        run_id = run_id(name, o.due),
                        "due {}: the command was stopped",
                        utc(o.due)
                    ),
                    (Err(_), None) => {}
                }
                if let Err(e @ (JobEnd::Spawn { .. } | JobEnd::Watchdog(_))) = result {
                    resign(runner, name);
                    return Err(e);
                }
                if lease.is_cancelled() {
                    resign(runner, name);
                    return Ok(());
                }
            }
            () = tokio::time::sleep_until(wake.into()) => {}
            _ = rx.changed() => {}
            _ = lease.cancelled(), if !running => {
                resign(runner, name);
                return Ok(());
            }
        }
    }
}

/// How a claim before a start ended.
enum Claim {
    /// This leader's to run (always without a state table).
    Won,
    /// Refused: claimed already, or by a newer leader.
    Refused,
    /// No answer until the next due time's start: the last error.
    Failed(String),
    /// The lease went first.
    LeaseLost,
}

/// Claims `o`; a failed claim (the database unreachable, a timeout) is tried
/// again every second until the next due time's start, each retry taking this
/// leader's own claim if an earlier attempt landed unanswered. A claim under
/// way when the lease goes is waited for (the server ends it within the query
/// timeout), never dropped: one that landed is `Won`, and the caller records
/// it as never started, so the next leader runs it.
async fn claim(runner: &Runner, lease: &Lease, o: Occurrence, clock: &ClockTask) -> Claim {
    let mut again = false;
    loop {
        let attempt = runner.claim(lease, o, again);
        again = true;
        tokio::pin!(attempt);
        let attempt = tokio::select! {
            r = &mut attempt => r,
            _ = lease.cancelled() => {
                return match attempt.await {
                    Ok(true) => Claim::Won,
                    _ => Claim::LeaseLost,
                };
            }
        };
        let error = match attempt {
            Ok(true) => return Claim::Won,
            Ok(false) => return Claim::Refused,
            Err(e) => e,
        };
        let next = runner.planner.borrow().wake_at();
        let now = clock.latest().and_then(|e| e.now());
        if let (Some(next), Some(now)) = (next, now) {
            if now + Duration::from_secs(1) >= next {
                return Claim::Failed(error);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = lease.cancelled() => return Claim::LeaseLost,
        }
    }
}

/// The lease is gone: nothing more starts; what waited is logged as missed.
fn resign(runner: &Runner, name: &str) {
    let mut planner = runner.planner.borrow_mut();
    planner.resign();
    // What resigning decided does not depend on the time.
    while let Some(action) = planner.poll(SystemTime::UNIX_EPOCH) {
        if let Action::Skip(o, why) = action {
            count_missed(name, why);
            missed(name, o, &why.to_string());
        }
    }
}

/// `lease_schedule_missed_total{lease, reason}`.
fn count_missed(name: &str, why: Missed) {
    metrics::counter!(
        "lease_schedule_missed_total",
        "lease" => name.to_owned(),
        "reason" => why.label()
    )
    .increment(1);
}

/// One line per due time that does not run.
fn missed(name: &str, o: Occurrence, why: &str) {
    tracing::warn!(
        lease = name,
        run_id = run_id(name, o.due),
        "due {}: not run: {why}",
        utc(o.due)
    );
}

/// `lease status --state-table TABLE [NAME...]`: each schedule's last run (the
/// due time, its outcome, when it started and finished) and its next due time
/// (by this host's clock), as a table or JSON lines.
pub async fn status(
    target: &Target,
    timeout: Duration,
    table: &str,
    names: &[String],
    json: bool,
) -> Result<String, String> {
    let table = Table::parse(table)?;
    let rows = state::rows(target, timeout, &table, names)
        .await
        .map_err(|e| match e {
            StateError::Missing => format!("the state table {} does not exist", table.name()),
            StateError::Other(e) => conn::redact(&e),
        })?;
    let secs = |t: SystemTime| {
        jiff::Timestamp::try_from(t).map_or_else(
            |_| "?".to_owned(),
            |ts| {
                ts.round(jiff::Unit::Second)
                    .map_or_else(|_| ts.to_string(), |r| r.to_string())
            },
        )
    };
    let now = SystemTime::now();
    let mut lines = Vec::new();
    for r in &rows {
        let next = r
            .schedule
            .parse::<Spec>()
            .ok()
            .and_then(|spec| spec.next_after(now))
            .map_or_else(|| "?".to_owned(), secs);
        let outcome = match (&r.outcome, r.finished, r.due) {
            (Some(o), _, _) => o.clone(),
            (None, _, None) => "-".to_owned(),
            (None, None, Some(_)) => "running".to_owned(),
            (None, Some(_), Some(_)) => "?".to_owned(),
        };
        let cells = [
            r.name.clone(),
            r.schedule.clone(),
            r.due.map_or_else(|| "-".to_owned(), secs),
            outcome,
            r.started.map_or_else(|| "-".to_owned(), secs),
            r.finished.map_or_else(|| "-".to_owned(), secs),
            next,
        ];
        if json {
            let keys = [
                "schedule_name",
                "schedule",
                "last_due",
                "outcome",
                "started",
                "finished",
                "next_due",
            ];
            let object: serde_json::Map<String, serde_json::Value> = keys
                .iter()
                .zip(&cells)
                .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String(v.clone())))
                .chain([(
                    "run_id".to_owned(),
                    r.run_id
                        .clone()
                        .map_or(serde_json::Value::Null, serde_json::Value::String),
                )])
                .collect();
            lines.push(serde_json::Value::Object(object).to_string());
        } else {
            lines.push(cells.join("\t"));
        }
    }
    if json {
        return Ok(lines.into_iter().map(|l| l + "\n").collect());
    }
    let header = "SCHEDULE\tEVERY / CRON\tLAST DUE\tOUTCOME\tSTARTED\tFINISHED\tNEXT DUE";
    Ok(align(std::iter::once(header.to_owned()).chain(lines)))
}

/// Tab-separated cells in aligned columns, two spaces apart.
fn align(lines: impl Iterator<Item = String>) -> String {
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect();
    let mut widths = Vec::new();
    for row in &rows {
        for (i, c) in row.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            if i + 1 < row.len() {
                line.push_str(&format!("{c:<w$}  ", w = widths[i]));
            } else {
                line.push_str(c);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
