//! The one rule for a session the machine gives up on itself: keep it, and
//! so its locks, until every job on it has returned.
//!
//! When a statement times out, fails or breaks its rules, or a lease's
//! validity ends, the machine no longer trusts the session: every lease on
//! it is lost and every job cancelled at once. But closing the connection
//! then would let the server free the keys while a cancelled job may still
//! act. Keeping the session open costs nothing: its locks still exclude
//! every other session. So the session becomes *doubtful*
//! ([`Session::Doubtful`]):
//!
//! - its leases are lost (jobs cancelled at once, as for any lost session);
//! - nothing is sent on it, and a statement in flight is ignored when it
//!   answers: the session is never treated as healthy again;
//! - no run acquires on it (no try is sent), and a new session for the
//!   standbys opens only after it is closed;
//! - it is closed as soon as no cancelled job is left running, and at the
//!   latest at [`Deadline::DeferredClose`](super::deadline::Deadline::DeferredClose): the send time of its last statement
//!   plus [`Options::guard_timeout`](crate::Options::guard_timeout)
//!   (`idle_session_timeout`), the first moment the server could free its
//!   keys anyway. A job that outlives that deadline is not protected by the
//!   session either way.
//!
//! Without the server guard the server would never free the keys of a
//! silent session, so waiting longer would be possible; the machine still
//! closes at the same deadline, so that a job that ignores its cancellation
//! cannot keep the machine's standbys (other keys) without a session for
//! ever. The promise is the same with and without the guard: a cancelled job
//! that returns within the guard margin of its lease's validity end is never
//! seen beside another holder.
//!
//! A session ended by the server or the connection
//! ([`Input::SessionEnded`](crate::Input::SessionEnded)) is gone at once: it is
//! never doubtful. Neither is one that holds no job: it is closed at once.

use std::time::{Duration, Instant};

use super::knobs::Knobs;
use super::session::{Session, Stage};

/// When the machine gives up on `session` at `now`: the deadline to keep it
/// open until, if it is kept doubtful (a ready session with `jobs_running`,
/// before its deadline: the send time of its last statement `last_sent`
/// plus the `guard` timeout); `None` if it is closed at once.
pub(super) fn keep_until(
    knobs: &Knobs,
    session: &Session,
    jobs_running: bool,
    last_sent: Option<Instant>,
    now: Instant,
    guard: Duration,
) -> Option<Instant> {
    if knobs.close_doubtful_at_once {
        return None;
    }
    // Only a ready session can hold keys for jobs.
    let up = session.up()?;
    if !matches!(up.stage, Stage::Ready { .. }) || !jobs_running {
        return None;
    }
    let close_by = last_sent.unwrap_or(now) + guard;
    // Past the deadline already (the process was frozen): the server may
    // have freed the keys; keeping the session protects nothing.
    (close_by > now).then_some(close_by)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::SessionId;
    use crate::machine::session::Up;

    const GUARD: Duration = Duration::from_secs(10);

    fn ready() -> Session {
        let mut up = Up::new(SessionId(1), 5);
        up.stage = Stage::Ready { backend_pid: 100 };
        Session::Up(up)
    }

    #[test]
    fn a_session_with_running_jobs_is_kept_until_its_last_send_plus_the_guard() {
        let now = Instant::now();
        let sent = now - Duration::from_secs(3);
        let knobs = Knobs::default();
        assert_eq!(
            keep_until(&knobs, &ready(), true, Some(sent), now, GUARD),
            Some(sent + GUARD)
        );
        // Nothing sent yet: from now.
        assert_eq!(
            keep_until(&knobs, &ready(), true, None, now, GUARD),
            Some(now + GUARD)
        );
    }

    #[test]
    fn a_session_is_closed_at_once_when_keeping_it_protects_nothing() {
        let now = Instant::now();
        let knobs = Knobs::default();
        // No job running.
        assert_eq!(
            keep_until(&knobs, &ready(), false, Some(now), now, GUARD),
            None
        );
        // Past the deadline already (the process was frozen).
        let long_ago = now - GUARD - Duration::from_millis(1);
        assert_eq!(
            keep_until(&knobs, &ready(), true, Some(long_ago), now, GUARD),
            None
        );
        // Not ready: it holds no key.
        let setting_up = Session::Up(Up::new(SessionId(1), 5));
        assert_eq!(
            keep_until(&knobs, &setting_up, true, Some(now), now, GUARD),
            None
        );
        assert_eq!(
            keep_until(&knobs, &Session::Idle, true, Some(now), now, GUARD),
            None
        );
        // The broken variant closes it at once.
        let broken = Knobs {
            close_doubtful_at_once: true,
            ..Knobs::default()
        };
        assert_eq!(
            keep_until(&broken, &ready(), true, Some(now), now, GUARD),
            None
        );
    }
}
