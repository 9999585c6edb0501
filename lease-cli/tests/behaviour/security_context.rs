//! `lease run` under the Kubernetes recipe's `securityContext`
//! (deploy/kubernetes/deployment.yaml): a non-root user (65534, the Dockerfile's `USER`), no
//! new privileges, no capabilities, a read-only root filesystem with an empty writable `/tmp`
//! (the recipe's `emptyDir`, where `lease valid`'s socket goes). It takes the lease, runs its
//! command and releases the lease, without a warning. Made here with a mount namespace whose
//! `/` is remounted read-only and a tmpfs on `/tmp` (`unshare --mount`), and `setpriv`, as
//! root.

use crate::common::*;
use lease_tests::Replica;
use std::os::unix::fs::PermissionsExt;

#[test]
fn lease_run_needs_no_root_no_capability_and_no_writable_root_filesystem() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["unshare", "setpriv"]
        .iter()
        .all(|t| std::process::Command::new(t).arg("--help").output().is_ok());
    if !root || !tools {
        eprintln!("SKIPPED: needs root, unshare and setpriv (util-linux)");
        return;
    }
    let c = cluster();
    let name = unique("security-context");
    // The binary where user 65534 can reach it (a CI clone's directory is mode 0700) and
    // the tmpfs on /tmp does not hide it.
    let dir = std::path::Path::new("/var/tmp").join(unique("lease-ro"));
    std::fs::create_dir(&dir).expect("a directory for the binary");
    let bin = dir.join("lease");
    std::fs::copy(env!("CARGO_BIN_EXE_lease"), &bin).expect("copy the binary");
    for path in [&dir, &bin] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    // What the command reports of the context it runs in.
    let script = "echo uid=$(id -u); \
         grep -E '^(NoNewPrivs|CapEff|CapBnd):' /proc/self/status | tr -d '\\t'; \
         echo root=$(awk '$5 == \"/\" { o = $6 } END { print substr(o, 1, 2) }' /proc/self/mountinfo); \
         echo ran";
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(
            "mount -o remount,bind,ro / && mount -t tmpfs -o mode=1777 tmpfs /tmp \
             && exec setpriv --reuid 65534 --regid 65534 \
             --clear-groups --no-new-privs --bounding-set -all --inh-caps -all \"$0\" \"$@\"",
        )
        .arg(&bin);
    for var in ENVIRONMENT {
        cmd.env_remove(var);
    }
    let cmd = run_sh_with(cmd, &c.url("postgres"), &FAST, &name, script);
    let mut r = Replica::spawn(cmd).expect("spawn unshare");
    let status = r.wait_exit(MS(20_000)).expect("it exits");
    let (out, err) = texts(&r);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    for want in [
        "uid=65534",
        "NoNewPrivs:1",
        "CapEff:0000000000000000",
        "CapBnd:0000000000000000",
        "root=ro",
        "ran",
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "no {want:?} in:\n{out}\n{err}"
        );
    }
    assert!(err.contains("lease acquired"), "{err}");
    assert!(!err.contains(" WARN "), "a warning: {err}");
    assert!(err.contains("lease released"), "{err}");
}
