//! The watch session: instant takeover for a locker that holds a lease.
//!
//! A locker that holds a lease cannot wait on its lease session (it must
//! stay free for heartbeats and releases, see `wait`), so without help it
//! learns of a crashed holder's freed key only at its next poll. The watch
//! session is a second connection that does nothing but wait. The rule, in
//! one place:
//!
//! - **When it is open.** While the lease session is ready, the locker holds
//!   at least one lease (a key its heartbeats confirm) and wants another
//!   whose holder its last try saw (`pg_locks` showed the holder's backend
//!   pid), [`Options::server_wait`](crate::Options::server_wait) is
//!   [`ServerWait::IdleAndWatch`](crate::ServerWait::IdleAndWatch), the
//!   locker is not closing, and the lease session's startup options were not
//!   rejected (behind such a pooler a blocked statement would hold one of its
//!   server connections, and waits are off there already). Closed as soon as
//!   that is no longer so. Not "two or more runs": a locker that holds
//!   nothing waits on its lease session already, and a process with one
//!   lease keeps exactly one connection, leading or waiting; the second
//!   connection exists only where the lease session may not wait.
//! - **What it sends.** Only [`Statement::Wait`](crate::Statement::Wait)s,
//!   one at a time, the same statement a standby's lease session sends: a
//!   transaction-level shared lock that ends with its statement, under a
//!   lock timeout cut below the server's `deadlock_timeout` (chunks of at
//!   most [`wait_limit_ms`](crate::server::wait_limit_ms), read from each
//!   reply; the first asks for a retry interval, which the statement cuts
//!   itself). No setup, no `LISTEN`, no try, no unlock: it never acquires and
//!   holds nothing, so it needs no guard of its own, and a wait ended by its
//!   lock timeout is followed at once by the next. Its statements are
//!   `pg_catalog`-qualified like every other; it connects exactly like the
//!   lease session (same host, same startup options).
//! - **Which key: the ring.** A crash frees every key of the crashed
//!   session at once, so one wait per holder session is enough. Among the
//!   holders of the wanted keys (backend pids from the last try of each),
//!   it waits for a key of the holder whose pid comes next after its own
//!   lease session's backend pid, cyclically (the least pid above its own,
//!   else the least), and among that holder's keys for the least. In a
//!   fleet of lockers that all want the same leases, each holder's
//!   predecessor in that ring waits for it: every holder has a watcher, at
//!   one extra connection per locker (the property
//!   `in_a_fleet_every_holder_is_watched` below, over any pids and any
//!   split of the leases). The keys this locker asked for by priority come
//!   first, in turn, until each ask's window ends: the holder's check must
//!   find the watch session waiting for that very key (see `handover`); a
//!   wait in flight is not cut for them (a new connection would be a new
//!   backend, not the one the ask named).
//!   Recomputed before every wait, so it moves on when
//!   that holder has no wanted key left. When the holders change (a try's or
//!   a membership read's answer) while a wait for a holder that is no longer
//!   the next is in flight, the watch session is closed and a new one opened
//!   at once to wait for the next (a wait cannot be moved, and letting it run
//!   to the end of its chunk left the new holder unwatched for up to a
//!   chunk, below the server's `deadlock_timeout`: a kill -9 of a member that
//!   had just taken handed-over leases took 300–600 ms to be noticed). The
//!   old backend's wait ends at its next client connection check (250 ms,
//!   on Linux servers; elsewhere at its lock timeout, below
//!   `deadlock_timeout`); it holds nothing, but meanwhile it is one more
//!   waiter in `pg_locks` (a standby's crowd count may see it).
//! - **Woken** (the key was freed): the lease session tries every wanted
//!   key at once, and a win waits out the lock delay as any win does: the
//!   wake rule of `wait`, unchanged. The watch session waits no more until
//!   that try has answered (its holders are then current).
//! - **No spin.** A wake whose following try wins nothing, and finds the
//!   key still with the holder the wait was for, counts (a spurious wake: a
//!   client holding the key SHARED grants every wait at once); after
//!   [`WAKE_BUDGET`] such wakes in a row it waits no more until the next
//!   periodic try. A key that changed hands (a lease group's hand-off to a
//!   new member, which this member may not even try) was released for real
//!   and does not count: counting it paused the watcher of a member that
//!   handed several keys over, and that member's kill was noticed a retry
//!   interval late.
//! - **Speed, never correctness.** A connection that fails, ends, or times
//!   out ([`Deadline::Watch`]: the attempt, or the wait's lock timeout, which
//!   the server times, stretched by the drift bound, plus the query timeout)
//!   is closed and opened again no sooner than the next
//!   periodic try; a wait that fails otherwise turns it off until the lease
//!   session ends. Meanwhile, or with the option off, the locker polls: a
//!   crashed holder's key moves within a retry interval.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::cx::Cx;
use super::deadline::Deadline;
use super::runs::{RunState, RunTable};
use super::wait::{MIN_WAIT, WAKE_BUDGET};
use crate::io::{Event, QueryId, SessionCommand, SessionError, SessionId};
use crate::sql::{Row, Statement, WaitReply};

/// The watch session and what its waits came to.
#[derive(Debug, Default)]
pub(super) struct Watch {
    conn: Conn,
    /// Closed after a failure: not opened again before the next periodic try.
    resting: bool,
    /// A wait failed otherwise than by its lock timeout: off until the
    /// lease session ends.
    off: bool,
    /// A wait was woken and no try has answered since: its key, and the
    /// holder the wait was for.
    woken: Option<(i64, Option<i64>)>,
    /// Wakes in a row whose following try won nothing (see [`WAKE_BUDGET`]).
    wake_losses: u32,
    /// The longest wait the server's `deadlock_timeout` allows, from the
    /// last reply.
    limit: Option<Duration>,
    /// The attempt or the wait in flight times out.
    timeout_at: Option<Instant>,
    /// The watch session's backend pid, from its last reply.
    pid: Option<i64>,
    /// The backend pid of this locker's last watch session before the
    /// current one: a key the holder handed over to it while it was up is
    /// still this locker's (see `handover`).
    former: Option<i64>,
    /// The keys this locker asked for by priority, until when: waited for
    /// first, in turn (see `handover`).
    preferred: BTreeMap<i64, Instant>,
    /// The last key waited for.
    last: Option<i64>,
}

#[derive(Debug, Default)]
enum Conn {
    #[default]
    Closed,
    Connecting(SessionId),
    Up {
        id: SessionId,
        /// The wait in flight: its query and key.
        inflight: Option<(QueryId, i64)>,
    },
}

impl Watch {
    fn id(&self) -> Option<SessionId> {
        match self.conn {
            Conn::Closed => None,
            Conn::Connecting(id) | Conn::Up { id, .. } => Some(id),
        }
    }

    /// Whether `session` is the watch session.
    pub(super) fn owns(&self, session: SessionId) -> bool {
        self.id() == Some(session)
    }

    /// Whether `query` is the watch session's wait in flight.
    pub(super) fn owns_query(&self, query: QueryId) -> bool {
        matches!(self.conn, Conn::Up { inflight: Some((q, _)), .. } if q == query)
    }

    /// This locker's watch session backends: the current one and the one
    /// before it (a key handed over to either is this locker's).
    pub(super) fn backend_pids(&self) -> impl Iterator<Item = i64> + '_ {
        self.pid.into_iter().chain(self.former)
    }

    /// This locker asked for `key` by priority: the watch session waits for
    /// it first until `until`.
    pub(super) fn prefer(&mut self, key: i64, until: Instant) {
        self.preferred.insert(key, until);
    }

    /// The key to wait for among `wanted` at `now`: a preferred one while
    /// any stands (the next after the last waited for), else the ring's.
    fn key_for(&mut self, now: Instant, own: i64, wanted: &[(i64, i64)]) -> Option<i64> {
        self.preferred.retain(|_, until| *until > now);
        let preferred: Vec<i64> = (self.preferred.keys().copied())
            .filter(|k| wanted.iter().any(|&(w, _)| w == *k))
            .collect();
        let after = self.last;
        let next = (preferred.iter().copied())
            .find(|k| after.is_some_and(|a| *k > a))
            .or_else(|| preferred.first().copied())
            .or_else(|| ring(own, wanted));
        self.last = next;
        next
    }

    /// No watch connection open or asked for.
    pub(super) fn is_closed(&self) -> bool {
        matches!(self.conn, Conn::Closed)
    }

    /// A wait was woken and no try answered since.
    pub(super) fn woken(&self) -> bool {
        self.woken.is_some()
    }

    /// The woken wait's key, while no try has answered since.
    pub(super) fn woken_key(&self) -> Option<i64> {
        self.woken.map(|(key, _)| key)
    }

    fn paused(&self) -> bool {
        self.off || self.resting || self.woken.is_some() || self.wake_losses >= WAKE_BUDGET
    }

    /// The periodic try (not the one after a wake): a rested watch session
    /// may open again, and waiting may start over.
    pub(super) fn periodic_try(&mut self) {
        self.resting = false;
        self.wake_losses = 0;
    }

    /// A try answered; `won`: it won something; `holder`: who holds the
    /// woken wait's key now, as far as this machine knows. A wake whose try
    /// won nothing counts against [`WAKE_BUDGET`] only if the key's holder is
    /// still the one the wait was for (a spurious wake: a client holding the
    /// key SHARED grants every wait at once); a key that changed hands (a
    /// lease group's hand-off to a new member) was released for real.
    pub(super) fn after_try(&mut self, won: bool, holder: Option<i64>) {
        if let Some((_, watched)) = self.woken.take() {
            if won {
                self.wake_losses = 0;
            } else if holder == watched {
                self.wake_losses += 1;
            }
        }
    }

    /// The lease session ended: what was learnt on it starts over.
    pub(super) fn session_down(&mut self) {
        self.off = false;
        self.limit = None;
    }

    /// For [`Deadline::Watch`].
    fn deadline(&self) -> Option<Instant> {
        self.timeout_at
    }
}

/// Whether a wait for `key` watches the holder the ring names next: `key`
/// is held by the holder of the ring's key (a crash frees every key of it).
fn watches_next(key: i64, own: i64, wanted: &[(i64, i64)]) -> bool {
    let holder = |k: i64| wanted.iter().find(|&&(w, _)| w == k).map(|&(_, h)| h);
    match ring(own, wanted) {
        Some(next) => holder(next) == holder(key),
        None => true,
    }
}

/// The key to wait for among `wanted` (key, holder pid), by the ring rule
/// above: a key of the holder whose pid comes next after `own`, cyclically.
fn ring(own: i64, wanted: &[(i64, i64)]) -> Option<i64> {
    let holders = || wanted.iter().map(|&(_, h)| h);
    let next = holders()
        .filter(|&h| h > own)
        .min()
        .or_else(|| holders().min())?;
    (wanted.iter())
        .filter(|&&(_, h)| h == next)
        .map(|&(k, _)| k)
        .min()
}

/// What the watch rule reads of the lease session; the dispatch fills it in
/// (`Machine::watch_cx`).
#[derive(Debug, Clone, Copy)]
pub(super) struct LeaseSide {
    /// The lease session's backend pid, once it is ready.
    pub(super) ready_pid: Option<i64>,
    /// The locker is open (not closing), a candidate (not an observer), and
    /// the lease session's startup options were not rejected.
    pub(super) may_watch: bool,
}

impl Watch {
    /// The lease session's backend pid and the wanted keys with their
    /// holders, while the watch session is called for (see above).
    fn wanted(cx: &Cx<'_>, lease: LeaseSide) -> Option<(i64, Vec<(i64, i64)>)> {
        if !cx.opts.server_wait.watch() || !lease.may_watch {
            return None;
        }
        if !cx.runs.holding() {
            return None;
        }
        let backend_pid = lease.ready_pid?;
        let wanted: Vec<(i64, i64)> = (cx.runs.iter())
            .filter_map(|(_, r)| match &r.state {
                RunState::Standby(s) => Some((r.lease.key(), s.holder.flatten()?)),
                _ => None,
            })
            .collect();
        (!wanted.is_empty()).then_some((backend_pid, wanted))
    }

    /// Before the lease session acts: a timed-out watch session is closed.
    pub(super) fn due(&mut self, cx: &mut Cx<'_>, now: Instant) {
        if self.timeout_at.is_some_and(|t| t <= now) {
            let error = SessionError::other("the watch session timed out");
            self.lost(cx, Some(error), true);
        }
        cx.timers.put(Deadline::Watch, self.deadline());
    }

    /// After the lease session acted: opens, closes or sends on the watch
    /// session as the rule says.
    pub(super) fn step(&mut self, cx: &mut Cx<'_>, now: Instant, lease: LeaseSide) {
        let wanted = Watch::wanted(cx, lease);
        match (&self.conn, wanted) {
            (Conn::Closed, None) => {}
            (_, None) => self.close(cx),
            (Conn::Closed, Some(_)) if self.paused() => {}
            (Conn::Closed, Some(_)) => self.open(cx, now),
            (Conn::Up { inflight: None, .. }, Some((own, wanted))) if !self.paused() => {
                self.send(cx, now, own, &wanted)
            }
            (
                Conn::Up {
                    inflight: Some((_, key)),
                    ..
                },
                Some((own, wanted)),
            ) if !self.paused() && !watches_next(*key, own, &wanted) => {
                self.close(cx);
                self.open(cx, now);
            }
            _ => {}
        }
        cx.timers.put(Deadline::Watch, self.deadline());
    }

    fn open(&mut self, cx: &mut Cx<'_>, now: Instant) {
        let session = cx.connector.next_session();
        cx.out.session(SessionCommand::OpenWatch { session });
        self.conn = Conn::Connecting(session);
        self.timeout_at = Some(now + cx.opts.query_timeout);
    }

    fn send(&mut self, cx: &mut Cx<'_>, now: Instant, own: i64, wanted: &[(i64, i64)]) {
        let Conn::Up { id, .. } = self.conn else {
            return;
        };
        let retry = cx.opts.retry_interval;
        if self.limit.is_some_and(|l| l.min(retry) < MIN_WAIT) {
            // Under so short a deadlock_timeout the lease session polls.
            self.off = true;
            return self.close(cx);
        }
        let Some(key) = self.key_for(now, own, wanted) else {
            return;
        };
        // A key asked for by priority is waited for until its ask ends (the
        // holder's checks must find the wait, see `handover`); any other for
        // a retry interval; both below the server's deadlock_timeout.
        let until = (self.preferred.get(&key)).map(|u| u.saturating_duration_since(now));
        let wait = until.map_or(retry, |u| u.max(retry));
        let timeout = self.limit.map_or(wait, |l| l.min(wait));
        if timeout < MIN_WAIT {
            return;
        }
        let query = cx.connector.next_watch_query();
        // No crowd limit: a holder's watcher must wait, whoever else waits
        // (the ring gives every holder one).
        let statement = Statement::Wait {
            key,
            timeout_ms: timeout.as_millis().max(1) as u64,
            crowd: None,
            watch_of: Some(own),
        };
        #[cfg(feature = "sim")] // The broken variant: a watch session that tries.
        let statement = match cx.knobs.mutation {
            Some(super::knobs::Mutation::WatchTries) => Statement::TryLock {
                keys: vec![key],
                backend_pid: own,
                nonce: 0,
            },
            _ => statement,
        };
        cx.out.session(SessionCommand::WatchQuery {
            session: id,
            query,
            statement,
        });
        self.conn = Conn::Up {
            id,
            inflight: Some((query, key)),
        };
        // The lock timeout runs on the server's clock; this one may run
        // faster by up to the drift bound (as for a take, `Machine::send`).
        let timeout = timeout.mul_f64(1.0 + cx.opts.drift_bound());
        self.timeout_at = Some(now + timeout + cx.opts.query_timeout);
    }

    /// A try answered after the lease session acted on a wake (`won`: it
    /// won something; `seen`: the woken key's holder as the try read it, if
    /// it tried that key): the no-spin count of [`Watch::after_try`], with
    /// the holder the runs last saw when the try did not read it.
    pub(super) fn try_answered(&mut self, runs: &RunTable, won: bool, seen: Option<Option<i64>>) {
        let holder = self
            .woken_key()
            .and_then(|key| seen.or_else(|| runs.standby_of(key).and_then(|(_, holder)| holder)));
        self.after_try(won, holder.flatten());
    }

    /// Closes the watch session because it is not called for.
    fn close(&mut self, cx: &mut Cx<'_>) {
        if let Some(session) = self.id() {
            cx.out.session(SessionCommand::CloseWatch { session });
        }
        self.conn = Conn::Closed;
        self.timeout_at = None;
        self.woken = None;
        self.former = self.pid.take().or(self.former);
    }

    /// The watch session failed, ended or timed out: closed, and opened
    /// again no sooner than the next periodic try.
    /// With `close`, the machine closes it (the driver did not see it end).
    fn lost(&mut self, cx: &mut Cx<'_>, error: Option<SessionError>, close: bool) {
        if let Some(session) = self.id() {
            cx.out.event(Event::WatchSessionLost { session, error });
        }
        if close {
            self.close(cx);
        }
        self.conn = Conn::Closed;
        self.timeout_at = None;
        self.woken = None;
        self.former = self.pid.take().or(self.former);
        self.resting = true;
    }

    /// Input: the watch session opened.
    pub(super) fn opened(&mut self, session: SessionId) {
        if matches!(self.conn, Conn::Connecting(id) if id == session) {
            self.conn = Conn::Up {
                id: session,
                inflight: None,
            };
            self.timeout_at = None;
        }
    }

    /// Input: the watch session failed to open or ended.
    pub(super) fn ended(
        &mut self,
        cx: &mut Cx<'_>,
        session: SessionId,
        error: Option<SessionError>,
    ) {
        if self.owns(session) {
            self.lost(cx, error, false);
        }
    }

    /// Input: the reply of the watch session's wait.
    pub(super) fn reply(
        &mut self,
        cx: &mut Cx<'_>,
        now: Instant,
        query: QueryId,
        result: Result<Vec<Row>, SessionError>,
    ) {
        #[cfg(not(feature = "sim"))] // Read only by a broken variant.
        let _ = now;
        let Conn::Up {
            id,
            inflight: Some((q, key)),
        } = self.conn
        else {
            return;
        };
        if q != query {
            return;
        }
        self.conn = Conn::Up { id, inflight: None };
        self.timeout_at = None;
        // The connection failed under the wait (the backend terminated or
        // cancelled, the server shutting down: its FATAL or cancel reaches
        // the statement in flight before the end of the connection is seen):
        // closed and opened again at the next periodic try, not turned off.
        if let Err(error) = &result {
            if connection_lost(error) {
                return self.lost(cx, Some(error.clone()), true);
            }
        }
        let reply = result.and_then(|rows| {
            WaitReply::parse(&rows).map_err(|e| SessionError::other(e.to_string()))
        });
        if let Ok(WaitReply { session, .. }) = &reply {
            self.pid = session.backend_pid.or(self.pid);
        }
        let (freed, deadlock_timeout_ms) = match reply {
            Ok(WaitReply {
                freed: Some(freed),
                deadlock_timeout_ms,
                ..
            }) => (freed, deadlock_timeout_ms),
            Ok(_) | Err(_) => {
                let error = match reply {
                    Err(error) => error,
                    Ok(_) => SessionError::other("malformed wait reply: no outcome row"),
                };
                cx.out.event(Event::WaitFailed { error });
                self.off = true;
                return self.close(cx);
            }
        };
        if let Some(d) = deadlock_timeout_ms {
            let limit = crate::sql::wait_limit_ms(d).max(0) as u64;
            self.limit = Some(Duration::from_millis(limit));
        }
        if !freed {
            return;
        }
        cx.out.event(Event::KeyFreed { key });
        let watched = cx.runs.standby_of(key).and_then(|(_, h)| h).flatten();
        self.woken = Some((key, watched));
        #[cfg(feature = "sim")] // The broken variant: a watcher that acquires.
        if cx.knobs.mutation == Some(super::knobs::Mutation::WatchAcquires) {
            let token = i64::MAX / 2 + cx.connector.peek_query() as i64;
            let window = cx.opts.validity_window();
            return cx.runs.wake_won(now, (key, token), window, cx.out);
        }
        cx.plan.try_soon();
    }
}

/// Whether a wait's error says the connection or the backend went away
/// (no SQLSTATE: I/O; class 08, a connection exception; class 57, operator
/// intervention: terminated, cancelled, shutting down), rather than a wait
/// that will fail the same way again (which turns the watch session off).
fn connection_lost(error: &SessionError) -> bool {
    match error.code.as_deref() {
        None => true,
        Some(code) => code.starts_with("08") || code.starts_with("57"),
    }
}

#[cfg(test)]
mod tests {
    use super::ring;

    #[test]
    fn the_ring_waits_for_the_next_holder_after_its_own_pid() {
        let wanted = [(10, 300), (11, 100), (12, 300), (13, 200)];
        assert_eq!(ring(150, &wanted), Some(13));
        assert_eq!(ring(200, &wanted), Some(10));
        // Past the largest pid: around to the least.
        assert_eq!(ring(400, &wanted), Some(11));
        assert_eq!(ring(50, &wanted), Some(11));
        assert_eq!(ring(1, &[]), None);
    }

    proptest::proptest! {
        #![proptest_config(crate::proptest_config())]

        /// Property: in a fleet of lockers that each hold some of the leases
        /// and want every other (any backend pids, any split), every holder
        /// is watched by at least one other holder, at one watch session each.
        #[test]
        fn in_a_fleet_every_holder_is_watched(
            pids in proptest::collection::btree_set(1..100_000i64, 2..12),
            split in proptest::collection::vec(0..64usize, 1..40),
        ) {
            let pids: Vec<i64> = pids.into_iter().collect();
            // Lease `k` is held by the locker `split[k] % n`; every locker
            // that holds a lease wants all the leases it does not hold.
            let holder = |k: usize| pids[split[k] % pids.len()];
            let holders: std::collections::BTreeSet<i64> = (0..split.len()).map(holder).collect();
            let mut watched = std::collections::BTreeSet::new();
            for &own in &holders {
                let wanted: Vec<(i64, i64)> = (0..split.len())
                    .filter(|&k| holder(k) != own)
                    .map(|k| (k as i64, holder(k)))
                    .collect();
                if let Some(key) = ring(own, &wanted) {
                    watched.insert(holder(key as usize));
                }
            }
            if holders.len() > 1 {
                proptest::prop_assert_eq!(watched, holders);
            }
        }
    }
}
