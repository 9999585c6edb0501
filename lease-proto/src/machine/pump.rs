//! The pump: after every input, the deadlines are enforced against the
//! clock and what is due is sent. The rule, in one place: which deadline
//! ends the session (validity, connect, query), when a held-back try reply
//! goes on, when a session opens or closes (`Machine::needs_session`), when
//! a wait in flight is interrupted, and the order in which the ready, idle
//! session sends (`Machine::next_statement`: verification, a group's
//! leave, releases, the heartbeat and the checks of asks, a preference, the
//! standby's try or an observer's read, then a wait on the server,
//! `Machine::next_wait`); and which deadline can make progress
//! (`Machine::next_timer`, behind `Machine::poll_timeout`). It reads every
//! component, so it is an `impl Machine` block; each component keeps its own
//! part of the decision (`SendPlan`: the heartbeat's turn, `Asks`: a
//! check's, `ServerWait`: a wait's).

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::asks::ask_window;
use super::deadline::Deadline;
#[cfg(feature = "sim")]
use super::knobs::Mutation;
use super::membership::free_bound;
use super::plan::Beat;
use super::session::{self, Session, Step, What};
use super::wait::MIN_WAIT;
use super::Machine;
use super::Phase;
use crate::io::{Event, Reason};

impl Machine {
    /// After every input: enforce deadlines against `now`, then start what
    /// is due. The validity timer is the earliest validity end of a held
    /// key, read from the runs before and after.
    pub(super) fn pump(&mut self, now: Instant) {
        self.sync_validity();
        let (watch, mut cx) = self.watch_cx();
        watch.due(&mut cx, now);
        self.act(now);
        let lease = self.lease_side();
        let (watch, mut cx) = self.watch_cx();
        watch.step(&mut cx, now, lease);
        self.sync_validity();
    }

    fn sync_validity(&mut self) {
        let end = self.runs.earliest_validity_end(self.opts.validity_window());
        self.timers.put(Deadline::Validity, end);
    }

    fn act(&mut self, now: Instant) {
        // Check the clock rather than trust that a timer fired.
        if self.timers.expired(Deadline::Validity, now) {
            self.lose_session(now, Reason::ValidityExpired, true);
        }
        if self.timers.expired(Deadline::Connect, now) || self.timers.expired(Deadline::Query, now)
        {
            let reason = if self.session.probing() {
                session::probe_unanswered(self.opts.query_timeout)
            } else {
                Reason::QueryTimeout
            };
            self.lose_session(now, reason, true);
        }
        if self.timers.expired(Deadline::LockDelay, now) {
            self.lock_delay_over(now);
        }
        self.close_doubtful_when_done(now);
        self.interrupt_wait_if_needed();
        let needed = self.needs_session();
        let backoff_over = self.timers.get(Deadline::Backoff).is_none_or(|t| t <= now);
        let orphans = self.runs.has_orphans();
        match self.session.next_step(needed, backoff_over, orphans) {
            Step::Nothing => {}
            Step::Open => self.open(now),
            Step::CloseIdle(id) => self.close_idle(id),
            Step::Send => {
                if let Some(what) = self.next_statement(now) {
                    self.send(now, what);
                }
            }
        }
    }

    /// While a wait blocks the session: closes the session if something
    /// else needs it (see `wait`).
    fn interrupt_wait_if_needed(&mut self) {
        let (Some(waited), Some(id)) = (self.session.waiting_for(), self.session.id()) else {
            return;
        };
        let other_wanted = self.runs.other_waiting(waited);
        let needed = self.needs_session();
        if needed && !(self.plan.try_owed() && other_wanted) && self.phase == Phase::Open {
            return;
        }
        self.out.event(Event::WaitInterrupted { session: id });
        if needed {
            self.close_for_new_session(id);
        } else {
            self.close_idle(id);
        }
    }

    /// Picks the next statement on the ready, idle session, in the send
    /// order: what is owed (a verify, a group to leave, releases), the
    /// heartbeat or an ask's check, a priority's request, the try (or an
    /// observer's look), then a wait on the server (`wait`). Each step is a
    /// method below, in that order.
    fn next_statement(&mut self, now: Instant) -> Option<What> {
        if let Some(what) = self.owed(now) {
            return Some(what);
        }
        self.expire_asks(now);
        let turn = self.turn(now)?;
        if let Some(what) = self.beat(now, &turn) {
            return Some(what);
        }
        self.plan.not_heartbeat();
        if let Some(until) = turn.held {
            if self.timers.get(Deadline::Retry).is_none_or(|t| t < until) {
                self.timers.set(Deadline::Retry, until);
            }
            return None;
        }
        if let Some(what) = self.prefer(now) {
            return Some(what);
        }
        if turn.try_due {
            if let ControlFlow::Break(what) = self.try_turn(now, &turn) {
                return what;
            }
        }
        self.take(now)
    }

    /// Owed before anything: a verify, the groups none of its runs wants
    /// any more (left, and announced, before their keys are released: see
    /// `groups`), and the releases.
    fn owed(&mut self, now: Instant) -> Option<What> {
        if self.plan.verify_owed() {
            return Some(What::Verify);
        }
        if let Some(leave) = self.groups.leaving(&self.group_keys()) {
            return Some(What::Members(leave));
        }
        let release = (self.runs).take_release(now, self.opts.handover_window());
        if release.is_empty() {
            return None;
        }
        let recent = self.opts.query_timeout;
        let reserved = self.runs.reservations(&release, now, recent);
        Some(What::Release {
            keys: release,
            reserved,
        })
    }

    /// Asks that ended unconfirmed, or whose key this locker no longer
    /// leads (see `handover`).
    fn expire_asks(&mut self, now: Instant) {
        let leading: Vec<i64> = self.runs.leading_keys().into_iter().collect();
        for (key, to) in self.asks.expire(now, &leading) {
            self.out.event(Event::HandoverDeclined { key, to });
        }
    }

    /// What this pass reads once; `None` when no session is up. On a newly
    /// promoted primary nothing is tried (nor waited for: a wait would be
    /// granted at once, the key being free there) before the hold ends; the
    /// retry deadline wakes the machine then.
    fn turn(&mut self, now: Instant) -> Option<Turn> {
        let holding = self.runs.holding();
        let up = self.session.up_mut()?;
        let held = up.promotion_hold.filter(|&until| until > now);
        if held.is_none() && up.promotion_hold.take().is_some() {
            self.out.event(Event::PromotionHoldEnded { session: up.id });
        }
        let heartbeat_due =
            self.heartbeat_needed() && self.timers.expired(Deadline::Heartbeat, now);
        let retry_due = self.timers.get(Deadline::Retry).is_none_or(|t| t <= now);
        let try_due =
            (self.plan.try_owed() || retry_due) && self.phase == Phase::Open && held.is_none();
        Some(Turn {
            holding,
            held,
            heartbeat_due,
            retry_due,
            try_due,
        })
    }

    /// The heartbeat, or an ask's check (a heartbeat too). Heartbeat first,
    /// but never twice in a row while a try is due. A locker holding nothing
    /// heartbeats only to keep its session alive, and a try does that too:
    /// it goes instead.
    fn beat(&mut self, now: Instant, turn: &Turn) -> Option<What> {
        let heartbeat_first = turn.holding || !turn.try_due;
        if turn.heartbeat_due
            && heartbeat_first
            && self
                .plan
                .heartbeat_may_go(turn.try_due, self.runs.any_waiting())
        {
            return Some(match self.plan.heartbeat() {
                Beat::Verify => What::Verify,
                // While asks stand, the heartbeat checks them (see `handover`).
                Beat::Heartbeat if self.asks.any() => {
                    What::Check(self.asks.take_check(now, self.opts.heartbeat_interval))
                }
                Beat::Heartbeat => What::Heartbeat,
            });
        }
        let every = self.opts.heartbeat_interval;
        if let Some(at) = self.asks.next_check(now, every) {
            // An ask's turn (see `handover`): a check, which is a heartbeat
            // too; else the machine wakes for it.
            if at <= now {
                self.asks.spend(now, every);
                return Some(What::Check(self.asks.take_check(now, every)));
            }
            self.timers.set(Deadline::Check, at);
        } else {
            self.timers.stop(Deadline::Check);
        }
        None
    }

    /// A standby of a priority that saw a holder asks it for the lease (see
    /// `preference_requested`).
    fn prefer(&mut self, now: Instant) -> Option<What> {
        let priority = self.opts.role.priority().unwrap_or(0);
        if self.phase != Phase::Open || priority == 0 {
            return None;
        }
        let me = self.session.up().and_then(|up| up.stage.backend_pid());
        let again = self.opts.validity_window();
        let key = self.runs.take_preference(now, me, again)?;
        // It queues for the key: on its lease session, or on its watch
        // session while it holds another lease (which names the lease
        // session, see `handover`).
        let until = now + ask_window(&self.opts);
        self.wait.named(key, until);
        self.watch.prefer(key, until);
        Some(What::Prefer { key, priority })
    }

    /// The try that is due (or an observer's look): `Break` with what to
    /// send (or nothing), `Continue` to go on to a wait.
    fn try_turn(&mut self, now: Instant, turn: &Turn) -> ControlFlow<Option<What>> {
        #[cfg(feature = "sim")] // The broken variant: an observer that tries.
        let observes = self.observes() && self.knobs.mutation != Some(Mutation::ObserverTries);
        #[cfg(not(feature = "sim"))]
        let observes = self.observes();
        if observes {
            // An observer reads who holds its keys instead of trying them.
            self.plan.tried();
            let keys = self.runs.take_look();
            return ControlFlow::Break((!keys.is_empty()).then_some(What::Look(keys)));
        }
        // The periodic try (for a group member, the read before it, on
        // whose reply the retry deadline moves on): waiting may start
        // over, and a rested watch session opens again. Not the try
        // after a wake's lock delay, which the retry deadline also
        // sends: it must count against the wake budget.
        let retry_due = turn.retry_due;
        if retry_due {
            self.wait.periodic_try();
        }
        if retry_due && !self.watch.woken() {
            self.watch.periodic_try();
        }
        // A group member reads the membership first (see `groups`).
        let wanted = self.group_keys();
        if self.groups.read_owed(&wanted) {
            return ControlFlow::Break(Some(What::Members(self.groups.read(&wanted))));
        }
        let woke = self.watch.woken();
        if woke && self.groups.announcing() {
            // The member that woke (it watched the one gone, and found
            // the departure first) announces it before its try: a try
            // that wins holds its reply back for the lock delay, and the
            // others would learn of the departure that much later, then
            // wait out their own lock delay: two in a row. The others'
            // announcements (every survivor's read finds the departure)
            // go after their tries, off the takeover's path: before, they
            // cost every survivor another read first.
            return ControlFlow::Break(Some(What::Members(self.groups.read(&wanted))));
        }
        let me = self.session.up().and_then(|up| up.stage.backend_pid());
        let own = self.own_backends();
        let bound = free_bound(&self.opts);
        let groups = &self.groups;
        #[cfg(feature = "sim")] // The broken variant: every key as if owned.
        let ignore_share = self.knobs.mutation == Some(Mutation::IgnoreShare);
        #[cfg(not(feature = "sim"))]
        let ignore_share = false;
        let keys = self.runs.take_try(now, &own, |lease| {
            ignore_share
                || (lease.group())
                    .is_none_or(|g| groups.may_try(g.id(), lease.key(), me, now, bound))
        });
        let announce = self.groups.tried();
        self.plan.tried();
        if announce {
            // A departure or a claim to announce: read again at once.
            self.plan.try_soon();
        }
        if keys.is_empty() && !wanted.is_empty() {
            // A group member that may try nothing after a wake: as a
            // try that won nothing (the watch session waits again).
            self.watch.try_answered(&self.runs, false, None);
        }
        if keys.is_empty() && retry_due {
            // Every waiting key is reserved for another backend (a
            // hand-over asked for): the next periodic try.
            let retry = now + self.connector.retry_delay(self.opts.retry_interval);
            self.timers.set(Deadline::Retry, retry);
        }
        if announce && keys.is_empty() {
            // Nothing to try: the announcing read goes now (else it
            // would wait for the next input, a heartbeat later).
            return ControlFlow::Break(Some(What::Members(self.groups.read(&wanted))));
        }
        if keys.is_empty() {
            return ControlFlow::Continue(());
        }
        if !turn.holding {
            // The try proves the session alive as a heartbeat does (it
            // checks the backend pid and the nonce), and a key it wins
            // counts from its send time: the next heartbeat is due an
            // interval after it.
            let next = now + self.opts.heartbeat_interval;
            self.timers.set(Deadline::Heartbeat, next);
        }
        ControlFlow::Break(Some(What::Try(keys)))
    }

    /// A wait on the server that takes the key (see `wait`, "Taken"): its
    /// run is in it as in a try.
    fn take(&mut self, now: Instant) -> Option<What> {
        let (key, timeout, chunk, named) = self.next_wait(now)?;
        if !self.runs.take_wait(key) {
            return None;
        }
        Some(What::Take {
            key,
            timeout,
            chunk,
            named,
        })
    }

    /// The wait to send now, if any (see `wait` for when).
    fn next_wait(&self, now: Instant) -> Option<(i64, Duration, bool, bool)> {
        if !self.opts.server_wait.idle()
            // Behind a pooler (it rejected the startup options), a blocked
            // statement would hold a pooled server connection all along.
            || self.connector.settings_by_statement()
            // A lease-group member's session is its membership (the member
            // id is its backend pid): a wait, which the machine interrupts by
            // replacing the session, would change it (see `groups`).
            || self.groups.active(&self.group_keys())
            // An observer never queues on a key (see `Machine::observes`).
            || self.observes()
            || self.phase != Phase::Open
            || self.wait.paused(now)
            || self.plan.verify_owed()
        {
            return None;
        }
        let wanted = self.runs.wait_candidates(&self.own_backends())?;
        // A take's win counts from its send time, and its job starts a lock
        // delay after its reply (see `wait`, "Taken"): it waits half of what
        // the validity window leaves beside the lock delay at most, so that
        // much is left for the reply.
        let longest = self
            .opts
            .validity_window()
            .saturating_sub(self.opts.lock_delay)
            / 2;
        let (key, timeout, chunk, named) =
            (self.wait).next(now, &wanted, self.timers.get(Deadline::Retry))?;
        if timeout > longest {
            return (longest >= MIN_WAIT).then_some((key, longest, true, named));
        }
        Some((key, timeout, chunk, named))
    }

    /// Whether heartbeats are due at all. A locker holding nothing needs no
    /// confirmation, only a session kept from looking idle to the server
    /// guard (`idle_session_timeout`): its tries do that when the longest
    /// gap between two tries' send times, a query timeout (a reply later
    /// than that ends the session) plus a retry interval (jittered down,
    /// never up), is shorter than the guard. With the defaults (5 s + 10 s
    /// against 16 s) a standby sends its tries and nothing else; otherwise
    /// it also heartbeats, each try pushing the heartbeat back.
    fn heartbeat_needed(&self) -> bool {
        // A hold after a promotion is longer than the guard: heartbeats keep
        // the session from looking idle meanwhile.
        self.runs.holding()
            || self
                .session
                .up()
                .is_some_and(|up| up.promotion_hold.is_some())
            || self.opts.retry_interval + self.opts.query_timeout >= self.opts.guard_timeout()
    }

    /// Whether any run needs the session: a standby, a leader, or a release.
    pub(super) fn needs_session(&self) -> bool {
        !matches!(self.phase, Phase::Refused(_))
            && self.runs.need_session(self.phase == Phase::Open)
    }

    /// The earliest deadline that can make progress, and which one it is.
    pub(super) fn next_timer(&self) -> Option<(Deadline, Instant)> {
        // Only a ready session with nothing in flight sends.
        let idle_ready = self.session.idle_ready();
        self.timers.next(|timer| match timer {
            Deadline::Connect | Deadline::Query | Deadline::Validity | Deadline::LockDelay => true,
            Deadline::DeferredClose => matches!(self.session, Session::Doubtful { .. }),
            Deadline::Heartbeat => idle_ready && self.heartbeat_needed(),
            Deadline::Retry => {
                // A group member reads (and so tries) periodically, waiting
                // runs or not, while it takes new work.
                let reads = self.phase == Phase::Open && self.groups.active(&self.group_keys());
                idle_ready && (self.runs.any_waiting() || reads)
            }
            Deadline::Backoff => matches!(self.session, Session::Backoff) && self.needs_session(),
            Deadline::Watch => true,
            Deadline::Check => idle_ready,
        })
    }
}

/// What one pass of `Machine::next_statement` reads once.
struct Turn {
    /// The locker holds a lease.
    holding: bool,
    /// A newly promoted primary's hold, until when.
    held: Option<Instant>,
    heartbeat_due: bool,
    retry_due: bool,
    /// A try is owed or the retry deadline passed, the locker is open and
    /// no promotion hold stands.
    try_due: bool,
}
