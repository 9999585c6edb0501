//! Explores one configuration and prints its figures:
//! `cargo run --release -p check --example explore -- PROCESSES BUDGET STEPS [MUTATION]`.

use check::{explore, Model};
use lease_proto::sim::Mutation;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let mut model = Model::new(num(0, 2), num(1, 1), num(2, 20));
    if let Some(m) = args.get(3).filter(|m| *m != "-") {
        model.mutation = Some(mutation(m));
    }
    match args.get(5).map(String::as_str) {
        Some("lock-delay") => model.faults = Model::lock_delay_menu(model.processes),
        Some("slow") => model.faults = Model::slow_then_silent_menu(model.processes),
        _ => {}
    }
    let limit = args.get(4).and_then(|s| s.parse().ok());
    let out = explore(&model, model.mutation.is_some(), limit);
    println!(
        "processes {} budget {} steps {} mutation {:?}: {} schedules, {} prefixes, depth {}, {:.1?}, reached {:?}",
        model.processes, model.budget, model.steps, model.mutation, out.schedules, out.prefixes, out.depth, out.elapsed, out.reached
    );
    if let Some(run) = &out.counterexample {
        println!("{}", run.text());
    }
}

fn mutation(name: &str) -> Mutation {
    match name {
        "ConfirmAtArrival" => Mutation::ConfirmAtArrival,
        "NotifyFromAnyone" => Mutation::NotifyFromAnyone,
        "LockDelayOnlyAfterWakes" => Mutation::LockDelayOnlyAfterWakes,
        "NoFastReconnect" => Mutation::NoFastReconnect,
        "WatchAcquires" => Mutation::WatchAcquires,
        "WatchTries" => Mutation::WatchTries,
        "KeepReservedWin" => Mutation::KeepReservedWin,
        "IgnoreGrantee" => Mutation::IgnoreGrantee,
        "HandOverUnchecked" => Mutation::HandOverUnchecked,
        "ObserverTries" => Mutation::ObserverTries,
        other => panic!("unknown mutation {other}"),
    }
}
