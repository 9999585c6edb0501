//! The README's main Rust example, pasted into a new crate with the
//! `[dependencies]` lines the README shows, compiles and hands over on Ctrl-C
//! in under 100 ms.
//!
//! The test reads both blocks from README.md (the first `toml` and the first
//! `rust` block of "Use it from Rust"), writes them into a fresh cargo project
//! in a temporary directory and builds it offline against this workspace's
//! lockfile and target directory (dependencies already built there are
//! reused). Three substitutions, each asserted to match exactly once: the
//! dependency's `path = "/path/to/lease/lease-tokio"` becomes this workspace's absolute path,
//! and, in the code, the connection string `host=127.0.0.1 user=postgres
//! dbname=postgres` becomes the ephemeral cluster's (it adds the port) and
//! the lease name `nightly-sweeper` a unique one. Everything else is the
//! README's text.
//!
//! Two copies run; once the leader prints "sweeping" and the standby stands
//! by (its try has lost, or it waits on the key), the leader gets SIGINT (what
//! Ctrl-C sends to the foreground process group). The library's default retry
//! interval is 5 s: only the server can wake the standby in time (the release
//! notification, or the freed key it waits on). Timings are printed
//! (`-- --nocapture`).

use crate::common::*;
use crate::pasted::{cargo, target_dir, workspace, Crate};
use lease_tests::scenario::Admin;
use lease_tests::scenario::TRY_PREFIX;
use lease_tests::Cluster;
use lease_tests::Replica;
use lease_tests::Stream;
use std::fs;
use std::process::Command;
use std::time::Instant;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

const README_URL: &str = "host=127.0.0.1 user=postgres dbname=postgres";

const README_NAME: &str = "nightly-sweeper";

const README_PATH: &str = "path = \"/path/to/lease/lease-tokio\"";

/// The body of the first fenced block whose info string starts with `lang`,
/// after the line `## Use it from Rust`.
fn block(readme: &str, lang: &str) -> String {
    let section = readme
        .split_once("\n## Use it from Rust\n")
        .expect("README has a \"Use it from Rust\" section")
        .1;
    let mut lines = section.lines();
    lines
        .by_ref()
        .find(|l| l.starts_with("```") && l[3..].starts_with(lang))
        .unwrap_or_else(|| panic!("no ```{lang} block"));
    let body: Vec<&str> = lines.take_while(|l| !l.starts_with("```")).collect();
    body.join("\n") + "\n"
}

/// `text` with `from` (which must occur exactly once) replaced by `to`.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "the README block should contain {from:?} exactly once:\n{text}"
    );
    text.replace(from, to)
}

#[test]
fn the_readme_example_compiles_as_pasted_and_hands_over_on_ctrl_c_within_100ms() {
    let readme = fs::read_to_string(workspace().join("README.md")).expect("read README.md");
    let deps = block(&readme, "toml");
    let code = block(&readme, "rust");
    assert!(deps.starts_with("[dependencies]"), "{deps}");
    let lease_tokio = workspace().join("lease-tokio");
    let deps = replace_once(
        &deps,
        README_PATH,
        &format!("path = {:?}", lease_tokio.display().to_string()),
    );

    let cluster = Cluster::start().expect("an ephemeral PostgreSQL");
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("readme-{}-{nanos}", std::process::id());
    let code = replace_once(&code, README_URL, &cluster.conn_string());
    let code = replace_once(&code, &format!("{README_NAME:?}"), &format!("{name:?}"));

    // The new crate: a package header, the README's dependency lines, its code.
    let krate = Crate::new("readme-example");
    krate.write(
        "Cargo.toml",
        &format!(
            "[package]\nname = \"readme-example\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n{deps}"
        ),
    );
    krate.write("src/main.rs", &code);
    let built = Instant::now();
    let out = cargo(
        krate.dir(),
        &["build", "--offline", "--quiet", "--bin", "readme-example"],
    )
    .output()
    .expect("run cargo build");
    let build_time = built.elapsed();
    assert!(
        out.status.success(),
        "the README example does not build ({}):\n{}\n--- Cargo.toml deps ---\n{deps}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = target_dir().join("debug").join("readme-example");

    let admin = Admin::connect(&cluster.conn_string()).expect("admin connection");
    let key = lease_proto::LeaseId::named(&name)
        .expect("a lease name")
        .key();
    let sweeping = |r: &Replica| {
        r.lines()
            .into_iter()
            .find(|l| {
                l.stream == Stream::Stdout && l.text.starts_with("sweeping with fencing token ")
            })
            .map(|l| l.at)
    };
    let mut a = Replica::spawn(Command::new(&bin)).expect("spawn the first copy");
    a.wait_for_line(|l| l.starts_with("sweeping"), MS(15_000))
        .expect("the first copy sweeps");
    let a_pid = admin.holders(key).expect("pg_locks");
    assert_eq!(a_pid.len(), 1, "one holder: {a_pid:?}");
    let mut b = Replica::spawn(Command::new(&bin)).expect("spawn the second copy");
    // The standby's session (the library's default application_name) stands by:
    // its last statement is the lost try, or it waits on the leader's key.
    let deadline = Instant::now() + MS(15_000);
    loop {
        let rows = admin
            .rows(&format!(
                "SELECT query, wait_event_type FROM pg_stat_activity \
                 WHERE (application_name = 'lease' OR application_name LIKE 'lease@%') AND pid <> {}",
                a_pid[0]
            ))
            .expect("pg_stat_activity");
        let standing_by = |r: &Vec<Option<String>>| {
            r[0].as_deref().is_some_and(|q| q.starts_with(TRY_PREFIX))
                || r[1].as_deref() == Some("Lock")
        };
        if rows.len() == 1 && standing_by(&rows[0]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no standby standing by: {rows:?}"
        );
        std::thread::sleep(MS(2));
    }
    assert_eq!(
        sweeping(&b),
        None,
        "the standby swept while the leader held"
    );

    let signalled = Instant::now();
    // What Ctrl-C in a terminal sends: SIGINT to the foreground process group.
    a.sigint().expect("SIGINT");
    let status = a
        .wait_exit(MS(10_000))
        .expect("the first copy exits on Ctrl-C");
    let exited = Instant::now();
    b.wait_for_line(|l| l.starts_with("sweeping"), MS(10_000))
        .unwrap_or_else(|e| panic!("the standby never took over: {e}"));
    let b_swept = sweeping(&b).expect("the standby swept");
    let handover = b_swept.saturating_duration_since(signalled);
    let after_exit = if b_swept >= exited {
        format!("{:?} after", b_swept - exited)
    } else {
        format!("{:?} before", exited - b_swept)
    };
    eprintln!(
        "README example: built in {build_time:?} (offline, shared target dir); Ctrl-C (SIGINT) \
         -> the standby sweeping {handover:?}; the leader exited {:?} after the signal, the \
         standby swept {after_exit} that",
        exited - signalled
    );
    assert!(
        status.success(),
        "the first copy exited with {status}: {:#?}",
        a.lines()
    );
    assert!(handover < MS(100), "handover took {handover:?}");
    let _ = b.kill9();
    let _ = b.wait_exit(MS(5_000));
}
