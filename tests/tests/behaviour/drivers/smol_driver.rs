//! The suite on lease-smol, each test on `smol::block_on` with smol's global executor,
//! without tokio's runtime.

pub use lease_smol as lease;

// Included by both drivers' files on purpose: the suite compiles once per driver.
#[allow(clippy::duplicate_mod)]
#[path = "suite.rs"]
mod suite;

// `Locker::try_run`, for both drivers as the suite.
#[allow(clippy::duplicate_mod)]
#[path = "try_suite.rs"]
mod try_suite;

/// How the suite builds lockers and uses smol.
pub mod rt {
    use std::future::Future;
    use std::net::TcpStream;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use lease_smol::{Error, Locker, Options};
    use smol::{future, Async, Timer};
    use tokio_postgres::NoTls;
    use tokio_util::compat::FuturesAsyncReadCompatExt;

    use crate::drivers::DB;

    /// Part of every lease name.
    pub const NAME: &str = "smol";

    /// Runs a test's body.
    pub fn block_on<F: Future>(f: F) -> F::Output {
        smol::block_on(f)
    }

    /// `Locker::without_tls`: a locker over `conn` without TLS, its driver running
    /// detached.
    pub fn connect(conn: &str, options: Options) -> Result<Locker, Error> {
        let (locker, driver) = Locker::without_tls(conn, options)?;
        smol::spawn(driver).detach();
        Ok(locker)
    }

    /// `Locker::from_config` over [`DB`] without TLS, its driver spawned as a task the test
    /// can cancel (dropping the driver) or await.
    pub fn new(options: Options) -> (Locker, Task<()>) {
        let config = DB.parse().expect("parse DB");
        let (locker, driver) =
            Locker::from_config(config, NoTls, options).expect("Locker::from_config");
        (locker, spawn(driver))
    }

    /// A spawned task; dropping it detaches it (as a tokio `JoinHandle`).
    pub struct Task<T>(Option<smol::Task<T>>);

    impl<T> Task<T> {
        pub fn is_finished(&self) -> bool {
            self.0.as_ref().is_none_or(smol::Task::is_finished)
        }

        /// Cancels the task and waits until its future is dropped.
        pub async fn cancel(mut self) {
            if let Some(task) = self.0.take() {
                task.cancel().await;
            }
        }
    }

    impl<T> Drop for Task<T> {
        fn drop(&mut self) {
            if let Some(task) = self.0.take() {
                task.detach();
            }
        }
    }

    impl<T> Future for Task<T> {
        type Output = T;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
            let task = self.0.as_mut().expect("a task polled after it finished");
            let out = Pin::new(task).poll(cx);
            if out.is_ready() {
                self.0 = None;
            }
            out
        }
    }

    pub fn spawn<F>(f: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Task(Some(smol::spawn(f)))
    }

    pub async fn sleep(d: Duration) {
        Timer::after(d).await;
    }

    /// `f`'s output, or an error once `limit` has passed.
    pub async fn timeout<T>(limit: Duration, f: impl Future<Output = T>) -> Result<T, String> {
        let expired = async {
            sleep(limit).await;
            Err(format!("timed out after {limit:?}"))
        };
        future::or(async { Ok(f.await) }, expired).await
    }

    /// A plain client of [`DB`], without tokio's runtime either (async-io's socket).
    pub async fn client() -> tokio_postgres::Client {
        let stream = Async::<TcpStream>::connect(([127, 0, 0, 1], 5432))
            .await
            .expect("connect to the test database");
        let config: tokio_postgres::Config = DB.parse().expect("parse DB");
        let (client, connection) = config
            .connect_raw(stream.compat(), NoTls)
            .await
            .expect("connect to the test database");
        smol::spawn(connection).detach();
        client
    }
}
