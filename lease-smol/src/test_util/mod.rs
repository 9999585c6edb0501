//! Test your job under failover, without PostgreSQL (feature `test-util`):
//! the real [`Locker`](crate::Locker) and driver over a simulated server,
//! with faults (terminate, partition, freeze, latency, crash, restart),
//! inspection and checks, in virtual time: inside [`block_on`] a minute of
//! failover runs in milliseconds, the same from the same seed. The guide:
//! `docs/testing.md` of the repository.
//!
//! async-io has no virtual clock, so the kit brings its own: [`block_on`]
//! runs your test and the tasks it [`spawn`]s on one thread, and moves the
//! clock to the next timer whenever none of them can run. The kit's lockers,
//! [`now`], [`sleep`] and [`Timer`] use that clock; async-io's `Timer` does
//! not, so a job's own waits go through [`sleep`] in the test (pass it in).
//! A [`TestServer`] made outside [`block_on`] runs in real time, on
//! async-io's timers.
//!
//! ```
//! use std::time::Duration;
//! use lease_smol::test_util::{self, TestServer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! test_util::block_on(async {
//!     let server = TestServer::new(7);
//!     let (locker, driver) = server.locker(lease_smol::Options::default())?;
//!     test_util::spawn(driver).detach();
//!     let store = server.fenced_store();
//!     let job = {
//!         let store = store.clone();
//!         locker.run("sweeper", move |lease| {
//!             let store = store.clone();
//!             async move {
//!                 store.write(lease.token(), "swept").ok();
//!                 lease.cancelled().await;
//!                 Ok::<(), std::io::Error>(())
//!             }
//!         })
//!     };
//!     test_util::spawn(job).detach();
//!     test_util::sleep(Duration::from_secs(1)).await;
//!     assert_eq!(server.holder("sweeper"), Some(0));
//!     assert_eq!(store.accepted().len(), 1);
//!     Ok(())
//! })
//! # }
//! ```

mod time;

use lease_driver::test_util::TestAdapter;

use crate::SmolAdapter;

pub use lease_driver::test_util::nemesis;
pub use lease_driver::test_util::{
    Breach, FencedStore, Grant, JobLog, JobRun, Rejected, Running, Sent, Write, DEFAULT_LATENCY,
    SIM_EPOCH,
};
pub use time::{block_on, now, sleep, spawn, TestRuntime, Timer};

/// A simulated PostgreSQL server for smol lockers:
/// [`TestServer::new(seed)`](lease_driver::test_util::TestServer::new), then
/// [`locker(options)`](lease_driver::test_util::TestServer::locker) for each
/// replica (a [`Locker`](crate::Locker) and its [`Driver`] to [`spawn`]).
/// Made inside [`block_on`], it runs in that virtual time; outside, in real
/// time.
pub type TestServer = lease_driver::test_util::TestServer<SmolAdapter>;

/// The driver of a [`TestServer`]'s locker: [`spawn`] it.
pub type Driver = lease_driver::test_util::SimDriver<TestRuntime>;

/// The kit's lockers run on [`TestRuntime`]: the virtual clock of the
/// current [`block_on`], or real time outside one.
impl TestAdapter for SmolAdapter {
    type TestRuntime = TestRuntime;

    fn test_runtime() -> TestRuntime {
        TestRuntime::current()
    }
}
