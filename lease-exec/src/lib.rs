//! # lease-exec: a subprocess and its whole tree, bounded by a deadline
//!
//! Runs a command so that no process of its tree outlives a deadline the
//! runner keeps moving, nor the runner itself: a small watchdog process
//! starts the command, holds the deadline, and SIGKILLs the command's whole
//! tree when the deadline passes unrenewed (the runner is frozen, starved or
//! deadlocked) or at once when the runner dies, even by SIGKILL. It is what
//! `lease run` (the lease-cli crate) runs its command under; a library user
//! who runs a subprocess under a lease gets the same guarantee with it: a
//! kill deadline just before the server may hand the lease to another
//! replica, renewed at each heartbeat.
//!
//! The promise, its conditions and the tests behind it are stated once, in
//! `docs/guarantees.md` of the repository: the row "`lease run`: no process
//! of the command's tree outlives a graceful stop, a lost lease, the
//! command's own exit (leftovers), or `lease run` itself", with its
//! condition row "the runner and its watchdog are not both SIGKILLed".
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//!
//! fn main() {
//!     // First: this binary is also its own watchdog (no thread, no runtime yet).
//!     lease_exec::maybe_run_watchdog(|_log| {});
//!     let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//!     rt.block_on(async {
//!         let mut command = lease_exec::Command::new("my-job");
//!         command.arg("--once").env("MY_JOB_TOKEN", "42");
//!         let mut dog = lease_exec::Watchdog::start(&command).await?;
//!         let mut job = dog.spawn(Instant::now() + Duration::from_secs(2)).await?;
//!         // Renew while the lease is valid; stop the tree when it is lost.
//!         dog.arm(Instant::now() + Duration::from_secs(2))?;
//!         let status = job.wait().await?;
//!         job.stop_leftovers(Duration::from_secs(5), std::future::pending()).await;
//!         dog.finish().await;
//!         println!("my-job: {status}");
//!         Ok::<(), lease_exec::Error>(())
//!     })
//!     .unwrap();
//! }
//! ```
//!
//! ## The protocol
//!
//! For each command it starts, the runner first starts a watchdog
//! ([`Watchdog::start`]): the same binary re-executed (`/proc/self/exe`)
//! with the hidden subcommand [`SUBCOMMAND`] and the command after `--`, in
//! a process group of its own (not the runner's, so that a SIGSTOP of the
//! runner's group does not stop it), with `PR_SET_PDEATHSIG` set, the
//! runner's stdin and stdout passed as extra descriptors for the command,
//! and the command's variables in its environment. The binary's `main`
//! hands it to [`maybe_run_watchdog`]. It makes itself a subreaper
//! (`PR_SET_CHILD_SUBREAPER`) and says `ready` on its stdout. The runner
//! then writes lines to the watchdog's stdin:
//!
//! - `spawn DEADLINE` ([`Watchdog::spawn`]): start the command in its own
//!   process group and SIGKILL its tree when `CLOCK_MONOTONIC` reaches
//!   DEADLINE (nanoseconds; that clock is system-wide, so both processes
//!   agree on it: [`monotonic_nanos`]). Answered `started PID` (`started
//!   PID CGROUP` with the directory of the command's cgroup leaf, if it has
//!   one: see "The tree") or `failed ERRNO` on stdout.
//! - `arm PGID DEADLINE` ([`Watchdog::arm`]): watch process group PGID
//!   (always the same one, the command's) and kill at DEADLINE instead. A
//!   later `arm` replaces the deadline.
//! - `disarm` ([`Watchdog::disarm`]): no deadline any more (a graceful
//!   stop: the runner's own grace applies).
//! - `lost REASON` ([`Watchdog::lost`]): the lease is lost, for REASON (the
//!   rest of the line); the deadline is now a kill the runner chose. The
//!   line the watchdog logs at a deadline says which it is: a loss the
//!   runner reported, with its reason (INFO), or a runner that stopped
//!   renewing without a word (WARN: frozen or starved). A deadline that
//!   finds nothing to kill (the command exited and left nothing) logs no
//!   warning.
//! - `done` ([`Watchdog::finish`]): the tree is gone; exit without killing
//!   anything.
//!
//! The watchdog reaps the command and every orphan of its tree, and reports
//! the command's exit as `exited STATUS` (the raw wait status) on stdout
//! ([`Job::wait`]).
//!
//! End of file on stdin (the runner died, however), the parent-death signal,
//! or a new parent kill the tree at once, armed or not: nothing else would
//! stop it. A malformed line does too (the runner is not what it should be).
//! A kill is the kill of the whole tree described in "The tree" below.
//! After a deadline kill the watchdog waits for `done` or end of file and
//! exits.
//!
//! The watchdog ignores SIGTERM, SIGINT and SIGHUP (a `systemctl stop` that
//! signals every process of the unit must leave the runner's graceful stop to
//! the runner; the command gets their default disposition back) and exits
//! when its runner does, after the tree; it never outlives it.
//!
//! ## The tree
//!
//! The command is spawned directly (no shell) by the watchdog and tied to
//! its life: the watchdog is the command's parent and a subreaper, so a
//! descendant that left the command's group and session (`setsid`, a
//! daemon's double fork, `nohup ... &`) and lost its parent becomes the
//! watchdog's child, not init's. A runner that called [`become_subreaper`]
//! is one too, for a tree whose watchdog died. When the runner dies the
//! watchdog kills the tree; when the watchdog dies, the command gets
//! SIGKILL from the kernel (`PR_SET_PDEATHSIG`) and the runner's [`Job`]
//! kills the rest.
//!
//! The tree is read by walking it from the subreaper down, through each
//! process's children lists (`/proc/PID/task/TID/children`), never by
//! reading the whole process table: a walk, and so a stop, costs the size
//! of the command's tree whatever the host's process count. Without those
//! lists (a kernel built without `CONFIG_PROC_CHILDREN`) each walk reads
//! all of `/proc` instead. The walk starts at the watchdog; in the runner
//! after [`become_subreaper`] at the runner, leaving out its other
//! watchdogs' subtrees; in a runner that is no subreaper and whose
//! watchdog is gone, only the command's group (and its cgroup leaf, if
//! any) is left to signal and check.
//! One walk is not a snapshot (a process whose parent dies meanwhile moves
//! to the subreaper's list, perhaps after the walk read it), so each answer
//! takes two walks in a row that find the same processes.
//!
//! A kill of the tree, by the watchdog or by a [`Job`]'s stop, cannot be
//! outrun by a process that forks and exits faster than one round of
//! signals (a child that calls `setsid` every millisecond while its parent
//! exits):
//!
//! - **A cgroup v2 leaf**, where one can be made: at `spawn` the watchdog
//!   creates `lease-exec-WATCHDOG_PID` under its own cgroup in the cgroup
//!   v2 hierarchy (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` in a hybrid
//!   layout) and the command moves into it before it execs, so that every
//!   descendant is in it too. A kill writes `1` to its `cgroup.kill`: the
//!   kernel kills every member, forks under way included, in one step, and
//!   `populated 0` in its `cgroup.events` says they are gone. It needs
//!   write access to the runner's cgroup (root, or a delegated subtree:
//!   systemd's `Delegate=yes`) and `cgroup.kill` (Linux 5.14); elsewhere
//!   there is none, and [`Command::cgroup`] turns it off. The watchdog
//!   removes the leaf when it exits.
//! - **The tree walk, frozen first**, always (alone where there is no
//!   leaf; after the leaf's kill it finds nothing or what left the leaf):
//!   SIGSTOP to each process a walk finds running, before its children are
//!   read, walking again until two walks in a row find the same processes,
//!   all stopped (or exited). A stopped process cannot fork, and a fork
//!   under way when the SIGSTOP came gives a child that is stopped too.
//!   Then SIGKILL to each process a walk finds, walking again until two
//!   walks in a row find none alive: "until none is left".
//!
//! A [`Job`]'s walks and waits run on the tokio runtime's blocking threads,
//! never on the thread that runs the runner's other tasks (its
//! heartbeats).
//!
//! ## Limits
//!
//! A process group id can be reused once every member is gone: call
//! [`Watchdog::finish`] as soon as the tree is gone, the watchdog kills only
//! before that. A watchdog killed by SIGKILL leaves its (empty) cgroup leaf
//! behind; the next watchdog with the same pid removes it. A process of the
//! tree that moves itself to another cgroup (it needs write access there)
//! leaves the leaf, not the walk. A process that a tracer keeps running
//! through SIGSTOP is killed without being frozen first (after 500 ms of
//! trying). A watchdog frozen together with its runner (a cgroup
//! freeze, a VM pause) cannot act either: `docs/fencing.md` of the
//! repository has the recipe for that. Killing both the runner and the
//! watchdog with SIGKILL leaves the command's escaped descendants (not its
//! group: the command dies with the watchdog) to init; in a cgroup leaf
//! they stay in it, where a write of `1` to its `cgroup.kill` (or the stop
//! of a systemd unit) still reaches them. A process under
//! another uid (a setuid program) cannot be signalled by a runner that is
//! not root: it is waited for but not killed. A process started on the
//! command's behalf by something outside the tree (`systemd-run`, `at`, a
//! container runtime) is not in it. A pid read from `/proc` can in theory
//! be reused between the read and the kill.
//!
//! ## Linux only
//!
//! `prctl` (`PR_SET_PDEATHSIG`, `PR_SET_CHILD_SUBREAPER`), `timerfd` and
//! `/proc` (and cgroup v2 where it can be used): on other systems the crate
//! does not build. The parent-death signal fires when the *thread* that
//! spawned the child exits: the watchdog is single-threaded, and
//! [`Watchdog::start`] says which thread to start it from.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(html_root_url = "https://docs.rs/lease-exec/0.1")]
#![warn(missing_docs)]

#[cfg(not(target_os = "linux"))]
compile_error!(
    "lease-exec is Linux-only: it ties the command's life to its watchdog's with \
     prctl(PR_SET_PDEATHSIG) and makes the watchdog a subreaper"
);

mod cgroup;
mod clock;
mod error;
mod job;
mod protocol;
mod runner;
mod tree;
mod watchdog;

pub use clock::monotonic_nanos;
pub use error::Error;
pub use job::Job;
pub use protocol::SUBCOMMAND;
pub use runner::{Command, Watchdog};
pub use tree::become_subreaper;
pub use watchdog::{maybe_run_watchdog, watchdog_main};
