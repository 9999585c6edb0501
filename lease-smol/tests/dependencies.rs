//! lease-smol's dependency graph stays free of tokio's runtime. (Its behaviour against
//! a real server is tested with lease-tokio's by one suite: `tests/tests/behaviour/drivers`.)

use std::process::Command;

/// Fails if lease-smol's dependency graph (dev-dependencies included; with and
/// without the `rustls` feature, and with the test kit's `test-util`) ever
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
    // Without features, with the rustls connector, and with the test kit (its
    // virtual time is its own executor, not tokio's).
    for features in [
        &[][..],
        &["--features", "rustls"][..],
        &["--features", "test-util"][..],
    ] {
        let tokio = tree(&[features, &["-i", "tokio"]].concat());
        println!("cargo tree -p lease-smol {features:?} -e features -i tokio:\n{tokio}");
        assert!(
            features != ["--features", "rustls"] || tokio.contains("tokio-rustls"),
            "the rustls feature does not bring tokio-rustls: {tokio}"
        );
        for line in tokio.lines() {
            assert!(
                !line.contains(r#"tokio feature "rt"#),
                "tokio's runtime is in the graph ({features:?}): {line}"
            );
        }
        let all = tree(&[features, &["--prefix", "none"]].concat());
        for line in all.lines() {
            assert!(
                !line.starts_with("async-compat ")
                    && !line.contains(r#"tokio-postgres feature "runtime""#),
                "{features:?}: {line}"
            );
        }
    }
}
