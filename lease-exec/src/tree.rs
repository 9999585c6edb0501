//! The command's process tree, walked from `/proc` and signalled: the
//! command's group and every other descendant of its watchdog (and, in a
//! runner that called [`become_subreaper`], the runner's orphans), walked
//! from the subreaper down through each process's children lists.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Whether this process called [`become_subreaper`].
static SUBREAPER: AtomicBool = AtomicBool::new(false);

/// The pids of this process's watchdogs, from their start to their reaping
/// (a runner may have several: `lease run --shards`). A job's tree leaves
/// out the others' subtrees: each watchdog is the parent and subreaper of
/// its own command's tree while it lives.
static WATCHDOGS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn watchdogs() -> MutexGuard<'static, Vec<i32>> {
    WATCHDOGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A watchdog's entry in [`WATCHDOGS`], removed on drop: taken as soon as it
/// is spawned, before the runner awaits anything.
#[derive(Debug)]
pub(crate) struct WatchdogPid(i32);

impl WatchdogPid {
    pub(crate) fn new(pid: i32) -> WatchdogPid {
        watchdogs().push(pid);
        WatchdogPid(pid)
    }
}

impl Drop for WatchdogPid {
    fn drop(&mut self) {
        watchdogs().retain(|&p| p != self.0);
    }
}

/// Makes this process the subreaper of its descendants
/// (`PR_SET_CHILD_SUBREAPER`), for the trees whose watchdog dies before
/// them: a process of a command's tree that left its group and session
/// (`setsid`, a double fork) and then lost its watchdog becomes this
/// process's child instead of init's, and every [`Job`](crate::Job)'s stop
/// reaches it (and reaps it once it has exited).
///
/// Call it once, before the first watchdog starts, in a process whose only
/// children are its watchdogs (as the `lease` command): from then on a
/// job's tree is every descendant of this process but the other watchdogs'
/// subtrees, so another child this process starts (and that child's
/// descendants) would be stopped with every job. Without it a job's tree is
/// its command's group and its watchdog's descendants, which is all of the
/// tree while the watchdog lives.
///
/// # Errors
/// The `prctl` call's error.
pub fn become_subreaper() -> io::Result<()> {
    subreaper()?;
    SUBREAPER.store(true, Ordering::SeqCst);
    Ok(())
}

/// `PR_SET_CHILD_SUBREAPER` for this process.
pub(crate) fn subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `sig` to every process of group `pgid`; `false` if none is left.
pub(crate) fn signal_group(pgid: i32, sig: libc::c_int) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill has no memory-safety preconditions; a negative pid names
    // the process group created for the command (never ours: pgid > 1 and
    // the command's group is its own pid).
    unsafe { libc::kill(-pgid, sig) == 0 }
}

/// Sends `sig` to process `pid` (never a pid <= 1).
fn signal(pid: i32, sig: libc::c_int) {
    if pid > 1 {
        // SAFETY: kill has no memory-safety preconditions; `pid` is a member
        // of the tree as of the walk that found it just now.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Whether any live process is left in group `pgid`. Zombies do not count:
/// an orphaned member that exited waits for its new parent (init, or a
/// container's PID 1, which may be slow) to reap it, and is gone already.
/// A group whose members all run under another uid (the command ran `sudo`)
/// cannot be signalled (EPERM) but is there all the same.
///
/// Only for a group outside every walkable tree (the watchdog is gone and
/// this runner is no subreaper): the zombie check reads the whole process
/// table, but only while the group still has a member.
pub(crate) fn group_alive(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: as in signal_group; signal 0 only checks.
    let exists = unsafe { libc::kill(-pgid, 0) } == 0
        || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    processes().is_none_or(|all| all.iter().any(|p| p.pgrp == pgid && p.live()))
}

/// One process, as read from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Process {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    pub(crate) pgrp: i32,
    /// The state letter: `R`, `S`, `D`, `T` (stopped), `t` (traced), `Z`...
    pub(crate) state: u8,
}

impl Process {
    /// Not a zombie: a zombie has exited and waits only to be reaped.
    pub(crate) fn live(&self) -> bool {
        !matches!(self.state, b'Z' | b'X' | b'x')
    }

    /// Stopped (SIGSTOP, or a tracer's stop): it cannot fork.
    fn stopped(&self) -> bool {
        matches!(self.state, b'T' | b't')
    }
}

/// `/proc/PID/stat` of `pid`; `None` if it is gone.
fn stat(pid: i32) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (which may contain anything, up to the last
    // ')'): state, ppid, pgrp.
    let rest = stat.rfind(')').map(|i| &stat[i + 1..])?;
    let mut fields = rest.split_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Process {
        pid,
        ppid,
        pgrp,
        state,
    })
}

/// `/proc/PID/stat` of every process; `None` if `/proc` cannot be read.
/// Only where the kernel has no children lists ([`children_lists`]), or for
/// a group outside every tree: its cost is the host's process count.
pub(crate) fn processes() -> Option<Vec<Process>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if let Some(p) = name.to_str().and_then(|s| s.parse().ok()).and_then(stat) {
            out.push(p);
        }
    }
    Some(out)
}

/// Whether this kernel lists each thread's children
/// (`/proc/PID/task/TID/children`, `CONFIG_PROC_CHILDREN`, on in the
/// common distributions' kernels): then a walk costs the tree's size, not
/// the host's process count.
fn children_lists() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| std::path::Path::new("/proc/thread-self/children").exists())
}

/// Appends the children of `pid` (those of each of its threads) to `out`.
fn children(pid: i32, out: &mut Vec<i32>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        out.extend(
            list.split_ascii_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
}

/// A process tree to walk, from the top down: the descendants of `root`,
/// `skip` walked through but not one of them, the `prune` processes left
/// out with their subtrees.
///
/// A process that left its group and session (`setsid`, a daemon's double
/// fork) is still a descendant while its ancestors live, and after they
/// died it is a child of the nearest subreaper (`PR_SET_CHILD_SUBREAPER`):
/// the watchdog, or the runner after [`become_subreaper`]. A walk from
/// there down finds it, at the cost of the tree alone.
#[derive(Debug, Clone)]
pub(crate) struct Tree {
    root: i32,
    skip: Option<i32>,
    prune: Vec<i32>,
    /// The root is this runner, a subreaper: the walk reaps the exited
    /// orphans it finds among its children (nothing else would).
    reap: bool,
}

impl Tree {
    /// The watchdog's tree: every descendant of this process.
    pub(crate) fn own() -> Tree {
        Tree {
            root: std::process::id() as i32,
            skip: None,
            prune: Vec::new(),
            reap: false,
        }
    }

    /// The tree of the job whose watchdog is `watchdog`, seen from its
    /// runner, the watchdog left out. After [`become_subreaper`]: every
    /// descendant of this process but the other watchdogs' subtrees
    /// (orphans of a tree whose watchdog died are this process's children).
    /// Otherwise: the watchdog's descendants, while it is this process's
    /// child (not a reused pid); `None` once it is not.
    pub(crate) fn of_job(watchdog: i32) -> Option<Tree> {
        let runner = std::process::id() as i32;
        if SUBREAPER.load(Ordering::SeqCst) {
            let prune = watchdogs()
                .iter()
                .copied()
                .filter(|&p| p != watchdog)
                .collect();
            return Some(Tree {
                root: runner,
                skip: Some(watchdog),
                prune,
                reap: true,
            });
        }
        stat(watchdog)
            .is_some_and(|w| w.ppid == runner && w.live())
            .then(|| Tree {
                root: watchdog,
                skip: None,
                prune: Vec::new(),
                reap: false,
            })
    }

    /// Reads the tree from the top down and returns its processes (zombies
    /// included). `visit` sees each one as soon as it is found, before its
    /// children are read: a SIGSTOP it sends reaches a process before the
    /// walk reads its children.
    pub(crate) fn walk(&self, visit: &mut dyn FnMut(&Process)) -> Vec<Process> {
        if !children_lists() {
            let all = processes().unwrap_or_default();
            let found = self.walk_in(&all);
            found.iter().for_each(&mut *visit);
            return found;
        }
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![self.root];
        let mut kids = Vec::new();
        while let Some(parent) = stack.pop() {
            kids.clear();
            children(parent, &mut kids);
            for &pid in &kids {
                if pid == self.root || self.prune.contains(&pid) || !seen.insert(pid) {
                    continue;
                }
                if Some(pid) == self.skip {
                    stack.push(pid);
                    continue;
                }
                let Some(p) = stat(pid) else { continue };
                if self.reap && !p.live() && p.ppid == self.root {
                    // An orphan of a tree whose watchdog died (watchdogs
                    // are skipped or pruned, never reaped here).
                    // SAFETY: waitpid on an exited child of this process.
                    unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
                }
                visit(&p);
                out.push(p);
                stack.push(pid);
            }
        }
        out
    }

    /// The walk in a read of the whole process table (`all`).
    fn walk_in(&self, all: &[Process]) -> Vec<Process> {
        let mut out = Vec::new();
        let mut frontier = vec![self.root];
        let mut seen = HashSet::new();
        while let Some(parent) = frontier.pop() {
            for p in all {
                if p.ppid == parent
                    && p.pid != self.root
                    && !self.prune.contains(&p.pid)
                    && seen.insert(p.pid)
                {
                    frontier.push(p.pid);
                    if Some(p.pid) != self.skip {
                        out.push(*p);
                    }
                }
            }
        }
        out
    }

    /// Whether a live process is in the tree. One walk is not a snapshot:
    /// a process whose parent dies while the walk reads the tree moves to
    /// the subreaper's children list, perhaps after the walk read it. So an
    /// empty answer needs two walks in a row that find the same processes
    /// (pid and state): a move during the second would change what it finds
    /// (its dying parent was live in the first). A tree that never settles
    /// (within [`SETTLE_WALKS`] walks) counts as alive.
    pub(crate) fn alive(&self) -> bool {
        let mut last = None;
        for _ in 0..SETTLE_WALKS {
            let found = self.walk(&mut |_| {});
            if found.iter().any(Process::live) {
                return true;
            }
            let now = snapshot(&found);
            if last.as_ref() == Some(&now) {
                return false;
            }
            last = Some(now);
        }
        true
    }

    /// Sends `sig` once to each live process of the tree whose group
    /// `in_reach` accepts, walking again until two walks in a row find the
    /// same processes (at most [`SETTLE_WALKS`] walks): a process that moved
    /// to the subreaper while one walk read the tree gets it from the next.
    pub(crate) fn signal(&self, in_reach: impl Fn(i32) -> bool, sig: libc::c_int) {
        let mut sent = HashSet::new();
        let mut last = None;
        for _ in 0..SETTLE_WALKS {
            let found = self.walk(&mut |p| {
                if p.live() && in_reach(p.pgrp) && sent.insert(p.pid) {
                    signal(p.pid, sig);
                }
            });
            let now = snapshot(&found);
            if last.as_ref() == Some(&now) {
                return;
            }
            last = Some(now);
        }
    }

    /// Kills the whole tree so that no process of it can outrun the kill
    /// (one that forks a child and exits every millisecond, say): first
    /// freezes it, SIGSTOP to each process a walk finds running, walking
    /// again until two walks in a row find the same processes and every one
    /// stopped (or exited, or in uninterruptible sleep with the SIGSTOP
    /// pending): a stopped process cannot fork, and a fork under way when
    /// the SIGSTOP came gives a child that stops too. Then SIGKILL to each
    /// process a walk finds, walking again until two walks in a row find
    /// the same processes and none alive ([`Tree::alive`] says why two).
    /// `between` runs between walks (the watchdog reaps there).
    /// Returns whether any process was found.
    ///
    /// The freeze gives up after [`FREEZE_LIMIT`] (a process that a tracer
    /// keeps running, say) and kills anyway; the kill goes on until nothing
    /// is left, with a warning every 1,000 walks (a process in
    /// uninterruptible sleep, or under another uid).
    pub(crate) fn kill(&self, between: &mut dyn FnMut()) -> bool {
        let start = Instant::now();
        let mut signalled = HashSet::new();
        let mut last = None;
        let mut found = false;
        loop {
            let mut running = false;
            let members = self.walk(&mut |p| {
                if p.live() && !p.stopped() {
                    signal(p.pid, libc::SIGSTOP);
                    // In uninterruptible sleep it cannot fork, and it stops
                    // before it could: once it has the SIGSTOP, it counts.
                    if !(p.state == b'D' && signalled.contains(&p.pid)) {
                        running = true;
                    }
                    signalled.insert(p.pid);
                }
            });
            found |= members.iter().any(Process::live);
            let now = snapshot(&members);
            if !running && last.as_ref() == Some(&now) {
                break;
            }
            let left = now.len();
            last = Some(now);
            if start.elapsed() > FREEZE_LIMIT {
                tracing::warn!(
                    left,
                    "processes of the command's tree do not stop (SIGSTOP); killing them anyway"
                );
                break;
            }
            between();
            if running {
                // Time for the stopped processes to be scheduled and stop.
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let mut last = None;
        let mut rounds = 0u32;
        loop {
            let mut live = 0usize;
            let members = self.walk(&mut |p| {
                if p.live() {
                    signal(p.pid, libc::SIGKILL);
                    live += 1;
                }
            });
            found |= live > 0;
            let now = snapshot(&members);
            if live == 0 && last.as_ref() == Some(&now) {
                return found;
            }
            last = Some(now);
            between();
            rounds += 1;
            if rounds % 1000 == 0 {
                tracing::warn!(
                    left = live,
                    "processes of the command's tree survive SIGKILL (uninterruptible sleep, or \
                     under another user); still killing"
                );
            }
            if live > 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// What a walk found, comparable with another walk's: (pid, state), sorted.
fn snapshot(found: &[Process]) -> Vec<(i32, u8)> {
    let mut out: Vec<(i32, u8)> = found.iter().map(|p| (p.pid, p.state)).collect();
    out.sort_unstable();
    out
}

/// How many walks [`Tree::alive`] and [`Tree::signal`] make at most for two
/// in a row that agree.
const SETTLE_WALKS: usize = 100;

/// How long [`Tree::kill`] tries to stop every process before it kills.
const FREEZE_LIMIT: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A job's tree with several watchdogs: its watchdog's descendants and
    /// the runner's orphans, never another watchdog's subtree.
    #[test]
    fn a_tree_leaves_out_the_other_watchdogs_subtrees() {
        // (pid, ppid, pgrp, state): runner 1; watchdog 10 with command 11
        // and its escaped child 12; watchdog 20 with command 21; an orphan
        // 30 of a dead watchdog's tree; a zombie 31.
        let all = [
            (10, 1, 10, b'S'),
            (11, 10, 11, b'S'),
            (12, 10, 12, b'R'),
            (20, 1, 20, b'S'),
            (21, 20, 21, b'S'),
            (30, 1, 30, b'T'),
            (31, 1, 31, b'Z'),
        ]
        .map(|(pid, ppid, pgrp, state)| Process {
            pid,
            ppid,
            pgrp,
            state,
        });
        let tree = |own, others: &[i32]| {
            let tree = Tree {
                root: 1,
                skip: Some(own),
                prune: others.to_vec(),
                reap: false,
            };
            let mut pids: Vec<i32> = (tree.walk_in(&all).iter())
                .filter(|p| p.live())
                .map(|p| p.pid)
                .collect();
            pids.sort_unstable();
            pids
        };
        assert_eq!(tree(10, &[20]), [11, 12, 30]);
        assert_eq!(tree(20, &[10]), [21, 30]);
        assert_eq!(tree(10, &[]), [11, 12, 20, 21, 30]);
        // Not a subreaper: the watchdog's descendants only.
        let own = Tree {
            root: 10,
            skip: None,
            prune: Vec::new(),
            reap: false,
        };
        let mut pids: Vec<i32> = own.walk_in(&all).iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        assert_eq!(pids, [11, 12]);
    }

    /// `kill(-pgid, 0)` fails with EPERM when every member of the group runs
    /// under another uid (a command that ran `sudo`, or `su`), and
    /// `group_alive` must still say the group is there. Needs root (to start
    /// the group as root and ask as the unprivileged user `leasetest`);
    /// skipped otherwise.
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
