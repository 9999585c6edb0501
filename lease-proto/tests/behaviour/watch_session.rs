//! The watch session (`ServerWait::IdleAndWatch`), hand-driven: it opens only for a locker
//! that holds a lease and wants another, sends nothing but waits for the ring's key, wakes
//! the lease session's try (whose win waits out the lock delay), falls back to polling when it fails, and
//! never opens for one lease, with the option off, or behind a pooler that rejected the
//! startup options.

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::sim::Command;
use lease_proto::sim::Harness;
use lease_proto::*;

/// The watch session's commands among `cmds`: (opened, queries with their statements,
/// closed).
fn watch_commands(cmds: &[Command]) -> (Vec<SessionId>, Vec<(QueryId, Statement)>, usize) {
    let (mut opened, mut queries, mut closed) = (Vec::new(), Vec::new(), 0);
    for c in cmds {
        match c {
            Command::OpenWatch { session } => opened.push(*session),
            Command::WatchQuery {
                query, statement, ..
            } => queries.push((*query, statement.clone())),
            Command::CloseWatch { .. } => closed += 1,
            _ => {}
        }
    }
    (opened, queries, closed)
}

fn wait_rows(freed: bool) -> Vec<Row> {
    WaitReply {
        session: HeartbeatReply {
            backend_pid: Some(55),
            nonce: None,
            server_clock_us: None,
        },
        freed: Some(freed),
        deadlock_timeout_ms: Some(1000),
        ..Default::default()
    }
    .to_rows()
}

/// Leads `a` (token 1), then runs `b`, whose try loses to backend `holder`: the
/// commands after that try's reply.
fn holder_wanting(h: &mut Harness, holder: i64) -> Vec<Command> {
    started(h, "a", 1);
    h.run(lease("b"));
    while !matches!(h.in_flight(), Some((_, Statement::TryLock { .. }))) {
        h.advance(ms(10));
        if matches!(h.in_flight(), Some((_, Statement::Heartbeat))) {
            h.heartbeat(7, &[]);
        }
    }
    h.lose(Some(holder))
}

/// A holder that wants another lease opens the watch session, waits there for the
/// wanted key, and when it is freed the lease session tries at once; the win starts
/// its job after the lock delay.
#[test]
fn a_holder_waits_on_its_watch_session_and_starts_after_the_lock_delay() {
    let o = {
        let mut o = opts();
        o.lock_delay = ms(20);
        o
    };
    let mut h = harness(o);
    let cmds = holder_wanting(&mut h, 99);
    let (opened, queries, _) = watch_commands(&cmds);
    assert_eq!(opened.len(), 1, "{cmds:?}");
    assert!(queries.is_empty());
    let watch = opened[0];
    assert_ne!(Some(watch), h.session());
    let cmds = h.input(Input::SessionOpened { session: watch });
    let (_, queries, _) = watch_commands(&cmds);
    assert_eq!(queries.len(), 1, "{cmds:?}");
    let (query, Statement::Wait { key: k, .. }) = queries[0].clone() else {
        panic!("{queries:?}")
    };
    assert_eq!(k, key("b"));
    // Held all along (cut below deadlock_timeout): the next wait goes at once.
    let result = Ok(wait_rows(false));
    let cmds = h.input(Input::Reply { query, result });
    let (_, queries, _) = watch_commands(&cmds);
    let (query, _) = queries[0].clone();
    // Freed: the lease session tries after the lock delay, not before.
    let result = Ok(wait_rows(true));
    h.input(Input::Reply { query, result });
    assert!(
        h.events().contains(&Event::KeyFreed { key: key("b") }),
        "{:?}",
        h.events()
    );
    if matches!(h.in_flight(), Some((_, Statement::Heartbeat))) {
        h.heartbeat(7, &[]);
    }
    assert_eq!(h.try_keys(), vec![key("b")]);
    // Won: its job starts after the lock delay, not before; then nothing is
    // wanted any more, and the watch session closes.
    let starts = |cmds: &[Command]| has(cmds, |c| matches!(c, Command::StartJob { .. }));
    assert!(!starts(&h.win_held(2)));
    assert!(!starts(&h.advance(ms(19))));
    let cmds = h.advance(ms(1));
    assert!(starts(&cmds), "{cmds:?}");
    let (_, _, closed) = watch_commands(&cmds);
    assert_eq!(closed, 1, "{cmds:?}");
}

/// A process with one lease never opens a second connection, leading or waiting; nor
/// does a holder with the option off; both poll (or wait on the lease session) as before.
#[test]
fn no_watch_session_for_one_lease_or_with_the_option_off() {
    let mut h = harness(opts());
    started(&mut h, "a", 1);
    let cmds = h.advance(ms(2000));
    assert!(watch_commands(&cmds).0.is_empty(), "{cmds:?}");
    let mut h = harness(opts());
    h.run(lease("a"));
    h.connect(7);
    let cmds = h.lose(Some(99));
    assert!(watch_commands(&cmds).0.is_empty(), "{cmds:?}");
    let o = {
        let mut o = opts();
        o.server_wait = ServerWait::Idle;
        o
    };
    let mut h = harness(o);
    let cmds = holder_wanting(&mut h, 99);
    assert!(watch_commands(&cmds).0.is_empty(), "{cmds:?}");
}

/// A watch session that fails to open costs speed only: the holder polls, and opens it
/// again at the next periodic try; a wait that fails turns it off for the session.
#[test]
fn a_failing_watch_session_falls_back_to_polling() {
    let mut h = harness(opts());
    let cmds = holder_wanting(&mut h, 99);
    let watch = watch_commands(&cmds).0[0];
    let error = Some(SessionError::other("refused"));
    let cmds = h.input(Input::SessionEnded {
        session: watch,
        error,
    });
    assert!(watch_commands(&cmds).0.is_empty(), "{cmds:?}");
    // The next periodic try (within a retry interval) opens it again.
    let mut reopened = None;
    for _ in 0..40 {
        let cmds = h.advance(ms(10));
        if let Some(s) = watch_commands(&cmds).0.first() {
            reopened = Some(*s);
            break;
        }
        let cmds = match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::Heartbeat) => h.heartbeat(7, &[]),
            Some(Statement::TryLock { .. }) => h.lose(Some(99)),
            _ => Vec::new(),
        };
        if let Some(s) = watch_commands(&cmds).0.first() {
            reopened = Some(*s);
            break;
        }
    }
    let watch = reopened.expect("the watch session opens again at the next try");
    let cmds = h.input(Input::SessionOpened { session: watch });
    let (query, _) = watch_commands(&cmds).1[0].clone();
    let result = Err(SessionError::server("XX000", "boom"));
    let cmds = h.input(Input::Reply { query, result });
    assert_eq!(watch_commands(&cmds).2, 1, "closed: {cmds:?}");
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::WaitFailed { .. })));
}

/// Behind a pooler that rejected the startup options, a holder opens no watch session:
/// a blocked wait would hold one of the pool's server connections.
#[test]
fn behind_a_pooler_no_watch_session() {
    let mut h = harness(opts());
    h.run(lease("a"));
    let session = h.session().expect("a session asked for");
    let error = Some(SessionError::server(
        "08P01",
        "unsupported startup parameter: options",
    ));
    h.input(Input::SessionEnded { session, error });
    h.connect(7);
    let cmds = h.win(1);
    assert!(has(&cmds, |c| matches!(c, Command::StartJob { .. })));
    h.run(lease("b"));
    let mut all = Vec::new();
    for _ in 0..100 {
        all.extend(h.advance(ms(10)));
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::Heartbeat) => all.extend(h.heartbeat(7, &[])),
            Some(Statement::Verify) => all.extend(h.heartbeat(7, &[key("a")])),
            Some(Statement::TryLock { .. }) => all.extend(h.lose(Some(99))),
            _ => {}
        }
    }
    assert!(watch_commands(&all).0.is_empty(), "{all:?}");
}

/// A graceful handover from holder 99 is followed by a new holder 77 that is terminated
/// within the lock delay: the win after the watch session's wake for 77's end gets the lock delay (the
/// notification came from the earlier holder, for an earlier wait). Failed before the
/// notification was kept only for the wait in flight for its key.
#[test]
fn a_stale_notification_does_not_skip_the_watch_lock_delay() {
    let o = {
        let mut o = opts();
        o.lock_delay = ms(20);
        o
    };
    let mut h = harness(o);
    let cmds = holder_wanting(&mut h, 99);
    let watch = watch_commands(&cmds).0[0];
    let cmds = h.input(Input::SessionOpened { session: watch });
    let (q1, _) = watch_commands(&cmds).1[0].clone();
    // 99 releases b gracefully: its notification arrives (from the holder the try saw).
    h.input(Input::Notification {
        channel: lease_proto::server::HANDOVER_CHANNEL.into(),
        payload: release_payload(key("b")),
        sender_pid: 99,
    });
    // The watch's wait is granted by that release.
    let cmds = h.input(Input::Reply {
        query: q1,
        result: Ok(wait_rows(true)),
    });
    let _ = cmds;
    // The lease session tries at once (graceful) and loses to 77, who took b first.
    for _ in 0..5 {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::Heartbeat) => {
                h.heartbeat(7, &[]);
            }
            _ => break,
        }
    }
    assert_eq!(h.try_keys(), vec![key("b")]);
    let cmds = h.lose(Some(77));
    let mut queries = watch_commands(&cmds).1;
    for _ in 0..10 {
        if matches!(h.in_flight(), Some((_, Statement::TryLock { .. }))) {
            queries.extend(watch_commands(&h.lose(Some(77))).1);
        }
        if !queries.is_empty() {
            break;
        }
        let cmds = h.advance(ms(1));
        queries = watch_commands(&cmds).1;
    }
    assert!(h.in_flight().is_none(), "{:?}", h.in_flight());
    let (q2, st) = queries
        .first()
        .cloned()
        .expect("a second wait on the watch session");
    assert!(
        matches!(st, Statement::Wait { key: k, .. } if k == key("b")),
        "{st:?}"
    );
    // 5 ms later 77 is terminated (no notification): the wait is woken.
    h.advance(ms(5));
    h.input(Input::Reply {
        query: q2,
        result: Ok(wait_rows(true)),
    });
    if matches!(h.in_flight(), Some((_, Statement::Heartbeat))) {
        h.heartbeat(7, &[]);
    }
    assert_eq!(h.try_keys(), vec![key("b")], "the try goes at once");
    let cmds = h.win_held(3);
    assert!(
        !has(&cmds, |c| matches!(c, Command::StartJob { .. })),
        "the job started at once after a non-graceful end of 77: the lock delay was skipped"
    );
}

/// The watch backend is terminated (`pg_terminate_backend`: the FATAL 57P01 read as the
/// wait's reply, then the connection's end): a connection failure, not a wait that failed
/// otherwise, so the watch session opens again at the next periodic try. Failed before:
/// instant takeover stayed off until the lease session ended.
#[test]
fn a_terminated_watch_session_opens_again() {
    let mut h = harness(opts());
    let cmds = holder_wanting(&mut h, 99);
    let watch = watch_commands(&cmds).0[0];
    let cmds = h.input(Input::SessionOpened { session: watch });
    let (query, _) = watch_commands(&cmds).1[0].clone();
    let result = Err(SessionError::server(
        "57P01",
        "terminating connection due to administrator command",
    ));
    h.input(Input::Reply { query, result });
    h.input(Input::SessionEnded {
        session: watch,
        error: None,
    });
    let mut reopened = false;
    for _ in 0..2000 {
        let cmds = h.advance(ms(10));
        if !watch_commands(&cmds).0.is_empty() {
            reopened = true;
            break;
        }
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::Heartbeat) => {
                h.heartbeat(7, &[]);
            }
            Some(Statement::TryLock { .. }) if !watch_commands(&h.lose(Some(99))).0.is_empty() => {
                reopened = true;
                break;
            }
            _ => {}
        }
    }
    assert!(
        reopened,
        "20 s (several periodic tries) and the watch session never opened again"
    );
}

/// A wait in flight for a holder that is no longer the ring's next (a try showed a new
/// holder between this locker's pid and the watched one's) is not left to run to the end
/// of its chunk: the watch session is closed and a new one opened at once, which waits for
/// the next holder. Before, the new holder went unwatched for up to a chunk (below the
/// server's `deadlock_timeout`): in the benchmark's lease group at the library defaults,
/// members killed 200–400 ms after they took handed-over leases were led again only after
/// 300–600 ms.
#[test]
fn a_wait_for_a_holder_no_longer_next_moves_to_the_next_at_once() {
    let mut h = harness(opts());
    let cmds = holder_wanting(&mut h, 99);
    let (opened, _, _) = watch_commands(&cmds);
    let cmds = h.input(Input::SessionOpened { session: opened[0] });
    let (_, queries, _) = watch_commands(&cmds);
    assert!(
        matches!(queries[..], [(_, Statement::Wait { key: k, .. })] if k == key("b")),
        "{queries:?}"
    );
    // The locker wants c too; its try finds c held by backend 50, next after 7.
    h.run(lease("c"));
    while !matches!(h.in_flight(), Some((_, Statement::TryLock { .. }))) {
        h.advance(ms(10));
        if matches!(h.in_flight(), Some((_, Statement::Heartbeat))) {
            h.heartbeat(7, &[]);
        }
    }
    let not_won = (h.try_keys().into_iter())
        .map(|k| (k, Some(if k == key("c") { 50 } else { 99 })))
        .collect();
    let reply = TryReply {
        won: vec![],
        not_won,
        untrusted: false,
        session: Some((7, h.nonce())),
    };
    let cmds = h.reply(reply.to_rows());
    let (opened, _, closed) = watch_commands(&cmds);
    assert_eq!(
        (opened.len(), closed),
        (1, 1),
        "expected the watch session replaced at once, got {cmds:?}"
    );
    let cmds = h.input(Input::SessionOpened { session: opened[0] });
    let (_, queries, _) = watch_commands(&cmds);
    assert!(
        matches!(queries[..], [(_, Statement::Wait { key: k, .. })] if k == key("c")),
        "{queries:?}"
    );
}

/// No spin counts only spurious wakes: a wake whose try finds the key held by the holder
/// the watch session waited for (a client holding it SHARED grants every wait) counts
/// against `WAKE_BUDGET`, and after that many in a row the watch session waits no more
/// until the next periodic try; a wake whose try finds the key with another holder (it
/// was released and taken: in a lease group, a hand-off to a new member) is a real
/// release and does not count, so a member whose watched holder hands several keys over
/// keeps watching (it paused, and a kill -9 of that holder took a retry interval to be
/// noticed: 3.3 s in the benchmark's groups phase).
#[test]
fn only_wakes_that_find_the_same_holder_pause_the_watch_session() {
    for moved in [false, true] {
        let mut h = harness(opts());
        let cmds = holder_wanting(&mut h, 99);
        let watch = watch_commands(&cmds).0[0];
        let mut cmds = h.input(Input::SessionOpened { session: watch });
        let mut holder = 99;
        let mut waits = 0;
        for wake in 0..=lease_proto::limits::WAKE_BUDGET {
            let (_, queries, _) = watch_commands(&cmds);
            let Some((query, _)) = queries.first().cloned() else {
                break;
            };
            waits += 1;
            h.input(Input::Reply {
                query,
                result: Ok(wait_rows(true)),
            });
            if matches!(h.in_flight(), Some((_, Statement::Heartbeat))) {
                h.heartbeat(7, &[]);
            }
            assert_eq!(h.try_keys(), vec![key("b")], "wake {wake}");
            if moved {
                holder += 1;
            }
            cmds = h.lose(Some(holder));
        }
        let budget = lease_proto::limits::WAKE_BUDGET;
        let expected = if moved { budget + 1 } else { budget };
        assert_eq!(waits, expected, "moved: {moved}");
    }
}

/// Review 5: a locker that holds `a` and waits for `b` on its watch session (backend 55)
/// is the one `lease status` lists among b's waiters, and the only backend of it that
/// `lease handover b --to PID` accepts (its lease session, 7, does not wait: the CLI
/// refuses it, and the holder's check would never find it). Named by its watch backend,
/// the holder hands `b` over and its release names 55: this locker must take `b`, yet it
/// counts the key reserved for "another" backend and neither it nor anyone else takes it
/// for the hand-over window (two query timeouts).
#[test]
fn a_release_that_names_this_lockers_watch_session_hands_the_key_to_it() {
    let mut h = harness(opts());
    let cmds = holder_wanting(&mut h, 99);
    let watch = watch_commands(&cmds).0[0];
    let cmds = h.input(Input::SessionOpened { session: watch });
    let (query, _) = watch_commands(&cmds).1[0].clone();
    // Held all along (the watch session's pid, 55, is known), waits again.
    let cmds = h.input(Input::Reply {
        query,
        result: Ok(wait_rows(false)),
    });
    let (query, _) = watch_commands(&cmds).1[0].clone();
    // The release: the watch session is granted b in the unlock (its wait answers
    // freed), then the holder's notification names it.
    h.input(Input::Reply {
        query,
        result: Ok(wait_rows(true)),
    });
    h.input(Input::Notification {
        channel: lease_proto::server::HANDOVER_CHANNEL.into(),
        payload: release_payload_reserved(key("b"), 0, 55),
        sender_pid: 99,
    });
    let end = h.now() + opts().query_timeout * 2 - ms(50);
    let mut started_b = false;
    let mut seen: Vec<Event> = h.events().to_vec();
    while h.now() < end && !started_b {
        let cmds = match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::TryLock { keys, .. }) if keys.contains(&key("b")) => h.win(2),
            Some(Statement::TryLock { .. }) => h.lose(Some(99)),
            Some(Statement::Verify) => h.heartbeat(7, &[key("a")]),
            Some(Statement::Release { .. }) => h.released(),
            Some(Statement::Heartbeat | Statement::CheckHandover { .. }) => h.heartbeat(7, &[]),
            Some(_) => h.advance(ms(5)),
            None => h.advance(ms(5)),
        };
        seen.extend(h.events().iter().cloned());
        started_b |= has(&cmds, |c| matches!(c, Command::StartJob { token: 2, .. }));
    }
    let declined: Vec<_> = (seen.iter())
        .filter(|e| matches!(e, Event::WinDeclined { .. }))
        .collect();
    assert!(
        started_b,
        "b, handed over to this locker's watch session, was not led within the window; declined: {declined:?}; events: {:?}",
        &seen
    );
}
