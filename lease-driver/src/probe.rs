//! The pooler probe ([`SessionCommand::Probe`](lease_proto::SessionCommand::Probe)):
//! a second, short connection to the session's host, behind a pooler that
//! rejected the startup options, that reads the session's nonce.
//!
//! Behind a session-mode pool whose every server connection is taken (a
//! `pool_size` no larger than the lease sessions through it: each holds one
//! for good) the probe's connection waits for a server connection that never
//! frees, and the machine ends the session at its query timeout, "a
//! statement timed out", every attempt, without a word about the pool. So
//! the driver gives the probe a bound of its own, a little shorter than the
//! machine's ([`probe_limit`]), and answers a probe that ran out of it with
//! an error that names the likely cause ([`waited`]): the machine ends the
//! session with that error (a failed probe, as before: the session is not
//! used, the next one probes again after a backoff), so the "lease session
//! lost" line and `Status::last_error` say it.

use std::sync::Arc;
use std::time::Duration;

use lease_proto::reply::Row;
use lease_proto::{SessionError, Statement};
use tokio_postgres::Config;

use crate::hosts;
use crate::runtime::Runtime;

/// The probe's own bound: nine tenths of the machine's `query_timeout` (its
/// bound on the probe), so that the driver's error, which names the cause,
/// comes first; the rest of the query timeout is the margin for the
/// driver's start after the machine's (the same instant, give or take a
/// poll).
pub(crate) fn probe_limit(query_timeout: Duration) -> Duration {
    query_timeout * 9 / 10
}

/// Where a probe that ran out of its bound was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Its connection had not opened (a pooler that needs a server
    /// connection to finish the startup).
    Connecting,
    /// Its connection was open; its statement got no answer (a pooler that
    /// queues the statement for a server connection).
    Statement,
}

/// The error of a probe that got no answer within `limit`.
pub(crate) fn waited(limit: Duration, stage: Stage) -> SessionError {
    let at = match stage {
        Stage::Connecting => "its connection did not open",
        Stage::Statement => "its connection opened, its statement got no answer",
    };
    SessionError::other(format!(
        "the pooler probe (a second connection to the same host, once per session behind a \
         pooler) got no answer within {} ms ({at}): most likely a session pool with no free \
         server connection, where the probe waits for one (each lease session holds one for \
         good: a pool_size no larger than the lease sessions through it); give the pool at \
         least one server connection more than the lease sessions",
        limit.as_millis()
    ))
}

/// The probe: `statement` on a new connection to `host` (the session's host
/// and parameters, `target_session_attrs` off), its rows, or [`waited`]
/// once `limit` has passed.
pub(crate) async fn probe<R: Runtime>(
    runtime: Arc<R>,
    host: Config,
    statement: Statement,
    limit: Duration,
) -> Result<Vec<Row>, SessionError> {
    let deadline = runtime.now() + limit;
    let left = |runtime: &R| deadline.saturating_duration_since(runtime.now());
    let opening = hosts::open(runtime.clone(), vec![host], None);
    let (_, mut session) = hosts::bounded(&*runtime, left(&runtime), opening)
        .await
        .ok_or_else(|| waited(limit, Stage::Connecting))??;
    let reply = session.query(&statement);
    let answer = hosts::alone(&mut *session, reply);
    hosts::bounded(&*runtime, left(&runtime), answer)
        .await
        .ok_or_else(|| waited(limit, Stage::Statement))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_gives_up_before_the_machine_does() {
        let ms = Duration::from_millis;
        assert_eq!(probe_limit(ms(1_000)), ms(900));
        assert_eq!(probe_limit(ms(5_000)), ms(4_500));
        assert!(probe_limit(ms(1)) <= ms(1));
    }

    #[test]
    fn a_probe_that_waited_names_the_full_pool_and_where_it_waited() {
        let connecting = waited(Duration::from_millis(900), Stage::Connecting).to_string();
        let statement = waited(Duration::from_millis(900), Stage::Statement).to_string();
        for e in [&connecting, &statement] {
            assert!(e.contains("pooler probe"), "{e}");
            assert!(e.contains("no free server connection"), "{e}");
            assert!(e.contains("900 ms"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(connecting.contains("did not open"), "{connecting}");
        assert!(statement.contains("got no answer"), "{statement}");
    }
}
