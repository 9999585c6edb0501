//! lease-proto's tests, one binary: the machine driven by hand and the simulator, one
//! module per behaviour, sharing [`common`].
//!
//! `cargo test -p lease-proto` runs them all; a module alone: `cargo test -p lease-proto
//! --test behaviour server_wait::`. A new module is a file here plus its `mod` line below
//! (`every_file_here_is_a_module` fails on a file without one).

mod common;

// The machine driven by hand.
mod arbitrary_inputs;
mod candidacy;
mod contract;
mod doubtful_session;
mod errors;
mod fuzz_regressions;
mod groups;
mod handover_notification;
mod handover_request;
mod heartbeat;
mod options;
mod poolers;
mod promotion;
mod reconnect;
mod schedule;
mod server_wait;
mod session_setup;
mod watch_session;

// The simulator: scenarios with one fault each, and properties over generated ones.
mod cancelled_jobs;
mod deadlock_timeout;
mod properties;
mod scenarios;

/// Every file of this directory is a module of this binary: cargo compiles only the
/// modules named above, so a file without its `mod` line would never run.
#[test]
fn every_file_here_is_a_module() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/behaviour");
    let main = include_str!("main.rs");
    for entry in std::fs::read_dir(dir).expect("the test directory") {
        let name = entry.expect("a directory entry").file_name();
        let name = name.to_string_lossy();
        if let Some(module) = name.strip_suffix(".rs").filter(|m| *m != "main") {
            assert!(
                main.contains(&format!("\nmod {module};")),
                "{name}: no `mod {module};` in main.rs"
            );
        }
    }
}
