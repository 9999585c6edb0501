//! The test kit on smol, in its virtual time (`test_util::block_on`): the
//! real locker and driver over the simulated server, under its own faults.

use std::time::{Duration, Instant};

use lease_smol::test_util::{self, JobLog, TestServer};
use lease_smol::{Options, RunError};
use smol::Task;

const LEASE: &str = "sweeper";

type Run = Task<Result<(), RunError<std::io::Error>>>;

/// A replica of a job that logs its runs and returns when cancelled. Keep
/// the run's task: dropping a smol task cancels it.
fn replica(server: &TestServer, log: &JobLog) -> (lease_smol::Locker, Run) {
    let (locker, driver) = server.locker(Options::default()).expect("options");
    test_util::spawn(driver).detach();
    let (run_locker, log) = (locker.clone(), log.clone());
    let run = test_util::spawn(async move {
        run_locker
            .run(LEASE, move |lease| {
                let log = log.clone();
                async move {
                    let _running = log.start(&lease);
                    lease.cancelled().await;
                    Ok::<(), std::io::Error>(())
                }
            })
            .await
    });
    (locker, run)
}

async fn sleep(secs: f64) {
    test_util::sleep(Duration::from_secs_f64(secs)).await;
}

/// A leader and a standby, the leader leading, with their runs.
async fn pair(
    seed: u64,
) -> (
    TestServer,
    JobLog,
    lease_smol::Locker,
    lease_smol::Locker,
    [Run; 2],
) {
    let server = TestServer::new(seed);
    let log = server.job_log();
    let (a, run_a) = replica(&server, &log);
    sleep(0.1).await;
    let (b, run_b) = replica(&server, &log);
    sleep(2.0).await;
    assert_eq!(server.holder(LEASE), Some(server.index(&a)));
    (server, log, a, b, [run_a, run_b])
}

/// What a user's smol test does: partition the leader for 60 s of virtual
/// time; its job stops before the standby's starts, in milliseconds of wall
/// time.
#[test]
fn a_partitioned_leader_stops_before_the_standby_starts() {
    let wall = Instant::now();
    test_util::block_on(async {
        let (server, log, a, b, _runs) = pair(1).await;
        server.partition(&a, Duration::from_secs(60));
        sleep(70.0).await;
        let runs = log.runs();
        assert_eq!(server.holder(LEASE), Some(server.index(&b)), "{runs:#?}");
        assert_eq!(runs.len(), 2, "{runs:#?}");
        let (first, second) = (&runs[0], &runs[1]);
        let stopped = first.stopped.expect("the partitioned leader stopped");
        assert!(stopped < second.started, "{runs:#?}");
        assert_eq!(log.check_no_overlap(), []);
        assert_eq!(log.check_stopped_within(Duration::ZERO), []);
        assert!(
            server.now() >= Duration::from_secs(72),
            "{:?}",
            server.now()
        );
        let wall = wall.elapsed();
        println!(
            "FIGURE smol kit: 60 s partition in {} ms wall (72 s virtual): the leader stopped at \
             {stopped:?}, the standby started at {:?}",
            wall.as_millis(),
            second.started,
        );
    });
    let wall = wall.elapsed();
    assert!(wall < Duration::from_secs(2), "{wall:?}");
}

#[test]
fn a_terminated_leader_hands_over_at_once_and_tokens_increase() {
    test_util::block_on(async {
        let (server, log, a, b, _runs) = pair(2).await;
        let before = server.now();
        server.terminate(&a);
        sleep(1.0).await;
        assert_eq!(server.holder(LEASE), Some(server.index(&b)));
        let runs = log.runs();
        assert!(
            runs[1].started - before < Duration::from_millis(100),
            "{runs:#?}"
        );
        let tokens = server.tokens(LEASE);
        assert_eq!(tokens.len(), 2, "{tokens:?}");
        assert!(tokens[0].1 < tokens[1].1, "{tokens:?}");
        assert_eq!(log.check_no_overlap(), []);
    });
}

#[test]
fn a_crashed_leader_frees_the_lease_and_its_run_ends() {
    test_util::block_on(async {
        let (server, log, a, b, [run_a, _run_b]) = pair(3).await;
        server.crash(&a);
        sleep(1.0).await;
        assert_eq!(server.holder(LEASE), Some(server.index(&b)));
        assert_eq!(log.check_no_overlap(), []);
        // Its driver is gone: the run returns once its (cancelled) job has.
        let ended = run_a.await;
        assert!(matches!(ended, Err(RunError::DriverStopped)), "{ended:?}");
    });
}

#[test]
fn a_frozen_leader_is_ended_by_the_guard_and_its_job_runs_on() {
    test_util::block_on(async {
        let (server, log, a, b, _runs) = pair(4).await;
        server.freeze(&a, Duration::from_secs(30));
        sleep(20.0).await;
        // The guard ended the frozen session; the standby leads; the frozen
        // driver has not noticed: its job still runs (only fencing helps).
        assert_eq!(server.holder(LEASE), Some(server.index(&b)));
        let runs = log.runs();
        assert!(runs[0].stopped.is_none(), "{runs:#?}");
        assert!(!log.check_no_overlap().is_empty());
        sleep(15.0).await;
        let runs = log.runs();
        assert!(runs[0].stopped.is_some(), "{runs:#?}");
    });
}

#[test]
fn a_server_restart_ends_every_session_and_a_replica_leads_again() {
    test_util::block_on(async {
        let (server, log, _a, _b, _runs) = pair(5).await;
        server.restart(Duration::from_secs(5));
        sleep(2.0).await;
        assert_eq!(server.holder(LEASE), None);
        sleep(10.0).await;
        assert!(server.holder(LEASE).is_some());
        assert_eq!(log.check_no_overlap(), []);
        assert_eq!(log.runs().len(), 2);
    });
}

#[test]
fn a_slow_network_still_elects_one_leader() {
    test_util::block_on(async {
        let server = TestServer::new(6);
        server.slow(Duration::from_millis(80));
        let log = server.job_log();
        let (_a, _run_a) = replica(&server, &log);
        let (_b, _run_b) = replica(&server, &log);
        sleep(5.0).await;
        assert!(server.holder(LEASE).is_some());
        assert_eq!(log.runs().len(), 1);
    });
}

/// The same seed, the same run: statement for statement, grant for grant.
#[test]
fn a_seed_replays_the_same_run() {
    let once = || {
        test_util::block_on(async {
            let (server, _, a, _, _runs) = pair(9).await;
            server.partition(&a, Duration::from_secs(20));
            sleep(30.0).await;
            let sent: Vec<_> = (server.statements().into_iter())
                .map(|s| (s.locker, s.at, s.statement.sql()))
                .collect();
            (sent, server.grants())
        })
    };
    let (first, second) = (once(), once());
    assert!(first.0.len() > 10);
    assert_eq!(first, second);
}

/// The nemesis: random partitions and latency on three replicas for a
/// minute each case; one run at a time, each stopped at once when
/// cancelled.
#[test]
fn under_random_partitions_and_latency_one_run_at_a_time() {
    use lease_smol::test_util::nemesis::proptest::test_runner::{Config, TestRunner};
    use lease_smol::test_util::nemesis::{timeline, Mix};

    let cases = std::env::var("PROPTEST_CASES").map_or(8, |n| n.parse().expect("a number"));
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let mix = Mix {
        terminate: 0,
        restart: 0,
        ..Mix::default()
    };
    let faults = timeline(3, Duration::from_secs(60), Duration::from_secs(30), 8, mix);
    let wall = Instant::now();
    runner
        .run(&(0..1000u64, faults), |(seed, faults)| {
            test_util::block_on(async {
                let server = TestServer::new(seed);
                let log = server.job_log();
                let (lockers, _runs): (Vec<_>, Vec<_>) =
                    (0..3).map(|_| replica(&server, &log)).unzip();
                sleep(1.0).await;
                server.run_timeline(&lockers, &faults).await;
                sleep(40.0).await;
                let mut found = log.check_no_overlap();
                found.extend(log.check_stopped_within(Duration::ZERO));
                assert!(found.is_empty(), "{faults:?}: {found:#?}");
                assert!(
                    server.holder(LEASE).is_some(),
                    "{faults:?}: nobody leads at the end"
                );
            });
            Ok(())
        })
        .expect("no breach");
    println!(
        "FIGURE smol kit nemesis: {cases} cases of 3 replicas under random faults in {:?}",
        wall.elapsed()
    );
}

/// A job's own waits go through the kit's timer: a job that sweeps every
/// 100 ms sweeps ten times a virtual second, however fast the wall clock.
#[test]
fn a_jobs_own_waits_run_in_virtual_time() {
    test_util::block_on(async {
        let server = TestServer::new(8);
        let (locker, driver) = server.locker(Options::default()).expect("options");
        test_util::spawn(driver).detach();
        let store = server.fenced_store();
        let job_store = store.clone();
        test_util::spawn(async move {
            locker
                .run(LEASE, move |lease| {
                    let store = job_store.clone();
                    async move {
                        let mut swept = 0u64;
                        while lease.is_valid() {
                            test_util::sleep(Duration::from_millis(100)).await;
                            swept += 1;
                            let _ = store.write(lease.token(), swept);
                        }
                        Ok::<(), std::io::Error>(())
                    }
                })
                .await
        })
        .detach();
        sleep(10.0).await;
        let sweeps = store.accepted().len();
        // About 100 in 10 s, less the time to win the lease.
        assert!((90..=100).contains(&sweeps), "{sweeps} sweeps");
        assert_eq!(server.check_newest_token(&store, LEASE), []);
    });
}

/// The clock stands still while anything can run and jumps to the earliest
/// timer when nothing can; timers fire in deadline order.
#[test]
fn the_clock_jumps_to_the_next_timer_only_when_idle() {
    let wall = Instant::now();
    test_util::block_on(async {
        let start = test_util::now();
        let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let tasks: Vec<_> = [3u64, 1, 2]
            .into_iter()
            .map(|secs| {
                let order = order.clone();
                test_util::spawn(async move {
                    let fired = test_util::sleep(Duration::from_secs(secs)).await;
                    order.borrow_mut().push((secs, fired - start));
                })
            })
            .collect();
        // Busy tasks hold the clock: yielding never moves it.
        for _ in 0..1000 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(test_util::now(), start);
        for task in tasks {
            task.await;
        }
        let secs = |s| Duration::from_secs(s);
        assert_eq!(*order.borrow(), [(1, secs(1)), (2, secs(2)), (3, secs(3))]);
        let at = test_util::Timer::at(start + secs(10)).await;
        assert_eq!(at - start, secs(10));
        assert_eq!(test_util::now() - start, secs(10));
    });
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "{:?}",
        wall.elapsed()
    );
}

/// With no timer pending, the executor waits for a wake from another thread
/// (real time), then goes on.
#[test]
fn a_wake_from_another_thread_ends_an_idle_wait() {
    test_util::block_on(async {
        let (tx, rx) = smol::channel::bounded(1);
        let task = test_util::spawn(async move { rx.recv().await.expect("a value") });
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send_blocking(7).expect("send");
        });
        assert_eq!(task.await, 7);
    });
}

/// The virtual clock only sees the tasks of its `block_on`: its timer polled
/// on another thread (a driver spawned on smol's global executor) panics
/// rather than let the clock run ahead of it.
#[test]
fn a_virtual_timer_polled_on_another_thread_panics() {
    // (In an Option: an async block that returns a future reads as a missed
    // `.await`.)
    let timer = test_util::block_on(async {
        let timer = test_util::sleep(Duration::from_secs(1));
        Some(timer)
    })
    .expect("a timer");
    let polled = std::thread::spawn(move || futures_lite::future::block_on(timer)).join();
    let panic = polled.expect_err("a panic");
    let message = (panic.downcast_ref::<&str>().copied())
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .expect("a message");
    assert!(message.contains("test_util::spawn"), "{message}");
}

/// A timer moved while pending keeps its waker: it fires at its new
/// deadline without being polled in between.
#[test]
fn a_moved_timer_fires_at_its_new_deadline() {
    test_util::block_on(async {
        let start = test_util::now();
        let mut timer = test_util::sleep(Duration::from_secs(10));
        assert!(futures_lite::future::poll_once(&mut timer).await.is_none());
        timer.set_at(start + Duration::from_secs(3));
        let fired = timer.await;
        assert_eq!(fired - start, Duration::from_secs(3));
    });
}

/// Outside `test_util::block_on` the kit runs in real time on async-io's
/// timers, under any executor, as it did before it had a clock.
#[test]
fn outside_block_on_the_kit_runs_in_real_time() {
    smol::block_on(async {
        let wall = Instant::now();
        let mut options = Options::default();
        options.retry_interval = Duration::from_millis(200);
        options.heartbeat_interval = Duration::from_millis(200);
        options.query_timeout = Duration::from_millis(500);
        options.guard_margin = Duration::from_millis(200);
        let server = TestServer::new(1);
        let (locker, driver) = server.locker(options).expect("options");
        smol::spawn(driver).detach();
        smol::spawn(async move {
            locker
                .run(LEASE, move |lease| async move {
                    lease.cancelled().await;
                    Ok::<(), std::io::Error>(())
                })
                .await
        })
        .detach();
        test_util::sleep(Duration::from_millis(300)).await;
        assert_eq!(server.holder(LEASE), Some(0));
        let real = wall.elapsed();
        assert!(real >= Duration::from_millis(300), "{real:?}");
        assert!(server.now() >= Duration::from_millis(300));
    });
}
