//! `Locker::try_run` against the local server, written once for both drivers
//! (included by `tokio_driver.rs` and `smol_driver.rs` as `suite.rs` is).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smol::channel::unbounded;

use super::lease::{Locker, Options, RunError, SessionState, Tried};
use super::rt::{self, sleep};
use crate::drivers::{holders_seen_by, init, key, opts, Res, DB, MS};

fn unique(name: &str) -> String {
    crate::drivers::unique(rt::NAME, name)
}

fn locker(options: Options) -> Locker {
    rt::connect(DB, options).expect("connect a locker")
}

async fn holders(key: i64) -> i64 {
    holders_seen_by(&rt::client().await, key).await
}

/// The backend pid of `locker`'s lease session, once it is ready.
fn backend_pid(locker: &Locker) -> Option<i64> {
    match locker.status().session {
        SessionState::Ready { backend_pid } => Some(backend_pid),
        _ => None,
    }
}

/// A run of `name` on `locker` that leads until `stop` resolves, once its
/// job started: its task.
async fn leading_until(
    locker: &Locker,
    name: &str,
    stop: smol::channel::Receiver<()>,
) -> rt::Task<Result<(), RunError<String>>> {
    let (started, started_rx) = unbounded();
    let (locker, name) = (locker.clone(), name.to_owned());
    let task = rt::spawn(async move {
        let shutdown = async move {
            let _ = stop.recv().await;
        };
        locker
            .run_until(&name, shutdown, move |lease| {
                let started = started.clone();
                async move {
                    started.try_send(()).unwrap();
                    lease.cancelled().await;
                    Res::Ok(())
                }
            })
            .await
    });
    started_rx.recv().await.unwrap();
    task
}

/// A job that counts its calls.
fn counting(
    calls: &Arc<AtomicUsize>,
) -> impl FnOnce(super::lease::Lease) -> std::future::Ready<Res> {
    let calls = calls.clone();
    move |_lease| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(()))
    }
}

#[test]
fn try_run_of_a_held_lease_does_not_run_and_names_the_holder() {
    rt::block_on(async {
        init();
        let holder = locker(opts());
        let name = unique("try-held");
        let (stop, stop_rx) = unbounded();
        let task = leading_until(&holder, &name, stop_rx).await;
        let pid = backend_pid(&holder).expect("the holder's session is ready");
        let other = locker(opts());
        let calls = Arc::new(AtomicUsize::new(0));
        for wait in [Duration::ZERO, MS(300)] {
            let start = Instant::now();
            let tried = other.try_run(&name, wait, counting(&calls)).await;
            let took = start.elapsed();
            eprintln!("FIGURE {} try_run held, wait {wait:?}: {took:?}", rt::NAME);
            assert_eq!(
                tried,
                Ok(Tried::Held {
                    holder_pid: Some(pid)
                })
            );
            assert!(
                took >= wait,
                "gave up after {took:?}, before the wait {wait:?}"
            );
            // Without a wait: a connection and a try (opts: 400 ms query timeout).
            let limit = wait.max(MS(800)) + MS(300);
            assert!(took < limit, "gave up after {took:?}, over {limit:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0, "the job ran");
        assert!(other.status().leases.is_empty(), "the try's run remains");
        let _ = stop.try_send(());
        assert_eq!(task.await, Ok(()));
        holder.close().await;
        other.close().await;
    });
}

#[test]
fn try_run_of_a_free_lease_runs_once_and_releases() {
    rt::block_on(async {
        init();
        let locker = locker(opts());
        let name = unique("try-free");
        let k = key(&name);
        let held_while_running = Arc::new(AtomicUsize::new(0));
        let seen = held_while_running.clone();
        let start = Instant::now();
        let tried = locker
            .try_run(&name, Duration::ZERO, move |lease| async move {
                assert!(lease.is_valid());
                let n = holders(lease.key()).await;
                seen.store(usize::try_from(n).unwrap(), Ordering::SeqCst);
                Res::Ok(())
            })
            .await;
        eprintln!("FIGURE {} try_run free: {:?}", rt::NAME, start.elapsed());
        assert_eq!(tried, Ok(Tried::Ran));
        assert_eq!(held_while_running.load(Ordering::SeqCst), 1);
        assert_eq!(holders(k).await, 0, "not released");
        // The job's error is the run's.
        let failed = locker
            .try_run(&name, Duration::ZERO, |_lease| async {
                Err::<(), _>("boom".to_owned())
            })
            .await;
        assert_eq!(failed, Err(RunError::Job("boom".to_owned())));
        locker.close().await;
    });
}

#[test]
fn try_run_that_waits_for_a_graceful_release_runs() {
    rt::block_on(async {
        init();
        let holder = locker(opts());
        let name = unique("try-wait");
        let (stop, stop_rx) = unbounded();
        let task = leading_until(&holder, &name, stop_rx).await;
        let other = locker(opts());
        let calls = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let try_task = {
            let (other, name, calls) = (other.clone(), name.clone(), calls.clone());
            rt::spawn(async move { other.try_run(&name, MS(5000), counting(&calls)).await })
        };
        sleep(MS(500)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 0, "ran while held");
        let _ = stop.try_send(());
        assert_eq!(task.await, Ok(()));
        let released = start.elapsed();
        assert_eq!(try_task.await, Ok(Tried::Ran));
        let took = start.elapsed();
        eprintln!(
            "FIGURE {} try_run after a graceful release: ran {:?} after it",
            rt::NAME,
            took - released
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(took < MS(3000), "ran only after {took:?}");
        holder.close().await;
        other.close().await;
    });
}

#[test]
fn try_run_gives_up_on_an_unreachable_server() {
    rt::block_on(async {
        init();
        // Nothing listens on port 1.
        let locker = rt::connect("host=127.0.0.1 port=1 user=postgres", opts()).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let tried = locker
            .try_run(&unique("try-down"), Duration::ZERO, counting(&calls))
            .await;
        assert!(
            matches!(
                tried,
                Ok(Tried::Unreachable {
                    last_error: Some(_)
                })
            ),
            "{tried:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    });
}
