//! lease-tests' tests, one binary: the drivers and the `replica` processes against real
//! PostgreSQL servers (the shared one at 127.0.0.1:5432 and the kit's ephemeral clusters),
//! one module per behaviour, sharing [`common`].
//!
//! `cargo test -p lease-tests` runs them all; a module alone: `cargo test -p lease-tests
//! --test behaviour scenarios::` (figures are printed as `FIGURE` lines with
//! `-- --nocapture`). A new module is a file here plus its `mod` line below
//! (`every_file_here_is_a_module` fails on a file without one).

mod common;

mod drivers;
mod errors;
mod fencing;
mod from_env;
mod groups;
mod ha_promotion;
mod handover_check;
mod heartbeat_cost;
mod job_span;
mod kit;
mod kit_runtimes;
mod library_schedule;
mod metrics;
mod pasted;
mod poolers;
mod readme_example;
mod scenarios;
mod server_model;
mod server_settings;
mod server_wait;
mod statements;
mod testing_guide;
mod tls;
mod tokens;
mod watch_session;

/// Every file of this directory is a module of this binary: cargo compiles only the
/// modules named above, so a file without its `mod` line would never run.
#[test]
fn every_file_here_is_a_module() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/behaviour");
    lease_tests::assert_every_file_is_a_module(dir.as_ref(), include_str!("main.rs"));
}
