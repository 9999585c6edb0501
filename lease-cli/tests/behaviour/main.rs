//! lease-cli's tests, one binary: the `lease` command as a process, against ephemeral
//! PostgreSQL servers of the workspace's test kit (lease-tests), one module per behaviour,
//! sharing [`common`]. They live here, not in `tests/tests`, because only this package's
//! tests get the `lease` binary's path (`CARGO_BIN_EXE_lease`).
//!
//! `cargo test -p lease-cli` runs them all; a module alone: `cargo test -p lease-cli
//! --test behaviour poolers::`. Measured figures are printed with `eprintln!` (add
//! `-- --nocapture`). A new module is a file here plus its `mod` line below
//! (`every_file_here_is_a_module` fails on a file without one).

mod common;

mod command_tree;
mod connection_config;
mod endpoints;
mod errors;
mod give_up;
mod hosts;
mod kill_deadline;
mod lease_valid;
mod log_lines;
mod migration;
mod names;
mod pid1;
mod poolers;
mod run;
mod schedules;
mod security_context;
mod shards;
mod status;
mod tls;
mod try_once;
mod watchdog;

/// Every file of this directory is a module of this binary: cargo compiles only the
/// modules named above, so a file without its `mod` line would never run.
#[test]
fn every_file_here_is_a_module() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/behaviour");
    lease_tests::assert_every_file_is_a_module(dir.as_ref(), include_str!("main.rs"));
}
