//! The command's cgroup v2 leaf, where one can be made: the watchdog
//! creates it under its own cgroup, the command moves into it before it
//! execs, and a kill is one write to its `cgroup.kill` (the kernel kills
//! every member, a fork under way included: nothing can outrun it).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The leaf's name under the watchdog's cgroup: `lease-exec-WATCHDOG_PID`.
pub(crate) fn leaf_name(watchdog: i32) -> String {
    format!("lease-exec-{watchdog}")
}

/// The watchdog's handle on the leaf: its directory and its `cgroup.procs`,
/// open for the command to move itself in. Dropped, it removes the leaf
/// (only an empty one can be: otherwise it stays).
#[derive(Debug)]
pub(crate) struct Leaf {
    dir: PathBuf,
    procs: OwnedFd,
}

impl Leaf {
    /// A fresh leaf for this watchdog's command; `None` where none can be
    /// made: no cgroup v2 hierarchy mounted, no write access to this
    /// process's cgroup (no delegation), or a kernel without `cgroup.kill`
    /// (before 5.14).
    pub(crate) fn create() -> Option<Leaf> {
        let parent = own_cgroup_dir()?;
        let dir = parent.join(leaf_name(std::process::id() as i32));
        if let Err(e) = std::fs::create_dir(&dir) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                return None;
            }
            // Left by a watchdog that died with this pid: empty, or not ours.
            std::fs::remove_dir(&dir).ok()?;
            std::fs::create_dir(&dir).ok()?;
        }
        let leaf = (|| {
            if !dir.join("cgroup.kill").exists() {
                return None;
            }
            let path = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok()?;
            // SAFETY: open with a valid C string; the result is a fresh
            // descriptor that nothing else owns.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            // SAFETY: as above.
            (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
        })();
        match leaf {
            Some(procs) => Some(Leaf {
                dir: dir.clone(),
                procs,
            }),
            None => {
                let _ = std::fs::remove_dir(&dir);
                None
            }
        }
    }

    /// The leaf's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its `cgroup.procs`, for [`join`] in the command's `pre_exec`.
    pub(crate) fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

impl Drop for Leaf {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is open
/// as `procs` ("0": the writer). Async-signal-safe: for a `pre_exec`.
pub(crate) fn join(procs: RawFd) -> io::Result<()> {
    // SAFETY: a write of one byte from a static buffer.
    if unsafe { libc::write(procs, b"0".as_ptr().cast(), 1) } != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// SIGKILL to every process of the cgroup at `dir`, forks under way
/// included (`cgroup.kill`); `false` if it could not be written.
pub(crate) fn kill(dir: &Path) -> bool {
    std::fs::write(dir.join("cgroup.kill"), "1").is_ok()
}

/// Whether the cgroup at `dir` still has a live process (`populated 1` in
/// its `cgroup.events`; a cgroup that cannot be read has none).
pub(crate) fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|events| events.lines().any(|l| l.trim() == "populated 1"))
}

/// The directory of this process's cgroup in the cgroup v2 hierarchy: the
/// `0::PATH` line of `/proc/self/cgroup` under the mount point of the
/// `cgroup2` file system (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` in
/// a hybrid layout).
fn own_cgroup_dir() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim_end();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS... - FSTYPE SOURCE OPTIONS
    let (root, mount) = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut fields = left.split_whitespace();
        let root = fields.nth(3)?;
        let mount = fields.next()?;
        Some((root.to_owned(), mount.to_owned()))
    })?;
    // Mount points with spaces are escaped (\040): not handled, no cgroup.
    if mount.contains('\\') || root.contains('\\') {
        return None;
    }
    let relative = if root == "/" {
        path
    } else {
        path.strip_prefix(root.as_str())?
    };
    let dir = Path::new(&mount).join(relative.trim_start_matches('/'));
    // Named to the runner on one line.
    (dir.is_dir() && !dir.as_os_str().as_bytes().contains(&b'\n')).then_some(dir)
}
