//! The asks: the hand-overs asked of this holder that stand, by key, and
//! when each is checked next (the component the `handover` rules keep; the
//! rule, with its bounds: the `handover` module).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::options::Options;

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
