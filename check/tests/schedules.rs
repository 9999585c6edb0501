//! The schedule model (`check::schedules`): every interleaving of two
//! replicas' planners, within bounds, runs no due time twice, with and without
//! a state table, across overlap policies and jitter; readings off by more than
//! the bound (`MAX_CLOCK_ERROR`) break it, and the checker finds that.

use check::schedules::ScheduleModel;
use lease_proto::schedule::{CatchUp, Overlap, Policy, MAX_CLOCK_ERROR};
use std::time::Duration;

fn model(policy: Policy, table: bool, errors: Vec<i64>) -> ScheduleModel {
    ScheduleModel {
        period_ms: 1_000,
        policy,
        table,
        errors,
        gaps: vec![0, 40, 1_000],
        steps: 6,
    }
}

fn bound() -> i64 {
    i64::try_from(MAX_CLOCK_ERROR.as_millis()).unwrap()
}

#[test]
fn every_interleaving_of_two_schedule_leaders_runs_no_due_time_twice() {
    for table in [false, true] {
        for overlap in [Overlap::Skip, Overlap::Queue, Overlap::Replace] {
            for jitter in [0, 150] {
                let policy = Policy {
                    jitter: Duration::from_millis(jitter),
                    overlap,
                    catch_up_window: if table {
                        Duration::from_secs(10)
                    } else {
                        Duration::ZERO
                    },
                    catch_up: CatchUp::All,
                };
                let m = model(policy, table, vec![-bound(), 0, bound()]);
                let out = m.explore();
                if let Some((path, what)) = &out.counterexample {
                    panic!("table {table}, {overlap:?}, jitter {jitter}: {what}\n{path:#?}");
                }
                assert!(out.starts > 0, "no start reached");
                assert!(out.takeovers_at_due_times > 0, "no takeover at a due time");
                eprintln!(
                    "schedules (table {table}, {overlap:?}, jitter {jitter} ms): {} sequences of \
                     {} steps, {} starts, {} takeovers at a due time, none twice",
                    out.sequences, m.steps, out.starts, out.takeovers_at_due_times
                );
            }
        }
    }
}

#[test]
fn readings_off_by_more_than_the_bound_run_a_due_time_twice() {
    let m = model(Policy::default(), false, vec![-3 * bound(), 3 * bound()]);
    let out = m.explore();
    let (path, what) = out
        .counterexample
        .expect("readings 150 ms off start a due time on both replicas");
    assert!(what.contains("started on p"), "{what}");
    eprintln!("found, as expected: {what}\n{path:?}");
}
