//! The job's process tree: the command is spawned directly (no shell) in a
//! new process group by the watchdog ([`crate::watchdog`]), tied to the
//! watchdog's life, and stopped as a whole tree.
//!
//! # The tree
//! The command's tree is every descendant of the runner but the watchdog:
//! the watchdog is the command's parent and a subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so a descendant that left the command's group
//! and session (`setsid`, a daemon's double fork, `nohup ... &`) and lost its
//! parent becomes the watchdog's child, not init's; the runner is a subreaper
//! too, for a tree whose watchdog died. Every stop signals the command's group
//! and each other process of the tree, and SIGKILL is repeated until nothing
//! of the tree is left. When the runner dies (even by SIGKILL) the watchdog
//! kills the tree; when the watchdog dies, the command gets SIGKILL from the
//! kernel (`PR_SET_PDEATHSIG`) and the runner kills the rest.
//!
//! # Limits
//! No descendant escapes by leaving its group or session: only the death of both the runner and its watchdog (both SIGKILLed) leaves
//! an escaped process to init. A process under another uid (a setuid
//! program) cannot be signalled by a runner that is not root; it is waited
//! for (its group counts as alive, [`group_alive`]) but not killed. A pid read
//! from `/proc` can in theory be reused between the read and the kill.
//!
//! # Linux only
//! The parent-death signal fires when the *thread* that spawned the child
//! exits; the watchdog is single-threaded, and `lease run` starts the watchdog
//! from the thread that lives as long as the process (the single-threaded
//! runtime's main thread). On other Unixes the crate does not build (the prctl
//! calls).

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{BufReader, Lines};
use tokio::process::ChildStdout;
use tokio::time::{sleep, Instant};

/// How often the group is checked for members while waiting for it to go.
const GROUP_POLL: Duration = Duration::from_millis(10);

/// The command to run while leading.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// The program (looked up in `PATH` unless it contains a `/`).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl ChildSpec {
    /// From `COMMAND [ARGS...]`; `None` if empty.
    pub fn new(mut argv: Vec<OsString>) -> Option<ChildSpec> {
        if argv.is_empty() {
            return None;
        }
        let program = argv.remove(0);
        Some(ChildSpec {
            program,
            args: argv,
        })
    }

    /// The program for messages.
    pub fn display(&self) -> String {
        self.program.to_string_lossy().into_owned()
    }

    /// Checks that the program exists and is executable, like a shell would
    /// before running it: `Err((127, message))` when not found, `Err((126,
    /// message))` when not executable.
    pub fn check(&self) -> Result<(), (i32, String)> {
        let name = self.display();
        if self.program.is_empty() {
            return Err((127, "the command is empty".to_owned()));
        }
        if self.program.as_bytes().contains(&b'/') {
            return executable(Path::new(&self.program))
                .map_err(|why| (126, format!("cannot execute {name}: {why}")))
                .and_then(|found| {
                    found
                        .then_some(())
                        .ok_or_else(|| (127, format!("{name}: no such file")))
                });
        }
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        let mut denied = None;
        for dir in std::env::split_paths(&path) {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            match executable(&dir.join(&self.program)) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(why) => denied = Some(why),
            }
        }
        Err(match denied {
            Some(why) => (126, format!("cannot execute {name}: {why}")),
            None => (127, format!("{name}: command not found in PATH")),
        })
    }
}

/// `Ok(true)`: an executable file; `Ok(false)`: nothing there; `Err`: there
/// but not executable.
fn executable(path: &Path) -> Result<bool, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err("is a directory".to_owned()),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err("permission denied".to_owned()),
        Ok(_) => Ok(true),
        Err(_) => Ok(false),
    }
}

/// The exit status `lease run` passes on: the code, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// Sends `sig` to every process of group `pgid`; `false` if none is left.
pub fn signal_group(pgid: i32, sig: libc::c_int) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill has no memory-safety preconditions; a negative pid names
    // the process group we created for the child (never ours: pgid > 1 and
    // the child's group is its own pid).
    unsafe { libc::kill(-pgid, sig) == 0 }
}

/// Whether any live process is left in group `pgid`. Zombies do not count:
/// an orphaned member that exited waits for its new parent (init, or a
/// container's PID 1, which may be slow) to reap it, and is gone already.
/// A group whose members all run under another uid (the command ran `sudo`)
/// cannot be signalled (EPERM) but is there all the same.
pub fn group_alive(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: as in signal_group; signal 0 only checks.
    let exists = unsafe { libc::kill(-pgid, 0) } == 0
        || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    live_members(pgid).is_none_or(|n| n > 0)
}

/// `/proc/PID/stat` of every process: (pid, ppid, pgrp, zombie); `None` if
/// `/proc` cannot be read.
fn processes() -> Option<Vec<(i32, i32, i32, bool)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name (which may contain anything, up to the last
        // ')'): state, ppid, pgrp.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let zombie = matches!(fields.next(), Some("Z" | "X"));
        let ppid = fields.next().and_then(|p| p.parse::<i32>().ok());
        let pgrp = fields.next().and_then(|p| p.parse::<i32>().ok());
        if let (Some(ppid), Some(pgrp)) = (ppid, pgrp) {
            out.push((pid, ppid, pgrp, zombie));
        }
    }
    Some(out)
}

/// How many processes of group `pgid` are not zombies, from `/proc`; `None`
/// if `/proc` cannot be read.
fn live_members(pgid: i32) -> Option<usize> {
    let all = processes()?;
    Some(
        all.iter()
            .filter(|&&(_, _, pgrp, zombie)| pgrp == pgid && !zombie)
            .count(),
    )
}

/// The live (not zombie) descendants of `root`, as (pid, pgrp), leaving out
/// the processes in `except` themselves (not their descendants). A process
/// that left its group and session (`setsid`, a daemon's double fork) is
/// still a descendant while its ancestors live, and after they died it is
/// one of the nearest subreaper's (`PR_SET_CHILD_SUBREAPER`): that is how
/// `lease run` and its watchdog find every process of a command's tree.
///
/// The processes in `prune` are left out with their whole subtrees: the
/// other jobs' watchdogs of a runner with several (`--shards`), each the
/// parent and subreaper of its own command's tree.
pub fn descendants(root: i32, except: &[i32], prune: &[i32]) -> Vec<(i32, i32)> {
    processes().map_or_else(Vec::new, |all| descendants_in(&all, root, except, prune))
}

/// [`descendants`] in a table read by [`processes`].
fn descendants_in(
    all: &[(i32, i32, i32, bool)],
    root: i32,
    except: &[i32],
    prune: &[i32],
) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid, pgrp, zombie) in all {
            if ppid == parent && pid != root && !prune.contains(&pid) {
                frontier.push(pid);
                if !zombie && !except.contains(&pid) {
                    out.push((pid, pgrp));
                }
            }
        }
    }
    out
}

/// Sends `sig` to group `pgid` (all at once) and to every other live
/// descendant of `root` (but the `except` ones and the `prune` subtrees);
/// how many descendants there were.
pub fn signal_tree(root: i32, except: &[i32], prune: &[i32], pgid: i32, sig: libc::c_int) -> usize {
    signal_group(pgid, sig);
    let tree = descendants(root, except, prune);
    signal_each(&tree, |pgrp| pgrp != pgid, sig);
    tree.len()
}

/// Sends `sig` to each process of `tree` (from [`descendants`]) whose group
/// `in_reach` accepts.
pub fn signal_each(tree: &[(i32, i32)], in_reach: impl Fn(i32) -> bool, sig: libc::c_int) {
    for &(pid, pgrp) in tree {
        if in_reach(pgrp) && pid > 1 {
            // SAFETY: kill has no memory-safety preconditions; `pid` is a
            // live descendant as of the read of /proc just now.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// Becomes the subreaper of its descendants: an orphan among them is
/// reparented to this process instead of init, so it stays in reach of
/// [`descendants`].
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's pid.
fn own_pid() -> i32 {
    std::process::id() as i32
}

/// The pids of this runner's watchdogs, from their start to their reaping:
/// one per shard led (`--shards`). A job's tree leaves out the others'
/// subtrees: each watchdog is the parent and subreaper of its own command's
/// tree while it lives, and an orphan of a tree whose watchdog died is the
/// runner's child, in reach of every job.
static WATCHDOGS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

fn watchdogs() -> std::sync::MutexGuard<'static, Vec<i32>> {
    WATCHDOGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A watchdog's entry in [`WATCHDOGS`], removed on drop: taken as soon as it
/// is spawned, before the runner awaits anything.
#[derive(Debug)]
pub struct WatchdogPid(i32);

impl WatchdogPid {
    pub fn new(pid: i32) -> WatchdogPid {
        watchdogs().push(pid);
        WatchdogPid(pid)
    }
}

impl Drop for WatchdogPid {
    fn drop(&mut self) {
        watchdogs().retain(|&p| p != self.0);
    }
}

/// The runner's watchdogs other than `own`.
fn other_watchdogs(own: i32) -> Vec<i32> {
    watchdogs().iter().copied().filter(|&p| p != own).collect()
}

/// A running command, started by the watchdog (see [`crate::watchdog`]):
/// its pid (also its process group), the watchdog's, and the watchdog's
/// reports of the command's exit.
///
/// The command's tree is every live descendant of this runner except the
/// watchdog itself: the watchdog is the command's parent and a subreaper
/// (orphans of the tree become its children), and this runner is a subreaper
/// too (for a tree whose watchdog died).
pub struct Job {
    pgid: i32,
    watchdog: i32,
    events: Lines<BufReader<ChildStdout>>,
    status: Option<ExitStatus>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("pgid", &self.pgid)
            .field("watchdog", &self.watchdog)
            .field("status", &self.status)
            .finish()
    }
}

/// Kills the tree if the job is dropped while it may still run (an early
/// return, a panic): nothing of it may outlive the lease. (The watchdog kills
/// it too when its pipe closes.)
impl Drop for Job {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

impl Job {
    /// The job of command `pid`, started by watchdog `watchdog`, whose
    /// reports come on `events`.
    pub fn new(pid: i32, watchdog: i32, events: Lines<BufReader<ChildStdout>>) -> Job {
        Job {
            pgid: pid,
            watchdog,
            events,
            status: None,
        }
    }

    /// The command's pid, which is also its process group id.
    pub fn pid(&self) -> i32 {
        self.pgid
    }

    /// `sig` to the command's group and every other process of its tree.
    fn signal(&self, sig: libc::c_int) -> usize {
        let others = other_watchdogs(self.watchdog);
        signal_tree(own_pid(), &[self.watchdog], &others, self.pgid, sig)
    }

    /// Whether a live process is left in the command's tree (one read of
    /// `/proc`; the group's signal check if `/proc` cannot be read).
    fn tree_alive(&self) -> bool {
        let others = other_watchdogs(self.watchdog);
        match processes() {
            Some(all) => !descendants_in(&all, own_pid(), &[self.watchdog], &others).is_empty(),
            None => group_alive(self.pgid),
        }
    }

    /// SIGKILL to the tree until nothing of it is left: the first at once,
    /// without a check before it. Returns whether anything was there.
    async fn kill_tree(&self) -> bool {
        let mut rounds = 0u32;
        let mut found = false;
        loop {
            let n = self.signal(libc::SIGKILL);
            if n == 0 && !group_alive(self.pgid) {
                return found;
            }
            found = true;
            rounds += 1;
            if rounds % 1000 == 0 {
                tracing::warn!(
                    pgid = self.pgid,
                    "processes of the command's tree survive SIGKILL (uninterruptible sleep, \
                     or under another user); still killing"
                );
            }
            sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits for the command itself to exit, as the watchdog reports it.
    /// Cancel-safe.
    ///
    /// # Errors
    /// If the watchdog is gone (its pipe closed): the command died with it
    /// (its parent-death signal).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        loop {
            let line = self.events.next_line().await?.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the watchdog, the command's parent, is gone",
                )
            })?;
            let raw = line
                .strip_prefix("exited ")
                .and_then(|w| w.trim().parse::<i32>().ok());
            if let Some(raw) = raw {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                return Ok(status);
            }
        }
    }

    /// Stops the whole tree: SIGTERM (and SIGCONT, so that a stopped process
    /// sees it) at once, SIGKILL when `grace` has passed or `hurry` resolves,
    /// whichever is first, unless the child has exited and the tree is empty
    /// by then. Returns the child's status once it has exited (and the tree
    /// got SIGKILL until empty if processes were still left).
    pub async fn terminate<H>(&mut self, grace: Duration, hurry: H) -> Option<ExitStatus>
    where
        H: std::future::Future<Output = ()>,
    {
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
        self.drain_group(grace, hurry).await
    }

    /// After the child exited by itself: stops whatever it left behind in its
    /// tree, in its group or not (SIGTERM, SIGKILL after `grace` or when
    /// `hurry` resolves). Returns whether anything was left.
    pub async fn reap_group<H>(&mut self, grace: Duration, hurry: H) -> bool
    where
        H: std::future::Future<Output = ()>,
    {
        if !self.tree_alive() {
            return false;
        }
        tracing::info!(
            pgid = self.pgid,
            "processes left in the command's tree; sending them SIGTERM"
        );
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
        self.drain_group(grace, hurry).await;
        true
    }

    async fn drain_group<H>(&mut self, grace: Duration, hurry: H) -> Option<ExitStatus>
    where
        H: std::future::Future<Output = ()>,
    {
        let deadline = Instant::now() + grace;
        let mut hurry = std::pin::pin!(hurry);
        let mut gone = false;
        loop {
            if (self.status.is_some() || gone) && !self.tree_alive() {
                return self.status;
            }
            let exited = self.status.is_some() || gone;
            tokio::select! {
                status = self.wait(), if !exited => {
                    if status.is_err() {
                        gone = true;
                    }
                }
                () = sleep(GROUP_POLL), if exited => {}
                () = tokio::time::sleep_until(deadline) => break,
                () = &mut hurry => break,
            }
        }
        if self.kill_tree().await {
            tracing::warn!(
                pgid = self.pgid,
                grace = ?grace,
                "the command's tree did not exit in time (or the lease was lost): sent SIGKILL"
            );
        }
        self.wait().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// `kill(-pgid, 0)` fails with EPERM when every member of the group runs
    /// under another uid (a command that ran `sudo`, or `su`), and
    /// `group_alive` must still say the group is there. Needs root (to start
    /// the group as root and ask as the unprivileged user `leasetest`);
    /// skipped otherwise.
    /// A job's tree with several shards: its watchdog's descendants and the
    /// runner's orphans, never another watchdog's subtree.
    #[test]
    fn a_tree_leaves_out_the_other_watchdogs_subtrees() {
        // (pid, ppid, pgrp, zombie): runner 1; watchdog 10 with command 11
        // and its escaped child 12; watchdog 20 with command 21; an orphan
        // 30 of a dead watchdog's tree; a zombie 31.
        let all = [
            (10, 1, 10, false),
            (11, 10, 11, false),
            (12, 10, 12, false),
            (20, 1, 20, false),
            (21, 20, 21, false),
            (30, 1, 30, false),
            (31, 1, 31, true),
        ];
        let tree = |own, others: &[i32]| {
            let mut pids: Vec<i32> = (descendants_in(&all, 1, &[own], others).iter())
                .map(|&(p, _)| p)
                .collect();
            pids.sort_unstable();
            pids
        };
        assert_eq!(tree(10, &[20]), [11, 12, 30]);
        assert_eq!(tree(20, &[10]), [21, 30]);
        assert_eq!(tree(10, &[]), [11, 12, 20, 21, 30]);
    }

    #[test]
    fn a_group_of_another_user_is_alive() {
        // SAFETY: geteuid has no preconditions; getpwnam returns a pointer
        // into static storage or null, read at once.
        let uid = unsafe {
            if libc::geteuid() != 0 {
                eprintln!("skipped: not root");
                return;
            }
            let pw = libc::getpwnam(c"leasetest".as_ptr());
            if pw.is_null() {
                eprintln!("skipped: no user leasetest");
                return;
            }
            ((*pw).pw_uid, (*pw).pw_gid)
        };
        let mut group = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let pgid = group.id() as i32;
        // Asked from a process running as leasetest: its exit status is the
        // answer (1: alive, 0: gone, 2: could not switch users).
        let mut ask = std::process::Command::new("true");
        // SAFETY: the closure runs in the forked child before exec; it calls
        // setgid/setuid, the function under test (which reads /proc) and
        // _exit. glibc's malloc is usable after fork.
        unsafe {
            ask.pre_exec(move || {
                if libc::setgid(uid.1) != 0 || libc::setuid(uid.0) != 0 {
                    libc::_exit(2);
                }
                let errno_eperm = libc::kill(-pgid, 0) != 0
                    && io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
                if !errno_eperm {
                    libc::_exit(3);
                }
                libc::_exit(i32::from(group_alive(pgid)));
            });
        }
        let status = ask.status().expect("run the question as leasetest");
        let _ = group.kill();
        let _ = group.wait();
        assert_ne!(status.code(), Some(2), "cannot switch to leasetest");
        assert_ne!(
            status.code(),
            Some(3),
            "kill(-pgid, 0) did not fail with EPERM"
        );
        assert_eq!(
            status.code(),
            Some(1),
            "group_alive says the group {pgid} of root's `sleep 30` is gone when asked by \
             another user (kill(-pgid, 0) fails with EPERM)"
        );
    }
}
