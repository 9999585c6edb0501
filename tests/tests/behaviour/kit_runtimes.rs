//! The test kit on both runtimes: the same fault schedules, from the same
//! seed, through lease-tokio's kit (tokio's paused clock) and lease-smol's
//! (its own virtual clock, `test_util::block_on`) give the same grants, to
//! the same lockers in the same order, and the same job runs, at nearly the
//! same times (tokio's timers round up to the millisecond; the smol kit's
//! clock is exact; a fencing token is the server's clock in microseconds,
//! so tokens are as close). No server needed.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use lease_driver::test_util::nemesis::Disruption;
use lease_driver::test_util::{TestAdapter, TestServer};
use lease_tokio::Options;

const LEASE: &str = "sweeper";

/// How far apart the two kits may put one event: tokio's millisecond
/// rounding, once per timer on the way.
const CLOSE: Duration = Duration::from_millis(50);

type Boxed = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a scenario leaves: every grant (locker, token, when), every run
/// (token, started, stopped).
#[derive(Debug)]
struct Outcome {
    grants: Vec<(usize, i64, Duration)>,
    runs: Vec<(i64, Duration, Option<Duration>)>,
}

/// Two replicas of a job that returns when cancelled, the first leading;
/// `faults` from 2 s on; 80 s in all.
async fn scenario<A: TestAdapter>(
    seed: u64,
    faults: &[(Duration, Disruption)],
    spawn: impl Fn(Boxed),
    sleep: impl Fn(Duration) -> Boxed,
) -> Outcome {
    let server = TestServer::<A>::new(seed);
    let log = server.job_log();
    let mut lockers = Vec::new();
    for _ in 0..2 {
        let (locker, driver) = server.locker(Options::default()).expect("options");
        spawn(Box::pin(driver));
        let (run, log) = (locker.clone(), log.clone());
        spawn(Box::pin(async move {
            let _ = run
                .run(LEASE, move |lease| {
                    let log = log.clone();
                    async move {
                        let _running = log.start(&lease);
                        lease.cancelled().await;
                        Ok::<(), std::io::Error>(())
                    }
                })
                .await;
        }));
        lockers.push(locker);
        sleep(Duration::from_millis(100)).await;
    }
    sleep(Duration::from_millis(1900)).await;
    server.run_timeline(&lockers, faults).await;
    sleep(Duration::from_secs(80).saturating_sub(server.now())).await;
    Outcome {
        grants: (server.grants().into_iter())
            .map(|g| (g.locker, g.token, g.at))
            .collect(),
        runs: (log.runs().into_iter())
            .map(|r| (r.token, r.started, r.stopped))
            .collect(),
    }
}

fn through_tokio(seed: u64, faults: &[(Duration, Disruption)]) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(scenario::<lease_tokio::TokioAdapter>(
        seed,
        faults,
        |f| drop(tokio::spawn(f)),
        |d| Box::pin(tokio::time::sleep(d)),
    ))
}

fn through_smol(seed: u64, faults: &[(Duration, Disruption)]) -> Outcome {
    use lease_smol::test_util;
    test_util::block_on(scenario::<lease_smol::SmolAdapter>(
        seed,
        faults,
        |f| test_util::spawn(f).detach(),
        |d| {
            Box::pin(async move {
                test_util::sleep(d).await;
            })
        },
    ))
}

fn close(a: Duration, b: Duration) -> bool {
    a.abs_diff(b) < CLOSE
}

/// Tokens of the server's clock (microseconds) at most [`CLOSE`] apart.
fn close_token(a: i64, b: i64) -> bool {
    a.abs_diff(b) < CLOSE.as_micros() as u64
}

fn close_opt(a: Option<Duration>, b: Option<Duration>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => close(a, b),
        (a, b) => a.is_none() && b.is_none(),
    }
}

#[test]
fn both_kits_give_the_same_grants_and_runs() {
    let s = Duration::from_secs;
    let schedules: [(&str, Vec<(Duration, Disruption)>); 5] = [
        (
            "partition 60 s",
            vec![(s(0), Disruption::Partition(0, s(60)))],
        ),
        (
            "terminate, then partition the new leader",
            vec![
                (s(0), Disruption::Terminate(0)),
                (s(8), Disruption::Partition(1, s(30))),
            ],
        ),
        ("freeze 30 s", vec![(s(0), Disruption::Freeze(0, s(30)))]),
        (
            "slow, then terminate",
            vec![
                (s(0), Disruption::Slow(Duration::from_millis(80))),
                (s(5), Disruption::Terminate(0)),
            ],
        ),
        (
            "partition both, one after the other",
            vec![
                (s(0), Disruption::Partition(0, s(40))),
                (s(25), Disruption::Partition(1, s(20))),
            ],
        ),
    ];
    for (name, faults) in &schedules {
        for seed in 1..=3 {
            let wall = Instant::now();
            let tokio = through_tokio(seed, faults);
            let tokio_wall = wall.elapsed();
            let wall = Instant::now();
            let smol = through_smol(seed, faults);
            let smol_wall = wall.elapsed();
            let who = |o: &Outcome| -> Vec<usize> { o.grants.iter().map(|g| g.0).collect() };
            assert!(who(&tokio).len() >= 2, "{name}, seed {seed}: {tokio:#?}");
            assert_eq!(
                who(&tokio),
                who(&smol),
                "{name}, seed {seed}: tokio {tokio:#?} smol {smol:#?}"
            );
            let grants_close = (tokio.grants.iter().zip(&smol.grants))
                .all(|(t, s)| close_token(t.1, s.1) && close(t.2, s.2));
            let runs_close = tokio.runs.len() == smol.runs.len()
                && (tokio.runs.iter().zip(&smol.runs))
                    .all(|(t, s)| close_token(t.0, s.0) && close(t.1, s.1) && close_opt(t.2, s.2));
            assert!(
                grants_close && runs_close,
                "{name}, seed {seed}: tokio {tokio:#?} smol {smol:#?}"
            );
            if seed == 1 {
                println!(
                    "FIGURE kits on both runtimes, {name}: {} grants, the same; 80 s virtual in \
                     {tokio_wall:?} wall (tokio), {smol_wall:?} (smol)",
                    smol.grants.len()
                );
            }
        }
    }
}
