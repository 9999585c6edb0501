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

use crate::pasted::{cargo, workspace, Crate};
use std::fs;
use std::time::{Duration, Instant};

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

    let krate = Crate::new(&format!("testing-guide-{adapter}"));
    krate.write(
        "Cargo.toml",
        &format!(
            "[package]\nname = \"testing-guide-{adapter}\"\nversion = \"0.0.0\"\n\
             edition = \"2021\"\npublish = false\n\n[workspace]\n\n{deps}"
        ),
    );
    krate.write("src/lib.rs", "");
    krate.write("tests/guide.rs", code);
    let built = Instant::now();
    let out = cargo(
        krate.dir(),
        &[
            "test",
            "--offline",
            "--quiet",
            "--test",
            "guide",
            "--no-run",
        ],
    )
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
    let out = cargo(
        krate.dir(),
        &["test", "--offline", "--quiet", "--test", "guide"],
    )
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
