//! What a user's test asserts: a store that fences writes by token, a log of
//! the job's runs, and the checks on them, each breach a [`Breach`].

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Grant;
use crate::shared::lock;
use crate::Lease;

/// The kit's clock: time since the server was made.
pub(crate) type Clock = Arc<dyn Fn() -> Duration + Send + Sync>;

/// A breach found by a check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Breach {
    /// Two runs of the job of one lease were running at once.
    Overlap {
        /// The lease.
        lease: String,
        /// The fencing tokens of the two runs.
        tokens: (i64, i64),
        /// When both were running.
        from: Duration,
        /// Until when (`None`: both still run).
        to: Option<Duration>,
    },
    /// A job ran on longer than allowed after its lease was cancelled.
    SlowStop {
        /// The lease.
        lease: String,
        /// The run's token.
        token: i64,
        /// When the lease was cancelled.
        cancelled: Duration,
        /// When the job returned (`None`: it still runs).
        stopped: Option<Duration>,
        /// The bound it broke.
        allowed: Duration,
    },
    /// A write was accepted without the newest token of its lease granted
    /// by then (`token: None`: a write with no token at all).
    StaleWrite {
        /// When.
        at: Duration,
        /// The token it carried.
        token: Option<i64>,
        /// The newest granted by then (`None`: none was).
        newest: Option<i64>,
    },
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Breach::Overlap {
                lease,
                tokens,
                from,
                to,
            } => write!(
                f,
                "two runs of {lease} at once (tokens {} and {}) from {from:?} to {to:?}",
                tokens.0, tokens.1
            ),
            Breach::SlowStop {
                lease,
                token,
                cancelled,
                stopped,
                allowed,
            } => write!(
                f,
                "the run of {lease} with token {token} was cancelled at {cancelled:?} and \
                 stopped at {stopped:?}, later than {allowed:?} after"
            ),
            Breach::StaleWrite { at, token, newest } => write!(
                f,
                "a write at {at:?} with token {token:?} was accepted while the newest token \
                 granted was {newest:?}"
            ),
        }
    }
}

/// A write the store saw.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Write<T> {
    /// When (time since the server was made).
    pub at: Duration,
    /// Its fencing token (`None`: written without one).
    pub token: Option<i64>,
    /// What was written.
    pub value: T,
    /// Whether the store took it.
    pub accepted: bool,
}

/// Why a fenced write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejected {
    /// The write's token.
    pub token: i64,
    /// The newest token the store had seen.
    pub newest: i64,
}

impl Rejected {
    /// How far the write's token is below the newest, in the tokens' units
    /// (microseconds of the server's clock).
    pub fn behind(&self) -> Duration {
        Duration::from_micros(self.newest.abs_diff(self.token))
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fencing token went backwards: {} is {:.6}s below the newest the store has seen, {} \
             (a stale leader, or a server clock that stepped back)",
            self.token,
            self.behind().as_secs_f64(),
            self.newest
        )
    }
}

impl std::error::Error for Rejected {}

struct Store<T> {
    newest: Option<i64>,
    writes: Vec<Write<T>>,
}

/// A store that accepts a write only with a fencing token at least the
/// newest it has seen, as a database row guarded by `WHERE token <= $1`
/// does, and records every write it accepted and rejected. Cheap to clone;
/// clones share the store.
pub struct FencedStore<T> {
    clock: Clock,
    store: Arc<Mutex<Store<T>>>,
}

impl<T> Clone for FencedStore<T> {
    fn clone(&self) -> Self {
        FencedStore {
            clock: self.clock.clone(),
            store: self.store.clone(),
        }
    }
}

impl<T> fmt::Debug for FencedStore<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = lock(&self.store);
        f.debug_struct("FencedStore")
            .field("newest", &s.newest)
            .field("writes", &s.writes.len())
            .finish()
    }
}

impl<T> FencedStore<T> {
    pub(crate) fn new(clock: Clock) -> Self {
        FencedStore {
            clock,
            store: Arc::new(Mutex::new(Store {
                newest: None,
                writes: Vec::new(),
            })),
        }
    }

    /// Writes `value` under fencing token `token`: accepted if `token` is
    /// at least the newest the store has seen (which it becomes).
    ///
    /// # Errors
    /// [`Rejected`] for an older token.
    pub fn write(&self, token: i64, value: T) -> Result<(), Rejected> {
        let at = (self.clock)();
        let mut s = lock(&self.store);
        let newest = s.newest;
        let accepted = newest.is_none_or(|n| token >= n);
        if accepted {
            s.newest = Some(token);
        }
        s.writes.push(Write {
            at,
            token: Some(token),
            value,
            accepted,
        });
        match newest {
            Some(newest) if !accepted => {
                let rejected = Rejected { token, newest };
                // Loud: a write refused is never silent (docs/fencing.md).
                tracing::warn!(token, newest, "fenced store refused a write: {rejected}");
                Err(rejected)
            }
            _ => Ok(()),
        }
    }

    /// Writes `value` with no token, as a store without fencing takes any
    /// write: always accepted (and flagged by
    /// [`TestServer::check_newest_token`](super::TestServer::check_newest_token)).
    pub fn write_unfenced(&self, value: T) {
        let at = (self.clock)();
        lock(&self.store).writes.push(Write {
            at,
            token: None,
            value,
            accepted: true,
        });
    }

    /// The newest token seen.
    pub fn newest(&self) -> Option<i64> {
        lock(&self.store).newest
    }

    /// Every write, accepted or not, in order.
    pub fn writes(&self) -> Vec<Write<T>>
    where
        T: Clone,
    {
        lock(&self.store).writes.clone()
    }

    /// The writes the store took, in order.
    pub fn accepted(&self) -> Vec<Write<T>>
    where
        T: Clone,
    {
        (self.writes().into_iter()).filter(|w| w.accepted).collect()
    }

    /// The writes the store refused, in order.
    pub fn rejected(&self) -> Vec<Write<T>>
    where
        T: Clone,
    {
        (self.writes().into_iter())
            .filter(|w| !w.accepted)
            .collect()
    }

    /// Every accepted write's time and token.
    pub(crate) fn accepted_marks(&self) -> Vec<(Duration, Option<i64>)> {
        (lock(&self.store).writes.iter())
            .filter(|w| w.accepted)
            .map(|w| (w.at, w.token))
            .collect()
    }
}

/// Accepted writes (time, token) against the grants of their lease.
pub(crate) fn newest_token(writes: &[(Duration, Option<i64>)], grants: &[Grant]) -> Vec<Breach> {
    let mut found = Vec::new();
    for &(at, token) in writes {
        let newest = (grants.iter())
            .filter(|g| g.at <= at)
            .map(|g| g.token)
            .max();
        if token.is_none() || token != newest {
            found.push(Breach::StaleWrite { at, token, newest });
        }
    }
    found
}

/// One call of a job, as the [`JobLog`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobRun {
    /// The lease.
    pub lease: String,
    /// Its fencing token.
    pub token: i64,
    /// When the job started.
    pub started: Duration,
    /// When its lease was cancelled, as soon as the kit saw it.
    pub cancelled: Option<Duration>,
    /// When it returned (`None`: it runs).
    pub stopped: Option<Duration>,
}

struct Entry {
    lease: Lease,
    run: JobRun,
}

/// A log of your job's runs: call [`JobLog::start`] first thing in the job
/// and keep the guard until it returns. Cheap to clone; clones share the
/// log.
#[derive(Clone)]
pub struct JobLog {
    clock: Clock,
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl fmt::Debug for JobLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.runs()).finish()
    }
}

/// A running job (from [`JobLog::start`]): its run ends when this is dropped.
#[derive(Debug)]
#[must_use = "the run ends when the guard is dropped: keep it for the whole job"]
pub struct Running {
    log: JobLog,
    index: usize,
}

impl Drop for Running {
    fn drop(&mut self) {
        let now = (self.log.clock)();
        let mut entries = lock(&self.log.entries);
        let entry = &mut entries[self.index];
        if entry.run.cancelled.is_none() && entry.lease.is_cancelled() {
            entry.run.cancelled = Some(now);
        }
        entry.run.stopped = Some(now);
    }
}

impl JobLog {
    pub(crate) fn new(clock: Clock) -> Self {
        JobLog {
            clock,
            entries: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Records that the job runs under `lease` from now until the guard is
    /// dropped.
    pub fn start(&self, lease: &Lease) -> Running {
        let now = (self.clock)();
        let mut entries = lock(&self.entries);
        entries.push(Entry {
            lease: lease.clone(),
            run: JobRun {
                lease: lease.name().to_string(),
                token: lease.token(),
                started: now,
                cancelled: None,
                stopped: None,
            },
        });
        Running {
            log: self.clone(),
            index: entries.len() - 1,
        }
    }

    /// Stamps the cancellation of every running job whose lease was
    /// cancelled since (the kit calls it whenever its time moves).
    pub(crate) fn note(&self, now: Duration) {
        for e in lock(&self.entries).iter_mut() {
            if e.run.stopped.is_none() && e.run.cancelled.is_none() && e.lease.is_cancelled() {
                e.run.cancelled = Some(now);
            }
        }
    }

    /// Every run so far, in start order.
    pub fn runs(&self) -> Vec<JobRun> {
        let now = (self.clock)();
        self.note(now);
        (lock(&self.entries).iter())
            .map(|e| e.run.clone())
            .collect()
    }

    /// No two runs of one lease were running at once.
    pub fn check_no_overlap(&self) -> Vec<Breach> {
        let runs = self.runs();
        let mut found = Vec::new();
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                if a.lease != b.lease {
                    continue;
                }
                let from = a.started.max(b.started);
                let to = match (a.stopped, b.stopped) {
                    (Some(x), Some(y)) => Some(x.min(y)),
                    (x, y) => x.or(y),
                };
                if to.is_none_or(|to| to > from) {
                    found.push(Breach::Overlap {
                        lease: a.lease.clone(),
                        tokens: (a.token, b.token),
                        from,
                        to,
                    });
                }
            }
        }
        found
    }

    /// Every cancelled run returned within `allowed` of its cancellation
    /// (a run still going counts until now).
    pub fn check_stopped_within(&self, allowed: Duration) -> Vec<Breach> {
        let now = (self.clock)();
        let mut found = Vec::new();
        for run in self.runs() {
            let Some(cancelled) = run.cancelled else {
                continue;
            };
            if run.stopped.unwrap_or(now).saturating_sub(cancelled) > allowed {
                found.push(Breach::SlowStop {
                    lease: run.lease,
                    token: run.token,
                    cancelled,
                    stopped: run.stopped,
                    allowed,
                });
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_that_goes_backwards_is_refused_naming_both_tokens_and_the_gap() {
        let store = FencedStore::new(Arc::new(|| Duration::ZERO));
        let base = lease_proto::server::TOKEN_CLOCK_OFFSET;
        assert_eq!(store.write(base + 30_000_000, "new"), Ok(()));
        // The next leader's token, made by a server clock 24.3 s behind.
        let err = store.write(base + 5_700_000, "after the step").unwrap_err();
        assert_eq!(
            err,
            Rejected {
                token: base + 5_700_000,
                newest: base + 30_000_000
            }
        );
        assert_eq!(err.behind(), Duration::from_millis(24_300));
        let text = err.to_string();
        for part in [
            "went backwards",
            &(base + 5_700_000).to_string(),
            &(base + 30_000_000).to_string(),
            "24.300000s",
        ] {
            assert!(text.contains(part), "{text}");
        }
        assert_eq!(store.newest(), Some(base + 30_000_000));
        assert_eq!(store.rejected().len(), 1);
    }
}
