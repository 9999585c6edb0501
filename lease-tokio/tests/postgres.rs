//! Against the local PostgreSQL at 127.0.0.1:5432 (trust auth).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lease_tokio::{Error, LeaseId, LeaseState, Locker, Options, Reason, RunError, SessionState};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep, timeout};

const DB: &str = "host=127.0.0.1 user=postgres dbname=postgres";
const MS: fn(u64) -> Duration = Duration::from_millis;

type Res = Result<(), String>;

fn opts() -> Options {
    Options {
        retry_interval: MS(100),
        heartbeat_interval: MS(100),
        query_timeout: MS(400),
        guard_margin: MS(200),
        ..Options::default()
    }
}

fn init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A name no other test (or earlier test run) uses.
fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn key(name: &str) -> i64 {
    LeaseId::named(name).unwrap().key()
}

async fn client() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(DB, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(connection);
    client
}

/// How many sessions hold `key`, seen from another session.
async fn holders(key: i64) -> i64 {
    client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND granted AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until `f` holds, at most `limit`.
async fn eventually<F: std::future::Future<Output = bool>>(limit: Duration, f: impl Fn() -> F) {
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        sleep(MS(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_and_job_sees_token_and_validity() {
    init();
    let locker = spawned(DB, opts());
    let name = unique("acquire");
    let k = key(&name);
    let seen = Arc::new(Mutex::new(None));
    let result = locker
        .run(&name, |lease| {
            let seen = seen.clone();
            async move {
                let now = Instant::now();
                let held = holders(lease.key()).await;
                *seen.lock().unwrap() = Some((
                    lease.name().to_owned(),
                    lease.token(),
                    lease.valid_until(),
                    lease.is_valid(),
                    lease.is_cancelled(),
                    now,
                    held,
                ));
                Ok::<(), String>(())
            }
        })
        .await;
    assert_eq!(result, Ok(()));
    let (lname, token, valid_until, valid, cancelled, now, held) =
        seen.lock().unwrap().take().unwrap();
    assert_eq!(lname, name);
    assert!(token > 0, "token {token}");
    assert!(
        valid_until.is_some_and(|v| v > now),
        "valid_until {valid_until:?} not after {now:?}"
    );
    assert!(valid && !cancelled);
    assert_eq!(held, 1, "the key was not held while the job ran");
    assert_eq!(
        holders(k).await,
        0,
        "the key was not released after the job returned"
    );
    assert!(locker.status().leases.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_by_notify_when_the_leader_returns() {
    init();
    let name = unique("handover");
    let a = spawned(DB, opts());
    // The standby polls only every 5 s: a fast takeover can only come from NOTIFY.
    let b = spawned(DB, Options::default());
    let (a_started, mut a_started_rx) = mpsc::unbounded_channel();
    let (a_finish, a_finish_rx) = oneshot::channel::<()>();
    let a_returned = Arc::new(Mutex::new(None));
    let a_run = {
        let (a, name, a_returned) = (a.clone(), name.clone(), a_returned.clone());
        let mut a_finish_rx = Some(a_finish_rx);
        tokio::spawn(async move {
            a.run(&name, move |_lease| {
                let (a_started, rx, a_returned) =
                    (a_started.clone(), a_finish_rx.take(), a_returned.clone());
                async move {
                    a_started.send(()).unwrap();
                    rx.unwrap().await.unwrap();
                    *a_returned.lock().unwrap() = Some(Instant::now());
                    Ok::<(), String>(())
                }
            })
            .await
        })
    };
    a_started_rx.recv().await.unwrap();
    let b_started = Arc::new(Mutex::new(None));
    let b_run = {
        let (b, name, b_started) = (b.clone(), name.clone(), b_started.clone());
        tokio::spawn(async move {
            b.run(&name, move |lease| {
                let b_started = b_started.clone();
                async move {
                    *b_started.lock().unwrap() = Some((Instant::now(), lease.token()));
                    Ok::<(), String>(())
                }
            })
            .await
        })
    };
    sleep(MS(300)).await;
    assert!(
        b_started.lock().unwrap().is_none(),
        "the standby ran while the leader held the key"
    );
    assert!(matches!(b.status().leases[0].state, LeaseState::Standby));
    a_finish.send(()).unwrap();
    assert_eq!(a_run.await.unwrap(), Ok(()));
    assert_eq!(timeout(MS(2000), b_run).await.unwrap().unwrap(), Ok(()));
    let returned = a_returned.lock().unwrap().unwrap();
    let (started, _) = b_started.lock().unwrap().unwrap();
    let handover = started - returned;
    println!("handover: {:.2} ms", handover.as_secs_f64() * 1e3);
    assert!(
        handover < MS(200),
        "handover took {handover:?}: NOTIFY did not wake the standby"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_locker_refuses_a_second_run_of_a_lease_and_bad_names() {
    init();
    let options = Options {
        max_leases: 2,
        ..opts()
    };
    let locker = spawned(DB, options);
    let name = unique("twice");
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let first = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move {
            locker
                .run(&name, move |lease| {
                    let started = started.clone();
                    async move {
                        started.send(()).unwrap();
                        lease.cancelled().await;
                        Ok::<(), String>(())
                    }
                })
                .await
        })
    };
    started_rx.recv().await.unwrap();
    let second = locker.run(&name, |_| async { Ok::<(), String>(()) }).await;
    assert_eq!(
        second,
        Err(RunError::AlreadyRunning(LeaseId::named(&name).unwrap()))
    );
    let raw = locker.run_lease(
        LeaseId::raw(key(&name)),
        std::future::pending(),
        |_| async { Res::Ok(()) },
    );
    assert!(
        matches!(raw.await, Err(RunError::AlreadyRunning(_))),
        "same key under another name"
    );
    let empty = locker.run("  ", |_| async { Res::Ok(()) }).await;
    assert_eq!(empty, Err(RunError::Name(lease_tokio::NameError::Empty)));
    // max_leases = 2: one more run fits, a third does not.
    let other = unique("twice-other");
    let (go, go_rx) = oneshot::channel::<()>();
    let fits = {
        let locker = locker.clone();
        let shutdown = async { go_rx.await.unwrap() };
        tokio::spawn(async move {
            let job = |lease: lease_tokio::Lease| async move {
                lease.cancelled().await;
                Res::Ok(())
            };
            locker.run_until(&other, shutdown, job).await
        })
    };
    let l = locker.clone();
    eventually(MS(1000), || async { l.status().leases.len() == 2 }).await;
    let third = locker
        .run(&unique("twice-third"), |_| async { Res::Ok(()) })
        .await;
    assert_eq!(third, Err(RunError::TooManyLeases { cap: 2 }));
    go.send(()).unwrap();
    assert_eq!(fits.await.unwrap(), Ok(()));
    locker.close().await;
    assert_eq!(first.await.unwrap(), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_makes_running_runs_return_ok() {
    init();
    let locker = spawned(DB, opts());
    let names = [unique("close-a"), unique("close-b")];
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let mut runs = Vec::new();
    for name in &names {
        let (locker, name, reasons, started) = (
            locker.clone(),
            name.clone(),
            reasons.clone(),
            started.clone(),
        );
        runs.push(tokio::spawn(async move {
            locker
                .run(&name, move |lease| {
                    let (reasons, started) = (reasons.clone(), started.clone());
                    async move {
                        started.send(()).unwrap();
                        let reason = lease.cancelled().await;
                        assert!(
                            lease.is_cancelled()
                                && !lease.is_valid()
                                && lease.valid_until().is_none()
                        );
                        reasons.lock().unwrap().push(reason);
                        Ok::<(), String>(())
                    }
                })
                .await
        }));
    }
    started_rx.recv().await.unwrap();
    started_rx.recv().await.unwrap();
    assert_eq!(holders(key(&names[0])).await, 1);
    timeout(MS(2000), locker.close()).await.expect("close hung");
    for run in runs {
        assert_eq!(run.await.unwrap(), Ok(()));
    }
    assert_eq!(
        *reasons.lock().unwrap(),
        vec![Reason::Closed, Reason::Closed]
    );
    for name in &names {
        assert_eq!(holders(key(name)).await, 0);
    }
    let called = Arc::new(Mutex::new(false));
    let late = locker.run(&unique("close-late"), |_| {
        *called.lock().unwrap() = true;
        async { Res::Ok(()) }
    });
    assert_eq!(timeout(MS(100), late).await.unwrap(), Ok(()));
    assert!(!*called.lock().unwrap(), "a job ran after close");
}

struct SetOnDrop(Arc<Mutex<bool>>);
impl Drop for SetOnDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = true;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_run_future_releases_the_key() {
    init();
    let locker = spawned(DB, opts());
    let name = unique("drop");
    let k = key(&name);
    let dropped = Arc::new(Mutex::new(false));
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let run = locker.run(&name, |_lease| {
        let (guard, started) = (SetOnDrop(dropped.clone()), started.clone());
        async move {
            let _guard = guard;
            started.send(()).unwrap();
            std::future::pending::<Res>().await // ignores cancellation
        }
    });
    tokio::select! {
        r = run => panic!("the run returned {r:?}"),
        _ = started_rx.recv() => {}
    }
    assert!(
        *dropped.lock().unwrap(),
        "the job future was not dropped with its run"
    );
    let t0 = Instant::now();
    eventually(MS(1000), || async { holders(k).await == 0 }).await;
    println!(
        "drop -> released: {:.2} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    assert!(locker.status().leases.is_empty());
    // The key is free for the next run.
    assert_eq!(locker.run(&name, |_| async { Res::Ok(()) }).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_error_is_returned_and_the_key_released() {
    init();
    let locker = spawned(DB, opts());
    let name = unique("error");
    let mut calls = 0;
    let result = locker
        .run(&name, |_| {
            calls += 1;
            async { Err::<(), _>("boom".to_owned()) }
        })
        .await;
    assert_eq!(result, Err(RunError::Job("boom".to_owned())));
    assert_eq!(calls, 1);
    assert_eq!(holders(key(&name)).await, 0);
    let e: Box<dyn std::error::Error> = Box::new(RunError::Job(std::io::Error::other("disk")));
    assert_eq!(e.to_string(), "disk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backend_cancels_the_job_at_once_and_the_run_reacquires() {
    init();
    // Heartbeat every 2 s: a cancellation within tens of ms comes from the
    // connection's end, not from a heartbeat or the validity deadline.
    let options = Options {
        heartbeat_interval: MS(2000),
        ..opts()
    };
    let locker = spawned(DB, options);
    let name = unique("terminate");
    let (events, mut events_rx) = mpsc::unbounded_channel();
    let run = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move {
            let mut call = 0;
            locker
                .run(&name, move |lease| {
                    call += 1;
                    let events = events.clone();
                    async move {
                        events
                            .send(("started", lease.token(), None, Instant::now()))
                            .unwrap();
                        if call == 1 {
                            let reason = lease.cancelled().await;
                            assert!(!lease.is_valid());
                            events
                                .send(("cancelled", lease.token(), Some(reason), Instant::now()))
                                .unwrap();
                        }
                        Ok::<(), String>(())
                    }
                })
                .await
        })
    };
    let (_, token1, _, _) = events_rx.recv().await.unwrap();
    let SessionState::Ready { backend_pid } = locker.status().session else {
        panic!("session not ready: {:?}", locker.status());
    };
    let other = client().await;
    let t0 = Instant::now();
    let terminated: bool = other
        .query_one(
            "SELECT pg_terminate_backend($1::int)",
            &[&(backend_pid as i32)],
        )
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    let (what, _, reason, at) = timeout(MS(1000), events_rx.recv()).await.unwrap().unwrap();
    assert_eq!(what, "cancelled");
    let cancel = at - t0;
    println!(
        "terminate -> cancel: {:.2} ms ({reason:?})",
        cancel.as_secs_f64() * 1e3
    );
    assert!(matches!(reason, Some(Reason::SessionLost(_))), "{reason:?}");
    assert!(cancel < MS(100), "cancellation took {cancel:?}");
    let (what, token2, _, _) = timeout(MS(3000), events_rx.recv()).await.unwrap().unwrap();
    assert_eq!(what, "started");
    assert!(
        token2 > token1,
        "fencing token did not grow: {token1} then {token2}"
    );
    assert_eq!(run.await.unwrap(), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_shuts_down_gracefully() {
    init();
    let locker = spawned(DB, opts());
    let name = unique("shutdown");
    let (stop, stop_rx) = oneshot::channel::<()>();
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let returned = Arc::new(Mutex::new(None));
    let run = {
        let (locker, name, returned) = (locker.clone(), name.clone(), returned.clone());
        tokio::spawn(async move {
            let signal = async { stop_rx.await.unwrap() };
            locker
                .run_until(&name, signal, move |lease| {
                    let (started, returned) = (started.clone(), returned.clone());
                    async move {
                        started.send(()).unwrap();
                        let reason = lease.cancelled().await;
                        sleep(MS(50)).await; // finishing up: the key stays held
                        assert_eq!(holders(lease.key()).await, 1);
                        *returned.lock().unwrap() = Some(reason);
                        Ok::<(), String>(())
                    }
                })
                .await
        })
    };
    started_rx.recv().await.unwrap();
    stop.send(()).unwrap();
    assert_eq!(timeout(MS(2000), run).await.unwrap().unwrap(), Ok(()));
    assert_eq!(*returned.lock().unwrap(), Some(Reason::Shutdown));
    assert_eq!(holders(key(&name)).await, 0);
    // A signal that fires while standing by ends the run without a job.
    let (holder_started, mut holder_started_rx) = mpsc::unbounded_channel();
    let holder = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move {
            locker
                .run(&name, move |lease| {
                    let holder_started = holder_started.clone();
                    async move {
                        holder_started.send(()).unwrap();
                        lease.cancelled().await;
                        Res::Ok(())
                    }
                })
                .await
        })
    };
    holder_started_rx.recv().await.unwrap();
    let standby = spawned(DB, opts());
    let r = standby.run_until(&name, sleep(MS(200)), |_| async {
        panic!("standby ran") as Res
    });
    assert_eq!(timeout(MS(1000), r).await.unwrap(), Ok(()));
    locker.close().await;
    assert_eq!(holder.await.unwrap(), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_does_not_fail_and_keeps_retrying() {
    init();
    let locker = spawned(
        "host=127.0.0.1 port=1 user=postgres dbname=postgres",
        opts(),
    );
    let run = tokio::spawn(locker.run(&unique("unreachable"), |_| async {
        panic!("ran without a server") as Res
    }));
    sleep(MS(300)).await;
    assert!(!run.is_finished(), "the run ended without a server");
    let status = locker.status();
    assert_eq!(status.leases.len(), 1);
    match status.session {
        // 50 ms first backoff, doubling: at least three attempts in 300 ms.
        SessionState::Backoff { failures, .. } => {
            assert!(failures >= 2, "only {failures} attempts")
        }
        SessionState::Connecting => {}
        other => panic!("unexpected session state {other:?}"),
    }
    run.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_driver_ends_pending_runs() {
    init();
    let name = unique("driver-drop");
    let holder = spawned(DB, opts());
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let held = {
        let (holder, name) = (holder.clone(), name.clone());
        tokio::spawn(async move {
            holder
                .run(&name, move |lease| {
                    let started = started.clone();
                    async move {
                        started.send(()).unwrap();
                        let reason = lease.cancelled().await;
                        Err::<(), _>(format!("{reason}"))
                    }
                })
                .await
        })
    };
    started_rx.recv().await.unwrap();
    let (standby, driver) =
        Locker::new(DB.parse().unwrap(), tokio_postgres::NoTls, opts()).unwrap();
    let driver = tokio::spawn(driver);
    let waiting = {
        let (standby, name) = (standby.clone(), name.clone());
        tokio::spawn(async move { standby.run(&name, |_| async { Res::Ok(()) }).await })
    };
    sleep(MS(200)).await;
    driver.abort();
    assert_eq!(
        timeout(MS(1000), waiting).await.unwrap().unwrap(),
        Err(RunError::DriverStopped)
    );
    // A job that returns an error once closed still ends its run with Ok.
    holder.close().await;
    assert_eq!(held.await.unwrap(), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_leaders_driver_cancels_its_job() {
    init();
    let name = unique("driver-drop-leader");
    let (locker, driver) = Locker::new(DB.parse().unwrap(), tokio_postgres::NoTls, opts()).unwrap();
    let driver = tokio::spawn(driver);
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let run = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move {
            locker
                .run(&name, move |lease| {
                    let started = started.clone();
                    async move {
                        started.send(()).unwrap();
                        lease.cancelled().await;
                        Res::Ok(())
                    }
                })
                .await
        })
    };
    started_rx.recv().await.unwrap();
    driver.abort();
    assert_eq!(
        timeout(MS(1000), run).await.unwrap().unwrap(),
        Err(RunError::DriverStopped)
    );
    eventually(MS(1000), || async { holders(key(&name)).await == 0 }).await;
}

#[tokio::test]
async fn the_driver_ends_when_every_locker_is_dropped() {
    init();
    let (locker, driver) = Locker::new(DB.parse().unwrap(), tokio_postgres::NoTls, opts()).unwrap();
    let driver = tokio::spawn(driver);
    assert_eq!(
        locker.run(&unique("last"), |_| async { Res::Ok(()) }).await,
        Ok(())
    );
    drop(locker);
    timeout(MS(1000), driver)
        .await
        .expect("the driver did not end")
        .unwrap();
}

#[tokio::test]
async fn construction_errors_are_typed_and_hide_passwords() {
    let bad = Options {
        retry_interval: Duration::ZERO,
        ..opts()
    };
    assert!(matches!(Locker::connect(DB, bad), Err(Error::Options(_))));
    for s in [
        "postgres://u:hunter2@localhost:notaport/db",
        "host=h password=hunter2 port=x",
        "password='hunter2",
    ] {
        match Locker::connect(s, opts()) {
            Err(Error::Config(msg)) => assert!(!msg.contains("hunter2"), "{msg}"),
            Err(other) => panic!("{s}: {other:?}"),
            Ok(_) => panic!("{s}: accepted"),
        }
    }
    assert!(matches!(
        Locker::connect("user=postgres", opts()),
        Err(Error::Config(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_long_job_valid() {
    init();
    let locker = spawned(DB, opts());
    let result = locker
        .run(&unique("long"), |lease| async move {
            let first = lease.valid_until().unwrap();
            // Three validity windows (500 ms each): only heartbeats keep it valid.
            let end = Instant::now() + MS(1500);
            while Instant::now() < end {
                if !lease.is_valid() || lease.is_cancelled() {
                    return Err(format!("lease invalid at {:?}", lease.valid_until()));
                }
                sleep(MS(20)).await;
            }
            let last = lease.valid_until().unwrap();
            if last < first + MS(900) {
                return Err(format!("valid_until moved only {:?}", last - first));
            }
            Ok(())
        })
        .await;
    assert_eq!(result, Ok(()));
}

#[test]
fn handles_are_shareable_and_the_driver_spawnable() {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    fn spawnable<T: std::future::Future<Output = ()> + Send + 'static>() {}
    shareable::<Locker>();
    shareable::<lease_tokio::Lease>();
    spawnable::<lease_tokio::Driver<tokio_postgres::NoTls>>();
}

/// A locker with its driver spawned.
fn spawned(config: &str, options: Options) -> Locker {
    let (locker, driver) = Locker::connect(config, options).unwrap();
    tokio::spawn(driver);
    locker
}
