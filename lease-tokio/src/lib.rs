//! # lease-tokio: singleton jobs over PostgreSQL advisory locks, on tokio
//!
//! A [`Locker`] makes a job run on exactly one replica at a time: every
//! replica calls [`Locker::run`](lease_driver::Locker::run) with the same
//! lease name; one runs the job, the others stand by and take over when it
//! returns, crashes or loses its database session. All leases of a locker
//! ride one dedicated database session (never a pool).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let (locker, driver) = lease_tokio::Locker::without_tls(
//!     "host=127.0.0.1 user=postgres dbname=postgres",
//!     lease_tokio::Options::default(),
//! )?;
//! tokio::spawn(driver); // the connection; it spawns nothing itself
//! locker
//!     .run("sweeper", |lease| async move {
//!         println!("leading with fencing token {}", lease.token());
//!         let reason = lease.cancelled().await; // work until cancelled
//!         println!("stopping: {reason}");
//!         Ok::<(), std::io::Error>(())
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! This crate is the tokio adapter of [`lease_driver`]: the [`Runtime`]
//! ([`Tokio`]: tokio's clock and timer, tokio-postgres's `Config::connect`),
//! the constructors and these docs. The locker, its runs, [`Lease`], the
//! outcomes and errors are [`lease_driver`]'s, and every rule is
//! [`lease_proto`](lease_driver::lease_proto)'s: read their docs for the guarantees, cancellation and
//! errors. The smol adapter, `lease-smol`, has the same API.
//!
//! ## The driver
//!
//! [`Locker::from_config`] and [`Locker::without_tls`] return the locker and a [`Driver`]
//! future that owns the connection: nothing happens until it is polled
//! (`tokio::spawn(driver)`). [`Locker::spawn`] spawns it for you. Creating a
//! locker never needs the database: the driver connects when a run needs it
//! and retries with backoff, logging every setback with `tracing`. Time is
//! tokio's, so tests can run leases under `tokio::time::pause()` (and see
//! "Testing your job" below).
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
//! ## Testing your job
//!
//! With the feature `test-util` (in `[dev-dependencies]`), `test_util::TestServer`
//! runs your job under the real locker and driver over a simulated
//! PostgreSQL, with terminate, partition, freeze, latency, crash and restart,
//! and checks (a fenced store, no two runs at once, stop after
//! cancellation), in tokio's virtual time: `docs/testing.md` of the
//! repository.
//!
//! With several hosts in the configuration, each host gets its own share of
//! the attempt, from the socket to the `target_session_attrs` check, and a
//! host that never answers costs only its share: see lease-driver's crate
//! docs, "Several hosts". Set `target_session_attrs=read-write` so that a
//! standby in the list is skipped (for a lease it means a primary, read-only
//! by default or not: the same section).

//! ## Connecting as psql does, TLS and logging
//!
//! [`Locker::from_env`](lease_driver::Locker::from_env) connects as `psql`
//! with no arguments: the `PG*` environment, the password file
//! (`PGPASSFILE`, `~/.pgpass`), and TLS as `sslmode` says, up to
//! `verify-full` (rustls with the ring provider; `sslrootcert` a PEM file
//! or `system`; client certificates with `sslcert`/`sslkey`).
//! [`Locker::from_conninfo`](lease_driver::Locker::from_conninfo) takes a
//! string first, as `psql "..."`. Both are the `libpq` feature (on by
//! default); lease-libpq's crate docs have every keyword and variable.
//! `Locker::without_tls` reads the string alone, without TLS. Everything the
//! driver has to say goes to `tracing`: install a subscriber to see it.
//!
//! ```no_run
//! // PGHOST=db.example.com PGUSER=app PGDATABASE=app PGSSLMODE=verify-full
//! // PGSSLROOTCERT=/etc/ssl/db-ca.pem (or system), the password in ~/.pgpass
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     tracing_subscriber::fmt().with_env_filter("info").init(); // connection setbacks, leases
//!     let (locker, driver) = lease_tokio::Locker::from_env(lease_tokio::Options::default())?;
//!     tokio::spawn(driver);
//!     locker
//!         .run("nightly-sweeper", |lease| async move {
//!             tracing::info!(token = lease.token(), "leading");
//!             lease.cancelled().await;
//!             Ok::<(), std::io::Error>(())
//!         })
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! [`Locker::from_config`](lease_driver::Locker::from_config) takes any tokio-postgres TLS
//! connector ([`TokioTls`]) for a setup of your own, e.g. with
//! [tokio-postgres-rustls](https://docs.rs/tokio-postgres-rustls) and rustls
//! on ring alone (no aws-lc-sys, no cmake):
//!
//! ```toml
//! tokio-postgres-rustls = { version = "0.14", features = ["ring"] }
//! rustls = { version = "0.23", default-features = false, features = ["ring", "std", "tls12"] }
//! ```
//!
//! With the platform's TLS library (OpenSSL on Linux), through
//! [postgres-native-tls](https://docs.rs/postgres-native-tls)
//! (`postgres-native-tls = "0.5"`, `native-tls = "0.2"`):
//!
//! ```ignore
//! let connector = native_tls::TlsConnector::builder().build()?;
//! let locker = lease_tokio::Locker::spawn(
//!     "host=db.example.com user=app dbname=app sslmode=require".parse()?,
//!     postgres_native_tls::MakeTlsConnector::new(connector),
//!     lease_tokio::Options::default(),
//! )?;
//! ```

#![forbid(unsafe_code)]
// docs.rs (nightly): items behind a feature say which (`doc_cfg` marks them by
// itself; `doc_auto_cfg` was merged into it).
#![cfg_attr(docsrs, feature(doc_cfg))]
// Where a dependent crate's docs link to this one's when this one is not
// documented beside it (`cargo doc --no-deps` of the dependent alone): its
// docs.rs pages for this minor version, not a dead relative path. Raise it
// with the version.
#![doc(html_root_url = "https://docs.rs/lease-tokio/0.1")]
#![warn(missing_docs)]

#[cfg(feature = "libpq")]
mod libpq;
mod runtime;
#[cfg(feature = "test-util")]
pub mod test_util;

use tokio_postgres::NoTls;

pub use lease_driver::adapter_exports::*;
#[cfg(feature = "libpq")]
pub use lease_libpq::{self, Conninfo, ConninfoError};
#[cfg(feature = "libpq")]
pub use libpq::Rustls;
pub use runtime::{Tokio, TokioAdapter, TokioTls};

/// The connection driver of a tokio [`Locker`]: spawn it.
pub type Driver<T = NoTls> = lease_driver::Driver<Tokio<T>>;

/// Runs jobs under leases over one dedicated database session, on tokio: a
/// [`lease_driver::Locker`] whose constructors make a [`Tokio`] runtime.
/// Create one per process and share it: clones are cheap and share the
/// session.
///
/// The methods are [`lease_driver::Locker`]'s, documented there (a type
/// alias' page lists them only with JavaScript):
///
/// | Method | Does |
/// |---|---|
/// | [`from_env(options)`](lease_driver::Locker::from_env) | connects as `psql` with no arguments does (`PG*`, `~/.pgpass`, `sslmode` up to `verify-full`; feature `libpq`, on by default): the locker and its [`Driver`], to spawn |
/// | [`from_conninfo(conn, options)`](lease_driver::Locker::from_conninfo) | the same as `psql "conn"`: the string wins, the environment fills in the rest |
/// | [`without_tls(conn, options)`](lease_driver::Locker::without_tls) | the string alone, without TLS, `PG*` or password file |
/// | [`from_config(config, tls, options)`](lease_driver::Locker::from_config) | any tokio-postgres `Config` and TLS connector ([`TokioTls`]) |
/// | [`spawn(config, tls, options)`](lease_driver::Locker::spawn) | `from_config`, with the driver spawned on the current runtime: the locker alone |
/// | [`run(name, job)`](lease_driver::Locker::run) | contends for the lease `name` and runs `job` while holding it |
/// | [`run_until(name, shutdown, job)`](lease_driver::Locker::run_until) | `run` with a graceful shutdown signal |
/// | [`run_lease(lease, shutdown, job)`](lease_driver::Locker::run_lease) | `run_until` for any [`LeaseId`] (a raw key) |
/// | [`group(name)`](lease_driver::Locker::group) | a lease group: its [`run`](lease_driver::Group::run)s share the group's leases evenly with the other lockers running them |
/// | [`close()`](lease_driver::Locker::close) | shuts every run down gracefully, then closes the session |
/// | [`status()`](lease_driver::Locker::status) | a snapshot of the session and every lease |
pub type Locker = lease_driver::Locker<TokioAdapter>;
/// A lease group on a [`Locker`]: [`Locker::group`](lease_driver::Locker::group).
pub type Group = lease_driver::Group<TokioAdapter>;
