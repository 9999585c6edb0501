//! The runner's side: the command to run, and the watchdog that starts it
//! and holds its deadline.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

use crate::cgroup::leaf_name;
use crate::clock::monotonic_nanos;
use crate::error::Error;
use crate::job::Job;
use crate::protocol::{Args, PARENT_DEATH_SIGNAL, SUBCOMMAND};
use crate::tree::WatchdogPid;

/// How long the runner waits for the watchdog's `ready`, and for its answer
/// to `spawn`.
const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the runner waits for the watchdog to exit after `done`.
const EXIT_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest reason [`Watchdog::lost`] passes on, in bytes: its line stays
/// far below `PIPE_BUF` (one atomic write) and the watchdog's line limit.
const LOST_REASON_MAX: usize = 1000;

/// A command to run under a [`Watchdog`]: a program (looked up in `PATH`
/// unless it contains a `/`, as `execvp` does; no shell), its arguments and
/// the variables added to the runner's environment.
///
/// It gets the runner's stdin, stdout and stderr, a process group of its
/// own, the default disposition of SIGTERM, SIGINT and SIGHUP, and SIGKILL
/// from the kernel when its watchdog dies.
#[derive(Debug, Clone)]
pub struct Command {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    log: String,
    cgroup: bool,
}

impl Command {
    /// The command `program`, without arguments.
    pub fn new(program: impl Into<OsString>) -> Command {
        Command {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            log: String::new(),
            cgroup: true,
        }
    }

    /// Adds an argument.
    pub fn arg(&mut self, arg: impl Into<OsString>) -> &mut Command {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I>(&mut self, args: I) -> &mut Command
    where
        I: IntoIterator,
        I::Item: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the command (and its watchdog).
    pub fn env(&mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> &mut Command {
        self.env.push((key.into(), value.into()));
        self
    }

    /// A string for the embedding binary's log setup in the watchdog: what
    /// [`maybe_run_watchdog`](crate::maybe_run_watchdog)'s `setup_log` gets
    /// (empty unless set). The `lease` command passes its `--quiet` and
    /// `--log-format` this way. At most a few hundred bytes, no `\0`.
    pub fn watchdog_log(&mut self, config: impl Into<String>) -> &mut Command {
        self.log = config.into();
        self
    }

    /// Whether the watchdog puts the command in a cgroup v2 leaf of its own
    /// where it can make one (default `true`): a kill is then also one write
    /// to the leaf's `cgroup.kill`. `false`: the tree walk alone, as where
    /// no cgroup can be made. The crate docs' "The tree" says which applies
    /// when.
    pub fn cgroup(&mut self, try_one: bool) -> &mut Command {
        self.cgroup = try_one;
        self
    }

    /// The program.
    pub fn get_program(&self) -> &OsStr {
        &self.program
    }

    /// The arguments.
    pub fn get_args(&self) -> impl ExactSizeIterator<Item = &OsStr> {
        self.args.iter().map(OsString::as_os_str)
    }
}

/// A running watchdog, seen from the runner: started with
/// [`Watchdog::start`], it starts the command ([`Watchdog::spawn`]) and
/// kills the command's tree at the deadline unless [`Watchdog::arm`]
/// moves it first.
///
/// Dropping it closes its pipe: the watchdog kills the command's tree at
/// once and exits. Call [`Watchdog::finish`] once the tree is gone.
#[must_use = "dropping a Watchdog has it kill the command's tree at once"]
#[derive(Debug)]
pub struct Watchdog {
    child: tokio::process::Child,
    /// The watchdog's pid.
    pid: u32,
    /// The write end of the watchdog's stdin, non-blocking.
    pipe: File,
    /// The watchdog's stdout, until [`Watchdog::spawn`] hands it to the job.
    reports: Option<Lines<BufReader<ChildStdout>>>,
    /// The command's group, once spawned.
    pgid: Option<i32>,
    /// Its entry among the runner's watchdogs, until it is reaped.
    _entry: Option<WatchdogPid>,
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
    /// Starts a watchdog for `command` (this executable re-executed with
    /// [`SUBCOMMAND`](crate::SUBCOMMAND), in a process group of its own) and
    /// waits for its `ready`. The command is not started yet: see
    /// [`Watchdog::spawn`].
    ///
    /// Needs a tokio runtime with its IO and time drivers. The watchdog's
    /// parent-death signal is tied to the thread that calls this: call it
    /// from one that lives as long as the process (a current-thread
    /// runtime's thread, or a multi-thread runtime's worker in a runtime
    /// that lives as long), never from `spawn_blocking`.
    ///
    /// # Errors
    /// [`Error::Start`] if it cannot be started or does not say `ready`
    /// within 5 s.
    ///
    /// # Cancel safety
    /// Cancel-safe: a watchdog cancelled before its `ready` sees its pipe
    /// close and exits; nothing was started.
    pub async fn start(command: &Command) -> Result<Watchdog, Error> {
        let stdin = dup_for_command(0);
        let stdout = dup_for_command(1);
        let fds: Vec<i32> = [&stdin, &stdout]
            .into_iter()
            .flatten()
            .map(AsRawFd::as_raw_fd)
            .collect();
        let parent = std::process::id() as libc::pid_t;
        let args = Args {
            parent,
            log: command.log.clone(),
            stdin_fd: stdin.as_ref().map(AsRawFd::as_raw_fd),
            stdout_fd: stdout.as_ref().map(AsRawFd::as_raw_fd),
            no_cgroup: !command.cgroup,
            command: std::iter::once(command.program.clone())
                .chain(command.args.iter().cloned())
                .collect(),
        };
        let arg0 = std::env::args_os()
            .next()
            .unwrap_or_else(|| "watchdog".into());
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        cmd.arg0(arg0)
            .arg(SUBCOMMAND)
            .args(args.to_argv())
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(false);
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe calls (prctl, getppid, fcntl); it
        // allocates nothing.
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
        let mut child = spawned.map_err(Error::Start)?;
        let pid = child.id().unwrap_or(0);
        let entry = i32::try_from(pid).ok().map(WatchdogPid::new);
        let broken = || Error::Start(io::Error::new(io::ErrorKind::BrokenPipe, "no pipe"));
        let stdin = child.stdin.take().ok_or_else(broken)?;
        let stdout = child.stdout.take().ok_or_else(broken)?;
        let pipe = File::from(stdin.into_owned_fd().map_err(Error::Start)?);
        set_nonblocking(&pipe).map_err(Error::Start)?;
        let mut reports = BufReader::new(stdout).lines();
        let not_ready = match tokio::time::timeout(READY_TIMEOUT, reports.next_line()).await {
            Ok(Ok(Some(line))) if line.trim() == "ready" => None,
            Ok(Ok(line)) => Some(io::Error::other(format!(
                "it said {:?} instead of ready",
                line.unwrap_or_default()
            ))),
            Ok(Err(e)) => Some(e),
            Err(_) => Some(io::Error::new(
                io::ErrorKind::TimedOut,
                "it did not get ready in time",
            )),
        };
        if let Some(e) = not_ready {
            let _ = child.start_kill();
            return Err(Error::Start(e));
        }
        Ok(Watchdog {
            child,
            pid,
            pipe,
            reports: Some(reports),
            pgid: None,
            _entry: entry,
        })
    }

    /// Has the watchdog start the command, armed with `deadline`: the
    /// command's tree is killed then unless [`Watchdog::arm`] moves it.
    ///
    /// # Errors
    /// [`Error::Spawn`]: the command's spawn error (not found, permission
    /// denied, ...). [`Error::Lost`]: the watchdog does not answer within
    /// 5 s. [`Error::Misuse`]: a second call.
    ///
    /// # Cancel safety
    /// Not cancel-safe: cancelled after the request went out, the command
    /// may run without a [`Job`]; drop the watchdog then (it kills it).
    pub async fn spawn(&mut self, deadline: Instant) -> Result<Job, Error> {
        if self.reports.is_none() {
            return Err(Error::Misuse("the command was started already"));
        }
        let at = monotonic_nanos(deadline);
        self.send(&format!("spawn {at}\n"))?;
        let Some(mut reports) = self.reports.take() else {
            return Err(Error::Misuse("the command was started already"));
        };
        let line = match tokio::time::timeout(READY_TIMEOUT, reports.next_line()).await {
            Ok(line) => line.map_err(Error::Lost)?.unwrap_or_default(),
            Err(_) => {
                return Err(Error::Lost(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "it did not start the command in time",
                )))
            }
        };
        let mut words = line.splitn(3, ' ');
        match (
            words.next(),
            words.next().and_then(|w| w.trim().parse::<i32>().ok()),
        ) {
            (Some("started"), Some(pid)) if pid > 1 => {
                self.pgid = Some(pid);
                let watchdog = i32::try_from(self.pid).unwrap_or(0);
                // The command's cgroup leaf, if the watchdog made one: only
                // the watchdog's own leaf name is taken.
                let leaf = words
                    .next()
                    .map(PathBuf::from)
                    .filter(|dir| dir.file_name() == Some(leaf_name(watchdog).as_ref()));
                Ok(Job::new(pid, watchdog, leaf, reports))
            }
            (Some("failed"), Some(errno)) => Err(Error::Spawn(io::Error::from_raw_os_error(errno))),
            _ => Err(Error::Lost(io::Error::other(format!(
                "it said {line:?} instead of started"
            )))),
        }
    }

    /// The watchdog's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Moves the kill deadline of the spawned command's tree to `deadline`
    /// (earlier or later); it is killed then unless moved again.
    ///
    /// # Errors
    /// [`Error::Lost`] if the watchdog is gone or its pipe is full (it is
    /// not reading); [`Error::Misuse`] before [`Watchdog::spawn`].
    pub fn arm(&self, deadline: Instant) -> Result<(), Error> {
        let pgid = self
            .pgid
            .ok_or(Error::Misuse("no command to arm for: spawn first"))?;
        let at = monotonic_nanos(deadline);
        self.send(&format!("arm {pgid} {at}\n"))
    }

    /// No deadline any more, until the next [`Watchdog::arm`]: the tree is
    /// killed only if the runner dies or closes the pipe (for a graceful
    /// stop with a grace of the runner's own).
    ///
    /// # Errors
    /// As [`Watchdog::arm`].
    pub fn disarm(&self) -> Result<(), Error> {
        if self.pgid.is_none() {
            return Err(Error::Misuse("no command to disarm: spawn first"));
        }
        self.send("disarm\n")
    }

    /// The lease the command runs under is lost, for `reason` (what the
    /// runner's own log says, such as "session ended: terminating connection
    /// due to administrator command"): the deadline in force, and any that
    /// [`Watchdog::arm`] sets later, is a kill the runner chose, not a
    /// renewal it missed. The watchdog's line at that deadline then names the
    /// loss and `reason` (an INFO: the runner has warned), where it would
    /// otherwise warn that the runner stopped renewing (frozen, starved).
    /// Call it before arming the kill deadline of the loss. Control
    /// characters in `reason` become spaces; it is cut at 1,000 bytes.
    ///
    /// # Errors
    /// As [`Watchdog::arm`].
    pub fn lost(&self, reason: &str) -> Result<(), Error> {
        if self.pgid.is_none() {
            return Err(Error::Misuse(
                "no command to report a loss for: spawn first",
            ));
        }
        let mut reason: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if reason.len() > LOST_REASON_MAX {
            let mut end = LOST_REASON_MAX;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason.truncate(end);
        }
        self.send(&format!("lost {reason}\n"))
    }

    /// The tree is gone (or was never started): tells the watchdog to exit
    /// without killing anything, and reaps it (killing it if it has not
    /// exited within 1 s). Problems are logged (`tracing`), not returned.
    ///
    /// # Cancel safety
    /// Cancel-safe: the watchdog has been told, and exits by itself.
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
    fn send(&self, line: &str) -> Result<(), Error> {
        let n = (&self.pipe).write(line.as_bytes()).map_err(Error::Lost)?;
        if n != line.len() {
            return Err(Error::Lost(io::Error::new(
                io::ErrorKind::WriteZero,
                "short write to the watchdog",
            )));
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
