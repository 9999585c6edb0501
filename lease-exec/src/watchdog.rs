//! The watchdog's side: the process the runner re-executes, which starts
//! the command, reaps its tree, and kills the tree at the deadline or when
//! the runner is gone (the crate docs describe the protocol).

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use crate::cgroup::{self, Leaf};
use crate::clock;
use crate::protocol::{Args, PARENT_DEATH_SIGNAL, SUBCOMMAND};
use crate::tree::{subreaper, Tree};

/// Runs the watchdog if this process was started as one (its first
/// argument is [`SUBCOMMAND`]), and then exits with its status (0 after the
/// runner's `done`, 1 when the runner is gone or misbehaved, 2 for bad
/// arguments); returns at once otherwise.
///
/// Call it first in `main`, before any thread or async runtime starts and
/// before the arguments are parsed: every binary that starts a
/// [`Watchdog`](crate::Watchdog) re-executes itself as its watchdog. A test
/// that starts one needs a test target with `harness = false` whose `main`
/// calls it (as this crate's `tests/watchdog.rs`): the default test harness
/// would run the tests instead.
/// `setup_log` is called first with the runner's
/// [`Command::watchdog_log`](crate::Command::watchdog_log) (empty if
/// none), to install a `tracing` subscriber: the watchdog's warnings (a
/// deadline kill, a vanished runner) are `tracing` events.
pub fn maybe_run_watchdog(setup_log: impl FnOnce(&str)) {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == SUBCOMMAND) {
        let code = watchdog_main(args, setup_log);
        std::process::exit(code);
    }
}

/// The watchdog: `args` are its arguments after [`SUBCOMMAND`]; returns
/// its exit status, as [`maybe_run_watchdog`] describes, once the runner
/// said `done` or is gone. For a binary that dispatches its subcommands
/// itself; the same conditions apply (a single thread, no runtime).
pub fn watchdog_main<I>(args: I, setup_log: impl FnOnce(&str)) -> i32
where
    I: IntoIterator<Item = OsString>,
{
    let args = match Args::parse(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{SUBCOMMAND}: {e}");
            return 2;
        }
    };
    setup_log(&args.log);
    let stdin = inherited(args.stdin_fd);
    let stdout = inherited(args.stdout_fd);
    let unblocked = match install_signals(args.parent) {
        Ok(mask) => mask,
        Err(e) => {
            tracing::error!("watchdog: cannot install its signal handlers: {e}");
            return 1;
        }
    };
    if let Err(e) = subreaper() {
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
        let now = clock::now();
        if let Some(deadline) = watch.deadline.filter(|&d| now >= d) {
            let killed = watch.fire();
            let late_us = Duration::from_nanos(now - deadline).as_micros() as u64;
            let pgid = watch.pgid.unwrap_or(0);
            // Said after the kill, which must not wait for a line.
            match (&watch.lost, killed) {
                (Some(reason), true) => tracing::info!(
                    pgid,
                    late_us,
                    "watchdog: the lease was lost ({reason}), as the runner reported; the \
                     command's tree had not stopped by the kill deadline the runner set: \
                     SIGKILL to it"
                ),
                (None, true) => tracing::warn!(
                    pgid,
                    late_us,
                    "watchdog: the runner did not renew the deadline and reported no loss \
                     (it is stopped, frozen or starved; the lease may be handed over now): \
                     SIGKILL to the command's tree"
                ),
                // The command had exited and left nothing: a runner that
                // reported its loss has nothing to hear; one that is late
                // (frozen) is worth a line, not a warning.
                (Some(_), false) => {}
                (None, false) => tracing::info!(
                    pgid,
                    late_us,
                    "watchdog: the runner did not renew the deadline and reported no loss; the \
                     command had exited and left nothing to kill"
                ),
            }
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
                    let io = (stdin.as_ref(), stdout.as_ref());
                    let mut leaf = if args.no_cgroup { None } else { Leaf::create() };
                    let mut spawned = spawn_command(&args.command, io, leaf.as_ref());
                    if spawned.is_err() && leaf.is_some() {
                        // Perhaps the move into the leaf failed: without it.
                        leaf = None;
                        spawned = spawn_command(&args.command, io, None);
                    }
                    match spawned {
                        Ok(pid) => {
                            match &leaf {
                                Some(l) => report(&format!("started {pid} {}", l.dir().display())),
                                None => report(&format!("started {pid}")),
                            }
                            watch.started(pid, at, leaf);
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

/// The group to kill from the parent-death signal handler (0: none yet).
static PGID: AtomicI32 = AtomicI32::new(0);
/// The runner's pid: the handler acts only once the parent has changed.
static PARENT: AtomicI32 = AtomicI32::new(0);

/// SIGKILL to group `pgid` (never a pid <= 1); whether the group had a
/// member (a zombie counts).
fn kill_group(pgid: i32) -> bool {
    // SAFETY: kill has no memory-safety preconditions; -pgid names the
    // command's process group.
    pgid > 1 && unsafe { libc::kill(-pgid, libc::SIGKILL) } == 0
}

extern "C" fn on_parent_death(_: libc::c_int) {
    // Only async-signal-safe calls here: getppid, kill. A stray signal while
    // the runner lives is ignored. The group is killed here at once; the
    // main loop, woken by the signal, sees the parent gone and kills the
    // rest of the command's tree (what left the group: the cgroup leaf and
    // the walk of /proc).
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
    /// The command's cgroup leaf, if one could be made.
    leaf: Option<Leaf>,
    /// The runner reported its lease lost, for this reason (`lost REASON`):
    /// a deadline from then on is a kill it chose, not a renewal it missed.
    lost: Option<String>,
}

/// One line to the runner (it may be gone: then nothing happens).
fn report(line: &str) {
    let mut out = io::stdout();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

impl Watch {
    /// Applies one line from the runner. `Err` for a malformed one.
    fn apply(&mut self, line: &str) -> Result<Step, String> {
        if let Some(reason) = line
            .strip_prefix("lost")
            .filter(|r| r.is_empty() || r.starts_with(' '))
        {
            self.lost = Some(reason.trim().to_owned());
            return Ok(Step::Continue);
        }
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

    /// The command runs as `pid` (its own group, and `leaf` if any), armed
    /// with `at`.
    fn started(&mut self, pid: i32, at: u64, leaf: Option<Leaf>) {
        self.child = Some(pid);
        self.leaf = leaf;
        self.pgid = Some(pid);
        PGID.store(pid, Ordering::SeqCst);
        self.deadline = Some(at);
    }

    /// Kills the group and the rest of the command's tree (the group once:
    /// it stays empty afterwards) and forgets the deadline. Whether there was
    /// anything to kill: the command had not been reaped, its group had a
    /// member, or the walk found a live process.
    fn fire(&mut self) -> bool {
        self.deadline = None;
        let mut found = self.child.is_some() && !self.reported;
        if !self.fired {
            if let Some(pgid) = self.pgid {
                found |= kill_group(pgid);
            }
        }
        self.fired = true;
        found | self.kill_tree()
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

    /// SIGKILL to the command's cgroup leaf (if any: the kernel kills every
    /// member, forks included) and to every descendant of the watchdog,
    /// frozen first, until none is left ([`Tree::kill`]). The watchdog is a
    /// subreaper: whatever of the command's tree lost its parent is its
    /// child now, so the walk from it down finds the whole tree, and a
    /// frozen process cannot fork.
    /// Whether the walk found a live process.
    fn kill_tree(&mut self) -> bool {
        if let Some(leaf) = &self.leaf {
            cgroup::kill(leaf.dir());
        }
        let found = Tree::own().kill(&mut || self.reap());
        self.reap();
        found
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

/// Starts the command (`argv`: the program, then its arguments): in `leaf`
/// if any, its own process group, SIGKILL when the watchdog dies (`PR_SET_PDEATHSIG`), the
/// default disposition of the signals the watchdog ignores, the runner's
/// stdin and stdout (else /dev/null: never the watchdog's pipes) and
/// stderr. Its pid.
fn spawn_command(
    argv: &[OsString],
    (stdin, stdout): (Option<&OwnedFd>, Option<&OwnedFd>),
    leaf: Option<&Leaf>,
) -> io::Result<i32> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).process_group(0);
    let stdio = |fd: Option<&OwnedFd>| -> io::Result<Stdio> {
        Ok(match fd {
            Some(fd) => Stdio::from(fd.try_clone()?),
            None => Stdio::null(),
        })
    };
    cmd.stdin(stdio(stdin)?).stdout(stdio(stdout)?);
    let parent = std::process::id() as libc::pid_t;
    let procs = leaf.map(Leaf::procs_fd);
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe calls (write, signal, prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            // Into the leaf first: whatever it starts is in it too.
            if let Some(procs) = procs {
                cgroup::join(procs)?;
            }
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
        assert_eq!(w.lost, None);
        assert_eq!(w.apply("lost session ended: x"), Ok(Step::Continue));
        assert_eq!(w.lost.as_deref(), Some("session ended: x"));
        assert!(w.apply("lostness").is_err());
        assert_eq!(w.apply("done"), Ok(Step::Exit));
        let mut fresh = Watch::default();
        assert_eq!(fresh.apply("spawn 7000"), Ok(Step::Spawn(7000)));
        assert!(fresh.apply("spawn soon").is_err());
        assert!(w.apply("spawn 7000").is_err(), "a second command");
        assert!(w.apply("reboot").is_err());
        assert!(w.apply("").is_err());
    }
}
