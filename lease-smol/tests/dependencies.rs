//! lease-smol's dependency graph stays free of tokio's runtime. (Its behaviour against
//! a real server is tested with lease-tokio's by one suite: `tests/tests/drivers`.)

use std::process::Command;

/// Fails if lease-smol's dependency graph (dev-dependencies included) ever
/// contains tokio's runtime, tokio-postgres's "runtime" feature (tokio's
/// reactor) or async-compat (which starts a hidden tokio runtime).
#[test]
fn the_dependency_graph_has_no_tokio_runtime() {
    let tree = |args: &[&str]| {
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        let out = Command::new(env!("CARGO"))
            .args(["tree", "--offline", "--manifest-path", manifest])
            .args(["-p", "lease-smol", "-e", "features"])
            .args(args)
            .output()
            .expect("run cargo tree");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "cargo tree failed: {stderr}");
        String::from_utf8(out.stdout).expect("utf-8 from cargo tree")
    };
    let tokio = tree(&["-i", "tokio"]);
    println!("cargo tree -p lease-smol -e features -i tokio:\n{tokio}");
    for line in tokio.lines() {
        assert!(
            !line.contains(r#"tokio feature "rt"#),
            "tokio's runtime is in the graph: {line}"
        );
    }
    let all = tree(&["--prefix", "none"]);
    for line in all.lines() {
        assert!(
            !line.starts_with("async-compat ")
                && !line.contains(r#"tokio-postgres feature "runtime""#),
            "{line}"
        );
    }
}
