//! Simulates a minute of three replicas with a frozen leader, and prints how
//! long it took: `cargo run --release -p lease-proto --features sim --example sim_minute`.

use std::time::{Duration, Instant};

use lease_proto::sim::{Fault, Sim, SimConfig};

fn main() {
    let started = Instant::now();
    let mut sim = Sim::new(
        SimConfig {
            processes: 3,
            ..SimConfig::default()
        },
        Instant::now(),
    );
    sim.schedule(
        Duration::from_secs(1),
        Fault::Freeze {
            process: 0,
            duration: Duration::from_secs(5),
        },
    );
    let report = sim.finish(Duration::from_secs(60), Duration::from_secs(3));
    assert!(report.violations.is_empty(), "{}", report.trace_text());
    println!(
        "63 s of virtual time in {:.1} ms; acquisitions {:?}, statements per process {:?}",
        started.elapsed().as_secs_f64() * 1e3,
        report.acquisitions,
        report.statements
    );
}
