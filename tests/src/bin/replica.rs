//! `replica`: one process, one `Locker`, for the failover scenarios in `tests/scenarios.rs`.
//!
//! ```text
//! replica --driver tokio|smol --url CONNSTR --lease NAME [--leases N] [--retry MS]
//!         [--heartbeat MS] [--query-timeout MS] [--guard-margin MS] [--no-guard]
//!         [--no-notify] [--no-wait] [--lock-delay MS] [--app-name NAME] [--job-exit-after MS]
//!         [--tick MS] [--status-poll MS] [--tls-ca PEM] [--group NAME]
//! ```
//!
//! With `--leases N` (N > 1) it runs the leases `NAME-0` .. `NAME-{N-1}`, else `NAME`;
//! with `--group GROUP`, each in the lease group `GROUP` (`Locker::group`).
//! `--also NAME` (repeatable) runs that lease too, `--also-after MS` after the start (a
//! process that holds a lease of its own, then wants another's). `--no-watch`: the watch
//! session off (`ServerWait::Idle`; `--no-wait`: `ServerWait::Off`).
//! Defaults are fast test values: retry 200 ms, heartbeat 150 ms, query timeout 400 ms,
//! guard margin 200 ms, a tick every 50 ms (`--tick 0`: no tick lines). The `pid` and
//! `valid` lines come from polling `Locker::status()` every `--status-poll` ms (default
//! 20); `--status-poll 0` runs no poller at all, so neither line is printed (to measure
//! the process at rest without the poller's cost). `--tls-ca PEM`: TLS required
//! (`sslmode=require`) and verified in full, chain and host name (libpq's `verify-full`),
//! against the CA certificates in that file, with rustls (tokio: tokio-postgres-rustls;
//! smol: lease-smol's `rustls` connector); without it, no TLS.
//!
//! Standard output carries one machine-readable line per event; `T` is
//! `CLOCK_MONOTONIC` in nanoseconds ([`lease_tests::monotonic_nanos`]), comparable across
//! processes:
//!
//! ```text
//! ready T                          the locker exists (nothing connected yet)
//! pid BACKEND_PID T                the session is ready on a new backend (not printed
//!                                  with --status-poll 0)
//! start LEASE TOKEN T              the job starts (the lease was won)
//! valid LEASE UNTIL T              the lease's valid_until changed (as CLOCK_MONOTONIC ns);
//!                                  printed only when the locker runs at most 16 leases
//!                                  (and not with --status-poll 0)
//! tick LEASE T                     a side effect: T was read, then is_valid() was true
//! skip LEASE T                     is_valid() was false at a tick: no side effect
//! cancel LEASE KIND T              the job's cancelled() fired; KIND is one word
//!                                  (session-lost, validity-expired, query-timeout, not-held,
//!                                  query-failed, shutdown, closed, refused, handed-over)
//! stop LEASE T                     the job returned (Ok)
//! shutdown T                       SIGTERM or SIGINT arrived: graceful shutdown begins
//! finished LEASE ok T              the run returned Ok
//! finished LEASE err:MESSAGE T     the run returned an error (the exit status is then 1)
//! ```
//!
//! The job ticks every `--tick` ms until it is cancelled (then it returns `Ok`, so the
//! run contends again) or until `--job-exit-after` ms have passed since its start (then
//! it returns `Ok`, the run completes and releases the lease). The process exits when
//! every run has returned. Logs (`tracing`, `RUST_LOG`, default `info`) go to stderr.
//!
//! Built with the crate's `metrics` feature, it installs a Prometheus recorder (never
//! scraped) and its drivers record their metrics into it.

use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use lease_proto::{LeaseState, Options, Reason, ServerWait, SessionState, Status};
use lease_tests::monotonic_nanos;
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DriverKind {
    Tokio,
    Smol,
}

#[derive(Debug)]
struct Args {
    driver: DriverKind,
    url: String,
    lease: String,
    leases: usize,
    /// `--also`: more leases, started `also_after` after the others.
    also: Vec<String>,
    also_after: Duration,
    /// `--no-wait`: [`ServerWait::Off`]; `--no-watch`: [`ServerWait::Idle`] (unless off).
    server_wait: ServerWait,
    retry: Duration,
    heartbeat: Duration,
    query_timeout: Duration,
    guard_margin: Duration,
    guard: bool,
    notify: bool,
    lock_delay: Duration,
    app_name: String,
    /// How often to poll `Locker::status()` for `pid`/`valid` lines; `None`: no poller.
    status_poll: Option<Duration>,
    /// `--tls-ca`: TLS verified in full against these CA certificates.
    tls_ca: Option<std::path::PathBuf>,
    /// `--group NAME`: every run in that lease group.
    group: Option<String>,
    job: JobConfig,
}

/// What every job does.
#[derive(Clone, Copy, Debug)]
struct JobConfig {
    /// `None`: no tick lines.
    tick: Option<Duration>,
    /// Return `Ok` this long after the start.
    exit_after: Option<Duration>,
}

const USAGE: &str = "usage: replica --driver tokio|smol --url CONNSTR --lease NAME [--leases N] \
[--retry MS] [--heartbeat MS] [--query-timeout MS] [--guard-margin MS] [--no-guard] \
[--no-notify] [--app-name NAME] [--job-exit-after MS] [--tick MS] [--status-poll MS] \
[--tls-ca PEM] [--group NAME]
  --group NAME      run every lease in the lease group NAME
  --tls-ca PEM      TLS required, verified in full (chain and host name) against the CA
                    certificates in PEM
  --status-poll MS  poll the locker's status every MS ms (default 20) to print `pid` and
                    `valid` lines; 0: no poller, no such lines";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        driver: DriverKind::Tokio,
        url: String::new(),
        lease: String::new(),
        leases: 1,
        also: Vec::new(),
        also_after: Duration::ZERO,
        server_wait: ServerWait::IdleAndWatch,
        retry: Duration::from_millis(200),
        heartbeat: Duration::from_millis(150),
        query_timeout: Duration::from_millis(400),
        guard_margin: Duration::from_millis(200),
        guard: true,
        notify: true,
        lock_delay: lease_proto::limits::DEFAULT_LOCK_DELAY,
        app_name: "lease-replica".to_owned(),
        status_poll: Some(Duration::from_millis(20)),
        tls_ca: None,
        group: None,
        job: JobConfig {
            tick: Some(Duration::from_millis(50)),
            exit_after: None,
        },
    };
    let mut driver = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let ms = |v: String| -> Result<Duration, String> {
            v.parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| format!("{flag}: not a number of milliseconds: {v}"))
        };
        match flag.as_str() {
            "--driver" => {
                driver = Some(match value()?.as_str() {
                    "tokio" => DriverKind::Tokio,
                    "smol" => DriverKind::Smol,
                    other => return Err(format!("--driver: tokio or smol, not {other}")),
                })
            }
            "--url" => args.url = value()?,
            "--lease" => args.lease = value()?,
            "--leases" => {
                let v = value()?;
                args.leases = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("--leases: not a positive number: {v}"))?;
            }
            "--also" => args.also.push(value()?),
            "--also-after" => args.also_after = ms(value()?)?,
            "--no-watch" if args.server_wait.idle() => args.server_wait = ServerWait::Idle,
            "--no-watch" => {}
            "--retry" => args.retry = ms(value()?)?,
            "--heartbeat" => args.heartbeat = ms(value()?)?,
            "--query-timeout" => args.query_timeout = ms(value()?)?,
            "--guard-margin" => args.guard_margin = ms(value()?)?,
            "--no-guard" => args.guard = false,
            "--no-notify" => args.notify = false,
            "--no-wait" => args.server_wait = ServerWait::Off,
            "--lock-delay" => args.lock_delay = ms(value()?)?,
            "--app-name" => args.app_name = value()?,
            "--job-exit-after" => args.job.exit_after = Some(ms(value()?)?),
            "--tick" => args.job.tick = Some(ms(value()?)?).filter(|d| !d.is_zero()),
            "--status-poll" => args.status_poll = Some(ms(value()?)?).filter(|d| !d.is_zero()),
            "--tls-ca" => args.tls_ca = Some(value()?.into()),
            "--group" => args.group = Some(value()?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    args.driver = driver.ok_or_else(|| format!("--driver is required\n{USAGE}"))?;
    if args.url.is_empty() || args.lease.is_empty() {
        return Err(format!("--url and --lease are required\n{USAGE}"));
    }
    Ok(args)
}

impl Args {
    fn options(&self) -> Options {
        {
            let mut o = Options::default();
            o.retry_interval = self.retry;
            o.heartbeat_interval = self.heartbeat;
            o.query_timeout = self.query_timeout;
            o.guard_margin = self.guard_margin;
            o.server_guard = self.guard;
            o.notify_handover = self.notify;
            o.server_wait = self.server_wait;
            o.lock_delay = self.lock_delay;
            o.max_leases = self.leases.max(lease_proto::limits::DEFAULT_MAX_LEASES);
            o
        }
    }

    /// The connection config: `--url`, the application name, and with `--tls-ca`
    /// `sslmode=require` (TLS or nothing), plus the rustls configuration to connect with.
    fn config(&self) -> Result<(tokio_postgres::Config, Option<rustls::ClientConfig>), String> {
        let mut config: tokio_postgres::Config =
            self.url.parse().map_err(|e| format!("--url: {e}"))?;
        config.application_name(&self.app_name);
        let tls = match &self.tls_ca {
            None => None,
            Some(ca) => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                Some(lease_tests::client_config(ca).map_err(|e| format!("--tls-ca: {e}"))?)
            }
        };
        Ok((config, tls))
    }

    /// Every lease to run, with how long after the start its run begins.
    fn names(&self) -> Vec<(String, Duration)> {
        let first = if self.leases == 1 {
            vec![self.lease.clone()]
        } else {
            (0..self.leases)
                .map(|i| format!("{}-{i}", self.lease))
                .collect()
        };
        let first = first.into_iter().map(|n| (n, Duration::ZERO));
        let also = self.also.iter().map(|n| (n.clone(), self.also_after));
        first.chain(also).collect()
    }
}

/// One line on stdout, flushed at once (a test reads it while we run).
fn out(line: impl Display) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

fn kind(reason: &Reason) -> &'static str {
    match reason {
        Reason::SessionEnded(_) => "session-lost",
        Reason::QueryTimeout => "query-timeout",
        Reason::ValidityExpired => "validity-expired",
        Reason::NotHeld => "not-held",
        Reason::QueryFailed(_) => "query-failed",
        Reason::Shutdown => "shutdown",
        Reason::Closed => "closed",
        Reason::Refused(_) => "refused",
        Reason::HandedOver => "handed-over",
        _ => "other",
    }
}

/// The job: tick (checking validity before each "side effect") until cancelled or done.
/// Both drivers hand out the driver core's `Lease`.
async fn job<S, F>(lease: lease_tokio::Lease, cfg: JobConfig, sleep: S) -> Result<(), Infallible>
where
    S: Fn(Duration) -> F,
    F: Future<Output = ()> + Send,
{
    let name = lease.name().to_owned();
    let started = Instant::now();
    out(format_args!(
        "start {name} {} {}",
        lease.token(),
        monotonic_nanos()
    ));
    let exit_at = cfg.exit_after.map(|d| started + d);
    let reason = loop {
        let now = Instant::now();
        if exit_at.is_some_and(|at| at <= now) {
            break None;
        }
        let mut step = cfg.tick.unwrap_or(Duration::from_secs(3600));
        if let Some(at) = exit_at {
            step = step.min(at - now);
        }
        let cancelled = async { Some(lease.cancelled().await) };
        let woke = async {
            sleep(step).await;
            None
        };
        if let Some(reason) = futures_lite::future::or(cancelled, woke).await {
            break Some(reason);
        }
        if cfg.tick.is_some() && exit_at.is_none_or(|at| Instant::now() < at) {
            // Read the clock first: a `tick` line's time is never later than the check.
            let t = monotonic_nanos();
            if lease.is_valid() {
                out(format_args!("tick {name} {t}"));
            } else {
                out(format_args!("skip {name} {t}"));
            }
        }
    };
    if let Some(reason) = reason {
        let t = monotonic_nanos();
        out(format_args!("cancel {name} {} {t}", kind(&reason)));
        tracing::info!(lease = %name, %reason, "job cancelled");
    }
    out(format_args!("stop {name} {}", monotonic_nanos()));
    Ok(())
}

/// `CLOCK_MONOTONIC` nanoseconds of an `Instant` (Instant is CLOCK_MONOTONIC on Linux).
fn instant_nanos(at: Instant) -> u64 {
    let (now, mono) = (Instant::now(), monotonic_nanos());
    if at >= now {
        mono + (at - now).as_nanos() as u64
    } else {
        mono.saturating_sub((now - at).as_nanos() as u64)
    }
}

/// Prints `pid` and `valid` lines from status snapshots.
#[derive(Default)]
struct StatusPrinter {
    pid: Option<i64>,
    valid: std::collections::HashMap<String, Instant>,
}

impl StatusPrinter {
    fn show(&mut self, status: &Status) {
        if let SessionState::Ready { backend_pid } = status.session {
            if self.pid != Some(backend_pid) {
                self.pid = Some(backend_pid);
                out(format_args!("pid {backend_pid} {}", monotonic_nanos()));
            }
        }
        if status.leases.len() > 16 {
            return;
        }
        for lease in &status.leases {
            if let LeaseState::Leading { valid_until, .. } = lease.state {
                let name = lease.lease.name();
                if self.valid.get(name) != Some(&valid_until) {
                    self.valid.insert(name.to_owned(), valid_until);
                    out(format_args!(
                        "valid {name} {} {}",
                        instant_nanos(valid_until),
                        monotonic_nanos()
                    ));
                }
            }
        }
    }
}

/// Prints `pid` and `valid` lines from `status()` every `every`, forever (both drivers'
/// pollers; `sleep` is the runtime's).
async fn poll_status<S, F>(status: impl Fn() -> Status, every: Duration, sleep: S)
where
    S: Fn(Duration) -> F,
    F: Future<Output = ()>,
{
    let mut printer = StatusPrinter::default();
    loop {
        printer.show(&status());
        sleep(every).await;
    }
}

/// One run of the replica, on either driver (both lockers are the driver core's; `sleep`
/// is the runtime's): after `after`, the job on the lease `name`, in `--group` if given,
/// until the shutdown signal.
fn replica_run<A, S, F>(
    args: &Args,
    locker: &lease_driver::Locker<A>,
    name: &str,
    after: Duration,
    shutdown: watch::Receiver<bool>,
    sleep: S,
) -> impl Future<Output = Result<(), lease_driver::RunError<Infallible>>>
where
    S: Fn(Duration) -> F + Copy,
    F: Future<Output = ()> + Send,
{
    let (locker, group, name, cfg) = (
        locker.clone(),
        args.group.clone(),
        name.to_owned(),
        args.job,
    );
    async move {
        sleep(after).await;
        let signal = wait_shutdown(shutdown);
        let job = move |lease| job(lease, cfg, sleep);
        match group {
            Some(g) => locker.group(&g).run_until(&name, signal, job).await,
            None => locker.run_until(&name, signal, job).await,
        }
    }
}

/// Prints a run's result; `true` if it was an error.
fn finished<E: Display>(name: &str, result: Result<(), E>) -> bool {
    let t = monotonic_nanos();
    match result {
        Ok(()) => {
            out(format_args!("finished {name} ok {t}"));
            false
        }
        Err(e) => {
            let msg = e.to_string().replace(['\r', '\n'], " ");
            out(format_args!("finished {name} err:{msg} {t}"));
            true
        }
    }
}

/// Blocks SIGTERM and SIGINT in every thread (call before any thread exists) and turns
/// them into a graceful-shutdown signal on a thread of their own.
fn shutdown_signal() -> watch::Receiver<bool> {
    // SAFETY: plain libc calls on a local, initialised signal set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let (tx, rx) = watch::channel(false);
    std::thread::spawn(move || loop {
        let mut sig = 0;
        // SAFETY: `set` is a valid signal set and `sig` a valid out-pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            out(format_args!("shutdown {}", monotonic_nanos()));
            let _ = tx.send(true);
        }
    });
    rx
}

async fn wait_shutdown(mut rx: watch::Receiver<bool>) {
    if rx.wait_for(|&v| v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn main() -> ExitCode {
    let shutdown = shutdown_signal();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(?args, "replica starting");
    // With the `metrics` feature (the bench's metrics-on build): a recorder as `lease run
    // --metrics-addr` installs it, before the locker exists so that it gets the
    // descriptions. Nothing scrapes it.
    #[cfg(feature = "metrics")]
    if let Err(e) = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
        eprintln!("replica: metrics recorder: {e}");
        return ExitCode::from(2);
    }
    let failed = match args.driver {
        DriverKind::Tokio => tokio_main(&args, shutdown),
        DriverKind::Smol => smol_main(&args, shutdown),
    };
    match failed {
        Ok(false) => ExitCode::SUCCESS,
        Ok(true) => ExitCode::from(1),
        Err(e) => {
            eprintln!("replica: {e}");
            ExitCode::from(2)
        }
    }
}

/// The tokio replica; `Ok(true)` if a run failed.
fn tokio_main(args: &Args, shutdown: watch::Receiver<bool>) -> Result<bool, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(async {
        let (config, tls) = args.config()?;
        let locker = match tls {
            None => lease_tokio::Locker::spawn(config, tokio_postgres::NoTls, args.options()),
            Some(tls) => lease_tokio::Locker::spawn(
                config,
                tokio_postgres_rustls::MakeRustlsConnect::new(tls),
                args.options(),
            ),
        }
        .map_err(|e| e.to_string())?;
        out(format_args!("ready {}", monotonic_nanos()));
        let sleep = tokio::time::sleep;
        let poller = args.status_poll.map(|every| {
            let locker = locker.clone();
            tokio::spawn(poll_status(move || locker.status(), every, sleep))
        });
        let runs: Vec<_> = args
            .names()
            .into_iter()
            .map(|(name, after)| {
                let run = replica_run(args, &locker, &name, after, shutdown.clone(), sleep);
                (name, tokio::spawn(run))
            })
            .collect();
        let mut failed = false;
        for (name, run) in runs {
            let result = run.await.map_err(|e| format!("run task: {e}"))?;
            failed |= finished(&name, result);
        }
        if let Some(poller) = poller {
            poller.abort();
        }
        Ok(failed)
    })
}

/// The smol replica (its driver and runs on smol's global executor); `Ok(true)` if a
/// run failed.
fn smol_main(args: &Args, shutdown: watch::Receiver<bool>) -> Result<bool, String> {
    smol::block_on(async {
        let (config, tls) = args.config()?;
        let (locker, driver) = match tls {
            None => lease_smol::Locker::from_config(config, tokio_postgres::NoTls, args.options())
                .map(|(locker, driver)| (locker, smol::spawn(driver))),
            Some(tls) => {
                let tls = lease_smol::rustls::MakeRustls::new(tls);
                lease_smol::Locker::from_config(config, tls, args.options())
                    .map(|(locker, driver)| (locker, smol::spawn(driver)))
            }
        }
        .map_err(|e| e.to_string())?;
        out(format_args!("ready {}", monotonic_nanos()));
        let sleep = |d: Duration| async move {
            smol::Timer::after(d).await;
        };
        let poller = args.status_poll.map(|every| {
            let locker = locker.clone();
            smol::spawn(poll_status(move || locker.status(), every, sleep))
        });
        let runs: Vec<_> = args
            .names()
            .into_iter()
            .map(|(name, after)| {
                let run = replica_run(args, &locker, &name, after, shutdown.clone(), sleep);
                (name, smol::spawn(run))
            })
            .collect();
        drop(locker);
        let mut failed = false;
        for (name, run) in runs {
            failed |= finished(&name, run.await);
        }
        if let Some(poller) = poller {
            poller.cancel().await;
        }
        // Every run is over and no locker is left: the driver ends by itself.
        driver.await;
        Ok(failed)
    })
}
