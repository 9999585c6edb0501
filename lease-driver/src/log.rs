//! One tracing line per core event, with the lease name, key and run as fields;
//! a failing connection is reported at once and then at most once per
//! [`REPEAT_INTERVAL`] ([`EventLog`]).

use std::time::{Duration, Instant};

use lease_proto::{Event, Reason};

use crate::runtime::Clock;

/// How often a connection that keeps failing the same way is reported after
/// its first failure: the repeats in between are logged at `DEBUG`, and the
/// next report counts them (`failed_since_last_line`).
pub(crate) const REPEAT_INTERVAL: Duration = Duration::from_secs(30);

/// What a failed connection attempt was, for [`EventLog`]: a change of kind
/// is reported at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Not reached (refused, timed out, reset, DNS).
    Unreachable,
    /// A configuration error after a ready session (a rotated password).
    Configuration,
    /// The server is a hot standby.
    InRecovery,
}

impl Failure {
    /// The words its report starts with.
    fn what(self) -> &'static str {
        match self {
            Failure::Unreachable => "cannot reach the database",
            Failure::Configuration => "cannot connect: configuration error",
            Failure::InRecovery => "the server is a hot standby (in recovery)",
        }
    }
}

/// Decides which failed attempts of a streak get a line: the first at once,
/// then one per [`REPEAT_INTERVAL`] (or when the kind of failure changes)
/// carrying how many attempts failed since the last line. A ready session
/// ends the streak.
#[derive(Debug, Default)]
pub(crate) struct Repeats {
    /// The last line's time and kind, within the current streak.
    last_line: Option<(Instant, Failure)>,
    /// Failed attempts not reported yet.
    unreported: u32,
}

impl Repeats {
    /// A failed attempt at `now`: `Some(n)` to log it, `n` the attempts
    /// that failed since the last line (this one included); `None` to log
    /// it at `DEBUG` only.
    fn failed(&mut self, now: Instant, kind: Failure) -> Option<u32> {
        self.unreported += 1;
        let due = match self.last_line {
            None => true,
            Some((at, last)) => {
                last != kind || now.saturating_duration_since(at) >= REPEAT_INTERVAL
            }
        };
        if !due {
            return None;
        }
        let n = std::mem::take(&mut self.unreported);
        self.last_line = Some((now, kind));
        Some(n)
    }

    /// A session became ready: the next failure is a new streak.
    fn ready(&mut self) {
        *self = Repeats::default();
    }
}

/// The driver's logging of the core's events ([`log_event`]), with the
/// repeated connection failures summarized ([`Repeats`]).
#[derive(Default)]
pub(crate) struct EventLog {
    repeats: Repeats,
    /// The host the lease session opened on (`host:port`), for the lines
    /// that say where the session is.
    host: Option<String>,
    /// The locker observes ([`Role::Observer`](lease_proto::Role::Observer)): its
    /// runs never lead, and their lines say so.
    observer: bool,
}

impl EventLog {
    /// The log of a locker; `observer`: an observing one.
    pub(crate) fn new(observer: bool) -> EventLog {
        EventLog {
            observer,
            ..EventLog::default()
        }
    }

    /// The host of the lease session from now on.
    pub(crate) fn set_host(&mut self, host: Option<String>) {
        self.host = host;
    }

    /// Logs `event` (the clock is read only for a session's failure).
    pub(crate) fn event(&mut self, clock: &Clock, event: &Event) {
        let kind = match event {
            Event::SessionReady { .. } => {
                self.repeats.ready();
                None
            }
            Event::ConnectFailed { retried: false, .. } => None,
            Event::ConnectFailed {
                configuration: true,
                ..
            } => Some(Failure::Configuration),
            Event::ConnectFailed { .. } => Some(Failure::Unreachable),
            Event::InRecovery { .. } => Some(Failure::InRecovery),
            // The session of that attempt, closed: its `InRecovery` said it.
            Event::SessionLost {
                session: s,
                reason: Reason::InRecovery,
            } => {
                tracing::debug!(session = s.0, "lease session closed (a hot standby)");
                return;
            }
            _ => None,
        };
        match kind {
            None => log_event(event, 1, self.host.as_deref(), self.observer),
            Some(kind) => match self.repeats.failed(clock(), kind) {
                Some(n) => log_event(event, n, self.host.as_deref(), self.observer),
                None => {
                    let error = match event {
                        Event::ConnectFailed { error, .. } => Some(error),
                        _ => None,
                    };
                    tracing::debug!(
                        error = error.map(tracing::field::display),
                        "{} again; still retrying (the next report counts it)",
                        kind.what()
                    )
                }
            },
        }
    }
}

/// Logs a lease event with the lease's name and key and the run.
macro_rules! lease_event {
    ($level:ident, $run:expr, $lease:expr, $($rest:tt)+) => {
        tracing::$level!(lease = $lease.name(), key = $lease.key(), run = $run.0, $($rest)+)
    };
}

/// One log line per event; `since` is how many failed attempts a
/// connection failure's line stands for (see [`Repeats`]); `host` is where
/// the lease session opened, named by every line that says where it is;
/// `observer`: the locker observes (its standbys never lead).
fn log_event(event: &Event, since: u32, host: Option<&str>, observer: bool) {
    use tracing::{debug, error, info, warn};
    let host = host.unwrap_or("?");
    match event {
        Event::SessionOpening {
            session: s,
            failures,
        } => debug!(session = s.0, failures, "lease session connecting"),
        Event::SessionReady {
            session: s,
            backend_pid: pid,
            server_version: v,
        } => {
            info!(
                session = s.0,
                host,
                backend_pid = pid,
                server_version = v,
                "lease session ready"
            )
        }
        Event::ConnectFailed {
            session: s,
            error,
            configuration: true,
            retried: false,
            ..
        } => debug!(
            session = s.0,
            %error,
            "cannot connect: configuration error (password, role, database or TLS); \
             every run returns it"
        ),
        Event::ConnectFailed {
            session: s,
            error,
            configuration: true,
            failures,
            ..
        } => error!(
            session = s.0,
            failures,
            failed_since_last_line = since,
            %error,
            "cannot connect: configuration error (password, role, database or TLS); \
             still retrying after a backoff because this locker had sessions before \
             (reported at most every {}s)",
            REPEAT_INTERVAL.as_secs()
        ),
        Event::ConnectFailed {
            session: s,
            error,
            failures,
            ..
        } => warn!(
            session = s.0,
            failures,
            failed_since_last_line = since,
            %error,
            "cannot reach the database; still retrying after a backoff (reported at most \
             every {}s)",
            REPEAT_INTERVAL.as_secs()
        ),
        Event::SessionLost { session: s, reason } => {
            warn!(session = s.0, host, %reason, "lease session lost")
        }
        Event::SessionIdle { session: s } => debug!(session = s.0, "lease session idle, closed"),
        Event::Acquired { run, lease, token } => {
            lease_event!(info, run, lease, token, host, "lease acquired")
        }
        Event::Lost { run, lease, reason } => lease_event!(warn, run, lease, %reason, "lease lost"),
        Event::Released { run, lease } => lease_event!(info, run, lease, "lease released"),
        Event::StandingBy {
            run,
            lease,
            holder_pid: pid,
        } => {
            let what = if observer {
                "observing the lease; an observer never leads"
            } else {
                "lease held elsewhere; standing by"
            };
            lease_event!(info, run, lease, holder_backend_pid = pid, host, "{what}")
        }
        Event::TryFailed { error } => warn!(%error, "lease try failed; verifying held keys"),
        Event::UnknownKeyReleased { key } => warn!(key, "unlocking a key held without a run"),
        Event::Refused { refusal } => error!(%refusal, "lease setup refused"),
        Event::InRecovery { session: s } => error!(
            session = s.0,
            host,
            failed_since_last_line = since,
            "the server is a hot standby (in recovery): no lease can be taken there; \
             retrying after a backoff (a failover in progress, or the wrong host; reported at \
             most every {}s)",
            REPEAT_INTERVAL.as_secs()
        ),
        Event::PromotionHold { session: s, hold } => warn!(
            session = s.0,
            host,
            hold_ms = hold.as_millis() as u64,
            "the server was promoted recently: no lease is taken there until the old \
             primary's holders must have stopped"
        ),
        Event::PromotionHoldEnded { session: s } => info!(
            session = s.0,
            host, "the promotion hold has passed: leases are taken on this server again"
        ),
        Event::ServerClockStepped {
            session: s,
            back,
            across_sessions,
        } => warn!(
            session = s.0,
            back_ms = back.as_millis() as u64,
            across_sessions,
            "the database server's clock stepped back by at least {:.3}s{}: fencing tokens \
             granted now may be below earlier ones, and a fence may reject the legitimate \
             leader's writes until the server's clock passes the newest stored token's time \
             (docs/fencing.md; the tokens' clock condition in docs/guarantees.md)",
            back.as_secs_f64(),
            if *across_sessions {
                " since the previous session (a restart, a failover or another host)"
            } else {
                ""
            }
        ),
        Event::StartupOptionsRejected { session: s, error } => warn!(
            session = s.0,
            %error,
            "the server (a pooler) rejected startup options; applying the session settings \
             by statement and verifying them"
        ),
        Event::KeyFreed { key } => debug!(key, "a wanted key was freed; trying"),
        Event::KeyTaken { key } => debug!(key, "the wait on the server took a wanted key"),
        Event::WinDeclined { key, to_pid } => info!(
            key,
            to_pid,
            "won a key that a hand-over to another backend was asked for meanwhile; \
             releasing it to that backend without starting its job"
        ),
        Event::WaitInterrupted { session: s } => debug!(
            session = s.0,
            "the session was waiting on the server and is needed now; reconnecting"
        ),
        Event::WaitFailed { error } => warn!(
            %error,
            "waiting on the server failed; this session polls every retry interval instead"
        ),
        Event::WatchSessionLost { session: s, error } => info!(
            session = s.0,
            error = error.as_ref().map(tracing::field::display),
            "the watch session ended; until it opens again (at the next try), this locker \
             polls for the leases it wants"
        ),
        Event::GroupMembers {
            group,
            members,
            joined,
            left,
        } => info!(
            group = group.name(),
            members = members.len(),
            joined = ?joined,
            left = ?left,
            "lease group membership changed"
        ),
        Event::HandedOver {
            run,
            lease,
            to,
            requested: false,
        } => lease_event!(
            info,
            run,
            lease,
            to_member = to,
            "handing the lease over to the group member that owns it in the share: stopping the \
             job, then releasing the lease"
        ),
        Event::HandedOver { run, lease, to, .. } => lease_event!(
            info,
            run,
            lease,
            to_backend_pid = to,
            "handing the lease over to the backend a hand-over request named, which waits for \
             it: stopping the job, then releasing the lease"
        ),
        Event::HandoverDeclined { key, to } => warn!(
            key,
            to_backend_pid = to,
            "a hand-over was asked for a backend that does not wait for the lease; declined (the job goes on)"
        ),
        Event::NotificationIgnored {
            key,
            sender_pid,
            holder_pid,
        } => debug!(
            key,
            sender_backend_pid = sender_pid,
            holder_backend_pid = holder_pid,
            "a handover notification from another backend than the holder seen; ignored"
        ),
        other => debug!(event = ?other, "lease event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_is_reported_at_once_then_every_interval_with_the_count() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut r = Repeats::default();
        assert_eq!(r.failed(at(0), Failure::Unreachable), Some(1));
        assert_eq!(r.failed(at(1), Failure::Unreachable), None);
        assert_eq!(r.failed(at(29), Failure::Unreachable), None);
        assert_eq!(r.failed(at(30), Failure::Unreachable), Some(3));
        assert_eq!(r.failed(at(31), Failure::Unreachable), None);
        // Another kind of failure is news: at once.
        assert_eq!(r.failed(at(32), Failure::InRecovery), Some(2));
        assert_eq!(r.failed(at(33), Failure::InRecovery), None);
        // A ready session ends the streak: the next failure is logged at once.
        r.ready();
        assert_eq!(r.failed(at(34), Failure::InRecovery), Some(1));
        assert_eq!(r.failed(at(70), Failure::InRecovery), Some(1));
    }
}
