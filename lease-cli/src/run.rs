//! `lease run`: contend for a lease and run a command while holding it.

use std::cell::Cell;
use std::ffi::OsStr;
use std::future::{pending, Future};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use lease_exec::Command;
use lease_proto::inspect::{lease_application_name, lease_application_name_of, HolderRow};
use lease_tokio::{Lease, LeaseId, LeaseState, Locker, Options, Role, ServerWait, SessionState};
use tokio::sync::mpsc;

use crate::args::{shard_leases, LogFormat, RunArgs, DEFAULT_GRACE};
use crate::conn::{self, Target};
use crate::job::{
    once_only, outcome, run_command, Attempt, Ctx, JobEnd, Signals, EXIT_NOT_RUN, RENEW_MAX,
    RENEW_MIN,
};
use crate::log::{self, usage_error, EXIT_FAILURE};
use crate::schedule::{self, Schedule};
use crate::serve::{self, Current, Endpoints, Health};
use crate::status;

/// Everything `lease run` needs once the input is validated.
struct Plan {
    /// The lease, or with `--shards` the shards' leases in index order.
    leases: Vec<LeaseId>,
    /// `--shards`.
    shards: Option<u16>,
    /// COMMAND, its watchdog's log setup included.
    command: Command,
    options: Options,
    target: Target,
    grace: Duration,
    /// Whether `--grace` was given (only a chosen grace is warned about).
    grace_set: bool,
    /// The kill deadline after a lost lease is the lease's validity end plus
    /// this: with the server guard, the guard margin less the drift allowance
    /// (just before the guard deadline, when the server may hand the lease
    /// over: see [`Options::act_after_validity`]), `grace` without it.
    after_validity: Duration,
    quiet: bool,
    format: LogFormat,
    /// `--metrics-addr`.
    metrics_addr: Option<std::net::SocketAddr>,
    /// `--try`, with `--wait`.
    attempt: Option<TryPlan>,
    /// `--give-up-after`.
    give_up_after: Option<Duration>,
    /// `--every` / `--cron`, with the options beside them.
    schedule: Option<Schedule>,
    /// `--identity`, or its default.
    identity: Option<String>,
}

/// `lease run --try [--wait D]`: COMMAND runs only if the lease is won at the
/// first try, or before `deadline`; otherwise `lease run` exits 3 (see
/// [`give_up`]).
#[derive(Debug, Clone, Copy)]
struct TryPlan {
    /// `--wait`: `None` for the first try alone.
    wait: Option<Duration>,
    /// When `lease run` started: `--wait` counts from here.
    start: Instant,
}

impl TryPlan {
    /// When COMMAND must have started: the end of `--wait`, or (first try
    /// alone) at the latest two query timeouts, a connection and a try.
    fn deadline(&self, query_timeout: Duration) -> Instant {
        self.start + self.wait.unwrap_or(2 * query_timeout)
    }
}

/// Runs `lease run`; returns the process exit status.
pub fn main(args: RunArgs) -> i32 {
    let start = Instant::now();
    let plan = match validate(args, start) {
        Ok(plan) => plan,
        Err((code, message)) => return usage_error(code, &message),
    };
    // Before the locker exists (its metric descriptions go to the recorder)
    // and before any database contact: a bad address is bad usage.
    let endpoints = match plan.metrics_addr.map(Endpoints::bind).transpose() {
        Ok(endpoints) => endpoints,
        Err(message) => return usage_error(2, &message),
    };
    if endpoints.is_some() {
        serve::zero(&plan.leases);
    }
    log::init(plan.quiet, plan.format);
    if plan.attempt.is_some() {
        // Nothing but one line when COMMAND does not run.
        log::hold_info();
    }
    for warning in &plan.target.warnings {
        tracing::warn!("{warning}");
    }
    warn_about_grace(&plan);
    // Orphans of a command's tree whose watchdog died become this runner's
    // children, still in reach (its only other children are watchdogs).
    if let Err(e) = lease_exec::become_subreaper() {
        tracing::error!("cannot become the subreaper of the command's tree: {e}");
        return EXIT_FAILURE;
    }
    // One thread: the watchdog's PR_SET_PDEATHSIG is tied to the thread that
    // spawns it, which must live as long as the process (`Watchdog::start`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => rt.block_on(contend(plan, endpoints)),
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            EXIT_FAILURE
        }
    }
}

/// Checks everything that can be checked without the database: the name, the
/// command, the intervals and the connection string. `Err((status, message))`.
fn validate(args: RunArgs, start: Instant) -> Result<Plan, (i32, String)> {
    let lease = LeaseId::named(args.name.as_str()).map_err(|e| (2, e.to_string()))?;
    let schedule = schedule::from_args(&args).map_err(|e| (2, e))?;
    let leases = match args.shards {
        None => vec![lease.clone()],
        Some(n) => shard_leases(lease.name(), n).map_err(|e| (2, e))?,
    };
    let mut argv = args.command.into_iter();
    let program = argv
        .next()
        .ok_or((2, "missing COMMAND after `--`".to_owned()))?;
    let mut command = Command::new(program);
    command
        .args(argv)
        .watchdog_log(log::watchdog_config(args.quiet, args.log_format));
    let mut options = {
        let mut o = Options::default();
        o.retry_interval = args.retry_interval;
        o.heartbeat_interval = args.heartbeat_interval;
        o.query_timeout = args.query_timeout;
        o.server_guard = !args.no_server_guard;
        o.notify_handover = !args.no_notify;
        o.server_wait = if args.no_wait_on_server {
            ServerWait::Off
        } else {
            ServerWait::IdleAndWatch
        };
        o.lock_delay = args.lock_delay;
        // clap refuses `--observer` with `--priority`.
        o.role = if args.observer {
            Role::Observer
        } else {
            Role::Candidate {
                priority: args.priority,
            }
        };
        o
    };
    if let Some(margin) = args.guard_margin {
        options.guard_margin = margin;
    }
    if let Err(e) = options.validate() {
        return Err((2, format!("inconsistent intervals: {e}")));
    }
    if args.wait.is_some_and(|w| w.is_zero()) {
        return Err((2, "--wait must be greater than zero".to_owned()));
    }
    let attempt = args.try_once.then_some(TryPlan {
        wait: args.wait,
        start,
    });
    let grace = args.grace.unwrap_or(DEFAULT_GRACE);
    if grace.is_zero() {
        return Err((2, "--grace must be greater than zero".to_owned()));
    }
    let mut target = conn::resolve(args.conn.database_url.as_deref()).map_err(|e| (2, e))?;
    let identity = args.identity.clone().or_else(lease_tokio::identity);
    if let Some(id) = &identity {
        if id.is_empty() || id.chars().any(|c| !c.is_ascii_graphic()) {
            return Err((
                2,
                format!(
                    "--identity {id:?}: printable ASCII without spaces (the server replaces \
                     anything else in application_name with '?')"
                ),
            ));
        }
    }
    if target.config.get_application_name().is_none() {
        target
            .config
            .application_name(lease_application_name_of(lease.name(), identity.as_deref()));
    }
    check_command(command.get_program())?;
    let after_validity = options.act_after_validity().unwrap_or(grace);
    Ok(Plan {
        leases,
        shards: args.shards,
        command,
        options,
        target,
        grace,
        grace_set: args.grace.is_some(),
        after_validity,
        quiet: args.quiet,
        format: args.log_format,
        metrics_addr: args.metrics_addr,
        attempt,
        give_up_after: args.give_up_after,
        schedule,
        identity,
    })
}

/// Checks that `program` exists and is executable, like a shell would
/// before running it: `Err((127, message))` when not found, `Err((126,
/// message))` when not executable.
fn check_command(program: &OsStr) -> Result<(), (i32, String)> {
    let name = program.to_string_lossy();
    if program.is_empty() {
        return Err((127, "the command is empty".to_owned()));
    }
    if program.as_encoded_bytes().contains(&b'/') {
        return executable(Path::new(program))
            .map_err(|why| (126, format!("cannot execute {name}: {why}")))
            .and_then(|found| {
                found
                    .then_some(())
                    .ok_or_else(|| (127, format!("{name}: no such file")))
            });
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let mut denied = None;
    for dir in std::env::split_paths(&path) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        match executable(&dir.join(program)) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(why) => denied = Some(why),
        }
    }
    Err(match denied {
        Some(why) => (126, format!("cannot execute {name}: {why}")),
        None => (127, format!("{name}: command not found in PATH")),
    })
}

/// `Ok(true)`: an executable file; `Ok(false)`: nothing there; `Err`: there
/// but not executable.
fn executable(path: &Path) -> Result<bool, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err("is a directory".to_owned()),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err("permission denied".to_owned()),
        Ok(_) => Ok(true),
        Err(_) => Ok(false),
    }
}

/// One line at startup when a `--grace` the user set cannot be given in full
/// after a lost lease (or, without the server guard, what bounds the command
/// instead).
///
/// The default grace is for graceful stops, where it applies in full; that a
/// lost lease cuts it at the kill deadline is the documented rule (`lease run
/// --help`), not news at every start, so the default never warns. A value
/// the user chose longer than the kill deadline allows is a promise the
/// runner cannot keep after a loss: that is said once, at startup.
fn warn_about_grace(plan: &Plan) {
    let grace = humantime::format_duration(plan.grace);
    if !plan.options.server_guard {
        tracing::warn!(
            "--no-server-guard: the server frees a silent holder's lease only when it ends the \
             session, at no moment this runner can know: after a lost lease the command's group \
             gets SIGKILL --grace {grace} after SIGTERM, at the latest {grace} after the lease's \
             validity ended, whatever the server does meanwhile"
        );
    } else if plan.grace_set && plan.grace > plan.after_validity {
        let bound = log::millis(plan.after_validity);
        let delay = humantime::format_duration(plan.options.lock_delay / 2);
        // A deliberate choice (the deploy recipes make it): said once, not
        // a warning.
        tracing::info!(
            "--grace {grace} applies in full to graceful stops (a shutdown, a hand-over); after \
             a lost lease the command is killed sooner, before the server may hand the lease to \
             another replica: {bound} after SIGTERM at the latest, {delay} (half of \
             --lock-delay) when the server ended the session"
        );
    }
}

async fn contend(plan: Plan, endpoints: Option<Endpoints>) -> i32 {
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot install signal handlers: {e}");
            return EXIT_FAILURE;
        }
    };
    let locker = match Locker::from_config(
        plan.target.config.clone(),
        plan.target.tls.clone(),
        plan.options.clone(),
    ) {
        Ok((locker, driver)) => {
            tokio::spawn(driver);
            locker
        }
        Err(e) => {
            tracing::error!("{e}");
            return 2;
        }
    };
    match plan.shards {
        None => tracing::info!(
            lease = plan.leases[0].name(),
            key = plan.leases[0].key(),
            identity = plan.identity.as_deref().unwrap_or(""),
            "contending for the lease at {}",
            plan.target.summary
        ),
        Some(shards) => tracing::info!(
            group = plan.leases[0].group().map_or("", |g| g.name()),
            shards,
            identity = plan.identity.as_deref().unwrap_or(""),
            "contending for the lease at {}",
            plan.target.summary
        ),
    }
    let current = Current::default();
    let endpoint = endpoints.map(|endpoints| {
        let addr = endpoints.local_addr();
        let addr = addr.map_or_else(|| "?".to_owned(), |a| a.to_string());
        tracing::info!("serving /metrics, /healthz and /leader on http://{addr}");
        let health = Health {
            tolerance: plan.options.query_timeout + plan.options.retry_interval,
            shards: plan.shards,
        };
        tokio::spawn(serve::serve(
            endpoints,
            locker.clone(),
            current.clone(),
            health,
        ))
    });
    let (holders_tx, holders) = mpsc::unbounded_channel();
    // A shard's holder is the group's business: `lease status --shards`.
    let holders_tx = (!plan.quiet && plan.shards.is_none()).then_some(holders_tx);
    let monitor = tokio::spawn(monitor(locker.clone(), holders_tx));
    let lookups = tokio::spawn(describe_holders(
        plan.target.clone(),
        plan.options.query_timeout,
        plan.leases[0].clone(),
        holders,
    ));

    let leading = Cell::new(0);
    let attempt = Cell::new(Attempt::Deciding);
    let runner = plan.schedule.clone().map(|sched| {
        tracing::info!(
            lease = plan.leases[0].name(),
            "runs {} {} (on the database server's clock)",
            plan.command.get_program().to_string_lossy(),
            sched.spec
        );
        schedule::Runner::new(
            plan.leases[0].name(),
            sched,
            plan.target.clone(),
            plan.options.query_timeout,
        )
    });
    if let Some(runner) = &runner {
        if let Err(e) = runner.check().await {
            tracing::error!("{e}");
            return EXIT_FAILURE;
        }
    }
    let ctx = Ctx {
        command: &plan.command,
        grace: plan.grace,
        after_validity: plan.after_validity,
        lock_delay: plan.options.lock_delay,
        drift_allowance: plan
            .options
            .guard_timeout()
            .mul_f64(plan.options.drift_bound()),
        locker: &locker,
        poll: (plan.options.heartbeat_interval / 4).clamp(RENEW_MIN, RENEW_MAX),
        signals: &signals,
        leading: &leading,
        current: &current,
        attempt: plan.attempt.map(|_| &attempt),
        scheduled: runner.is_some(),
    };
    let ctx = &ctx;
    let runner = runner.as_ref();
    // The status of the run that ended first; its end stops the others
    // (with `--shards`) as a signal would.
    let first = Cell::new(None);
    let password_search = plan.target.password_search.as_deref();
    let runs = plan.leases.iter().enumerate().map(|(i, lease)| {
        let shard = plan.shards.map(|n| (i, n));
        let (first, signals) = (&first, &signals);
        let run = locker.run_lease(lease.clone(), signals.at_least(1), move |lease| {
            let job: Pin<Box<dyn Future<Output = Result<(), JobEnd>> + '_>> = match runner {
                Some(runner) => Box::pin(schedule::lead(lease, ctx, runner)),
                None => Box::pin(lead(lease, ctx, shard)),
            };
            job
        });
        Box::pin(async move {
            // The locker's errors (a refusal, a wrong password) end every
            // run alike: said once.
            let code = outcome(run.await, first.get().is_none(), password_search);
            if first.get().is_none() {
                first.set(Some(code));
                if shard.is_some() && signals.received() == 0 {
                    tracing::info!(
                        lease = lease.name(),
                        "the shard's run ended (status {code}): stopping the other shards"
                    );
                }
            }
            signals.stop();
        }) as Pin<Box<dyn Future<Output = ()> + '_>>
    });
    let standing_by_at_signal = async {
        signals.at_least(1).await;
        if leading.get() > 0 {
            // The runs shut the jobs down and release the leases.
            pending::<()>().await;
        }
    };
    let gave_up = async {
        match plan.attempt {
            Some(t) => give_up(&locker, &attempt, t, &plan).await,
            None => pending().await,
        }
    };
    // `--give-up-after`: the cause, once given up (the runs stop as on a signal).
    let no_session = std::cell::RefCell::new(None);
    let give_up_after = async {
        match plan.give_up_after {
            Some(d) => {
                let cause = without_session(&locker, d).await;
                *no_session.borrow_mut() = Some(cause);
                signals.stop();
                pending().await
            }
            None => pending().await,
        }
    };
    tokio::select! {
        () = all(runs.collect()) => {}
        () = standing_by_at_signal => {
            if no_session.borrow().is_none() {
                // A standby, or a schedule's leader between runs (it then
                // releases the lease it holds, and says so).
                tracing::info!("no command running: exiting");
            }
        }
        (not_run, t) = gave_up => say_not_run(not_run, t, &plan).await,
        () = give_up_after => {}
    }
    let mut code = match attempt.get() {
        Attempt::Exit(code) => code,
        Attempt::Deciding | Attempt::Started => first.get().unwrap_or(0),
    };
    if let (Some(cause), Some(d)) = (no_session.into_inner(), plan.give_up_after) {
        tracing::error!(
            "no database session for {} (--give-up-after): giving up; the last error: {}",
            humantime::format_duration(d),
            cause.as_deref().unwrap_or("none (still connecting)")
        );
        code = EXIT_FAILURE;
    }
    if attempt.get() == Attempt::Deciding {
        // `--try` ended undecided (a signal, a refusal): what it held back.
        log::release_held();
    }
    monitor.abort();
    lookups.abort();
    if code == 0 || code > 2 {
        // Ends the session politely; exiting would end it anyway.
        let _ = tokio::time::timeout(Duration::from_secs(1), locker.close()).await;
    }
    // Served until the session is closed: a last scrape may see the release.
    if let Some(endpoint) = endpoint {
        endpoint.abort();
    }
    code
}

/// `--give-up-after D`: resolves once no session has been ready for `d`
/// (since this call, or since the session was last seen ready), with the
/// last connection error. Reads the locker's status every `d / 20` (5 ms to
/// 100 ms).
async fn without_session(locker: &Locker, d: Duration) -> Option<String> {
    let poll = (d / 20).clamp(Duration::from_millis(5), Duration::from_millis(100));
    let mut since = Instant::now();
    loop {
        let status = locker.status();
        let now = Instant::now();
        if matches!(status.session, SessionState::Ready { .. }) {
            since = now;
        } else if now.saturating_duration_since(since) >= d {
            return status.last_error.map(|e| e.error.to_string());
        }
        tokio::time::sleep(poll).await;
    }
}

/// Runs `futures` until every one is done.
async fn all(mut futures: Vec<Pin<Box<dyn Future<Output = ()> + '_>>>) {
    std::future::poll_fn(|cx| {
        futures.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if futures.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// The job: runs the command while the lease is held, with a watchdog that
/// kills the command's tree at the kill deadline unless renewed
/// ([`lease_exec`]).
///
/// The kill deadline is the lease's validity end plus
/// [`Ctx::after_validity`]: with the server guard, the last confirming
/// statement's send time + `idle_session_timeout` less the drift allowance,
/// just before the first moment the server could hand the lease to another
/// session. It moves with every
/// confirmed heartbeat. A lost lease: SIGTERM at once, SIGKILL at the kill
/// deadline or after `--grace`, whichever is first; within `--lock-delay`
/// (half of it) if the session ended (the server freed the key:
/// [`lease_tokio::Reason::key_may_be_free`], [`crate::job::session_end_wait`]).
/// A graceful stop
/// (shutdown, or the command's own exit with leftovers in its group): the
/// full `--grace`, the key being held until the group is gone.
///
/// `shard`: with `--shards`, this lease's index and the shard count, for the
/// command's environment.
async fn lead(lease: Lease, ctx: &Ctx<'_>, shard: Option<(usize, u16)>) -> Result<(), JobEnd> {
    if lease.is_cancelled() {
        return Ok(());
    }
    if let Some(attempt) = ctx.attempt {
        // `--try`: COMMAND runs once, and not after `lease run` gave up.
        if attempt.get() != Attempt::Deciding {
            return Ok(());
        }
        attempt.set(Attempt::Started);
        log::release_held();
    }
    let (result, own) = run_command(&lease, ctx, shard, &[], None).await;
    if let Some(attempt) = ctx.attempt {
        once_only(&lease, attempt, own, ctx).await;
    }
    result
}

/// Why `lease run --try` did not run COMMAND.
enum NotRun {
    /// A try lost: the holder's backend pid, when `pg_locks` showed it.
    Held(Option<i64>),
    /// No session could be opened: the last error, if any.
    Unreachable(Option<String>),
}

/// `--try`: resolves once `lease run` gives up, with why, having set the
/// exit status in `attempt` (3, or 1 when the database could not be reached)
/// in the same poll (so COMMAND can no longer start, and the caller's
/// `select!` takes this branch); never once COMMAND started. Reads the locker's status every
/// 5 ms:
/// - the first try lost (a standby whose try saw a holder), without
///   `--wait`: held;
/// - a failed connection attempt before any session, without `--wait`:
///   unreachable (a configuration error, a refusal end the run by
///   themselves: exit 1 as without `--try`);
/// - the deadline ([`TryPlan::deadline`]) passed: held (by the last holder
///   seen), or unreachable when no session was ever ready.
async fn give_up(
    locker: &Locker,
    attempt: &Cell<Attempt>,
    t: TryPlan,
    plan: &Plan,
) -> (NotRun, TryPlan) {
    let deadline = t.deadline(plan.options.query_timeout);
    let mut holder = None;
    let mut had_session = false;
    let not_run = loop {
        if attempt.get() != Attempt::Deciding {
            return pending().await;
        }
        let status = locker.status();
        let standby = status.leases.first().and_then(|l| match l.state {
            LeaseState::Standby { holder_pid } => Some(holder_pid),
            _ => None,
        });
        if let Some(Some(pid)) = standby {
            holder = Some(pid);
        }
        let last_error = status.last_error.as_ref();
        match &status.session {
            SessionState::Ready { .. } => had_session = true,
            // A wrong password, an unknown role: the run ends by itself.
            SessionState::Backoff { .. }
                if !had_session
                    && t.wait.is_none()
                    && !last_error.is_some_and(|e| e.error.is_configuration()) =>
            {
                break NotRun::Unreachable(last_error.map(|e| e.error.to_string()));
            }
            _ => {}
        }
        if t.wait.is_none() && holder.is_some() {
            break NotRun::Held(holder);
        }
        let now = Instant::now();
        if now >= deadline {
            break if had_session {
                NotRun::Held(holder)
            } else {
                NotRun::Unreachable(last_error.map(|e| e.error.to_string()))
            };
        }
        tokio::time::sleep(TRY_POLL.min(deadline - now)).await;
    };
    let code = match not_run {
        NotRun::Held(_) => EXIT_NOT_RUN,
        NotRun::Unreachable(_) => EXIT_FAILURE,
    };
    // From here on COMMAND cannot start (single-threaded: no job runs
    // between the check above and this).
    attempt.set(Attempt::Exit(code));
    log::drop_held();
    (not_run, t)
}

/// `--try`'s one line when COMMAND was not run (text: `lease: ...`; JSON: a
/// `WARN` object), the holder described as `lease status` would.
async fn say_not_run(not_run: NotRun, t: TryPlan, plan: &Plan) {
    let lease = &plan.leases[0];
    let deadline = t.deadline(plan.options.query_timeout);
    let code = match not_run {
        NotRun::Held(_) => EXIT_NOT_RUN,
        NotRun::Unreachable(_) => EXIT_FAILURE,
    };
    let how = match t.wait {
        None => "--try".to_owned(),
        Some(w) => format!("--try --wait {}", humantime::format_duration(w)),
    };
    let name = lease.name();
    let line = match not_run {
        NotRun::Held(Some(pid)) => {
            let timeout = plan.options.query_timeout.min(HOLDER_LOOKUP);
            let lookup = lookup_holder(&plan.target, timeout, lease, pid);
            let about = match tokio::time::timeout(timeout, lookup).await {
                Ok(Ok(Some(h))) => format!(
                    " ({}, {}, since {})",
                    h.application_name.as_deref().unwrap_or("?"),
                    status::client(&h).unwrap_or_else(|| "unknown client".to_owned()),
                    h.backend_start
                        .as_deref()
                        .map_or("?".to_owned(), status::seconds),
                ),
                _ => String::new(),
            };
            format!("{name} is held by backend {pid}{about}: not run ({how})")
        }
        NotRun::Held(None) if t.wait.is_some() => {
            format!("{name} was not acquired in time (holder not seen): not run ({how})")
        }
        NotRun::Held(None) => format!(
            "{name} was not acquired within {} (no try answered, or a holder pg_locks did not \
             show): not run ({how})",
            humantime::format_duration(deadline - t.start)
        ),
        NotRun::Unreachable(error) => format!(
            "cannot reach the database{}: not run ({how})",
            error.map_or(String::new(), |e| format!(" ({e})"))
        ),
    };
    match plan.format {
        LogFormat::Text => {
            let line = conn::redact(&line).replace(['\r', '\n'], " ");
            eprintln!("lease: {line}");
        }
        LogFormat::Json => tracing::warn!(lease = name, status = code, "{line}"),
    }
}

/// How often `--try` reads the locker's status while it decides.
const TRY_POLL: Duration = Duration::from_millis(5);

/// The most `--try`'s line waits for the holder's description.
const HOLDER_LOOKUP: Duration = Duration::from_secs(1);

/// Says on stderr when the database can be reached again after failed
/// attempts (the driver reports the failures themselves: the first at once,
/// then at most one line per 30 s counting the attempts since), and feeds a
/// standby's holder to [`describe_holders`].
async fn monitor(locker: Locker, holders: Option<mpsc::UnboundedSender<i64>>) {
    let mut failed = false;
    let mut interval = tokio::time::interval(Duration::from_millis(200));
    loop {
        interval.tick().await;
        let status = locker.status();
        // A standby's status names the holder's backend: describe it.
        if let Some(tx) = &holders {
            for lease in &status.leases {
                if let LeaseState::Standby {
                    holder_pid: Some(pid),
                } = lease.state
                {
                    let _ = tx.send(pid);
                }
            }
        }
        match status.session {
            SessionState::Backoff { .. } => failed = true,
            SessionState::Ready { .. } if failed => {
                tracing::info!("database reachable again");
                failed = false;
            }
            _ => {}
        }
    }
}

/// Looks up who holds the lease (application_name, client address) each time
/// the holder's backend pid changes, in the lock table read on a short-lived
/// separate connection (as `lease status` reads it). Failures are logged at
/// debug level and otherwise ignored.
async fn describe_holders(
    mut target: Target,
    timeout: Duration,
    lease: LeaseId,
    mut pids: mpsc::UnboundedReceiver<i64>,
) {
    target.config.application_name(format!(
        "{} (holder lookup)",
        lease_application_name(lease.name())
    ));
    target.config.connect_timeout(timeout);
    let mut last = None;
    while let Some(pid) = pids.recv().await {
        if last == Some(pid) {
            continue;
        }
        last = Some(pid);
        match tokio::time::timeout(timeout, lookup_holder(&target, timeout, &lease, pid)).await {
            Ok(Ok(Some(h))) => tracing::info!(
                lease = lease.name(),
                holder_backend_pid = pid,
                application_name = h.application_name.as_deref().unwrap_or_default(),
                client = status::client(&h).unwrap_or_else(|| "unknown".to_owned()),
                since = h
                    .backend_start
                    .as_deref()
                    .map_or("?".to_owned(), status::seconds),
                "the lease is held by another session"
            ),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::debug!("holder lookup failed: {}", conn::redact(&e)),
            Err(_) => tracing::debug!("holder lookup timed out"),
        }
    }
}

/// The lock table's row of the lease's holder with backend `pid`, if it
/// still holds it.
async fn lookup_holder(
    target: &Target,
    timeout: Duration,
    lease: &LeaseId,
    pid: i64,
) -> Result<Option<HolderRow>, String> {
    let session = conn::LockSession::connect(target, timeout).await?;
    let read = session.locks().await;
    session.close().await;
    let read = read?;
    let holders = read.key(lease.key()).map_or(&[][..], |l| &l.holders);
    Ok(holders
        .iter()
        .find(|h| h.pid.map(i64::from) == Some(pid))
        .cloned())
}
