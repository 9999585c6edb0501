//! One model of the server: the same fault schedules, run through the test
//! kit (the real locker and driver over `lease_proto::sim::Postgres`, in
//! tokio's paused time) and through the deterministic simulator
//! (`lease_proto::sim::Sim`, the simulated driver over the same server
//! model), give the same leadership history.
//!
//! What is compared, per lease: the sequence of job starts, each as (the
//! process that started its job, how many of the schedule's faults had begun
//! by then). The second number pins every change of leader after the fault
//! that causes it and before the next one. Exact times are not compared:
//! the two have different networks (the kit's wire against the simulator's
//! links), different drivers around the same machine and different seeds
//! for the machines' jitter, so a takeover comes a few milliseconds apart;
//! each start must only be within [`CLOSE`] (100 ms) of the other path's,
//! which a missed wake-up (a takeover only at the next poll) breaks. Both
//! histories must also equal the one written in the schedule, so two runs
//! that both do nothing do not agree by accident. The times are printed
//! (`FIGURE`) for a reader.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_driver::lease_proto::sim::{Fault, Sim, SimConfig, TraceEvent};
use lease_tokio::test_util::TestServer;
use lease_tokio::Options;

/// One fault, said once for both.
#[derive(Debug, Clone, Copy)]
enum Step {
    Terminate(usize),
    Partition(usize, Duration),
    Crash(usize),
    Restart(Duration),
    Freeze(usize, Duration),
}

impl Step {
    fn fault(self) -> Fault {
        match self {
            Step::Terminate(process) => Fault::Terminate { process },
            Step::Partition(process, duration) => Fault::Partition { process, duration },
            Step::Crash(process) => Fault::Crash {
                process,
                restart_after: None,
            },
            Step::Restart(downtime) => Fault::ServerRestart { downtime },
            Step::Freeze(process, duration) => Fault::Freeze { process, duration },
        }
    }
}

struct Schedule {
    name: &'static str,
    lockers: usize,
    leases: &'static [&'static str],
    /// Per locker, per lease (by index): when its run of that lease starts.
    run_after: Vec<Vec<Duration>>,
    faults: Vec<(Duration, Step)>,
    end: Duration,
    /// The history both must show: per lease, (leader, faults begun by then).
    expect: &'static [(&'static str, &'static [(usize, usize)])],
}

/// How far apart in time the same start may be in the two paths: well
/// above their difference in latency (a millisecond or two per hop), well
/// below what a missed wake-up costs (a poll, up to the retry interval).
const CLOSE: Duration = Duration::from_millis(100);

/// Per lease, the job starts in order: (process, time).
type Starts = BTreeMap<String, Vec<(usize, Duration)>>;
/// Per lease, the job starts in order: (process, faults begun by then).
type History = BTreeMap<String, Vec<(usize, usize)>>;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// The same options for both: the defaults (validity 15 s, guard 16 s,
/// retry interval 5 s, the watch session on).
fn options() -> Options {
    Options::default()
}

fn history(schedule: &Schedule, starts: &Starts) -> History {
    (starts.iter())
        .map(|(lease, starts)| {
            let h = (starts.iter())
                .map(|&(p, at)| {
                    let begun = (schedule.faults.iter()).filter(|(t, _)| *t < at).count();
                    (p, begun)
                })
                .collect();
            (lease.clone(), h)
        })
        .collect()
}

/// Through the simulator: its trace's job starts.
fn through_sim(schedule: &Schedule, seed: u64) -> Starts {
    let cfg = SimConfig {
        seed,
        processes: schedule.lockers,
        leases: schedule.leases.iter().map(|s| s.to_string()).collect(),
        run_after: schedule.run_after.clone(),
        options: options(),
        // The kit's wire: 1 ms one way plus up to 0.2 ms.
        latency: Duration::from_millis(1),
        jitter: Duration::from_micros(200),
        full_trace: true,
        ..SimConfig::default()
    };
    let mut sim = Sim::new(cfg, Instant::now());
    for (at, step) in &schedule.faults {
        sim.schedule(*at, step.fault());
    }
    sim.run_until(schedule.end);
    let mut starts = Starts::new();
    for line in &sim.report().trace {
        if let (TraceEvent::JobStarted { lease, .. }, Some(p)) = (&line.event, line.process) {
            starts.entry(lease.clone()).or_default().push((p, line.at));
        }
    }
    starts
}

/// Through the kit: the real lockers, each job logging its start.
async fn through_kit(schedule: &Schedule, seed: u64) -> Starts {
    let server = TestServer::new(seed);
    let starts = Arc::new(Mutex::new(Starts::new()));
    let mut lockers = Vec::new();
    for p in 0..schedule.lockers {
        let (locker, driver) = server.locker(options()).expect("options");
        tokio::spawn(driver);
        for (l, name) in schedule.leases.iter().enumerate() {
            let after = schedule.run_after[p][l];
            let (run, server, starts) = (locker.clone(), server.clone(), starts.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                run.run(name, move |lease| {
                    let at = server.now();
                    (starts.lock().unwrap().entry(lease.name().to_string()))
                        .or_default()
                        .push((p, at));
                    async move {
                        lease.cancelled().await;
                        Ok::<(), std::io::Error>(())
                    }
                })
                .await
            });
        }
        lockers.push(locker);
    }
    for (at, step) in &schedule.faults {
        tokio::time::sleep(at.saturating_sub(server.now())).await;
        match *step {
            Step::Terminate(p) => server.terminate(&lockers[p]),
            Step::Partition(p, d) => server.partition(&lockers[p], d),
            Step::Crash(p) => server.crash(&lockers[p]),
            Step::Restart(d) => server.restart(d),
            Step::Freeze(p, d) => server.freeze(&lockers[p], d),
        }
    }
    tokio::time::sleep(schedule.end.saturating_sub(server.now())).await;
    let starts = starts.lock().unwrap().clone();
    starts
}

async fn agree(schedule: Schedule) {
    let sim = through_sim(&schedule, 7);
    let kit = through_kit(&schedule, 7).await;
    println!(
        "FIGURE kit and sim, {}: job starts (process, time) through the simulator {sim:?}, \
         through the kit {kit:?}",
        schedule.name
    );
    let expect: History = (schedule.expect.iter())
        .map(|(lease, h)| (lease.to_string(), h.to_vec()))
        .collect();
    let (sim_h, kit_h) = (history(&schedule, &sim), history(&schedule, &kit));
    assert_eq!(
        kit_h, sim_h,
        "{}: the kit and the simulator differ",
        schedule.name
    );
    assert_eq!(kit_h, expect, "{}: not the history expected", schedule.name);
    // Loosely in time too: each start within `CLOSE` of the other path's.
    for (lease, starts) in &sim {
        for (s, k) in starts.iter().zip(&kit[lease]) {
            let apart = s.1.abs_diff(k.1);
            assert!(
                apart < CLOSE,
                "{}: {lease} started {apart:?} apart: {s:?} and {k:?}",
                schedule.name
            );
        }
    }
}

/// Each schedule above gives each handover one candidate. When two
/// replicas race for a freed lease (they reconnect after a restart with
/// jittered backoffs), the winner is decided by the network's jitter and the
/// machines' own jitter, both drawn from the seed, and the kit and the
/// simulator draw them from different streams: for one seed they may pick
/// different winners. Across seeds, both paths must pick each of the racers:
/// the same set of histories. Two standbys waiting on the server when the
/// holder crashes do not race: the server grants the key to the take first
/// in its queue, the standby that stood by first, in every seed, through
/// both paths.
#[tokio::test(start_paused = true)]
async fn a_race_between_standbys_has_the_same_winners_across_seeds() {
    let races = [
        Schedule {
            name: "crash the holder, two standbys waiting: the first in the queue takes it",
            lockers: 3,
            leases: &["sweeper"],
            run_after: staggered(3, 1),
            faults: vec![(secs(3.0), Step::Crash(0))],
            end: secs(20.0),
            expect: &[],
        },
        Schedule {
            name: "restart the server, both replicas race",
            lockers: 2,
            leases: &["sweeper"],
            run_after: staggered(2, 1),
            faults: vec![(secs(3.0), Step::Restart(secs(5.0)))],
            end: secs(20.0),
            expect: &[],
        },
    ];
    let expect: [&[History]; 2] = [
        &[one("sweeper", &[(0, 0), (1, 1)])],
        &[
            one("sweeper", &[(0, 0), (0, 1)]),
            one("sweeper", &[(0, 0), (1, 1)]),
        ],
    ];
    for (race, expect) in races.iter().zip(expect) {
        let (mut sim, mut kit) = (Vec::new(), Vec::new());
        for seed in 1..=8 {
            sim.push(history(race, &through_sim(race, seed)));
            kit.push(history(race, &through_kit(race, seed).await));
        }
        println!("FIGURE kit and sim, {}: seeds 1 to 8, through the simulator {sim:?}, through the kit {kit:?}", race.name);
        for (path, found) in [("the simulator", &sim), ("the kit", &kit)] {
            for h in expect {
                assert!(
                    found.contains(h),
                    "{}: {path} never gave {h:?}: {found:?}",
                    race.name
                );
            }
            for h in found {
                assert!(expect.contains(h), "{}: {path} gave {h:?}", race.name);
            }
        }
    }
}

fn one(lease: &str, h: &[(usize, usize)]) -> History {
    BTreeMap::from([(lease.to_string(), h.to_vec())])
}

/// Locker `p` of `n` starts its runs of `leases` leases `p` × 100 ms in.
fn staggered(n: usize, leases: usize) -> Vec<Vec<Duration>> {
    (0..n).map(|p| vec![secs(0.1 * p as f64); leases]).collect()
}

#[tokio::test(start_paused = true)]
async fn terminating_the_holder_hands_the_lease_to_the_standby_and_back() {
    agree(Schedule {
        name: "terminate the holder, then the new holder",
        lockers: 2,
        leases: &["sweeper"],
        run_after: staggered(2, 1),
        faults: vec![
            (secs(3.0), Step::Terminate(0)),
            (secs(10.0), Step::Terminate(1)),
        ],
        end: secs(20.0),
        expect: &[("sweeper", &[(0, 0), (1, 1), (0, 2)])],
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn partitioning_the_holder_past_the_guard_hands_the_lease_over_once() {
    agree(Schedule {
        name: "partition the holder for 30 s (the guard is 16 s)",
        lockers: 2,
        leases: &["sweeper"],
        run_after: staggered(2, 1),
        faults: vec![(secs(3.0), Step::Partition(0, secs(30.0)))],
        end: secs(60.0),
        expect: &[("sweeper", &[(0, 0), (1, 1)])],
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn crashing_holders_hands_the_lease_down_the_line() {
    agree(Schedule {
        name: "crash the holder, then the next (the third asks at 5 s)",
        lockers: 3,
        leases: &["sweeper"],
        run_after: vec![vec![secs(0.0)], vec![secs(0.1)], vec![secs(5.0)]],
        faults: vec![(secs(3.0), Step::Crash(0)), (secs(10.0), Step::Crash(1))],
        end: secs(20.0),
        expect: &[("sweeper", &[(0, 0), (1, 1), (2, 2)])],
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_server_restart_ends_the_lease_and_a_replica_leads_again() {
    agree(Schedule {
        name: "restart the server (5 s down), then terminate the holder (the second asks at 10 s)",
        lockers: 2,
        leases: &["sweeper"],
        run_after: vec![vec![secs(0.0)], vec![secs(10.0)]],
        faults: vec![
            (secs(3.0), Step::Restart(secs(5.0))),
            (secs(15.0), Step::Terminate(0)),
        ],
        end: secs(30.0),
        expect: &[("sweeper", &[(0, 0), (0, 1), (1, 2)])],
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn freezing_the_holder_past_the_guard_hands_the_lease_over_once() {
    agree(Schedule {
        name: "freeze the holder for 30 s",
        lockers: 2,
        leases: &["sweeper"],
        run_after: staggered(2, 1),
        faults: vec![(secs(3.0), Step::Freeze(0, secs(30.0)))],
        end: secs(60.0),
        expect: &[("sweeper", &[(0, 0), (1, 1)])],
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn two_leases_in_a_ring_survive_a_crash_and_a_partition() {
    // Each of two lockers holds a lease of its own and wants the other's
    // (asked 300 ms later); a third wants both, later still.
    let at = |own: f64, other: f64| vec![secs(own), secs(other)];
    agree(Schedule {
        name: "two leases: crash the left holder, partition the right one",
        lockers: 3,
        leases: &["left", "right"],
        run_after: vec![at(0.0, 0.3), at(0.3, 0.0), at(0.6, 0.6)],
        faults: vec![
            (secs(3.0), Step::Crash(0)),
            (secs(10.0), Step::Partition(1, secs(30.0))),
        ],
        end: secs(60.0),
        expect: &[
            ("left", &[(0, 0), (1, 1), (2, 2)]),
            ("right", &[(1, 0), (2, 2)]),
        ],
    })
    .await;
}
