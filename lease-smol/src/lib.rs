//! # lease-smol: singleton jobs over PostgreSQL advisory locks, on smol
//!
//! A [`Locker`] makes a job run on exactly one replica at a time: every
//! replica calls [`Locker::run`](lease_driver::Locker::run) with the same lease name; one runs the job,
//! the others stand by and take over when it returns, crashes or loses its
//! database session. All leases of a locker ride one dedicated database
//! session (never a pool). This is the `lease-tokio` API on `async-io`: no
//! tokio runtime, and nothing spawned behind your back.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> { smol::block_on(async {
//! let (locker, driver) = lease_smol::Locker::without_tls(
//!     "host=127.0.0.1 user=postgres dbname=postgres",
//!     lease_smol::Options::default(),
//! )?;
//! smol::spawn(driver).detach(); // or run it on any executor
//! locker
//!     .run("sweeper", |lease| async move {
//!         println!("leading with fencing token {}", lease.token());
//!         let reason = lease.cancelled().await; // work until cancelled
//!         println!("stopping: {reason}");
//!         Ok::<(), std::io::Error>(())
//!     })
//!     .await?;
//! # Ok(()) }) }
//! ```
//!
//! This crate is the async-io adapter of [`lease_driver`]: the [`Runtime`]
//! ([`Smol`]: the system clock, async-io's timer, sessions opened over
//! async-io sockets), the constructors and these docs. The locker, its runs,
//! [`Lease`], the outcomes and errors are [`lease_driver`]'s, and every rule
//! is the core's (`lease-proto`): read their docs for the guarantees,
//! cancellation and errors. The tokio adapter, `lease-tokio`, has the same
//! API.
//!
//! ## The driver
//!
//! [`Locker::from_config`] and [`Locker::without_tls`] return the locker and a [`Driver`]
//! future that owns the connection: nothing happens until it is polled. Run it
//! on any executor: `smol::spawn(driver).detach()`, an `async-executor`
//! (`LocalExecutor` too: see `examples/embed.rs`), or beside your runs under
//! `futures_lite::future::block_on`. It spawns no task and no thread; its
//! sockets and timer use async-io, whose reactor thread ("async-io", one per
//! process, started on first use) is the only thread that appears. Creating
//! a locker never needs the database: the driver connects when a run needs
//! it and retries with backoff, logging every setback with `tracing`. The
//! core never cancels a query (it closes the session instead), so no cancel
//! request is ever sent.
//!
//! The connection must reach the server directly or through a **session-mode**
//! pool: a transaction pooler or a hot standby cannot give mutual exclusion,
//! and runs then fail with [`RunError::Refused`].
//!
//! Every job runs inside a `tracing` span with its lease, key, run and token.
//! The cargo feature `metrics` (off by default) turns on lease-driver's
//! metrics; `docs/metrics.md` of the repository lists them.
//!
//! A one-shot job that runs only if the lease is free: [`Locker::try_run`].
//! A job at each due time of a schedule (`every 15m`, a cron expression in a
//! time zone), on the replica that holds its lease: `Locker::schedule`, with
//! the cargo feature `schedule` (off by default). Both: `docs/schedules.md`
//! of the repository, "From Rust".
//!
//! ## Connecting without tokio
//!
//! tokio-postgres's `Config::connect` needs tokio's reactor, so the driver
//! opens the socket itself and hands it to `Config::connect_raw`. It follows
//! `Config::connect` where it can:
//! - a host list is walked by the driver, one host at a time, each within
//!   its share of the attempt (lease-driver's crate docs, "Several hosts");
//! - each host uses its `hostaddr` if given (no name resolution), else its
//!   name: IP literals are used as they are, other names are resolved with the
//!   system resolver (`getaddrinfo`), which **blocks the thread polling the
//!   driver** for the lookup; give IP addresses or `hostaddr` to avoid it;
//! - one port for every host, or one per host (default 5432); a Unix socket
//!   host (a path) connects to `<dir>/.s.PGSQL.<port>`;
//! - `connect_timeout` (at most the host's share) bounds the attempt at each
//!   address, socket, TLS and startup included, as libpq does;
//! - TCP sockets get no-delay, the `keepalives*` settings and, on Linux,
//!   `tcp_user_timeout`;
//! - TLS goes through [`SmolTls`], asked for a connector per host name; the
//!   `rustls` feature adds a ready one, `rustls::MakeRustls` (no tokio
//!   runtime), which `Locker::from_env` and `Locker::from_conninfo` (feature
//!   `libpq`, on by default) build from lease-libpq's resolution: the `PG*`
//!   environment, `~/.pgpass` and `sslmode` up to `verify-full`;
//! - `target_session_attrs` is checked by the driver, as for every runtime.
//!
//! ## Testing your job
//!
//! With the feature `test-util` (in `[dev-dependencies]`), `test_util::TestServer`
//! runs your job under the real locker and driver over a simulated
//! PostgreSQL, with faults and checks, as lease-tokio's kit does, in virtual
//! time: inside `test_util::block_on`, which runs the test and the tasks it
//! starts with `test_util::spawn` on one thread, the kit's clock jumps to the
//! next timer whenever no task can run, so a minute of failover takes
//! milliseconds. A job's own waits go through `test_util::sleep` there
//! (async-io's timer is real time). The rules and an example:
//! `docs/testing.md` of the repository, "smol".
//!
#![forbid(unsafe_code)]
// docs.rs (nightly): items behind a feature say which (`doc_cfg` marks them by
// itself; `doc_auto_cfg` was merged into it).
#![cfg_attr(docsrs, feature(doc_cfg))]
// Where a dependent crate's docs link to this one's when this one is not
// documented beside it (`cargo doc --no-deps` of the dependent alone): its
// docs.rs pages for this minor version, not a dead relative path. Raise it
// with the version.
#![doc(html_root_url = "https://docs.rs/lease-smol/0.1")]
#![warn(missing_docs)]

mod connect;
#[cfg(feature = "libpq")]
mod libpq;
mod runtime;
#[cfg(feature = "rustls")]
pub mod rustls;
#[cfg(feature = "test-util")]
pub mod test_util;

use tokio_postgres::NoTls;

pub use connect::{SmolTls, Socket};
pub use lease_driver::adapter_exports::*;
#[cfg(feature = "libpq")]
pub use lease_libpq::{self, Conninfo, ConninfoError};
pub use runtime::{Smol, SmolAdapter};

/// The connection driver of a smol [`Locker`]: run it on any executor.
pub type Driver<T = NoTls> = lease_driver::Driver<Smol<T>>;

/// Runs jobs under leases over one dedicated database session, on async-io:
/// a [`lease_driver::Locker`] whose constructors make a [`Smol`] runtime.
/// Create one per process and share it: clones are cheap and share the
/// session.
///
/// The methods are [`lease_driver::Locker`]'s, documented there (a type
/// alias' page lists them only with JavaScript):
///
/// | Method | Does |
/// |---|---|
/// | [`from_env(options)`](lease_driver::Locker::from_env) | connects as `psql` with no arguments does (`PG*`, `~/.pgpass`, `sslmode` up to `verify-full`; feature `libpq`, on by default): the locker and its [`Driver`], to run on any executor |
/// | [`from_conninfo(conn, options)`](lease_driver::Locker::from_conninfo) | the same as `psql "conn"`: the string wins, the environment fills in the rest |
/// | [`without_tls(conn, options)`](lease_driver::Locker::without_tls) | the string alone, without TLS, `PG*` or password file |
/// | [`from_config(config, tls, options)`](lease_driver::Locker::from_config) | any tokio-postgres `Config` and [`SmolTls`] connector |
/// | [`run(name, job)`](lease_driver::Locker::run) | contends for the lease `name` and runs `job` while holding it |
/// | [`run_until(name, shutdown, job)`](lease_driver::Locker::run_until) | `run` with a graceful shutdown signal |
/// | [`run_lease(lease, shutdown, job)`](lease_driver::Locker::run_lease) | `run_until` for any [`LeaseId`] (a raw key) |
/// | [`group(name)`](lease_driver::Locker::group) | a lease group: its [`run`](lease_driver::Group::run)s share the group's leases evenly with the other lockers running them |
/// | [`close()`](lease_driver::Locker::close) | shuts every run down gracefully, then closes the session |
/// | [`status()`](lease_driver::Locker::status) | a snapshot of the session and every lease |
pub type Locker = lease_driver::Locker<SmolAdapter>;
/// A lease group on a [`Locker`]: [`Locker::group`](lease_driver::Locker::group).
pub type Group = lease_driver::Group<SmolAdapter>;
