//! Hand-overs asked for by name: `lease handover NAME --to PID` (the
//! payload `to <key> <pid>`) and a standby of a higher priority (`prefer
//! <key> <pid> <priority>`, see [`Role::Candidate`](crate::Role::Candidate)).
//! Any role that may `NOTIFY` can send either, so a request alone moves
//! nothing. The rule, in one place:
//!
//! - **Only the holder acts on a request, and only for a standby that
//!   waits for that key.** The locker whose run leads the key keeps the
//!   request as an *ask* and checks it with a
//!   [`Statement::CheckHandover`](crate::Statement::CheckHandover), a
//!   heartbeat that also reads `pg_locks`: at once, then after
//!   [`CHECK_EVERY`](super::CHECK_EVERY), twice that, and so on up to the heartbeat interval,
//!   within a budget of [`CHECK_BURST`](super::CHECK_BURST) checks beside the heartbeats that
//!   earns one more per heartbeat interval; past it, each heartbeat checks.
//!   Only when the named backend, or a watch session of its locker (whose
//!   wait names that backend in its `application_name`, see `watch`),
//!   waits for the key does the holder hand it over to the backend found
//!   waiting (its job cancelled with
//!   [`Reason::HandedOver`](crate::Reason::HandedOver), the key released
//!   once the job returned). An ask that no check confirms within
//!   [`ask_window`] ends with [`Event::HandoverDeclined`]; the job never
//!   noticed it.
//! - **Repeats change nothing.** An ask is not replaced or re-armed by a
//!   request for the same backend. At most [`MAX_ASKS_PER_KEY`](super::MAX_ASKS_PER_KEY) stand per
//!   key: a new one evicts the oldest that a check has found not waiting
//!   (refused), so a flood neither crowds out a real request nor costs the
//!   holder more than its check budget.
//! - **Only the holder reserves the key.** Standbys ignore the requests
//!   themselves. The check that confirms an ask announces it from the
//!   holder's backend (`to <key> <the backend found>`); a standby leaves a
//!   key so reserved alone for [`Options::handover_window`](crate::Options::handover_window) from then, and from the
//!   release, and only when the announcement came from the holder its last
//!   try saw. A locker counts a reservation for its lease session or its
//!   watch session (the current or the one before) as its own. The release
//!   names the backend again only if it holds or waits for the key, or the
//!   hand-over was confirmed less than a query timeout before and it is
//!   still connected ([`Statement::Release`](crate::Statement::Release));
//!   a release of the holder's that names nobody ends the reservation, and
//!   the standbys take the key at once. The named backend is in the key's
//!   queue, so it is granted the key in the release, or right after the
//!   takes ahead of it (which decline their wins at once), or at its next
//!   wait, which the release's notification wakes: no reservation keeps a
//!   free key from every standby for longer than that hand-over.
//! - **The named standby queues.** A locker named by a `to` request (by its
//!   lease session or its watch session), or one that asked for a key by
//!   priority, waits for that key first: on its lease session even behind
//!   [`HERD_WAITERS`](super::HERD_WAITERS) (its wait ignores the crowd, see
//!   `wait`), or on its watch session while it holds another lease, until
//!   [`ask_window`] has passed; its waits run in chunks below
//!   `deadlock_timeout`, so it leaves the queue for a round trip between
//!   two of them. A standby that does not wait on the server (behind a
//!   pooler that rejected the startup options, or with
//!   [`ServerWait::Off`](crate::ServerWait::Off)) is
//!   never confirmed, and keeps its place behind the holder.
//!
//! What a role that can connect can still do: move the lease to a standby
//! that waits for it, as `lease handover --to` does (each move interrupts
//! the holder's job), and hold the key itself (`pg_advisory_lock` needs no
//! privilege): only `CONNECT` on the database keeps a role out.
//!
//! The handover channel's other side is here too: a holder's release
//! notification (`Machine::handover_notified`), which counts as graceful
//! only from the holder a standby's last try saw, carries the reservation
//! the release names, and wakes the standbys that want the key; and the
//! hand-over itself (`Machine::hand_over`), which a confirmed ask and a
//! lease group's share both end in.

use std::time::Instant;

use super::asks::ask_window;
#[cfg(feature = "sim")]
use super::knobs::Mutation;
use super::Machine;
use crate::io::Event;
use crate::sql::{CheckReply, Preference, ReleaseNotice};

impl Machine {
    /// This locker's backends: its lease session's and its watch session's
    /// (a key reserved for either is its own, see `handover`).
    pub(super) fn own_backends(&self) -> Vec<i64> {
        let lease = self.session.up().and_then(|up| up.stage.backend_pid());
        lease.into_iter().chain(self.watch.backend_pids()).collect()
    }

    /// A hand-over of `key` to backend `to` was asked for
    /// ([`handover_request_payload`](crate::server::handover_request_payload),
    /// `lease handover NAME --to PID`), or announced by the holder once its
    /// check confirmed it (`sender` is the holder this locker's last try
    /// saw): the holder asks a check (see `handover`); the named locker
    /// queues for the key (on its lease session, or its watch session when
    /// it holds another lease); a standby reserves the key only on the
    /// holder's announcement.
    pub(super) fn handover_requested(&mut self, now: Instant, key: i64, to: i64, sender: i64) {
        let me = self.own_backends();
        if me.contains(&sender) {
            // Its own announcement (see `check_done`).
            return;
        }
        let standby = self.runs.standby_of(key);
        #[cfg(feature = "sim")] // The broken variant: every request reserves.
        if self.knobs.mutation == Some(Mutation::HandOverUnchecked) && standby.is_some() {
            let until = now + self.opts.handover_window();
            self.runs.reserve(key, to, (now, until), u32::MAX);
        }
        if let Some((_, Some(Some(holder)))) = standby.filter(|_| sender != 0) {
            if holder == sender {
                // The holder's announcement of a confirmed hand-over.
                let until = now + self.opts.handover_window();
                self.runs.reserve(key, to, (now, until), u32::MAX);
                if me.contains(&to) {
                    self.runs.hand_over_announced(key, holder);
                }
            }
        }
        if me.contains(&to) {
            if standby.is_some() {
                // Its next wait is for the key (the key is held: a try would
                // only cost a round trip).
                let until = now + ask_window(&self.opts);
                self.wait.named(key, until);
                self.watch.prefer(key, until);
            }
            return;
        }
        self.ask(now, key, to, u32::MAX);
    }

    /// The holder of `key` keeps a request to hand it to `to` as an ask,
    /// checked at once and then less and less often (see `handover`).
    fn ask(&mut self, now: Instant, key: i64, to: i64, priority: u32) {
        if !self.runs.leading_keys().contains(&key) {
            return;
        }
        #[cfg(feature = "sim")] // The broken variant: no check.
        if self.knobs.mutation == Some(Mutation::HandOverUnchecked) {
            let until = now + self.opts.handover_window();
            self.runs.reserve(key, to, (now, until), priority);
            return self.hand_over(key, to, true);
        }
        let until = now + ask_window(&self.opts);
        if let (_, Some(evicted)) = self.asks.ask(key, to, priority, (now, until)) {
            self.out.event(Event::HandoverDeclined { key, to: evicted });
        }
    }

    /// A check answered: it proves the session as a heartbeat does; each
    /// key whose asked backend waits is handed over to the backend found
    /// waiting (see `handover`).
    pub(super) fn check_done(
        &mut self,
        now: Instant,
        sent: Instant,
        asked: &[(i64, i64)],
        reply: CheckReply,
    ) {
        self.heartbeat_done(now, sent, reply.session);
        if self.session.up().is_none() {
            return;
        }
        let leading = self.runs.leading_keys();
        for (ordinal, waiting) in reply.waiting {
            let i = usize::try_from(ordinal).ok().and_then(|o| o.checked_sub(1));
            let Some(&ask) = i.and_then(|i| asked.get(i)) else {
                continue;
            };
            let key = ask.0;
            let Some(to) = self.asks.confirmed(ask, waiting) else {
                continue;
            };
            if !leading.contains(&key) {
                continue;
            }
            let until = now + self.opts.handover_window();
            self.runs.reserve(key, to.pid, (now, until), to.priority);
            self.hand_over(key, to.pid, true);
        }
    }

    /// A standby of a higher priority asks for `key` (the payload `prefer
    /// <key> <pid> <priority>`, sent by its [`Statement::Prefer`](crate::Statement::Prefer)
    /// from backend `sender`). The priority rule, in one place
    /// ([`Role::Candidate`](crate::Role::Candidate)):
    ///
    /// - a standby with a priority above 0 whose last try saw its key held
    ///   by another backend asks that holder once, and again if the same
    ///   holder still holds it a validity window later, then two, then every
    ///   four, until that holder has handed it over three times
    ///   (`RunTable::take_preference`); a lease-group run never
    ///   asks (its share decides);
    /// - a request counts only from the backend it names (`sender` is
    ///   `pid`) and only if its priority is above this locker's; then it is
    ///   asked of the holder as a `to` request is (see `handover`: the
    ///   holder hands the lease over, not a lease-group run's, once a check
    ///   finds the asking standby waiting for the key), the ask of the
    ///   highest priority first. A holder of an equal or higher priority
    ///   ignores it, so leadership never moves back and forth: it moves
    ///   only up.
    ///
    /// Bound: the preferred standby leads one hand-over after its first
    /// try: the try's and the request's round trips, the check, the
    /// holder's job reaction, the release, and the grant of its queued wait
    /// (docs/guarantees.md, "a preferred member takes over").
    pub(super) fn preference_requested(&mut self, now: Instant, asked: Preference, sender: i64) {
        let Preference { key, pid, priority } = asked;
        // An observer (no priority) ranks as 0; it never holds a key anyway.
        let own = self.opts.role.priority().unwrap_or(0);
        if sender != pid || priority <= own || self.runs.in_group(key) != Some(false) {
            return;
        }
        self.ask(now, key, pid, priority);
    }

    /// A handover notification for `key` from backend `sender`: a graceful
    /// release, if `sender` is the holder this standby last saw; then a
    /// standby that wants it tries at once (see `wait` for a wait in flight).
    ///
    /// From any other backend it is ignored: any role may `NOTIFY` on the
    /// channel (a forged one sent just before the holder's session is
    /// terminated would skip the lock delay), and a late one from an
    /// earlier holder may reach a standby that lost the herd and waits
    /// again behind the new holder.
    pub(super) fn handover_notified(&mut self, now: Instant, release: ReleaseNotice, sender: i64) {
        let ReleaseNotice {
            key,
            at,
            grantee,
            reserved,
        } = release;
        let Some((wanted, holder)) = self.runs.standby_of(key) else {
            return;
        };
        let me = self.own_backends();
        if let Some(holder) = holder {
            #[cfg(feature = "sim")]
            let anyone = self.knobs.mutation == Some(Mutation::NotifyFromAnyone);
            #[cfg(not(feature = "sim"))]
            let anyone = false;
            if holder != Some(sender) && !anyone {
                self.out.event(Event::NotificationIgnored {
                    key,
                    sender_pid: sender,
                    holder_pid: holder,
                });
                // A key handed over to this backend may come by way of
                // another standby, whose take won it and released it at once
                // (`try_done`): any release of it is worth a try now (its win
                // still waits out the lock delay).
                let named = reserved.is_some_and(|r| me.contains(&r));
                if wanted && (named || self.runs.reserved_for(key, &me, now)) {
                    self.plan.try_soon();
                }
                return;
            }
            // The holder's release names the backend it handed the key to
            // (see `handover`): only that one tries it for the window; one
            // that names nobody ends a reservation.
            match reserved {
                Some(to) => {
                    let until = now + self.opts.handover_window();
                    self.runs.reserve(key, to, (now, until), u32::MAX);
                }
                None if holder.is_some() => self.runs.unreserve(key),
                None => {}
            }
        }
        self.runs.released_gracefully(key, now, (at, grantee));
        self.lock_delay_over_if_graceful(now);
        if (self.wait).notified(key, self.session.waiting_for(), wanted) {
            self.plan.try_soon();
        }
    }

    /// The lease of `key`, if a run of it leads, handed over to backend
    /// `to` ([`RunTable::hand_over`](super::runs::RunTable::hand_over): its
    /// job cancelled with [`Reason::HandedOver`](crate::Reason::HandedOver),
    /// the key released once the job returned) with its
    /// [`Event::HandedOver`]; `requested`: a hand-over request asked for it,
    /// not the group's share. Nothing when no run of `key` leads.
    pub(super) fn hand_over(&mut self, key: i64, to: i64, requested: bool) {
        if let Some((run, lease)) = self.runs.hand_over(key, &mut self.out) {
            (self.out).event(Event::HandedOver {
                run,
                lease,
                to,
                requested,
            });
        }
    }
}
