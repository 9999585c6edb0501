//! docs/testing.md's examples, each pasted into a new crate with the
//! `[dev-dependencies]` lines the page shows beside it, build and pass: the
//! test kit works from outside the workspace, on tokio and on smol, and a
//! 72 s partition scenario runs in well under a second of wall time.
//!
//! As `readme_example`: the page's `toml` and `rust` blocks, in pairs (the
//! first of each for tokio, the second for smol), are written into a fresh
//! cargo project (the block as `tests/guide.rs`) in a temporary directory and
//! built offline against this workspace's lockfile and target directory. One
//! substitution, asserted to match once: the dependency's `path =
//! "lease-tokio"` (`"lease-smol"`) becomes this workspace's absolute path. No
//! server is needed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds the tests crate")
        .to_owned()
}

/// `<target>/<profile>/deps/<test>`: the example's build shares `<target>`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.ancestors()
        .nth(3)
        .expect("<target>/<profile>/deps/<test>")
        .to_owned()
}

/// The bodies of the fenced blocks whose info string is `lang`, in order.
fn blocks(page: &str, lang: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = page.lines();
    while lines.by_ref().any(|l| l.trim_end() == format!("```{lang}")) {
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        found.push(body.join("\n") + "\n");
    }
    found
}

#[test]
fn the_testing_guide_example_passes_from_a_crate_of_its_own() {
    let page = fs::read_to_string(workspace().join("docs/testing.md")).expect("read testing.md");
    let (deps, code) = (blocks(&page, "toml"), blocks(&page, "rust"));
    assert_eq!(deps.len(), 2, "a toml block for tokio, one for smol");
    assert_eq!(code.len(), 2, "a rust block for tokio, one for smol");
    for (i, adapter) in ["lease-tokio", "lease-smol"].into_iter().enumerate() {
        let (build_time, run_time) = build_and_run(adapter, &deps[i], &code[i]);
        println!(
            "FIGURE testing guide example ({adapter}) from its own crate: built in \
             {build_time:?} (offline, shared target dir), ran in {run_time:?} (cargo \
             included) for a 72 s virtual scenario"
        );
    }
}

/// Builds the crate of `deps` and `code` against `adapter` and runs its
/// test: how long each took.
fn build_and_run(adapter: &str, deps: &str, code: &str) -> (Duration, Duration) {
    assert!(deps.starts_with("[dev-dependencies]"), "{deps}");
    let from = format!("path = \"{adapter}\"");
    assert_eq!(deps.matches(&from).count(), 1, "{deps}");
    let path = workspace().join(adapter);
    let deps = deps.replace(&from, &format!("path = {:?}", path.display().to_string()));

    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "lease-testing-guide-{adapter}-{}-{nanos}",
        std::process::id()
    ));
    fs::create_dir_all(dir.join("src")).expect("create the crate");
    fs::create_dir_all(dir.join("tests")).expect("create the crate");
    let _cleanup = RemoveOnDrop(dir.clone());
    fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"testing-guide-{adapter}\"\nversion = \"0.0.0\"\n\
             edition = \"2021\"\npublish = false\n\n[workspace]\n\n{deps}"
        ),
    )
    .expect("write Cargo.toml");
    fs::write(dir.join("src/lib.rs"), "").expect("write lib.rs");
    fs::write(dir.join("tests/guide.rs"), code).expect("write the test");
    fs::copy(workspace().join("Cargo.lock"), dir.join("Cargo.lock")).expect("copy Cargo.lock");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = target_dir();
    let built = Instant::now();
    let out = Command::new(&cargo)
        .args([
            "test",
            "--offline",
            "--quiet",
            "--test",
            "guide",
            "--no-run",
        ])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo test --no-run");
    let build_time = built.elapsed();
    assert!(
        out.status.success(),
        "the guide's {adapter} example does not build ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let ran = Instant::now();
    let out = Command::new(&cargo)
        .args(["test", "--offline", "--quiet", "--test", "guide"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo test");
    let run_time = ran.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the guide's {adapter} example fails ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
    (build_time, run_time)
}

/// Removes the example's crate directory (its build output stays in the
/// shared target directory).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
