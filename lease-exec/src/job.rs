//! The runner's handle on a running command: its exit, and the stops of its
//! whole tree.

use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{BufReader, Lines};
use tokio::process::ChildStdout;
use tokio::time::{sleep, Instant};

use crate::cgroup;
use crate::error::Error;
use crate::tree::{group_alive, signal_group, Tree};

/// How often the tree is checked for members while waiting for it to go:
/// first after 1 ms, then twice as long each time, up to 10 ms (a walk
/// costs the tree's size and runs off the runner's thread).
const GROUP_POLL: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(10));

/// A running command, started by its [`Watchdog`](crate::Watchdog) with
/// [`Watchdog::spawn`](crate::Watchdog::spawn): its pid (also its process
/// group), its exit as the watchdog reports it, and the stops of its tree.
///
/// The command's tree is its process group and every other descendant of
/// its watchdog (the command's parent and a subreaper: an orphan of the
/// tree becomes its child, whatever group or session it moved to); after
/// [`become_subreaper`](crate::become_subreaper) also the runner's own
/// orphans, but not its other watchdogs' subtrees; and its cgroup leaf, if
/// it has one. The crate docs' "The tree" says how it is walked and killed.
///
/// Dropping it sends SIGKILL to the tree at once (the group, the leaf, each
/// process of one walk) and, if anything was there, finishes the kill
/// (freeze, then SIGKILL until none is left) on a thread of its own:
/// nothing of it may outlive the handle by mistake (an early return, a
/// panic). The watchdog kills it too when its pipe closes.
#[must_use = "dropping a Job kills the command's tree at once"]
pub struct Job {
    pgid: i32,
    reach: Reach,
    events: Lines<BufReader<ChildStdout>>,
    status: Option<ExitStatus>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("pgid", &self.pgid)
            .field("watchdog", &self.reach.watchdog)
            .field("cgroup", &self.reach.leaf)
            .field("status", &self.status)
            .finish()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // SIGKILL to the group, the leaf and each process of one walk, here
        // and now; the rest of the stop (a freeze first, until none is left)
        // on a thread of its own, which the runtime's thread does not wait
        // for. If the process ends first, the watchdog finishes it.
        if self.reach.kill_once() {
            let reach = self.reach.clone();
            let _ = std::thread::Builder::new()
                .name("lease-exec-kill".into())
                .spawn(move || reach.kill_tree());
        } else if let Some(dir) = &self.reach.leaf {
            // The watchdog removes its leaf when it exits; if it died, this
            // does (only an empty leaf can be removed).
            let _ = std::fs::remove_dir(dir.as_path());
        }
    }
}

/// What a stop of a job reaches, for the stop's blocking work (walks of the
/// tree, signals), which never runs on the runner's async thread.
#[derive(Debug, Clone)]
struct Reach {
    pgid: i32,
    watchdog: i32,
    /// The command's cgroup leaf, if its watchdog made one.
    leaf: Option<Arc<PathBuf>>,
}

impl Reach {
    /// `sig` to the command's group and each other live process of its
    /// tree (one walk).
    fn signal(&self, sig: libc::c_int) {
        signal_group(self.pgid, sig);
        if let Some(tree) = Tree::of_job(self.watchdog) {
            tree.signal(|pgrp| pgrp != self.pgid, sig);
        }
    }

    /// Whether a live process is left in the command's tree (one walk; and
    /// the leaf's `populated`). Without a tree to walk (the watchdog is
    /// gone, and this runner is no subreaper): the group's check.
    fn alive(&self) -> bool {
        let leaf = self.leaf.as_ref().is_some_and(|dir| cgroup::populated(dir));
        leaf || match Tree::of_job(self.watchdog) {
            Some(tree) => tree.alive(),
            None => group_alive(self.pgid),
        }
    }

    /// SIGKILL to the leaf, the group and each process of one walk; whether
    /// anything was there.
    fn kill_once(&self) -> bool {
        let mut found = false;
        if let Some(dir) = &self.leaf {
            found |= cgroup::populated(dir);
            cgroup::kill(dir);
        }
        found |= signal_group(self.pgid, libc::SIGKILL);
        if let Some(tree) = Tree::of_job(self.watchdog) {
            found |= tree.alive();
            tree.signal(|_| true, libc::SIGKILL);
        }
        found
    }

    /// SIGKILL to the whole tree until nothing of it is left: the leaf's
    /// `cgroup.kill` (if any), the group, then [`Tree::kill`] (freeze, then
    /// kill) on the tree walked from the watchdog or this runner down.
    /// Returns whether anything was there.
    fn kill_tree(&self) -> bool {
        let mut found = false;
        if let Some(dir) = &self.leaf {
            found |= cgroup::populated(dir);
            cgroup::kill(dir);
        }
        found |= signal_group(self.pgid, libc::SIGKILL);
        match Tree::of_job(self.watchdog) {
            Some(tree) => found |= tree.kill(&mut || {}),
            None => {
                // No tree to walk: the group (its members are frozen by
                // nothing, but never left it) until it is gone.
                let mut rounds = 0u32;
                while group_alive(self.pgid) {
                    found = true;
                    signal_group(self.pgid, libc::SIGKILL);
                    rounds += 1;
                    if rounds % 1000 == 0 {
                        tracing::warn!(
                            pgid = self.pgid,
                            "processes of the command's group survive SIGKILL; still killing"
                        );
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        // What the leaf's kill reached dies in the kernel's own time.
        if let Some(dir) = &self.leaf {
            let mut rounds = 0u32;
            while cgroup::populated(dir) {
                rounds += 1;
                if rounds % 5000 == 0 {
                    tracing::warn!(
                        pgid = self.pgid,
                        "processes of the command's cgroup survive its cgroup.kill; still waiting"
                    );
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        found
    }

    /// Runs `work` on this reach on a thread of the runtime's blocking pool
    /// (here if the runtime is shutting down): the stop's reads of `/proc`
    /// and its waits never hold up the runner's other tasks (its heartbeats).
    async fn blocking<T, F>(&self, work: F) -> T
    where
        T: Send + 'static,
        F: Fn(&Reach) -> T + Send + Sync + 'static,
    {
        let work = Arc::new(work);
        let (reach, task) = (self.clone(), Arc::clone(&work));
        match tokio::task::spawn_blocking(move || task(&reach)).await {
            Ok(out) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => work(self),
        }
    }
}

impl Job {
    /// The job of command `pid`, started by watchdog `watchdog` (in cgroup
    /// leaf `leaf`, if any), whose reports come on `events`.
    pub(crate) fn new(
        pid: i32,
        watchdog: i32,
        leaf: Option<PathBuf>,
        events: Lines<BufReader<ChildStdout>>,
    ) -> Job {
        Job {
            pgid: pid,
            reach: Reach {
                pgid: pid,
                watchdog,
                leaf: leaf.map(Arc::new),
            },
            events,
            status: None,
        }
    }

    /// The command's pid, which is also its process group id.
    pub fn pid(&self) -> u32 {
        self.pgid.unsigned_abs()
    }

    /// SIGTERM and SIGCONT (so that a stopped process sees it) to the tree.
    async fn terminate_tree(&self) {
        self.reach
            .blocking(|r| {
                r.signal(libc::SIGTERM);
                r.signal(libc::SIGCONT);
            })
            .await;
    }

    /// Whether a live process is left in the command's tree.
    async fn tree_alive(&self) -> bool {
        self.reach.blocking(Reach::alive).await
    }

    /// SIGKILL to the tree until nothing of it is left. Returns whether
    /// anything was there.
    async fn kill_tree(&self) -> bool {
        self.reach.blocking(Reach::kill_tree).await
    }

    /// Waits for the command itself to exit, as its watchdog reports it
    /// (the raw wait status: a code, or the signal that killed it).
    ///
    /// # Errors
    /// [`Error::Lost`] if the watchdog is gone (its pipe closed): the
    /// command died with it (its parent-death signal is SIGKILL).
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future loses no report; a later call
    /// resolves with the same status.
    pub async fn wait(&mut self) -> Result<ExitStatus, Error> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        loop {
            let line = self.events.next_line().await.map_err(Error::Lost)?;
            let line = line.ok_or_else(|| {
                Error::Lost(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the watchdog, the command's parent, is gone",
                ))
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
    /// whichever is first, unless the command has exited and the tree is
    /// empty by then. Returns the command's status once it has exited (and
    /// the tree got SIGKILL until empty if processes were still left);
    /// `None` if the watchdog is gone.
    ///
    /// The watchdog's deadline still applies meanwhile: it kills the tree
    /// at its deadline whatever `grace` says (disarm it first for a longer
    /// stop).
    ///
    /// # Cancel safety
    /// Not cancel-safe: cancelled, the tree has had SIGTERM and may still
    /// run; a later call or the drop of the job (SIGKILL) finishes the stop.
    /// A kill under way when it is cancelled goes on to its end on its
    /// blocking thread.
    pub async fn terminate<H>(&mut self, grace: Duration, hurry: H) -> Option<ExitStatus>
    where
        H: Future<Output = ()>,
    {
        self.terminate_tree().await;
        self.drain(grace, hurry).await
    }

    /// After the command exited by itself: stops whatever it left behind in
    /// its tree, in its group or not (SIGTERM, SIGKILL after `grace` or when
    /// `hurry` resolves). Returns whether anything was left.
    ///
    /// # Cancel safety
    /// As [`Job::terminate`].
    pub async fn stop_leftovers<H>(&mut self, grace: Duration, hurry: H) -> bool
    where
        H: Future<Output = ()>,
    {
        if !self.tree_alive().await {
            return false;
        }
        tracing::info!(
            pgid = self.pgid,
            "processes left in the command's tree; sending them SIGTERM"
        );
        self.terminate_tree().await;
        self.drain(grace, hurry).await;
        true
    }

    /// Waits for the command's exit and its tree's end until `grace` or
    /// `hurry`, then SIGKILL to the tree until empty.
    async fn drain<H>(&mut self, grace: Duration, hurry: H) -> Option<ExitStatus>
    where
        H: Future<Output = ()>,
    {
        let deadline = Instant::now() + grace;
        let mut hurry = std::pin::pin!(hurry);
        let mut gone = false;
        let mut poll = GROUP_POLL.0;
        loop {
            if (self.status.is_some() || gone) && !self.tree_alive().await {
                return self.status;
            }
            let exited = self.status.is_some() || gone;
            tokio::select! {
                status = self.wait(), if !exited => {
                    if status.is_err() {
                        gone = true;
                    }
                }
                () = sleep(poll), if exited => poll = (poll * 2).min(GROUP_POLL.1),
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
