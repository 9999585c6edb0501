//! A user's test of a sweeper job under failover, with the test kit: the
//! correct sweeper passes every check; a sweeper that ignores its
//! cancellation, or writes without its fencing token, is caught.
//!
//! The guide: docs/testing.md ("Testing your job under failover").

use std::time::Duration;

use lease_tokio::test_util::{Breach, FencedStore, JobLog, TestServer};
use lease_tokio::{Lease, Options};

const LEASE: &str = "sweeper";
const EVERY: Duration = Duration::from_millis(100);

/// How the sweeper under test behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Sweeper {
    /// Sweeps while its lease is valid, with its token; returns when cancelled.
    Correct,
    /// Never looks at `cancelled()` nor `is_valid()`: sweeps on, with its token.
    IgnoresCancellation,
    /// Returns when cancelled, but writes without its token.
    Unfenced,
}

/// The job: one sweep every 100 ms, each a write to the store.
async fn sweep(kind: Sweeper, lease: Lease, store: FencedStore<u64>, log: JobLog) {
    let _running = log.start(&lease);
    let mut swept = 0;
    loop {
        let tick = tokio::time::sleep(EVERY);
        if kind == Sweeper::IgnoresCancellation {
            tick.await;
        } else {
            tokio::select! {
                _ = lease.cancelled() => return,
                _ = tick => {}
            }
        }
        swept += 1;
        match kind {
            Sweeper::Correct if lease.is_valid() => {
                let _ = store.write(lease.token(), swept);
            }
            Sweeper::Correct => {}
            Sweeper::IgnoresCancellation => {
                let _ = store.write(lease.token(), swept);
            }
            Sweeper::Unfenced => store.write_unfenced(swept),
        }
    }
}

/// Two replicas of the sweeper on one server.
fn replicas(
    server: &TestServer,
    kind: Sweeper,
) -> (Vec<lease_tokio::Locker>, FencedStore<u64>, JobLog) {
    let (store, log) = (server.fenced_store(), server.job_log());
    let mut lockers = Vec::new();
    for _ in 0..2 {
        let (locker, driver) = server.locker(Options::default()).expect("options");
        tokio::spawn(driver);
        let (store, log, run) = (store.clone(), log.clone(), locker.clone());
        tokio::spawn(async move {
            run.run(LEASE, move |lease| {
                let (store, log) = (store.clone(), log.clone());
                async move {
                    sweep(kind, lease, store, log).await;
                    Ok::<(), std::io::Error>(())
                }
            })
            .await
        });
        lockers.push(locker);
    }
    (lockers, store, log)
}

/// The leader is partitioned for 60 s, then the new leader's session is
/// terminated: the first one must stop, hand over, and resume. Returns
/// every check's findings, and whether the job resumed (a third run, under
/// the newest token, wrote).
async fn partition_then_terminate(kind: Sweeper) -> (Vec<Breach>, bool) {
    let server = TestServer::new(11);
    let (lockers, store, log) = replicas(&server, kind);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = server.holder(LEASE).expect("a leader");
    let (a, b) = (&lockers[leader], &lockers[1 - leader]);
    server.partition(a, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(70)).await;
    server.terminate(b);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let newest = server.tokens(LEASE).last().expect("grants").1;
    let resumed = log.runs().len() >= 3 && store.accepted().iter().any(|w| w.token == Some(newest));
    let mut found = log.check_no_overlap();
    found.extend(log.check_stopped_within(Duration::from_millis(200)));
    found.extend(server.check_newest_token(&store, LEASE));
    (found, resumed)
}

/// The leader's process is frozen for 30 s (its job is not: the pause no
/// client beats). Returns what the fencing check finds.
async fn freeze(kind: Sweeper) -> Vec<Breach> {
    let server = TestServer::new(12);
    let (lockers, store, _log) = replicas(&server, kind);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = server.holder(LEASE).expect("a leader");
    server.freeze(&lockers[leader], Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(server.holder(LEASE), Some(1 - leader));
    server.check_newest_token(&store, LEASE)
}

#[tokio::test(start_paused = true)]
async fn the_correct_sweeper_stops_on_partition_and_resumes() {
    let (found, resumed) = partition_then_terminate(Sweeper::Correct).await;
    assert!(found.is_empty(), "{found:#?}");
    assert!(resumed);
}

#[tokio::test(start_paused = true)]
async fn the_correct_sweeper_writes_nothing_stale_across_a_freeze() {
    let found = freeze(Sweeper::Correct).await;
    assert!(found.is_empty(), "{found:#?}");
}

#[tokio::test(start_paused = true)]
async fn a_sweeper_that_ignores_cancellation_is_caught() {
    let (found, _) = partition_then_terminate(Sweeper::IgnoresCancellation).await;
    println!("caught: {found:#?}");
    assert!(found.iter().any(|v| matches!(v, Breach::Overlap { .. })));
    assert!(found.iter().any(|v| matches!(v, Breach::SlowStop { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_sweeper_that_writes_without_its_token_is_caught() {
    let found = freeze(Sweeper::Unfenced).await;
    println!(
        "caught {} writes without a token, the last: {:?}",
        found.len(),
        found.last()
    );
    assert!(found
        .iter()
        .any(|v| matches!(v, Breach::StaleWrite { token: None, .. })));
}
