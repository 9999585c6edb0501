//! The command's process tree, read from `/proc` and signalled: the
//! command's group and every other descendant of its watchdog (and, in a
//! runner that called [`become_subreaper`], the runner's orphans).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

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
/// reaches it.
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

/// Whether any live process is left in group `pgid`. Zombies do not count:
/// an orphaned member that exited waits for its new parent (init, or a
/// container's PID 1, which may be slow) to reap it, and is gone already.
/// A group whose members all run under another uid (the command ran `sudo`)
/// cannot be signalled (EPERM) but is there all the same.
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
    processes().is_none_or(|all| {
        all.iter()
            .any(|&(_, _, pgrp, zombie)| pgrp == pgid && !zombie)
    })
}

/// One process of the table: (pid, ppid, pgrp, zombie).
pub(crate) type Process = (i32, i32, i32, bool);

/// `/proc/PID/stat` of every process; `None` if `/proc` cannot be read.
pub(crate) fn processes() -> Option<Vec<Process>> {
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

/// The live (not zombie) descendants of `root`, as (pid, pgrp), leaving out
/// the processes in `except` themselves (not their descendants) and the
/// processes in `prune` with their whole subtrees. A process that left its
/// group and session (`setsid`, a daemon's double fork) is still a
/// descendant while its ancestors live, and after they died it is one of
/// the nearest subreaper's (`PR_SET_CHILD_SUBREAPER`).
pub(crate) fn descendants_in(
    all: &[Process],
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

/// [`descendants_in`] of the whole table; empty if `/proc` cannot be read.
pub(crate) fn descendants(root: i32) -> Vec<(i32, i32)> {
    processes().map_or_else(Vec::new, |all| descendants_in(&all, root, &[], &[]))
}

/// The tree of the job whose watchdog is `watchdog`, in `all`, as (pid,
/// pgrp), the watchdog left out. After [`become_subreaper`]: every
/// descendant of this process but the other watchdogs' subtrees (orphans of
/// a tree whose watchdog died are this process's children). Otherwise: the
/// watchdog's descendants, while it is this process's child (not a reused
/// pid).
pub(crate) fn job_tree_in(all: &[Process], runner: i32, watchdog: i32) -> Vec<(i32, i32)> {
    if SUBREAPER.load(Ordering::SeqCst) {
        let others: Vec<i32> = watchdogs()
            .iter()
            .copied()
            .filter(|&p| p != watchdog)
            .collect();
        return descendants_in(all, runner, &[watchdog], &others);
    }
    let ours = all
        .iter()
        .any(|&(pid, ppid, _, _)| pid == watchdog && ppid == runner);
    if ours {
        descendants_in(all, watchdog, &[], &[])
    } else {
        Vec::new()
    }
}

/// Sends `sig` to each process of `tree` (from [`descendants_in`]) whose
/// group `in_reach` accepts.
pub(crate) fn signal_each(tree: &[(i32, i32)], in_reach: impl Fn(i32) -> bool, sig: libc::c_int) {
    for &(pid, pgrp) in tree {
        if in_reach(pgrp) && pid > 1 {
            // SAFETY: kill has no memory-safety preconditions; `pid` is a
            // live descendant as of the read of /proc just now.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A job's tree with several watchdogs: its watchdog's descendants and
    /// the runner's orphans, never another watchdog's subtree.
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
        // Not a subreaper (this test process never calls become_subreaper):
        // the watchdog's descendants only, and nothing under a pid that is
        // not this runner's child (a reused one).
        let mut own: Vec<i32> = job_tree_in(&all, 1, 10).iter().map(|&(p, _)| p).collect();
        own.sort_unstable();
        assert_eq!(own, [11, 12]);
        assert!(job_tree_in(&all, 2, 10).is_empty());
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
