//! One tracing line per core event, with the lease name, key and run as fields.

use lease_proto::Event;

/// Logs a lease event with the lease's name and key and the run.
macro_rules! lease_event {
    ($level:ident, $run:expr, $lease:expr, $($rest:tt)+) => {
        tracing::$level!(lease = $lease.name(), key = $lease.key(), run = $run.0, $($rest)+)
    };
}

/// One log line per event.
pub(crate) fn log_event(event: &Event) {
    use tracing::{debug, error, info, warn};
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
            %error,
            "cannot connect: configuration error (password, role, database or TLS); \
             retrying after a backoff because this locker had sessions before"
        ),
        Event::ConnectFailed {
            session: s,
            error,
            failures,
            ..
        } => warn!(
            session = s.0,
            failures,
            %error,
            "cannot reach the database; retrying after a backoff"
        ),
        Event::SessionLost { session: s, reason } => {
            warn!(session = s.0, %reason, "lease session lost")
        }
        Event::SessionIdle { session: s } => debug!(session = s.0, "lease session idle, closed"),
        Event::Acquired { run, lease, token } => {
            lease_event!(info, run, lease, token, "lease acquired")
        }
        Event::Lost { run, lease, reason } => lease_event!(warn, run, lease, %reason, "lease lost"),
        Event::Released { run, lease } => lease_event!(info, run, lease, "lease released"),
        Event::StandingBy {
            run,
            lease,
            holder_pid: pid,
        } => {
            lease_event!(
                info,
                run,
                lease,
                holder_pid = pid,
                "lease held elsewhere; standing by"
            )
        }
        Event::TryFailed { error } => warn!(%error, "lease try failed; verifying held keys"),
        Event::UnknownKeyReleased { key } => warn!(key, "unlocking a key held without a run"),
        Event::Refused { refusal } => error!(%refusal, "lease setup refused"),
        Event::InRecovery { session: s } => error!(
            session = s.0,
            "the server is a hot standby (in recovery): no lease can be taken there; \
             retrying after a backoff (a failover in progress, or the wrong host)"
        ),
        Event::PromotionHold { session: s, hold } => warn!(
            session = s.0,
            hold_ms = hold.as_millis() as u64,
            "the server was promoted recently: no lease is taken there until the old \
             primary's holders must have stopped"
        ),
        Event::StartupOptionsRejected { session: s, error } => warn!(
            session = s.0,
            %error,
            "the server (a pooler) rejected startup options; applying the session settings \
             by statement and verifying them"
        ),
        Event::KeyFreed { key } => debug!(key, "a wanted key was freed; trying"),
        Event::WaitInterrupted { session: s } => debug!(
            session = s.0,
            "the session was waiting on the server and is needed now; reconnecting"
        ),
        Event::WaitFailed { error } => warn!(
            %error,
            "waiting on the server failed; this session polls every retry interval instead"
        ),
        Event::NotificationIgnored {
            key,
            sender_pid,
            holder_pid,
        } => debug!(
            key,
            sender_pid,
            holder_pid,
            "a handover notification from another backend than the holder seen; ignored"
        ),
        other => debug!(event = ?other, "lease event"),
    }
}
