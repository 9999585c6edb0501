//! Lease names and interval floors at the command line: a name that is not in
//! Unicode NFC form, one with an invisible or a bidirectional control
//! character, a plain lease named like a shard (`NAME/0`), and an interval
//! below its floor are bad usage: exit 2 with one line, before any
//! connection to the database.

use crate::common::*;
use std::io::ErrorKind;
use std::net::TcpListener;

/// Runs `lease ARGS` with `DATABASE_URL` pointing at a listener that
/// records any connection; asserts exit 2, nothing on stdout, one stderr
/// line that contains `words`, and no connection. `Err`: what happened
/// instead, for one assertion over every case.
fn refused(args: &[&str], words: &str) -> Result<String, String> {
    let db = TcpListener::bind("127.0.0.1:0").expect("bind");
    db.set_nonblocking(true).expect("nonblocking");
    let port = db.local_addr().expect("addr").port();
    let mut cmd = lease();
    cmd.env("DATABASE_URL", format!("postgres://u@127.0.0.1:{port}/x"))
        .args(args);
    let (status, out, err, took) = try_output(cmd, MS(3_000));
    let connected = !matches!(db.accept(), Err(e) if e.kind() == ErrorKind::WouldBlock);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    let code = status.and_then(|s| s.code());
    let what = format!(
        "{args:?}: {} after {took:?}, stdout {:?}, stderr {lines:?}{}",
        exit_text(status),
        out.trim(),
        if connected {
            ", connected to the database"
        } else {
            ""
        }
    );
    eprintln!("{what}");
    let ok = code == Some(2)
        && out.is_empty()
        && !connected
        && lines.len() == 1
        && lines[0].starts_with("lease: error: ")
        && lines[0].contains(words);
    if ok {
        Ok(what)
    } else {
        Err(what)
    }
}

/// Every case refused; the failures listed together.
fn all_refused(cases: &[(Vec<&str>, &str)]) {
    let wrong: Vec<String> = (cases.iter())
        .filter_map(|(args, words)| refused(args, words).err())
        .collect();
    assert!(
        wrong.is_empty(),
        "accepted, or not refused on one line with the expected words:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn lookalike_names_and_shard_names_are_refused() {
    let nfd = "caf\u{65}\u{301}";
    let zero_width = "night\u{200b}ly";
    let override_ = "job\u{202e}x";
    all_refused(&[
        (
            vec!["key", nfd],
            "not in Unicode NFC form (U+0065 at character 4)",
        ),
        (vec!["run", nfd, "--", "true"], "NFC"),
        (vec!["status", nfd], "NFC"),
        (
            vec!["key", zero_width],
            "invisible character U+200B at character 6",
        ),
        (vec!["run", zero_width, "--", "true"], "U+200B"),
        (
            vec!["key", override_],
            "bidirectional control character U+202E at character 4",
        ),
        (vec!["run", override_, "--", "true"], "U+202E"),
        (vec!["run", "NAME/0", "--", "true"], "shard"),
        (vec!["run", "reindexer/3", "--", "true"], "shard"),
        (vec!["handover", "NAME/0", "--to", "4242"], "shard"),
    ]);
    // A shard's name still shows its key (`lease key`, `lease status`): the
    // key of shard 0 of the group NAME, which `lease run NAME/0` would share.
    let mut key = lease();
    key.args(["key", "NAME/0"]);
    let (status, out, err, _) = output(key, MS(3_000));
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.trim(), "5049073497831337967");
}

#[test]
fn intervals_below_their_floor_are_refused() {
    let run = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["floor-job", "--", "true"]);
        args
    };
    all_refused(&[
        (
            run(&["--heartbeat-interval", "1ns"]),
            "heartbeat interval (1ns) must be at least 10ms",
        ),
        (
            run(&["--retry-interval", "1ms", "--lock-delay", "0s"]),
            "retry interval (1ms) must be at least 10ms",
        ),
        (
            run(&["--guard-margin", "1us"]),
            "guard margin (1µs) must be at least 1ms",
        ),
        (
            run(&["--lock-delay", "1ns"]),
            "lock delay (1ns) must be at least 1ms",
        ),
        (
            run(&["--query-timeout", "1ms"]),
            "query timeout (1ms) must be at least 10ms",
        ),
    ]);
}
