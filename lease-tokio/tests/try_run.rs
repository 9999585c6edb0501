//! `Locker::try_run` in the test kit's virtual time: the deadline against the
//! lock delay, which only virtual time can place exactly.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_tokio::test_util::TestServer;
use lease_tokio::{Options, Tried};

const LEASE: &str = "nightly";

fn options() -> Options {
    let mut o = Options::default();
    o.retry_interval = Duration::from_secs(1);
    o.lock_delay = Duration::from_millis(500);
    o
}

/// A win whose start is held back by the lock delay when the wait ends: the
/// job does not run and the key is released.
#[tokio::test(start_paused = true)]
async fn a_win_still_in_its_lock_delay_at_the_deadline_does_not_run() {
    let server = TestServer::new(7);
    let (locker, driver) = server.locker(options()).unwrap();
    tokio::spawn(driver);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let start = tokio::time::Instant::now();
    let tried = locker
        .try_run(
            LEASE,
            Duration::from_millis(200),
            move |_lease| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<(), std::io::Error>(())
            },
        )
        .await;
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert_eq!(tried.unwrap(), Tried::Held { holder_pid: None });
    // The win came (its grant is on the server) but never started the job.
    assert_eq!(server.grants().len(), 1, "{:?}", server.grants());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the job ran");
    assert_eq!(server.holder(LEASE), None, "the key was not released");
    assert!(locker.status().leases.is_empty());
}

/// The same with a wait past the lock delay: it runs, once.
#[tokio::test(start_paused = true)]
async fn a_win_whose_lock_delay_ends_within_the_wait_runs() {
    let server = TestServer::new(7);
    let (locker, driver) = server.locker(options()).unwrap();
    tokio::spawn(driver);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let tried = locker
        .try_run(
            LEASE,
            Duration::from_millis(800),
            move |_lease| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<(), std::io::Error>(())
            },
        )
        .await;
    assert_eq!(tried.unwrap(), Tried::Ran);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(server.holder(LEASE), None, "the key was not released");
}

/// A lease lost while the job runs: the job is cancelled, and not called
/// again when the lease is won back (at most once); its run ends.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_does_not_run_the_job_again() {
    let server = TestServer::new(3);
    let (locker, driver) = server.locker(Options::default()).unwrap();
    tokio::spawn(driver);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let run = {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .try_run(LEASE, Duration::ZERO, move |lease| async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    lease.cancelled().await;
                    Ok::<(), std::io::Error>(())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    server.terminate(&locker);
    let tried = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run ended")
        .unwrap();
    assert_eq!(tried.unwrap(), Tried::Ran);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "called again");
    assert_eq!(server.holder(LEASE), None);
}
