//! Every broken variant of `check::variants` is found: the checker explores
//! its model with the mutation planted and finds a counterexample showing the
//! expected breach; the counterexample's schedule, written down below,
//! replays it (the regression test), and the correct code passes that
//! schedule. The fourth review's holes 1, 2, 5 and 6, their fixes reverted,
//! are among them.

use check::{explore, replay, sparse, try_replay, variants, Model};

/// Explores `name`'s model to its first counterexample, which must show its
/// breach; replays `choices` (the counterexample written down), which must
/// show it too, and passes on the correct code.
fn found(name: &str, choices: &[(usize, u16)]) {
    let v = variants::named(name).expect("a variant");
    let out = explore(&v.model, true, None);
    let run = out
        .counterexample
        .unwrap_or_else(|| panic!("{name}: no counterexample in {} schedules", out.schedules));
    eprintln!(
        "{name}: found after {} schedules, {:.1?}:\n{}",
        out.schedules,
        out.elapsed,
        run.text()
    );
    assert_eq!(run.breach().as_deref(), Some(v.breach), "{}", run.text());
    let schedule = sparse(choices);
    let run = replay(&v.model, &schedule);
    assert_eq!(run.breach().as_deref(), Some(v.breach), "{}", run.text());
    let correct = Model {
        mutation: None,
        ..v.model.clone()
    };
    // The correct code's run may offer other options at a step (other events
    // due): then the schedule is not one of its own, and the exhaustive
    // bounds (check.rs) stand for it.
    match try_replay(&correct, &schedule) {
        Ok(run) => assert!(
            !run.failed(),
            "the correct code fails {name}'s schedule:\n{}",
            run.text()
        ),
        Err(e) => eprintln!("{name}: not a schedule of the correct code: {e}"),
    }
}

/// the standby's session is terminated, then the holder's: the standby's new session polls, wins the key the terminate freed and starts its job at once, while the old holder's job is still stopping.
#[test]
fn lock_delay_only_after_wakes_is_found() {
    found("lock-delay-only-after-wakes", &[(36, 2), (39, 1)]);
}

/// the holder's session is terminated and a forged handover notification reaches the polling standby at the same instant: its next try wins and counts the release as graceful, skipping the lock delay.
#[test]
fn notify_from_anyone_is_found() {
    found("notify-from-anyone", &[(48, 1), (49, 2)]);
}

/// the holder's link turns slow (a round trip above the guard margin), then it is partitioned: its validity, counted from the slow reply's arrival, outlasts the server guard's idle clock, which frees the key for the standby.
#[test]
fn confirm_at_arrival_is_found() {
    found("confirm-at-arrival", &[(42, 1), (49, 1)]);
}

/// a server restart of 300 ms: both sessions end, the doubling backoff tries again well after the server is back (retry interval 1 s), and nobody leads for longer than the bound.
#[test]
fn no_fast_reconnect_is_found() {
    found("no-fast-reconnect", &[(49, 2)]);
}

/// The fourth review's hole 5, its fix reverted: two hand-over requests for a backend that does not exist: the holder hands over without checking and every locker reserves the key for the named backend, so nobody leads for about a second.
#[test]
fn hand_over_unchecked_is_found() {
    found("hand-over-unchecked", &[(29, 1), (39, 2)]);
}

/// a promotion while the primary is frozen: the standby connects to the promoted server and tries at once, while the holder's session on the old primary is still valid.
#[test]
fn ignore_promotion_is_found() {
    found("ignore-promotion", &[(13, 1)]);
}

/// The fourth review's hole 2, its fix reverted: a promotion while the primary is frozen, then a restart of the promoted server: the restart erases what showed the promotion since the start, the hold ends, the standby leads while the old primary's holder is still valid.
#[test]
fn hold_only_since_start_is_found() {
    found("hold-only-since-start", &[(13, 1), (34, 1)]);
}

/// no fault: the lone client behind a one-backend transaction pooler leads.
#[test]
fn no_pooler_probe_is_found() {
    found("no-pooler-probe", &[]);
}

/// a hand-over request for process 2 once the holder is established: process 1's take, first in the key's queue, is granted the key at the release and keeps it.
#[test]
fn keep_reserved_win_is_found() {
    found("keep-reserved-win", &[(49, 2)]);
}

/// the next taker's session is terminated 1 ms after a graceful release granted it the key: the take queued behind it is granted, reads the release's notification and starts at once, while the first taker's job is still stopping.
#[test]
fn ignore_grantee_is_found() {
    found("ignore-grantee", &[(28, 1)]);
}

/// a crash of process 0 (back after 300 ms): process 1's watch session wakes and counts as the win of process 0's key; process 0 restarts and wins the key on the server.
#[test]
fn watch_acquires_is_found() {
    found("watch-acquires", &[(59, 1)]);
}

/// no fault: the watch session sends a try.
#[test]
fn watch_tries_is_found() {
    found("watch-tries", &[]);
}

/// no fault: the observer wins the start race.
#[test]
fn observer_tries_is_found() {
    found("observer-tries", &[]);
}

/// The fourth review's hole 1, its fix reverted: the server turns slow (statements in flight for 150 ms), then the holder's session is terminated during a heartbeat: the driver reads the FATAL answer as a failed statement and does not kill the command, which runs 300 ms while the standby leads after the lock delay.
#[test]
fn fatal_reply_is_statement_failure_is_found() {
    found("fatal-reply-is-statement-failure", &[(24, 1), (27, 1)]);
}

/// The fourth review's hole 6, its fix reverted: a forged member lock (group, 1) appears: counted as a member, it owns a share of the four keys that nobody leads.
#[test]
fn forged_member_counted_is_found() {
    found("forged-member-counted", &[(29, 1)]);
}

/// Three members of a group of four keys, no fault: the member that ignores
/// its share wins every key at the start and keeps three of them.
#[test]
fn ignore_share_is_found() {
    found("ignore-share", &[]);
}
