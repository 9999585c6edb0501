//! Fuzz target `sim_schedule`: fuzzer-chosen cluster setups and fault
//! schedules through the deterministic simulator, the coverage-guided
//! counterpart of `lease-proto/tests/behaviour/properties.rs`.
//!
//! The fuzzer picks a [`SimConfig`] (2-4 processes, 1-3 leases, seed, clock
//! drift up to 5 %, the probability that a job returns by itself) and up to
//! eight faults (partitions, freezes, slow links and servers, crashes,
//! terminates, restarts, failing statements, hand-over requests, dropped
//! runs), with start times and durations within a 10 s horizon. The
//! simulation runs to the horizon, heals everything, closes every machine
//! and settles ([`Sim::finish`]) until every delayed message has arrived.
//! Then:
//!
//! - without server-side faults ([`Fault::server_ends_sessions`]): no
//!   violation at all (strong safety, release after exit, the run contract,
//!   no leaked lock);
//! - with them: no violation but strong-safety ones ([`Violation::TwoLeaders`]: the server may end a
//!   holder's session before the holder hears of it), and no two processes
//!   act on one key for longer than the validity window, as the holder's
//!   clock counts it (a slow clock: validity / (1 - drift) of the server's time).

#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use lease_proto::sim::{Fault, Report, Sim, SimConfig, Violation};
use libfuzzer_sys::fuzz_target;

/// Faults start within this horizon; the simulation runs to it, then settles.
const HORIZON_MS: u64 = 10_000;
/// After the horizon: everything healed, every machine closed. The settle
/// period is this plus every added latency and server slowness of the
/// schedule (see [`settle`]).
const SETTLE_MS: u64 = 3_000;
/// Most faults in one schedule.
const MAX_FAULTS: usize = 8;

/// One fuzz input.
#[derive(Arbitrary, Debug)]
struct Case {
    /// 2-4 processes.
    processes: u8,
    /// 1-3 leases.
    leases: u8,
    seed: u64,
    /// Clock-rate drift in per mille, up to 50 (5 %).
    drift_permille: u8,
    /// Probability (/255) that a started job returns by itself.
    job_exit: u8,
    faults: Vec<(u16, FaultSpec)>,
}

/// A fault; process numbers are taken modulo the process count, times and
/// durations (milliseconds) modulo the horizon.
#[derive(Arbitrary, Debug)]
enum FaultSpec {
    Partition {
        process: u8,
        duration: u16,
    },
    Freeze {
        process: u8,
        duration: u16,
    },
    Delay {
        process: u8,
        extra: u16,
        duration: u16,
    },
    SlowServer {
        extra: u16,
        duration: u16,
    },
    Crash {
        process: u8,
        restart_after: Option<u16>,
    },
    Terminate {
        process: u8,
    },
    ServerRestart {
        downtime: u16,
    },
    /// Probabilities in /255.
    FlakyStatements {
        error: u8,
        malformed: u8,
        duration: u16,
    },
    /// `lease handover` of lease number `lease` to process `to`.
    RequestHandover {
        lease: u8,
        to: u8,
    },
    /// Process `process` drops its run of lease number `lease`.
    Abandon {
        process: u8,
        lease: u8,
    },
}

fn ms(n: u16) -> Duration {
    Duration::from_millis(u64::from(n) % (HORIZON_MS + 1))
}

impl FaultSpec {
    fn fault(&self, processes: usize) -> Fault {
        let p = |x: u8| usize::from(x) % processes;
        match *self {
            FaultSpec::Partition { process, duration } => Fault::Partition {
                process: p(process),
                duration: ms(duration),
            },
            FaultSpec::Freeze { process, duration } => Fault::Freeze {
                process: p(process),
                duration: ms(duration),
            },
            FaultSpec::Delay {
                process,
                extra,
                duration,
            } => Fault::Delay {
                process: p(process),
                extra: ms(extra),
                duration: ms(duration),
            },
            FaultSpec::SlowServer { extra, duration } => Fault::SlowServer {
                extra: ms(extra),
                duration: ms(duration),
            },
            FaultSpec::Crash {
                process,
                restart_after,
            } => Fault::Crash {
                process: p(process),
                restart_after: restart_after.map(ms),
            },
            FaultSpec::Terminate { process } => Fault::Terminate {
                process: p(process),
            },
            FaultSpec::ServerRestart { downtime } => Fault::ServerRestart {
                downtime: ms(downtime),
            },
            FaultSpec::FlakyStatements {
                error,
                malformed,
                duration,
            } => Fault::FlakyStatements {
                error: f64::from(error) / 255.0,
                malformed: f64::from(malformed) / 255.0,
                duration: ms(duration),
            },
            FaultSpec::RequestHandover { lease, to } => Fault::RequestHandover {
                lease: usize::from(lease),
                to: p(to),
            },
            FaultSpec::Abandon { process, lease } => Fault::Abandon {
                process: p(process),
                lease: usize::from(lease),
            },
        }
    }
}

/// How long to let the simulation settle after the horizon before the leak
/// and contract checks: healing stops new delays, but messages already on a
/// delayed link (which stays FIFO) and statements already on a slowed server
/// still take as long as the schedule made them, up to the sum of every
/// added latency and slowness. Until they arrive, a process's `close` has not
/// reached the server and the server still holds its locks. Cheap: once
/// closed, the machines are idle.
fn settle(faults: &[(Duration, Fault)]) -> Duration {
    let stacked: Duration = faults
        .iter()
        .map(|(_, f)| match f {
            Fault::Delay { extra, .. } | Fault::SlowServer { extra, .. } => *extra,
            _ => Duration::ZERO,
        })
        .sum();
    Duration::from_millis(SETTLE_MS) + stacked
}

fn explain(cfg: &SimConfig, faults: &[(Duration, Fault)], r: &Report) -> String {
    format!(
        "seed {}, {} processes, leases {:?}, drift {}, job exit probability {}\n\
         faults: {faults:#?}\nviolations: {:#?}\nmax overlap: {:?}\ntrace:\n{}",
        cfg.seed,
        cfg.processes,
        cfg.leases,
        cfg.drift,
        cfg.job_exit_probability,
        r.violations,
        r.max_overlap,
        r.trace_text()
    )
}

fuzz_target!(|case: Case| {
    let processes = 2 + usize::from(case.processes % 3);
    let cfg = SimConfig {
        seed: case.seed,
        processes,
        leases: (0..1 + case.leases % 3)
            .map(|i| format!("job-{i}"))
            .collect(),
        drift: f64::from(case.drift_permille % 51) / 1000.0,
        job_exit_probability: f64::from(case.job_exit) / 255.0,
        job_lifetime: Duration::from_millis(HORIZON_MS / 2),
        ..SimConfig::default()
    };
    let faults: Vec<(Duration, Fault)> = case
        .faults
        .iter()
        .take(MAX_FAULTS)
        .map(|(at, f)| (ms(*at), f.fault(processes)))
        .collect();
    // A holder counts its validity window on its own clock, which runs as slow as
    // `1 - drift`: in the server's time the window lasts up to validity / (1 - drift).
    let validity = cfg.options.validity_window().div_f64(1.0 - cfg.drift);
    let server_faults = faults.iter().any(|(_, f)| f.server_ends_sessions());

    let mut sim = Sim::new(cfg.clone(), Instant::now());
    for (at, f) in &faults {
        sim.schedule(*at, f.clone());
    }
    let r = sim.finish(Duration::from_millis(HORIZON_MS), settle(&faults));

    if !server_faults {
        assert!(
            r.violations.is_empty(),
            "violations without server-side faults\n{}",
            explain(&cfg, &faults, &r)
        );
        return;
    }
    let others: Vec<&Violation> = r
        .violations
        .iter()
        .filter(|v| !matches!(v, Violation::TwoLeaders { .. }))
        .collect();
    assert!(
        others.is_empty(),
        "violations other than safety with server-side faults\n{}",
        explain(&cfg, &faults, &r)
    );
    for (lease, overlap) in &r.max_overlap {
        assert!(
            *overlap <= validity,
            "{lease}: overlap {overlap:?} > validity {validity:?}\n{}",
            explain(&cfg, &faults, &r)
        );
    }
});
