//! Test your job under failover, without PostgreSQL (feature `test-util`):
//! the real [`Locker`](crate::Locker) and driver over a simulated server,
//! with faults (terminate, partition, freeze, latency, crash, restart),
//! inspection and checks. async-io has no virtual clock: the kit runs in
//! real time, so give the lockers short options and the faults short
//! durations. The guide: `docs/testing.md` of the repository.

use tokio_postgres::NoTls;

use crate::{Smol, SmolAdapter};

pub use lease_driver::test_util::nemesis;
pub use lease_driver::test_util::{
    FencedStore, Grant, JobLog, JobRun, Rejected, Running, Sent, Violation, Write, DEFAULT_LATENCY,
};

/// A simulated PostgreSQL server for smol lockers:
/// [`TestServer::new(seed)`](lease_driver::test_util::TestServer::new), then
/// [`locker(options)`](lease_driver::test_util::TestServer::locker) for each
/// replica (a [`Locker`](crate::Locker) and its [`Driver`] to run).
pub type TestServer = lease_driver::test_util::TestServer<SmolAdapter>;

/// The driver of a [`TestServer`]'s locker: run it on any executor.
pub type Driver = lease_driver::test_util::SimDriver<Smol<NoTls>>;
