//! Hand-overs asked for by name: `lease handover NAME --to PID` (the
//! payload `to <key> <pid>`) and a standby of a higher priority (`prefer
//! <key> <pid> <priority>`, see [`Options::priority`](crate::Options::priority)).
//! Any role that may `NOTIFY` can send either, so a request alone moves
//! nothing. The rule, in one place:
//!
//! - **Only the holder acts on a request, and only for a standby that
//!   waits for that key.** The locker whose run leads the key keeps the
//!   request as an *ask* and checks it with a
//!   [`Statement::CheckHandover`](crate::Statement::CheckHandover), a
//!   heartbeat that also reads `pg_locks`: at once, then after
//!   [`CHECK_EVERY`], twice that, and so on up to the heartbeat interval,
//!   within a budget of [`CHECK_BURST`] checks beside the heartbeats that
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
//!   request for the same backend. At most [`MAX_ASKS_PER_KEY`] stand per
//!   key: a new one evicts the oldest that a check has found not waiting
//!   (refused), so a flood neither crowds out a real request nor costs the
//!   holder more than its check budget.
//! - **Only the holder reserves the key.** Standbys ignore the requests
//!   themselves. The check that confirms an ask announces it from the
//!   holder's backend (`to <key> <the backend found>`); a standby leaves a
//!   key so reserved alone for [`Options::handover_window`] from then, and from the
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
//!   [`Options::wait_on_server`](crate::Options::wait_on_server) off) is
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

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[cfg(feature = "sim")]
use super::knobs::Mutation;
use super::Machine;
use crate::io::Event;
use crate::options::Options;
use crate::sql::{CheckReply, Preference, ReleaseNotice};

/// The most asks that stand at once for one key; a new request evicts the
/// oldest one a check has already found not waiting, and is dropped only
/// when every standing ask is still unchecked (see `handover`).
pub const MAX_ASKS_PER_KEY: usize = 4;

/// The least time between two checks (see `handover`): a new ask is checked
/// at once, but never sooner than this after the last check.
pub const CHECK_EVERY: Duration = Duration::from_millis(50);

/// The most checks a holder sends beside its heartbeats in a burst (see
/// `handover`); one more is allowed every heartbeat interval, so a flood of
/// requests adds at most one statement per heartbeat interval.
pub const CHECK_BURST: u32 = 4;

/// How long an ask stands unconfirmed: two validity windows and two query
/// timeouts, time for the named standby to hear of it, end the statement
/// it has in flight (a wait up to half the validity window) and queue for
/// the key, and for several heartbeats to check (the named standby leaves
/// the queue for a round trip between two of its waits, see `handover`).
pub(crate) fn ask_window(opts: &Options) -> Duration {
    opts.validity_window() * 2 + opts.query_timeout * 2
}

/// One hand-over asked of this holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ask {
    /// The named lease session's backend.
    pid: i64,
    /// The request's priority (`u32::MAX`: a `to` request).
    priority: u32,
    /// When it was asked.
    since: Instant,
    /// Until when it stands unconfirmed.
    until: Instant,
    /// How many checks have read it.
    checks: u32,
    /// When it is due for its next check: at once, then [`CHECK_EVERY`]
    /// after a check, twice that after the next, and so on, up to the
    /// heartbeat interval apart.
    next: Instant,
}

/// The asks that stand, by key (see `handover`).
#[derive(Debug, Default)]
pub(super) struct Asks {
    by_key: BTreeMap<i64, Vec<Ask>>,
    /// When the last check was sent.
    last_check: Option<Instant>,
    /// Checks left beside the heartbeats ([`CHECK_BURST`] at most), and
    /// when they were last counted.
    budget: Option<(u32, Instant)>,
}

/// A confirmed ask: hand the key over to `pid`, the backend the check found
/// waiting (the named lease session or the asking locker's watch session),
/// with `priority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Confirmed {
    pub(super) pid: i64,
    pub(super) priority: u32,
}

impl Asks {
    /// A request for `key` to backend `pid` with `priority`, at `now`,
    /// standing until `until`. Returns whether it stands now as a new ask
    /// (false for a repeat or a key whose asks are all unchecked), and the
    /// backend of the ask it evicted, if any: a new ask on a full key evicts
    /// the oldest checked one.
    pub(super) fn ask(
        &mut self,
        key: i64,
        pid: i64,
        priority: u32,
        (now, until): (Instant, Instant),
    ) -> (bool, Option<i64>) {
        let asks = self.by_key.entry(key).or_default();
        if asks.iter().any(|a| a.pid == pid) {
            return (false, None);
        }
        let mut evicted = None;
        if asks.len() >= MAX_ASKS_PER_KEY {
            let Some(oldest) = (asks.iter().enumerate())
                .filter(|(_, a)| a.checks > 0)
                .min_by_key(|(_, a)| a.since)
                .map(|(i, _)| i)
            else {
                return (false, None);
            };
            evicted = Some(asks.remove(oldest).pid);
        }
        asks.push(Ask {
            pid,
            priority,
            since: now,
            until,
            checks: 0,
            next: now,
        });
        (true, evicted)
    }

    /// The checks left beside the heartbeats at `now`, `every` being the
    /// heartbeat interval: one more every interval, up to [`CHECK_BURST`].
    fn budget(&mut self, now: Instant, every: Duration) -> u32 {
        let (left, since) = *self.budget.get_or_insert((CHECK_BURST, now));
        let refill = every.max(CHECK_EVERY);
        let earned = (now.saturating_duration_since(since).as_nanos() / refill.as_nanos()) as u32;
        let left = (left + earned).min(CHECK_BURST);
        let since = if left == CHECK_BURST {
            now
        } else {
            since + refill * earned
        };
        self.budget = Some((left, since));
        left
    }

    /// When the next check beside the heartbeats is due, `every` being the
    /// heartbeat interval: the earliest ask's turn, never sooner than
    /// [`CHECK_EVERY`] after the last check, while the budget lasts; `None`
    /// with no ask or no budget (the heartbeats check the asks then).
    pub(super) fn next_check(&mut self, now: Instant, every: Duration) -> Option<Instant> {
        let due = self.by_key.values().flatten().map(|a| a.next).min()?;
        if self.budget(now, every) == 0 {
            return None;
        }
        Some(match self.last_check {
            Some(last) => due.max(last + CHECK_EVERY),
            None => due,
        })
    }

    /// A check beside the heartbeats is sent: it spends the budget.
    pub(super) fn spend(&mut self, now: Instant, every: Duration) {
        let left = self.budget(now, every);
        if let Some((l, _)) = &mut self.budget {
            *l = left.saturating_sub(1);
        }
    }

    /// Whether any ask stands: heartbeats check them.
    pub(super) fn any(&self) -> bool {
        !self.by_key.is_empty()
    }

    /// The asks to check at `now`, `(key, backend)`,
    /// each counted as checked once more (its next check after twice the
    /// last gap, at most `every`, the heartbeat interval): per key, the
    /// highest priority first (the earliest on a tie), the order in which
    /// the check picks the first that waits.
    pub(super) fn take_check(&mut self, now: Instant, every: Duration) -> Vec<(i64, i64)> {
        self.last_check = Some(now);
        let mut out = Vec::new();
        for (key, asks) in &mut self.by_key {
            asks.sort_by_key(|a| (std::cmp::Reverse(a.priority), a.since));
            for a in asks {
                let gap = CHECK_EVERY.saturating_mul(1 << a.checks.min(16));
                a.checks += 1;
                a.next = now + gap.min(every.max(CHECK_EVERY));
                out.push((*key, a.pid));
            }
        }
        out
    }

    /// A check found the backend `waiting` (the named one, or its locker's
    /// watch session) of the ask `(key, pid)` waiting for its key (see
    /// `take_check`): every ask of `key` ends; the confirmed one, if it
    /// still stood.
    pub(super) fn confirmed(&mut self, (key, pid): (i64, i64), waiting: i64) -> Option<Confirmed> {
        let asks = self.by_key.remove(&key)?;
        let a = asks.iter().find(|a| a.pid == pid && a.checks > 0)?;
        Some(Confirmed {
            pid: waiting,
            priority: a.priority,
        })
    }

    /// The asks that ended unconfirmed by `now`, `(key, backend)`, removed;
    /// and every ask of a key not in `leading` (this locker no longer leads
    /// it), removed without a word.
    pub(super) fn expire(&mut self, now: Instant, leading: &[i64]) -> Vec<(i64, i64)> {
        self.by_key.retain(|k, _| leading.contains(k));
        let mut ended = Vec::new();
        for (key, asks) in &mut self.by_key {
            asks.retain(|a| {
                let stands = a.until > now;
                if !stands {
                    ended.push((*key, a.pid));
                }
                stands
            });
        }
        self.by_key.retain(|_, asks| !asks.is_empty());
        ended
    }

    /// What ends with the lease session: every ask (the holder holds
    /// nothing now).
    pub(super) fn session_down(&mut self) {
        self.by_key.clear();
        self.last_check = None;
    }
}

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
    /// ([`Options::priority`]):
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
        if sender != pid || priority <= self.opts.priority || self.runs.in_group(key) != Some(false)
        {
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

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn repeats_change_nothing_a_full_key_evicts_a_checked_ask_and_priority_goes_first() {
        let now = Instant::now();
        let at = (now, now + S);
        let mut asks = Asks::default();
        assert!(asks.ask(1, 10, 1, at).0);
        assert!(!asks.ask(1, 10, 5, (now, now + S * 9)).0, "a repeat");
        assert_eq!(asks.by_key[&1][0].until, now + S, "not re-armed");
        let ms = Duration::from_millis;
        assert!(asks.ask(1, 11, 3, (now + ms(1), now + S)).0);
        assert!(asks.ask(1, 12, u32::MAX, (now + ms(2), now + S)).0);
        assert!(asks.ask(1, 13, 2, (now + ms(3), now + S)).0);
        assert!(!asks.ask(1, 14, 2, at).0, "full of unchecked asks");
        assert_eq!(asks.next_check(now, S), Some(now));
        let checked = asks.take_check(now, S);
        assert_eq!(checked.len(), 4);
        assert_eq!(checked[0], (1, 12), "the highest priority first");
        // Checked once: a new one evicts the oldest checked.
        assert_eq!(
            asks.ask(1, 14, 2, (now + S / 10, now + S)),
            (true, Some(10))
        );
        assert!(
            !asks.by_key[&1].iter().any(|a| a.pid == 10),
            "the oldest went"
        );
        let best = asks.confirmed(checked[0], 12).unwrap();
        assert_eq!((best.pid, best.priority), (12, u32::MAX));
        assert!(!asks.any());
    }

    #[test]
    fn checks_come_at_once_then_further_apart_within_a_budget() {
        let now = Instant::now();
        let mut asks = Asks::default();
        asks.ask(1, 10, 1, (now, now + S * 60));
        let mut at = now;
        let mut gaps = Vec::new();
        let hb = Duration::from_millis(500);
        for _ in 0..4 {
            let next = asks.next_check(at, hb).unwrap();
            gaps.push(next - at);
            at = next;
            asks.spend(at, hb);
            asks.take_check(at, hb);
        }
        let ms = |m| Duration::from_millis(m);
        assert_eq!(gaps, [ms(0), ms(50), ms(100), ms(200)]);
        // The burst is spent: the heartbeats check, until an interval earns one more.
        assert_eq!(asks.next_check(at, hb), None);
        let later = now + hb;
        assert!(asks.next_check(later, hb).is_some());
        // A new ask is checked at once, but never sooner than CHECK_EVERY after the last.
        asks.take_check(later, hb);
        asks.ask(1, 11, 1, (later + ms(1), now + S * 60));
        let next = asks.next_check(later + ms(1), hb);
        assert_eq!(next, Some(later + CHECK_EVERY));
    }

    #[test]
    fn an_ask_ends_unconfirmed_at_its_window_or_with_the_lead() {
        let now = Instant::now();
        let mut asks = Asks::default();
        asks.ask(1, 10, 1, (now, now + S));
        asks.ask(2, 10, 1, (now, now + S * 5));
        assert_eq!(asks.expire(now, &[1, 2]), vec![]);
        assert_eq!(asks.expire(now + S, &[1, 2]), vec![(1, 10)]);
        assert_eq!(asks.expire(now, &[1]), vec![]);
        assert!(!asks.any());
    }
}
