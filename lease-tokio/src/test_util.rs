//! Test your job under failover, without PostgreSQL (feature `test-util`):
//! the real [`Locker`](crate::Locker) and driver over a simulated server,
//! with faults (terminate, partition, freeze, latency, crash, restart),
//! inspection and checks, in tokio's time: under
//! `#[tokio::test(start_paused = true)]` a minute of failover runs in
//! milliseconds, the same from the same seed. The guide:
//! `docs/testing.md` of the repository.
//!
//! ```
//! use std::time::Duration;
//! use lease_tokio::test_util::TestServer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = TestServer::new(7);
//! let (locker, driver) = server.locker(lease_tokio::Options::default())?;
//! tokio::spawn(driver);
//! let store = server.fenced_store();
//! let job = {
//!     let store = store.clone();
//!     locker.run("sweeper", move |lease| {
//!         let store = store.clone();
//!         async move {
//!             store.write(lease.token(), "swept").ok();
//!             lease.cancelled().await;
//!             Ok::<(), std::io::Error>(())
//!         }
//!     })
//! };
//! tokio::spawn(job);
//! tokio::time::sleep(Duration::from_secs(1)).await;
//! assert_eq!(server.holder("sweeper"), Some(0));
//! assert_eq!(store.accepted().len(), 1);
//! # Ok(()) }
//! ```

use tokio_postgres::NoTls;

use lease_driver::test_util::TestAdapter;

use crate::{Tokio, TokioAdapter};

pub use lease_driver::test_util::nemesis;
pub use lease_driver::test_util::{
    Breach, FencedStore, Grant, JobLog, JobRun, Rejected, Running, Sent, Write, DEFAULT_LATENCY,
    SIM_EPOCH,
};

/// A simulated PostgreSQL server for tokio lockers:
/// [`TestServer::new(seed)`](lease_driver::test_util::TestServer::new), then
/// [`locker(options)`](lease_driver::test_util::TestServer::locker) for each
/// replica (a [`Locker`](crate::Locker) and its [`Driver`] to spawn).
pub type TestServer = lease_driver::test_util::TestServer<TokioAdapter>;

/// The driver of a [`TestServer`]'s locker: spawn it.
pub type Driver = lease_driver::test_util::SimDriver<Tokio<NoTls>>;

/// The kit's lockers run on tokio's clock and timer: virtual under a paused
/// runtime.
impl TestAdapter for TokioAdapter {
    type TestRuntime = Tokio<NoTls>;

    fn test_runtime() -> Tokio<NoTls> {
        Tokio::new(NoTls)
    }
}
