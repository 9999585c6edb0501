//! The watchdog alone (`lease __watchdog`, the lease-exec crate), driven over
//! its stdin by this test as `lease run` drives it: renewals keep it quiet, a
//! missed renewal kills the group at the deadline, end of file kills it at
//! once. No database. Timings are printed (`--nocapture`).

use crate::common::*;
use std::io::BufRead;
use std::io::BufReader;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::Child;
use std::process::ChildStdin;
use std::process::ChildStdout;
use std::process::Command;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::Instant;

/// `CLOCK_MONOTONIC` now, in nanoseconds (the watchdog's clock).
fn mono() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A process group to watch: `sleep 60` leading its own group, with a second
/// member (`sh -c 'sleep 60 & wait'`).
struct Group {
    child: Child,
}

impl Group {
    fn start() -> Group {
        let child = Command::new("sh")
            .args(["-c", "sleep 60 & wait"])
            .process_group(0)
            .spawn()
            .expect("spawn a process group");
        Group { child }
    }

    fn pgid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether a live (non-zombie) process is in the group.
    fn alive(&self) -> bool {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return false;
        };
        dir.flatten().any(|e| {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                return false;
            };
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.len() > 2 && f[0] != "Z" && f[2].parse::<i32>().ok() == Some(self.pgid())
        })
    }

    /// Waits until the group is empty; when (`None`: not within `limit`).
    fn wait_gone(&mut self, limit: Duration) -> Option<Instant> {
        let start = Instant::now();
        while start.elapsed() < limit {
            let _ = self.child.try_wait();
            if !self.alive() {
                return Some(Instant::now());
            }
            std::thread::sleep(MS(1));
        }
        None
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill of our own child's process group.
        unsafe { libc::kill(-self.pgid(), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A watchdog started as `lease run` starts it (own process group), once it
/// said `ready`; its stderr (its log lines) collected.
struct Dog {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Dog {
    fn start() -> Dog {
        Dog::start_with(&[])
    }

    /// With `command` to start on `spawn`.
    fn start_with(command: &[&str]) -> Dog {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lease"))
            .args(["__watchdog", "--parent", &std::process::id().to_string()])
            .arg("--")
            .args(command)
            .env_remove("LEASE_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn the watchdog");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut dog = Dog {
            child,
            stdin,
            stdout,
            stderr,
        };
        assert_eq!(dog.report(), "ready");
        dog
    }

    /// The next line the watchdog reports on its stdout.
    fn report(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read a report");
        line.trim().to_owned()
    }

    /// Its log lines so far.
    fn stderr(&self) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(line.as_bytes())
            .expect("write to the watchdog");
        stdin.flush().expect("flush");
    }

    fn arm(&mut self, pgid: i32, deadline: u64) {
        self.send(&format!("arm {pgid} {deadline}\n"));
    }

    /// Exit status within `limit`.
    fn exit(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(MS(1));
        }
        None
    }
}

impl Drop for Dog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn renewals_keep_it_quiet_and_done_exits_without_killing() {
    let mut group = Group::start();
    let mut dog = Dog::start();
    // Deadline 300 ms ahead, renewed every 100 ms for 1.5 s.
    let start = Instant::now();
    while start.elapsed() < MS(1_500) {
        dog.arm(group.pgid(), mono() + 300_000_000);
        std::thread::sleep(MS(100));
        assert!(group.alive(), "killed despite renewals");
    }
    // Disarmed: quiet past the last deadline too.
    dog.send("disarm\n");
    std::thread::sleep(MS(500));
    assert!(group.alive(), "killed while disarmed");
    dog.send("done\n");
    assert_eq!(dog.exit(MS(2_000)), Some(0), "exit status after done");
    std::thread::sleep(MS(100));
    assert!(group.alive(), "killed on done");
    assert!(group.wait_gone(MS(0)).is_none());
}

#[test]
fn no_renewal_kills_the_group_at_the_deadline() {
    let mut group = Group::start();
    let mut dog = Dog::start();
    let deadline = Instant::now() + MS(400);
    let deadline_ns = mono() + 400_000_000;
    dog.arm(group.pgid(), deadline_ns);
    let gone = group.wait_gone(MS(3_000)).expect("the group is killed");
    let late_ms = gone.checked_duration_since(deadline).map_or_else(
        || -(deadline.duration_since(gone).as_secs_f64() * 1e3),
        |d| d.as_secs_f64() * 1e3,
    );
    eprintln!("no renewal: the group was gone {late_ms:.2} ms after the deadline");
    // Seen from this test (1 ms polling), on a busy machine.
    assert!(late_ms > -2.0, "killed {late_ms:.2} ms before the deadline");
    assert!(late_ms < 50.0, "killed {late_ms:.2} ms after the deadline");
    // It waits for done (or end of file) after the kill.
    assert_eq!(dog.exit(MS(100)), None, "exited before done");
    dog.send("done\n");
    assert_eq!(dog.exit(MS(2_000)), Some(0));
}

#[test]
fn end_of_file_kills_the_group_at_once() {
    let mut group = Group::start();
    let mut dog = Dog::start();
    dog.arm(group.pgid(), mono() + 60_000_000_000);
    std::thread::sleep(MS(100));
    assert!(group.alive());
    let closed = Instant::now();
    drop(dog.stdin.take());
    let gone = group.wait_gone(MS(3_000)).expect("the group is killed");
    let after = gone.duration_since(closed);
    eprintln!("end of file: the group was gone {after:?} after the pipe closed");
    assert!(after < MS(100), "took {after:?}");
    assert_eq!(
        dog.exit(MS(2_000)),
        Some(1),
        "exit status after end of file"
    );
}

#[test]
fn end_of_file_kills_a_disarmed_group_too() {
    let mut group = Group::start();
    let mut dog = Dog::start();
    dog.arm(group.pgid(), mono() + 60_000_000_000);
    dog.send("disarm\n");
    std::thread::sleep(MS(100));
    drop(dog.stdin.take());
    assert!(group.wait_gone(MS(1_000)).is_some(), "still alive");
}

#[test]
fn a_malformed_message_kills_the_group() {
    let mut group = Group::start();
    let mut dog = Dog::start();
    dog.arm(group.pgid(), mono() + 60_000_000_000);
    dog.send("extend forever\n");
    assert!(group.wait_gone(MS(1_000)).is_some(), "still alive");
    assert_eq!(dog.exit(MS(2_000)), Some(1));
}

#[test]
fn the_parent_death_signal_kills_the_group_only_once_the_parent_is_gone() {
    let group = Group::start();
    let mut dog = Dog::start();
    dog.arm(group.pgid(), mono() + 60_000_000_000);
    // A stray SIGUSR1 while the parent (this test) lives: ignored.
    // SAFETY: kill of our own child.
    unsafe { libc::kill(dog.child.id() as i32, libc::SIGUSR1) };
    std::thread::sleep(MS(200));
    assert!(group.alive(), "a stray signal killed the group");
    assert_eq!(dog.exit(MS(0)), None, "a stray signal ended the watchdog");
    // SIGTERM is ignored too (a `systemctl stop` leaves the grace to the runner).
    // SAFETY: as above.
    unsafe { libc::kill(dog.child.id() as i32, libc::SIGTERM) };
    std::thread::sleep(MS(200));
    assert!(group.alive(), "SIGTERM killed the group");
    assert_eq!(dog.exit(MS(0)), None, "SIGTERM ended the watchdog");
}

/// A runner that stops renewing without a word (frozen, starved): the line
/// says so.
#[test]
fn an_unrenewed_deadline_is_said_to_be_the_runners() {
    let mut group = Group::start();
    let mut dog = Dog::start();
    dog.arm(group.pgid(), mono() + 100_000_000);
    group.wait_gone(MS(3_000)).expect("the group is killed");
    dog.send("done\n");
    assert_eq!(dog.exit(MS(2_000)), Some(0));
    let err = dog.stderr().join("\n");
    eprintln!("{err}");
    let line = err
        .lines()
        .find(|l| l.contains("watchdog:"))
        .unwrap_or_else(|| panic!("no watchdog line:\n{err}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("did not renew"), "{line}");
    assert!(line.contains("reported no loss"), "{line}");
}

/// A loss the runner reported (`lost REASON`, then the kill deadline it
/// chose): the line at that deadline names the loss and its reason, not a
/// runner that stopped renewing.
#[test]
fn a_loss_the_runner_reported_is_named_at_the_deadline() {
    let mut group = Group::start();
    let mut dog = Dog::start();
    dog.arm(group.pgid(), mono() + 60_000_000_000);
    let reason =
        "session ended: terminating connection due to administrator command (SQLSTATE 57P01)";
    dog.send(&format!("lost {reason}\n"));
    dog.arm(group.pgid(), mono() + 100_000_000);
    group.wait_gone(MS(3_000)).expect("the group is killed");
    dog.send("done\n");
    let code = dog.exit(MS(2_000));
    let err = dog.stderr().join("\n");
    eprintln!("{err}");
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("watchdog:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(!lines[0].contains("did not renew"), "{}", lines[0]);
    assert!(lines[0].contains("the lease was lost"), "{}", lines[0]);
    assert!(lines[0].contains(reason), "{}", lines[0]);
}

/// The command exited by itself and left nothing: a deadline that passes
/// before the runner's `done` kills nothing, and says nothing at WARN.
#[test]
fn no_warning_at_the_deadline_after_the_command_exited() {
    let mut dog = Dog::start_with(&["true"]);
    dog.send(&format!("spawn {}\n", mono() + 200_000_000));
    let started = dog.report();
    assert!(started.starts_with("started "), "{started}");
    assert_eq!(dog.report(), "exited 0");
    // Past the deadline, then done.
    std::thread::sleep(MS(400));
    dog.send("done\n");
    assert_eq!(dog.exit(MS(2_000)), Some(0));
    std::thread::sleep(MS(50));
    let err = dog.stderr().join("\n");
    eprintln!("{err}");
    assert!(
        !err.contains("WARN"),
        "a warning for a command that had exited:\n{err}"
    );
}
