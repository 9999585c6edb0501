//! Reconnecting after a session that passed its setup ends (a server restart, a
//! terminated backend): how soon the locker tries again, at library defaults.

use std::time::{Duration, Instant};

use lease_proto::limits::{FAST_RECONNECT_CAP, FAST_RECONNECT_WINDOW, RECONNECT_BASE};
use lease_proto::reply::SetupReply;
use lease_proto::sim::{Command, Harness};
use lease_proto::*;

use crate::common::*;

/// A locker leads lease `a`; then the server goes away under it (a restart: SQLSTATE
/// 57P01), and every connection attempt within `down` fails as `fail` makes it fail.
/// Returns the times of the attempts.
fn attempts_after_a_restart(
    h: &mut Harness,
    down: Duration,
    fail: impl FnMut(&mut Harness),
) -> Vec<Instant> {
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
    attempts_within(h, down, fail)
}

/// Ticks through `down`, failing every connection attempt with `fail`; returns their times.
fn attempts_within(
    h: &mut Harness,
    down: Duration,
    mut fail: impl FnMut(&mut Harness),
) -> Vec<Instant> {
    let end = h.now() + down;
    let mut attempts = Vec::new();
    while let Some(at) = h.machine().poll_timeout().filter(|&at| at <= end) {
        h.set_now(at);
        let cmds = h.input(Input::Tick);
        if has(&cmds, |c| matches!(c, Command::OpenSession { .. })) {
            attempts.push(at);
            fail(h);
        }
    }
    attempts
}

/// Fails the attempt in progress with `error`.
fn ended(error: SessionError) -> impl FnMut(&mut Harness) {
    move |h| {
        let session = h.session().expect("the attempt's session");
        h.input(Input::SessionEnded {
            session,
            error: Some(error.clone()),
        });
    }
}

fn refused() -> SessionError {
    SessionError::other("error connecting to server: Connection refused")
}

/// The attempts of 10 s were not all within the fast cap: the ordinary backoff grew past it.
fn assert_ordinary_backoff(attempts: &[Instant]) {
    let gaps = gaps(attempts);
    assert!(
        gaps.iter().any(|g| *g > FAST_RECONNECT_CAP * 4),
        "{} attempts in 10 s: {gaps:?}",
        attempts.len()
    );
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
    let attempts = attempts_after_a_restart(&mut h, Duration::from_secs(10), ended(refused()));
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
/// from the base up to the retry interval): a fleet does not hammer a server in a long
/// recovery, and a server back just after the window is not left for a whole retry interval.
#[test]
fn past_the_window_the_backoff_grows_again() {
    let mut h = harness(Options::default());
    let down = FAST_RECONNECT_WINDOW + Duration::from_secs(30);
    let attempts = attempts_after_a_restart(&mut h, down, ended(refused()));
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
    let window_end = start + FAST_RECONNECT_WINDOW;
    let first_after: Vec<Duration> = attempts
        .windows(2)
        .filter(|w| w[0] >= window_end)
        .map(|w| w[1] - w[0])
        .take(4)
        .collect();
    assert!(
        first_after[0] <= FAST_RECONNECT_CAP && first_after.windows(2).all(|p| p[1] >= p[0]),
        "the first gaps past the window double from the base: {first_after:?}"
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
    let attempts = attempts_after_a_restart(&mut h, Duration::from_secs(10), ended(denied));
    let gaps = gaps(&attempts);
    assert!(
        gaps.iter().any(|g| *g > RECONNECT_BASE * 8),
        "gaps {gaps:?}"
    );
}

/// A hot standby answers every attempt (a failover in progress): each attempt is a whole
/// connection and setup on a server that is there, so the window ends and the ordinary
/// backoff applies.
#[test]
fn a_hot_standby_gets_the_ordinary_backoff() {
    let o = Options::default();
    let mut h = harness(o.clone());
    let attempts = attempts_after_a_restart(&mut h, Duration::from_secs(10), |h| {
        let nonce = open_until_setup(h);
        let rows = SetupReply {
            in_recovery: true,
            ..setup_reply(&o, nonce)
        }
        .to_rows();
        h.reply(rows);
    });
    assert_ordinary_backoff(&attempts);
}

/// Too many connections (53300): the server is there and answered; the window ends.
#[test]
fn too_many_connections_gets_the_ordinary_backoff() {
    let mut h = harness(Options::default());
    let attempts = attempts_after_a_restart(&mut h, Duration::from_secs(10), ended(boom("53300")));
    assert_ordinary_backoff(&attempts);
}

/// "The database system is starting up" (57P03) is a server not there yet: the window holds.
#[test]
fn a_starting_server_is_tried_again_within_the_cap() {
    let mut h = harness(Options::default());
    let attempts = attempts_after_a_restart(&mut h, Duration::from_secs(5), ended(boom("57P03")));
    let longest = gaps(&attempts).into_iter().max().unwrap_or_default();
    assert!(longest <= FAST_RECONNECT_CAP, "longest gap {longest:?}");
}

/// A session the machine closed itself (no run needed it) opens no window: when a run
/// wants a session again and the server is gone, the ordinary backoff applies.
#[test]
fn a_session_closed_by_the_machine_opens_no_window() {
    let mut h = harness(Options::default());
    let run = started(&mut h, "a", 900);
    h.input(Input::Shutdown { run });
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    h.released();
    assert_eq!(
        h.machine().status().session,
        SessionState::Idle,
        "the idle session is closed"
    );
    h.run(lease("b"));
    let cmds = h.drain();
    assert!(h.session().is_some(), "{cmds:?}");
    ended(refused())(&mut h);
    let attempts = attempts_within(&mut h, Duration::from_secs(10), ended(refused()));
    assert_ordinary_backoff(&attempts);
}
