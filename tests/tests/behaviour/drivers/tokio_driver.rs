//! The suite on lease-tokio, each test on its own multi-thread tokio runtime (two
//! workers).

pub use lease_tokio as lease;

// Included by both drivers' files on purpose: the suite compiles once per driver.
#[allow(clippy::duplicate_mod)]
#[path = "suite.rs"]
mod suite;

// `Locker::try_run`, for both drivers as the suite.
#[allow(clippy::duplicate_mod)]
#[path = "try_suite.rs"]
mod try_suite;

/// How the suite builds lockers and uses tokio.
pub mod rt {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use lease_tokio::{Error, Locker, Options};
    use tokio_postgres::NoTls;

    use crate::drivers::DB;

    /// Part of every lease name.
    pub const NAME: &str = "tokio";

    /// Runs a test's body on a fresh runtime.
    pub fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("build a tokio runtime")
            .block_on(f)
    }

    /// `Locker::without_tls`: a locker over `conn` without TLS, its driver running
    /// detached.
    pub fn connect(conn: &str, options: Options) -> Result<Locker, Error> {
        let (locker, driver) = Locker::without_tls(conn, options)?;
        tokio::spawn(driver);
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

    /// A spawned task; dropping it detaches it.
    pub struct Task<T>(tokio::task::JoinHandle<T>);

    impl<T> Task<T> {
        pub fn is_finished(&self) -> bool {
            self.0.is_finished()
        }

        /// Cancels the task and waits until its future is dropped.
        pub async fn cancel(self) {
            self.0.abort();
            let _ = self.0.await;
        }
    }

    impl<T> Future for Task<T> {
        type Output = T;

        /// The task's output; a panic in the task panics here.
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
            Pin::new(&mut self.0).poll(cx).map(|r| match r {
                Ok(out) => out,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("task: {e}"),
            })
        }
    }

    pub fn spawn<F>(f: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Task(tokio::spawn(f))
    }

    pub async fn sleep(d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// `f`'s output, or an error once `limit` has passed.
    pub async fn timeout<T>(limit: Duration, f: impl Future<Output = T>) -> Result<T, String> {
        tokio::time::timeout(limit, f)
            .await
            .map_err(|_| format!("timed out after {limit:?}"))
    }

    /// A plain client of [`DB`] (tokio-postgres on tokio's reactor).
    pub async fn client() -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(DB, NoTls)
            .await
            .expect("connect to the test database");
        tokio::spawn(connection);
        client
    }
}

// lease-tokio alone: its clock is tokio's.

/// The machine reads tokio's clock, the one its timer fires by: under
/// `tokio::time::pause()`, advancing virtual time past the lease's validity
/// cancels the job at once, in real milliseconds, without any reply. (With the
/// system clock beside a tokio timer, the timer fired in virtual time while the
/// machine saw real time: the job ran on for the real validity window.)
#[test]
fn paused_tokio_time_expires_the_lease_in_virtual_time() {
    use std::time::{Duration, Instant};

    use lease_tokio::Reason;

    use crate::drivers::{init, opts};

    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(async {
            init();
            let options = {
                let mut o = opts();
                o.retry_interval = Duration::from_secs(30);
                o.heartbeat_interval = Duration::from_secs(30);
                o.query_timeout = Duration::from_secs(30);
                o
            };
            let validity = options.validity_window();
            let locker = rt::connect(crate::drivers::DB, options).expect("connect");
            let (done, result) = smol::channel::bounded(1);
            let run = locker.run(&crate::drivers::unique(rt::NAME, "paused"), move |lease| {
                let done = done.clone();
                async move {
                    if done.is_closed() {
                        // Called again after the loss: nothing more to check.
                        lease.cancelled().await;
                        return Ok::<(), std::io::Error>(());
                    }
                    // Leading, on real time. From here on, time is virtual.
                    tokio::time::pause();
                    assert!(lease.is_valid());
                    let real = Instant::now();
                    tokio::time::advance(validity + Duration::from_secs(1)).await;
                    let reason = tokio::time::timeout(validity, lease.cancelled()).await;
                    let _ = done.send((reason, lease.is_valid(), real.elapsed())).await;
                    done.close();
                    Ok(())
                }
            });
            let checked = futures_lite::future::or(
                async { Some(result.recv().await.expect("the job reports")) },
                async {
                    let _ = run.await;
                    None
                },
            )
            .await;
            let (reason, valid_after, took) =
                checked.expect("the run ended before the job reported");
            assert!(
                matches!(reason, Ok(Reason::ValidityExpired)),
                "after advancing virtual time past the validity window: {reason:?}"
            );
            assert!(!valid_after, "still valid after its validity window");
            assert!(
                took < Duration::from_secs(5),
                "cancelled {took:?} (real) after the virtual deadline"
            );
            eprintln!("paused tokio time: cancelled {took:?} (real) after advancing past validity");
            locker.close().await;
        });
}
