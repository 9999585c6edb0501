//! `lease run --give-up-after D`: exit 1 with the last connection error once no database
//! session has been ready for D, from the start or after a session that worked.

use crate::common::*;
use lease_tests::{FaultProxy, Mode, Replica};
use std::net::{SocketAddr, TcpListener};
use std::time::Instant;

/// The command of these runners: prints `start`, and `stop` on SIGTERM.
const ANNOUNCE: &str = r#"echo start; trap "echo stop; exit 0" TERM; while :; do sleep 0.02; done"#;

/// Nothing listens: exit 1 about D after the start, the last line naming the cause; without
/// the flag the same runner retries on.
#[test]
fn give_up_after_exits_1_with_the_last_error_when_no_session_opens() {
    let nobody = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = nobody.local_addr().expect("addr");
    drop(nobody);
    let url = format!("postgres://u:sekrit@{addr}/db");
    let start = Instant::now();
    let cmd = run_sh(
        &url,
        &fast_and(&["--give-up-after", "1s"]),
        "give-up",
        "echo start",
    );
    let (status, out, err, _) = output(cmd, MS(10_000));
    let took = start.elapsed();
    eprintln!("FIGURE --give-up-after 1s, nothing listening: exit after {took:?}");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(took >= MS(1_000) && took < MS(5_000), "{took:?}");
    assert!(out.is_empty(), "the command ran: {out}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("no database session for 1s (--give-up-after): giving up; the last error:")
            && last.contains("Connection refused"),
        "{err}"
    );
    assert!(!err.contains("sekrit"), "{err}");
    // Bad usage: 0 and a non-duration.
    for bad in ["0s", "soon"] {
        let (status, _, err, _) = output(
            run_sh(&url, &["--give-up-after", bad], "give-up", "true"),
            MS(5_000),
        );
        assert_eq!(status.code(), Some(2), "{bad}: {err}");
    }
}

/// A leader whose database goes silent: its session, so its lease, is lost at the end of the
/// validity; its command is stopped, and D after the session was last ready `lease run` exits
/// 1. A session that stays ready for longer than D is no reason to give up.
#[test]
fn give_up_after_counts_from_the_last_ready_session_and_stops_a_leader_first() {
    let c = cluster();
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], c.port()))).expect("proxy");
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let name = unique("give-up");
    let mut r = Replica::spawn(run_sh(
        &url,
        &fast_and(&["--give-up-after", "1s"]),
        &name,
        ANNOUNCE,
    ))
    .expect("spawn");
    r.wait_for_line(|l| l == "start", MS(10_000))
        .expect("it leads");
    // Twice D with a ready session: still running.
    std::thread::sleep(MS(2_000));
    assert!(r.is_alive(), "gave up with a ready session");
    let cut = Instant::now();
    proxy.set_mode(Mode::BlackHole);
    let status = r.wait_exit(MS(15_000)).expect("it gives up");
    let took = cut.elapsed();
    let (out, err) = texts(&r);
    eprintln!("FIGURE --give-up-after 1s, leader black-holed: exit 1 after {took:?}");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        out.lines().any(|l| l == "stop"),
        "the command was not stopped:\n{out}\n{err}"
    );
    assert!(took >= MS(1_000), "{took:?}");
    assert!(err.contains("(--give-up-after): giving up"), "{err}");
}
