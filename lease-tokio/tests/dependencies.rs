//! The `metrics` feature costs nothing when off: lease-tokio's dependency graph
//! has no metrics crate then, and has it once the feature is asked for.

use std::process::Command;

fn tree(args: &[&str]) -> String {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--manifest-path", manifest])
        .args(["-p", "lease-tokio", "--prefix", "none", "-e", "normal"])
        .args(args)
        .output()
        .expect("run cargo tree");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo tree failed: {stderr}");
    String::from_utf8(out.stdout).expect("utf-8 from cargo tree")
}

/// Crates of the metrics ecosystem (the facade, its utilities and exporters).
fn metrics_crates(tree: &str) -> Vec<&str> {
    tree.lines()
        .filter(|line| line.starts_with("metrics ") || line.starts_with("metrics-"))
        .collect()
}

#[test]
fn without_the_feature_no_metrics_crate_is_in_the_graph() {
    let off = tree(&[]);
    assert!(off.contains("lease-driver "), "unexpected tree:\n{off}");
    let found = metrics_crates(&off);
    assert!(
        found.is_empty(),
        "metrics crates without the feature: {found:?}"
    );

    // The check can see one: with the feature, the facade is there.
    let on = tree(&["--features", "metrics"]);
    let found = metrics_crates(&on);
    assert!(
        found.iter().any(|line| line.starts_with("metrics v0.24")),
        "no metrics facade with the feature:\n{on}"
    );
}
