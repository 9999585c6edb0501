//! Lease groups: the membership this session reads from the server and the
//! share of each group's keys it computes from it (see `docs/library.md`,
//! "Lease groups").
//!
//! - **Membership** lives in the advisory-lock space: while the machine has
//!   runs in a group, its session holds the two-int lock `(group id, backend
//!   pid)`, freed with the session. The member id is the backend pid: unique
//!   among the server's live sessions without any coordination, and gone
//!   with the session, as every lease of the session is. A
//!   [`Statement::Members`](crate::Statement::Members) read, sent before
//!   every try of a machine with group runs, joins, leaves and reads the
//!   member locks and the holders of the group's keys. The steady heartbeat
//!   reads no `pg_locks`.
//! - **The share** ([`assign`](super::membership::assign)): every member computes the same balanced
//!   assignment of the group's keys from the member set and the key set.
//! - **What a member tries**: the keys it owns, and a key it does not own
//!   only once the key stayed free for [`free_bound`](super::membership::free_bound) (its owner had that
//!   long to take it), so every lease is led even when an owner does not
//!   run the key.
//! - **Hand-off**: a member holding a key that another member owns hands it
//!   over (its job is cancelled with [`Reason::HandedOver`](crate::Reason),
//!   the key released after the job returned, the handover notification
//!   wakes the owner) only if the owner was seen in two consecutive reads
//!   (hysteresis), and only once per key and owner while the membership
//!   stays the same (an owner that did not take it is not offered it again,
//!   nor by any member that saw the key stay free past the bound).
//! - **Claim**: a member that reads a key it owns held by another member
//!   in every read for [`free_bound`](super::membership::free_bound) (the holder had its reads by then)
//!   claims it on the handover channel (`claim <key> <pid>`), once per
//!   holder while the membership holds; the holder hands it over if its own
//!   share gives the key to the claimant (a holder whose share differs, as
//!   with different key sets, keeps it). So an owner that was frozen past
//!   the bound (its keys taken, then offered it no more) gets them back;
//!   hence a group run needs [`Options::notify_handover`](crate::Options)
//!   (`RunRejected::GroupWithoutNotify` in `Machine::run`).
//! - **Announcements** on the handover channel (`group <id>`): a member
//!   that joins, one whose read finds a member gone, one that leaves, and
//!   one that won keys of the group announce it; every member reads again at
//!   once (so the holders every member's ring watches are current). The
//!   member that woke for the departure (its watch session's wait, or its
//!   idle session's) announces it by a read of its own before its try: a try
//!   that wins holds its reply back for the lock delay, and the others would
//!   wait that long to learn, then their own
//!   (`a_departure_is_announced_before_the_announcers_own_try`); the others
//!   announce what their reads find after their tries. A member whose runs of
//!   a group all finish (it closes, or its jobs returned) leaves the group
//!   before it releases their keys, so the members its releases' handover
//!   notifications wake read it gone and own its keys at once. The lease session never waits on the
//!   server (the machine ends a wait by replacing the session, and with it
//!   the member id); a member holding a lease waits on the watch session, for
//!   the holders the reads saw.
//!
//! The [`Groups`](super::membership::Groups) (the `membership` module) keep the membership and
//! decide; the machine's handling
//! of what the channel and the reads bring (an `impl Machine` block below,
//! as it confirms the runs, hands keys over and moves the retry deadline)
//! is here too: a membership read's reply (`Machine::members_done`), an
//! observer's read of its keys' holders (`Machine::look_done`, the same
//! statement), a member's claim and a join announcement.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::deadline::Deadline;
use super::membership::{free_bound, Read};
use super::Machine;
use crate::io::Event;
use crate::sql::{HeartbeatReply, MembersReply};

impl Machine {
    /// Member `by` of a lease group claims `key` (see `groups`): the
    /// locker that leads it hands it over if its own share gives it to
    /// `by` (a holder whose share differs, as when members run different
    /// key sets, keeps it), once per key and claimant while the membership
    /// holds. A claim counts only from the backend it names (the statement
    /// sends `pg_backend_pid()`) and never for this session itself: anyone
    /// who may `NOTIFY` could otherwise make a holder drop its keys.
    pub(super) fn group_claimed(&mut self, key: i64, by: i64, sender: i64) {
        let me = self.session.up().and_then(|up| up.stage.backend_pid());
        let leads = self.runs.leading_keys().contains(&key);
        if self.groups.claim_from(key, by, sender, me, leads) {
            self.hand_over(key, by, false);
        }
    }

    /// Whether the session that answered a membership read (a member's or
    /// an observer's) is this one (same backend pid, same nonce), checked as
    /// `same_session` checks a heartbeat's; refuses the locker if not.
    fn members_same_session(&mut self, now: Instant, reply: &MembersReply) -> bool {
        let session = HeartbeatReply {
            backend_pid: reply.backend_pid,
            nonce: reply.nonce,
            server_clock_us: None,
        };
        self.same_session(now, &session)
    }

    /// An observer's read of its keys' holders answered: it proves the
    /// session as a heartbeat does; each standby records the holder.
    pub(super) fn look_done(&mut self, now: Instant, sent: Instant, reply: &MembersReply) {
        if !self.members_same_session(now, reply) {
            return;
        }
        self.runs.confirm_all(sent);
        self.heartbeat_again(now, sent);
        for &(key, holder) in &reply.holders {
            self.runs.holder_seen(key, holder, &mut self.out);
        }
        let retry = now + self.connector.retry_delay(self.opts.retry_interval);
        self.timers.set(Deadline::Retry, retry);
    }

    /// The groups this locker is a member of, with the keys it runs in
    /// each: none for an observer (see [`Machine::observes`]).
    pub(super) fn group_keys(&self) -> BTreeMap<u32, BTreeSet<i64>> {
        if self.observes() {
            return BTreeMap::new();
        }
        self.runs.group_keys()
    }

    /// A group's membership read answered (see `groups`): it proves the
    /// session as a heartbeat does (same backend, same nonce), so every held
    /// lease is confirmed from `sent`; the shares are computed again,
    /// hand-offs decided are carried out, and the try follows at once.
    pub(super) fn members_done(
        &mut self,
        now: Instant,
        sent: Instant,
        read: &Read,
        reply: &MembersReply,
    ) {
        if !self.members_same_session(now, reply) {
            return;
        }
        let Some(me) = reply.backend_pid else {
            return;
        };
        self.runs.confirm_all(sent);
        self.heartbeat_again(now, sent);
        let wanted = self.group_keys();
        let held = self.runs.leading_keys();
        let bound = free_bound(&self.opts);
        let before = self.groups.snapshot();
        (self.groups).read_done(now, bound, me, read, reply, &wanted, &held);
        self.membership_events(&before);
        for key in self.groups.take_handoffs() {
            match self.groups.owner_of(key) {
                Some(to) => self.hand_over(key, to, false),
                None => {
                    self.runs.hand_over(key, &mut self.out);
                }
            }
        }
        for &(key, holder) in &reply.holders {
            self.runs.holder_seen(key, holder, &mut self.out);
        }
        let retry = now + self.connector.retry_delay(self.opts.retry_interval);
        self.timers.set(Deadline::Retry, retry);
        self.plan.try_soon();
    }

    /// After a membership read: [`Event::GroupMembers`] for each group whose
    /// members are not those of the read before (`before`).
    fn membership_events(&mut self, before: &BTreeMap<u32, BTreeSet<i64>>) {
        for change in self.groups.changed_since(before) {
            let group = (self.runs.iter()).find_map(|(_, r)| {
                (r.lease.group())
                    .filter(|g| g.id() == change.group)
                    .cloned()
            });
            let Some(group) = group else {
                continue;
            };
            self.out.event(Event::GroupMembers {
                group,
                members: change.members,
                joined: change.joined,
                left: change.left,
            });
        }
    }

    /// A member announced that it joined `group`: read the membership at
    /// the next chance (not during a wait, which it would cut short).
    pub(super) fn join_announced(&mut self, group: u32) {
        if self.session.waiting_for().is_none() && self.groups.join_announced(group) {
            self.plan.try_soon();
        }
    }
}
