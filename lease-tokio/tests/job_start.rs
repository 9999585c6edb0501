//! A job is called only for a start still valid: not after its run's shutdown
//! signal, a loss, or the driver's end (in the test kit, virtual time).

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use lease_tokio::test_util::TestServer;
use lease_tokio::{LeaseState, Locker, Options, RunError};

fn leading(locker: &Locker) -> bool {
    (locker.status().leases.iter()).any(|l| matches!(l.state, LeaseState::Leading { .. }))
}

/// Waits (2 s of virtual time at most) until `locker` leads; asserts it does.
async fn until_leading(locker: &Locker) {
    for _ in 0..200 {
        if leading(locker) {
            return;
        }
        sleep(0.01).await;
    }
    panic!("A never won: {:?}", locker.status());
}

async fn sleep(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

/// `run_until`: the shutdown future completes (it resolves in the very poll
/// where the won lease's start is pending). The job must not be called after
/// that: the run was shut down before its job started.
#[tokio::test(start_paused = true)]
async fn a_job_is_not_called_after_its_shutdown_future_completed() {
    let server = TestServer::new(11);
    let (locker, driver) = server.locker(Options::default()).expect("options");
    tokio::spawn(driver);
    let fired = Arc::new(AtomicBool::new(false));
    // Resolves once the lease is won (the run is polled then: its start).
    let shutdown = {
        let (locker, fired) = (locker.clone(), fired.clone());
        poll_fn(move |_| {
            if leading(&locker) {
                fired.store(true, Ordering::SeqCst);
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    };
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (c, f) = (calls.clone(), fired.clone());
    let run = locker.run_until("x", shutdown, move |lease| {
        c.lock()
            .unwrap()
            .push((f.load(Ordering::SeqCst), lease.is_cancelled()));
        async move {
            lease.cancelled().await;
            Ok::<(), std::io::Error>(())
        }
    });
    let ended = tokio::time::timeout(Duration::from_secs(30), run).await;
    assert!(fired.load(Ordering::SeqCst), "the shutdown fired");
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    let calls = calls.lock().unwrap().clone();
    assert!(
        calls.is_empty(),
        "the job was called after the shutdown future completed: \
         (shutdown already fired, lease already cancelled) per call = {calls:?}"
    );
}

/// The lease is won, then lost (its session terminated, the key taken by
/// another replica) before the run future is polled again (a busy
/// executor). The run then calls the job with a lease lost long ago, while
/// the other replica's job runs.
#[tokio::test(start_paused = true)]
async fn a_job_is_not_called_for_a_lease_lost_before_its_start() {
    let server = TestServer::new(12);
    let (a, driver_a) = server.locker(Options::default()).expect("options");
    tokio::spawn(driver_a);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    let b_running = Arc::new(AtomicBool::new(false));
    let br = b_running.clone();
    let run = a.run("x", move |lease| {
        c.lock().unwrap().push((
            lease.is_valid(),
            lease.is_cancelled(),
            br.load(Ordering::SeqCst),
        ));
        async move {
            lease.cancelled().await;
            Ok::<(), std::io::Error>(())
        }
    });
    let mut run = pin!(run);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(run.as_mut().poll(&mut cx).is_pending());
    // Won: the start waits in the run's slot; the run's task is not polled.
    until_leading(&a).await;
    server.terminate(&a);
    let (b, driver_b) = server.locker(Options::default()).expect("options");
    tokio::spawn(driver_b);
    let br = b_running.clone();
    tokio::spawn(async move {
        b.run("x", move |lease| {
            let br = br.clone();
            async move {
                br.store(true, Ordering::SeqCst);
                lease.cancelled().await;
                Ok::<(), std::io::Error>(())
            }
        })
        .await
    });
    sleep(5.0).await;
    assert!(b_running.load(Ordering::SeqCst), "B leads");
    // A's run task gets its turn.
    let _ = run.as_mut().poll(&mut cx);
    let calls = calls.lock().unwrap().clone();
    assert!(
        calls.is_empty(),
        "A's job was called for a lease lost before its start, while B's job runs: \
         (is_valid, is_cancelled, B running) = {calls:?}"
    );
}

/// The driver is dropped while a won lease's start waits in the run's slot:
/// the job is called after the driver is gone.
#[tokio::test(start_paused = true)]
async fn a_job_is_not_called_after_the_driver_is_gone() {
    let server = TestServer::new(13);
    let (a, driver) = server.locker(Options::default()).expect("options");
    let driver = tokio::spawn(driver);
    let calls = Arc::new(Mutex::new(0));
    let c = calls.clone();
    let run = a.run("x", move |lease| {
        *c.lock().unwrap() += 1;
        async move {
            lease.cancelled().await;
            Ok::<(), std::io::Error>(())
        }
    });
    let mut run = pin!(run);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(run.as_mut().poll(&mut cx).is_pending());
    until_leading(&a).await;
    driver.abort();
    let _ = driver.await;
    let ended = run.as_mut().poll(&mut cx);
    let calls = *calls.lock().unwrap();
    assert!(
        matches!(ended, Poll::Ready(Err(RunError::DriverStopped))) && calls == 0,
        "after the driver was dropped: poll = {ended:?}, job calls = {calls}"
    );
}
