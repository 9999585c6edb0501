//! Acquiring a key: a try's reply and a take's (a standby's wait that takes
//! its key), and the lock delay between a win and its job, in one place
//! (`Machine::try_answered`). A win checks the session that answered it,
//! gives way to a hand-over reserved meanwhile (see `handover`), and starts
//! its run; what was not won is a standby's holder seen. It combines the
//! session's statement in flight, the runs, the send plan, the wait and
//! watch components and the deadlines, so it is an `impl Machine` block.

use std::time::Instant;

use super::deadline::Deadline;
#[cfg(feature = "sim")]
use super::knobs::Mutation;
use super::session::{self, InFlight, What};
use super::wait::{NotFreed, TAKE_NOTICES};
use super::Machine;
use crate::io::{Event, QueryId, Reason, Refusal, SessionError};
use crate::sql::{Row, TryReply, WaitReply};

/// How a try's reply came (see `Machine::try_answered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// A try of the standby's own: a poll, a new session's first try, a
    /// notification's.
    Poll,
    /// A try after the watch session's wake.
    Wake,
    /// A take (a wait that takes its key).
    Take,
}

impl Machine {
    /// A try's reply (`rows`) to the session's own try of `keys`, sent as
    /// `query` at `sent`: after the watch session's wake, or a poll.
    pub(super) fn try_replied(
        &mut self,
        now: Instant,
        (query, sent): (QueryId, Instant),
        keys: Vec<i64>,
        rows: Vec<Row>,
    ) {
        let via = if self.watch.woken() {
            Via::Wake
        } else {
            Via::Poll
        };
        let reply = TryReply::parse(&keys, &rows);
        self.try_answered(now, (query, sent), keys, reply, via)
    }

    /// A try of `keys` failed: maybe acquired (the statement may have taken
    /// some locks), so the session verifies before the next try.
    pub(super) fn try_failed(&mut self, now: Instant, keys: &[i64], error: SessionError) {
        self.out.event(Event::TryFailed { error });
        self.runs.try_back(keys);
        self.plan.owe_verify();
        let retry = now + self.connector.retry_delay(self.opts.retry_interval);
        self.timers.set(Deadline::Retry, retry);
    }

    /// A try's reply (`via`: what the statement was). The lock delay, in
    /// one place: a key the try won starts its job
    /// [`Options::lock_delay`](crate::Options::lock_delay) after the reply,
    /// unless a handover notification from the holder its standby's last try saw
    /// said the release was graceful (at most the lock delay before the try
    /// was sent, or meanwhile: the rest of the delay is skipped then). The
    /// win may come moments after the server ended the holder's session
    /// (`pg_terminate_backend`, a reset connection), which the old holder
    /// learns at about the same moment: its job may still be stopping. So
    /// the reply is held back, its statement still in flight (as if the
    /// server had answered that much later: a session that ends meanwhile
    /// loses the win with it), whether the try followed a wake (a standby's
    /// wait or the watch session), a poll, or a new session's first try.
    fn try_answered(
        &mut self,
        now: Instant,
        (query, sent): (QueryId, Instant),
        keys: Vec<i64>,
        reply: TryReply,
        via: Via,
    ) {
        let delay = self.opts.lock_delay;
        #[cfg(feature = "sim")] // The broken variant: no lock delay after a poll.
        let delay = match self.knobs.mutation {
            Some(Mutation::LockDelayOnlyAfterWakes) if via == Via::Poll => {
                std::time::Duration::ZERO
            }
            _ => delay,
        };
        let me = self.session.up().and_then(|up| up.stage.backend_pid());
        let ignored = self.grantee_ignored();
        let needs = !delay.is_zero()
            && (self.runs).any_win_needs_lock_delay(&reply.won, (sent, me), delay, ignored);
        // A take's win waits for the notifications behind its reply.
        let delay = match (needs, via) {
            (true, _) => delay,
            (false, Via::Take) if !reply.won.is_empty() => TAKE_NOTICES,
            (false, _) => return self.try_done(now, sent, &keys, reply),
        };
        let Some(up) = self.session.up_mut() else {
            return;
        };
        up.inflight = Some(InFlight {
            id: query,
            sent,
            what: What::Try(keys),
        });
        up.held_back = Some(Box::new(reply));
        self.timers.set(Deadline::LockDelay, now + delay);
    }

    /// The lock delay of a held-back try reply ended: the reply is taken as
    /// arriving now.
    pub(super) fn lock_delay_over(&mut self, now: Instant) {
        self.timers.stop(Deadline::LockDelay);
        let Some(up) = self.session.up_mut() else {
            return;
        };
        let Some(reply) = up.held_back.take() else {
            return;
        };
        let Some(InFlight {
            sent,
            what: What::Try(keys),
            ..
        }) = up.inflight.take_if(|q| matches!(q.what, What::Try(_)))
        else {
            return;
        };
        self.try_done(now, sent, &keys, *reply)
    }

    /// A graceful release was notified: a held-back try reply whose every
    /// win is now graceful goes on at once.
    pub(super) fn lock_delay_over_if_graceful(&mut self, now: Instant) {
        let Some(up) = self.session.up() else {
            return;
        };
        let (
            Some(reply),
            Some(InFlight {
                sent,
                what: What::Try(_),
                ..
            }),
        ) = (&up.held_back, &up.inflight)
        else {
            return;
        };
        let me = up.stage.backend_pid();
        let (delay, ignored) = (self.opts.lock_delay, self.grantee_ignored());
        if !(self.runs).any_win_needs_lock_delay(&reply.won, (*sent, me), delay, ignored) {
            self.lock_delay_over(now);
        }
    }

    /// The broken variant [`Mutation::IgnoreGrantee`]: a release's
    /// notification counts as graceful for a take's win whoever the release
    /// granted the key to.
    fn grantee_ignored(&self) -> bool {
        #[cfg(feature = "sim")]
        return self.knobs.mutation == Some(Mutation::IgnoreGrantee);
        #[cfg(not(feature = "sim"))]
        false
    }

    fn try_done(&mut self, now: Instant, sent: Instant, tried: &[i64], reply: TryReply) {
        let Some(up) = self.session.up() else {
            return;
        };
        let pid = up.stage.backend_pid();
        match up.same_try_session(reply.session) {
            Ok(()) => {}
            Err(Reason::Refused(refusal)) => return self.refuse(now, refusal),
            Err(reason) => return self.lose_session(now, reason, true),
        }
        // This session never tries a key it holds (orphans aside): if its
        // own backend holds one, another client does.
        let own = (reply.not_won.iter())
            .find(|(key, holder)| *holder == pid && !self.runs.is_orphan(*key));
        if let Some((key, _)) = own {
            let detail = format!("key {key} is held by this session's own backend");
            return self.refuse(now, Refusal::BackendShared { detail });
        }
        let window = self.opts.validity_window();
        if !reply.won.is_empty() && now >= sent + window {
            // Answered (or its lock delay ended) after its validity: the
            // process was frozen meanwhile, and the server may have ended
            // the session for it. No job starts on a lease already expired.
            return self.lose_session(now, Reason::ValidityExpired, true);
        }
        // Its session row (same backend, same nonce) proves the session as
        // a heartbeat does, and a try unlocks nothing: every held lease is
        // confirmed from its send time. Else a holder's heartbeat that waits
        // behind its periodic try lets its leases expire without a fault.
        self.runs.confirm_all(sent);
        let seen = (self.watch.woken_key())
            .and_then(|key| reply.not_won.iter().find(|(k, _)| *k == key))
            .map(|&(_, holder)| holder);
        (self.watch).try_answered(&self.runs, !reply.won.is_empty(), seen);
        let me = self.own_backends();
        for &won in &reply.won {
            #[cfg(feature = "sim")] // The broken variant: a reserved win kept.
            let keeps = self.knobs.mutation == Some(Mutation::KeepReservedWin);
            #[cfg(not(feature = "sim"))]
            let keeps = false;
            let reserved = self.runs.reserved_for_other(won.0, &me, now);
            if let Some(to) = reserved.filter(|_| !keeps) {
                // A hand-over to `to` was asked for while the try (or the
                // take) was in flight: the key is `to`'s, so its job does
                // not start (see `handover`).
                let window = self.opts.handover_window();
                self.runs.decline(won.0, now, window);
                self.out.event(Event::WinDeclined {
                    key: won.0,
                    to_pid: to,
                });
                continue;
            }
            self.runs.won(now, sent, won, window, &mut self.out);
            if let Some(group) = self.runs.group_of(won.0) {
                self.groups.won_keys_of(group);
                self.plan.try_soon();
            }
        }
        for &(key, holder) in &reply.not_won {
            self.runs.not_won(key, holder, &mut self.out);
        }
        let unanswered = reply.unanswered(tried);
        if reply.untrusted || !unanswered.is_empty() {
            // A key without an answer may have been taken: verify.
            self.runs.try_back(&unanswered);
            self.plan.owe_verify();
        }
        let retry = now + self.connector.retry_delay(self.opts.retry_interval);
        self.timers.set(Deadline::Retry, retry);
    }

    /// A take's reply (a standby's wait that takes its key, sent as
    /// `query` at `sent`): taken, timed out, crowded, or failed (see `wait`).
    pub(super) fn wait_done(
        &mut self,
        now: Instant,
        (query, sent): (QueryId, Instant),
        (key, chunk): (i64, bool),
        result: Result<Vec<Row>, SessionError>,
    ) {
        let answered = self.wait.answered(key);
        if !self.runs.holding() {
            self.timers
                .set(Deadline::Heartbeat, now + self.opts.heartbeat_interval);
        }
        let rows = match result {
            Ok(rows) => rows,
            Err(error) => {
                // Maybe taken, as after a failed try: verify first.
                self.out.event(Event::WaitFailed { error });
                self.wait.failed();
                self.runs.try_back(&[key]);
                self.plan.owe_verify();
                return self.plan.try_soon();
            }
        };
        let reply = match WaitReply::parse(&rows) {
            Ok(reply @ WaitReply { freed: Some(_), .. }) => reply,
            Ok(WaitReply { freed: None, .. }) => {
                let e = SessionError::other("malformed wait reply: no outcome row");
                return self.lose_session(now, Reason::QueryFailed(e), true);
            }
            Err(e) => return self.lose_session(now, session::malformed(e), true),
        };
        if !self.same_session(now, &reply.session) {
            return;
        }
        self.wait.limit_from(reply.deadlock_timeout_ms);
        if reply.held_here {
            // Another client's lock on this backend (a transaction pooler),
            // as a try finds it (see `try_done`).
            let detail = format!("key {key} is held by this session's own backend");
            return self.refuse(now, Refusal::BackendShared { detail });
        }
        if reply.freed == Some(true) {
            // Taken: the win of a try sent when the take was, with its lock
            // delay (see `wait`, "Taken").
            let (Some(token), Some(backend_pid)) = (reply.token, reply.session.backend_pid) else {
                let e = SessionError::other("malformed wait reply: a take without its token");
                return self.lose_session(now, Reason::QueryFailed(e), true);
            };
            self.out.event(Event::KeyTaken { key });
            // The win counts from the take's send time: the next heartbeat is
            // due an interval after that, as after a try (at once, if the
            // take blocked that long).
            let next = (sent + self.opts.heartbeat_interval).max(now);
            self.timers.set(Deadline::Heartbeat, next);
            let won = TryReply {
                won: vec![(key, token)],
                not_won: Vec::new(),
                untrusted: false,
                session: Some((backend_pid, reply.session.nonce)),
            };
            return self.try_answered(now, (query, sent), vec![key], won, Via::Take);
        }
        self.runs.try_back(&[key]);
        if reply.crowded {
            // Enough standbys wait for the key: this one polls it until
            // its next periodic try (see `wait`, "No herd").
            self.wait.crowded();
            return;
        }
        // Cut short below deadlock_timeout: the same key's wait goes on.
        // Ended at the retry deadline: as good as a try of this key that
        // lost. Not jittered: jitter spreads the polls of replicas started
        // together, and waits on the server do not poll.
        let held_all_along = self.wait.not_freed(answered, chunk) == NotFreed::HeldAllAlong;
        if held_all_along && self.runs.standbys() <= 1 {
            let retry = now + self.opts.retry_interval;
            self.timers.set(Deadline::Retry, retry);
        }
    }
}
