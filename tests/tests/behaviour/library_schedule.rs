//! `Locker::schedule` (lease-driver's `schedule` feature): two replicas of a
//! schedule, in the test kit's virtual time and against the local server;
//! each due time runs at most once across them, and the survivor of a
//! stopped leader goes on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lease_tokio::{LeaseState, Locker, Options, Schedule};

use crate::common::{init, opts, DB};

/// Every run: (due as Unix seconds, replica), in start order.
type Runs = Arc<Mutex<Vec<(u64, usize)>>>;

/// The schedule of replica `i`: `every 1s`, a job that records its due time
/// and works 100 ms (or until stopped).
fn schedule(
    locker: &Locker,
    name: &str,
    i: usize,
    runs: &Runs,
) -> tokio::task::JoinHandle<Result<(), lease_tokio::RunError<std::convert::Infallible>>> {
    let (locker, name, runs) = (locker.clone(), name.to_owned(), runs.clone());
    tokio::spawn(async move {
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        locker
            .schedule(&name, every, move |run| {
                let runs = runs.clone();
                async move {
                    let due = run.due().duration_since(UNIX_EPOCH).unwrap().as_secs();
                    assert_eq!(run.id(), format!("{}@{due}", run.lease().name()));
                    assert!(run.lease().is_valid());
                    runs.lock().unwrap().push((due, i));
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = run.stopped() => {}
                    }
                    Ok::<(), String>(())
                }
            })
            .await
    })
}

fn leader(lockers: &[Locker]) -> Option<usize> {
    lockers.iter().position(|l| {
        (l.status().leases.iter()).any(|s| matches!(s.state, LeaseState::Leading { .. }))
    })
}

/// Each due time ran once at most; the due times missing between the first
/// and the last run, and which replica ran each.
fn check(runs: &[(u64, usize)]) -> (Vec<u64>, BTreeMap<u64, usize>) {
    let mut by_due = BTreeMap::new();
    for &(due, i) in runs {
        if let Some(other) = by_due.insert(due, i) {
            panic!("due {due} ran twice: on {other} and {i} ({runs:?})");
        }
    }
    let (first, last) = (
        *by_due.keys().next().unwrap(),
        *by_due.keys().last().unwrap(),
    );
    let missing = (first..=last).filter(|d| !by_due.contains_key(d)).collect();
    (missing, by_due)
}

/// In virtual time: the leader's process crashes (driver, session and job
/// gone) after 6 s; the standby runs the rest.
#[tokio::test(start_paused = true)]
async fn a_schedule_survives_its_leader_crashing_in_virtual_time() {
    use lease_tokio::test_util::{TestServer, SIM_EPOCH};
    let server = TestServer::new(11);
    let runs = Runs::default();
    let mut lockers = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..2 {
        let (locker, driver) = server.locker(Options::default()).unwrap();
        tokio::spawn(driver);
        tasks.push(schedule(&locker, "report", i, &runs));
        lockers.push(locker);
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let old = leader(&lockers).expect("a leader");
    let before = runs.lock().unwrap().len();
    server.crash(&lockers[old]);
    tasks[old].abort();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let runs = runs.lock().unwrap().clone();
    let (missing, by_due) = check(&runs);
    eprintln!("FIGURE kit schedule: runs {runs:?}, missing {missing:?}");
    let first = *by_due.keys().next().unwrap();
    // Due at every whole second of the server's clock from the first grant on.
    assert!(first <= SIM_EPOCH.as_secs() + 2, "first due {first}");
    assert!(before >= 4, "{before} runs before the crash: {runs:?}");
    let after = by_due.values().filter(|&&i| i != old).count();
    assert!(after >= 6, "the standby ran {after}: {runs:?}");
    assert!(missing.len() <= 1, "missed {missing:?}: {runs:?}");
}

/// In virtual time: one locker leading 20 schedules reads the server's clock
/// for all of them at once (a read is a connection of its own): 30 s cost
/// about 4 reads, not 4 per schedule.
#[tokio::test(start_paused = true)]
async fn a_lockers_schedules_share_one_clock_read() {
    use lease_tokio::test_util::TestServer;
    let server = TestServer::new(12);
    let runs = Runs::default();
    let (locker, driver) = server.locker(Options::default()).unwrap();
    tokio::spawn(driver);
    let tasks: Vec<_> = (0..20)
        .map(|i| schedule(&locker, &format!("report-{i}"), 0, &runs))
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let connections = server.connections();
    let started = runs.lock().unwrap().len();
    eprintln!(
        "FIGURE kit schedules: 20 schedules, 30 s: {connections} connections, {started} runs"
    );
    // Each schedule ran at about every second of the 30.
    assert!(started >= 20 * 27, "{started} runs");
    // The lease session, and a clock read every 10 s (the first at once).
    assert!(connections <= 1 + 5, "{connections} connections");
    tasks.iter().for_each(tokio::task::JoinHandle::abort);
}

/// In virtual time: two lockers share 8 schedules in one lease group: each
/// leads some of them, and no due time of any schedule runs twice.
#[tokio::test(start_paused = true)]
async fn a_group_spreads_its_schedules_and_runs_each_due_time_once() {
    use lease_tokio::test_util::TestServer;
    let server = TestServer::new(13);
    let runs: Arc<Mutex<Vec<(String, u64, usize)>>> = Arc::default();
    let mut tasks = Vec::new();
    let mut lockers = Vec::new();
    for i in 0..2 {
        let (locker, driver) = server.locker(Options::default()).unwrap();
        tokio::spawn(driver);
        for s in 0..8 {
            let (group, runs) = (locker.group("reports"), runs.clone());
            let every = Schedule::every(Duration::from_secs(1)).unwrap();
            tasks.push(tokio::spawn(async move {
                let name = format!("report-{s}");
                group
                    .schedule(&name, every, move |run| {
                        let runs = runs.clone();
                        async move {
                            let due = run.due().duration_since(UNIX_EPOCH).unwrap().as_secs();
                            runs.lock()
                                .unwrap()
                                .push((run.lease().name().to_owned(), due, i));
                            Ok::<(), String>(())
                        }
                    })
                    .await
            }));
        }
        lockers.push(locker);
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    let runs = runs.lock().unwrap().clone();
    let mut seen = BTreeMap::new();
    for (name, due, i) in &runs {
        if let Some(other) = seen.insert((name.clone(), *due), *i) {
            panic!("{name} due {due} ran on {other} and {i}");
        }
    }
    let by = |i| runs.iter().filter(|r| r.2 == i).count();
    eprintln!(
        "FIGURE kit group schedules: {} runs, {} and {}",
        runs.len(),
        by(0),
        by(1)
    );
    assert!(
        by(0) > 0 && by(1) > 0,
        "both members lead some: {} / {}",
        by(0),
        by(1)
    );
    assert!(runs.len() >= 8 * 15, "{} runs", runs.len());
    tasks.iter().for_each(tokio::task::JoinHandle::abort);
}

/// Against the local server: two lockers schedule `every 1s` for about 5 s;
/// the leader is closed midway (its job stopped, the key released) and the
/// other goes on. Each due time runs at most once, and the due times between
/// the first and the last run all ran but for the takeover's window.
#[test]
fn two_lockers_share_a_schedule_and_the_survivor_goes_on() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        init();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("lib-schedule-{}-{nanos}", std::process::id());
        let runs = Runs::default();
        let mut lockers = Vec::new();
        let mut tasks = Vec::new();
        for i in 0..2 {
            let locker =
                lease_tokio::Locker::spawn(DB.parse().unwrap(), tokio_postgres::NoTls, opts())
                    .unwrap();
            tasks.push(schedule(&locker, &name, i, &runs));
            lockers.push(locker);
        }
        tokio::time::sleep(Duration::from_millis(2600)).await;
        let old = leader(&lockers).expect("a leader");
        let closed = Instant::now();
        lockers[old].close().await;
        eprintln!(
            "FIGURE library schedule: leader closed in {:?}",
            closed.elapsed()
        );
        assert_eq!(tasks.remove(old).await.unwrap(), Ok(()));
        tokio::time::sleep(Duration::from_millis(2600)).await;
        let survivor = lockers.remove(1 - old);
        survivor.close().await;
        assert_eq!(tasks.remove(0).await.unwrap(), Ok(()));
        let runs = runs.lock().unwrap().clone();
        let (missing, by_due) = check(&runs);
        eprintln!("FIGURE library schedule: runs {runs:?}, missing {missing:?}");
        let before = by_due.values().filter(|&&i| i == old).count();
        let after = by_due.len() - before;
        assert!(before >= 1, "the first leader ran none: {runs:?}");
        assert!(after >= 2, "the survivor ran {after}: {runs:?}");
        assert!(missing.len() <= 1, "missed {missing:?}: {runs:?}");
    });
}

/// In virtual time, `Overlap::Replace`: a job that never ends by itself is
/// stopped (`Stopped::Replaced`) by the next due time, which then starts; and
/// the default `Overlap::Skip` skips due times while a run still goes.
#[tokio::test(start_paused = true)]
async fn overlapping_due_times_replace_or_skip_the_running_job() {
    use lease_tokio::schedule::{Overlap, Stopped};
    use lease_tokio::test_util::TestServer;
    let server = TestServer::new(5);
    let (locker, driver) = server.locker(Options::default()).unwrap();
    tokio::spawn(driver);
    let replaced = Arc::new(Mutex::new(Vec::new()));
    let skipped = Runs::default();
    {
        let (locker, replaced) = (locker.clone(), replaced.clone());
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        tokio::spawn(async move {
            locker
                .schedule("replace", every.overlap(Overlap::Replace), move |run| {
                    let replaced = replaced.clone();
                    async move {
                        let why = run.stopped().await;
                        let due = run.due().duration_since(UNIX_EPOCH).unwrap().as_secs();
                        replaced.lock().unwrap().push((due, why));
                        Ok::<(), String>(())
                    }
                })
                .await
        });
    }
    {
        let (locker, skipped) = (locker.clone(), skipped.clone());
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        tokio::spawn(async move {
            locker
                .schedule("skip", every, move |run| {
                    let skipped = skipped.clone();
                    async move {
                        let due = run.due().duration_since(UNIX_EPOCH).unwrap().as_secs();
                        skipped.lock().unwrap().push((due, 0));
                        tokio::time::sleep(Duration::from_millis(2500)).await;
                        Ok::<(), String>(())
                    }
                })
                .await
        });
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let replaced = replaced.lock().unwrap().clone();
    eprintln!("FIGURE kit schedule replace: {replaced:?}");
    assert!(replaced.len() >= 6, "{replaced:?}");
    assert!(replaced.iter().all(|(_, why)| *why == Stopped::Replaced));
    assert!(
        replaced.windows(2).all(|w| w[1].0 == w[0].0 + 1),
        "{replaced:?}"
    );
    let skipped: Vec<u64> = skipped.lock().unwrap().iter().map(|r| r.0).collect();
    eprintln!("FIGURE kit schedule skip: {skipped:?}");
    // A run of 2.5 s: the next two due times are skipped, the third runs.
    assert!(skipped.len() >= 2, "{skipped:?}");
    assert!(skipped.windows(2).all(|w| w[1] == w[0] + 3), "{skipped:?}");
}

/// lease-smol against the local server: the schedule's due times are the
/// server's whole seconds (this host's clock is the server's here, so each
/// run starts within a few hundred milliseconds of its due time).
#[test]
fn a_smol_locker_runs_a_schedule_on_the_servers_clock() {
    smol::block_on(async {
        init();
        let (locker, driver) = lease_smol::Locker::without_tls(DB, opts()).unwrap();
        smol::spawn(driver).detach();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("lib-schedule-smol-{}-{nanos}", std::process::id());
        let lateness = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (locker, lateness) = (locker.clone(), lateness.clone());
            let every = lease_smol::Schedule::every(Duration::from_secs(1)).unwrap();
            smol::spawn(async move {
                locker
                    .schedule(&name, every, move |run| {
                        let late = SystemTime::now().duration_since(run.due());
                        lateness
                            .lock()
                            .unwrap()
                            .push(late.map_err(|e| e.duration()));
                        async { Ok::<(), String>(()) }
                    })
                    .await
            })
        };
        smol::Timer::after(Duration::from_millis(3500)).await;
        locker.close().await;
        assert_eq!(task.await, Ok(()));
        let lateness = lateness.lock().unwrap().clone();
        eprintln!("FIGURE smol schedule: start - due {lateness:?}");
        assert!(lateness.len() >= 2, "{lateness:?}");
        for late in lateness {
            match late {
                Ok(late) => assert!(late < Duration::from_millis(300), "started {late:?} late"),
                // The clock bound: a reading within ±50 ms.
                Err(early) => assert!(early <= Duration::from_millis(50), "{early:?} early"),
            }
        }
    });
}
