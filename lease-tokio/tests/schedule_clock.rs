//! A schedule when the server's clock cannot be read for a while (feature
//! `schedule`; in the test kit, virtual time).
#![cfg(feature = "schedule")]

use std::time::Duration;

use lease_tokio::test_util::TestServer;
use lease_tokio::{LeaseState, Locker, Options, Schedule};

fn leading(locker: &Locker) -> bool {
    (locker.status().leases.iter()).any(|l| matches!(l.state, LeaseState::Leading { .. }))
}

fn releasing(locker: &Locker) -> bool {
    (locker.status().leases.iter()).any(|l| matches!(l.state, LeaseState::Releasing))
}

/// A schedule whose leader cannot read the server's clock for 30 s (the
/// server refuses new connections, as at `max_connections`; the lease
/// session goes on) gives its lease up: its lead returns an error, the key is
/// released, and it would contend again after a pause. The shutdown signal
/// fires while that lease is being released: `schedule_until` returns `Ok`
/// at once. (It used to poll the signal again after the run had polled it to
/// its end: an `async` block panics then.)
#[tokio::test(start_paused = true)]
async fn a_schedule_shut_down_while_giving_up_its_lease_does_not_panic() {
    let server = TestServer::new(21);
    let (locker, driver) = server.locker(Options::default()).expect("options");
    tokio::spawn(driver);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = rx.await;
    };
    let l = locker.clone();
    let schedule = tokio::spawn(async move {
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        l.schedule_until("s", every, shutdown, |_occurrence| async {
            Ok::<(), String>(())
        })
        .await
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(leading(&locker), "{:?}", locker.status());
    server.refuse_connections(Duration::from_secs(120));
    // Given up after 30 s without a usable reading: fire while the key is
    // released.
    let mut tx = Some(tx);
    for _ in 0..60_000 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if releasing(&locker) {
            if let Some(tx) = tx.take() {
                let _ = tx.send(());
            }
            break;
        }
    }
    assert!(
        tx.is_none(),
        "the lease was given up: {:?}",
        locker.status()
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), schedule).await;
    match ended {
        Ok(Ok(Ok(()))) => {}
        Ok(Err(e)) if e.is_panic() => {
            let p = e.into_panic();
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            panic!("schedule_until panicked: {msg}");
        }
        other => panic!("schedule_until: {other:?}"),
    }
}

/// A schedule's leader loses its link for 2 minutes (a clock read fails
/// meanwhile; the lease is lost). Once the link heals, the locker wins the
/// lease again and the schedule must run again: the server's clock is
/// readable again.
#[tokio::test(start_paused = true)]
async fn a_schedule_runs_again_after_an_outage_longer_than_30_s() {
    const PART_AT: f64 = 9.5;
    use std::sync::{Arc, Mutex};
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let server = TestServer::new(22);
    // Heartbeats every 3 s, statements (and clock reads) time out after 2 s:
    // a clock read due during the outage fails before the lease is lost.
    let mut options = Options::default();
    options.heartbeat_interval = Duration::from_secs(3);
    options.query_timeout = Duration::from_secs(2);
    let (locker, driver) = server.locker(options).expect("options");
    tokio::spawn(driver);
    let runs: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let (l, r, s) = (locker.clone(), runs.clone(), server.clone());
    let schedule = tokio::spawn(async move {
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        l.schedule("s", every, move |_occurrence| {
            r.lock().unwrap().push(s.now());
            async { Ok::<(), String>(()) }
        })
        .await
    });
    tokio::time::sleep(Duration::from_secs_f64(PART_AT)).await;
    let before = runs.lock().unwrap().len();
    assert!(before > 0, "the schedule runs");
    server.partition(&locker, Duration::from_secs(120));
    let healed = server.now() + Duration::from_secs(120);
    tokio::time::sleep(Duration::from_secs(120 + 300)).await;
    let after: Vec<Duration> = (runs.lock().unwrap().iter())
        .filter(|t| **t > healed)
        .copied()
        .collect();
    let status = locker.status();
    schedule.abort();
    assert!(
        !after.is_empty(),
        "no run in the 300 s after the link healed at {healed:?} ({before} runs before); \
         the locker's status now: {status:?}"
    );
}

/// Two lockers run one schedule. The leader, L, cannot read the server's clock
/// for 30 s (new connections refused; its lease session goes on) and gives
/// the lease up; B takes it over and runs the due times once the server
/// accepts connections again. Then B crashes and L takes the schedule back:
/// it must not run again what B ran (its planner resigned when it gave the
/// lease up, so its new lead leaves the due times before its grant to B).
#[tokio::test(start_paused = true)]
async fn a_leader_that_gave_up_for_the_clock_does_not_rerun_what_the_next_one_ran() {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::SystemTime;
    let server = TestServer::new(23);
    let runs: Arc<Mutex<Vec<(SystemTime, usize)>>> = Arc::default();
    let mut lockers = Vec::new();
    for who in 0..2 {
        let (locker, driver) = server.locker(Options::default()).expect("options");
        tokio::spawn(driver);
        let (l, r) = (locker.clone(), runs.clone());
        tokio::spawn(async move {
            let every = Schedule::every(Duration::from_secs(1)).unwrap();
            l.schedule("s", every, move |occurrence| {
                r.lock().unwrap().push((occurrence.due(), who));
                async { Ok::<(), String>(()) }
            })
            .await
        });
        lockers.push(locker);
        // L (0) leads before B (1) starts.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    assert!(leading(&lockers[0]), "{:?}", lockers[0].status());
    server.refuse_connections(Duration::from_secs(40));
    // B runs a due time at x.0; it crashes at x.3, and L (contending again
    // after its pause) takes over at once.
    tokio::time::sleep(Duration::from_millis(80_300)).await;
    assert!(
        leading(&lockers[1]),
        "B took over: {:?}",
        lockers[1].status()
    );
    assert!(
        runs.lock().unwrap().iter().any(|(_, who)| *who == 1),
        "B ran the schedule"
    );
    server.crash(&lockers[1]);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        leading(&lockers[0]),
        "L led again: {:?}",
        lockers[0].status()
    );
    let mut by_due: BTreeMap<SystemTime, Vec<usize>> = BTreeMap::new();
    for (due, who) in runs.lock().unwrap().iter() {
        by_due.entry(*due).or_default().push(*who);
    }
    let twice: Vec<_> = by_due.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "due times run twice (0 = L, 1 = B): {twice:?}"
    );
    assert!(
        by_due
            .iter()
            .next_back()
            .is_some_and(|(_, w)| w == &vec![0]),
        "L runs the schedule again"
    );
}
