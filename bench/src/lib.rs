//! What the `bench` and `demo` binaries share: building another binary of the workspace
//! the way the running one was built.

use std::path::{Path, PathBuf};

/// Builds binary `bin` of package `package` (with `features`) with the profile of the
/// running binary, into its directory, and returns its path. `cargo run --bin demo`
/// builds only `demo`; running cargo each time keeps the other binary in step with its
/// sources (a no-op when it is, about a second).
pub fn build_sibling(package: &str, bin: &str, features: &[&str]) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating this binary: {e}"))?;
    let dir = exe.parent().ok_or("this binary has no directory")?;
    // Without what `cargo run` set for this binary (lease-tests' `nested_cargo`).
    let mut cmd = lease_tests::process::nested_cargo();
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
