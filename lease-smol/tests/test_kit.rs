//! The test kit on smol: real time (async-io has no virtual clock), so short
//! options and short faults.

use std::time::{Duration, Instant};

use lease_smol::test_util::TestServer;
use lease_smol::Options;

const LEASE: &str = "sweeper";

fn short() -> Options {
    let mut options = Options::default();
    options.retry_interval = Duration::from_millis(200);
    options.heartbeat_interval = Duration::from_millis(200);
    options.query_timeout = Duration::from_millis(500);
    options.guard_margin = Duration::from_millis(200);
    options
}

#[test]
fn a_partitioned_leader_stops_before_the_standby_starts_in_real_time() {
    smol::block_on(async {
        let wall = Instant::now();
        let server = TestServer::new(1);
        let log = server.job_log();
        let mut lockers = Vec::new();
        for _ in 0..2 {
            let (locker, driver) = server.locker(short()).expect("options");
            smol::spawn(driver).detach();
            let (log, run) = (log.clone(), locker.clone());
            smol::spawn(async move {
                run.run(LEASE, move |lease| {
                    let log = log.clone();
                    async move {
                        let _running = log.start(&lease);
                        lease.cancelled().await;
                        Ok::<(), std::io::Error>(())
                    }
                })
                .await
            })
            .detach();
            lockers.push(locker);
            smol::Timer::after(Duration::from_millis(100)).await;
        }
        smol::Timer::after(Duration::from_millis(500)).await;
        let leader = server.holder(LEASE).expect("a leader");
        server.partition(&lockers[leader], Duration::from_secs(4));
        smol::Timer::after(Duration::from_secs(3)).await;
        assert_eq!(server.holder(LEASE), Some(1 - leader));
        let runs = log.runs();
        assert_eq!(runs.len(), 2, "{runs:#?}");
        assert!(
            runs[0].stopped.expect("stopped") < runs[1].started,
            "{runs:#?}"
        );
        assert_eq!(log.check_no_overlap(), []);
        println!(
            "FIGURE smol kit: a 4 s partition, the standby leads after {:?} (real time {:?})",
            runs[1].started,
            wall.elapsed()
        );
    });
}
