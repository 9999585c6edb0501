//! The runner's handle on a running command: its exit, and the stops of its
//! whole tree.

use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{BufReader, Lines};
use tokio::process::ChildStdout;
use tokio::time::{sleep, Instant};

use crate::error::Error;
use crate::tree::{group_alive, job_tree_in, processes, signal_each, signal_group};

/// How often the tree is checked for members while waiting for it to go.
const GROUP_POLL: Duration = Duration::from_millis(10);

/// A running command, started by its [`Watchdog`](crate::Watchdog) with
/// [`Watchdog::spawn`](crate::Watchdog::spawn): its pid (also its process
/// group), its exit as the watchdog reports it, and the stops of its tree.
///
/// The command's tree is its process group and every other descendant of
/// its watchdog (the command's parent and a subreaper: an orphan of the
/// tree becomes its child, whatever group or session it moved to); after
/// [`become_subreaper`](crate::become_subreaper) also the runner's own
/// orphans, but not its other watchdogs' subtrees.
///
/// Dropping it sends SIGKILL to the tree (once): nothing of it may outlive
/// the handle by mistake (an early return, a panic). The watchdog kills it
/// too when its pipe closes.
#[must_use = "dropping a Job kills the command's tree at once"]
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

impl Drop for Job {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

/// This process's pid.
fn own_pid() -> i32 {
    std::process::id() as i32
}

impl Job {
    /// The job of command `pid`, started by watchdog `watchdog`, whose
    /// reports come on `events`.
    pub(crate) fn new(pid: i32, watchdog: i32, events: Lines<BufReader<ChildStdout>>) -> Job {
        Job {
            pgid: pid,
            watchdog,
            events,
            status: None,
        }
    }

    /// The command's pid, which is also its process group id.
    pub fn pid(&self) -> u32 {
        self.pgid.unsigned_abs()
    }

    /// `sig` to the command's group and every other process of its tree;
    /// how many processes the tree had.
    fn signal(&self, sig: libc::c_int) -> usize {
        signal_group(self.pgid, sig);
        let tree =
            processes().map_or_else(Vec::new, |all| job_tree_in(&all, own_pid(), self.watchdog));
        signal_each(&tree, |pgrp| pgrp != self.pgid, sig);
        tree.len()
    }

    /// Whether a live process is left in the command's tree (one read of
    /// `/proc`; the group's signal check if `/proc` cannot be read).
    fn tree_alive(&self) -> bool {
        match processes() {
            Some(all) => !job_tree_in(&all, own_pid(), self.watchdog).is_empty(),
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
    pub async fn terminate<H>(&mut self, grace: Duration, hurry: H) -> Option<ExitStatus>
    where
        H: Future<Output = ()>,
    {
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
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
        if !self.tree_alive() {
            return false;
        }
        tracing::info!(
            pgid = self.pgid,
            "processes left in the command's tree; sending them SIGTERM"
        );
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
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
