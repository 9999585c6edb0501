//! `demo`: failover, live. Three replicas of a tiny job under `lease run`, their leader
//! killed, frozen, partitioned and stopped in turn, with a live timeline and a summary.
//!
//! ```text
//! cargo run -p lease-bench --bin demo -- [--verbose] [--defaults] [--database-url URL] [--lease PATH]
//! ```
//!
//! The replicas are real `lease run` processes (the `lease` binary of lease-cli, built on
//! demand next to this one), each connecting through its own fault-injecting TCP proxy
//! ([`FaultProxy`](lease_tests::FaultProxy)); the job is this binary re-invoked as
//! `demo --job`, which prints a heartbeat with its fencing token every 100 ms. Gaps and
//! overlaps are measured from those lines, stamped on arrival by the kit's
//! [`Replica`](lease_tests::Replica). The demo starts a throwaway server
//! ([`Cluster`](lease_tests::Cluster)) unless `--database-url` names another (with a loud
//! line first); `DATABASE_URL` and the `PG*` variables are ignored, and kept from the
//! replicas. The orchestration is in [`show`].

mod show;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const USAGE: &str = "\
usage: cargo run -p lease-bench --bin demo -- [OPTIONS]

Watch failover work. It starts a throwaway PostgreSQL (a server of version 14 or newer must be
installed: initdb, postgres and psql; on Debian or Ubuntu `sudo apt-get install postgresql`),
unless --database-url names another server. DATABASE_URL, PGHOST and
every other PG* variable are ignored (and removed from the replicas' environment), so a shell
that holds a production URL never points the demo at production. It runs three replicas of
`lease run demo-job -- <a tiny job>` as real processes, each through its own fault-injecting
TCP proxy, and in turn kills the leader with SIGKILL, freezes it (SIGSTOP, later SIGCONT),
partitions it from the database, and stops it with SIGTERM. It prints a live timeline and a
summary of each failover: the time to detect it, the gap without a job, any overlap of two
jobs, and the fencing tokens before and after. Takes about 15 seconds after the build, at test
timings (failover within about 2 s); --defaults runs `lease run` at its default timings
(a frozen or cut-off leader is replaced after 11 to 16 s; about 40 s in all).

options:
  -v, --verbose         also show every log line of the three `lease run` replicas
  --defaults            run the replicas at `lease run`'s default timings (the first line says
                        which), not at the demo's test timings
  --database-url URL    run against this server (a URL or a key=value string, the password in
                        it) instead of a throwaway one: the demo kills, freezes, partitions
                        and stops the replicas against it (it says so loudly first)
  --lease PATH          the `lease` binary to run (default: build lease-cli's, next to this one)
  -h, --help            this text";

/// The demo job's heartbeat period.
const BEAT: Duration = Duration::from_millis(100);

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs `on_stop_signal` for SIGTERM and SIGINT.
fn catch_stop_signals() {
    let handler = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

/// Whether SIGTERM or SIGINT arrived.
fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The command line.
pub struct Args {
    /// Show every log line of the replicas.
    pub verbose: bool,
    /// `--defaults`: `lease run` at its default timings.
    pub defaults: bool,
    /// `--database-url`.
    pub database_url: Option<String>,
    /// `--lease`.
    pub lease: Option<PathBuf>,
}

enum Parsed {
    Demo(Args),
    Job,
    Help,
}

fn parse_args() -> Result<Parsed, String> {
    let mut args = Args {
        verbose: false,
        defaults: false,
        database_url: None,
        lease: None,
    };
    let mut it = std::env::args_os().skip(1);
    while let Some(arg) = it.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("not UTF-8: {}", a.to_string_lossy()))?;
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().and_then(|v| v.into_string().ok()))
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--job" => return Ok(Parsed::Job),
            "-h" | "--help" => return Ok(Parsed::Help),
            "-v" | "--verbose" => args.verbose = true,
            "--defaults" => args.defaults = true,
            "--database-url" => args.database_url = Some(value("--database-url")?),
            "--lease" => args.lease = Some(PathBuf::from(value("--lease")?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Parsed::Demo(args))
}

fn main() -> ExitCode {
    let code = match parse_args() {
        Ok(Parsed::Job) => job(),
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            0
        }
        Ok(Parsed::Demo(args)) => demo(args),
        Err(e) => {
            eprintln!("demo: error: {e} (see --help)");
            2
        }
    };
    let _ = std::io::stdout().flush();
    ExitCode::from(code)
}

fn demo(args: Args) -> u8 {
    catch_stop_signals();
    let job_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fail(&format!("cannot find this executable: {e}")),
    };
    let lease = match args.lease.clone() {
        Some(p) => p,
        None => match lease_binary() {
            Ok(p) => p,
            Err(e) => return fail(&e),
        },
    };
    show::main(&args, &lease, &job_exe)
}

/// Prints `demo: error: MESSAGE` (redacted) and returns 1.
fn fail(message: &str) -> u8 {
    eprintln!("demo: error: {}", redact(message));
    1
}

/// The configured password, never printed (see [`redact`]).
static SECRET: OnceLock<String> = OnceLock::new();

/// Registers the password of the configured database.
fn add_secret(secret: &str) {
    // Shorter ones would garble every line; the password is never formatted into a line in
    // the first place (redaction is the second line of defence, as in `lease` itself).
    if secret.len() >= 3 {
        let _ = SECRET.set(secret.to_owned());
    }
}

/// `text` with the registered password replaced by `***`.
fn redact(text: &str) -> String {
    match SECRET.get() {
        Some(s) => text.replace(s.as_str(), "***"),
        None => text.to_owned(),
    }
}

/// Builds lease-cli's `lease` with the profile this binary was built with, next to it
/// (`cargo run --bin demo` builds only `demo`), and returns its path.
fn lease_binary() -> Result<PathBuf, String> {
    println!("building `lease` (cargo build -p lease-cli --bin lease) ...");
    lease_bench::build_sibling("lease-cli", "lease", &[])
        .map_err(|e| format!("{e} (or pass --lease PATH)"))
}

/// The demo job (`demo --job`, run by `lease run`): prints `demo-worker token=T pid=P
/// started`, then `demo-worker token=T seq=N` every 100 ms, and `demo-worker token=T
/// stopping` on SIGTERM or SIGINT, then exits 0.
fn job() -> u8 {
    catch_stop_signals();
    let token = std::env::var("LEASE_TOKEN").unwrap_or_else(|_| "?".to_owned());
    let pid = std::process::id();
    let mut out = std::io::stdout();
    if writeln!(out, "demo-worker token={token} pid={pid} started").is_err() {
        return 1;
    }
    let mut seq = 0u64;
    loop {
        let mut slept = Duration::ZERO;
        while slept < BEAT && !stopped() {
            std::thread::sleep(Duration::from_millis(5));
            slept += Duration::from_millis(5);
        }
        if stopped() {
            let _ = writeln!(out, "demo-worker token={token} stopping");
            return 0;
        }
        seq += 1;
        if writeln!(out, "demo-worker token={token} seq={seq}").is_err() {
            return 1;
        }
    }
}
