//! `lease`: run a command on exactly one replica at a time, using PostgreSQL
//! session-level advisory locks.
//!
//! - `lease run NAME -- COMMAND...`: contend for NAME and run COMMAND while
//!   leading ([`run`]; the command runs under a watchdog: lease-exec).
//!   With `--metrics-addr`, also serves `/metrics`, `/healthz` and `/leader`
//!   ([`serve`]).
//! - `lease status [NAME...]`: who holds which lease and who waits for it on
//!   the server ([`status`]); `--watch` redraws it until Ctrl-C.
//! - `lease key NAME`: the advisory-lock key of a name.
//! - `lease handover NAME --to PID`: hand a lease over to a named standby
//!   ([`status::handover`]).
//! - `lease valid`: from inside `lease run`'s command, whether its lease is
//!   valid now and until when, asked of the runner over a Unix socket
//!   ([`valid`]).
//! - `lease __watchdog` (hidden): started by `lease run` beside each command;
//!   kills the command's tree when the runner stops renewing its deadline
//!   ([`lease_exec::maybe_run_watchdog`]).
//!
//! Exit statuses: 2 for bad usage (nothing is sent to the database), 1 for
//! errors, and for `lease run` the command's own status.
//!
//! Linux only: the command's parent-death signal uses `prctl` (see lease-exec).

#[cfg(not(target_os = "linux"))]
compile_error!(
    "lease is Linux-only: it ties the child's life to its runner with prctl(PR_SET_PDEATHSIG)"
);

mod args;
mod clock;
mod conn;
mod job;
mod log;
mod run;
mod schedule;
mod serve;
mod state;
mod status;
mod valid;

use std::io::Write;

use clap::error::ErrorKind;
use clap::Parser;

use args::{Cli, Cmd, ScheduleCmd};
use log::usage_error;

fn main() {
    // `lease run` re-executes this binary as each command's watchdog.
    lease_exec::maybe_run_watchdog(log::init_watchdog);
    let code = match Cli::try_parse() {
        Ok(cli) => dispatch(cli),
        Err(e) => clap_error(&e),
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

fn dispatch(cli: Cli) -> i32 {
    match cli.command {
        Cmd::Run(args) => run::main(*args),
        Cmd::Status(args) => status::main(args),
        Cmd::Schedule(ScheduleCmd::Next(args)) => schedule::next(args),
        Cmd::Schedule(ScheduleCmd::Init(args)) => schedule::init(args),
        Cmd::Schedule(ScheduleCmd::Ddl(args)) => schedule::ddl(args),
        Cmd::Key(args) => status::key(args),
        Cmd::Handover(args) => status::handover(args),
        Cmd::Valid(args) => valid::main(args),
    }
}

/// Help and version go to stdout as clap renders them (status 0); a usage
/// error becomes one line on stderr (status 2): clap's first line and the
/// usage of the subcommand.
fn clap_error(e: &clap::Error) -> i32 {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            2
        }
        _ => {
            // Not `env::args`: it panics on an argument that is not UTF-8.
            let argv: Vec<String> = (std::env::args_os())
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let mut message = one_line(&e.render().to_string());
            if let Some(hint) = separator_hint(e, &argv) {
                message.push_str(&format!("; {hint}"));
            }
            usage_error(2, &message)
        }
    }
}

/// A hint for `lease run NAME COMMAND` without the `--` before COMMAND: clap
/// calls COMMAND an unexpected argument.
fn separator_hint(e: &clap::Error, argv: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != ErrorKind::UnknownArgument || argv.get(1).map(String::as_str) != Some("run") {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    if arg.starts_with('-') || argv.iter().any(|a| a == "--") {
        return None;
    }
    Some(format!(
        "the command goes after `--`: lease run [OPTIONS] NAME -- {arg} [ARGS]..."
    ))
}

/// Folds clap's rendered error into one line: the error paragraph, any tip,
/// and the usage.
fn one_line(rendered: &str) -> String {
    let mut error = Vec::new();
    let mut tips = Vec::new();
    let mut usage = None;
    let mut in_error = true;
    for line in rendered.lines().map(str::trim) {
        if line.is_empty() {
            in_error = error.is_empty();
            continue;
        }
        if let Some(u) = line.strip_prefix("Usage:") {
            usage = Some(u.trim());
        } else if let Some(tip) = line.strip_prefix("tip:") {
            tips.push(tip.trim());
        } else if in_error {
            error.push(line.trim_start_matches("error:").trim());
        }
    }
    let mut message = error.join(" ");
    if message.is_empty() {
        message.push_str("invalid arguments");
    }
    for tip in tips {
        message.push_str(&format!("; {tip}"));
    }
    match usage {
        Some(u) => message.push_str(&format!(" (usage: {u}; see --help)")),
        None => message.push_str(" (see --help)"),
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_without_the_separator_gets_a_hint() {
        let argv = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
        let hint = |a: &[&str]| {
            let e = Cli::try_parse_from(a).expect_err("refused");
            separator_hint(&e, &argv(a))
        };
        assert_eq!(
            hint(&["lease", "run", "job", "./job.sh", "--batch", "5"]).as_deref(),
            Some("the command goes after `--`: lease run [OPTIONS] NAME -- ./job.sh [ARGS]...")
        );
        assert_eq!(
            hint(&["lease", "run", "--bogus", "job", "--", "true"]),
            None
        );
        assert_eq!(hint(&["lease", "run", "a", "b", "--", "true"]), None);
    }

    #[test]
    fn clap_errors_fold_into_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  \
                        <COMMAND>...\n\nUsage: lease run [OPTIONS] <NAME> -- <COMMAND> \
                        [ARGS]...\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(rendered),
            "the following required arguments were not provided: <COMMAND>... \
             (usage: lease run [OPTIONS] <NAME> -- <COMMAND> [ARGS]...; see --help)"
        );
        let rendered = "error: unexpected argument 'x' found\n\n  tip: to pass 'x' as a \
                        value, use '-- x'\n\nUsage: lease run\n";
        assert_eq!(
            one_line(rendered),
            "unexpected argument 'x' found; to pass 'x' as a value, use '-- x' (usage: lease \
             run; see --help)"
        );
    }
}
