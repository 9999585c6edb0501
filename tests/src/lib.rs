//! Real-PostgreSQL test kit for `lease`.
//!
//! Everything here is blocking and runtime-free (std threads and child processes), so the
//! kit works the same from plain `#[test]`s, `#[tokio::test]`s, smol tests and benchmarks.
//! It hands out connection parameters, never clients.
//!
//! - [`Cluster`]: an ephemeral PostgreSQL server (plus hot standbys of it) with blocking
//!   admin helpers that run `psql`. The server is the system's, or the one in the directory
//!   that `LEASE_PG_BINDIR` names ([`cluster::BINDIR_VAR`]: how `.ci/run` tests every
//!   PostgreSQL version); a directory without client programs borrows the system's `psql`.
//! - [`FaultProxy`]: a loopback TCP proxy that can pass, black-hole, reset or delay traffic.
//! - [`Replica`]: a child process whose output lines are timestamped on arrival.
//! - [`PgBouncer`]: a pgbouncer in front of a [`Cluster`].
//! - [`NetNs`]: a network namespace on a veth link that can be cut like a real network.
//!
//! Failures are [`KitError`]s; a missing binary is an error that says what to install
//! (`.ci/install-deps` installs everything), never a silent skip. The admin helpers block
//! for a few milliseconds, which is fine inside async tests too.
//!
//! PostgreSQL and pgbouncer refuse to run as root; when the tests run as root the kit runs
//! them as the system user [`UNPRIVILEGED_USER`], creating it if needed.

pub mod cluster;
pub mod netns;
pub mod pgbouncer;
pub mod process;
pub mod proxy;
pub mod scenario;
pub mod tls;

pub use cluster::{Cluster, Frozen};
pub use netns::NetNs;
pub use pgbouncer::{PgBouncer, PoolMode, Settings as PgBouncerSettings};
pub use process::{monotonic_nanos, pid_alive, Line, Replica, Stream};
pub use proxy::{FaultProxy, Mode};
pub use tls::{client_config, Certs};

/// The workspace README's Rust blocks, compiled as doctests (`cargo test -p lease-tests
/// --doc`), so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The Rust blocks of the guide's pages (docs/), compiled as doctests like the README's.
#[cfg(doctest)]
pub mod guide_doctests {
    #[doc = include_str!("../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../../docs/library.md")]
    pub struct Library;
    #[doc = include_str!("../../docs/metrics.md")]
    pub struct Metrics;
    #[doc = include_str!("../../docs/schedules.md")]
    pub struct Schedules;
    #[doc = include_str!("../../docs/simulator.md")]
    pub struct Simulator;
}

use std::fmt;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The system user that runs PostgreSQL and pgbouncer when the tests run as root.
pub const UNPRIVILEGED_USER: &str = "leasetest";

/// Everything that can go wrong while setting up or driving the test environment.
///
/// `Debug` prints the same readable text as `Display` (with log tails on their own lines),
/// so that tests returning `Result<(), KitError>` fail legibly.
pub enum KitError {
    /// A required program is not installed; the message says what to install.
    Missing(String),
    /// An operating-system call failed.
    Io {
        /// What the kit was doing.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A program or server failed; `detail` carries its stderr or the tail of its log.
    Failed {
        /// What the kit was doing.
        context: String,
        /// Output or log tail that explains the failure.
        detail: String,
    },
    /// Something did not happen in time; `detail` carries the output or log tail seen so far.
    Timeout {
        /// What the kit was waiting for.
        context: String,
        /// Output or log tail that may explain the wait.
        detail: String,
    },
    /// The kit was used in a way it does not support.
    Invalid(String),
}

impl fmt::Display for KitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KitError::Missing(msg) | KitError::Invalid(msg) => f.write_str(msg),
            KitError::Io { context, source } => write!(f, "{context}: {source}"),
            KitError::Failed { context, detail } => write!(f, "{context}\n{detail}"),
            KitError::Timeout { context, detail } => write!(f, "timed out: {context}\n{detail}"),
        }
    }
}

impl fmt::Debug for KitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for KitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KitError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Builds a closure that wraps an `io::Error` with `context`, for `map_err`.
pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> KitError {
    let context = context.into();
    move |source| KitError::Io { context, source }
}

/// An error and its sources, `: `-separated (tokio-postgres puts the cause of a failed
/// connection, such as a TLS verification error, in the source).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Panics unless every `.rs` file and every directory in `dir` (a test binary's directory,
/// whose root is `main.rs` with the text `main`) is a module of that binary: a
/// `mod NAME;` line in `main`. Cargo compiles only the modules the root names, so a test
/// file without its line would silently never run.
pub fn assert_every_file_is_a_module(dir: &Path, main: &str) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.expect("a directory entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let module = match name.strip_suffix(".rs") {
            Some("main") => continue,
            Some(module) => module.to_owned(),
            None if entry.path().is_dir() => name.clone(),
            None => continue,
        };
        assert!(
            main.contains(&format!("\nmod {module};")),
            "{}: {name} is not a module of main.rs (add `mod {module};`)",
            dir.display()
        );
    }
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The last `n` lines of the file at `path`, labelled with the path.
pub(crate) fn file_tail(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => format!(
            "--- last lines of {} ---\n{}",
            path.display(),
            tail(&String::from_utf8_lossy(&bytes), n)
        ),
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}

/// User and group ids to run a server as.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunAs {
    uid: u32,
    gid: u32,
}

/// `None` when not root; otherwise the ids of [`UNPRIVILEGED_USER`], created if missing.
pub(crate) fn run_as() -> Result<Option<RunAs>, KitError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    static CACHED: Mutex<Option<RunAs>> = Mutex::new(None);
    let mut cached = CACHED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ids) = *cached {
        return Ok(Some(ids));
    }
    // Concurrent `useradd`s of one name can both "succeed" with different uids, leaving one
    // test process with a uid that no longer exists: serialize them across processes.
    let _lock = lock_file(&std::env::temp_dir().join("lease-tests-useradd.lock"))?;
    let ids = match lookup_user() {
        Ok(ids) => ids,
        Err(_) => {
            let useradd = run(
                Command::new("useradd").args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    UNPRIVILEGED_USER,
                ]),
                "useradd",
                Duration::from_secs(30),
            );
            lookup_user().map_err(|e| KitError::Failed {
                context: format!(
                    "could not create the system user {UNPRIVILEGED_USER} to run PostgreSQL \
                     and pgbouncer as (they refuse to run as root)"
                ),
                detail: format!(
                    "{}\n{e}",
                    useradd.err().map_or(String::new(), |a| a.to_string())
                ),
            })?
        }
    };
    *cached = Some(ids);
    Ok(Some(ids))
}

/// Opens (creating, never truncating or following a symlink) and exclusively locks `path`;
/// the lock is released when the returned file is dropped.
pub(crate) fn lock_file(path: &Path) -> Result<fs::File, KitError> {
    let file = fs::File::options()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    // SAFETY: flock on a file descriptor that `file` keeps open; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io_err(format!("locking {}", path.display()))(
            io::Error::last_os_error(),
        ));
    }
    Ok(file)
}

fn lookup_user() -> Result<RunAs, KitError> {
    let id = |flag: &str| -> Result<u32, KitError> {
        let out = run(
            Command::new("id").args([flag, UNPRIVILEGED_USER]),
            "id",
            Duration::from_secs(10),
        )?;
        out.parse().map_err(|_| KitError::Failed {
            context: format!("id {flag} {UNPRIVILEGED_USER} printed no number"),
            detail: out,
        })
    };
    Ok(RunAs {
        uid: id("-u")?,
        gid: id("-g")?,
    })
}

/// A `Command` for `program` that runs as `user` (if any), in `home`, with `HOME=home`.
pub(crate) fn command_as(program: &Path, user: Option<RunAs>, home: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(home).env("HOME", home).stdin(Stdio::null());
    if let Some(user) = user {
        cmd.uid(user.uid).gid(user.gid);
    }
    cmd
}

/// Runs `cmd` to completion (killing it after `timeout`) and returns its trimmed stdout;
/// a non-zero exit becomes [`KitError::Failed`] carrying stderr.
pub(crate) fn run(cmd: &mut Command, what: &str, timeout: Duration) -> Result<String, KitError> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            let program = cmd.get_program().to_string_lossy().into_owned();
            io_err(format!("could not run {what} ({program})"))(e)
        })?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(out)) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }
        Ok(Ok(out)) => Err(KitError::Failed {
            context: format!("{what} failed ({})", out.status),
            detail: tail(
                &format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                30,
            ),
        }),
        Ok(Err(e)) => Err(io_err(format!("waiting for {what}"))(e)),
        Err(_) => {
            let _ = process::signal(pid as i32, libc::SIGKILL);
            Err(KitError::Timeout {
                context: format!("{what} did not finish within {timeout:?}"),
                detail: String::new(),
            })
        }
    }
}

/// A directory under `std::env::temp_dir()`, removed with everything in it on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// Creates a fresh directory named `PREFIX-PID-COUNTER-NANOS`, owned by `owner` if given.
    pub(crate) fn new(prefix: &str, owner: Option<RunAs>) -> Result<TempDir, KitError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        create_dir(&path, owner)?;
        Ok(TempDir(path))
    }

    /// Creates the subdirectory `name`, owned by `owner` if given.
    pub(crate) fn subdir(&self, name: &str, owner: Option<RunAs>) -> Result<PathBuf, KitError> {
        let path = self.0.join(name);
        create_dir(&path, owner)?;
        Ok(path)
    }

    /// The directory's path.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn create_dir(path: &Path, owner: Option<RunAs>) -> Result<(), KitError> {
    fs::create_dir(path).map_err(io_err(format!("creating {}", path.display())))?;
    if let Some(o) = owner {
        std::os::unix::fs::chown(path, Some(o.uid), Some(o.gid)).map_err(io_err(format!(
            "chown {} to {UNPRIVILEGED_USER}",
            path.display()
        )))?;
    }
    Ok(())
}

/// A loopback port that was free a moment ago, for a server the kit starts.
///
/// Taken below the kernel's ephemeral range (32768–60999 by default), from which every
/// outgoing connection's local port comes: a port picked there (bind to port 0) can be
/// taken by a client's connection before the server binds it. Each test process walks
/// the range from its own place (its pid), so two processes rarely try the same port;
/// a server that still finds its port taken is started again on another
/// ([`bind_conflict`]).
pub(crate) fn free_port() -> Result<u16, KitError> {
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..COUNT {
        let step = NEXT.fetch_add(1, Ordering::Relaxed) as u32;
        let port = (FIRST + start.wrapping_add(step) % COUNT) as u16;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    Err(KitError::Failed {
        context: format!("no free loopback port in {FIRST}..{}", FIRST + COUNT),
        detail: String::new(),
    })
}

/// How many times the kit starts a new server on another port when its port was taken.
pub(crate) const BIND_ATTEMPTS: usize = 5;

/// Whether a server's start failed because its port was taken meanwhile (the log tail
/// of a failed start says so).
pub(crate) fn bind_conflict(error: &KitError) -> bool {
    match error {
        KitError::Failed { detail, .. } | KitError::Timeout { detail, .. } => {
            detail.contains("Address already in use")
        }
        _ => false,
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub(crate) fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Polls `check` every few milliseconds until it yields a value or `timeout` passes.
pub(crate) fn poll<T>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<Option<T>, KitError>,
) -> Result<Option<T>, KitError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check()? {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The defaults the README's table and docs/tuning.md state are the library's
/// (`lease_proto::limits`, `Options`'s methods): a changed constant fails here until the pages
/// follow it.
#[cfg(test)]
mod documented_defaults {
    use lease_proto::limits::*;
    use lease_proto::Options;
    use std::time::Duration;

    const README: &str = include_str!("../../README.md");
    const TUNING: &str = include_str!("../../docs/tuning.md");

    /// The cells of the first table row of `page` whose first cell starts with `first`.
    fn row(page: &str, first: &str) -> Vec<String> {
        let line = page
            .lines()
            .find(|l| l.starts_with(&format!("| {first}")))
            .unwrap_or_else(|| panic!("no table row starting with {first:?}"));
        line.trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_string())
            .collect()
    }

    /// A duration as the pages write it: "5 s", "20 ms".
    fn written(d: Duration) -> String {
        if d.subsec_nanos() == 0 {
            format!("{} s", d.as_secs())
        } else {
            format!("{} ms", d.as_millis())
        }
    }

    #[test]
    fn the_readme_states_the_library_defaults() {
        let o = Options::default();
        for (setting, value) in [
            ("heartbeat interval", DEFAULT_HEARTBEAT_INTERVAL),
            ("query timeout", DEFAULT_QUERY_TIMEOUT),
            ("validity", o.validity_window()),
            ("server guard", o.guard_timeout()),
            ("retry interval", DEFAULT_RETRY_INTERVAL),
            ("lock delay", DEFAULT_LOCK_DELAY),
            ("promotion hold", o.promotion_hold()),
        ] {
            assert_eq!(row(README, setting)[1], written(value), "README: {setting}");
        }
        assert!(row(README, "server guard")[0]
            .contains(&format!("{} margin", written(DEFAULT_GUARD_MARGIN))));
    }

    #[test]
    fn tuning_states_the_library_defaults_and_floors() {
        for (option, default, floor) in [
            (
                "`retry_interval`",
                DEFAULT_RETRY_INTERVAL,
                MIN_RETRY_INTERVAL,
            ),
            (
                "`heartbeat_interval`",
                DEFAULT_HEARTBEAT_INTERVAL,
                MIN_HEARTBEAT_INTERVAL,
            ),
            ("`query_timeout`", DEFAULT_QUERY_TIMEOUT, MIN_QUERY_TIMEOUT),
            ("`guard_margin`", DEFAULT_GUARD_MARGIN, MIN_GUARD_MARGIN),
            ("`lock_delay`", DEFAULT_LOCK_DELAY, MIN_LOCK_DELAY),
        ] {
            let cells = row(TUNING, option);
            assert!(
                cells[1].starts_with(&written(default)),
                "tuning.md: {option} {cells:?}"
            );
            assert!(
                cells[2].contains(&written(floor)),
                "tuning.md: {option} {cells:?}"
            );
        }
        let o = Options::default();
        for (quantity, value) in [
            ("validity window", o.validity_window()),
            ("server guard", o.guard_timeout()),
            ("promotion hold", o.promotion_hold()),
        ] {
            assert_eq!(
                row(TUNING, quantity)[2],
                written(value),
                "tuning.md: {quantity}"
            );
        }
        let kill = o.act_after_validity().expect("the guard is on by default");
        let kill_ms = (kill.as_secs_f64() * 1000.0).round();
        let cells = row(TUNING, "`lease run`'s kill deadline");
        assert!(
            cells[2].starts_with(&format!("{kill_ms} ms")),
            "tuning.md: {cells:?}"
        );
        assert!(
            row(TUNING, "`max_leases`")[1].starts_with("1,000"),
            "{DEFAULT_MAX_LEASES}"
        );
        assert_eq!(DEFAULT_MAX_LEASES, 1_000);
        assert!(row(TUNING, "`max_leases`")[2].contains("100,000") && MAX_MAX_LEASES == 100_000);
        assert!(
            row(TUNING, "`validity`")[2].contains("10 min")
                && MAX_GUARD_TIMEOUT == Duration::from_secs(600)
        );
        assert!(row(TUNING, "`heartbeat_interval`")[2]
            .contains(&format!("{MAX_HEARTBEAT_PER_QUERY_TIMEOUT} ×")));
        assert!(row(TUNING, "`role`")[1].starts_with(&format!("`Role::{:?}`", o.role)));
        assert!(row(TUNING, "`role`")[2].contains("2^32 − 2") && MAX_PRIORITY == u32::MAX - 1);
        assert_eq!(
            row(TUNING, "`server_wait`")[1],
            format!("`ServerWait::{:?}`", o.server_wait)
        );
        for (constant, value) in [
            ("`HERD_WAITERS`", HERD_WAITERS.to_string()),
            ("`WAKE_BUDGET`", WAKE_BUDGET.to_string()),
            ("`TAKE_NOTICES`", written(TAKE_NOTICES)),
            ("`MIN_WAIT`", written(MIN_WAIT)),
            ("`MAX_ASKS_PER_KEY`", MAX_ASKS_PER_KEY.to_string()),
            (
                "`CHECK_EVERY`, `CHECK_BURST`",
                format!("{}, {CHECK_BURST}", written(CHECK_EVERY)),
            ),
            (
                "`MIN_SERVER_VERSION_GUARD`, `MIN_SERVER_VERSION`",
                format!(
                    "{}, {}",
                    MIN_SERVER_VERSION_GUARD / 10_000,
                    MIN_SERVER_VERSION / 10_000
                ),
            ),
        ] {
            assert_eq!(row(TUNING, constant)[1], value, "tuning.md: {constant}");
        }
    }
}
