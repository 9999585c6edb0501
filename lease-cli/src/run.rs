//! `lease run`: contend for a lease and run a command while holding it.

use std::cell::Cell;
use std::fmt;
use std::future::pending;
use std::time::Duration;

use lease_tokio::{Lease, LeaseId, Locker, Options, Reason, RunError, SessionState};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};
use tokio_postgres::{Config, NoTls};

use crate::args::{LogFormat, RunArgs};
use crate::child::{exit_code, ChildSpec, Job};
use crate::conn::{self, Target};
use crate::{log, usage_error, EXIT_FAILURE};

/// Everything `lease run` needs once the input is validated.
struct Plan {
    lease: LeaseId,
    spec: ChildSpec,
    options: Options,
    target: Target,
    grace: Duration,
    quiet: bool,
    format: LogFormat,
}

/// Runs `lease run`; returns the process exit status.
pub fn main(args: RunArgs) -> i32 {
    let plan = match validate(args) {
        Ok(plan) => plan,
        Err((code, message)) => return usage_error(code, &message),
    };
    let (holders_tx, holders_rx) = mpsc::unbounded_channel();
    let holders_tx = (!plan.quiet).then_some(holders_tx);
    log::init(plan.quiet, plan.format, holders_tx);
    // One thread: the child's PR_SET_PDEATHSIG is tied to the thread that
    // spawns it, which must live as long as the process (see `child`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => rt.block_on(contend(plan, holders_rx)),
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            EXIT_FAILURE
        }
    }
}

/// Checks everything that can be checked without the database: the name, the
/// command, the intervals and the connection string. `Err((status, message))`.
fn validate(args: RunArgs) -> Result<Plan, (i32, String)> {
    let lease = LeaseId::named(args.name.as_str()).map_err(|e| (2, e.to_string()))?;
    let spec = ChildSpec::new(args.command).ok_or((2, "missing COMMAND after `--`".to_owned()))?;
    let mut options = Options {
        retry_interval: args.retry_interval,
        heartbeat_interval: args.heartbeat_interval,
        query_timeout: args.query_timeout,
        server_guard: !args.no_server_guard,
        notify_handover: !args.no_notify,
        ..Options::default()
    };
    if let Some(margin) = args.guard_margin {
        options.guard_margin = margin;
    }
    if let Err(e) = options.validate() {
        return Err((2, format!("inconsistent intervals: {e}")));
    }
    if args.grace.is_zero() {
        return Err((2, "--grace must be greater than zero".to_owned()));
    }
    let mut target = conn::resolve(&args.conn).map_err(|e| (2, e))?;
    target
        .config
        .application_name(application_name(lease.name()));
    spec.check()?;
    Ok(Plan {
        lease,
        spec,
        options,
        target,
        grace: args.grace,
        quiet: args.quiet,
        format: args.log_format,
    })
}

/// `lease:<NAME>`, cut to the 63 bytes the server keeps (on a character
/// boundary).
pub fn application_name(name: &str) -> String {
    let mut s = format!("lease:{name}");
    let mut end = s.len().min(63);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

/// Why a job ended in a way that ends the run.
#[derive(Debug)]
enum JobEnd {
    /// The command exited with this non-zero status (128 + signal if killed).
    Exited(i32),
    /// The command could not be started.
    Spawn { code: i32, message: String },
}

impl fmt::Display for JobEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobEnd::Exited(code) => write!(f, "the command exited with status {code}"),
            JobEnd::Spawn { message, .. } => f.write_str(message),
        }
    }
}

impl std::error::Error for JobEnd {}

/// SIGTERM and SIGINT, counted.
struct Signals {
    count: watch::Receiver<u32>,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (tx, count) = watch::channel(0);
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
                    tracing::warn!("received {name} again: not waiting for the grace period");
                }
            }
        });
        Ok(Signals { count })
    }

    /// Resolves once `n` signals have arrived.
    async fn at_least(&self, n: u32) {
        let mut count = self.count.clone();
        if count.wait_for(|&c| c >= n).await.is_err() {
            pending::<()>().await;
        }
    }
}

/// The job's shared context (borrowed by every call of the job).
struct Ctx<'a> {
    spec: &'a ChildSpec,
    grace: Duration,
    signals: &'a Signals,
    /// A child runs (or is being stopped).
    leading: &'a Cell<bool>,
}

async fn contend(plan: Plan, holders: mpsc::UnboundedReceiver<i64>) -> i32 {
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot install signal handlers: {e}");
            return EXIT_FAILURE;
        }
    };
    let locker = match Locker::new(plan.target.config.clone(), NoTls, plan.options.clone()) {
        Ok((locker, driver)) => {
            tokio::spawn(driver);
            locker
        }
        Err(e) => {
            tracing::error!("{e}");
            return 2;
        }
    };
    tracing::info!(
        lease = plan.lease.name(),
        key = plan.lease.key(),
        "contending for the lease at {}",
        plan.target.summary
    );
    let monitor = tokio::spawn(monitor(locker.clone(), plan.target.summary.clone()));
    let lookups = tokio::spawn(describe_holders(
        plan.target.config.clone(),
        plan.options.query_timeout,
        plan.lease.clone(),
        holders,
    ));

    let leading = Cell::new(false);
    let ctx = Ctx {
        spec: &plan.spec,
        grace: plan.grace,
        signals: &signals,
        leading: &leading,
    };
    let ctx = &ctx;
    let run = locker.run_lease(plan.lease.clone(), signals.at_least(1), move |lease| {
        lead(lease, ctx)
    });
    let standing_by_at_signal = async {
        signals.at_least(1).await;
        if leading.get() {
            // The run shuts the job down and releases the lease.
            pending::<()>().await;
        }
    };
    let code = tokio::select! {
        result = run => outcome(result),
        () = standing_by_at_signal => {
            tracing::info!("not leading: exiting");
            0
        }
    };
    monitor.abort();
    lookups.abort();
    if code == 0 || code > 2 {
        // Ends the session politely; exiting would end it anyway.
        let _ = tokio::time::timeout(Duration::from_secs(1), locker.close()).await;
    }
    code
}

/// The exit status for how the run ended.
fn outcome(result: Result<(), RunError<JobEnd>>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(RunError::Job(JobEnd::Exited(code))) => code,
        Err(RunError::Job(JobEnd::Spawn { code, .. })) => code,
        Err(RunError::Refused(r)) => {
            tracing::error!("refused: {r}");
            EXIT_FAILURE
        }
        Err(RunError::Name(e)) => {
            tracing::error!("{e}");
            2
        }
        Err(e) => {
            tracing::error!("{e}");
            EXIT_FAILURE
        }
    }
}

/// The job: runs the command while the lease is held.
async fn lead(lease: Lease, ctx: &Ctx<'_>) -> Result<(), JobEnd> {
    let token = lease.token();
    if lease.is_cancelled() {
        return Ok(());
    }
    let env = [
        ("LEASE_NAME", lease.name().to_owned()),
        ("LEASE_KEY", lease.key().to_string()),
        ("LEASE_TOKEN", token.to_string()),
    ];
    let mut job = match Job::spawn(ctx.spec, &env) {
        Ok(job) => job,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            };
            let message = format!("cannot run {}: {e}", ctx.spec.display());
            tracing::error!("{message}; releasing the lease");
            return Err(JobEnd::Spawn { code, message });
        }
    };
    ctx.leading.set(true);
    tracing::info!(
        pid = job.pid(),
        token,
        "leading: started {}",
        ctx.spec.display()
    );
    let ended = tokio::select! {
        status = job.wait() => Ok(status),
        reason = lease.cancelled() => Err(reason),
    };
    let result = match ended {
        Ok(status) => {
            let code = status.map_or(EXIT_FAILURE, exit_code);
            job.reap_group(ctx.grace).await;
            if code == 0 {
                tracing::info!("the command exited successfully; releasing the lease");
                Ok(())
            } else {
                tracing::info!("the command exited with status {code}; releasing the lease");
                Err(JobEnd::Exited(code))
            }
        }
        Err(reason) => {
            let grace = ctx.grace;
            if reason == Reason::Shutdown {
                tracing::info!(
                    pid = job.pid(),
                    "stopping the command's process group (SIGTERM, SIGKILL after {})",
                    humantime::format_duration(grace)
                );
            } else {
                tracing::warn!(
                    pid = job.pid(),
                    %reason,
                    "lease lost: stopping the command's process group (SIGTERM, SIGKILL after {})",
                    humantime::format_duration(grace)
                );
            }
            let status = job.terminate(grace, ctx.signals.at_least(2)).await;
            let status = status.map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
            tracing::info!("the command stopped ({status})");
            Ok(())
        }
    };
    ctx.leading.set(false);
    result
}

/// Says on stderr when the database cannot be reached (the driver retries on
/// its own; this is not fatal), and when it can again.
async fn monitor(locker: Locker, summary: String) {
    let mut reported: Option<tokio::time::Instant> = None;
    let mut interval = tokio::time::interval(Duration::from_millis(200));
    loop {
        interval.tick().await;
        match locker.status().session {
            SessionState::Backoff { failures, .. } if failures >= 2 => {
                let due = reported.is_none_or(|at| at.elapsed() >= Duration::from_secs(30));
                if due {
                    tracing::warn!(
                        failures,
                        "cannot reach the database ({summary}); still retrying (not fatal)"
                    );
                    reported = Some(tokio::time::Instant::now());
                }
            }
            SessionState::Ready { .. } if reported.is_some() => {
                tracing::info!("database reachable again");
                reported = None;
            }
            _ => {}
        }
    }
}

/// Looks up who holds the lease (application_name, client address) each time
/// the holder's backend pid changes, on a short-lived separate connection.
/// Failures are logged at debug level and otherwise ignored.
async fn describe_holders(
    mut config: Config,
    timeout: Duration,
    lease: LeaseId,
    mut pids: mpsc::UnboundedReceiver<i64>,
) {
    config.application_name(format!(
        "{} (holder lookup)",
        application_name(lease.name())
    ));
    config.connect_timeout(timeout);
    let mut last = None;
    while let Some(pid) = pids.recv().await {
        if last == Some(pid) {
            continue;
        }
        last = Some(pid);
        match tokio::time::timeout(timeout, lookup_holder(&config, pid)).await {
            Ok(Ok(Some(h))) => tracing::info!(
                lease = lease.name(),
                holder_pid = pid,
                application_name = h.application_name,
                client = h.client,
                since = h.since,
                "the lease is held by another session"
            ),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::debug!("holder lookup failed: {}", conn::redact(&e)),
            Err(_) => tracing::debug!("holder lookup timed out"),
        }
    }
}

/// What `pg_stat_activity` says about the holder's session.
struct HolderInfo {
    application_name: String,
    client: String,
    since: String,
}

async fn lookup_holder(config: &Config, pid: i64) -> Result<Option<HolderInfo>, String> {
    let pid = i32::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| conn::error_chain(&e))?;
    let connection = tokio::spawn(connection);
    let row = client
        .query_opt(
            "SELECT application_name, host(client_addr), client_port, \
             to_char(backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') \
             FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .map_err(|e| conn::error_chain(&e))?;
    drop(client);
    let _ = connection.await;
    let Some(row) = row else {
        return Ok(None);
    };
    let text = |i: usize| row.try_get::<_, Option<String>>(i).ok().flatten();
    let port = row.try_get::<_, Option<i32>>(2).ok().flatten();
    let client = match (text(1), port) {
        (Some(a), Some(p)) if p > 0 => format!("{a}:{p}"),
        (Some(a), _) => a,
        (None, Some(-1)) => "local socket".to_owned(),
        _ => "unknown".to_owned(),
    };
    Ok(Some(HolderInfo {
        application_name: text(0).unwrap_or_default(),
        client,
        since: text(3).unwrap_or_else(|| "?".to_owned()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_names_fit_the_server() {
        assert_eq!(application_name("job"), "lease:job");
        let long = application_name(&"é".repeat(40));
        assert!(long.len() <= 63);
        assert!(long.starts_with("lease:é"));
    }
}
