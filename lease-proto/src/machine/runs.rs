//! The run table: every run of the machine, by id and by key, and the keys
//! the session holds without a run that holds them. It owns the key-index
//! invariant (each run's key maps back to it, and nothing else is in the
//! index) and every transition of a run's state; the machine's dispatch
//! calls it with what happened and it says, through [`Outputs`], what the
//! run futures and the logs must hear.
//!
//! A run's states are named as their public [`LeaseState`](super::LeaseState)
//! counterparts; where one public state covers several, the internal ones are
//! its sub-states.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::outputs::Outputs;
use crate::io::{Event, JobExit, Outcome, Reason, RunCommand, RunId};
use crate::key::LeaseId;

#[derive(Debug)]
pub(super) struct Run {
    pub(super) lease: LeaseId,
    pub(super) state: RunState,
}

/// How many hand-overs to it a standby with a priority has one holder (one
/// backend pid) announce before it asks that holder no more: one that
/// cannot take the key in the reservation window (a slow link) interrupts
/// the holder's job a bounded number of times, not forever.
pub const MAX_ASKS: u32 = 3;

/// The longest a standby with a priority waits before it asks a holder
/// again, in validity windows: it waits one, then twice as long after each
/// ask, up to this many.
pub const ASK_AGAIN_CAP: u32 = 4;

/// What one run is doing.
#[derive(Debug)]
pub(super) enum RunState {
    /// Not held, no job.
    Standby(Standby),
    /// Held; the job runs.
    Leading(Held),
    /// The job was cancelled; waiting for it to return.
    Stopping(Stopping),
    /// The job returned; the key is held until the unlock answers.
    Releasing {
        /// What the run finishes with once released; `None`: it was handed
        /// over to another session, and stands by again.
        outcome: Option<Outcome>,
        release: Release,
    },
}

impl RunState {
    /// In standby and not in the try in flight: the next try includes it.
    fn is_waiting(&self) -> bool {
        matches!(
            self,
            RunState::Standby(Standby {
                step: StandbyStep::Waiting,
                ..
            })
        )
    }

    /// The key's confirmation, while the session holds it for this run and
    /// its job has not returned.
    pub(super) fn held(&self) -> Option<&Held> {
        match self {
            RunState::Leading(held) | RunState::Stopping(Stopping::Held { held, .. }) => Some(held),
            _ => None,
        }
    }

    /// Stopping or releasing to finish (not to stand by again after a
    /// group's hand-off): the run wants its key no more.
    fn finishing(&self) -> bool {
        matches!(
            self,
            RunState::Stopping(Stopping::Held {
                outcome: Some(_),
                ..
            }) | RunState::Stopping(Stopping::Lost { outcome: Some(_) })
                | RunState::Releasing {
                    outcome: Some(_),
                    ..
                }
        )
    }

    fn held_mut(&mut self) -> Option<&mut Held> {
        match self {
            RunState::Leading(held) | RunState::Stopping(Stopping::Held { held, .. }) => Some(held),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub(super) struct Standby {
    step: StandbyStep,
    /// The holder the last answered try of this standby reported (`None`:
    /// no try answered yet; `Some(None)`: `pg_locks` did not show it).
    pub(super) holder: Option<Option<i64>>,
    /// When a handover notification from that holder said it released the
    /// key gracefully, and the release's moment on the server's clock (in
    /// fencing-token units) if the payload had it, and the backend the
    /// server granted the key to at the release if the payload named one;
    /// cleared when a try finds the key held again.
    graceful: Option<(Instant, Option<i64>, Option<i64>)>,
    /// The holder this standby last asked to hand the key over (its
    /// priority, see `Machine::preference_requested`), when, how many
    /// times it asked that holder, and how many hand-overs to this locker
    /// that holder announced.
    asked: Option<(i64, Instant, u32, u32)>,
}

impl Standby {
    fn new() -> Standby {
        Standby {
            step: StandbyStep::Waiting,
            holder: None,
            graceful: None,
            asked: None,
        }
    }

    /// Whether a win with fencing token `token` by a try (or take) sent at
    /// `sent`, on backend `me`, follows a graceful release: the notification
    /// came at most `lock_delay` before the statement was sent, or while it
    /// was in flight; the server granted the key at most `lock_delay` after
    /// the release on its own clock (a notification delivered late, after
    /// another holder took the key and lost it, is older than that; one
    /// without the release's moment never counts); and the release granted
    /// the key to nobody else. A take's win needs the release to name this
    /// backend as its grantee: its session read no notification while it
    /// waited, so one that came in the meantime proves nothing by its timing
    /// (another take first in the queue may have held the key for a moment
    /// and lost it to a terminate). `grantee_ignored`: the broken variant
    /// that skips that last check.
    fn graceful_for(
        &self,
        (sent, token): (Instant, i64),
        me: Option<i64>,
        lock_delay: Duration,
        grantee_ignored: bool,
    ) -> bool {
        let delay_us = lock_delay.as_micros() as i64;
        let took = self.step == StandbyStep::Taking;
        (self.graceful).is_some_and(|(seen, released, grantee)| {
            let granted_here = match grantee {
                Some(g) => Some(g) == me,
                None => !took,
            };
            seen + lock_delay >= sent
                && released.is_some_and(|r| token >= r && token - r <= delay_us)
                && (granted_here || grantee_ignored)
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StandbyStep {
    /// The next try includes this key.
    Waiting,
    /// In the try in flight.
    Trying,
    /// In the take in flight (a wait that takes the key: see `wait`).
    Taking,
}

impl StandbyStep {
    /// In the try or the take in flight: a win of the key is this run's.
    fn in_flight(self) -> bool {
        matches!(self, StandbyStep::Trying | StandbyStep::Taking)
    }
}

/// A key the session holds for a run.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) token: i64,
    /// The reply's arrival.
    pub(super) since: Instant,
    /// Send time of the last statement that confirmed the key.
    pub(super) confirmed: Instant,
}

#[derive(Debug)]
pub(super) enum Stopping {
    /// Shutdown, close, refusal or a group's hand-off while leading: the
    /// key is still held (and confirmed by heartbeats, and timed by its
    /// validity) until the job returns; then it is released and the run
    /// finishes with `outcome`, or stands by again if there is none (handed
    /// over).
    Held {
        held: Held,
        outcome: Option<Outcome>,
    },
    /// The lease was lost: the key is not held. When the job returns the run
    /// finishes with `outcome`, or stands by again if there is none.
    Lost { outcome: Option<Outcome> },
}

/// The unlock of a releasing run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    /// Goes into the next release statement.
    Queued,
    /// In the release statement in flight.
    Sent,
}

/// Every run, and the keys to unlock that no run holds.
#[derive(Debug, Default)]
pub(super) struct RunTable {
    runs: BTreeMap<RunId, Run>,
    /// Each run's key, to its run.
    keys: BTreeMap<i64, RunId>,
    next_run: u64,
    /// Keys to unlock at the next release: held without a run that holds them.
    orphans: BTreeSet<i64>,
    /// Keys found held whose run lost them (stopping): unlocked once its job
    /// returned.
    held_lost: BTreeSet<i64>,
    /// Keys handed over to a named backend: key → (that backend's pid,
    /// until when no other tries it, the request's priority: `u32::MAX` for
    /// a `to` request, since when; see `handover`). A holder's own, from the
    /// check that confirmed the request; a standby's, from the holder's
    /// announcement or release.
    reserved: BTreeMap<i64, (i64, Instant, u32, Instant)>,
}

impl RunTable {
    // ---- membership ----------------------------------------------------

    pub(super) fn len(&self) -> usize {
        self.runs.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub(super) fn has_key(&self, key: i64) -> bool {
        self.keys.contains_key(&key)
    }

    /// The id of the next run.
    pub(super) fn next_id(&mut self) -> RunId {
        let id = RunId(self.next_run);
        self.next_run += 1;
        id
    }

    /// A new run of `lease`, in standby.
    pub(super) fn insert(&mut self, id: RunId, lease: LeaseId) {
        self.keys.insert(lease.key(), id);
        self.runs.insert(
            id,
            Run {
                lease,
                state: RunState::Standby(Standby::new()),
            },
        );
        self.check();
    }

    pub(super) fn ids(&self) -> Vec<RunId> {
        self.runs.keys().copied().collect()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&RunId, &Run)> {
        self.runs.iter()
    }

    pub(super) fn get(&self, id: RunId) -> Option<&Run> {
        self.runs.get(&id)
    }

    fn by_key(&self, key: i64) -> Option<&Run> {
        self.keys.get(&key).and_then(|id| self.runs.get(id))
    }

    fn by_key_mut(&mut self, key: i64) -> Option<(RunId, &mut Run)> {
        let id = *self.keys.get(&key)?;
        self.runs.get_mut(&id).map(|r| (id, r))
    }

    /// The key-index invariant.
    fn check(&self) {
        debug_assert_eq!(self.runs.len(), self.keys.len(), "one key per run");
        debug_assert!(
            (self.keys.iter())
                .all(|(k, id)| self.runs.get(id).is_some_and(|r| r.lease.key() == *k)),
            "every key maps to the run of that key"
        );
    }

    // ---- questions -----------------------------------------------------

    /// Whether the session holds a lease whose validity heartbeats renew.
    pub(super) fn holding(&self) -> bool {
        self.runs.values().any(|r| r.state.held().is_some())
    }

    /// Whether a standby is not in the try in flight: the next try has work.
    pub(super) fn any_waiting(&self) -> bool {
        self.runs.values().any(|r| r.state.is_waiting())
    }

    /// Whether a job has not returned: leading, or cancelled and stopping.
    pub(super) fn any_job_running(&self) -> bool {
        self.runs
            .values()
            .any(|r| matches!(r.state, RunState::Leading(_) | RunState::Stopping(_)))
    }

    /// Standbys, in the try in flight or not.
    pub(super) fn standbys(&self) -> usize {
        (self.runs.values())
            .filter(|r| matches!(r.state, RunState::Standby(_)))
            .count()
    }

    /// Whether any run needs the session: a standby (while the machine takes
    /// new work, `open`), a leader, a release, or a lost run whose key a
    /// verify found held (closing the session would free the key while the
    /// cancelled job still runs; it is unlocked once the job returned).
    pub(super) fn need_session(&self, open: bool) -> bool {
        self.runs.values().any(|r| match &r.state {
            RunState::Stopping(Stopping::Lost { .. }) => self.held_lost.contains(&r.lease.key()),
            RunState::Standby(s) if s.step == StandbyStep::Waiting => open,
            RunState::Standby(_)
            | RunState::Leading(_)
            | RunState::Stopping(Stopping::Held { .. })
            | RunState::Releasing { .. } => true,
        })
    }

    /// The earliest end of validity of a key held for a job that has not
    /// returned: its confirmation plus the validity `window`.
    pub(super) fn earliest_validity_end(&self, window: Duration) -> Option<Instant> {
        let confirmed = self.runs.values().filter_map(|r| r.state.held());
        let earliest = confirmed.map(|held| held.confirmed).min()?;
        Some(earliest + window)
    }

    /// The keys a wait may be for, if the session holds and owes nothing:
    /// every run a standby, no key to unlock; the keys of the standbys not in
    /// the try in flight whose last try answered.
    /// `me`: this locker's backends (a key reserved for another is no
    /// candidate).
    pub(super) fn wait_candidates(&self, me: &[i64]) -> Option<Vec<i64>> {
        if !self.orphans.is_empty() || !self.held_lost.is_empty() {
            return None;
        }
        let mut wanted = Vec::new();
        for r in self.runs.values() {
            match &r.state {
                RunState::Standby(s) if s.step == StandbyStep::Waiting && s.holder.is_some() => {
                    let key = r.lease.key();
                    let other =
                        (self.reserved.get(&key)).is_some_and(|(pid, ..)| !me.contains(pid));
                    if !other {
                        wanted.push(key)
                    }
                }
                RunState::Standby(_) => {}
                // Holding or owing something: the session stays free.
                _ => return None,
            }
        }
        Some(wanted)
    }

    /// Whether a standby of another key than `key` is not in the try in flight.
    pub(super) fn other_waiting(&self, key: i64) -> bool {
        (self.runs.values()).any(|r| r.lease.key() != key && r.state.is_waiting())
    }

    /// For a standby of `key`: whether it is not in the try in flight, and the
    /// holder its last try saw. `None` if `key` is no run's, or its run is not
    /// a standby (a standby's flag `false` then too).
    pub(super) fn standby_of(&self, key: i64) -> Option<(bool, Option<Option<i64>>)> {
        let run = self.by_key(key)?;
        Some(match &run.state {
            RunState::Standby(s) => (s.step == StandbyStep::Waiting, Some(s.holder.flatten())),
            _ => (false, None),
        })
    }

    /// Whether `key` is to be unlocked without a run.
    pub(super) fn is_orphan(&self, key: i64) -> bool {
        self.orphans.contains(&key)
    }

    pub(super) fn has_orphans(&self) -> bool {
        !self.orphans.is_empty()
    }

    // ---- the session's statements ----------------------------------------

    /// The keys of the next try: every standby not in the try in flight
    /// joins it.
    /// `may`: whether a run's lease may be tried now (a group's share).
    /// A key reserved for another backend than this locker's (`me`) is left
    /// out until its reservation ends.
    pub(super) fn take_try(
        &mut self,
        now: Instant,
        me: &[i64],
        may: impl Fn(&LeaseId) -> bool,
    ) -> Vec<i64> {
        self.reserved.retain(|_, (_, until, ..)| *until > now);
        let reserved = &self.reserved;
        let mut keys = Vec::new();
        for r in self.runs.values_mut() {
            let key = r.lease.key();
            if reserved
                .get(&key)
                .is_some_and(|(pid, ..)| !me.contains(pid))
            {
                continue;
            }
            if let RunState::Standby(standby) = &mut r.state {
                if standby.step == StandbyStep::Waiting && may(&r.lease) {
                    standby.step = StandbyStep::Trying;
                    keys.push(key);
                }
            }
        }
        keys
    }

    /// The standby of `key` goes into a take (a wait that takes the key,
    /// see `wait`, "Taken") as into a try. Returns whether it did: the key's
    /// run is a standby not in a try.
    pub(super) fn take_wait(&mut self, key: i64) -> bool {
        let Some((_, r)) = self.by_key_mut(key) else {
            return false;
        };
        match &mut r.state {
            RunState::Standby(standby) if standby.step == StandbyStep::Waiting => {
                standby.step = StandbyStep::Taking;
                true
            }
            _ => false,
        }
    }

    /// Whether `key` is reserved at `now` for one of this locker's backends
    /// `me` (its lease session's, its watch session's: a hand-over to it).
    pub(super) fn reserved_for(&self, key: i64, me: &[i64], now: Instant) -> bool {
        (self.reserved.get(&key)).is_some_and(|(pid, until, ..)| *until > now && me.contains(pid))
    }

    /// The backend `key` is reserved for at `now`, if it is none of this
    /// locker's backends `me` (see `handover`).
    pub(super) fn reserved_for_other(&self, key: i64, me: &[i64], now: Instant) -> Option<i64> {
        (self.reserved.get(&key))
            .filter(|(pid, until, ..)| *until > now && !me.contains(pid))
            .map(|(pid, ..)| *pid)
    }

    /// A win of `key` declined (it is reserved for another backend): its
    /// standby stands by again, and the key is unlocked at the next release
    /// (whose notification tells the backend it is reserved for); the
    /// reservation runs on `window` from now.
    pub(super) fn decline(&mut self, key: i64, now: Instant, window: Duration) {
        self.try_back(&[key]);
        self.orphans.insert(key);
        if let Some((_, until, ..)) = self.reserved.get_mut(&key) {
            *until = (*until).max(now + window);
        }
    }

    /// The keys of an observer's read of their holders: every standby's
    /// (see `Machine::observes`).
    pub(super) fn take_look(&self) -> Vec<i64> {
        (self.runs.values())
            .filter(|r| matches!(r.state, RunState::Standby(_)))
            .map(|r| r.lease.key())
            .collect()
    }

    /// The keys of the next release: every orphan, then every releasing run
    /// not in a release yet.
    /// A key reserved for another backend (a hand-over asked for) stays
    /// reserved for `window` from its release.
    pub(super) fn take_release(&mut self, now: Instant, window: Duration) -> Vec<i64> {
        let mut release: Vec<i64> = std::mem::take(&mut self.orphans).into_iter().collect();
        for r in self.runs.values_mut() {
            if let RunState::Releasing { release: step, .. } = &mut r.state {
                if *step == Release::Queued {
                    *step = Release::Sent;
                    let key = r.lease.key();
                    if let Some((_, until, ..)) = self.reserved.get_mut(&key) {
                        *until = (*until).max(now + window);
                    }
                    release.push(key);
                }
            }
        }
        release
    }

    /// A try won `key` with `token`; the try was sent at `sent`: the run's
    /// job starts, valid for `window` from `sent`. Won for a run that is gone
    /// (shut down or closed while trying): the key is unlocked.
    pub(super) fn won(
        &mut self,
        now: Instant,
        sent: Instant,
        (key, token): (i64, i64),
        window: Duration,
        out: &mut Outputs,
    ) {
        let Some((id, r)) = self
            .by_key_mut(key)
            .filter(|(_, r)| matches!(&r.state, RunState::Standby(s) if s.step.in_flight()))
        else {
            self.orphans.insert(key);
            return;
        };
        r.state = RunState::Leading(Held {
            token,
            since: now,
            confirmed: sent,
        });
        let lease = r.lease.clone();
        out.event(Event::Acquired {
            run: id,
            lease: lease.clone(),
            token,
        });
        out.run(RunCommand::StartJob {
            run: id,
            lease,
            token,
            valid_until: sent + window,
        });
    }

    /// The broken variant [`Mutation::WatchAcquires`](crate::options::Mutation):
    /// a wake taken as the win of `key`, with `token`.
    #[cfg(feature = "sim")]
    pub(super) fn wake_won(
        &mut self,
        now: Instant,
        (key, token): (i64, i64),
        window: Duration,
        out: &mut Outputs,
    ) {
        let Some((_, r)) = self.by_key_mut(key) else {
            return;
        };
        if let RunState::Standby(s) = &mut r.state {
            s.step = StandbyStep::Trying;
            self.won(now, now, (key, token), window, out);
        }
    }

    /// Whether the win of any of `won` by the try sent at `sent` must wait
    /// out the lock delay before its job starts: its run is a standby in
    /// that try and no graceful release of its key came (see
    /// [`Standby::graceful_for`]). A key no standby tried is unlocked, not
    /// started.
    pub(super) fn any_win_needs_lock_delay(
        &self,
        won: &[(i64, i64)],
        (sent, me): (Instant, Option<i64>),
        lock_delay: Duration,
        grantee_ignored: bool,
    ) -> bool {
        won.iter().any(|(key, token)| {
            matches!(
                self.by_key(*key).map(|r| &r.state),
                Some(RunState::Standby(s)) if s.step.in_flight()
                    && !s.graceful_for((sent, *token), me, lock_delay, grantee_ignored)
            )
        })
    }

    /// `key` is handed over to backend `pid` at `now` with `priority`
    /// (`u32::MAX`: by name): no other backend's run tries it before
    /// `until` (see `handover`). Replaces any reservation of `key`. Returns
    /// whether this table has a run of `key`.
    pub(super) fn reserve(
        &mut self,
        key: i64,
        pid: i64,
        (now, until): (Instant, Instant),
        priority: u32,
    ) -> bool {
        if !self.keys.contains_key(&key) {
            return false;
        }
        self.reserved.insert(key, (pid, until, priority, now));
        true
    }

    /// `key` is reserved for nobody.
    pub(super) fn unreserve(&mut self, key: i64) {
        self.reserved.remove(&key);
    }

    /// The reservations in force at `now` of `keys` (a release's): `(key,
    /// backend, 1 if made less than `recent` ago else 0)`.
    pub(super) fn reservations(
        &self,
        keys: &[i64],
        now: Instant,
        recent: Duration,
    ) -> Vec<(i64, i64, i64)> {
        (keys.iter())
            .filter_map(|k| {
                let &(pid, until, _, since) = self.reserved.get(k)?;
                let fresh = i64::from(now.saturating_duration_since(since) < recent);
                (until > now).then_some((*k, pid, fresh))
            })
            .collect()
    }

    /// Whether the run of `key` is in a lease group (`None`: no run).
    pub(super) fn in_group(&self, key: i64) -> Option<bool> {
        Some(self.by_key(key)?.lease.group().is_some())
    }

    /// A standby with a priority: the key of the first standby not in the
    /// try in flight and in no group whose last answered try saw a holder
    /// (not `me`) it has not asked yet, or asked `again` ago or longer,
    /// doubled for every time it asked that holder before up to
    /// [`ASK_AGAIN_CAP`] times `again`, until that holder has announced
    /// [`MAX_ASKS`] hand-overs to this locker (one that cannot take the key
    /// in the reservation window, a slow link, interrupts the holder's job
    /// a bounded number of times, not forever; an ask the holder refused,
    /// not finding the standby waiting, interrupts nothing and does not
    /// count); it counts as asked at `now` (see
    /// `Machine::preference_requested`).
    pub(super) fn take_preference(
        &mut self,
        now: Instant,
        me: Option<i64>,
        again: Duration,
    ) -> Option<i64> {
        self.runs.values_mut().find_map(|r| {
            let RunState::Standby(s) = &mut r.state else {
                return None;
            };
            let holder = s.holder.flatten().filter(|&h| Some(h) != me)?;
            let (times, announced) = match s.asked {
                Some((pid, _, times, announced)) if pid == holder => (times, announced),
                _ => (0, 0),
            };
            let asked = (s.asked).is_some_and(|(pid, at, times, announced)| {
                let wait = again * (1 << (times - 1).min(ASK_AGAIN_CAP.ilog2()));
                pid == holder && (announced >= MAX_ASKS || now < at + wait)
            });
            if s.step != StandbyStep::Waiting || r.lease.group().is_some() || asked {
                return None;
            }
            s.asked = Some((holder, now, times + 1, announced));
            Some(r.lease.key())
        })
    }

    /// The holder `holder` announced a hand-over of `key` to this locker
    /// (see [`RunTable::take_preference`]).
    pub(super) fn hand_over_announced(&mut self, key: i64, holder: i64) {
        if let Some((_, r)) = self.by_key_mut(key) {
            if let RunState::Standby(s) = &mut r.state {
                if let Some((pid, _, _, announced)) = &mut s.asked {
                    if *pid == holder {
                        *announced += 1;
                    }
                }
            }
        }
    }

    /// A handover notification for `key` from the holder its standby's last
    /// try saw, at `now`: that holder released it gracefully.
    pub(super) fn released_gracefully(
        &mut self,
        key: i64,
        now: Instant,
        (at, grantee): (Option<i64>, Option<i64>),
    ) {
        if let Some((_, r)) = self.by_key_mut(key) {
            if let RunState::Standby(standby) = &mut r.state {
                standby.graceful = Some((now, at, grantee));
            }
        }
    }

    /// A try did not win `key`; `holder` is who holds it, if `pg_locks` said.
    pub(super) fn not_won(&mut self, key: i64, holder: Option<i64>, out: &mut Outputs) {
        let Some((id, r)) = self.by_key_mut(key) else {
            return;
        };
        if let RunState::Standby(standby) = &mut r.state {
            if standby.step.in_flight() {
                standby.step = StandbyStep::Waiting;
                standby.graceful = None;
                if standby.holder != Some(holder) {
                    standby.holder = Some(holder);
                    let lease = r.lease.clone();
                    out.event(Event::StandingBy {
                        run: id,
                        lease,
                        holder_pid: holder,
                    });
                }
            }
        }
    }

    /// A lease group's membership read saw `holder` hold `key` (`None`:
    /// free): a standby not in the try in flight records it, as a try that
    /// lost would (the watch session waits for a holder it saw, a handover
    /// notification counts from it).
    pub(super) fn holder_seen(&mut self, key: i64, holder: Option<i64>, out: &mut Outputs) {
        let Some((id, r)) = self.by_key_mut(key) else {
            return;
        };
        if let RunState::Standby(standby) = &mut r.state {
            if standby.step == StandbyStep::Waiting && standby.holder != Some(holder) {
                standby.holder = Some(holder);
                standby.graceful = None;
                if holder.is_some() {
                    let lease = r.lease.clone();
                    out.event(Event::StandingBy {
                        run: id,
                        lease,
                        holder_pid: holder,
                    });
                }
            }
        }
    }

    /// Runs whose try (or take) got no usable answer or won nothing go back
    /// to waiting; a graceful release they heard of counts no more (a later
    /// win follows another release, or none).
    pub(super) fn try_back(&mut self, keys: &[i64]) {
        for &key in keys {
            if let Some((_, r)) = self.by_key_mut(key) {
                if let RunState::Standby(standby) = &mut r.state {
                    standby.step = StandbyStep::Waiting;
                    standby.graceful = None;
                }
            }
        }
    }

    /// The steady heartbeat sent at `sent` answered: every held lease is
    /// confirmed from then.
    pub(super) fn confirm_all(&mut self, sent: Instant) {
        for r in self.runs.values_mut() {
            if let Some(h) = r.state.held_mut() {
                h.confirmed = sent;
            }
        }
    }

    /// The verify sent at `sent` answered that the session holds `held`: a
    /// held lease in it is confirmed, one not in it is lost; a key in it that
    /// no run holds is unlocked (after its run's job returned, if its run
    /// lost it).
    pub(super) fn verified(&mut self, sent: Instant, held: BTreeSet<i64>, out: &mut Outputs) {
        let mut lost = Vec::new();
        for (id, r) in &mut self.runs {
            let in_reply = held.contains(&r.lease.key());
            match r.state.held_mut() {
                Some(h) if in_reply => h.confirmed = sent,
                Some(_) => lost.push(*id),
                None => {}
            }
        }
        for id in lost {
            self.lose(id, Reason::NotHeld, out);
        }
        for key in held {
            match self.by_key(key).map(|r| &r.state) {
                Some(
                    RunState::Leading(_)
                    | RunState::Stopping(Stopping::Held { .. })
                    | RunState::Releasing { .. },
                ) => continue,
                // Held, but its run lost it and its cancelled job still runs:
                // unlock only after the job has returned.
                Some(RunState::Stopping(Stopping::Lost { .. })) => {
                    self.held_lost.insert(key);
                    continue;
                }
                Some(RunState::Standby(_)) | None => {}
            }
            if self.orphans.insert(key) {
                out.event(Event::UnknownKeyReleased { key });
            }
        }
    }

    /// A release statement of `keys` answered: their releasing runs finish.
    pub(super) fn release_answered(&mut self, keys: Vec<i64>, out: &mut Outputs) {
        for key in keys {
            let Some(&id) = self.keys.get(&key) else {
                continue;
            };
            if let Some(RunState::Releasing {
                outcome,
                release: Release::Sent,
            }) = self.runs.get(&id).map(|r| &r.state)
            {
                let outcome = outcome.clone();
                self.released(id, outcome, out);
            }
        }
    }

    // ---- the runs' own events ---------------------------------------------

    pub(super) fn job_exited(&mut self, id: RunId, exit: JobExit, out: &mut Outputs) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let key = run.lease.key();
        match &run.state {
            RunState::Leading(_) | RunState::Stopping(Stopping::Held { .. }) => {
                let outcome = match (exit, &run.state) {
                    (JobExit::Abandoned, _) => Some(Outcome::Abandoned),
                    (_, RunState::Stopping(Stopping::Held { outcome, .. })) => outcome.clone(),
                    (JobExit::Ok, _) => Some(Outcome::Completed),
                    (JobExit::Failed, _) => Some(Outcome::Failed),
                };
                run.state = RunState::Releasing {
                    outcome,
                    release: Release::Queued,
                };
            }
            RunState::Stopping(Stopping::Lost { outcome }) => {
                match (exit, outcome.clone()) {
                    (JobExit::Abandoned, _) => self.finish(id, Outcome::Abandoned, out),
                    (_, Some(outcome)) => self.finish(id, outcome, out),
                    // Lost, and the job returned: contend again, restart on the next win.
                    (_, None) => run.state = RunState::Standby(Standby::new()),
                }
                // Found held again while the job ran: unlock it now (releases
                // go before tries, so it is never locked twice).
                if self.held_lost.remove(&key) {
                    self.orphans.insert(key);
                }
            }
            RunState::Standby(_) if exit == JobExit::Abandoned => {
                self.finish(id, Outcome::Abandoned, out)
            }
            // Dropped while its key is released (after a hand-over, or after
            // its job returned): it finishes with the release, and never
            // contends again. A drop decides the outcome, as in every state.
            RunState::Releasing { .. } if exit == JobExit::Abandoned => {
                if let RunState::Releasing { outcome, .. } = &mut run.state {
                    *outcome = Some(Outcome::Abandoned);
                }
            }
            RunState::Standby(_) | RunState::Releasing { .. } => {}
        }
    }

    /// Shutdown, close or refusal of one run: it ends with `outcome` once its
    /// job (if any) returned. The first stop of a run decides its outcome.
    pub(super) fn stop(&mut self, id: RunId, outcome: Outcome, reason: Reason, out: &mut Outputs) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        match &mut run.state {
            // A try in flight that wins for a finished run leaves an unknown
            // key: the reply handler unlocks it.
            RunState::Standby(_) => self.finish(id, outcome, out),
            RunState::Leading(held) => {
                let held = held.clone();
                let outcome = Some(outcome);
                run.state = RunState::Stopping(Stopping::Held { held, outcome });
                out.run(RunCommand::CancelJob { run: id, reason });
            }
            RunState::Stopping(Stopping::Lost { outcome: then })
            | RunState::Stopping(Stopping::Held { outcome: then, .. })
            | RunState::Releasing { outcome: then, .. } => {
                then.get_or_insert(outcome);
            }
        }
    }

    /// A group's hand-off of `key`: its leading run's job is cancelled
    /// ([`Reason::HandedOver`]); the key is released once the job returned,
    /// and the run stands by again. Nothing for a run not leading; the run
    /// and its lease when it was (for the caller's event).
    pub(super) fn hand_over(&mut self, key: i64, out: &mut Outputs) -> Option<(RunId, LeaseId)> {
        let (id, run) = self.by_key_mut(key)?;
        let RunState::Leading(held) = &run.state else {
            return None;
        };
        let held = held.clone();
        run.state = RunState::Stopping(Stopping::Held {
            held,
            outcome: None,
        });
        out.run(RunCommand::CancelJob {
            run: id,
            reason: Reason::HandedOver,
        });
        Some((id, run.lease.clone()))
    }

    /// The group id of the run of `key`, if it runs in a group.
    pub(super) fn group_of(&self, key: i64) -> Option<u32> {
        self.by_key(key)?.lease.group().map(|g| g.id())
    }

    /// The keys of the runs in each group that still want them (not
    /// finishing), by group id.
    pub(super) fn group_keys(&self) -> BTreeMap<u32, BTreeSet<i64>> {
        let mut groups: BTreeMap<u32, BTreeSet<i64>> = BTreeMap::new();
        for r in self.runs.values().filter(|r| !r.state.finishing()) {
            if let Some(g) = r.lease.group() {
                groups.entry(g.id()).or_default().insert(r.lease.key());
            }
        }
        groups
    }

    /// The keys whose runs lead.
    pub(super) fn leading_keys(&self) -> BTreeSet<i64> {
        (self.runs.values())
            .filter(|r| matches!(r.state, RunState::Leading(_)))
            .map(|r| r.lease.key())
            .collect()
    }

    /// The key of `id` is lost (or suspected lost): its job is cancelled,
    /// unless a stop cancelled it already.
    pub(super) fn lose(&mut self, id: RunId, reason: Reason, out: &mut Outputs) {
        let Some(r) = self.runs.get_mut(&id) else {
            return;
        };
        let cancel = match &r.state {
            RunState::Leading(_) => {
                r.state = RunState::Stopping(Stopping::Lost { outcome: None });
                true
            }
            RunState::Stopping(Stopping::Held { outcome, .. }) => {
                let outcome = outcome.clone();
                r.state = RunState::Stopping(Stopping::Lost { outcome });
                false
            }
            _ => return,
        };
        let lease = r.lease.clone();
        out.event(Event::Lost {
            run: id,
            lease,
            reason: reason.clone(),
        });
        if cancel {
            out.run(RunCommand::CancelJob { run: id, reason });
        }
    }

    /// The machine gives up on the session while jobs run on it: every
    /// standby in the try in flight waits for the next session, every lease
    /// is lost.
    pub(super) fn doubt_session(&mut self, reason: &Reason, out: &mut Outputs) {
        for id in self.ids() {
            if let Some(r) = self.runs.get_mut(&id) {
                if let RunState::Standby(standby) = &mut r.state {
                    standby.step = StandbyStep::Waiting;
                }
            }
            self.lose(id, reason.clone(), out);
        }
    }

    /// The session is gone: every lease on it is lost, every release done
    /// (the session's end released the key), every standby waits for the
    /// next one.
    pub(super) fn session_gone(&mut self, reason: &Reason, out: &mut Outputs) {
        for id in self.ids() {
            let Some(r) = self.runs.get_mut(&id) else {
                continue;
            };
            match &mut r.state {
                RunState::Standby(standby) => {
                    standby.step = StandbyStep::Waiting;
                    // A request sent on the lost session may not have gone
                    // out: ask again on the next.
                    standby.asked = None;
                }
                RunState::Leading(_) | RunState::Stopping(Stopping::Held { .. }) => {
                    self.lose(id, reason.clone(), out)
                }
                RunState::Releasing { outcome, .. } => {
                    let outcome = outcome.clone();
                    self.released(id, outcome, out);
                }
                RunState::Stopping(Stopping::Lost { .. }) => {}
            }
        }
    }

    /// What ends with any session: the keys it held without a run, and the
    /// try (or take) in flight, never answered now: its standbys wait for
    /// the next session's.
    pub(super) fn session_down(&mut self) {
        self.orphans.clear();
        self.held_lost.clear();
        for r in self.runs.values_mut() {
            if let RunState::Standby(standby) = &mut r.state {
                standby.step = StandbyStep::Waiting;
            }
        }
    }

    fn released(&mut self, id: RunId, outcome: Option<Outcome>, out: &mut Outputs) {
        if let Some(r) = self.runs.get_mut(&id) {
            let lease = r.lease.clone();
            out.event(Event::Released { run: id, lease });
            match outcome {
                Some(outcome) => self.finish(id, outcome, out),
                // Handed over: contend again.
                None => r.state = RunState::Standby(Standby::new()),
            }
        }
    }

    fn finish(&mut self, id: RunId, outcome: Outcome, out: &mut Outputs) {
        if let Some(r) = self.runs.remove(&id) {
            self.keys.remove(&r.lease.key());
            out.run(RunCommand::Finish { run: id, outcome });
        }
        self.check();
    }
}

#[cfg(test)]
mod tests {
    //! The run table alone: each transition of a run, what it tells the run
    //! futures and the logs, and the keys it leaves to unlock.

    use super::*;

    const WINDOW: Duration = Duration::from_secs(5);
    const DELAY: Duration = Duration::from_millis(20);

    fn lease(name: &str) -> LeaseId {
        LeaseId::named(name).unwrap()
    }

    /// A table with one standby of each name, in order (run ids 0, 1, …).
    fn table(names: &[&str]) -> (RunTable, Vec<RunId>) {
        let mut t = RunTable::default();
        let ids = (names.iter())
            .map(|n| {
                let id = t.next_id();
                t.insert(id, lease(n));
                id
            })
            .collect();
        (t, ids)
    }

    fn drain(out: &mut Outputs) -> (Vec<RunCommand>, Vec<Event>) {
        out.take_runs_and_events()
    }

    /// A table whose one run is a standby of lease "a", with what its tests
    /// start from: no outputs yet, the time now and a's key.
    fn standby_of_a() -> (RunTable, Outputs, Instant, i64) {
        let (t, _) = table(&["a"]);
        (t, Outputs::default(), Instant::now(), lease("a").key())
    }

    /// A try sent at `sent`, joined by every waiting standby, found `key`
    /// held by `holder`.
    fn stand_by(t: &mut RunTable, key: i64, sent: Instant, holder: Option<i64>, out: &mut Outputs) {
        t.take_try(sent, &[], |_| true);
        t.not_won(key, holder, out);
    }

    /// `name`'s run tried at `sent` and won with `token`.
    fn lead(t: &mut RunTable, name: &str, sent: Instant, token: i64, out: &mut Outputs) {
        let keys = t.take_try(sent, &[], |_| true);
        assert!(keys.contains(&lease(name).key()));
        t.won(sent, sent, (lease(name).key(), token), WINDOW, out);
        for other in keys.into_iter().filter(|k| *k != lease(name).key()) {
            t.not_won(other, Some(7), out);
        }
    }

    #[test]
    fn a_try_takes_every_waiting_standby_once() {
        let (mut t, _) = table(&["a", "b"]);
        let now = Instant::now();
        assert!(t.any_waiting());
        let keys = t.take_try(now, &[], |_| true);
        assert_eq!(keys.len(), 2);
        assert!(!t.any_waiting(), "both are in the try in flight");
        assert!(t.take_try(now, &[], |_| true).is_empty(), "nothing twice");
        // A group's share can leave a lease out.
        t.try_back(&keys);
        let b = lease("b").key();
        assert_eq!(t.take_try(now, &[], |l| l.key() == b), vec![b]);
    }

    #[test]
    fn a_win_starts_the_job_valid_for_the_window_from_the_send() {
        let (mut t, ids) = table(&["a"]);
        let mut out = Outputs::default();
        let sent = Instant::now();
        t.take_try(sent, &[], |_| true);
        let now = sent + Duration::from_millis(3);
        t.won(now, sent, (lease("a").key(), 42), WINDOW, &mut out);
        let (runs, events) = drain(&mut out);
        assert_eq!(
            runs,
            vec![RunCommand::StartJob {
                run: ids[0],
                lease: lease("a"),
                token: 42,
                valid_until: sent + WINDOW,
            }]
        );
        assert!(matches!(events[..], [Event::Acquired { token: 42, .. }]));
        assert!(t.holding() && t.any_job_running());
        assert_eq!(t.earliest_validity_end(WINDOW), Some(sent + WINDOW));
        // A heartbeat sent later confirms from its own send time.
        let beat = sent + Duration::from_secs(1);
        t.confirm_all(beat);
        assert_eq!(t.earliest_validity_end(WINDOW), Some(beat + WINDOW));
    }

    #[test]
    fn a_win_for_no_trying_run_is_unlocked() {
        let (mut t, ids) = table(&["a"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        // Not in a try: the win is nobody's.
        t.won(now, now, (lease("a").key(), 1), WINDOW, &mut out);
        assert!(t.is_orphan(lease("a").key()));
        assert_eq!(drain(&mut out), (vec![], vec![]));
        // A key no run has at all.
        t.won(now, now, (99, 1), WINDOW, &mut out);
        assert!(t.is_orphan(99));
        assert_eq!(t.take_release(now, WINDOW).len(), 2);
        assert!(!t.has_orphans());
        assert!(t.get(ids[0]).is_some(), "the run still stands by");
    }

    #[test]
    fn a_job_that_returns_releases_then_finishes() {
        let (mut t, ids) = table(&["a"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        lead(&mut t, "a", now, 1, &mut out);
        drain(&mut out);
        t.job_exited(ids[0], JobExit::Ok, &mut out);
        assert_eq!(
            drain(&mut out),
            (vec![], vec![]),
            "not finished before the unlock"
        );
        assert!(!t.holding(), "no validity to renew once the job returned");
        assert!(t.need_session(false), "the release needs the session");
        assert_eq!(t.take_release(now, WINDOW), vec![lease("a").key()]);
        assert!(t.take_release(now, WINDOW).is_empty(), "released once");
        t.release_answered(vec![lease("a").key()], &mut out);
        let (runs, events) = drain(&mut out);
        assert_eq!(
            runs,
            vec![RunCommand::Finish {
                run: ids[0],
                outcome: Outcome::Completed
            }]
        );
        assert!(matches!(events[..], [Event::Released { .. }]));
        assert!(t.is_empty() && !t.has_key(lease("a").key()));
    }

    #[test]
    fn a_stop_while_leading_keeps_the_key_until_the_job_returns() {
        let (mut t, ids) = table(&["a"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        lead(&mut t, "a", now, 1, &mut out);
        drain(&mut out);
        t.stop(ids[0], Outcome::Cancelled, Reason::Shutdown, &mut out);
        assert_eq!(
            drain(&mut out).0,
            vec![RunCommand::CancelJob {
                run: ids[0],
                reason: Reason::Shutdown
            }]
        );
        assert!(
            t.holding(),
            "still held, still confirmed, while the job stops"
        );
        // The first stop decides the outcome.
        t.stop(ids[0], Outcome::Closed, Reason::Closed, &mut out);
        assert_eq!(drain(&mut out), (vec![], vec![]));
        t.job_exited(ids[0], JobExit::Ok, &mut out);
        t.take_release(now, WINDOW);
        t.release_answered(vec![lease("a").key()], &mut out);
        assert!(drain(&mut out).0.contains(&RunCommand::Finish {
            run: ids[0],
            outcome: Outcome::Cancelled
        }));
    }

    #[test]
    fn a_stop_of_a_standby_finishes_it_at_once() {
        let (mut t, ids) = table(&["a"]);
        let mut out = Outputs::default();
        t.stop(ids[0], Outcome::Cancelled, Reason::Shutdown, &mut out);
        assert_eq!(
            drain(&mut out).0,
            vec![RunCommand::Finish {
                run: ids[0],
                outcome: Outcome::Cancelled
            }]
        );
        assert!(t.is_empty());
    }

    #[test]
    fn a_lost_lease_cancels_the_job_and_contends_again_when_it_returns() {
        let (mut t, ids) = table(&["a"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        lead(&mut t, "a", now, 1, &mut out);
        drain(&mut out);
        t.lose(ids[0], Reason::QueryTimeout, &mut out);
        let (runs, events) = drain(&mut out);
        assert_eq!(
            runs,
            vec![RunCommand::CancelJob {
                run: ids[0],
                reason: Reason::QueryTimeout
            }]
        );
        assert!(matches!(
            &events[..],
            [Event::Lost {
                reason: Reason::QueryTimeout,
                ..
            }]
        ));
        assert!(!t.holding() && t.any_job_running());
        assert!(
            !t.need_session(true),
            "a lost run needs no session until its job returns"
        );
        // Lost again: nothing more to say.
        t.lose(ids[0], Reason::NotHeld, &mut out);
        assert_eq!(drain(&mut out), (vec![], vec![]));
        t.job_exited(ids[0], JobExit::Ok, &mut out);
        assert_eq!(
            drain(&mut out),
            (vec![], vec![]),
            "no finish: it stands by again"
        );
        assert!(t.any_waiting());
    }

    #[test]
    fn a_verify_loses_what_the_server_does_not_show_and_unlocks_what_no_run_holds() {
        let (mut t, ids) = table(&["a", "b"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        let (a, b) = (lease("a").key(), lease("b").key());
        let keys = t.take_try(now, &[], |_| true);
        assert_eq!(keys.len(), 2);
        t.won(now, now, (a, 1), WINDOW, &mut out);
        t.won(now, now, (b, 1), WINDOW, &mut out);
        drain(&mut out);
        let later = now + Duration::from_secs(1);
        t.verified(later, BTreeSet::from([a, 77]), &mut out);
        let (runs, events) = drain(&mut out);
        assert!(runs.contains(&RunCommand::CancelJob {
            run: ids[1],
            reason: Reason::NotHeld
        }));
        assert!(events.contains(&Event::UnknownKeyReleased { key: 77 }));
        assert!(t.is_orphan(77) && !t.is_orphan(a));
        assert_eq!(t.earliest_validity_end(WINDOW), Some(later + WINDOW));
    }

    #[test]
    fn a_key_found_held_by_a_lost_run_is_unlocked_only_after_its_job_returned() {
        let (mut t, ids) = table(&["a"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        let a = lease("a").key();
        lead(&mut t, "a", now, 1, &mut out);
        t.lose(ids[0], Reason::QueryTimeout, &mut out);
        // The server still shows the key: the cancelled job may still act.
        t.verified(now, BTreeSet::from([a]), &mut out);
        assert!(!t.is_orphan(a), "not unlocked while the job runs");
        assert_eq!(t.wait_candidates(&[]), None, "the session owes an unlock");
        t.job_exited(ids[0], JobExit::Ok, &mut out);
        assert!(t.is_orphan(a), "unlocked once the job returned");
    }

    #[test]
    fn a_session_that_ends_releases_every_key_and_loses_every_lease() {
        let (mut t, ids) = table(&["a", "b", "c"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        assert_eq!(t.take_try(now, &[], |_| true).len(), 3);
        t.won(now, now, (lease("a").key(), 1), WINDOW, &mut out);
        t.won(now, now, (lease("b").key(), 1), WINDOW, &mut out);
        t.job_exited(ids[1], JobExit::Failed, &mut out);
        t.take_release(now, WINDOW);
        drain(&mut out);
        assert!(!t.any_waiting(), "c is in the try in flight");
        t.session_gone(&Reason::SessionEnded(None), &mut out);
        t.session_down();
        let (runs, _) = drain(&mut out);
        assert!(runs.contains(&RunCommand::CancelJob {
            run: ids[0],
            reason: Reason::SessionEnded(None)
        }));
        assert!(
            runs.contains(&RunCommand::Finish {
                run: ids[1],
                outcome: Outcome::Failed
            }),
            "the session's end released b: its run finishes"
        );
        assert!(t.any_waiting(), "c waits for the next session's try");
    }

    #[test]
    fn a_reserved_key_is_left_out_of_the_try_until_its_reservation_ends() {
        let (mut t, _, now, a) = standby_of_a();
        assert!(t.reserve(a, 500, (now, now + WINDOW), u32::MAX));
        assert!(
            !t.reserve(99, 500, (now, now + WINDOW), u32::MAX),
            "no run of 99"
        );
        assert_eq!(t.reserved_for_other(a, &[600], now), Some(500));
        assert!(t.take_try(now, &[600], |_| true).is_empty());
        assert_eq!(t.wait_candidates(&[600]), Some(vec![]));
        // Reserved for this locker's own backend: tried.
        assert!(t.reserved_for(a, &[500], now));
        assert_eq!(t.take_try(now, &[500], |_| true), vec![a]);
        t.try_back(&[a]);
        // Ended: tried by anyone.
        assert_eq!(t.take_try(now + WINDOW, &[600], |_| true), vec![a]);
        assert_eq!(t.reserved_for_other(a, &[600], now), None);
    }

    #[test]
    fn a_release_names_its_reservation_and_whether_it_is_recent() {
        let (mut t, _, now, a) = standby_of_a();
        t.reserve(a, 500, (now, now + WINDOW), 1);
        let recent = Duration::from_millis(500);
        assert_eq!(t.reservations(&[a, 9], now, recent), vec![(a, 500, 1)]);
        let later = now + Duration::from_secs(1);
        assert_eq!(t.reservations(&[a], later, recent), vec![(a, 500, 0)]);
        assert!(t.reservations(&[a], now + WINDOW, recent).is_empty());
        t.unreserve(a);
        assert!(t.reservations(&[a], now, recent).is_empty());
    }

    #[test]
    fn a_declined_win_is_unlocked_and_its_reservation_runs_on() {
        let (mut t, _, now, a) = standby_of_a();
        t.reserve(a, 500, (now, now + Duration::from_millis(10)), u32::MAX);
        t.take_try(now, &[500], |_| true);
        t.decline(a, now, WINDOW);
        assert!(t.is_orphan(a));
        assert!(t.any_waiting(), "its standby stands by again");
        assert_eq!(t.reserved_for_other(a, &[1], now + WINDOW / 2), Some(500));
    }

    #[test]
    fn only_a_graceful_release_close_to_the_win_spares_the_lock_delay() {
        let (mut t, mut out, now, a) = standby_of_a();
        // The last try saw holder 7.
        stand_by(&mut t, a, now, Some(7), &mut out);
        let sent = now + Duration::from_millis(5);
        let released_at = 1_000_000;
        t.released_gracefully(a, now, (Some(released_at), None));
        t.take_try(sent, &[], |_| true);
        let me = Some(8);
        let soon = released_at + 10_000; // 10 ms after the release
        let late = released_at + 30_000; // 30 ms: beyond the delay
        assert!(!t.any_win_needs_lock_delay(&[(a, soon)], (sent, me), DELAY, false));
        assert!(t.any_win_needs_lock_delay(&[(a, late)], (sent, me), DELAY, false));
        // A try sent long after the notification proves nothing.
        let slow = now + Duration::from_millis(50);
        assert!(t.any_win_needs_lock_delay(&[(a, soon)], (slow, me), DELAY, false));
        // A release that granted the key to another backend.
        t.released_gracefully(a, now, (Some(released_at), Some(9)));
        assert!(t.any_win_needs_lock_delay(&[(a, soon)], (sent, me), DELAY, false));
        assert!(
            !t.any_win_needs_lock_delay(&[(a, soon)], (sent, me), DELAY, true),
            "the broken variant ignores the grantee"
        );
        // A notification without the release's moment never counts.
        t.released_gracefully(a, now, (None, None));
        assert!(t.any_win_needs_lock_delay(&[(a, soon)], (sent, me), DELAY, false));
    }

    #[test]
    fn a_take_wins_without_the_delay_only_when_the_release_named_its_backend() {
        let (mut t, mut out, now, a) = standby_of_a();
        stand_by(&mut t, a, now, Some(7), &mut out);
        assert!(t.take_wait(a));
        assert!(!t.take_wait(a), "already taking");
        let token = 1_000_000 + 1_000;
        t.released_gracefully(a, now, (Some(1_000_000), None));
        assert!(
            t.any_win_needs_lock_delay(&[(a, token)], (now, Some(8)), DELAY, false),
            "a release naming nobody proves nothing to a take"
        );
        t.released_gracefully(a, now, (Some(1_000_000), Some(8)));
        assert!(!t.any_win_needs_lock_delay(&[(a, token)], (now, Some(8)), DELAY, false));
    }

    #[test]
    fn a_standby_logs_a_holder_once_until_it_changes() {
        let (mut t, mut out, now, a) = standby_of_a();
        for _ in 0..3 {
            stand_by(&mut t, a, now, Some(7), &mut out);
        }
        assert_eq!(drain(&mut out).1.len(), 1, "one StandingBy for holder 7");
        stand_by(&mut t, a, now, Some(8), &mut out);
        assert!(matches!(
            drain(&mut out).1[..],
            [Event::StandingBy {
                holder_pid: Some(8),
                ..
            }]
        ));
        assert_eq!(t.standby_of(a), Some((true, Some(Some(8)))));
        assert_eq!(t.wait_candidates(&[]), Some(vec![a]));
    }

    #[test]
    fn a_priority_standby_asks_a_holder_less_and_less_often_then_stops() {
        let (mut t, mut out, now, a) = standby_of_a();
        let again = Duration::from_secs(1);
        assert_eq!(
            t.take_preference(now, Some(8), again),
            None,
            "no holder seen yet"
        );
        stand_by(&mut t, a, now, Some(7), &mut out);
        assert_eq!(t.take_preference(now, Some(8), again), Some(a));
        assert_eq!(
            t.take_preference(now, Some(8), again),
            None,
            "asked just now"
        );
        let at = |s: u64| now + Duration::from_secs(s);
        assert_eq!(t.take_preference(at(1), Some(8), again), Some(a));
        // Asked twice: the next ask waits two windows.
        assert_eq!(t.take_preference(at(2), Some(8), again), None);
        assert_eq!(t.take_preference(at(3), Some(8), again), Some(a));
        for _ in 0..MAX_ASKS {
            t.hand_over_announced(a, 7);
        }
        assert_eq!(
            t.take_preference(at(100), Some(8), again),
            None,
            "handed over enough"
        );
        // Not the holder itself.
        let (mut t, _) = table(&["b"]);
        stand_by(&mut t, lease("b").key(), now, Some(8), &mut out);
        assert_eq!(t.take_preference(now, Some(8), again), None);
    }

    #[test]
    fn a_group_hand_off_stands_the_run_by_again_after_its_release() {
        let (mut t, ids) = table(&["a"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        let a = lease("a").key();
        assert_eq!(t.hand_over(a, &mut out), None, "not leading");
        lead(&mut t, "a", now, 1, &mut out);
        drain(&mut out);
        assert_eq!(t.hand_over(a, &mut out), Some((ids[0], lease("a"))));
        assert_eq!(
            drain(&mut out).0,
            vec![RunCommand::CancelJob {
                run: ids[0],
                reason: Reason::HandedOver
            }]
        );
        t.job_exited(ids[0], JobExit::Ok, &mut out);
        t.take_release(now, WINDOW);
        t.release_answered(vec![a], &mut out);
        let (runs, events) = drain(&mut out);
        assert!(runs.is_empty(), "no finish");
        assert!(matches!(events[..], [Event::Released { .. }]));
        assert!(t.any_waiting());
    }

    #[test]
    fn an_abandoned_job_finishes_its_run_whatever_its_state() {
        let (mut t, ids) = table(&["a", "b"]);
        let mut out = Outputs::default();
        let now = Instant::now();
        t.job_exited(ids[0], JobExit::Abandoned, &mut out);
        assert!(drain(&mut out).0.contains(&RunCommand::Finish {
            run: ids[0],
            outcome: Outcome::Abandoned
        }));
        lead(&mut t, "b", now, 1, &mut out);
        t.stop(ids[1], Outcome::Cancelled, Reason::Shutdown, &mut out);
        t.job_exited(ids[1], JobExit::Abandoned, &mut out);
        t.take_release(now, WINDOW);
        drain(&mut out);
        t.release_answered(vec![lease("b").key()], &mut out);
        assert!(drain(&mut out).0.contains(&RunCommand::Finish {
            run: ids[1],
            outcome: Outcome::Abandoned
        }));
    }
}
