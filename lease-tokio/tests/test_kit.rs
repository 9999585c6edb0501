//! The test kit under its own faults: the real locker and driver over the
//! simulated server, in tokio's paused time.

use std::time::{Duration, Instant};

use lease_tokio::test_util::{JobLog, TestServer};
use lease_tokio::{Options, RunError};

const LEASE: &str = "sweeper";

type Run = tokio::task::JoinHandle<Result<(), RunError<std::io::Error>>>;

/// A replica of a job that logs its runs and returns when cancelled.
fn replica(server: &TestServer, log: &JobLog) -> (lease_tokio::Locker, Run) {
    let (locker, driver) = server.locker(Options::default()).expect("options");
    tokio::spawn(driver);
    let (run_locker, log) = (locker.clone(), log.clone());
    let run = tokio::spawn(async move {
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
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

/// A leader and a standby, the leader leading, with their runs.
async fn pair(
    seed: u64,
) -> (
    TestServer,
    JobLog,
    lease_tokio::Locker,
    lease_tokio::Locker,
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

#[tokio::test(start_paused = true)]
async fn a_partitioned_leader_stops_before_the_standby_starts() {
    let wall = Instant::now();
    let (server, log, a, b, _) = pair(1).await;
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
    let wall = wall.elapsed();
    println!(
        "FIGURE kit partition of the leader for 60 s (72 s virtual): the leader stopped at {stopped:?}, \
         the standby started at {:?}, wall time {wall:?}",
        second.started,
    );
    assert!(wall < Duration::from_secs(1), "{wall:?}");
}

#[tokio::test(start_paused = true)]
async fn a_terminated_leader_hands_over_at_once_and_tokens_increase() {
    let (server, log, a, b, _) = pair(2).await;
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
    // What each locker sent, typed.
    let sent = server.statements();
    assert!(sent.iter().any(|s| s.locker == 1
        && matches!(
            s.statement,
            lease_driver::lease_proto::Statement::TryLock { .. }
        )));
}

#[tokio::test(start_paused = true)]
async fn a_crashed_leader_frees_the_lease_and_its_run_ends() {
    let (server, log, a, b, [run_a, _]) = pair(3).await;
    server.crash(&a);
    sleep(1.0).await;
    assert_eq!(server.holder(LEASE), Some(server.index(&b)));
    assert_eq!(log.check_no_overlap(), []);
    // Its driver is gone: the run returns once its (cancelled) job has.
    let ended = run_a.await.expect("the run's task");
    assert!(matches!(ended, Err(RunError::DriverStopped)), "{ended:?}");
}

#[tokio::test(start_paused = true)]
async fn a_frozen_leader_is_ended_by_the_guard_and_its_job_runs_on() {
    let (server, log, a, b, _) = pair(4).await;
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
}

#[tokio::test(start_paused = true)]
async fn a_server_restart_ends_every_session_and_a_replica_leads_again() {
    let (server, log, _a, _b, _) = pair(5).await;
    server.restart(Duration::from_secs(5));
    sleep(2.0).await;
    assert_eq!(server.holder(LEASE), None);
    sleep(10.0).await;
    assert!(server.holder(LEASE).is_some());
    assert_eq!(log.check_no_overlap(), []);
    assert_eq!(log.runs().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_slow_network_still_elects_one_leader() {
    let server = TestServer::new(6);
    server.slow(Duration::from_millis(80));
    let log = server.job_log();
    let (_a, _) = replica(&server, &log);
    let (_b, _) = replica(&server, &log);
    sleep(5.0).await;
    assert!(server.holder(LEASE).is_some());
    assert_eq!(log.runs().len(), 1);
}

/// The same seed, the same run: statement for statement, grant for grant.
#[test]
fn a_seed_replays_the_same_run() {
    let once = || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (server, _, a, _, _) = pair(9).await;
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
/// cancelled, and no stale write accepted.
#[test]
fn under_random_partitions_and_latency_one_run_at_a_time() {
    use lease_tokio::test_util::nemesis::proptest::test_runner::{Config, TestRunner};
    use lease_tokio::test_util::nemesis::{timeline, Mix};

    let cases = std::env::var("PROPTEST_CASES").map_or(12, |n| n.parse().expect("a number"));
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
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("runtime");
            rt.block_on(async {
                let server = TestServer::new(seed);
                let log = server.job_log();
                let lockers: Vec<_> = (0..3).map(|_| replica(&server, &log).0).collect();
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
        "FIGURE kit nemesis: {cases} cases of 3 replicas under random faults in {:?}",
        wall.elapsed()
    );
}

/// The nemesis with freezes: a frozen locker's job runs on past its lease
/// (runs overlap), but a job that writes only while `is_valid()` and under
/// its token never has a stale write accepted.
#[test]
fn under_random_freezes_a_job_checking_its_lease_writes_nothing_stale() {
    use lease_tokio::test_util::nemesis::proptest::test_runner::{Config, TestRunner};
    use lease_tokio::test_util::nemesis::{timeline, Mix};

    let cases = std::env::var("PROPTEST_CASES").map_or(12, |n| n.parse().expect("a number"));
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let mix = Mix {
        terminate: 0,
        restart: 0,
        freeze: 3,
        ..Mix::default()
    };
    let faults = timeline(3, Duration::from_secs(60), Duration::from_secs(30), 8, mix);
    runner
        .run(&(0..1000u64, faults), |(seed, faults)| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("runtime");
            rt.block_on(async {
                let server = TestServer::new(seed);
                let store = server.fenced_store();
                let mut lockers = Vec::new();
                for _ in 0..3 {
                    let (locker, driver) = server.locker(Options::default()).expect("options");
                    tokio::spawn(driver);
                    let (run, store) = (locker.clone(), store.clone());
                    tokio::spawn(async move {
                        run.run(LEASE, move |lease| {
                            let store = store.clone();
                            async move {
                                let mut n = 0u64;
                                loop {
                                    tokio::select! {
                                        _ = lease.cancelled() => return Ok::<(), std::io::Error>(()),
                                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                                    }
                                    n += 1;
                                    if lease.is_valid() {
                                        let _ = store.write(lease.token(), n);
                                    }
                                }
                            }
                        })
                        .await
                    });
                    lockers.push(locker);
                }
                sleep(1.0).await;
                server.run_timeline(&lockers, &faults).await;
                sleep(40.0).await;
                let found = server.check_newest_token(&store, LEASE);
                assert!(found.is_empty(), "{faults:?}: {found:#?}");
                assert!(!store.accepted().is_empty());
            });
            Ok(())
        })
        .expect("no stale write accepted");
}

/// The watch session rides the kit too: in a ring of two holders (each holds
/// its own lease and runs the other's), the survivor of a crash takes the
/// crashed holder's lease at once, where it polled before (up to the retry
/// interval, 5 s by default).
#[tokio::test(start_paused = true)]
async fn a_holder_takes_a_crashed_holders_lease_at_once_through_its_watch_session() {
    let server = TestServer::new(8);
    let mut lockers = Vec::new();
    for (own, other) in [("left", "right"), ("right", "left")] {
        let (locker, driver) = server.locker(Options::default()).expect("options");
        tokio::spawn(driver);
        for (name, after) in [(own, 0.0), (other, 0.3)] {
            let run = locker.clone();
            tokio::spawn(async move {
                sleep(after).await;
                run.run(name, |lease| async move {
                    lease.cancelled().await;
                    Ok::<(), std::io::Error>(())
                })
                .await
            });
        }
        lockers.push(locker);
        sleep(0.1).await;
    }
    sleep(3.0).await;
    assert_eq!(server.holder("left"), Some(0));
    assert_eq!(server.holder("right"), Some(1));
    let crashed = server.now();
    server.crash(&lockers[0]);
    let mut took = None;
    for _ in 0..500 {
        sleep(0.01).await;
        if server.holder("left") == Some(1) {
            took = Some(server.now() - crashed);
            break;
        }
    }
    let took = took.expect("the survivor takes the crashed holder's lease");
    println!("FIGURE kit watch session: the crashed holder's lease taken {took:?} after the crash");
    assert!(took < Duration::from_millis(100), "{took:?}");
}

/// A crash closes the crashed locker's session at once: its close reaches
/// the server one link latency later, the waiting standby is woken there and
/// takes the lease after the lock delay (20 ms), as in the simulator; not
/// when some other timer of the kit next happens to move its time. Nothing
/// inspects the server meanwhile (an inspection moves its time too).
#[tokio::test(start_paused = true)]
async fn a_crashed_leaders_close_reaches_the_server_at_once() {
    let (server, log, a, _b, _) = pair(10).await;
    let crashed = server.now();
    server.crash(&a);
    sleep(2.0).await;
    let runs = log.runs();
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let took = runs[1].started - crashed;
    println!("FIGURE kit crash: the standby started its job {took:?} after the crash");
    assert!(took < Duration::from_millis(100), "{took:?}");
}

/// A locker without handover notifications refuses a lease group's runs: a group needs
/// them (docs/library.md, "Lease groups"); its other runs are not refused.
#[tokio::test(start_paused = true)]
async fn a_group_run_without_handover_notifications_is_refused() {
    let server = TestServer::new(1);
    let mut options = Options::default();
    options.notify_handover = false;
    let (locker, driver) = server.locker(options).expect("options");
    tokio::spawn(driver);
    let refused = (locker.group("reconcilers"))
        .run(LEASE, |_| async { Ok::<(), std::io::Error>(()) })
        .await;
    assert!(
        matches!(&refused, Err(RunError::GroupWithoutNotify(l)) if l.name() == LEASE),
        "{refused:?}"
    );
    let alone = locker
        .run(LEASE, |_| async { Ok::<(), std::io::Error>(()) })
        .await;
    assert!(alone.is_ok(), "{alone:?}");
}

/// Log lines captured from the test's thread (the paused runtime's).
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn matching(&self, level: &str, text: &str) -> Vec<String> {
        let all = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        (all.lines())
            .filter(|l| l.contains(level) && l.contains(text))
            .map(String::from)
            .collect()
    }
}

/// The review's restart with the server's clock set 30 s back, end to end
/// through the real driver: each locker logs one WARN with the step's size
/// (none before it), the next token is below the last, and the kit's fenced
/// store refuses it with a WARN naming both tokens.
#[tokio::test(start_paused = true)]
async fn a_server_clock_stepped_back_is_logged_once_per_locker_and_the_fence_says_so() {
    use tracing_subscriber::util::SubscriberInitExt;
    let lines = Lines::default();
    let writer = lines.clone();
    let _guard = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish()
        .set_default();
    let (server, _log, _a, _b, _) = pair(11).await;
    let store = server.fenced_store::<&str>();
    let last = server.tokens(LEASE).last().expect("a token").1;
    assert_eq!(store.write(last, "before the step"), Ok(()));
    sleep(5.0).await;
    let stepped = "clock stepped back";
    assert_eq!(lines.matching("WARN", stepped), Vec::<String>::new());
    server.with_postgres(|pg| pg.step_clock_back(Duration::from_secs(30)));
    server.restart(Duration::from_millis(500));
    sleep(10.0).await;
    let warned = lines.matching("WARN", stepped);
    assert_eq!(warned.len(), 2, "{warned:#?}");
    for line in &warned {
        assert!(line.contains("by at least 29."), "{line}");
        assert!(line.contains("since the previous session"), "{line}");
    }
    let next = server.tokens(LEASE).last().expect("a token").1;
    assert!(next < last, "{next} is not below {last}");
    let refused = store.write(next, "after the step").unwrap_err();
    assert_eq!((refused.token, refused.newest), (next, last));
    let fence = lines.matching("WARN", "fencing token went backwards");
    assert_eq!(fence.len(), 1, "{fence:#?}");
    assert!(fence[0].contains(&next.to_string()) && fence[0].contains(&last.to_string()));
}
