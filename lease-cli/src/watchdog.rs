//! The watchdog: a small process that starts the command and kills its
//! whole tree when the runner stops renewing its kill deadline or dies, so
//! that a frozen, starved, deadlocked or killed `lease run` cannot extend its
//! command's life past the moment the server may hand the lease to another
//! replica.
//!
//! # Protocol
//! For each command it starts, the runner first starts a watchdog: the same
//! `lease` binary re-executed (`/proc/self/exe`) with the hidden subcommand
//! [`SUBCOMMAND`] and the command after `--`, in a process group of its own
//! (not the runner's, so that a SIGSTOP of the runner's group does not stop
//! it), with `PR_SET_PDEATHSIG` set to [`PARENT_DEATH_SIGNAL`], the runner's
//! stdin and stdout passed as extra descriptors for the command, and the
//! command's `LEASE_*` variables in its environment. It makes itself a
//! subreaper (`PR_SET_CHILD_SUBREAPER`) and says `ready` on its stdout. The
//! runner then writes lines to the watchdog's stdin:
//!
//! - `spawn DEADLINE`: start the command (see [`crate::child`]) in its own
//!   process group and SIGKILL its tree when `CLOCK_MONOTONIC` reaches
//!   DEADLINE (nanoseconds; that clock is system-wide, so both processes
//!   agree on it). Answered `started PID` or `failed ERRNO` on stdout.
//! - `arm PGID DEADLINE`: watch process group PGID (always the same one, the
//!   command's) and kill at DEADLINE instead. Sent each time the lease's kill
//!   deadline moves (each heartbeat); a later `arm` replaces the deadline.
//! - `disarm`: no deadline any more (a graceful stop: the key is held until
//!   the command exits, and the runner's own `--grace` applies).
//! - `done`: the tree is gone; exit without killing anything.
//!
//! The watchdog reaps the command and every orphan of its tree, and reports
//! the command's exit as `exited STATUS` (the raw wait status) on stdout.
//!
//! End of file on stdin (the runner died, however), the parent-death signal,
//! or a new parent kill the tree at once, armed or not: nothing else would
//! stop it. A malformed line does too (the runner is not what it should be).
//! A kill is SIGKILL to the command's group, then to every descendant of the
//! watchdog until none is left (the subreaper gets every orphan of the tree,
//! whatever group or session it moved to). After a deadline kill the
//! watchdog waits for `done` or end of file and exits.
//!
//! The watchdog ignores SIGTERM, SIGINT and SIGHUP (a `systemctl stop` that
//! signals every process of the unit must leave the runner's graceful stop to
//! the runner; the command gets their default disposition back) and exits
//! when its runner does, after the tree; it never outlives it.
//!
//! # Limits
//! A process group id can be reused once every member is gone: the runner
//! sends `done` as soon as it has seen the tree empty, and the watchdog
//! kills only before that. A watchdog frozen together with its runner (a
//! cgroup freeze, a VM pause) cannot act either: see docs/fencing.md. Killing both
//! the runner and the watchdog with SIGKILL leaves the command's escaped
//! descendants (not its group: the command dies with the watchdog) to init.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

use crate::args::{LogFormat, WatchdogArgs};
use crate::child::{self, ChildSpec, Job};

/// The hidden subcommand that runs the watchdog.
pub const SUBCOMMAND: &str = "__watchdog";

/// Sent to the watchdog by the kernel when the runner's thread that started
/// it exits (`PR_SET_PDEATHSIG`): kill the group at once.
pub const PARENT_DEATH_SIGNAL: libc::c_int = libc::SIGUSR1;

/// How long the runner waits for the watchdog's `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the runner waits for the watchdog to exit after `done`.
const EXIT_TIMEOUT: Duration = Duration::from_secs(1);

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// `at` on `CLOCK_MONOTONIC`, in nanoseconds. `std::time::Instant` is
/// `CLOCK_MONOTONIC` on Linux, so this only moves the origin. The clock is
/// read before the `Instant`, so any error makes the result early, never late.
pub fn instant_to_monotonic(at: Instant) -> u64 {
    let mono = monotonic_nanos();
    let now = Instant::now();
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match at.checked_duration_since(now) {
        Some(ahead) => mono.saturating_add(nanos(ahead)),
        None => mono.saturating_sub(nanos(now - at)),
    }
}

// ---- the runner's side ----------------------------------------------------

/// A running watchdog, seen from the runner.
pub struct Watchdog {
    child: tokio::process::Child,
    /// The write end of the watchdog's stdin, non-blocking.
    pipe: File,
    /// The watchdog's stdout, until [`Watchdog::spawn`] hands it to the job.
    reports: Option<Lines<BufReader<ChildStdout>>>,
    /// The group it watches, once armed.
    pgid: Option<i32>,
    /// Its entry among the runner's watchdogs, until it is reaped.
    _pid: Option<child::WatchdogPid>,
}

/// A duplicate of this process's descriptor `fd` (close-on-exec, numbered 3
/// or above), for the command; `None` if `fd` is not open.
fn dup_for_command(fd: i32) -> Option<OwnedFd> {
    // SAFETY: fcntl on a descriptor number; the result is a fresh descriptor
    // that nothing else owns.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    // SAFETY: as above.
    (new >= 0).then(|| unsafe { OwnedFd::from_raw_fd(new) })
}

impl Watchdog {
    /// Starts a watchdog for `spec` (started on [`Watchdog::spawn`], with
    /// `env` added and this process's stdin and stdout) and waits for its
    /// `ready`. Must be called from the thread that lives as long as the
    /// process (see [`crate::child`]).
    ///
    /// # Errors
    /// If it cannot be started or does not say `ready` in time.
    pub async fn start(
        quiet: bool,
        format: LogFormat,
        spec: &ChildSpec,
        env: &[(&str, String)],
    ) -> io::Result<Watchdog> {
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        let stdin = dup_for_command(0);
        let stdout = dup_for_command(1);
        let fds: Vec<i32> = [&stdin, &stdout]
            .into_iter()
            .flatten()
            .map(AsRawFd::as_raw_fd)
            .collect();
        let mut fd_args = Vec::new();
        if let Some(fd) = &stdin {
            fd_args.extend(["--stdin-fd".to_owned(), fd.as_raw_fd().to_string()]);
        }
        if let Some(fd) = &stdout {
            fd_args.extend(["--stdout-fd".to_owned(), fd.as_raw_fd().to_string()]);
        }
        let format = match format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        };
        let parent = std::process::id() as libc::pid_t;
        cmd.arg0("lease")
            .arg(SUBCOMMAND)
            .args(["--parent", &parent.to_string()])
            .args(["--log-format", format])
            .args(quiet.then_some("--quiet"))
            .args(&fd_args)
            .arg("--")
            .arg(&spec.program)
            .args(&spec.args)
            .envs(env.iter().map(|(k, v)| (OsStr::new(k), OsStr::new(v))))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(false);
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe calls (prctl, getppid); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                let sig = PARENT_DEATH_SIGNAL as libc::c_ulong;
                if libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                // The command's stdin and stdout, kept open across exec.
                for &fd in &fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        drop((stdin, stdout));
        let mut child = spawned?;
        let pid = child.id().and_then(|p| i32::try_from(p).ok());
        let pid = pid.map(child::WatchdogPid::new);
        let broken = || io::Error::new(io::ErrorKind::BrokenPipe, "no pipe to the watchdog");
        let stdin = child.stdin.take().ok_or_else(broken)?;
        let stdout = child.stdout.take().ok_or_else(broken)?;
        let pipe = File::from(stdin.into_owned_fd()?);
        set_nonblocking(&pipe)?;
        let mut reports = BufReader::new(stdout).lines();
        match tokio::time::timeout(READY_TIMEOUT, reports.next_line()).await {
            Ok(Ok(Some(line))) if line.trim() == "ready" => {}
            Ok(Ok(line)) => {
                let _ = child.start_kill();
                return Err(io::Error::other(format!(
                    "the watchdog said {:?} instead of ready",
                    line.unwrap_or_default()
                )));
            }
            Ok(Err(e)) => {
                let _ = child.start_kill();
                return Err(e);
            }
            Err(_) => {
                let _ = child.start_kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the watchdog did not get ready in time",
                ));
            }
        }
        Ok(Watchdog {
            child,
            pipe,
            reports: Some(reports),
            pgid: None,
            _pid: pid,
        })
    }

    /// Has the watchdog start the command, armed with `deadline`; the
    /// command's job once it runs.
    ///
    /// # Errors
    /// The command's spawn error (not found, permission denied, ...), or the
    /// watchdog's if it does not answer.
    pub async fn spawn(&mut self, deadline: Instant) -> io::Result<Job> {
        let at = instant_to_monotonic(deadline);
        self.send(&format!("spawn {at}\n"))?;
        let mut reports = self
            .reports
            .take()
            .ok_or_else(|| io::Error::other("the command was started already"))?;
        let line = match tokio::time::timeout(READY_TIMEOUT, reports.next_line()).await {
            Ok(line) => line?.unwrap_or_default(),
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the watchdog did not start the command in time",
                ))
            }
        };
        let mut words = line.split_ascii_whitespace();
        match (
            words.next(),
            words.next().and_then(|w| w.parse::<i32>().ok()),
        ) {
            (Some("started"), Some(pid)) if pid > 1 => {
                self.pgid = Some(pid);
                let watchdog = self.pid().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
                Ok(Job::new(pid, watchdog, reports))
            }
            (Some("failed"), Some(errno)) => Err(io::Error::from_raw_os_error(errno)),
            _ => Err(io::Error::other(format!(
                "the watchdog said {line:?} instead of started"
            ))),
        }
    }

    /// The watchdog's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Watch `pgid` and kill it at `deadline` unless renewed before.
    ///
    /// # Errors
    /// If the watchdog is gone, or its pipe is full (it is not reading).
    pub fn arm(&mut self, pgid: i32, deadline: Instant) -> io::Result<()> {
        self.pgid = Some(pgid);
        let at = instant_to_monotonic(deadline);
        self.send(&format!("arm {pgid} {at}\n"))
    }

    /// Move the deadline of the group given to [`Watchdog::arm`].
    ///
    /// # Errors
    /// As [`Watchdog::arm`]; also if not armed yet.
    pub fn extend(&mut self, deadline: Instant) -> io::Result<()> {
        let pgid = self
            .pgid
            .ok_or_else(|| io::Error::other("the watchdog is not armed"))?;
        self.arm(pgid, deadline)
    }

    /// Drop the deadline: the runner's grace applies.
    ///
    /// # Errors
    /// As [`Watchdog::arm`].
    pub fn disarm(&mut self) -> io::Result<()> {
        self.send("disarm\n")
    }

    /// The group is gone: tell the watchdog to exit, and reap it.
    pub async fn finish(mut self) {
        let _ = self.send("done\n");
        drop(self.pipe);
        match tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => tracing::warn!("the watchdog exited with {status}"),
            Ok(Err(e)) => tracing::warn!("waiting for the watchdog: {e}"),
            Err(_) => {
                tracing::warn!("the watchdog did not exit after `done`; killing it");
                let _ = self.child.kill().await;
            }
        }
    }

    /// One write of a short line: atomic on a pipe (shorter than PIPE_BUF).
    fn send(&mut self, line: &str) -> io::Result<()> {
        let n = self.pipe.write(line.as_bytes())?;
        if n != line.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short write to the watchdog",
            ));
        }
        Ok(())
    }
}

fn set_nonblocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a file descriptor we own; no pointers involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// ---- the watchdog's side --------------------------------------------------

/// The group to kill from the parent-death signal handler (0: none yet).
static PGID: AtomicI32 = AtomicI32::new(0);
/// The runner's pid: the handler acts only once the parent has changed.
static PARENT: AtomicI32 = AtomicI32::new(0);

/// SIGKILL to group `pgid` (never a pid <= 1).
fn kill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: kill has no memory-safety preconditions; -pgid names the
        // command's process group.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

extern "C" fn on_parent_death(_: libc::c_int) {
    // Only async-signal-safe calls here: getppid, kill. A stray signal while
    // the runner lives is ignored. The group is killed here at once; the
    // main loop, woken by the signal, sees the parent gone and kills the
    // rest of the command's tree (what left the group), which needs /proc.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } == PARENT.load(Ordering::SeqCst) {
        return;
    }
    kill_group(PGID.load(Ordering::SeqCst));
}

/// SIGCHLD: only wakes the main loop's `ppoll` (which alone unblocks it), to
/// reap and report.
extern "C" fn on_child(_: libc::c_int) {}

/// What the watchdog does next.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Continue,
    Exit,
    /// Start the command, armed with this deadline.
    Spawn(u64),
}

/// The watchdog's state.
#[derive(Debug, Default)]
struct Watch {
    pgid: Option<i32>,
    deadline: Option<u64>,
    fired: bool,
    /// The command, once started.
    child: Option<i32>,
    /// Its exit was reported to the runner.
    reported: bool,
}

/// One line to the runner (it may be gone: then nothing happens).
fn report(line: &str) {
    let mut out = io::stdout();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

impl Watch {
    /// Applies one line from the runner. `Err` for a malformed one.
    fn apply(&mut self, line: &str) -> Result<Step, String> {
        let mut words = line.split_ascii_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("arm"), Some(pgid), Some(at), None) => {
                let pgid = pgid
                    .parse::<i32>()
                    .ok()
                    .filter(|&p| p > 1)
                    .ok_or_else(|| format!("bad process group in {line:?}"))?;
                let at = at
                    .parse::<u64>()
                    .map_err(|_| format!("bad deadline in {line:?}"))?;
                if self.pgid.is_some_and(|p| p != pgid) {
                    return Err(format!("another process group in {line:?}"));
                }
                self.pgid = Some(pgid);
                PGID.store(pgid, Ordering::SeqCst);
                if !self.fired {
                    self.deadline = Some(at);
                }
                Ok(Step::Continue)
            }
            (Some("spawn"), Some(at), None, None) => {
                let at = at
                    .parse::<u64>()
                    .map_err(|_| format!("bad deadline in {line:?}"))?;
                if self.child.is_some() || self.pgid.is_some() || self.fired {
                    return Err(format!("a second command in {line:?}"));
                }
                Ok(Step::Spawn(at))
            }
            (Some("disarm"), None, None, None) => {
                self.deadline = None;
                Ok(Step::Continue)
            }
            (Some("done"), None, None, None) => Ok(Step::Exit),
            _ => Err(format!("unknown message {line:?}")),
        }
    }

    /// The command runs as `pid` (its own group), armed with `at`.
    fn started(&mut self, pid: i32, at: u64) {
        self.child = Some(pid);
        self.pgid = Some(pid);
        PGID.store(pid, Ordering::SeqCst);
        self.deadline = Some(at);
    }

    /// Kills the group and the rest of the command's tree (once: the tree
    /// stays empty afterwards) and forgets the deadline.
    fn fire(&mut self) {
        self.deadline = None;
        if !self.fired {
            if let Some(pgid) = self.pgid {
                kill_group(pgid);
            }
        }
        self.fired = true;
        self.kill_tree();
    }

    /// The runner died or closed the pipe: the tree is killed at once.
    fn runner_gone(&mut self) {
        if !self.fired && self.pgid.is_some() {
            tracing::warn!(
                pgid = self.pgid.unwrap_or(0),
                "watchdog: the runner is gone: SIGKILL to the command's tree"
            );
        }
        self.fire();
    }

    /// SIGKILL to every descendant of the watchdog until none is left. The
    /// watchdog is a subreaper: whatever of the command's tree lost its
    /// parent is its child now, so nothing of the tree can escape this.
    fn kill_tree(&mut self) {
        let me = std::process::id() as i32;
        let mut rounds = 0u32;
        loop {
            self.reap();
            let tree = child::descendants(me, &[], &[]);
            if tree.is_empty() {
                break;
            }
            child::signal_each(&tree, |_| true, libc::SIGKILL);
            rounds += 1;
            if rounds % 1000 == 0 {
                tracing::warn!(
                    left = tree.len(),
                    "watchdog: processes of the command's tree survive SIGKILL; still killing"
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.reap();
    }

    /// Reaps every exited child (the command, and orphans of its tree that
    /// became the watchdog's), and reports the command's exit to the runner
    /// as its raw wait status (`exited STATUS`).
    fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes the status through a valid pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if Some(pid) == self.child && !self.reported {
                self.reported = true;
                report(&format!("exited {status}"));
            }
        }
    }
}

/// The command's stdin or stdout: descriptor `fd`, inherited from the
/// runner; made close-on-exec here (the command gets it as 0 or 1).
fn inherited(fd: Option<i32>) -> Option<OwnedFd> {
    let fd = fd.filter(|&fd| fd > 2)?;
    // SAFETY: fcntl on a descriptor number.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: the runner passed this descriptor to this process alone.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Starts the command: its own process group, SIGKILL when the watchdog
/// dies (`PR_SET_PDEATHSIG`), the default disposition of the signals the
/// watchdog ignores, the runner's stdin and stdout (else /dev/null: never
/// the watchdog's pipes) and stderr. Its pid.
fn spawn_command(
    spec: Option<&ChildSpec>,
    stdin: Option<&OwnedFd>,
    stdout: Option<&OwnedFd>,
) -> io::Result<i32> {
    let spec = spec.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
    let mut cmd = std::process::Command::new(&spec.program);
    cmd.args(&spec.args).process_group(0);
    let stdio = |fd: Option<&OwnedFd>| -> io::Result<Stdio> {
        Ok(match fd {
            Some(fd) => Stdio::from(fd.try_clone()?),
            None => Stdio::null(),
        })
    };
    cmd.stdin(stdio(stdin)?).stdout(stdio(stdout)?);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe calls (signal, prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(io::Error::last_os_error());
                }
            }
            let kill = libc::SIGKILL as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, kill, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    // Not waited for through `Child`: the main loop reaps it (waitpid).
    let child = cmd.spawn()?;
    i32::try_from(child.id()).map_err(|_| io::Error::other("pid out of range"))
}

/// `lease __watchdog`: runs until `done` or the runner's death; the exit
/// status is 0 after `done`, 1 otherwise.
pub fn main(args: WatchdogArgs) -> i32 {
    crate::log::init(args.quiet, args.log_format);
    let stdin = inherited(args.stdin_fd);
    let stdout = inherited(args.stdout_fd);
    let spec = ChildSpec::new(args.command);
    let unblocked = match install_signals(args.parent) {
        Ok(mask) => mask,
        Err(e) => {
            tracing::error!("watchdog: cannot install its signal handlers: {e}");
            return 1;
        }
    };
    if let Err(e) = child::become_subreaper() {
        tracing::error!("watchdog: cannot become the subreaper of the command's tree: {e}");
        return 1;
    }
    let timer = match Timer::new() {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("watchdog: cannot create its timer: {e}");
            return 1;
        }
    };
    // Ready: the runner may have the command started.
    let mut out = io::stdout();
    if writeln!(out, "ready").and_then(|()| out.flush()).is_err() {
        return 1;
    }
    let mut watch = Watch::default();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        watch.reap();
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } != args.parent {
            watch.runner_gone();
            return 1;
        }
        let now = monotonic_nanos();
        if let Some(deadline) = watch.deadline.filter(|&d| now >= d) {
            watch.fire();
            let late = Duration::from_nanos(now - deadline);
            tracing::warn!(
                pgid = watch.pgid.unwrap_or(0),
                late_us = late.as_micros() as u64,
                "watchdog: the runner did not renew the deadline (the lease may be handed \
                 over now): SIGKILL to the command's tree"
            );
            continue;
        }
        let waited = timer
            .set(watch.deadline)
            .and_then(|()| timer.wait(&unblocked));
        match waited {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                tracing::error!("watchdog: cannot wait for the runner: {e}; killing the tree");
                watch.fire();
                return 1;
            }
        }
        let mut chunk = [0u8; 512];
        // SAFETY: read into a local buffer of the given length.
        let n = unsafe { libc::read(0, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                continue;
            }
            tracing::error!("watchdog: cannot read from the runner: {e}; killing the tree");
            watch.fire();
            return 1;
        }
        if n == 0 {
            watch.runner_gone();
            return 1;
        }
        buf.extend_from_slice(&chunk[..n as usize]);
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            match watch.apply(line.trim_end()) {
                Ok(Step::Continue) => {}
                Ok(Step::Spawn(at)) => {
                    match spawn_command(spec.as_ref(), stdin.as_ref(), stdout.as_ref()) {
                        Ok(pid) => {
                            watch.started(pid, at);
                            report(&format!("started {pid}"));
                        }
                        Err(e) => {
                            report(&format!("failed {}", e.raw_os_error().unwrap_or(libc::EIO)))
                        }
                    }
                }
                Ok(Step::Exit) => return 0,
                Err(e) => {
                    tracing::error!("watchdog: {e}; killing the tree");
                    watch.fire();
                    return 1;
                }
            }
        }
        if buf.len() > 4096 {
            tracing::error!("watchdog: overlong message; killing the tree");
            watch.fire();
            return 1;
        }
    }
}

/// The parent-death and SIGCHLD handlers; SIGTERM, SIGINT and SIGHUP
/// ignored; SIGCHLD blocked except in the main loop's wait. Returns the
/// signal mask for that wait.
fn install_signals(parent: i32) -> io::Result<libc::sigset_t> {
    PARENT.store(parent, Ordering::SeqCst);
    // SAFETY: a zeroed sigaction or sigset_t is a valid value to fill in; the
    // handlers only make async-signal-safe calls; signal() with SIG_IGN and
    // sigprocmask have no preconditions beyond valid pointers.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_parent_death as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(PARENT_DEATH_SIGNAL, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut chld: libc::sigaction = std::mem::zeroed();
        chld.sa_sigaction = on_child as extern "C" fn(libc::c_int) as usize;
        chld.sa_flags = libc::SA_NOCLDSTOP;
        libc::sigemptyset(&mut chld.sa_mask);
        if libc::sigaction(libc::SIGCHLD, &chld, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGCHLD);
        let mut old: libc::sigset_t = std::mem::zeroed();
        if libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::sigdelset(&mut old, libc::SIGCHLD);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            if libc::signal(sig, libc::SIG_IGN) == libc::SIG_ERR {
                return Err(io::Error::last_os_error());
            }
        }
        // Wake at the deadline, not up to 50 us after it (the default slack).
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        // The runner may have died before the handler was in place.
        if libc::getppid() != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(old)
    }
}

/// A `CLOCK_MONOTONIC` timerfd with an absolute expiry. It wakes the watchdog
/// at the deadline within the task's timer slack (set to 1 ns), where a poll
/// timeout would get 0.1 % of its length as slack (15 ms for a 15 s wait).
struct Timer(OwnedFd);

impl Timer {
    fn new() -> io::Result<Timer> {
        // SAFETY: timerfd_create has no memory-safety preconditions.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Timer(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Expires at `at` (`CLOCK_MONOTONIC` nanoseconds); `None` disarms.
    fn set(&self, at: Option<u64>) -> io::Result<()> {
        // 0 would disarm: the earliest real deadline is 1 ns.
        let ns = at.map_or(0, |a| a.max(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: a valid itimerspec; the old value is not asked for.
        let r = unsafe {
            libc::timerfd_settime(
                self.0.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits until stdin is readable (`true`) or the timer expired or a
    /// signal came (`false`: the caller looks at the clock again).
    fn wait(&self, mask: &libc::sigset_t) -> io::Result<bool> {
        let mut fds = [
            libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds, no timeout, a valid signal mask (SIGCHLD
        // unblocked while waiting: no wakeup is lost between reap and wait).
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, std::ptr::null(), mask) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(e);
        }
        if fds[1].revents != 0 {
            let mut expirations = 0u64;
            // SAFETY: reads the 8-byte expiration count into a local.
            unsafe { libc::read(self.0.as_raw_fd(), (&mut expirations as *mut u64).cast(), 8) };
        }
        // POLLHUP (end of file) and POLLERR also mean: read now.
        Ok(fds[0].revents != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse() {
        let mut w = Watch::default();
        assert_eq!(w.apply("arm 1234 5000"), Ok(Step::Continue));
        assert_eq!((w.pgid, w.deadline), (Some(1234), Some(5000)));
        assert_eq!(w.apply("arm 1234 6000"), Ok(Step::Continue));
        assert_eq!(w.deadline, Some(6000));
        assert!(w.apply("arm 999 6000").is_err(), "another group");
        assert!(w.apply("arm 1 6000").is_err(), "pid 1");
        assert!(w.apply("arm 1234 soon").is_err());
        assert_eq!(w.apply("disarm"), Ok(Step::Continue));
        assert_eq!(w.deadline, None);
        assert_eq!(w.apply("done"), Ok(Step::Exit));
        let mut fresh = Watch::default();
        assert_eq!(fresh.apply("spawn 7000"), Ok(Step::Spawn(7000)));
        assert!(fresh.apply("spawn soon").is_err());
        assert!(w.apply("spawn 7000").is_err(), "a second command");
        assert!(w.apply("reboot").is_err());
        assert!(w.apply("").is_err());
    }

    #[test]
    fn instants_map_onto_the_monotonic_clock() {
        let now = Instant::now();
        let mono = monotonic_nanos();
        let later = instant_to_monotonic(now + Duration::from_secs(2));
        let diff = later as i128 - (mono as i128 + 2_000_000_000);
        assert!(diff.abs() < 5_000_000, "off by {diff} ns");
        let earlier = instant_to_monotonic(now - Duration::from_millis(1));
        assert!(earlier < mono);
    }
}
