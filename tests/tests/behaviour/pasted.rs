//! What `readme_example` and `testing_guide` share: a crate of blocks pasted from
//! the docs, in a temporary directory, built by a `cargo` of its own into this
//! workspace's target directory (dependencies already built there are reused).

use lease_tests::process::nested_cargo;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// The workspace's root directory.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds the tests crate")
        .to_owned()
}

/// The target directory this test was built into (`<target>/<profile>/deps/<test>`):
/// the pasted crate's build shares it, whatever `CARGO_TARGET_DIR` says.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.ancestors()
        .nth(3)
        .expect("<target>/<profile>/deps/<test>")
        .to_owned()
}

/// `cargo ARGS` in `dir`, building into [`target_dir`], without what `cargo test`
/// set for this test ([`nested_cargo`]: else ring's build script, watching
/// `CARGO_MANIFEST_DIR`, rebuilds it and everything above it, here and in CI's next
/// workspace build).
pub fn cargo(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = nested_cargo();
    cmd.args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir());
    cmd
}

/// A new crate directory, `<tmp>/lease-<what>-<pid>-<nanos>` with an empty `src/`,
/// holding the workspace's `Cargo.lock`; removed on drop (its build output stays
/// in the shared target directory).
pub struct Crate(PathBuf);

impl Crate {
    pub fn new(what: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("lease-{what}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(dir.join("src")).expect("create the crate");
        let this = Crate(dir);
        fs::copy(workspace().join("Cargo.lock"), this.0.join("Cargo.lock"))
            .expect("copy Cargo.lock");
        this
    }

    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to `path` (relative to the crate), creating its directory.
    pub fn write(&self, path: &str, text: &str) {
        let path = self.0.join(path);
        fs::create_dir_all(path.parent().expect("a file in the crate"))
            .expect("create a directory");
        fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

impl Drop for Crate {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
