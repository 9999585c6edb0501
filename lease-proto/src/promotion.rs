//! A newly promoted primary: what the setup reads about the server's last
//! promotion, and the one rule that holds tries back there.
//!
//! Advisory locks are not replicated: a standby promoted while the old
//! primary is frozen or cut off grants every key at once, while a holder on
//! the old primary goes on acting until its own validity ends (and `lease
//! run`'s command until the guard deadline). The server guard
//! (`idle_session_timeout`) cannot help: it ends sessions only on the server
//! that holds them. So a session on a server that was promoted recently
//! tries no key until [`Options::promotion_hold`](crate::Options::promotion_hold)
//! has passed since the promotion, measured on the promoted server's clock.
//!
//! What a role without any privilege can read (measured on PostgreSQL 15):
//! - `pg_last_wal_receive_lsn()` is non-NULL on a server that asked for
//!   streaming since it started (a standby with `primary_conninfo`, also
//!   after its promotion; it is set when streaming is requested, so also on
//!   a standby restarted while its primary was frozen or gone), and
//!   `pg_last_xact_replay_timestamp()` on one that replayed a commit in
//!   archive recovery or streaming. Both stay NULL after crash recovery (a
//!   crash restart, or a backend crash that makes the postmaster
//!   reinitialise), so a crash costs nothing: it ended every holder's
//!   session anyway. Not covered: a standby fed only by `restore_command`
//!   that replayed no commit since its start, once its promotion's
//!   checkpoint is done.
//! - `pg_control_checkpoint()` gives the latest checkpoint's timeline and
//!   `checkpoint_time` (whole seconds, when the checkpoint started). A
//!   promotion (fast promotion, the default) writes an end-of-recovery WAL
//!   record and then requests a checkpoint; until that checkpoint is done
//!   the latest checkpoint is still the standby's last restartpoint, on the
//!   old timeline (about 0.5 s on an idle server; the checkpoint is not an
//!   immediate one, so with many buffers dirtied by replay it can take up to
//!   `checkpoint_completion_target` x `checkpoint_timeout`: measured more
//!   than 1.5 s after a standby's restart). Every checkpoint on the
//!   new timeline started after the promotion, so its `checkpoint_time + 1 s`
//!   is an upper bound of the promotion instant. (Its `prev_timeline_id`
//!   equals its `timeline_id`: only a non-fast end-of-recovery checkpoint
//!   shows the old timeline there, so that column tells nothing.)
//! - The current WAL timeline (the first 8 hex digits of
//!   `pg_walfile_name(pg_current_wal_lsn())`), to compare with the
//!   checkpoint's.
//!
//! What survives a restart of the promoted server (a fast or immediate
//! restart, or a backend's crash that makes the postmaster reinitialise, as
//! the OOM killer does): only the timeline and its history file. After it,
//! nothing was replayed since the start and the latest checkpoint is on the
//! new timeline, so the two signals above show nothing, while a holder on a
//! frozen old primary may still act.
//! - The current timeline's history file (`0000000N.history` in `pg_wal`,
//!   written by the promotion that began the timeline): its modification
//!   time, read with `pg_ls_waldir()`, which superusers and members of
//!   `pg_monitor` may call. Whole seconds, truncated; the server grants its
//!   first lock moments after it writes the file, so `modification + 2 s` is
//!   an upper bound of the promotion instant.
//! - Without that privilege, on a timeline above 1 (the server, or the
//!   cluster it was copied from, was promoted once), the latest checkpoint
//!   on that timeline is the only bound (every checkpoint on it started
//!   after the promotion): a session set up within the hold after any
//!   checkpoint (one every `checkpoint_timeout`, and one at every restart)
//!   waits the rest of it. Grant `pg_monitor` to the lease's role to read
//!   the promotion's own time instead.
//!
//! The rule ([`PromotionState::hold`]): when the server was promoted since
//! its start, its current timeline is not its latest checkpoint's (a
//! promotion whose checkpoint is pending), or its timeline is above 1 (it
//! was promoted once, maybe before a restart), tries wait until the
//! server's clock has advanced the hold past the earliest known upper
//! bound of the promotion instant: the history file's `modification + 2 s`,
//! the latest checkpoint's `checkpoint_time + 1 s` when it is on the current
//! timeline, or else the setup itself. Both ends are read on the promoted
//! server's clock, so no agreement between clocks is needed, only a server
//! clock that does not step during the hold.

use std::time::Duration;

/// What the setup reads about the server's promotion; see the module docs.
/// The default is a server that was never promoted since its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PromotionState {
    /// WAL was received (`pg_last_wal_receive_lsn()`) or a transaction
    /// replayed (`pg_last_xact_replay_timestamp()`) since the server
    /// started. On a server that is not in recovery: it was promoted since
    /// its start. Crash recovery sets neither.
    pub replayed_since_start: bool,
    /// The timeline of the current WAL; `None` in recovery.
    pub wal_timeline: Option<i64>,
    /// The latest checkpoint's timeline (`pg_control_checkpoint()`).
    pub checkpoint_timeline: Option<i64>,
    /// The server's `clock_timestamp()` minus the latest checkpoint's
    /// `checkpoint_time` (whole seconds, truncated), in ms.
    pub checkpoint_age_ms: Option<i64>,
    /// The server's `clock_timestamp()` minus the modification time of the
    /// current timeline's history file (whole seconds, truncated), in ms;
    /// `None` on timeline 1, without the privilege to read it
    /// (`pg_ls_waldir()`: `pg_monitor`), or when the file is missing.
    pub history_age_ms: Option<i64>,
}

impl PromotionState {
    /// A promotion whose checkpoint is not done yet: the current WAL
    /// timeline is not the latest checkpoint's.
    pub fn checkpoint_pending(&self) -> bool {
        matches!((self.wal_timeline, self.checkpoint_timeline), (Some(w), Some(c)) if w != c)
    }

    /// Whether the server was promoted since its start (or is being).
    pub fn promoted(&self) -> bool {
        self.replayed_since_start || self.checkpoint_pending()
    }

    /// Whether the server was promoted at some time: since its start, or on
    /// a timeline above 1 (a promotion before a restart leaves only that).
    pub fn ever_promoted(&self) -> bool {
        self.promoted() || self.wal_timeline.is_some_and(|t| t > 1)
    }

    /// How long from the setup's reply tries must wait so that `hold` has
    /// passed on the server since the latest instant the promotion can have
    /// happened; `None` when nothing is to wait (never promoted, or long
    /// enough ago).
    ///
    /// The bound is the earliest of: the history file's modification time
    /// plus 2 s (whole seconds, truncated, and the first grant comes moments
    /// after the file is written); the latest checkpoint's
    /// `checkpoint_time + 1 s` (whole seconds, truncated) when that
    /// checkpoint is on the current timeline; else (pending, or neither
    /// readable) the setup itself. Without the history file a checkpoint
    /// after the first one on the new timeline only moves the bound later:
    /// on a server promoted once, every checkpoint holds tries back for up
    /// to `hold` (docs/guarantees.md says what that costs). Never more than
    /// `hold`: the promotion happened before the setup read the server's
    /// state.
    pub fn hold(&self, hold: Duration) -> Option<Duration> {
        if !self.ever_promoted() {
            return None;
        }
        let checkpoint = match self.checkpoint_age_ms {
            Some(age) if !self.checkpoint_pending() => age.saturating_sub(1_000),
            _ => 0,
        };
        let history = self
            .history_age_ms
            .map_or(0, |age| age.saturating_sub(2_000));
        let since_ms = checkpoint.max(history);
        let since = Duration::from_millis(since_ms.max(0) as u64);
        let rest = hold.saturating_sub(since);
        (!rest.is_zero()).then_some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(17);

    fn promoted(age_ms: i64, wal: i64, checkpoint: i64) -> PromotionState {
        PromotionState {
            replayed_since_start: true,
            wal_timeline: Some(wal),
            checkpoint_timeline: Some(checkpoint),
            checkpoint_age_ms: Some(age_ms),
            history_age_ms: None,
        }
    }

    /// A promoted server restarted since (fast, immediate, or a backend's
    /// crash): nothing replayed since the start, the latest checkpoint the
    /// restart's, `checkpoint_ms` ago, on the new timeline 2.
    fn restarted(checkpoint_ms: i64, history_ms: Option<i64>) -> PromotionState {
        PromotionState {
            replayed_since_start: false,
            history_age_ms: history_ms,
            ..promoted(checkpoint_ms, 2, 2)
        }
    }

    #[test]
    fn a_restart_of_a_promoted_server_keeps_the_hold() {
        // The promotion 3 s ago, the restart's checkpoint 300 ms ago: the
        // history file dates the promotion (read with pg_monitor).
        assert_eq!(
            restarted(300, Some(3_000)).hold(HOLD),
            Some(HOLD - Duration::from_millis(1_000))
        );
        // Without the privilege, the restart's checkpoint bounds it.
        assert_eq!(restarted(300, None).hold(HOLD), Some(HOLD));
        assert_eq!(
            restarted(5_000, None).hold(HOLD),
            Some(HOLD - Duration::from_millis(4_000))
        );
        // The earliest bound wins: an old promotion, a fresh checkpoint.
        assert_eq!(restarted(300, Some(3_600_000)).hold(HOLD), None);
        // An old checkpoint on a timeline above 1: nothing to wait.
        assert_eq!(restarted(60_000, None).hold(HOLD), None);
    }

    #[test]
    fn a_server_never_promoted_since_its_start_holds_nothing() {
        assert_eq!(PromotionState::default().hold(HOLD), None);
        // Crash recovery of a server never promoted (timeline 1): the
        // checkpoint is a second old, nothing replayed. (On a timeline above
        // 1 a crash may follow a promotion: see the restart test below.)
        let crashed = PromotionState {
            replayed_since_start: false,
            ..promoted(300, 1, 1)
        };
        assert_eq!(crashed.hold(HOLD), None);
    }

    #[test]
    fn a_pending_checkpoint_holds_for_the_whole_hold() {
        // Still the standby's restartpoint on timeline 1, an hour old.
        assert_eq!(promoted(3_600_000, 2, 1).hold(HOLD), Some(HOLD));
        // Even when nothing was replayed since the start (archive recovery
        // without a commit).
        let archive = PromotionState {
            replayed_since_start: false,
            ..promoted(3_600_000, 2, 1)
        };
        assert_eq!(archive.hold(HOLD), Some(HOLD));
    }

    #[test]
    fn the_checkpoint_bounds_the_promotion_from_above() {
        // Checkpoint started in the second read 2.5 s ago: the promotion was
        // at most 1.5 s ago.
        assert_eq!(
            promoted(2_500, 2, 2).hold(HOLD),
            Some(HOLD - Duration::from_millis(1_500))
        );
        assert_eq!(promoted(18_000, 2, 2).hold(HOLD), None);
        assert_eq!(
            promoted(17_999, 2, 2).hold(HOLD),
            Some(Duration::from_millis(1))
        );
        // A server clock behind the checkpoint (stepped back): the whole hold.
        assert_eq!(promoted(-5_000, 2, 2).hold(HOLD), Some(HOLD));
        // Unreadable checkpoint: the whole hold.
        let unknown = PromotionState {
            checkpoint_age_ms: None,
            checkpoint_timeline: None,
            ..promoted(0, 2, 2)
        };
        assert_eq!(unknown.hold(HOLD), Some(HOLD));
    }
}
