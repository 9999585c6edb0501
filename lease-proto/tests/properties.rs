//! Properties of the machine in the simulator, over generated fault schedules.
//! Each runs `PROPTEST_CASES` cases (256 by default in this file's config);
//! a failure shrinks to a small schedule and prints the trace.

use std::time::{Duration, Instant};

use lease_proto::sim::{faults_end, Fault, Report, Sim, SimConfig};
use lease_proto::Options;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const HORIZON: u64 = 15_000;

fn config(processes: usize, leases: usize, seed: u64, exits: bool) -> SimConfig {
    SimConfig {
        seed,
        processes,
        leases: (0..leases).map(|i| format!("job-{i}")).collect(),
        job_exit_probability: if exits { 0.3 } else { 0.0 },
        job_lifetime: ms(3000),
        // 700 ms validity, 200 ms margin: the drift bound is 12.5 %; stay inside.
        drift: 0.05,
        ..SimConfig::default()
    }
}

/// Faults under which the strong safety property must hold: nothing the
/// server does on its own.
fn client_fault(processes: usize) -> impl Strategy<Value = Fault> {
    let p = 0..processes;
    prop_oneof![
        (p.clone(), 1..4000u64).prop_map(|(process, d)| Fault::Partition {
            process,
            duration: ms(d)
        }),
        (p.clone(), 1..4000u64).prop_map(|(process, d)| Fault::Freeze {
            process,
            duration: ms(d)
        }),
        (p.clone(), 1..400u64, 1..3000u64).prop_map(|(process, e, d)| Fault::Delay {
            process,
            extra: ms(e),
            duration: ms(d)
        }),
        (1..400u64, 1..3000u64).prop_map(|(e, d)| Fault::SlowServer {
            extra: ms(e),
            duration: ms(d)
        }),
        (p, proptest::option::of(1..3000u64)).prop_map(|(process, r)| Fault::Crash {
            process,
            restart_after: r.map(ms)
        }),
    ]
}

fn any_fault(processes: usize) -> impl Strategy<Value = Fault> {
    let p = 0..processes;
    prop_oneof![
        4 => client_fault(processes),
        1 => p.prop_map(|process| Fault::Terminate { process }),
        1 => (1..2000u64).prop_map(|d| Fault::ServerRestart { downtime: ms(d) }),
    ]
}

fn schedule(f: impl Strategy<Value = Fault>) -> impl Strategy<Value = Vec<(Duration, Fault)>> {
    proptest::collection::vec(((0..HORIZON / 2).prop_map(ms), f), 0..6)
}

fn run(cfg: SimConfig, faults: &[(Duration, Fault)]) -> Report {
    let mut sim = Sim::new(cfg, Instant::now());
    for (at, f) in faults {
        sim.schedule(*at, f.clone());
    }
    sim.finish(ms(HORIZON), ms(3000))
}

fn explain(r: &Report) -> String {
    format!(
        "violations: {:#?}\ntrace (time, process, event):\n{}",
        r.violations,
        r.trace_text()
    )
}

/// Liveness bound after the last fault heals: the old session may live until
/// the guard ends it, a standby may be waiting out a query timeout, a reconnect
/// backoff (capped at the retry interval) and one retry interval.
fn liveness_bound(o: &Options) -> Duration {
    o.guard_timeout() + o.query_timeout + o.retry_interval * 2 + ms(50)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    /// Strong safety, contract and no leaks under partitions, freezes, delays,
    /// slow replies and client crashes.
    #[test]
    fn strong_safety_contract_and_no_leaks(
        processes in 2..5usize,
        leases in 1..4usize,
        seed in any::<u64>(),
        exits in any::<bool>(),
        faults in schedule(client_fault(4)),
    ) {
        let faults: Vec<_> = faults.into_iter().filter(|(_, f)| fault_process(f).is_none_or(|p| p < processes)).collect();
        let r = run(config(processes, leases, seed, exits), &faults);
        prop_assert!(r.violations.is_empty(), "{}", explain(&r));
    }

    /// Bounded safety when the server ends sessions itself (terminate,
    /// restart): two jobs overlap at most the validity window, and at most a
    /// one-way latency when the holder can hear the server.
    #[test]
    fn bounded_overlap_when_the_server_ends_sessions(
        processes in 2..5usize,
        seed in any::<u64>(),
        faults in schedule(any_fault(4)),
    ) {
        let faults: Vec<_> = faults.into_iter().filter(|(_, f)| fault_process(f).is_none_or(|p| p < processes)).collect();
        let cfg = config(processes, 2, seed, false);
        let validity = cfg.options.validity_window();
        let hears = faults.iter().all(|(_, f)| f.server_ends_sessions() || matches!(f, Fault::Crash { .. }));
        let latency = cfg.latency + cfg.jitter + cfg.job_reaction;
        let r = run(cfg, &faults);
        let contract: Vec<_> = r.violations.iter().filter(|v| !v.is_safety()).collect();
        prop_assert!(contract.is_empty(), "{}", explain(&r));
        for (lease, overlap) in &r.max_overlap {
            prop_assert!(*overlap <= validity, "{lease}: overlap {overlap:?} > validity {validity:?}\n{}", explain(&r));
            if hears {
                prop_assert!(*overlap <= latency, "{lease}: overlap {overlap:?} > {latency:?} with the holder hearing the server\n{}", explain(&r));
            }
        }
    }

    /// Liveness: once every fault has healed, some live process leads every
    /// lease within the documented bound.
    #[test]
    fn liveness_after_healing(
        processes in 2..5usize,
        leases in 1..4usize,
        seed in any::<u64>(),
        faults in schedule(any_fault(4)),
    ) {
        let faults: Vec<_> = faults.into_iter().filter(|(_, f)| fault_process(f).is_none_or(|p| p < processes)).collect();
        let cfg = config(processes, leases, seed, false);
        let names = cfg.leases.clone();
        let bound = liveness_bound(&cfg.options);
        let mut sim = Sim::new(cfg, Instant::now());
        for (at, f) in &faults {
            sim.schedule(*at, f.clone());
        }
        // Crashes without restart still leave other processes; if all crashed, skip.
        let healed = faults_end(&faults).unwrap_or(Duration::ZERO);
        let alive_at_end = (0..processes).any(|p| !faults.iter().any(|(_, f)| matches!(f, Fault::Crash { process, restart_after: None } if *process == p)));
        prop_assume!(alive_at_end);
        sim.run_until(healed);
        let deadline = healed + bound;
        let mut led_at = None;
        while sim.now() < deadline {
            let t = sim.now() + ms(5);
            sim.run_until(t);
            if names.iter().all(|n| (0..processes).any(|p| sim.leads(p, n))) {
                led_at = Some(sim.now());
                break;
            }
        }
        prop_assert!(led_at.is_some(), "not every lease led within {bound:?} after healing at {healed:?}\n{}", explain(sim.report()));
    }
}

fn fault_process(f: &Fault) -> Option<usize> {
    match f {
        Fault::Partition { process, .. }
        | Fault::Freeze { process, .. }
        | Fault::Delay { process, .. }
        | Fault::Crash { process, .. }
        | Fault::Terminate { process } => Some(*process),
        Fault::SlowServer { .. }
        | Fault::ServerRestart { .. }
        | Fault::ServerCrash { .. }
        | Fault::Promote { .. } => None,
    }
}

/// Efficiency: statements per heartbeat interval do not grow with the number
/// of leases, for a holder and for a standby.
#[test]
fn statements_per_interval_are_constant_in_the_number_of_leases() {
    let mut per_interval = Vec::new();
    for n in [1usize, 10, 100, 1000] {
        let mut cfg = config(2, n, 7, false);
        cfg.drift = 0.0;
        let mut sim = Sim::new(cfg.clone(), Instant::now());
        sim.run_until(ms(2000));
        let before = (sim.statements(0), sim.statements(1));
        sim.run_until(ms(12_000));
        let intervals = 10_000 / cfg.options.heartbeat_interval.as_millis() as u64;
        let holder = (sim.statements(0) - before.0) as f64 / intervals as f64;
        let standby = (sim.statements(1) - before.1) as f64 / intervals as f64;
        eprintln!("{n:>5} leases: {holder:.2} statements/interval (p0), {standby:.2} (p1)");
        per_interval.push((n, holder, standby));
    }
    let (_, h1, s1) = per_interval[0];
    for (n, h, s) in &per_interval {
        assert!(
            (h - h1).abs() < 0.3 && (s - s1).abs() < 0.3,
            "{n} leases: {h}/{s} vs {h1}/{s1} statements per interval"
        );
    }
}
