//! Reconnecting after a session that passed its setup ends (a server restart, a
//! terminated backend): how soon the locker tries again, at library defaults.

use std::time::{Duration, Instant};

use lease_proto::limits::{FAST_RECONNECT_CAP, FAST_RECONNECT_WINDOW, RECONNECT_BASE};
use lease_proto::sim::{Command, Harness};
use lease_proto::*;

use crate::common::*;

/// A locker leads lease `a`; then the server goes away under it (a restart: SQLSTATE 57P01), and every
/// connection attempt fails while it is down (`refused`). Returns the times of the
/// attempts made within `down`.
fn attempts_while_down(h: &mut Harness, down: Duration, refused: &SessionError) -> Vec<Instant> {
    let run = started(h, "a", 900);
    let session = h.session().expect("a session");
    h.input(Input::SessionEnded {
        session,
        error: Some(boom("57P01")),
    });
    // The cancelled job returns; the run keeps wanting its lease.
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    let end = h.now() + down;
    let mut attempts = Vec::new();
    while let Some(at) = h.machine().poll_timeout().filter(|&at| at <= end) {
        h.set_now(at);
        let cmds = h.input(Input::Tick);
        if has(&cmds, |c| matches!(c, Command::OpenSession { .. })) {
            attempts.push(at);
            let session = h.session().expect("the attempt's session");
            h.input(Input::SessionEnded {
                session,
                error: Some(refused.clone()),
            });
        }
    }
    attempts
}

fn gaps(attempts: &[Instant]) -> Vec<Duration> {
    attempts.windows(2).map(|w| w[1] - w[0]).collect()
}

/// A restarting server is back within seconds: the locker that had a session tries again
/// at least every [`FAST_RECONNECT_CAP`], so it leads again within about that of the server
/// accepting connections (the backoff would have grown to the retry interval).
#[test]
fn a_restarting_server_is_tried_again_at_least_every_fast_reconnect_cap() {
    let mut h = harness(Options::default());
    let refused = SessionError::other("error connecting to server: Connection refused");
    let attempts = attempts_while_down(&mut h, Duration::from_secs(10), &refused);
    let gaps = gaps(&attempts);
    let longest = gaps.iter().max().copied().unwrap_or_default();
    assert!(
        longest <= FAST_RECONNECT_CAP,
        "{} attempts in 10 s, longest gap {longest:?} (cap {FAST_RECONNECT_CAP:?}): {gaps:?}",
        attempts.len()
    );
    // Jittered: not every locker of a fleet at the same instant.
    assert!(gaps.iter().any(|g| *g != longest), "{gaps:?}");
}

/// Past the window, a server that is still down gets the ordinary backoff again (doubling
/// up to the retry interval): a fleet does not hammer a server in a long recovery.
#[test]
fn past_the_window_the_backoff_grows_again() {
    let mut h = harness(Options::default());
    let refused = SessionError::other("error connecting to server: Connection refused");
    let down = FAST_RECONNECT_WINDOW + Duration::from_secs(30);
    let attempts = attempts_while_down(&mut h, down, &refused);
    let start = attempts[0];
    let late: Vec<Duration> = attempts
        .windows(2)
        .filter(|w| w[0] > start + FAST_RECONNECT_WINDOW + Duration::from_secs(10))
        .map(|w| w[1] - w[0])
        .collect();
    let retry = Options::default().retry_interval;
    assert!(
        !late.is_empty() && late.iter().all(|g| *g >= retry / 2),
        "gaps 10 s past the window: {late:?}"
    );
}

/// A configuration error after a restart (a rotated password) is not a restarting server:
/// the ordinary backoff, from [`RECONNECT_BASE`] doubling.
#[test]
fn a_configuration_error_gets_the_ordinary_backoff() {
    let mut h = harness(Options::default());
    let denied = SessionError {
        code: Some("28P01".into()),
        message: "password authentication failed".into(),
        config: true,
    };
    let attempts = attempts_while_down(&mut h, Duration::from_secs(10), &denied);
    let gaps = gaps(&attempts);
    assert!(
        gaps.iter().any(|g| *g > RECONNECT_BASE * 8),
        "gaps {gaps:?}"
    );
}
