//! The suite on lease-smol, each test on `smol::block_on` with smol's global executor,
//! without tokio's runtime.

use std::time::Instant;

pub use lease_smol as lease;
use lease_smol::Options;

use crate::{init, opts, Res, MS};

// Included by both drivers' files on purpose: the suite compiles once per driver.
#[allow(clippy::duplicate_mod)]
#[path = "suite.rs"]
mod suite;

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

    use crate::DB;

    /// Part of every lease name.
    pub const NAME: &str = "smol";

    /// Runs a test's body.
    pub fn block_on<F: Future>(f: F) -> F::Output {
        smol::block_on(f)
    }

    /// `Locker::connect`: a locker over `conn` without TLS, its driver running
    /// detached.
    pub fn connect(conn: &str, options: Options) -> Result<Locker, Error> {
        let (locker, driver) = Locker::connect(conn, options)?;
        smol::spawn(driver).detach();
        Ok(locker)
    }

    /// `Locker::new` over [`DB`] without TLS, its driver spawned as a task the test
    /// can cancel (dropping the driver) or await.
    pub fn new(options: Options) -> (Locker, Task<()>) {
        let config = DB.parse().expect("parse DB");
        let (locker, driver) = Locker::new(config, NoTls, options).expect("Locker::new");
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

// lease-smol alone: it opens its sockets itself (`connect_raw`), while lease-tokio uses
// tokio-postgres's `Config::connect`, which bounds only the TCP connect by
// `connect_timeout`.

/// `connect_timeout` bounds each host's whole attempt (as in libpq): a first host
/// that accepts connections but never answers does not stall failover.
#[test]
fn connect_timeout_moves_on_from_a_host_that_never_answers() {
    rt::block_on(async {
        init();
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let config = format!(
            "host=127.0.0.1,127.0.0.1 port={port},5432 connect_timeout=1 \
             user=postgres dbname=postgres"
        );
        let options = Options {
            query_timeout: MS(3000),
            ..opts()
        };
        let locker = rt::connect(&config, options).unwrap();
        let t0 = Instant::now();
        let run = locker.run(&crate::unique(rt::NAME, "silent"), |_| async {
            Res::Ok(())
        });
        assert_eq!(rt::timeout(MS(2500), run).await, Ok(Ok(())));
        println!(
            "silent first host -> led on the second: {:.0} ms",
            t0.elapsed().as_secs_f64() * 1e3
        );
        assert!(t0.elapsed() >= MS(1000), "the silent host answered?");
    })
}
