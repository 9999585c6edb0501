//! Prints the simulator's full trace and report for a fixed set of seeds and
//! fault schedules, every fault kind included, so that a change meant to keep
//! the machine's behaviour (a refactor) can be checked byte for byte:
//!
//! ```sh
//! cargo run -q -p lease-proto --features sim --example trace_seeds > before.txt
//! # ... change the code ...
//! cargo run -q -p lease-proto --features sim --example trace_seeds > after.txt
//! cmp before.txt after.txt
//! ```
//!
//! `trace_seeds [CASES]` (default 300). Each case is derived from its number
//! alone, so the same number is the same case on every build.

use std::time::{Duration, Instant};

use lease_proto::sim::{Fault, Sim, SimConfig};

/// A small deterministic generator (xorshift64*), independent of the
/// simulator's own randomness.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn ms(&mut self, n: u64) -> Duration {
        Duration::from_millis(self.below(n))
    }
}

fn fault(g: &mut Gen, processes: usize, leases: usize) -> Fault {
    let process = g.below(processes as u64) as usize;
    match g.below(13) {
        0 => Fault::Partition {
            process,
            duration: g.ms(3_000),
        },
        1 => Fault::Freeze {
            process,
            duration: g.ms(3_000),
        },
        2 => Fault::Delay {
            process,
            extra: g.ms(400),
            duration: g.ms(3_000),
        },
        3 => Fault::SlowServer {
            extra: g.ms(400),
            duration: g.ms(3_000),
        },
        4 => Fault::Crash {
            process,
            restart_after: g.below(2).eq(&0).then(|| g.ms(2_000)),
        },
        5 => Fault::Terminate { process },
        6 => Fault::ServerRestart {
            downtime: g.ms(1_500),
        },
        7 => Fault::ServerCrash {
            downtime: g.ms(1_500),
        },
        8 => Fault::Promote {
            lag: g.below(3) as u32,
            downtime: g.ms(1_500),
        },
        9 => Fault::PromoteFrozenPrimary {
            lag: g.below(3) as u32,
        },
        10 => Fault::FlakyStatements {
            error: g.below(30) as f64 / 100.0,
            malformed: g.below(10) as f64 / 100.0,
            duration: g.ms(3_000),
        },
        11 => Fault::ForgedNotify {
            lease: g.below(leases as u64) as usize,
        },
        _ => Fault::AuthFailing {
            duration: g.ms(2_000),
        },
    }
}

fn main() {
    let cases: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("CASES: a whole number"))
        .unwrap_or(300);
    let base = Instant::now();
    for case in 0..cases {
        let mut g = Gen(case.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let processes = 2 + g.below(3) as usize;
        let leases = 1 + g.below(3) as usize;
        let defaults = SimConfig::default();
        let cfg = SimConfig {
            seed: g.next(),
            processes,
            leases: (0..leases).map(|i| format!("job{i}")).collect(),
            options: {
                let mut o = defaults.options.clone();
                o.notify_handover = g.below(4) != 0;
                o
            },
            drift: g.below(50) as f64 / 1_000.0,
            job_exit_probability: g.below(4) as f64 / 10.0,
            full_trace: true,
            ..defaults
        };
        let mut sim = Sim::new(cfg.clone(), base);
        let mut schedule = Vec::new();
        for _ in 0..g.below(6) {
            let at = g.ms(8_000);
            let f = fault(&mut g, processes, leases);
            schedule.push((at, f.clone()));
            sim.schedule(at, f);
        }
        let report = sim.finish(Duration::from_secs(10), Duration::from_secs(4));
        println!(
            "==== case {case}: {processes} processes, {leases} leases, seed {}",
            cfg.seed
        );
        println!("schedule {schedule:?}");
        println!("{}", report.trace_text());
        println!(
            "violations {:?}\nmax_overlap {:?}\nacquisitions {:?}\nstatements {:?}\noutcomes {:?}\nwaits_past_deadlock_timeout {}",
            report.violations,
            report.max_overlap,
            report.acquisitions,
            report.statements,
            report.outcomes,
            report.lock_waits_past_deadlock_timeout
        );
    }
}
