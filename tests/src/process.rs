//! Child processes ("replicas") whose output is timestamped line by line, plus small
//! process helpers.

use crate::{io_err, KitError};
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock behind [`Instant`] on Linux.
///
/// It is shared by every process on the machine, so a child that prints its own
/// `CLOCK_MONOTONIC` readings (from any language) can be put on one timeline with the test's
/// readings and with [`Line::mono_nanos`]. Differences are meaningful; absolute values are
/// not (they count from boot).
pub fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Variables that cargo sets for the program it runs (`cargo run`, `cargo test`), by
/// name or prefix. A `cargo` started by that program must not inherit them: build
/// scripts that watch them (`cargo:rerun-if-env-changed`; ring's watches
/// `CARGO_MANIFEST_DIR` and `CARGO_PKG_*`) would see them changed and rebuild, with
/// every crate above them, and so invalidate the next build of the workspace.
const SET_BY_CARGO: [&str; 8] = [
    "CARGO_MANIFEST_",
    "CARGO_PKG_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// Whether cargo set the variable `name` for the program it runs.
pub fn set_by_cargo(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    SET_BY_CARGO.iter().any(|p| name.starts_with(p))
}

/// A `cargo` command (`$CARGO`, else `cargo` on the PATH) without the variables cargo
/// set for this program ([`set_by_cargo`]).
pub fn nested_cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        if set_by_cargo(&name) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Whether process `pid` exists and is not a zombie.
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists and may be signalled.
    let exists = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// State letter and parent pid of `pid`, from `/proc/PID/stat`.
pub(crate) fn stat(pid: i32) -> Option<(char, i32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: skip to the last ')'.
    let mut fields = text[text.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Pids of the current children of `parent`.
pub(crate) fn children(parent: i32) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| stat(pid).is_some_and(|(_, ppid)| ppid == parent))
        .collect()
}

/// Sends `sig` to `pid` (a negative pid means a process group); `Err` if it was not sent.
pub(crate) fn signal(pid: i32, sig: libc::c_int) -> std::io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions; callers only pass pids they own.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Which output stream a [`Line`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The child's standard output.
    Stdout,
    /// The child's standard error.
    Stderr,
}

/// One line of a child's output, stamped when the kit read it.
#[derive(Clone, Debug)]
pub struct Line {
    /// When the line arrived.
    pub at: Instant,
    /// The same moment as [`monotonic_nanos`].
    pub mono_nanos: u64,
    /// Where it came from.
    pub stream: Stream,
    /// The line without its newline (invalid UTF-8 replaced).
    pub text: String,
}

#[derive(Default)]
struct Log {
    lines: Vec<Line>,
    /// Output streams not yet at end of file.
    open: usize,
}

#[derive(Default)]
struct Shared {
    log: Mutex<Log>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A child process run by a test, with its stdout and stderr collected line by line.
///
/// The child is the leader of its own process group and every signal goes to the whole
/// group, so wrappers such as `sh -c` or `cargo run` do not shield the real process.
/// Dropping a `Replica` continues (if stopped), kills and reaps it.
pub struct Replica {
    child: Child,
    shared: Arc<Shared>,
    status: Option<ExitStatus>,
}

impl Replica {
    /// Spawns `cmd` with stdin closed and stdout/stderr piped into the line log.
    pub fn spawn(mut cmd: Command) -> Result<Replica, KitError> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(io_err(format!("spawning {:?}", cmd.get_program())))?;
        let shared = Arc::new(Shared::default());
        start_reader(&shared, child.stdout.take(), Stream::Stdout);
        start_reader(&shared, child.stderr.take(), Stream::Stderr);
        Ok(Replica {
            child,
            shared,
            status: None,
        })
    }

    /// The child's pid (also its process group id).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// A snapshot of every line received so far, in arrival order.
    pub fn lines(&self) -> Vec<Line> {
        self.shared.lock().lines.clone()
    }

    /// Waits until a line (from either stream) satisfies `pred` and returns when it arrived
    /// and its text.
    ///
    /// Every call scans the whole log from the first line, calling `pred` exactly once per
    /// line in arrival order, so a stateful predicate can pick the n-th occurrence. Fails on
    /// timeout, or as soon as both streams are closed without a match; the error carries the
    /// last lines of stdout and stderr.
    pub fn wait_for_line(
        &self,
        mut pred: impl FnMut(&str) -> bool,
        timeout: Duration,
    ) -> Result<(Instant, String), KitError> {
        let deadline = Instant::now() + timeout;
        let mut next = 0;
        let mut log = self.shared.lock();
        loop {
            while let Some(line) = log.lines.get(next) {
                if pred(&line.text) {
                    return Ok((line.at, line.text.clone()));
                }
                next += 1;
            }
            let now = Instant::now();
            if log.open == 0 || now >= deadline {
                let context = format!(
                    "replica {} printed no matching line ({})",
                    self.pid(),
                    if log.open == 0 {
                        "its output ended".to_owned()
                    } else {
                        format!("waited {timeout:?}")
                    }
                );
                let detail = output_tails(&log.lines);
                return Err(if log.open == 0 {
                    KitError::Failed { context, detail }
                } else {
                    KitError::Timeout { context, detail }
                });
            }
            log = self
                .shared
                .changed
                .wait_timeout(log, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends SIGKILL.
    pub fn kill9(&self) -> Result<(), KitError> {
        self.signal(libc::SIGKILL, "SIGKILL")
    }

    /// Sends SIGSTOP (freezes the process, like a long GC pause or a suspended VM).
    pub fn sigstop(&self) -> Result<(), KitError> {
        self.signal(libc::SIGSTOP, "SIGSTOP")
    }

    /// Sends SIGCONT.
    pub fn sigcont(&self) -> Result<(), KitError> {
        self.signal(libc::SIGCONT, "SIGCONT")
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) -> Result<(), KitError> {
        self.signal(libc::SIGTERM, "SIGTERM")
    }

    /// Sends SIGINT.
    pub fn sigint(&self) -> Result<(), KitError> {
        self.signal(libc::SIGINT, "SIGINT")
    }

    fn signal(&self, sig: libc::c_int, name: &str) -> Result<(), KitError> {
        signal(-self.pid(), sig).map_err(io_err(format!(
            "sending {name} to replica process group {}",
            self.pid()
        )))
    }

    /// Waits up to `timeout` for the child to exit and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, KitError> {
        let start = Instant::now();
        let status = crate::poll(timeout, || {
            self.try_status()
                .map_err(io_err(format!("waiting for replica {}", self.pid())))
        })?;
        let status = status.ok_or_else(|| KitError::Timeout {
            context: format!("replica {} did not exit within {timeout:?}", self.pid()),
            detail: output_tails(&self.shared.lock().lines),
        })?;
        // Its last lines: read to the end of its output (the readers lag the
        // exit; a test once read a replica's lines without its last), unless
        // a process it left behind holds the pipes open.
        let until = start + timeout.max(Duration::from_secs(1));
        let mut log = self.shared.lock();
        while log.open > 0 {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                break;
            };
            log = (self.shared.changed.wait_timeout(log, left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(status)
    }

    /// Whether the child has not exited yet (a stopped child is alive).
    pub fn is_alive(&mut self) -> bool {
        matches!(self.try_status(), Ok(None))
    }

    fn try_status(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = signal(-self.pid(), libc::SIGCONT);
        let _ = signal(-self.pid(), libc::SIGKILL);
        if self.status.is_none() {
            let _ = self.child.wait();
        }
    }
}

fn start_reader(shared: &Arc<Shared>, pipe: Option<impl Read + Send + 'static>, stream: Stream) {
    if let Some(pipe) = pipe {
        shared.lock().open += 1;
        let shared = Arc::clone(shared);
        thread::spawn(move || read_lines(pipe, stream, &shared));
    }
}

fn read_lines(pipe: impl Read, stream: Stream, shared: &Shared) {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&buf);
                let line = Line {
                    at: Instant::now(),
                    mono_nanos: monotonic_nanos(),
                    stream,
                    text: text.trim_end_matches(['\n', '\r']).to_owned(),
                };
                shared.lock().lines.push(line);
                shared.changed.notify_all();
            }
        }
    }
    shared.lock().open -= 1;
    shared.changed.notify_all();
}

fn output_tails(lines: &[Line]) -> String {
    let last = |stream| {
        let mut picked: Vec<&str> = lines
            .iter()
            .rev()
            .filter(|l| l.stream == stream)
            .take(20)
            .map(|l| l.text.as_str())
            .collect();
        picked.reverse();
        picked.join("\n")
    };
    format!(
        "--- last stdout lines ---\n{}\n--- last stderr lines ---\n{}",
        last(Stream::Stdout),
        last(Stream::Stderr)
    )
}

#[cfg(test)]
mod cargo_tests {
    use super::set_by_cargo;

    #[test]
    fn only_what_cargo_sets_for_its_program_is_dropped() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_BIN_NAME",
            "OUT_DIR",
        ] {
            assert!(set_by_cargo(name.as_ref()), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
        ] {
            assert!(!set_by_cargo(name.as_ref()), "{name}");
        }
    }
}
