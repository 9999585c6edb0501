//! Failover gap and overlap, scenario by scenario.
//!
//! Every scenario, driver and design: repetitions of [`Bench::rep`] between two `replica`
//! processes, the fault at a random fraction of the retry interval after the standby
//! stands by.

use crate::duel::{Bench, Contender, Rep, Scenario};
use crate::{Design, Plan, DRIVERS, R};
use lease_tests::scenario::Driver;

/// The repetitions of one scenario, driver and design.
#[derive(Clone, Debug)]
pub struct Cell {
    pub scenario: Scenario,
    pub driver: Driver,
    pub design: Design,
    pub reps: Vec<Rep>,
}

pub fn run_all(bench: &mut Bench, plan: &Plan) -> R<Vec<Cell>> {
    let mut cells = Vec::new();
    for scenario in Scenario::ALL {
        for driver in DRIVERS {
            for design in Design::BOTH {
                let n = if scenario.slow() {
                    plan.slow_reps
                } else {
                    plan.reps
                };
                let who = Contender::Replica {
                    driver,
                    design,
                    lock_delay: None,
                };
                let mut reps = Vec::with_capacity(n);
                for i in 0..n {
                    let lease = format!(
                        "{}-{}-{}-{i}",
                        scenario.name(),
                        driver.name(),
                        design.name()
                    );
                    reps.push(bench.rep(scenario, who, &lease, plan.intervals.retry)?);
                }
                let gaps: Vec<String> = reps
                    .iter()
                    .map(|r| {
                        r.gap_ns
                            .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6))
                    })
                    .collect();
                eprintln!(
                    "bench: {:<9} {:<5} {:<9} gaps ms [{}]",
                    scenario.name(),
                    driver.name(),
                    design.name(),
                    gaps.join(" ")
                );
                cells.push(Cell {
                    scenario,
                    driver,
                    design,
                    reps,
                });
            }
        }
    }
    Ok(cells)
}
