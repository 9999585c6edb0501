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

/// A member that closes leaves its groups, announcing it, before it releases their keys:
/// the members its release's handover notification wakes read it gone, own its keys and
/// take them at once. Before, its member lock stayed until its session closed, after the
/// release: a member woken by the notification read it still there, still the owner, and
/// took the key only at a read after that session's end, up to a retry interval later.
#[test]
fn a_closing_member_leaves_its_groups_before_it_releases_their_keys() {
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
    h.input(Input::Close);
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
