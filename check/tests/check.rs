//! The checker in CI: every schedule of the bounded configurations passes
//! every property and reaches the paths a model must reach; a broken variant
//! is found, and its counterexample replays. `CHECK_DEEP=1` raises the
//! bounds (see `docs/checker.md`); run it with `--release`.

use check::{explore, replay, Model, Outcome};
use lease_proto::sim::{Mutation, Violation};

/// Deep mode: the bounds of `docs/checker.md`'s deep runs.
fn deep() -> bool {
    std::env::var("CHECK_DEEP").is_ok_and(|v| v == "1")
}

/// Explores `model` to the end and prints its figures.
fn passes(what: &str, model: &Model) -> Outcome {
    let out = explore(model, true, None);
    eprintln!(
        "{what}: {} processes, {} faults of {}, {} steps: {} schedules, {} prefixes, {:.1?}, reached {:?}",
        model.processes,
        model.budget,
        model.faults.len(),
        model.steps,
        out.schedules,
        out.prefixes,
        out.elapsed,
        out.reached
    );
    if let Some(run) = &out.counterexample {
        panic!("{what}: counterexample\n{}", run.text());
    }
    out
}

#[test]
fn two_processes_one_fault_every_schedule_passes_and_reaches_each_path() {
    let steps = if deep() { 60 } else { 20 };
    let out = passes("2 x 1 fault", &Model::new(2, 1, steps));
    assert!(out.reached.takeover, "no schedule reaches a takeover");
    assert!(
        out.reached.lock_delay_win,
        "no schedule reaches a win after the lock delay"
    );
    assert!(out.reached.handover, "no schedule reaches a hand-over");
}

#[test]
fn two_processes_two_lock_delay_faults_every_schedule_passes() {
    let mut model = Model::new(2, 2, if deep() { 60 } else { 20 });
    model.faults = Model::lock_delay_menu(2);
    let out = passes("2 x 2 terminates/forged", &model);
    assert!(out.reached.lock_delay_win);
}

#[test]
fn two_processes_two_faults_every_schedule_passes() {
    // Deep mode only: 13 faults squared is 70 s in a debug build at 8 steps.
    if deep() {
        passes("2 x 2 faults", &Model::new(2, 2, 30));
    }
}

/// Three processes, one fault.
#[test]
fn three_processes_one_fault_every_schedule_passes() {
    // In CI only the start (the three-way race for the key, a fault in it):
    // a takeover needs a fault after the first holder is established, some
    // 30 steps in, which deep mode reaches.
    let steps = if deep() { 40 } else { 8 };
    let out = passes("3 x 1 fault", &Model::new(3, 1, steps));
    assert!(!deep() || out.reached.takeover);
}

/// [`Mutation::LockDelayOnlyAfterWakes`]: the standby's session is
/// terminated, then the holder's: the standby's new session polls, wins the
/// key the terminate freed and starts its job at once, while the old
/// holder's job is still stopping.
fn lock_delay_only_after_wakes() -> Model {
    let mut model = Model::new(2, 2, 40);
    model.faults = Model::lock_delay_menu(2);
    model.mutation = Some(Mutation::LockDelayOnlyAfterWakes);
    model
}

#[test]
fn broken_lock_delay_only_after_wakes_is_found() {
    let model = lock_delay_only_after_wakes();
    let out = explore(&model, true, None);
    let run = out
        .counterexample
        .expect("the checker finds the broken lock delay");
    eprintln!(
        "found after {} schedules, {:.1?}:\n{}",
        out.schedules,
        out.elapsed,
        run.text()
    );
    assert!(
        matches!(run.violations(), [Violation::TwoLeaders { .. }, ..]),
        "{}",
        run.text()
    );
}

/// The counterexample above, replayed: terminate p1 before step 36, p0
/// before step 39 (the regression test of its schedule).
#[test]
fn broken_lock_delay_only_after_wakes_counterexample_replays() {
    let mut schedule = vec![0; 40];
    schedule[36] = 2; // Terminate { process: 1 }
    schedule[39] = 1; // Terminate { process: 0 }
    let run = replay(&lock_delay_only_after_wakes(), &schedule);
    assert!(
        matches!(run.violations(), [Violation::TwoLeaders { .. }, ..]),
        "{}",
        run.text()
    );
    // The correct machine passes the same schedule.
    let mut model = lock_delay_only_after_wakes();
    model.mutation = None;
    let run = replay(&model, &schedule);
    assert!(run.violations().is_empty(), "{}", run.text());
}
