//! The checker in CI: every schedule of the bounded configurations passes
//! every property and reaches the paths a model must reach ("sometimes"
//! properties); a broken variant is found, and its counterexample replays
//! (every other broken variant: `variants.rs`). `CHECK_DEEP=1` raises the
//! bounds, each with a time budget (see `docs/checker.md`); run it with
//! `--release -- --nocapture --test-threads=1`.

use std::time::Duration;

use check::{explore_within, replay, variants, Model, Outcome};
use lease_proto::sim::{Fault, Mutation, Violation};
use lease_proto::{group_id_for_name, key_for_name};

/// Deep mode: the bounds of `docs/checker.md`'s deep runs.
fn deep() -> bool {
    std::env::var("CHECK_DEEP").is_ok_and(|v| v == "1")
}

/// In deep mode, the wall time a bound may take: `minutes` (times
/// `CHECK_BUDGET_SCALE`, default 1); none in CI, where every bound is
/// explored to its end.
fn budget(minutes: f64) -> Option<Duration> {
    deep().then(|| {
        let scale: f64 = std::env::var("CHECK_BUDGET_SCALE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1.0);
        Duration::from_secs_f64(minutes * scale * 60.0)
    })
}

/// When this test binary's first bound started.
fn started() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// Explores `model` (to the end, or `minutes` in deep mode) and prints its
/// figures; panics on a counterexample.
fn passes(what: &str, model: &Model, minutes: f64) -> Outcome {
    started();
    let budget = budget(minutes);
    let out = explore_within(model, true, None, budget);
    eprintln!(
        "{what}: {} processes, {} leases, <= {} faults of {}, steps {}..{}{}: {} schedules, {} \
         prefixes, {} pruned at {} visited states, {:.1?}, {}, reached {:?}",
        model.processes,
        model.config().leases.len(),
        model.budget,
        model.faults.len(),
        model.from,
        model.steps,
        if model.visited { ", visited set" } else { "" },
        out.schedules,
        out.prefixes,
        out.pruned,
        out.states,
        out.elapsed,
        if out.complete {
            "every schedule".to_string()
        } else {
            format!("stopped at the time budget ({budget:?})")
        },
        out.reached
    );
    if let Some(run) = &out.counterexample {
        panic!("{what}: counterexample\n{}", run.text());
    }
    assert!(out.complete || deep(), "{what}: not explored to the end");
    out
}

#[test]
fn two_processes_one_fault_every_schedule_passes_and_reaches_each_path() {
    let steps = if deep() { 60 } else { 20 };
    let out = passes("2 x 1 fault", &Model::new(2, 1, steps), 8.0);
    assert!(out.reached.takeover, "no schedule reaches a takeover");
    assert!(
        out.reached.lock_delay_win,
        "no schedule reaches a win after the lock delay"
    );
    assert!(out.reached.handover, "no schedule reaches a hand-over");
    assert!(
        out.reached.validity_cancel,
        "no schedule reaches a cancel at the validity's end"
    );
}

#[test]
fn two_processes_two_lock_delay_faults_every_schedule_passes() {
    let mut model = Model::new(2, 2, if deep() { 60 } else { 20 });
    model.faults = Model::lock_delay_menu(2);
    let out = passes("2 x 2 terminates/forged", &model, 8.0);
    assert!(out.reached.lock_delay_win);
}

/// A run future dropped at any step, before or after a hand-over request
/// either way: the dropped run finishes `Abandoned`, is never started
/// again, and the other process leads within the failover bound.
#[test]
fn two_processes_a_dropped_run_and_hand_overs_every_schedule_passes() {
    let mut model = Model::new(2, 2, if deep() { 60 } else { 30 });
    model.faults = Model::abandon_menu();
    // A warm-up to a holder: the start, without faults to choose from.
    model.from = 12;
    let out = passes("2 x dropped run/hand-over", &model, 8.0);
    assert!(out.reached.handover);
    assert!(
        out.reached.drop_while_releasing,
        "no schedule drops a run while its key is released"
    );
}

/// The same beside jobs that return by themselves (within 100 ms) and a terminate: a run
/// dropped after its job's own return, and after a loss. No failover bound (a completed
/// run leaves its lease unled); every end check holds.
#[test]
fn two_processes_a_dropped_run_beside_returning_jobs_every_schedule_passes() {
    let mut model = Model::new(2, 2, if deep() { 60 } else { 30 }).with(|cfg| {
        cfg.job_exit_probability = 1.0;
        cfg.job_lifetime = Duration::from_millis(100);
    });
    model.failover = None;
    model.faults = vec![
        Fault::Abandon {
            process: 0,
            lease: 0,
        },
        Fault::Terminate { process: 0 },
    ];
    model.from = 12;
    let out = passes("2 x dropped run/returning jobs/terminate", &model, 8.0);
    assert!(out.reached.drop_while_releasing);
}

/// The same with the visited set of states (deep mode only: in a debug
/// build the fingerprint costs about what it saves).
#[test]
fn two_processes_two_lock_delay_faults_with_a_visited_set() {
    if deep() {
        let mut model = Model::new(2, 2, 40);
        model.faults = Model::lock_delay_menu(2);
        model.visited = true;
        passes("2 x 2 terminates/forged", &model, 6.0);
        model.visited = false;
        passes("2 x 2 terminates/forged", &model, 6.0);
    }
}

#[test]
fn two_processes_two_faults_every_schedule_passes() {
    // Deep mode only: the full menu squared.
    if deep() {
        passes("2 x 2 faults", &Model::new(2, 2, 30), 10.0);
    }
}

/// Three processes, one fault.
#[test]
fn three_processes_one_fault_every_schedule_passes() {
    // In CI only the start (the three-way race for the key, a fault in it):
    // a takeover needs a fault after the first holder is established, some
    // 30 steps in, which deep mode reaches.
    let steps = if deep() { 40 } else { 8 };
    let out = passes("3 x 1 fault", &Model::new(3, 1, steps), 8.0);
    assert!(!deep() || out.reached.takeover);
}

/// Three processes once the first holder is established (the first 26
/// steps in time order): one fault of the full menu, or two of the
/// terminates and forged notification; each must reach a takeover.
#[test]
fn three_processes_after_the_start_every_schedule_passes() {
    let mut model = Model::new(3, 1, if deep() { 80 } else { 60 });
    model.from = 26;
    let out = passes("3 x 1 fault after the start", &model, 8.0);
    assert!(out.reached.takeover && out.reached.handover);
    let mut model = Model::new(3, 2, if deep() { 50 } else { 40 });
    model.from = 26;
    model.faults = Model::lock_delay_menu(3);
    let out = passes("3 x 2 terminates/forged after the start", &model, 8.0);
    assert!(out.reached.lock_delay_win);
    if deep() {
        let mut model = Model::new(3, 2, 40);
        model.from = 26;
        passes("3 x 2 faults after the start", &model, 10.0);
        let mut model = Model::new(2, 2, 50);
        model.from = 24;
        passes("2 x 2 faults after the start", &model, 10.0);
    }
}

/// Two members of a lease group of four keys: the fair share (from 2 s
/// after the last fault), bounded failover, and a rebalance reached; the
/// faults: a crash of either member (back after 300 ms), a freeze past the
/// validity, a terminate, a forged member lock, a forged announcement and a
/// forged claim.
#[test]
fn a_lease_group_every_schedule_passes_and_rebalances() {
    let mut model = Model::new(2, 1, if deep() { 40 } else { 16 }).with(variants::group_of_four);
    model.fair_share = Some(Duration::from_secs(2));
    model.failover = Some(Duration::from_millis(500));
    model.faults = vec![
        Fault::Crash {
            process: 0,
            restart_after: Some(Duration::from_millis(300)),
        },
        Fault::Freeze {
            process: 1,
            duration: Duration::from_secs(2),
        },
        Fault::Terminate { process: 0 },
        Fault::ForgedMember { pid: 1 },
        // Forged notifications of the group's payloads: an announcement,
        // and a claim of a key naming process 1's backend.
        Fault::ForgedPayload {
            payload: format!("group {}", group_id_for_name("g")),
        },
        Fault::ForgedPayload {
            payload: format!("claim {} 1002", key_for_name("job-0")),
        },
    ];
    let out = passes("group of 4 keys x 1 fault", &model, 8.0);
    assert!(
        out.reached.rebalance,
        "no schedule reaches a group rebalance"
    );
}

/// Deep mode: each broken variant's model passes on the correct code, to
/// the variant's bound (or the time budget).
#[test]
fn every_variants_model_passes_on_the_correct_code() {
    if !deep() {
        return;
    }
    let mut failed = Vec::new();
    for v in variants::all() {
        let model = Model {
            mutation: None,
            ..v.model
        };
        let what = format!("correct code on {}'s model", v.name);
        if std::panic::catch_unwind(|| passes(&what, &model, 1.0)).is_err() {
            failed.push(v.name);
        }
    }
    assert!(
        failed.is_empty(),
        "counterexamples on the correct code: {failed:?}"
    );
}

/// Deep mode, last (the tests run in name order on one thread): three
/// processes, two faults (terminates, forged notification), to 40 steps,
/// for the time left until the deep run has lasted `CHECK_DEEP_MINUTES`
/// (default 62), at least 5 minutes.
#[test]
fn with_the_time_left_three_processes_two_lock_delay_faults_pass() {
    if !deep() {
        return;
    }
    let total: f64 = std::env::var("CHECK_DEEP_MINUTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(62.0);
    let left = (total - started().elapsed().as_secs_f64() / 60.0).max(5.0);
    let scale: f64 = std::env::var("CHECK_BUDGET_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let mut model = Model::new(3, 2, 40);
    model.faults = Model::lock_delay_menu(3);
    passes("3 x 2 terminates/forged", &model, left / scale);
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
    let out = check::explore(&model, true, None);
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
