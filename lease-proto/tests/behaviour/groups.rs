//! Lease groups, hand-driven: what a member sends around its own comings and goings (the
//! share and hand-offs under faults are the properties' `..._lease_group...` cases).

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::sim::{Command, Harness};
use lease_proto::*;
use std::collections::BTreeSet;

/// Answers the membership read in flight (this session is backend 7): `members` of the
/// group `gid`, and every key read free.
fn members(h: &mut Harness, gid: u32, members: &[i64]) -> Vec<Command> {
    let Statement::Members { keys, .. } = h.statement() else {
        panic!("expected a membership read, got {:?}", h.statement())
    };
    let reply = MembersReply {
        backend_pid: Some(7),
        nonce: h.nonce(),
        members: members.iter().map(|m| (gid, *m)).collect::<BTreeSet<_>>(),
        holders: keys.into_iter().map(|k| (k, None)).collect(),
    };
    h.reply(reply.to_rows())
}

/// A member whose runs of a group all finish (it closes, or its last job of the group
/// returned) leaves the group, announcing it, before it releases the keys: the members its
/// release's handover notification wakes read it gone, own its keys and take them at once.
/// Before, its member lock stayed until its session closed, after the release: a member
/// woken by the notification read it still there, still the owner, and took the key only
/// at a read after that session's end, up to a retry interval later.
fn leaves_before_it_releases(close: bool) {
    let group = GroupId::named("g").unwrap();
    let gid = group.id();
    let a = lease("a").in_group(group);
    let mut h = harness(opts());
    let run = h.run(a.clone());
    h.connect(7);
    let Statement::Members { join, .. } = h.statement() else {
        panic!("expected a membership read, got {:?}", h.statement())
    };
    assert_eq!(join, vec![gid]);
    members(&mut h, gid, &[7]);
    assert_eq!(h.try_keys(), vec![a.key()]);
    let cmds = h.win(900);
    assert!(has(&cmds, |c| matches!(c, Command::StartJob { .. })));
    // The win's announcement (see below).
    members(&mut h, gid, &[7]);
    if close {
        h.input(Input::Close);
    }
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    let Statement::Members {
        leave, announce, ..
    } = h.statement()
    else {
        panic!(
            "expected the leave before the release, got {:?}",
            h.statement()
        )
    };
    assert_eq!((leave, announce), (vec![gid], vec![gid]));
    members(&mut h, gid, &[]);
    assert!(
        matches!(h.statement(), Statement::Release { ref keys, .. } if keys == &vec![a.key()]),
        "{:?}",
        h.statement()
    );
}

#[test]
fn a_closing_member_leaves_its_groups_before_it_releases_their_keys() {
    leaves_before_it_releases(true);
}

#[test]
fn a_member_whose_last_group_job_returned_leaves_before_the_release() {
    leaves_before_it_releases(false);
}

/// Answers the membership read in flight (this session is backend 7): `members` of the
/// group `gid`, every key held by `holder`.
fn members_holding(h: &mut Harness, gid: u32, members: &[i64], holder: i64) -> Vec<Event> {
    let Statement::Members { keys, .. } = h.statement() else {
        panic!("expected a membership read, got {:?}", h.statement())
    };
    let reply = MembersReply {
        backend_pid: Some(7),
        nonce: h.nonce(),
        members: members.iter().map(|m| (gid, *m)).collect::<BTreeSet<_>>(),
        holders: keys.into_iter().map(|k| (k, Some(holder))).collect(),
    };
    h.reply(reply.to_rows());
    h.events().to_vec()
}

/// Answers heartbeats (backend 7, holding `held`) and moves the clock until the next
/// membership read is in flight.
fn next_read(h: &mut Harness, held: &[i64]) {
    for _ in 0..100 {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(Statement::Members { .. }) => return,
            Some(Statement::Heartbeat | Statement::Verify) => {
                h.heartbeat(7, held);
            }
            Some(other) => panic!("expected a heartbeat or a read, got {other:?}"),
            None => {
                let at = h.machine().poll_timeout().expect("a deadline");
                h.advance(at.saturating_duration_since(h.now()));
            }
        }
    }
    panic!("no membership read came");
}

/// What a member's reads and hand-offs say as events: `Event::GroupMembers` when a read
/// shows members joined or left (the session's first read shows every member, this one
/// included), none for a read that shows the same members; `Event::HandedOver`, with the
/// owner, for each lease handed over (to a member seen in two consecutive reads); a
/// member gone is a change too.
#[test]
fn membership_changes_and_hand_offs_are_events() {
    let group = GroupId::named("g").unwrap();
    let gid = group.id();
    let leases: Vec<LeaseId> = (0..4)
        .map(|i| lease(&format!("k{i}")).in_group(group.clone()))
        .collect();
    let keys: Vec<i64> = leases.iter().map(LeaseId::key).collect();
    let mut h = harness(opts());
    for l in &leases {
        h.run(l.clone());
    }
    h.connect(7);
    let membership = |events: &[Event]| -> Vec<(Vec<i64>, Vec<i64>, Vec<i64>)> {
        (events.iter())
            .filter_map(|e| match e {
                Event::GroupMembers {
                    group: g,
                    members,
                    joined,
                    left,
                } if g.id() == gid => Some((members.clone(), joined.clone(), left.clone())),
                _ => None,
            })
            .collect()
    };
    let handed = |events: &[Event]| -> Vec<(i64, i64)> {
        (events.iter())
            .filter_map(|e| match e {
                Event::HandedOver { lease, to, .. } => Some((lease.key(), *to)),
                _ => None,
            })
            .collect()
    };

    // Alone: every key its own.
    members(&mut h, gid, &[7]);
    assert_eq!(
        membership(h.events()),
        [(vec![7], vec![7], vec![])],
        "the first read"
    );
    assert_eq!(h.try_keys().len(), 4);
    h.win(900);

    // Member 8 appears: a change; no hand-off yet (seen once).
    next_read(&mut h, &keys);
    let events = members_holding(&mut h, gid, &[7, 8], 7);
    assert_eq!(membership(&events), [(vec![7, 8], vec![8], vec![])]);
    assert!(handed(&events).is_empty(), "{events:?}");

    // Seen twice: the same members (no event), and its share handed over to it.
    next_read(&mut h, &keys);
    let events = members_holding(&mut h, gid, &[7, 8], 7);
    assert!(membership(&events).is_empty(), "{events:?}");
    let share = group_share(&keys.iter().copied().collect(), &[7, 8].into());
    let mut theirs: Vec<(i64, i64)> = (share.into_iter()).filter(|(_, m)| *m == 8).collect();
    let mut got = handed(&events);
    theirs.sort();
    got.sort();
    assert_eq!(got.len(), 2);
    assert_eq!(got, theirs);

    // Member 8 is gone (the handed-over jobs have not returned yet): a change.
    next_read(&mut h, &keys);
    let events = members_holding(&mut h, gid, &[7], 7);
    assert_eq!(membership(&events), [(vec![7], vec![], vec![8])]);
}

/// A member that wins keys of its group announces the group at once (a membership read
/// with the announcement follows the win), so every member reads, learns the new holder
/// and watches it on its ring. Before, a member that took handed-over keys was watched by
/// nobody until the others' next periodic read (up to a retry interval): a kill -9 in that
/// window took seconds (the bench's groups phase at the library defaults: p99 4.45 s).
#[test]
fn a_member_that_wins_keys_of_its_group_announces_it() {
    let group = GroupId::named("g").unwrap();
    let gid = group.id();
    let a = lease("a").in_group(group);
    let mut h = harness(opts());
    h.run(a.clone());
    h.connect(7);
    members(&mut h, gid, &[7]);
    assert_eq!(h.try_keys(), vec![a.key()]);
    h.win(900);
    let read = h.in_flight().map(|(_, s)| s.clone());
    let Some(Statement::Members { announce, .. }) = read else {
        panic!("expected a membership read after the win, got {read:?}")
    };
    assert_eq!(announce, vec![gid]);
}

/// A member that leads a key its share gives to another member, without handing it over
/// (the owner had left the key free past the bound, as a frozen member does: every member
/// then offers it to that owner no more while the membership holds), hands it over when
/// the owner claims it (`claim <key> <pid>` on the handover channel): the owner, back and
/// reading the key held by another member past the bound, asks once. Before, the share
/// stayed unbalanced until the membership changed: `every_live_member_leads_its_fair_share_
/// after_healing` found `[2, 0, 1, 3]` for 8.3 s after a 2.9 s freeze healed.
#[test]
fn a_member_hands_a_key_over_when_its_owner_claims_it() {
    let group = GroupId::named("g").unwrap();
    let gid = group.id();
    // A key the share of members 7 and 9 gives to 9.
    let a = (0..)
        .map(|i| lease(&format!("a{i}")).in_group(group.clone()))
        .find(|l| group_share(&[l.key()].into(), &[7, 9].into())[&l.key()] == 9)
        .unwrap();
    let mut h = harness(opts());
    h.run(a.clone());
    h.connect(7);
    members(&mut h, gid, &[7, 9]);
    // 9 leaves it free past the bound: 7 takes it.
    let mut tried = false;
    for _ in 0..50 {
        next_read(&mut h, &[]);
        members(&mut h, gid, &[7, 9]);
        if matches!(h.in_flight(), Some((_, Statement::TryLock { .. }))) {
            assert_eq!(h.try_keys(), vec![a.key()]);
            tried = true;
            break;
        }
    }
    assert!(tried, "7 never tried the key its owner left free");
    let cmds = h.win(900);
    assert!(has(&cmds, |c| matches!(c, Command::StartJob { .. })));
    // Not offered to 9 again at the reads that follow.
    for _ in 0..3 {
        next_read(&mut h, &[a.key()]);
        let events = members_holding(&mut h, gid, &[7, 9], 7);
        assert!(!events.iter().any(|e| matches!(e, Event::HandedOver { .. })));
    }
    // A claim from another backend than the one it names, or naming this session: ignored
    // (anyone who may NOTIFY could otherwise make a holder drop its keys).
    for (by, sender) in [(9, 12), (7, 7)] {
        let cmds = h.input(Input::Notification {
            channel: server::HANDOVER_CHANNEL.into(),
            payload: format!("claim {} {by}", a.key()),
            sender_pid: sender,
        });
        assert!(
            !has(&cmds, |c| matches!(c, Command::CancelJob { .. })),
            "a forged claim ({by} from {sender}) was honoured: {cmds:?}"
        );
    }
    // 9 claims it.
    let cmds = h.input(Input::Notification {
        channel: server::HANDOVER_CHANNEL.into(),
        payload: format!("claim {} 9", a.key()),
        sender_pid: 9,
    });
    assert!(
        has(&cmds, |c| matches!(c, Command::CancelJob { .. })),
        "expected the job cancelled at the owner's claim, got {cmds:?}"
    );
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::HandedOver { to: 9, .. })));
}

/// A run in a lease group on a machine without handover notifications is refused
/// (`RunRejected::GroupWithoutNotify`); a run in no group is not. A group needs the
/// handover channel: a member frozen past the free bound (its keys taken by another
/// member, then offered it no more while the membership holds) gets them back only by
/// claiming them there. Without it the group stayed unbalanced until the membership
/// changed: `scenarios::a_member_frozen_past_the_free_bound_gets_its_share_back` with
/// `notify_handover` off came out `[4, 0]` 6 s (30 retry intervals) after the thaw.
#[test]
fn a_group_run_without_handover_notifications_is_refused() {
    let mut o = opts();
    o.notify_handover = false;
    let mut h = harness(o);
    let a = lease("a").in_group(GroupId::named("g").unwrap());
    let refused = h.start(a.clone());
    assert_eq!(refused, Err(RunRejected::GroupWithoutNotify(a)));
    assert_eq!(
        refused.unwrap_err().to_string(),
        format!(
            "lease a ({}) is in lease group g, and a lease group needs handover notifications \
             (notify_handover is off)",
            key("a")
        )
    );
    assert!(h.start(lease("b")).is_ok(), "a run in no group");
}

/// A group member that holds a lease and wants another watches its holder on the watch
/// session; when that session is lost (its backend terminated, its connection reset) it
/// opens again at the next periodic try. A member's periodic try is a membership read, and
/// the try after it goes on a retry deadline the read's reply already moved on: the watch
/// session stayed closed, and every failover of the watched member waited for a poll
/// (found in review).
#[test]
fn a_members_lost_watch_session_opens_again_at_the_next_periodic_read() {
    let group = GroupId::named("g").unwrap();
    let gid = group.id();
    let (a, b) = (
        lease("a").in_group(group.clone()),
        lease("b").in_group(group),
    );
    let mut h = harness(opts());
    h.run(a.clone());
    h.run(b.clone());
    h.connect(7);
    members(&mut h, gid, &[7, 50]);
    // The share gives this member one of the two keys.
    let mine = h.try_keys();
    assert_eq!(mine.len(), 1, "{mine:?}");
    let other = if mine[0] == a.key() { b.key() } else { a.key() };
    h.win(900);
    // Reads answer: this member holds its key, backend 50 the other.
    let read = |h: &mut Harness| {
        let Statement::Members { keys, .. } = h.statement() else {
            panic!("expected a membership read, got {:?}", h.statement())
        };
        let reply = MembersReply {
            backend_pid: Some(7),
            nonce: h.nonce(),
            members: [(gid, 7), (gid, 50)].into(),
            holders: (keys.into_iter())
                .map(|k| (k, Some(if k == other { 50 } else { 7 })))
                .collect(),
        };
        h.reply(reply.to_rows())
    };
    // Answers whatever the lease session sends until the watch session opens.
    let until_watch_opens = |h: &mut Harness| {
        for _ in 0..200 {
            let cmds = match h.in_flight().map(|(_, s)| s.clone()) {
                Some(Statement::Members { .. }) => read(h),
                Some(Statement::Heartbeat | Statement::Verify) => h.heartbeat(7, &mine),
                Some(Statement::TryLock { .. }) => h.lose(Some(50)),
                Some(s) => panic!("unexpected {s:?}"),
                None => {
                    let at = h.machine().poll_timeout().expect("a deadline");
                    h.advance(at.saturating_duration_since(h.now()))
                }
            };
            if let Some(Command::OpenWatch { session }) =
                cmds.iter().find(|c| matches!(c, Command::OpenWatch { .. }))
            {
                return Some((*session, h.now()));
            }
        }
        None
    };
    let (watch, _) = until_watch_opens(&mut h).expect("the watch session opens");
    h.input(Input::SessionOpened { session: watch });
    // Its backend is terminated: the connection ends.
    let lost_at = h.now();
    h.input(Input::SessionEnded {
        session: watch,
        error: Some(SessionError::server(
            "57P01",
            "terminating connection due to administrator command",
        )),
    });
    let reopened = until_watch_opens(&mut h);
    let retry = opts().retry_interval;
    assert!(
        reopened.is_some_and(|(_, at)| at - lost_at <= retry * 2),
        "the watch session did not open again within two retry intervals ({reopened:?}, \
         lost at {lost_at:?})"
    );
}
