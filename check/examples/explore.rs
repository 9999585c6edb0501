//! Explores one configuration and prints its figures:
//! `cargo run --release -p check --example explore -- PROCESSES BUDGET STEPS [MUTATION|-] [LIMIT] [lock-delay|slow]`,
//! or a broken variant's model (`check::variants`), with or without its mutation:
//! `... --example explore -- variant NAME [correct] [STEPS] [FROM]`.

use check::{explore, variants, Model};
use lease_proto::sim::Mutation;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    if args.first().map(String::as_str) == Some("variant") {
        let name = args.get(1).expect("a variant's name");
        let v = variants::named(name).unwrap_or_else(|| panic!("no variant {name}"));
        let mut model = v.model;
        if args.get(2).map(String::as_str) == Some("replay") {
            // `variant NAME replay STEP=OPTION,...`: one schedule, its trace.
            let mut schedule = vec![0u16; model.steps];
            for pair in args
                .get(3)
                .map_or("", String::as_str)
                .split(',')
                .filter(|p| !p.is_empty())
            {
                let (step, option) = pair.split_once('=').expect("STEP=OPTION");
                let step: usize = step.parse().expect("a step");
                if step >= schedule.len() {
                    schedule.resize(step + 1, 0);
                }
                schedule[step] = option.parse().expect("an option");
            }
            model.steps = model.steps.max(schedule.len());
            let run = check::replay(&model, &schedule);
            if std::env::var("STEPS").is_ok() {
                for (i, (at, what)) in run.steps.iter().enumerate() {
                    println!(
                        "step {i:>3} at {at:>10.3?}: {what} ({} options)",
                        run.arity[i]
                    );
                }
            }
            println!("breach {:?}\n{}", run.breach(), run.text());
            return;
        }
        let correct = args.get(2).map(String::as_str) == Some("correct");
        if correct {
            model.mutation = None;
        }
        model.steps = num(3, model.steps);
        model.from = num(4, model.from);
        let out = explore(&model, true, None);
        println!(
            "variant {name}{}: steps {} from {}: {} schedules, {} prefixes, depth {}, {:.1?}, reached {:?}",
            if correct { " (correct code)" } else { "" },
            model.steps, model.from, out.schedules, out.prefixes, out.depth, out.elapsed, out.reached
        );
        if let Some(run) = &out.counterexample {
            println!(
                "breach {:?} (expected {})\n{}",
                run.breach(),
                v.breach,
                run.text()
            );
        }
        return;
    }
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
    model.visited = std::env::var("VISITED").is_ok();
    if let Some(from) = std::env::var("FROM").ok().and_then(|s| s.parse().ok()) {
        model.from = from;
    }
    let out = explore(&model, true, limit);
    println!("pruned {} states {}", out.pruned, out.states);
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
        "NoPoolerProbe" => Mutation::NoPoolerProbe,
        "IgnorePromotion" => Mutation::IgnorePromotion,
        "HoldOnlySinceStart" => Mutation::HoldOnlySinceStart,
        "IgnoreShare" => Mutation::IgnoreShare,
        "FatalReplyIsStatementFailure" => Mutation::FatalReplyIsStatementFailure,
        "ForgedMemberCounted" => Mutation::ForgedMemberCounted,
        other => panic!("unknown mutation {other}"),
    }
}
