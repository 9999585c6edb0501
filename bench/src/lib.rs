//! What the `bench` and `demo` binaries share: building another binary of the workspace
//! the way the running one was built.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Variables that `cargo run` sets for the program it runs, by name or prefix. A `cargo`
/// started by that program must not inherit them: build scripts that watch them
/// (`cargo:rerun-if-env-changed`; ring's watches `CARGO_MANIFEST_DIR` and
/// `CARGO_PKG_*`) would see them changed, rebuild, and so invalidate the next `cargo run`.
const SET_BY_CARGO_RUN: [&str; 8] = [
    "CARGO_MANIFEST_",
    "CARGO_PKG_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// Whether `cargo run` set the variable `name` for the program it runs.
fn set_by_cargo_run(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    SET_BY_CARGO_RUN.iter().any(|p| name.starts_with(p))
}

/// Builds binary `bin` of package `package` (with `features`) with the profile of the
/// running binary, into its directory, and returns its path. `cargo run --bin demo`
/// builds only `demo`; running cargo each time keeps the other binary in step with its
/// sources (a no-op when it is, about a second).
pub fn build_sibling(package: &str, bin: &str, features: &[&str]) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating this binary: {e}"))?;
    let dir = exe.parent().ok_or("this binary has no directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    for (name, _) in std::env::vars_os() {
        if set_by_cargo_run(&name) {
            cmd.env_remove(name);
        }
    }
    cmd.args(["build", "-p", package, "--bin", bin])
        .args(features.iter().flat_map(|f| ["--features", f]))
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    let mut flag = String::new();
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => flag = " --release".into(),
        Some(profile) => flag = format!(" --profile {profile}"),
        None => return Err(format!("unexpected binary location {}", exe.display())),
    }
    cmd.args(flag.split_whitespace());
    let status = cmd
        .status()
        .map_err(|e| format!("running cargo to build the {bin} binary: {e}"))?;
    let path = dir.join(bin);
    if !status.success() || !path.is_file() {
        return Err(format!(
            "building the {bin} binary failed ({status}); try: \
             cargo build{flag} -p {package} --bin {bin}"
        ));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_run;

    #[test]
    fn only_what_cargo_run_sets_is_dropped() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_BIN_NAME",
            "OUT_DIR",
        ] {
            assert!(set_by_cargo_run(name.as_ref()), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_PROFILE_DEV_DEBUG",
        ] {
            assert!(!set_by_cargo_run(name.as_ref()), "{name}");
        }
    }
}
