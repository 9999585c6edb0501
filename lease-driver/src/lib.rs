//! # lease-driver: the runtime-independent half of every lease driver
//!
//! [`lease_proto`] decides everything; this crate carries its decisions out
//! for any async runtime: the [`Locker`] handle, the run futures and their
//! [`Lease`] handles, the routing of the core's commands to the runs and to
//! the connection, cancellation, status, error types, one tracing line per
//! event, and the [`Driver`] future that owns the connection. A runtime
//! adapter (`lease-tokio`, `lease-smol`) implements [`Runtime`] — a clock, a
//! timer and a way to open a [`Session`] (a tokio-postgres connection, as a
//! [`PostgresSession`]) — and nothing else.
//!
//! Most users want an adapter, not this crate. To drive leases on another
//! runtime, implement [`Runtime`] and call [`Locker::with_runtime`]:
//!
//! ```no_run
//! use std::pin::Pin;
//! use std::task::{Context, Poll};
//! use std::time::Instant;
//! use lease_driver::{BoxFuture, Connected, Locker, Options, Runtime, Timer};
//!
//! #[derive(Debug)]
//! struct MyRuntime;
//!
//! # #[derive(Debug)] struct MyTimer;
//! # impl Timer for MyTimer {
//! #     fn reset(self: Pin<&mut Self>, _: Instant) {}
//! #     fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> { Poll::Pending }
//! # }
//! impl Runtime for MyRuntime {
//!     fn now(&self) -> Instant {
//!         Instant::now() // the clock the timers fire by
//!     }
//!     fn timer(&self, at: Instant) -> Pin<Box<dyn Timer>> {
//!         # let _ = at;
//!         Box::pin(MyTimer) // a resettable timer of the runtime
//!     }
//!     fn connect(&self, config: tokio_postgres::Config) -> BoxFuture<Connected> {
//!         # let _ = config;
//!         // open a socket, `config.connect_raw(socket, tls)`, then
//!         // `Ok(PostgresSession::boxed(client, connection))`
//!         Box::pin(async { Err(lease_driver::SessionError::other("not in this example")) })
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = lease_driver::parse_config("host=127.0.0.1 user=postgres")?;
//! let (locker, driver) = Locker::with_runtime(MyRuntime, config, Options::default())?;
//! // Spawn or poll `driver` on your runtime, then `locker.run(...)`.
//! # drop((locker, driver)); Ok(()) }
//! ```
//!
//! ## Guarantees and defaults
//!
//! Every rule lives in the sans-IO core, [`lease_proto`]. What a lease
//! promises, with its bound, its conditions and the tests behind it, is in
//! `docs/guarantees.md` of the repository (the guide, `docs/README.md`,
//! links every page); every option's default is in the docs of [`Options`].
//!
//! ## Cancellation
//!
//! - **Graceful**: [`Locker::run_until`]'s shutdown signal, or
//!   [`Locker::close`]. The job's [`Lease::cancelled`] fires; the run waits
//!   for the job to return, releases the key (waking standbys) and returns
//!   `Ok(())`.
//! - **Lost lease** (session lost, lease not confirmed in time): the lease is
//!   cancelled the same way; when the job returns, the run stands by again and
//!   calls the job anew on its next win. Jobs must therefore be restartable.
//! - **Drop**: dropping a run future drops the job future at once (it gets no
//!   chance to finish); the driver then releases the key.
//! - **Driver gone**: if the [`Driver`] is dropped, the session ends with it
//!   (the server releases every key), jobs are cancelled, and every run
//!   returns [`RunError::DriverStopped`] once its job returned.
//!
//! ## Errors
//!
//! Construction fails only on bad [`Options`] or configuration ([`Error`]).
//! A run returns `Ok(())` when its job completed, or on shutdown or close,
//! and a [`RunError`] for the job's own error, a bad name, a lease already
//! run by this locker, too many leases, a refused setup, a configuration
//! error before the first session ([`RunError::Config`]: a wrong password,
//! an unknown role or database, a TLS verification failure), or a stopped
//! driver. Network errors are retried with backoff, never returned;
//! [`Locker::status`]'s [`Status::last_error`] says what the last one was.
//!
//! ## Several hosts
//!
//! With a host list (`host=a,b`, several `hostaddr`s, a multi-host URL) the
//! driver tries the hosts in order (shuffled with `load_balance_hosts=random`),
//! one at a time, as libpq does, and gives each its own share of the attempt:
//! `connect_timeout` if set, at most [`Options::query_timeout`] divided by the
//! number of hosts (the locker bounds the whole attempt by the query
//! timeout), so every host is tried within one attempt. The share covers the
//! whole of a host's attempt — socket, TLS, startup and authentication, and
//! the `target_session_attrs` check, which the driver runs itself (on every
//! runtime) — so a host that accepts
//! TCP connections but never answers (a frozen server: the kernel's listen
//! backlog completes the handshake) costs one share and the next host is
//! tried. The first host that opens wins; else the attempt fails with the
//! last host's error, every host's error in its message. A host whose name
//! resolves to several addresses shares its one share among them. Set
//! `target_session_attrs=read-write` so that a standby in the list is
//! skipped rather than connected to (the core only finds a standby at setup
//! and retries from the first host after a backoff).
//!
//! For a lease, `read-write` means **a primary**: the driver checks
//! `SELECT pg_is_in_recovery()` (libpq's `primary`), not libpq's
//! `SHOW transaction_read_only`. No lease statement writes (advisory locks,
//! `set_config`, `LISTEN` and `pg_notify` all run in a read-only
//! transaction), so a primary whose sessions default to read-only — `ALTER
//! ROLE … SET default_transaction_read_only = on`, a write freeze before a
//! cut-over — still holds leases, where libpq's check would skip every host
//! and the locker would retry forever. `read-only` keeps libpq's meaning
//! (useless for a lease: a standby is refused at setup). Test:
//! `a_frozen_first_host_does_not_block_failover_to_the_next`,
//! `read_write_skips_a_standby_listed_first` and
//! `read_write_leads_on_a_primary_whose_role_defaults_to_read_only` in
//! `tests/tests/behaviour/drivers`.
//!
//! **No lease on a stale primary.** When a lease session opens on one of
//! several hosts, whatever `target_session_attrs` says, the driver asks
//! that server and every other listed host for its WAL timeline (one short
//! connection per other host, in parallel, each within its share; a host
//! that failed earlier in the same walk without an answer of its server is
//! not asked again) and closes the session before its setup when another listed
//! host is a primary on a newer timeline: an old primary that an HA tool
//! has not demoted yet while its standby was promoted. One `WARN` names both
//! hosts and timelines, and the next host is tried. A timeline that cannot
//! be read is logged once per locker, and that host is not compared
//! ([`Session::primary_timeline`]: a session of your own runtime that does
//! not implement it turns the check off, with that line). What is covered,
//! what is not and the cost: the stale-primary promise in
//! `docs/guarantees.md`; test: `a_stale_primary_listed_first_is_never_led_on`
//! in `tests/tests/behaviour/ha_promotion.rs`.
//!
//! ## Logs, the job span and metrics
//!
//! The locker logs one `tracing` line per event of the core, and every call
//! of a job runs inside a `tracing` span `job` (the lease, its key, the run
//! and the fencing token), so every line the job logs carries them. With the
//! cargo feature `metrics` (off by default; `lease-tokio` and `lease-smol`
//! forward it under the same name) the locker records metrics through the
//! [`metrics`](https://docs.rs/metrics) facade. The span's level and target,
//! every metric with its type, labels and meaning, and what to alert on:
//! `docs/metrics.md` of the repository.
//!
//! ## Layout
//!
//! - [`runtime`]: the [`Runtime`], [`Timer`], [`Session`] and [`Connection`]
//!   traits, and [`PostgresSession`].
//! - `driver`: the [`Driver`] future and its poll order.
//! - `hosts`: opening a session over a host list.
//! - `probe`: the pooler probe's second connection, bounded, and the error
//!   that names a full session pool.
//! - `shared`: the state shared by the driver and the runs, and the drain
//!   rule that routes the core's outputs.
//! - `run`: the run future and the [`Lease`] handle.
//! - `group`: [`Group`], runs that share a lease group's leases.
//! - `try_run`: [`Locker::try_run`], a job that runs once if its lease is won
//!   in time.
//! - `schedule`: `Locker::schedule`, a job at each due time (feature
//!   `schedule`).
//! - `cancel`, `log`: a runtime-free cancellation signal, event logging.
//! - `metrics`: every metric (feature `metrics`).
//! - `test_util`: the test kit, a simulated server under the real driver
//!   (feature `test-util`; the adapters forward it).

#![forbid(unsafe_code)]
// docs.rs (nightly): items behind a feature say which (`doc_cfg` marks them by
// itself; `doc_auto_cfg` was merged into it).
#![cfg_attr(docsrs, feature(doc_cfg))]
// Where a dependent crate's docs link to this one's when this one is not
// documented beside it (`cargo doc --no-deps` of the dependent alone): its
// docs.rs pages for this minor version, not a dead relative path. Raise it
// with the version.
#![doc(html_root_url = "https://docs.rs/lease-driver/0.1")]
#![warn(missing_docs)]

mod cancel;
mod driver;
mod group;
mod hosts;
mod log;
mod metrics;
mod run;
pub mod runtime;
#[cfg(feature = "schedule")]
pub mod schedule;
mod shared;
#[cfg(feature = "test-util")]
pub mod test_util;
mod try_run;

use std::fmt;
use std::future::{poll_fn, Future};
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::Poll;

use lease_proto::{Input, Machine};
use tokio_postgres::NoTls;

/// tokio-postgres's connection configuration, which [`Locker::from_config`] takes.
pub use tokio_postgres::Config;

pub use driver::Driver;
pub use group::Group;
pub use lease_proto;
pub use lease_proto::{
    GroupId, LastError, LeaseId, LeaseState, LeaseStatus, NameError, Options, OptionsError, Reason,
    Refusal, Role, ServerWait, SessionError, SessionState, Status,
};
#[cfg(feature = "metrics")]
pub use metrics::describe_metrics;
pub use run::Lease;
pub use runtime::{
    check_primary, in_recovery, session_error, BoxFuture, Connected, Connection, PostgresSession,
    Runtime, Session, SessionEvent, Timer, UNSUPPORTED,
};
#[cfg(feature = "schedule")]
pub use schedule::{Occurrence, Schedule};
use shared::Inner;
pub use try_run::Tried;

/// What both adapters (lease-tokio, lease-smol) re-export, listed once:
/// `pub use lease_driver::adapter_exports::*;`.
pub mod adapter_exports {
    pub use crate::{
        identity, Config, Error, GroupId, LastError, Lease, LeaseId, LeaseState, LeaseStatus,
        NameError, Options, OptionsError, Reason, Refusal, Role, RunError, Runtime, ServerWait,
        SessionError, SessionState, Status, Tried,
    };
    #[cfg(feature = "schedule")]
    pub use crate::{schedule, Occurrence, Schedule};
}

/// Why a locker could not be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The options are inconsistent.
    Options(OptionsError),
    /// The connection configuration is unusable (never echoes a password).
    Config(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Options(e) => write!(f, "invalid lease options: {e}"),
            Error::Config(e) => write!(f, "invalid connection configuration: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Options(e) => Some(e),
            Error::Config(_) => None,
        }
    }
}

/// Why a run ended without success.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError<E> {
    /// The job returned this error while leading; the key was released.
    /// Displays as the job's error.
    Job(E),
    /// The lease name is invalid.
    Name(NameError),
    /// This locker already runs a lease with this key.
    AlreadyRunning(LeaseId),
    /// This locker already runs [`Options::max_leases`] leases.
    TooManyLeases {
        /// The cap in force.
        cap: usize,
    },
    /// The server or the connection cannot give mutual exclusion.
    Refused(Refusal),
    /// A run of a lease group ([`Group::run`]) on a locker without
    /// [`Options::notify_handover`]: a group needs the handover channel
    /// (docs/library.md, "Lease groups").
    GroupWithoutNotify(LeaseId),
    /// The locker never had a session and its connection attempt failed
    /// with a configuration error ([`SessionError::is_configuration`]: a wrong
    /// password, no password for a server that asks for one, an unknown
    /// role or database, a TLS verification failure):
    /// the server's words, e.g. `password authentication failed for user
    /// "app" (SQLSTATE 28P01)`. Displays as `cannot connect: <error>`.
    /// Once a locker has had a session, such errors are retried (logged at
    /// `ERROR`) instead: a rotated password must not stop a running fleet.
    Config(SessionError),
    /// The [`Driver`] was dropped or ended while the run was pending.
    DriverStopped,
}

impl<E> RunError<E> {
    /// The same end, with the job's error turned into any end by `f`.
    pub(crate) fn map_job<F>(self, f: impl FnOnce(E) -> RunError<F>) -> RunError<F> {
        match self {
            RunError::Job(e) => f(e),
            RunError::Name(e) => RunError::Name(e),
            RunError::AlreadyRunning(l) => RunError::AlreadyRunning(l),
            RunError::TooManyLeases { cap } => RunError::TooManyLeases { cap },
            RunError::Refused(r) => RunError::Refused(r),
            RunError::GroupWithoutNotify(l) => RunError::GroupWithoutNotify(l),
            RunError::Config(e) => RunError::Config(e),
            RunError::DriverStopped => RunError::DriverStopped,
        }
    }
}

impl<E: fmt::Display> fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Job(e) => e.fmt(f),
            RunError::Name(e) => e.fmt(f),
            RunError::AlreadyRunning(l) => write!(f, "lease {l} is already running on this locker"),
            RunError::TooManyLeases { cap } => write!(f, "this locker already runs {cap} leases"),
            RunError::Refused(r) => r.fmt(f),
            RunError::GroupWithoutNotify(l) => {
                fmt::Display::fmt(&lease_proto::RunRejected::GroupWithoutNotify(l.clone()), f)
            }
            RunError::Config(e) => write!(f, "cannot connect: {e}"),
            RunError::DriverStopped => f.write_str("the lease driver stopped"),
        }
    }
}

/// Transparent: a job's error shows as itself.
impl<E: std::error::Error> std::error::Error for RunError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Job(e) => e.source(),
            _ => None,
        }
    }
}

/// How an adapter crate turns a TLS connector `T` into the [`Runtime`] that
/// connects with it. Implemented by each adapter's marker type
/// (`lease_tokio::TokioAdapter`, `lease_smol::SmolAdapter`), which names the
/// adapter's `Locker`: `type Locker = lease_driver::Locker<TokioAdapter>`.
pub trait Adapter<T>: 'static {
    /// The runtime that connects with `T`.
    type Runtime: Runtime;

    /// The runtime for `tls`.
    fn runtime(tls: T) -> Self::Runtime;
}

/// An adapter that resolves connections as libpq does, for
/// [`Locker::from_env`] and [`Locker::from_conninfo`]: the adapters
/// implement it with lease-libpq (its crate docs have the rules) and their
/// rustls connector.
pub trait Resolve {
    /// The TLS connector a resolved connection connects with.
    type Tls;

    /// Resolves `conn` (a URL or `key=value` string; `None`: the
    /// environment alone), the `PG*` environment and the password file
    /// filling in what it leaves out.
    ///
    /// # Errors
    /// [`Error::Config`], naming the keyword or variable at fault.
    fn resolve(conn: Option<&str>) -> Result<(Config, Self::Tls), Error>;
}

/// An adapter whose runtime can spawn the driver itself ([`Locker::spawn`]).
pub trait Spawn {
    /// Spawns `driver` on the current runtime.
    fn spawn<R: Runtime>(driver: Driver<R>);
}

/// Runs jobs under leases over one dedicated database session. Create one per
/// process and share it: clones are cheap and share the session. While it
/// holds a lease and wants another, it also keeps a second connection that
/// only waits for a wanted lease to be freed (the watch session,
/// [`ServerWait::IdleAndWatch`]).
///
/// `A` is the adapter that made it (it only picks the constructors); every
/// other method, the runs and their [`Lease`]s are the same for every
/// runtime. `Locker` alone (`A = ()`) is made by [`Locker::with_runtime`].
#[must_use = "a Locker does nothing by itself: call `run` on it (the session closes once every \
              clone is dropped and no run remains)"]
pub struct Locker<A = ()> {
    handle: Arc<Handle>,
    adapter: PhantomData<fn() -> A>,
}

impl<A> Clone for Locker<A> {
    fn clone(&self) -> Self {
        Locker {
            handle: self.handle.clone(),
            adapter: PhantomData,
        }
    }
}

/// Dropped with the last `Locker` clone (run futures hold one): the driver may
/// end then. Keeps the runtime (its timers, for [`Locker::try_run`]'s wait) and
/// the configuration (for connections of a locker's own beside the lease
/// session, such as a schedule's clock readings).
struct Handle {
    inner: Arc<Inner>,
    runtime: Arc<dyn Runtime>,
    #[cfg_attr(not(feature = "schedule"), allow(dead_code))]
    config: Config,
    /// The server's clock, read once for every schedule of this locker.
    #[cfg(feature = "schedule")]
    clock: Arc<schedule::ServerClock>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let mut s = self.inner.lock();
        s.lockers_gone = true;
        s.drain();
    }
}

impl<A> fmt::Debug for Locker<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("status", &self.status())
            .finish()
    }
}

impl Locker {
    /// A locker over `config` on `runtime`, and its driver, which the caller
    /// must run. Does not connect.
    ///
    /// # Errors
    /// [`Error::Options`] for inconsistent options, [`Error::Config`] when the
    /// config names no host, or hosts, `hostaddr`s and ports that do not pair
    /// up (every connection attempt would fail).
    pub fn with_runtime<R: Runtime>(
        runtime: R,
        config: Config,
        options: Options,
    ) -> Result<(Locker, Driver<R>), Error> {
        Locker::build(runtime, config, options, shared::seed())
    }
}

impl<A> Locker<A> {
    /// A locker over `config` and its driver, which the caller must run
    /// (spawn it, or poll it beside the runs). Connects with `tls`. Does not
    /// connect yet: the driver connects when a run needs the session.
    ///
    /// # Errors
    /// [`Error::Options`] for inconsistent options, [`Error::Config`] when the
    /// config names no host, or hosts, `hostaddr`s and ports that do not pair
    /// up (every connection attempt would fail).
    pub fn from_config<T>(
        config: Config,
        tls: T,
        options: Options,
    ) -> Result<(Self, Driver<A::Runtime>), Error>
    where
        A: Adapter<T>,
    {
        Locker::build(A::runtime(tls), config, options, shared::seed())
    }

    /// A locker without TLS over a libpq-style connection string, URL
    /// (`postgres://user:password@host/db`) or key-value
    /// (`host=... user=... dbname=...`), and its driver, which the caller must
    /// run. Does not connect. Only the string counts: no `PG*` variable, no
    /// password file, no TLS ([`Locker::from_conninfo`] has them).
    ///
    /// # Errors
    /// [`Error::Config`] if the string does not parse (the message never
    /// contains the string) or names no usable host, [`Error::Options`] for
    /// inconsistent options.
    #[allow(clippy::type_complexity)]
    pub fn without_tls(
        config: &str,
        options: Options,
    ) -> Result<(Self, Driver<<A as Adapter<NoTls>>::Runtime>), Error>
    where
        A: Adapter<NoTls>,
    {
        Locker::from_config(parse_config(config)?, NoTls, options)
    }

    /// A locker connecting as `psql` with no arguments does: the `PG*`
    /// environment (`PGHOST`, `PGUSER`, `PGSSLMODE`, `PGSSLROOTCERT`, ...),
    /// the password file (`PGPASSFILE`, `~/.pgpass`) and libpq's defaults,
    /// with TLS as `sslmode` says (up to `verify-full`). Returns the locker
    /// and its driver, which the caller must run. Does not connect; the
    /// files it names (certificates, keys) are read now.
    ///
    /// # Errors
    /// [`Error::Config`], naming the variable at fault, [`Error::Options`]
    /// for inconsistent options.
    #[allow(clippy::type_complexity)]
    pub fn from_env(
        options: Options,
    ) -> Result<(Self, Driver<<A as Adapter<A::Tls>>::Runtime>), Error>
    where
        A: Resolve + Adapter<<A as Resolve>::Tls>,
    {
        let (config, tls) = A::resolve(None)?;
        Locker::from_config(config, tls, options)
    }

    /// [`Locker::without_tls`] as `psql "conn"` does: the string (URL or
    /// `key=value`) wins, the `PG*` environment and the password file fill
    /// in what it leaves out, TLS as `sslmode` says. See
    /// [`Locker::from_env`].
    ///
    /// # Errors
    /// [`Error::Config`], naming the keyword or variable at fault (a typo
    /// such as `usr=` too), [`Error::Options`] for inconsistent options.
    #[allow(clippy::type_complexity)]
    pub fn from_conninfo(
        conn: &str,
        options: Options,
    ) -> Result<(Self, Driver<<A as Adapter<A::Tls>>::Runtime>), Error>
    where
        A: Resolve + Adapter<<A as Resolve>::Tls>,
    {
        let (config, tls) = A::resolve(Some(conn))?;
        Locker::from_config(config, tls, options)
    }

    /// [`Locker::from_config`], with the driver spawned on the current runtime (for
    /// adapters that can spawn: tokio).
    ///
    /// # Errors
    /// As [`Locker::from_config`].
    ///
    /// # Panics
    /// Where the adapter's spawn panics (tokio: outside a runtime).
    pub fn spawn<T>(config: Config, tls: T, options: Options) -> Result<Self, Error>
    where
        A: Adapter<T> + Spawn,
    {
        let (locker, driver) = Locker::from_config(config, tls, options)?;
        A::spawn(driver);
        Ok(locker)
    }

    /// `seed`: the core's ([`shared::seed`] but in the test kit).
    fn build<R: Runtime>(
        runtime: R,
        mut config: Config,
        options: Options,
        seed: u64,
    ) -> Result<(Self, Driver<R>), Error> {
        check_config(&config)?;
        // Operators tell lease sessions apart in pg_stat_activity (and `lease
        // status` shows it for the holder); the caller's own name wins.
        if config.get_application_name().is_none() {
            config.application_name(default_application_name(identity().as_deref()));
        }
        let machine = Machine::new(options, seed).map_err(Error::Options)?;
        let runtime = Arc::new(runtime);
        let clock = {
            let runtime = runtime.clone();
            Arc::new(move || runtime.now())
        };
        let inner = Arc::new(Inner::new(machine, clock));
        let handle = Arc::new(Handle {
            inner: inner.clone(),
            runtime: runtime.clone(),
            config: config.clone(),
            #[cfg(feature = "schedule")]
            clock: Arc::default(),
        });
        let driver = Driver::new(inner, runtime, config);
        let locker = Locker {
            handle,
            adapter: PhantomData,
        };
        Ok((locker, driver))
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.handle.inner
    }

    /// Contends for the lease `name` and runs `job` while holding it, until
    /// the job completes (see the crate docs for every outcome).
    ///
    /// The job runs inside the returned future, which borrows neither the
    /// locker nor `name` (spawn it freely). The job gets a [`Lease`] and must
    /// return promptly once [`Lease::cancelled`] fires; after a lost lease it
    /// is called again on the next win.
    ///
    /// # Errors
    /// [`RunError`]: the job's error, or why the run could not proceed.
    ///
    /// # Cancel safety
    /// Not cancel-safe: dropping the future (a losing `select!` branch, a
    /// timeout) drops the job where it stands and ends the run; the driver
    /// then releases the key, so nothing keeps running under the lease, but
    /// the job gets no chance to finish. To stop a run so that its job
    /// returns first, use the `shutdown` of [`Locker::run_until`] or
    /// [`Locker::close`].
    #[must_use = "the run does nothing unless awaited or spawned"]
    pub fn run<F, Fut, E>(
        &self,
        name: &str,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<E>>>
    where
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        self.run_until(name, std::future::pending(), job)
    }

    /// [`Locker::run`] with a graceful shutdown signal: when `shutdown`
    /// resolves, the job's lease is cancelled, the run waits for the job to
    /// return, releases the key and returns `Ok(())`.
    ///
    /// # Errors
    /// As [`Locker::run`].
    ///
    /// # Cancel safety
    /// As [`Locker::run`]: dropping the future drops the job and releases
    /// the key; resolving `shutdown` is the graceful way.
    #[must_use = "the run does nothing unless awaited or spawned"]
    pub fn run_until<S, F, Fut, E>(
        &self,
        name: &str,
        shutdown: S,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<E>>>
    where
        S: Future<Output = ()>,
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        run::run(self.clone(), LeaseId::named(name), shutdown, job)
    }

    /// [`Locker::run_until`] for any [`LeaseId`], such as a raw key shared with
    /// other code ([`LeaseId::raw`]). Pass `std::future::pending()` for no
    /// shutdown signal.
    ///
    /// # Errors
    /// As [`Locker::run`].
    ///
    /// # Cancel safety
    /// As [`Locker::run`].
    #[must_use = "the run does nothing unless awaited or spawned"]
    pub fn run_lease<S, F, Fut, E>(
        &self,
        lease: LeaseId,
        shutdown: S,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<E>>>
    where
        S: Future<Output = ()>,
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        run::run(self.clone(), Ok(lease), shutdown, job)
    }

    /// Shuts every run down gracefully (their jobs are cancelled; each run
    /// returns `Ok(())` once its job returned and its key was released), then
    /// closes the session. Resolves when the driver has ended. Later runs
    /// return `Ok(())` at once.
    ///
    /// # Cancel safety
    /// Cancel-safe once polled: the close is requested at the first poll and
    /// proceeds whether or not the future is kept; dropping it only stops
    /// waiting for the end (call it again to wait). Dropped before its first
    /// poll, it requests nothing.
    pub async fn close(&self) {
        let inner = self.inner();
        inner.input(Input::Close);
        poll_fn(|cx| {
            let mut s = inner.lock();
            if s.driver_gone {
                return Poll::Ready(());
            }
            if !s.close_waiters.iter().any(|w| w.will_wake(cx.waker())) {
                s.close_waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
    }

    /// A snapshot: the session's state and every lease with its state
    /// (token, since, valid until).
    pub fn status(&self) -> Status {
        self.inner().lock().machine.status()
    }
}

/// The hosts of `config` in the order a locker tries them, each as a one-host
/// configuration with the bound of its share of an `attempt` (`None`: one host
/// without `connect_timeout`): see "Several hosts" in the crate docs. For
/// connections of your own that should fail over like the lease session.
/// tokio-postgres's `Config::connect` runs libpq's `target_session_attrs`
/// check, which skips a primary whose sessions default to read-only; to
/// check as a lease session does, connect each with `target_session_attrs`
/// set to `any` and call [`check_primary`] when it was `read-write`, both
/// within its bound.
pub fn hosts(
    config: &Config,
    attempt: std::time::Duration,
) -> Vec<(Config, Option<std::time::Duration>)> {
    let each = hosts::split(config, shared::seed());
    let share = hosts::share(config.get_connect_timeout().copied(), each.len(), attempt);
    each.into_iter().map(|c| (c, share)).collect()
}

/// The `application_name` of lease sessions whose configuration names none,
/// followed by `@` and this process's [`identity`] when it has one:
/// `lease@web-7f9c` (set `application_name` in the configuration to name
/// them yourself).
pub const DEFAULT_APPLICATION_NAME: &str = "lease";

/// This process's holder identity, as `pg_stat_activity` and `lease status`
/// show it: `$POD_NAME` when set (Kubernetes' downward API), else the host
/// name; `None` when neither is printable ASCII (the server would replace
/// anything else with `?`).
pub fn identity() -> Option<String> {
    let usable = |s: &String| !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic());
    if let Some(pod) = std::env::var("POD_NAME").ok().filter(usable) {
        return Some(pod);
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(usable);
    host.or_else(|| std::env::var("HOSTNAME").ok().filter(usable))
}

/// [`DEFAULT_APPLICATION_NAME`] with `identity`, within the server's 63 bytes
/// (the identity is cut).
fn default_application_name(identity: Option<&str>) -> String {
    let mut name = DEFAULT_APPLICATION_NAME.to_owned();
    if let Some(id) = identity {
        let room = 63 - name.len() - 1;
        let end = id.len().min(room);
        if end > 0 {
            name.push('@');
            name.push_str(&id[..end]);
        }
    }
    name
}

/// Parses a libpq-style connection string: a URL
/// (`postgres://user:password@host/db`) or key-value (`host=... user=...`).
///
/// # Errors
/// [`Error::Config`] if it does not parse; the message never contains the
/// string, nor any character of it.
pub fn parse_config(s: &str) -> Result<Config, Error> {
    s.parse::<Config>().map_err(|e| {
        // "invalid connection string: unknown option `usr`": the cause names
        // the keyword (tokio-postgres's own Display drops it).
        let mut message = e.to_string();
        if let Some(cause) = std::error::Error::source(&e) {
            message.push_str(&format!(": {cause}"));
        }
        Error::Config(redact_parse_error(&message))
    })
}

/// The checks tokio-postgres would fail every connection attempt on.
fn check_config(config: &Config) -> Result<(), Error> {
    let (hosts, addrs) = (config.get_hosts().len(), config.get_hostaddrs().len());
    let ports = config.get_ports().len();
    if hosts == 0 && addrs == 0 {
        return Err(Error::Config("no host given".into()));
    }
    if hosts != 0 && addrs != 0 && hosts != addrs {
        let e =
            format!("number of hosts ({hosts}) is different from number of hostaddrs ({addrs})");
        return Err(Error::Config(e));
    }
    if ports > 1 && ports != hosts.max(addrs) {
        return Err(Error::Config("invalid number of ports".into()));
    }
    Ok(())
}

/// tokio-postgres's parse errors may quote one character of the input ("but
/// got `c`"), which can be the first letter of a password: drop that part.
fn redact_parse_error(message: &str) -> String {
    match message.find(" but got") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_application_name_carries_the_identity_within_63_bytes() {
        assert_eq!(default_application_name(None), "lease");
        assert_eq!(default_application_name(Some("web-1")), "lease@web-1");
        let long = "p".repeat(80);
        let name = default_application_name(Some(&long));
        assert_eq!(name.len(), 63);
        assert!(name.starts_with("lease@ppp"));
    }
}
