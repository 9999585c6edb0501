//! COMMAND under a lease, for `lease run`: started when the lease is won,
//! watched by a watchdog renewed while the lease is valid, and stopped (its
//! whole tree) when the lease is lost or the runner shuts down. Used by a
//! plain lease's leader (`run`) and by a schedule's, once per due time
//! (`schedule`).

use std::cell::Cell;
use std::fmt;
use std::future::pending;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use lease_exec::{Command, Job, Watchdog};
use lease_tokio::{Lease, Locker, Reason, RunError, SessionState};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::log::{self, EXIT_FAILURE};
use crate::serve::Current;
use crate::valid;

/// Where `lease run --try` stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// COMMAND may still start.
    Deciding,
    /// COMMAND started (at most once).
    Started,
    /// Decided: exit with this status (3: not run; 1: no database, or the
    /// lease lost while COMMAND ran).
    Exit(i32),
}

/// The exit status `lease run` passes on: the code, or 128 + the signal.
pub(crate) fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// Why a job ended in a way that ends the run.
#[derive(Debug)]
pub(crate) enum JobEnd {
    /// The command exited with this non-zero status (128 + signal if killed).
    Exited(i32),
    /// The command could not be started.
    Spawn { code: i32, message: String },
    /// The watchdog could not be started or renewed: the command was stopped.
    Watchdog(String),
}

impl fmt::Display for JobEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobEnd::Exited(code) => write!(f, "the command exited with status {code}"),
            JobEnd::Spawn { message, .. } | JobEnd::Watchdog(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for JobEnd {}

/// SIGTERM and SIGINT, counted; [`Signals::stop`] counts as the first.
pub(crate) struct Signals {
    count: watch::Receiver<u32>,
    tx: std::sync::Arc<watch::Sender<u32>>,
}

impl Signals {
    pub(crate) fn install() -> std::io::Result<Signals> {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (tx, count) = watch::channel(0);
        let tx = std::sync::Arc::new(tx);
        let signals = Signals {
            count,
            tx: tx.clone(),
        };
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                let n = {
                    let mut n = 0;
                    tx.send_modify(|c| {
                        *c += 1;
                        n = *c;
                    });
                    n
                };
                if n == 1 {
                    tracing::info!("received {name}: shutting down");
                } else {
                    tracing::warn!(
                        "received {name} while stopping: not waiting for the grace period"
                    );
                }
            }
        });
        Ok(signals)
    }

    /// Stops every run as a first signal would (a shard's run ended).
    pub(crate) fn stop(&self) {
        self.tx.send_if_modified(|c| {
            let first = *c == 0;
            *c = (*c).max(1);
            first
        });
    }

    /// How many signals have arrived (a stop counts as one).
    pub(crate) fn received(&self) -> u32 {
        *self.count.borrow()
    }

    /// Resolves once `n` signals have arrived.
    pub(crate) async fn at_least(&self, n: u32) {
        let mut count = self.count.clone();
        if count.wait_for(|&c| c >= n).await.is_err() {
            pending::<()>().await;
        }
    }
}

/// Bounds of the interval at which the lease's validity is read to renew the
/// watchdog (a quarter of the heartbeat interval, within these).
pub(crate) const RENEW_MIN: Duration = Duration::from_millis(5);

pub(crate) const RENEW_MAX: Duration = Duration::from_millis(250);

/// The job's shared context (borrowed by every call of the job).
pub(crate) struct Ctx<'a> {
    pub(crate) command: &'a Command,
    pub(crate) grace: Duration,
    /// See `run::Plan::after_validity`.
    pub(crate) after_validity: Duration,
    /// `Options::lock_delay`: a command gets SIGKILL within it after SIGTERM
    /// once its session ended (see [`session_end_wait`]).
    pub(crate) lock_delay: Duration,
    /// `guard_timeout × drift_bound`: how much earlier than a doubtful
    /// session's `close_by` (on this runner's clock) a command must be dead.
    pub(crate) drift_allowance: Duration,
    /// For the session's state while a command stops with the key held ([`session_watch`]).
    pub(crate) locker: &'a Locker,
    /// How often the lease's validity is read to renew the watchdog.
    pub(crate) poll: Duration,
    pub(crate) signals: &'a Signals,
    /// How many children run (or are starting, or being stopped): one per shard led.
    pub(crate) leading: &'a Cell<usize>,
    /// The lease the child runs under, for `/leader`.
    pub(crate) current: &'a Current,
    /// `--try`: where it stands.
    pub(crate) attempt: Option<&'a Cell<Attempt>>,
    /// `--every` / `--cron`: the leader runs COMMAND at each due time
    /// (`schedule::lead`), which logs each run's outcome and keeps the lease.
    pub(crate) scheduled: bool,
}

/// One job in [`Ctx::leading`] while it lives: counted from before its command
/// starts until its watchdog is finished, on every path. (Counted only once the
/// command had started, a SIGTERM in between found the runner "not leading": it
/// exited at once and its watchdog SIGKILLed the fresh command.)
pub(crate) struct Counted<'a>(&'a Cell<usize>);

impl<'a> Counted<'a> {
    pub(crate) fn new(leading: &'a Cell<usize>) -> Counted<'a> {
        leading.set(leading.get() + 1);
        Counted(leading)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// The exit status for how the run ended; its error logged if `log`, with
/// `password_search` (where no password was found) after a "password
/// missing".
pub(crate) fn outcome(
    result: Result<(), RunError<JobEnd>>,
    log: bool,
    password_search: Option<&str>,
) -> i32 {
    let code = match &result {
        Ok(()) => 0,
        Err(RunError::Job(JobEnd::Exited(code) | JobEnd::Spawn { code, .. })) => *code,
        Err(RunError::Name(_)) => 2,
        Err(_) => EXIT_FAILURE,
    };
    match result {
        // The job's own errors are logged where they happen.
        Ok(()) | Err(RunError::Job(_)) => {}
        _ if !log => {}
        Err(RunError::Refused(r)) => tracing::error!("refused: {r}"),
        Err(RunError::Name(e)) => tracing::error!("{e}"),
        // "cannot connect: password authentication failed for user ..."
        Err(e) => match password_search {
            Some(search) if e.to_string().contains("password missing") => {
                tracing::error!("{e}: the server asks for a password, and there is {search}")
            }
            _ => tracing::error!("{e}"),
        },
    }
    code
}

/// How the command's wait ended.
pub(crate) enum Ended {
    /// The command exited.
    Exited(Result<ExitStatus, lease_exec::Error>),
    /// The lease was cancelled.
    Cancelled(Reason),
    /// The watchdog could not be renewed.
    WatchdogLost(lease_exec::Error),
    /// The next due time replaces this run (`--overlap replace`).
    Replaced,
}

/// Resolves once `replace` is notified; never without one.
pub(crate) async fn replaced(replace: Option<&tokio::sync::Notify>) {
    match replace {
        Some(n) => n.notified().await,
        None => pending().await,
    }
}

/// Runs COMMAND once under `lease`, with `env` added to its environment, until it
/// exits or the lease is cancelled (the stops of `run::lead`); `replace`, when
/// notified, stops it gracefully as on SIGTERM (`--overlap replace`). How it
/// ended, and COMMAND's own exit status when it exited by itself.
pub(crate) async fn run_command(
    lease: &Lease,
    ctx: &Ctx<'_>,
    shard: Option<(usize, u16)>,
    env: &[(&str, String)],
    replace: Option<&tokio::sync::Notify>,
) -> (Result<(), JobEnd>, Option<i32>) {
    let token = lease.token();
    // `lease valid` from inside the command: answered until the tree is gone
    // (dropped at the end of this function).
    let answerer = match valid::Answerer::start(lease) {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::warn!(
                "cannot listen for `lease valid` ({e}): {} is not set for the command",
                valid::SOCKET_VAR
            );
            None
        }
    };
    let mut command = ctx.command.clone();
    command
        .env("LEASE_NAME", lease.name())
        .env("LEASE_KEY", lease.key().to_string())
        .env("LEASE_TOKEN", token.to_string());
    if let Some((i, n)) = shard {
        command
            .env("LEASE_SHARD", i.to_string())
            .env("LEASE_SHARDS", n.to_string());
    }
    if let Some(a) = &answerer {
        command.env(valid::SOCKET_VAR, a.path());
    }
    for (name, value) in env {
        command.env(name, value);
    }
    // Leading from before the command starts: a signal from here on finds the runner
    // leading, and the run stops the command as on any shutdown (SIGTERM, --grace).
    let counted = Counted::new(ctx.leading);
    let mut dog = match Watchdog::start(&command).await {
        Ok(dog) => dog,
        Err(e) => {
            let message = e.to_string();
            tracing::error!("{message}; releasing the lease");
            return (Err(JobEnd::Watchdog(message)), None);
        }
    };
    let Some(valid_until) = lease.valid_until() else {
        dog.finish().await;
        return (Ok(()), None);
    };
    let mut deadline = valid_until + ctx.after_validity;
    // The watchdog starts the command (it is its parent and subreaper).
    let mut job = match dog.spawn(deadline).await {
        Ok(job) => job,
        Err(lease_exec::Error::Spawn(e)) => {
            dog.finish().await;
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            };
            let message = format!("cannot run {}: {e}", program(ctx));
            tracing::error!("{message}; releasing the lease");
            return (Err(JobEnd::Spawn { code, message }), None);
        }
        Err(e) => {
            dog.finish().await;
            let message = format!("cannot start the command: {e}");
            tracing::error!("{message}; releasing the lease");
            return (Err(JobEnd::Watchdog(message)), None);
        }
    };
    ctx.current.set(shard.map_or(0, |(i, _)| i), lease);
    let armed = dog.arm(deadline);
    tracing::info!(
        command_pid = job.pid(),
        token,
        watchdog_pid = dog.pid(),
        "leading: started {}",
        program(ctx)
    );
    let ended = match armed {
        Err(e) => Ended::WatchdogLost(e),
        Ok(()) => tokio::select! {
            status = job.wait() => Ended::Exited(status),
            reason = lease.cancelled() => Ended::Cancelled(reason),
            e = renew(&dog, lease, ctx, &mut deadline) => Ended::WatchdogLost(e),
            () = replaced(replace) => Ended::Replaced,
        },
    };
    // The command's own status, when it exited by itself.
    let own = match &ended {
        Ended::Exited(status) => Some(status.as_ref().map_or(EXIT_FAILURE, |s| exit_code(*s))),
        _ => None,
    };
    let result = match ended {
        Ended::Exited(status) => exited(status, &mut job, &dog, lease, ctx, &mut deadline).await,
        Ended::Replaced => {
            graceful_stop(&mut job, &dog, ctx, None).await;
            Ok(())
        }
        Ended::Cancelled(reason) => {
            if graceful(&reason) {
                graceful_stop(&mut job, &dog, ctx, Some(&reason)).await;
            } else if reason.key_may_be_free() {
                // The server may hand the key over now: the job of a
                // standby that wins it starts after the lock delay.
                let wait = session_end_wait(ctx, deadline);
                // The watchdog's line at this deadline names the loss.
                let _ = dog.lost(&reason.to_string());
                let _ = dog.arm(Instant::now() + wait);
                tracing::warn!(
                    command_pid = job.pid(),
                    %reason,
                    "lease lost with its session (the server has freed it): stopping the \
                     command's tree (SIGTERM, SIGKILL in {}, within the lock delay)",
                    humantime::format_duration(wait)
                );
                stop(&mut job, wait, ctx.signals.at_least(2)).await;
            } else {
                let wait = kill_wait(deadline, ctx.grace);
                // The kill deadline in force is now the loss's.
                let _ = dog.lost(&reason.to_string());
                tracing::warn!(
                    command_pid = job.pid(),
                    %reason,
                    "lease lost: stopping the command's process group (SIGTERM, SIGKILL {})",
                    kill_when(wait, ctx.grace)
                );
                // The session may still hold the key (doubtful); if the
                // server ends it meanwhile, the key is free: hurry.
                let hurry = async {
                    tokio::select! {
                        () = ctx.signals.at_least(2) => {}
                        () = session_watch(ctx, "while the command stops") => {}
                    }
                };
                stop(&mut job, wait, hurry).await;
            }
            Ok(())
        }
        Ended::WatchdogLost(e) => {
            let message = format!(
                "cannot renew the watchdog (pid {}): {e}; nothing outside this runner would \
                 stop the command at the lease's deadline",
                dog.pid()
            );
            let wait = kill_wait(deadline, ctx.grace);
            tracing::error!(
                command_pid = job.pid(),
                "{message}; stopping the command's process group (SIGTERM, SIGKILL {}) and \
                 releasing the lease",
                kill_when(wait, ctx.grace)
            );
            stop(&mut job, wait, ctx.signals.at_least(2)).await;
            Err(JobEnd::Watchdog(message))
        }
    };
    ctx.current.clear(shard.map_or(0, |(i, _)| i));
    dog.finish().await;
    drop(counted);
    (result, own)
}

/// `--try` after its COMMAND's end: a lease lost (or handed over) meanwhile
/// would have the run stand by and start COMMAND again on its next win; with
/// `--try` the run ends instead, as on a signal, and `lease run` exits with
/// the command's own status, or 1 when the loss stopped it.
pub(crate) async fn once_only(
    lease: &Lease,
    attempt: &Cell<Attempt>,
    own: Option<i32>,
    ctx: &Ctx<'_>,
) {
    if !lease.is_cancelled() {
        return;
    }
    let reason = lease.cancelled().await;
    if matches!(reason, Reason::Shutdown) {
        return;
    }
    let code = own.unwrap_or(EXIT_FAILURE);
    tracing::error!(
        %reason,
        "the lease was lost while the command ran: not running it again (--try); exiting with \
         status {code}"
    );
    attempt.set(Attempt::Exit(code));
    ctx.signals.stop();
}

/// `lease run --try`'s status when COMMAND was not run: the lease is held.
pub const EXIT_NOT_RUN: i32 = 3;

/// After the command exited by itself.
pub(crate) async fn exited(
    status: Result<ExitStatus, lease_exec::Error>,
    job: &mut Job,
    dog: &Watchdog,
    lease: &Lease,
    ctx: &Ctx<'_>,
    deadline: &mut Instant,
) -> Result<(), JobEnd> {
    let killed = status
        .as_ref()
        .is_ok_and(|s| s.signal() == Some(libc::SIGKILL));
    let expired = lease.valid_until().is_none_or(|v| v <= Instant::now());
    if killed && Instant::now() >= *deadline && expired {
        // The watchdog's kill: this runner was late (stopped, starved), and
        // the lease is lost; the core says so at its next timer.
        tracing::warn!(
            command_pid = job.pid(),
            "the watchdog killed the command at the lease's deadline (this runner was late)"
        );
        job.stop_leftovers(Duration::ZERO, pending()).await;
        let _ = tokio::time::timeout(ctx.grace, lease.cancelled()).await;
        return Ok(());
    }
    let code = status.map_or(EXIT_FAILURE, exit_code);
    // Leftovers get the full grace (the key is held meanwhile); the watchdog
    // stays armed in case the lease is lost in between, and a loss meanwhile
    // hurries the kill as it would for the command itself.
    {
        let snapshot = *deadline;
        let hurry = async {
            let reason = lease.cancelled().await;
            if graceful(&reason) {
                // The key is held while the leftovers stop, unless the
                // session ends meanwhile.
                return session_watch(ctx, "during the graceful stop").await;
            }
            let wait = if reason.key_may_be_free() {
                session_end_wait(ctx, snapshot)
            } else {
                kill_wait(snapshot, ctx.grace)
            };
            // A watchdog deadline from here on is the loss's.
            let _ = dog.lost(&reason.to_string());
            tracing::warn!(
                %reason,
                "lease lost while stopping what the command left running: SIGKILL in {}",
                log::millis(wait)
            );
            // A session kept open (doubtful) that the server ends meanwhile
            // frees the key: hurry.
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = session_watch(ctx, "while the leftovers stop") => {}
            }
        };
        let reap = job.stop_leftovers(ctx.grace, hurry);
        tokio::pin!(reap);
        tokio::select! {
            _ = &mut reap => {}
            e = renew(dog, lease, ctx, deadline) => {
                tracing::warn!("the watchdog cannot be renewed ({e})");
                (&mut reap).await;
            }
        }
    }
    if ctx.scheduled {
        // The schedule logs the run's outcome and keeps the lease.
        return if code == 0 {
            Ok(())
        } else {
            Err(JobEnd::Exited(code))
        };
    }
    if code == 0 {
        tracing::info!("the command exited successfully; releasing the lease");
        Ok(())
    } else {
        tracing::info!("the command exited with status {code}; releasing the lease");
        Err(JobEnd::Exited(code))
    }
}

/// COMMAND's program, for messages.
pub(crate) fn program(ctx: &Ctx<'_>) -> String {
    ctx.command.get_program().to_string_lossy().into_owned()
}

/// Whether a cancelled lease's command gets a graceful stop (the full
/// `--grace`, the key held until its tree is gone): a shutdown, or a shard
/// that its group moves to another replica.
pub(crate) fn graceful(reason: &Reason) -> bool {
    matches!(reason, Reason::Shutdown | Reason::HandedOver)
}

/// A graceful stop of the command's tree: the key is held until the tree is
/// gone, unless the session ends meanwhile; SIGTERM, SIGKILL after `--grace`
/// (or at a second signal). `reason`: the lease's cancellation, `None` for a
/// replace (`--overlap replace`).
pub(crate) async fn graceful_stop(
    job: &mut Job,
    dog: &Watchdog,
    ctx: &Ctx<'_>,
    reason: Option<&Reason>,
) {
    let _ = dog.disarm();
    let grace = humantime::format_duration(ctx.grace);
    match reason {
        Some(reason) => tracing::info!(
            command_pid = job.pid(),
            %reason,
            "stopping the command's tree (SIGTERM, SIGKILL after {grace})"
        ),
        None => tracing::info!(
            command_pid = job.pid(),
            "the next due time replaces this run: stopping the command's tree (SIGTERM, \
             SIGKILL after {grace})"
        ),
    }
    let hurry = async {
        tokio::select! {
            () = ctx.signals.at_least(2) => {}
            () = session_watch(ctx, "during the graceful stop") => {}
        }
    };
    stop(job, ctx.grace, hurry).await;
}

/// SIGTERM to the tree now, SIGKILL after `wait` or once `hurry` resolves
/// (a second signal to the runner, a session that cannot hold the key that
/// long).
pub(crate) async fn stop(
    job: &mut Job,
    wait: Duration,
    hurry: impl std::future::Future<Output = ()>,
) {
    let status = job.terminate(wait, hurry).await;
    let status = status.map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
    tracing::info!("the command stopped ({status})");
}

/// While the command stops with the key held (a graceful stop, or a loss
/// whose session the core keeps open: doubtful): resolves when the tree must
/// be killed because the session holding the key cannot hold it that long
/// any more. The session ended (another backend, or none): half the lock
/// delay after this runner sees it, as after a loss with the session
/// ([`session_end_wait`]). The session is doubtful (a statement timed out or
/// failed): the core closes it at `close_by` at the latest, so the drift
/// allowance before that, and the server may end it sooner (a terminate, a
/// restart), which is then an end as above. Polled every quarter of the lock
/// delay (1 to 5 ms). `during` names the stop in the log lines.
pub(crate) async fn session_watch(ctx: &Ctx<'_>, during: &str) {
    let poll = (ctx.lock_delay / 4).clamp(Duration::from_millis(1), Duration::from_millis(5));
    let held_by = match ctx.locker.status().session {
        SessionState::Ready { backend_pid } => Some(backend_pid),
        _ => None,
    };
    let mut doubtful_seen = false;
    loop {
        match ctx.locker.status().session {
            SessionState::Ready { backend_pid } if Some(backend_pid) == held_by => {}
            SessionState::Doubtful { close_by } => {
                let at = close_by
                    .checked_sub(ctx.drift_allowance)
                    .unwrap_or(close_by);
                let left = at.saturating_duration_since(Instant::now());
                if !doubtful_seen {
                    doubtful_seen = true;
                    tracing::warn!(
                        "the session holding the lease was given up on {during}: SIGKILL to the \
                         command's tree in {} (before the session's close) or as soon as the \
                         session ends",
                        log::millis(left)
                    );
                }
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(poll.min(left)).await;
                continue;
            }
            _ => {
                let wait = ctx.lock_delay / 2;
                tracing::warn!(
                    "the session holding the lease ended {during} (the server has freed the \
                     lease): SIGKILL to the command's tree in {}",
                    humantime::format_duration(wait)
                );
                tokio::time::sleep(wait).await;
                return;
            }
        }
        tokio::time::sleep(poll).await;
    }
}

/// How long a command may take after SIGTERM once its session ended: half the
/// lock delay (never more than [`kill_wait`]). A standby that wins the key
/// starts its job `lock_delay` after its win, which comes after the release,
/// and this runner learns of the end at about the release (or later); the
/// other half is room for this runner's own latency (a timer's wake on a
/// busy machine, a read of `/proc`) before the SIGKILL lands, and the standby
/// still needs its own command's start after the delay.
pub(crate) fn session_end_wait(ctx: &Ctx<'_>, deadline: Instant) -> Duration {
    (ctx.lock_delay / 2).min(kill_wait(deadline, ctx.grace))
}

/// How long a command may take after SIGTERM on a lost lease: until the kill
/// deadline, and never more than `grace`.
pub(crate) fn kill_wait(deadline: Instant, grace: Duration) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .min(grace)
}

/// "after 10s", or "in 300ms, at the lease's deadline" for log lines.
pub(crate) fn kill_when(wait: Duration, grace: Duration) -> String {
    if wait < grace {
        format!("in {}, at the lease's deadline", log::millis(wait))
    } else {
        format!("after {}", humantime::format_duration(grace))
    }
}

/// Renews the watchdog each time the lease's kill deadline moves (read every
/// [`Ctx::poll`]); `deadline` is what the watchdog was last told. Returns only
/// if the watchdog cannot be told.
pub(crate) async fn renew(
    dog: &Watchdog,
    lease: &Lease,
    ctx: &Ctx<'_>,
    deadline: &mut Instant,
) -> lease_exec::Error {
    let mut tick = tokio::time::interval(ctx.poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(valid_until) = lease.valid_until() else {
            continue;
        };
        let next = valid_until + ctx.after_validity;
        if next > *deadline {
            if let Err(e) = dog.arm(next) {
                return e;
            }
            *deadline = next;
        }
    }
}
