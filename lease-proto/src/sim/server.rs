//! The PostgreSQL model: sessions, re-entrant advisory locks (one database),
//! `pg_locks`, `idle_session_timeout` (asked for by the session, or imposed
//! by the server on silent sessions), `pg_terminate_backend`, restarts,
//! `LISTEN/NOTIFY`, hot-standby mode, lock waits (a [`Statement::Wait`]
//! queues while its key is held by another owner and answers when the key
//! is freed, or with "held" at its `lock_timeout`) and a
//! transaction pooler that moves statements between backends and drops (or
//! rejects) startup options.
//!
//! A client that is not a lease client may hold keys SHARED
//! ([`ServerConfig::foreign_shared_keys`]): tries of them lose, waits for
//! them are granted at once.
//!
//! Not modelled: the microseconds in which a woken waiter's shared lock is
//! granted before its transaction ends (a try arriving then loses; the
//! real-server herd test covers it).
//!
//! The rows of every reply are built in one place, [`reply`], also used by
//! the [`Harness`](super::Harness).

use std::collections::BTreeMap;
use std::time::Duration;

use super::inject::Injected;
use super::net::{Direction, ToClient, ToServer};
use super::{Ev, Fault, ServerConfig, Sim, TraceEvent};
use crate::{reply::Row, QueryId, SessionError, Statement};

/// The rows the server answers each statement with (the wire shapes of
/// `sql.rs`), and the errors it sends.
pub(super) mod reply {
    use crate::{
        reply::{HeartbeatReply, ReleaseReply, Row, SetupReply, TryReply, VerifyReply},
        SessionError,
    };

    /// `Setup`: version, recovery, backend pid, `idle_session_timeout` (ms),
    /// the TCP settings (in the order of `TCP_SETTINGS`), the nonce, what the
    /// server shows of its promotion and its clock (µs).
    #[allow(clippy::too_many_arguments)] // The reply's fields.
    pub(crate) fn setup(
        version: i64,
        standby: bool,
        pid: i64,
        idle_ms: i64,
        tcp_settings: [Option<i64>; 4],
        nonce: Option<i64>,
        promotion: crate::reply::PromotionState,
        server_clock_us: Option<i64>,
    ) -> Vec<Row> {
        SetupReply {
            server_version: version,
            in_recovery: standby,
            backend_pid: pid,
            idle_session_timeout_ms: Some(idle_ms),
            tcp_settings,
            unix_socket: false,
            search_path_catalog: true,
            nonce,
            promotion,
            server_clock_us,
        }
        .to_rows()
    }

    /// `TryLock`: a key won, with the fencing token.
    pub(crate) fn try_won(key: i64, token: i64) -> Row {
        let reply = TryReply {
            won: vec![(key, token)],
            not_won: vec![],
            untrusted: false,
            session: None,
        };
        reply.to_rows().remove(0)
    }

    /// `TryLock`: a key not won, with the holder's pid if known.
    pub(crate) fn try_held(key: i64, holder: Option<i64>) -> Row {
        let reply = TryReply {
            won: vec![],
            not_won: vec![(key, holder)],
            untrusted: false,
            session: None,
        };
        reply.to_rows().remove(0)
    }

    /// `Wait`: the backend pid, the nonce, whether the key was freed and
    /// the session's `deadlock_timeout` (ms).
    pub(crate) fn wait(
        pid: i64,
        nonce: Option<i64>,
        freed: bool,
        deadlock_ms: Option<i64>,
    ) -> Vec<Row> {
        wait_outcome(pid, nonce, deadlock_ms, |r| r.freed = Some(freed))
    }

    /// `Take` that took its key, with `token`.
    pub(crate) fn taken(
        pid: i64,
        nonce: Option<i64>,
        token: i64,
        deadlock_ms: Option<i64>,
    ) -> Vec<Row> {
        wait_outcome(pid, nonce, deadlock_ms, |r| {
            r.freed = Some(true);
            r.token = Some(token);
        })
    }

    /// `Take` that found its key held by its own backend already.
    pub(crate) fn take_held_here(
        pid: i64,
        nonce: Option<i64>,
        deadlock_ms: Option<i64>,
    ) -> Vec<Row> {
        wait_outcome(pid, nonce, deadlock_ms, |r| r.held_here = true)
    }

    /// `Wait` that did not queue: its key had as many waiters as its crowd
    /// limit.
    pub(crate) fn wait_crowded(pid: i64, nonce: Option<i64>, deadlock_ms: Option<i64>) -> Vec<Row> {
        wait_outcome(pid, nonce, deadlock_ms, |r| r.crowded = true)
    }

    /// The rows of a wait's or a take's reply from session `pid` (`nonce`),
    /// its outcome set by `outcome` (not freed unless it says so).
    fn wait_outcome(
        pid: i64,
        nonce: Option<i64>,
        deadlock_ms: Option<i64>,
        outcome: impl FnOnce(&mut crate::reply::WaitReply),
    ) -> Vec<Row> {
        let mut reply = crate::reply::WaitReply {
            session: HeartbeatReply {
                backend_pid: Some(pid),
                nonce,
                server_clock_us: None,
            },
            freed: Some(false),
            deadlock_timeout_ms: deadlock_ms,
            ..Default::default()
        };
        outcome(&mut reply);
        reply.to_rows()
    }

    /// `Heartbeat`: the backend pid and the nonce.
    pub(crate) fn heartbeat(pid: i64, nonce: Option<i64>) -> Vec<Row> {
        heartbeat_at(pid, nonce, None)
    }

    /// `Heartbeat`: the backend pid, the nonce and the server's clock (µs).
    pub(crate) fn heartbeat_at(pid: i64, nonce: Option<i64>, clock_us: Option<i64>) -> Vec<Row> {
        HeartbeatReply {
            backend_pid: Some(pid),
            nonce,
            server_clock_us: clock_us,
        }
        .to_rows()
    }

    /// `Verify`: the backend pid, the nonce, then every key the session holds.
    pub(crate) fn verify(
        pid: i64,
        nonce: Option<i64>,
        keys: impl IntoIterator<Item = i64>,
    ) -> Vec<Row> {
        verify_at(pid, nonce, None, keys)
    }

    /// [`verify`] with the server's clock (µs).
    pub(crate) fn verify_at(
        pid: i64,
        nonce: Option<i64>,
        clock_us: Option<i64>,
        keys: impl IntoIterator<Item = i64>,
    ) -> Vec<Row> {
        VerifyReply {
            session: HeartbeatReply {
                backend_pid: Some(pid),
                nonce,
                server_clock_us: clock_us,
            },
            held: keys.into_iter().collect(),
        }
        .to_rows()
    }

    /// `TryLock`: the session that answered (always the first row).
    pub(crate) fn try_session(pid: i64, nonce: Option<i64>) -> Row {
        vec![None, Some(pid), nonce]
    }

    /// `Release`: whether the session held the key.
    pub(crate) fn release(key: i64, held: bool) -> Row {
        ReleaseReply {
            unlocked: vec![(key, held)],
        }
        .to_rows()
        .remove(0)
    }

    /// `Listen` on a hot standby.
    pub(crate) fn listen_in_recovery() -> SessionError {
        SessionError {
            code: Some("25006".into()),
            message: "cannot execute LISTEN during recovery".into(),
            config: false,
        }
    }
}

/// A statement the server ran.
#[derive(Debug)]
pub(super) struct Executed {
    /// When it is done (the reply leaves then).
    pub(super) done: Duration,
    pub(super) result: Result<Vec<Row>, SessionError>,
    /// Keys whose release notifies listeners, in order.
    /// Payloads of the `NOTIFY`s it sent on the handover channel.
    pub(super) notify: Vec<String>,
    /// A wait that blocks: its key and lock timeout; no reply yet.
    pub(super) blocks: Option<(i64, Duration)>,
    /// Keys a try was granted, with the fencing token (the order in which
    /// tokens must increase: see [`Violation::TokenNotIncreasing`](super::Violation)).
    pub(super) granted: Vec<(i64, i64)>,
}

/// A [`Statement::Wait`] queued behind a held key.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) conn: u64,
    pub(super) p: usize,
    pub(super) query: QueryId,
    pub(super) key: i64,
    /// A [`Statement::Take`]: granted the key exclusively when it is free.
    pub(super) take: bool,
    /// The fault drawn for the statement, applied to its reply.
    pub(super) injected: Injected,
    /// When its lock wait began (see [`ServerConfig::deadlock_timeout`]).
    pub(super) since: Duration,
    /// A watch session's wait: the lease session it names in its
    /// `application_name` meanwhile ([`Statement::Wait`]).
    pub(super) watch_of: Option<i64>,
}

impl Waiter {
    /// The reply the client gets when the wait's statement answers with
    /// `rows` (woken, or its lock timeout caught): the fault drawn for it
    /// applied as to any wait's reply.
    fn reply(&self, rows: Vec<Row>) -> Result<Vec<Row>, SessionError> {
        let wait = Statement::Wait {
            key: self.key,
            timeout_ms: 0,
            crowd: None,
            watch_of: None,
        };
        let (result, _) = self.injected.reply(&wait, Ok(rows), Vec::new());
        result
    }
}

/// A queued wait the server answers now (see [`Server::woken`]).
#[derive(Debug)]
pub(super) struct Woken {
    pub(super) waiter: Waiter,
    /// Its reply's rows.
    pub(super) rows: Vec<Row>,
    /// When its backend runs: its reply leaves then.
    pub(super) runs_at: Duration,
    /// A take's key and fencing token.
    pub(super) granted: Option<(i64, i64)>,
}

/// How long after a promotion the promoted server's first checkpoint is done
/// (about 0.5 s measured on an idle PostgreSQL 15).
pub const PROMOTION_CHECKPOINT: Duration = Duration::from_millis(500);

/// How far the server's wall clock is ahead of the simulation's time, for
/// the whole seconds of `checkpoint_time`.
pub(crate) const WALL_OFFSET: Duration = Duration::from_millis(370);

/// The backend pid of the client of [`ServerConfig::foreign_shared_keys`].
const FOREIGN_SHARED_PID: i64 = 998;
/// The backend pid of the client that sends [`Fault::ForgedNotify`](super::Fault::ForgedNotify).
pub(super) const FORGER_PID: i64 = 997;

/// The lock owner of the shared backend of [`ServerConfig::pooler_one_backend`].
const SHARED_BACKEND: u64 = u64::MAX;
/// Its backend pid.
const SHARED_BACKEND_PID: i64 = 999;

/// The `idle_session_timeout` of these settings, if on.
fn idle_timeout_of(settings: &BTreeMap<&'static str, String>) -> Option<Duration> {
    (settings.get("idle_session_timeout"))
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// One server session (backend).
#[derive(Debug)]
pub(super) struct SrvSession {
    pub(super) p: usize,
    pub(super) pid: i64,
    /// Settings the session applied (startup options, setup statement).
    settings: BTreeMap<&'static str, String>,
    /// `lease.nonce` of this backend.
    nonce: Option<i64>,
    idle_timeout: Option<Duration>,
    /// When the last statement (or the connection) arrived from the client.
    last_heard: Duration,
    busy_until: Duration,
    /// The last statement that did not block, and when the server is done
    /// with it: in flight until then.
    in_flight: Option<(QueryId, Duration)>,
    listening: bool,
    statements: u64,
}

/// The server's state.
#[derive(Debug)]
pub(super) struct Server {
    cfg: ServerConfig,
    pub(super) up: bool,
    sessions: BTreeMap<u64, SrvSession>,
    /// key → (owner conn, re-entrancy count)
    locks: BTreeMap<i64, (u64, u32)>,
    /// Lease-group member locks: (group id, owner conn), the two-int space.
    /// With how many joins each is held (a join is a `pg_try_advisory_lock`,
    /// re-entrant: a second join of a group needs two leaves).
    members: BTreeMap<(u32, u64), u32>,
    /// Member locks `(group id, n)` a non-lease client holds on its own
    /// backend, whose pid is not `n` ([`super::Fault::ForgedMember`]).
    pub(super) forged_members: std::collections::BTreeSet<(u32, i64)>,
    /// [`super::Mutation::ForgedMemberCounted`]: the membership read counts them.
    count_forged_members: bool,
    /// Waits queued behind held keys, in arrival order.
    waiters: Vec<Waiter>,
    /// key → owners of shared locks kept by waits (only with
    /// [`ServerConfig::wait_keeps_shared_lock`]).
    shared: BTreeMap<i64, std::collections::BTreeSet<u64>>,
    /// Shared locks of woken waits whose backends have not run yet (see
    /// [`ServerConfig::woken_backend_lag`]): (key, owner, until).
    woken_shared: Vec<(i64, u64, Duration)>,
    /// Notifications for listening sessions blocked in a wait, as
    /// `(payload, sender pid)`: PostgreSQL delivers them between
    /// transactions, so after the wait's reply (see [`Server::hold_notification`]).
    held_notifications: BTreeMap<u64, Vec<(String, i64)>>,
    next_pid: i64,
    /// The last transaction id assigned (only the broken
    /// [`ServerConfig::legacy_tokens`] assign any).
    next_xid: i64,
    /// The last transaction id flushed to the WAL: a crash goes back to it.
    flushed_xid: i64,
    /// The server's clock minus the simulation's, in microseconds: stepped
    /// back by [`ServerConfig::clock_step_back`] at every crash and promotion.
    clock_skew_us: i64,
    /// The last clock reading of a winning try since the clock was last
    /// stepped (see [`Server::clock_token`]).
    last_clock_us: Option<i64>,
    /// The WAL timeline: one more at every promotion.
    timeline: i64,
    /// When the server was last promoted (see [`crate::reply::PromotionState`]).
    promoted_at: Option<Duration>,
    /// When the server last went down for a restart or a crash (its
    /// checkpoint then: a shutdown checkpoint, or crash recovery's).
    restarted_at: Option<Duration>,
    /// `lease.nonce` of the one backend of [`ServerConfig::pooler_one_backend`].
    backend_nonce: Option<i64>,
    /// Added processing time of every statement now.
    pub(super) slow: Duration,
    /// [`Fault::AuthFailing`](super::Fault::AuthFailing) windows in force:
    /// connection attempts fail authentication.
    pub(super) auth_failing: u32,
}

impl Server {
    pub(super) fn new(cfg: ServerConfig) -> Server {
        Server {
            cfg,
            up: true,
            sessions: BTreeMap::new(),
            locks: BTreeMap::new(),
            members: Default::default(),
            forged_members: Default::default(),
            count_forged_members: false,
            waiters: Vec::new(),
            shared: BTreeMap::new(),
            woken_shared: Vec::new(),
            held_notifications: BTreeMap::new(),
            next_pid: 1000,
            next_xid: 700,
            flushed_xid: 700,
            clock_skew_us: 0,
            last_clock_us: None,
            timeline: 1,
            promoted_at: None,
            restarted_at: None,
            backend_nonce: None,
            slow: Duration::ZERO,
            auth_failing: 0,
        }
    }

    /// Who owns the locks `conn` takes: the connection, or the one backend
    /// every client shares behind [`ServerConfig::pooler_one_backend`].
    fn owner(&self, conn: u64) -> u64 {
        if self.cfg.pooler_one_backend {
            SHARED_BACKEND
        } else {
            conn
        }
    }

    /// [`super::Mutation::ForgedMemberCounted`] if `on`.
    pub(super) fn counting_forged_members(mut self, on: bool) -> Server {
        self.count_forged_members = on;
        self
    }

    /// The backend pid of a lock owner.
    fn owner_pid(&self, owner: u64) -> Option<i64> {
        if owner == SHARED_BACKEND {
            return Some(SHARED_BACKEND_PID);
        }
        self.sessions.get(&owner).map(|s| s.pid)
    }

    /// A restart at `now`: the server goes down, and what the setup shows
    /// of a promotion before it is only the timeline, its history file and
    /// the restart's checkpoint.
    pub(super) fn restart(&mut self, now: Duration) {
        self.up = false;
        self.restarted_at = Some(now);
        self.forged_members.clear();
    }

    /// A crash at `now`: a restart that forgets unflushed transaction ids;
    /// its clock may come back behind ([`ServerConfig::clock_step_back`]).
    pub(super) fn crash(&mut self, now: Duration) {
        self.restart(now);
        self.next_xid = self.flushed_xid;
        self.step_clock();
    }

    /// A promotion of a replica that missed the last `lag` transaction ids,
    /// on another machine whose clock may be behind
    /// ([`ServerConfig::clock_step_back`]): a new timeline; a hot standby
    /// becomes the primary.
    pub(super) fn promote(&mut self, lag: u32, now: Duration) {
        self.up = false;
        self.forged_members.clear();
        self.timeline += 1;
        self.promoted_at = Some(now);
        let replicated = (self.flushed_xid - i64::from(lag)).max(0);
        self.next_xid = replicated;
        self.flushed_xid = replicated;
        self.step_clock();
        self.cfg.standby = false;
    }

    /// A promotion while the old primary is frozen or cut off from every
    /// client ([`Fault::PromoteFrozenPrimary`](super::Fault::PromoteFrozenPrimary)):
    /// this server becomes the replica promoted at `now`. The old primary's
    /// sessions are forgotten without a word (their clients' connections
    /// stay open, nothing answers on them, no timeout of the old server ends
    /// them), its locks are not here (advisory locks are not replicated),
    /// and new connections reach the promoted server at once.
    pub(super) fn promote_frozen(&mut self, lag: u32, now: Duration) {
        self.sessions.clear();
        self.locks.clear();
        self.members.clear();
        self.waiters.clear();
        self.shared.clear();
        self.backend_nonce = None;
        self.promote(lag, now);
        self.up = true;
    }

    /// What the setup reads of the server's promotion at `now` (see
    /// [`crate::reply::PromotionState`]): a promoted server's checkpoint on its new
    /// timeline is done [`PROMOTION_CHECKPOINT`] after the promotion (until
    /// then the latest checkpoint is on the old timeline);
    /// `checkpoint_time` has whole seconds of a wall clock
    /// [`WALL_OFFSET`] ahead of the simulation's.
    ///
    /// A restart or crash after the promotion ([`Server::restart`]) ends
    /// what shows a promotion since the start: nothing was replayed since,
    /// and the latest checkpoint is the restart's, on the new timeline. The
    /// history file's time is read when [`ServerConfig::history_readable`].
    fn promotion_state(&self, now: Duration) -> crate::reply::PromotionState {
        let wall = |d: Duration| (d + WALL_OFFSET).as_millis() as i64;
        let age = |d: Duration| wall(now) - wall(d) / 1000 * 1000;
        let history_age_ms = (self.promoted_at)
            .filter(|_| self.cfg.history_readable)
            .map(age);
        let since_start =
            (self.promoted_at).filter(|at| self.restarted_at.is_none_or(|r| *at >= r));
        let Some(at) = since_start else {
            let checkpoint = self.restarted_at.map_or(0, age);
            return crate::reply::PromotionState {
                wal_timeline: Some(self.timeline),
                checkpoint_timeline: Some(self.timeline),
                checkpoint_age_ms: Some(checkpoint),
                history_age_ms,
                ..Default::default()
            };
        };
        let done = at + PROMOTION_CHECKPOINT;
        let (timeline, started) = if now >= done {
            (self.timeline, done)
        } else {
            (self.timeline - 1, Duration::ZERO)
        };
        crate::reply::PromotionState {
            replayed_since_start: true,
            wal_timeline: Some(self.timeline),
            checkpoint_timeline: Some(timeline),
            checkpoint_age_ms: Some(age(started)),
            history_age_ms,
        }
    }

    fn step_clock(&mut self) {
        self.step_clock_back(self.cfg.clock_step_back);
    }

    /// The server's clock steps back by `by` now (see
    /// [`Postgres::step_clock_back`](super::Postgres::step_clock_back)).
    pub(super) fn step_clock_back(&mut self, by: Duration) {
        self.clock_skew_us -= by.as_micros() as i64;
        self.last_clock_us = None;
    }

    /// The fencing token of a try that won at `now` (see
    /// [`Statement::TryLock`]): [`crate::server::TOKEN_CLOCK_OFFSET`] plus the
    /// server's clock in microseconds. Two winning tries of one key are
    /// causally ordered (the first holder's unlock, after its client got the
    /// reply, comes between them), so a real clock that is not stepped reads
    /// at least a round trip later at the second; the simulation's latency
    /// may be zero, which no network has, so a reading is at least one
    /// microsecond above the previous one since the clock was last stepped.
    fn clock_token(&mut self, now: Duration) -> i64 {
        let mut us = now.as_micros() as i64 + self.clock_skew_us;
        if let Some(last) = self.last_clock_us {
            us = us.max(last + 1);
        }
        self.last_clock_us = Some(us);
        crate::sql::TOKEN_CLOCK_OFFSET + us
    }

    /// The server's clock at `now` in fencing-token units, read without
    /// taking a token (a release's moment in its notification).
    pub(super) fn clock_now(&self, now: Duration) -> i64 {
        crate::sql::TOKEN_CLOCK_OFFSET + now.as_micros() as i64 + self.clock_skew_us
    }

    /// The `deadlock_timeout` a wait's reply reports (ms): none from the
    /// statement before the fix.
    pub(super) fn reported_deadlock_timeout(&self) -> Option<i64> {
        (!self.cfg.wait_ignores_deadlock_timeout)
            .then_some(self.cfg.deadlock_timeout.as_millis() as i64)
    }

    /// The advisory keys held now.
    pub(super) fn held_keys(&self) -> Vec<i64> {
        self.locks.keys().copied().collect()
    }

    /// Connections of `p`'s sessions (`None`: every session).
    pub(super) fn sessions_of(&self, p: Option<usize>) -> Vec<u64> {
        self.sessions
            .iter()
            .filter(|(_, s)| p.is_none_or(|p| s.p == p))
            .map(|(c, _)| *c)
            .collect()
    }

    /// The process of a session.
    pub(super) fn process_of(&self, conn: u64) -> Option<usize> {
        self.sessions.get(&conn).map(|s| s.p)
    }

    /// The checks every new backend passes first, a session's or a probe's:
    /// the server is up and authentication does not fail.
    fn admit(&self) -> Result<(), SessionError> {
        if !self.up {
            return Err(refuse("08006", "connection refused"));
        }
        if self.auth_failing > 0 {
            return Err(refuse(
                "28P01",
                "password authentication failed for user \"sim\"",
            ));
        }
        Ok(())
    }

    /// A connection attempt: the session, or the error the client gets.
    pub(super) fn connect(
        &mut self,
        conn: u64,
        p: usize,
        settings: &[(&'static str, String)],
        now: Duration,
    ) -> Result<(), SessionError> {
        self.admit()?;
        if self.cfg.pooler && self.cfg.pooler_rejects_options && !settings.is_empty() {
            return Err(refuse("08P01", "unsupported startup parameter: options"));
        }
        // PostgreSQL 13 and older reject the server guard's setting (new in 14) in the
        // startup packet; a pooler drops startup options instead (below).
        if !self.cfg.pooler {
            if let Some(name) = unknown_setting(self.cfg.version, settings) {
                return Err(unrecognized(name));
            }
        }
        // A pooler drops startup options.
        let settings: BTreeMap<&'static str, String> = if self.cfg.pooler {
            BTreeMap::new()
        } else {
            settings.iter().cloned().collect()
        };
        self.next_pid += 1;
        let pid = if self.cfg.pooler_one_backend {
            SHARED_BACKEND_PID
        } else {
            self.next_pid
        };
        self.sessions.insert(
            conn,
            SrvSession {
                p,
                pid,
                idle_timeout: idle_timeout_of(&settings),
                settings,
                nonce: None,
                last_heard: now,
                busy_until: now,
                in_flight: None,
                listening: false,
                statements: 0,
            },
        );
        Ok(())
    }

    /// A second, short connection that runs `statement` (a
    /// [`Statement::Heartbeat`]: pid and nonce) and closes: on a fresh
    /// backend, or behind [`ServerConfig::pooler_one_backend`] on the one
    /// shared backend, whose nonce is whatever a setup set last.
    pub(super) fn probe(&mut self, statement: &Statement) -> Result<Vec<Row>, SessionError> {
        self.admit()?;
        if !matches!(statement, Statement::Heartbeat) {
            return Err(refuse(
                "0A000",
                "the simulator probes with a heartbeat only",
            ));
        }
        self.next_pid += 1;
        Ok(if self.cfg.pooler_one_backend {
            reply::heartbeat(SHARED_BACKEND_PID, self.backend_nonce)
        } else {
            reply::heartbeat(self.next_pid, None)
        })
    }

    /// When the session is ended as idle if nothing else happens: the
    /// session's own timeout or the server's silent-session kill, whichever
    /// is shorter.
    pub(super) fn idle_deadline(&self, conn: u64) -> Option<Duration> {
        let s = self.sessions.get(&conn)?;
        let limit = match (s.idle_timeout, self.cfg.silent_session_kill) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(s.busy_until + limit)
    }

    /// How long the server's TCP waits for a silent client of `conn`: the
    /// session's own settings, or the server's.
    pub(super) fn tcp_give_up(&self, conn: u64) -> Option<Duration> {
        let s = self.sessions.get(&conn)?;
        let own = |name: &str| s.settings.get(name).and_then(|v| v.parse::<u64>().ok());
        match (own("tcp_user_timeout"), own("tcp_keepalives_idle")) {
            (Some(user_ms), Some(idle_s)) if user_ms > 0 || idle_s > 0 => {
                Some(Duration::from_millis(user_ms).max(Duration::from_secs(idle_s)))
            }
            _ => self.cfg.tcp_give_up,
        }
    }

    /// When the server's TCP gives up on `conn` if its client stays silent.
    pub(super) fn tcp_deadline(&self, conn: u64) -> Option<Duration> {
        let s = self.sessions.get(&conn)?;
        Some(s.last_heard + self.tcp_give_up(conn)?)
    }

    /// Runs one statement on `conn`.
    pub(super) fn execute(
        &mut self,
        conn: u64,
        now: Duration,
        statement: &Statement,
    ) -> Option<Executed> {
        let owner = self.owner(conn);
        let shared = self.cfg.pooler_one_backend;
        let s = self.sessions.get_mut(&conn)?;
        s.last_heard = now;
        s.statements += 1;
        let stmt_no = s.statements;
        let done = now.max(s.busy_until) + self.slow;
        s.busy_until = done;
        // One server connection cannot move statements between backends.
        let pid = if self.cfg.pooler && !shared {
            s.pid + (stmt_no % 2) as i64 * 7919
        } else {
            s.pid
        };
        let mut notify = Vec::new();
        let mut granted = Vec::new();
        let rows = match statement {
            Statement::Setup { nonce, settings } => {
                // Its first statement sets the settings: one the server does not know
                // fails the whole setup, as `set_config` does.
                if let Some(name) = unknown_setting(self.cfg.version, settings) {
                    return Some(Executed {
                        done,
                        result: Err(unrecognized(name)),
                        notify,
                        blocks: None,
                        granted,
                    });
                }
                s.nonce = Some(*nonce);
                if shared {
                    self.backend_nonce = s.nonce;
                }
                for (name, value) in settings {
                    s.settings.insert(name, value.clone());
                }
                s.idle_timeout = idle_timeout_of(&s.settings);
                let ist = s.idle_timeout.map_or(0, |d| d.as_millis() as i64);
                // What the server reports: the session's own value, or the
                // server's default (PostgreSQL's are 0, 7200, 75, 9).
                let defaults = [0, 7200, 75, 9];
                let tcp = std::array::from_fn(|i| {
                    let name = crate::sql::TCP_SETTINGS[i];
                    let own = s.settings.get(name).and_then(|v| v.parse().ok());
                    Some(own.unwrap_or(defaults[i]))
                });
                let promotion = self.promotion_state(now);
                let s = self.sessions.get(&conn)?;
                let standby = self.cfg.standby;
                let clock = Some(self.clock_now(now) - crate::sql::TOKEN_CLOCK_OFFSET);
                reply::setup(
                    self.cfg.version,
                    standby,
                    pid,
                    ist,
                    tcp,
                    s.nonce,
                    promotion,
                    clock,
                )
            }
            Statement::Listen => {
                if self.cfg.standby {
                    let result = Err(reply::listen_in_recovery());
                    return Some(Executed {
                        done,
                        result,
                        notify,
                        blocks: None,
                        granted: Vec::new(),
                    });
                }
                s.listening = true;
                vec![]
            }
            Statement::TryLock {
                keys,
                backend_pid,
                nonce,
            } => {
                // The statement's own checks: this backend and this nonce,
                // or nothing is tried; a key this backend holds is not tried.
                let nonce_now = if shared { self.backend_nonce } else { s.nonce };
                let ok = pid == *backend_pid && nonce_now == Some(*nonce);
                let mut won = Vec::new();
                let mut lost = Vec::new();
                let mut foreign = Vec::new();
                for &k in keys {
                    if self.cfg.foreign_shared_keys.contains(&k) {
                        // Held shared by a foreign client: an exclusive try loses.
                        foreign.push(k);
                        continue;
                    }
                    let shared_by_other = self.shared_by_others(owner, k, now).is_some();
                    match self.locks.get(&k) {
                        None if shared_by_other => lost.push((k, None)),
                        None if ok => {
                            self.locks.insert(k, (owner, 1));
                            won.push(k);
                        }
                        None => lost.push((k, None)),
                        Some((owner, _)) => lost.push((k, Some(*owner))),
                    }
                }
                let nonce = nonce_now;
                let mut token = 0;
                if !won.is_empty() {
                    token = if self.cfg.legacy_tokens {
                        self.next_xid += 1;
                        self.next_xid
                    } else {
                        self.clock_token(now)
                    };
                }
                granted.extend(won.iter().map(|k| (*k, token)));
                let mut rows = vec![reply::try_session(pid, nonce)];
                rows.extend(won.into_iter().map(|k| reply::try_won(k, token)));
                for (k, owner) in lost {
                    let holder = owner.and_then(|o| self.owner_pid(o));
                    rows.push(reply::try_held(k, holder));
                }
                for k in foreign {
                    rows.push(reply::try_held(k, Some(FOREIGN_SHARED_PID)));
                }
                rows
            }
            Statement::Wait {
                key,
                timeout_ms,
                crowd,
                ..
            } => {
                let nonce = if shared { self.backend_nonce } else { s.nonce };
                let deadlock_ms = self.cfg.deadlock_timeout.as_millis() as i64;
                // The crowd check: the waiters queued for the key by a
                // backend with a smaller pid (in pg_locks: ungranted locks
                // on it), before anything else.
                let queued = (self.waiters.iter())
                    .filter(|w| w.key == *key)
                    .filter(|w| self.sessions.get(&w.conn).is_some_and(|o| o.pid < pid))
                    .count();
                if crowd.is_some_and(|n| queued >= n as usize) {
                    reply::wait_crowded(pid, nonce, self.reported_deadlock_timeout())
                } else {
                    let rows = reply::wait(pid, nonce, true, self.reported_deadlock_timeout());
                    if self.locks.get(key).is_some_and(|(o, _)| *o != owner) {
                        // The statement's lock timeout: cut below deadlock_timeout.
                        let limit = crate::sql::wait_limit_ms(deadlock_ms) as u64;
                        let ms = if self.cfg.wait_ignores_deadlock_timeout {
                            *timeout_ms
                        } else {
                            (*timeout_ms).min(limit)
                        };
                        let timeout = Duration::from_millis(ms);
                        return Some(Executed {
                            done,
                            result: Ok(rows),
                            notify,
                            blocks: Some((*key, timeout)),
                            granted: Vec::new(),
                        });
                    }
                    if self.cfg.wait_keeps_shared_lock {
                        self.shared.entry(*key).or_default().insert(owner);
                    }
                    rows
                }
            }
            // A wait that takes the key: granted at once when it is free
            // (its reply leaves once the shared locks of waits the last
            // release woke are gone, the lock being its own from now: a try
            // loses to either), else queued, granted at the release before
            // any waiter behind it.
            Statement::Take {
                key,
                timeout_ms,
                crowd,
                backend_pid,
                nonce: asked,
            } => {
                let nonce = if shared { self.backend_nonce } else { s.nonce };
                let deadlock = self.reported_deadlock_timeout();
                let deadlock_ms = self.cfg.deadlock_timeout.as_millis() as i64;
                let queued = (self.waiters.iter())
                    .filter(|w| w.key == *key)
                    .filter(|w| self.sessions.get(&w.conn).is_some_and(|o| o.pid < pid))
                    .count();
                let shared_until = self.shared_by_others(owner, *key, now);
                let shared_here = (self.shared.get(key)).is_some_and(|o| o.contains(&owner));
                if crowd.is_some_and(|n| queued >= n as usize) {
                    reply::wait_crowded(pid, nonce, deadlock)
                } else if pid != *backend_pid || nonce != Some(*asked) {
                    reply::wait(pid, nonce, false, deadlock)
                } else if self.locks.get(key).is_some_and(|(o, _)| *o == owner) || shared_here {
                    reply::take_held_here(pid, nonce, deadlock)
                } else if self.locks.contains_key(key)
                    || self.cfg.foreign_shared_keys.contains(key)
                    || shared_until == Some(Duration::MAX)
                {
                    let limit = crate::sql::wait_limit_ms(deadlock_ms) as u64;
                    let ms = if self.cfg.wait_ignores_deadlock_timeout {
                        *timeout_ms
                    } else {
                        (*timeout_ms).min(limit)
                    };
                    return Some(Executed {
                        done,
                        result: Ok(Vec::new()),
                        notify,
                        blocks: Some((*key, Duration::from_millis(ms))),
                        granted: Vec::new(),
                    });
                } else {
                    self.locks.insert(*key, (owner, 1));
                    let token = self.clock_token(now);
                    granted.push((*key, token));
                    let done = done.max(shared_until.unwrap_or_default());
                    if let Some(s) = self.sessions.get_mut(&conn) {
                        s.busy_until = done;
                    }
                    return Some(Executed {
                        done,
                        result: Ok(reply::taken(pid, nonce, token, deadlock)),
                        notify,
                        blocks: None,
                        granted,
                    });
                }
            }
            // A heartbeat that notifies (sent at commit, as the others); its
            // reply has no clock row.
            Statement::Prefer { key, priority } => {
                if !self.cfg.standby {
                    notify.push(format!("prefer {key} {pid} {priority}"));
                }
                let nonce = if shared { self.backend_nonce } else { s.nonce };
                reply::heartbeat(pid, nonce)
            }
            // A heartbeat that reads who waits for the asked keys: an
            // ungranted lock in pg_locks, a queued wait or take.
            Statement::CheckHandover { asks } => {
                let nonce = if shared { self.backend_nonce } else { s.nonce };
                let clock = Some(self.clock_now(now) - crate::sql::TOKEN_CLOCK_OFFSET);
                let reply = crate::reply::CheckReply {
                    session: crate::reply::HeartbeatReply {
                        backend_pid: Some(pid),
                        nonce,
                        server_clock_us: clock,
                    },
                    waiting: Default::default(),
                };
                let mut reply = reply;
                let mut done_keys = Vec::new();
                for (i, &(k, p)) in asks.iter().enumerate() {
                    // The named backend first, else a watch session whose
                    // wait names it (its `application_name`).
                    let watch_of_p = (self.waiters.iter())
                        .filter(|w| w.key == k && w.watch_of == Some(p))
                        .find_map(|w| self.sessions.get(&w.conn).map(|s| s.pid));
                    let waiting = if self.waits_for(k, p) {
                        Some(p)
                    } else {
                        watch_of_p
                    };
                    let Some(w) = waiting.filter(|_| !done_keys.contains(&k)) else {
                        continue;
                    };
                    done_keys.push(k);
                    reply.waiting.insert(i as i64 + 1, w);
                    if !self.cfg.standby {
                        notify.push(crate::server::handover_request_payload(k, w));
                    }
                }
                reply.to_rows()
            }
            // No pg_locks read: what the session holds is not asked.
            Statement::Heartbeat => {
                let nonce = if shared { self.backend_nonce } else { s.nonce };
                let clock = Some(self.clock_now(now) - crate::sql::TOKEN_CLOCK_OFFSET);
                reply::heartbeat_at(pid, nonce, clock)
            }
            Statement::Verify => {
                let held = self
                    .locks
                    .iter()
                    .filter(|(_, (o, _))| *o == owner)
                    .map(|(k, _)| *k);
                let nonce = if shared { self.backend_nonce } else { s.nonce };
                let clock = Some(self.clock_now(now) - crate::sql::TOKEN_CLOCK_OFFSET);
                reply::verify_at(pid, nonce, clock, held)
            }
            // Member locks: the two-int space (`objsubid` 2), apart from
            // the keys; taken by a try (never contended: the second half is
            // the session's own pid), freed with the session.
            Statement::Members {
                join,
                leave,
                groups,
                keys,
                notify: n,
                announce,
                claims,
            } => {
                if *n && !self.cfg.standby {
                    notify.extend(claims.iter().map(|k| format!("claim {k} {pid}")));
                    notify.extend(announce.iter().map(|g| format!("group {g}")));
                }
                for g in join {
                    *self.members.entry((*g, owner)).or_insert(0) += 1;
                    if *n && !self.cfg.standby {
                        notify.push(format!("group {g}"));
                    }
                }
                for g in leave {
                    if let Some(n) = self.members.get_mut(&(*g, owner)) {
                        *n -= 1;
                        if *n == 0 {
                            self.members.remove(&(*g, owner));
                        }
                    }
                }
                let mut reply = crate::reply::MembersReply {
                    backend_pid: Some(pid),
                    nonce: if shared { self.backend_nonce } else { s.nonce },
                    ..Default::default()
                };
                for (g, o) in self.members.keys() {
                    if groups.contains(g) {
                        if let Some(member) = self.owner_pid(*o) {
                            reply.members.insert((*g, member));
                        }
                    }
                }
                if self.count_forged_members {
                    let forged = self.forged_members.iter();
                    reply
                        .members
                        .extend(forged.filter(|(g, _)| groups.contains(g)));
                }
                for k in keys {
                    let holder = self.locks.get(k).and_then(|(o, _)| self.owner_pid(*o));
                    reply.holders.push((*k, holder));
                }
                reply.to_rows()
            }
            Statement::Release {
                keys,
                notify: n,
                reserved,
            } => {
                let mut rows = Vec::new();
                for &k in keys {
                    let freed = match self.locks.get_mut(&k) {
                        Some((o, count)) if *o == owner => {
                            *count -= 1;
                            Some(*count == 0)
                        }
                        _ => None,
                    };
                    if freed == Some(true) {
                        self.locks.remove(&k);
                    }
                    if *n && freed.is_some() {
                        // The first take in a freed key's queue is granted it
                        // now (see `woken`), and its backend is named: at once
                        // if it is first; behind the waits queued before it
                        // once their transactions end, which a woken wait's
                        // backend does in microseconds on an idle server,
                        // before this statement reads `pg_locks` (measured:
                        // PostgreSQL 15 and 18 name it), unless their shared
                        // locks stay (a backend that runs late, a foreign
                        // shared holder, the broken wait that keeps its lock).
                        let queue: Vec<&Waiter> = (self.waiters.iter())
                            .filter(|_| freed == Some(true))
                            .filter(|w| w.key == k && self.sessions.contains_key(&w.conn))
                            .collect();
                        let ahead = queue.iter().take_while(|w| !w.take).count();
                        let kept = self.cfg.foreign_shared_keys.contains(&k)
                            || (ahead > 0 && self.cfg.wait_keeps_shared_lock)
                            || (ahead > 1 && !self.cfg.woken_backend_lag.is_zero());
                        let grantee = (queue.get(ahead).filter(|_| !kept))
                            .and_then(|w| self.sessions.get(&w.conn))
                            .map(|s| s.pid);
                        // Named only if the backend holds or waits for the
                        // key, or, confirmed moments ago, is connected.
                        let connected =
                            |p: i64| (self.sessions.values()).any(|s| s.pid != 0 && s.pid == p);
                        let holds = |p: i64| {
                            (self.locks.get(&k))
                                .is_some_and(|(o, _)| self.owner_pid(*o).is_some_and(|o| o == p))
                        };
                        let to = (reserved.iter())
                            .find(|&&(rk, p, recent)| {
                                rk == k
                                    && (grantee == Some(p)
                                        || holds(p)
                                        || self.waits_for(k, p)
                                        || (recent == 1 && connected(p)))
                            })
                            .map(|&(_, p, _)| p);
                        let tail = match (grantee, to) {
                            (g, Some(to)) => format!(" {} {to}", g.unwrap_or(0)),
                            (Some(g), None) => format!(" {g}"),
                            (None, None) => String::new(),
                        };
                        notify.push(format!("{k} {}{tail}", self.clock_now(now)));
                    }
                    let held = freed.is_some();
                    rows.push(reply::release(k, held));
                }
                rows
            }
        };
        // A transaction's notifications of one payload reach a listener once.
        let mut sent = std::collections::BTreeSet::new();
        notify.retain(|payload| sent.insert(payload.clone()));
        Some(Executed {
            done,
            result: Ok(rows),
            notify,
            blocks: None,
            granted,
        })
    }

    /// Whether a session of backend `pid` waits for `key` (a queued wait
    /// or take: an ungranted lock in `pg_locks`).
    fn waits_for(&self, key: i64, pid: i64) -> bool {
        let named = |conn: u64| (self.sessions.get(&conn)).is_some_and(|s| s.pid == pid);
        pid != 0 && (self.waiters.iter()).any(|w| w.key == key && named(w.conn))
    }

    /// Until when sessions other than `owner` hold `key` shared (kept by the
    /// broken [`ServerConfig::wait_keeps_shared_lock`]: `Duration::MAX`), or
    /// `None` if none does now.
    fn shared_by_others(&self, owner: u64, key: i64, now: Duration) -> Option<Duration> {
        let kept = (self.shared.get(&key)).is_some_and(|owners| owners.iter().any(|o| *o != owner));
        if kept {
            return Some(Duration::MAX);
        }
        (self.woken_shared.iter())
            .filter(|(k, o, until)| *k == key && *o != owner && *until > now)
            .map(|(_, _, until)| *until)
            .max()
    }

    /// Waits whose key is free now (or held by their own owner), removed
    /// from the queue in arrival order, with the reply each gets: the rows
    /// of its session. Each keeps its shared lock until its backend runs,
    /// when its reply leaves: the n-th woken wait of a key n - 1 times
    /// [`ServerConfig::woken_backend_lag`] after `now`. A take
    /// ([`Waiter::take`]) is granted the key exclusively (returned with its
    /// token), so the waits behind it stay queued; its reply leaves when its
    /// backend runs, after the shared locks of the waits woken before it.
    pub(super) fn woken(&mut self, now: Duration) -> Vec<Woken> {
        self.woken_shared.retain(|(_, _, until)| *until > now);
        let lag = self.cfg.woken_backend_lag;
        let mut woken: Vec<Woken> = Vec::new();
        let mut i = 0;
        while i < self.waiters.len() {
            let w = &self.waiters[i];
            let owner = self.owner(w.conn);
            let kept = w.take
                && (self.cfg.foreign_shared_keys.contains(&w.key)
                    || self.shared_by_others(owner, w.key, now) == Some(Duration::MAX));
            if kept || self.locks.get(&w.key).is_some_and(|(o, _)| *o != owner) {
                i += 1;
                continue;
            }
            let w = self.waiters.remove(i);
            let Some(s) = self.sessions.get(&w.conn) else {
                continue;
            };
            // The scheduler runs the woken backends one after another.
            let before = (woken.iter()).filter(|o| o.waiter.key == w.key).count();
            let runs_at = now + lag * before as u32;
            let nonce = if self.cfg.pooler_one_backend {
                self.backend_nonce
            } else {
                s.nonce
            };
            if w.take {
                let (pid, deadlock) = (s.pid, self.reported_deadlock_timeout());
                let runs_at =
                    runs_at.max(self.shared_by_others(owner, w.key, now).unwrap_or_default());
                self.locks.insert(w.key, (owner, 1));
                let token = self.clock_token(now);
                woken.push(Woken {
                    rows: reply::taken(pid, nonce, token, deadlock),
                    granted: Some((w.key, token)),
                    waiter: w,
                    runs_at,
                });
                continue;
            }
            if self.cfg.wait_keeps_shared_lock {
                self.shared.entry(w.key).or_default().insert(owner);
            } else if runs_at > now {
                self.woken_shared.push((w.key, owner, runs_at));
            }
            let rows = reply::wait(s.pid, nonce, true, self.reported_deadlock_timeout());
            woken.push(Woken {
                waiter: w,
                rows,
                runs_at,
                granted: None,
            });
        }
        woken
    }

    /// The wait of `query` on `conn`, if still queued, ended by its lock
    /// timeout, with the reply it gets if its session is still there: the
    /// statement catches the timeout (SQLSTATE 55P03) and answers that the
    /// key stayed held.
    pub(super) fn timed_out(
        &mut self,
        conn: u64,
        query: QueryId,
    ) -> Option<(Waiter, Option<Vec<Row>>)> {
        let i = (self.waiters.iter()).position(|w| w.conn == conn && w.query == query)?;
        let w = self.waiters.remove(i);
        let Some(s) = self.sessions.get(&conn) else {
            return Some((w, None));
        };
        let nonce = if self.cfg.pooler_one_backend {
            self.backend_nonce
        } else {
            s.nonce
        };
        let rows = reply::wait(s.pid, nonce, false, self.reported_deadlock_timeout());
        Some((w, Some(rows)))
    }

    /// A wait that blocks behind a held key until `until` (its lock
    /// timeout): queued; its backend is not idle meanwhile.
    pub(super) fn block(&mut self, waiter: Waiter, until: Duration) {
        if let Some(s) = self.sessions.get_mut(&waiter.conn) {
            s.busy_until = until;
        }
        self.waiters.push(waiter);
    }

    /// Whether `conn` has been idle past its idle deadline at `now` (see
    /// [`Server::idle_deadline`]).
    pub(super) fn idle_expired(&self, conn: u64, now: Duration) -> bool {
        self.idle_deadline(conn).is_some_and(|d| d <= now)
    }

    /// The backend pid of the session of `conn`.
    pub(super) fn pid_of(&self, conn: u64) -> Option<i64> {
        self.sessions.get(&conn).map(|s| s.pid)
    }

    /// Every advisory key held now, with the connection that holds it (the
    /// shared backend's keys are owned by no connection: `None`).
    pub(super) fn lock_owners(&self) -> Vec<(i64, Option<u64>)> {
        (self.locks.iter())
            .map(|(k, (o, _))| (*k, (*o != SHARED_BACKEND).then_some(*o)))
            .collect()
    }

    /// Every lease-group member lock held now (the two-int space): the group
    /// and the connection that holds it (`None`: the shared backend's).
    pub(super) fn member_locks(&self) -> Vec<(u32, Option<u64>)> {
        (self.members.keys())
            .map(|(g, o)| (*g, (*o != SHARED_BACKEND).then_some(*o)))
            .collect()
    }

    /// The server's configuration.
    pub(super) fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Listening sessions and their processes.
    pub(super) fn listeners(&self) -> Vec<(u64, usize)> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.listening)
            .map(|(c, s)| (*c, s.p))
            .collect()
    }

    /// A blocked write of a large reply completed at `now`: the backend is
    /// idle from then.
    pub(super) fn write_done(&mut self, conn: u64, now: Duration) {
        if let Some(s) = self.sessions.get_mut(&conn) {
            s.busy_until = s.busy_until.max(now);
        }
    }

    /// The statement of `conn` the server has not answered at `now`: a wait
    /// blocked on a key, or a statement still running (a slow server).
    pub(super) fn in_flight(&self, conn: u64, now: Duration) -> Option<QueryId> {
        if let Some(w) = self.waiters.iter().find(|w| w.conn == conn) {
            return Some(w.query);
        }
        let (query, done) = self.sessions.get(&conn)?.in_flight?;
        (done > now).then_some(query)
    }

    /// `query` of `conn` runs until `done` (see [`Server::in_flight`]).
    pub(super) fn running(&mut self, conn: u64, query: QueryId, done: Duration) {
        if let Some(s) = self.sessions.get_mut(&conn) {
            s.in_flight = Some((query, done));
        }
    }

    /// A wait of `conn` ended at `at`: the backend is idle from then.
    pub(super) fn unblocked(&mut self, conn: u64, at: Duration) {
        if let Some(s) = self.sessions.get_mut(&conn) {
            s.busy_until = at;
        }
    }

    /// Ends a session: it and its locks are gone.
    /// A notification for `conn`, if its session is blocked in a wait:
    /// held until the wait's reply leaves (a listening session gets
    /// notifications between transactions only), and `true`; else `false`.
    pub(super) fn hold_notification(&mut self, conn: u64, payload: &str, sender: i64) -> bool {
        if !self.waiters.iter().any(|w| w.conn == conn) {
            return false;
        }
        let held = self.held_notifications.entry(conn).or_default();
        held.push((payload.to_string(), sender));
        true
    }

    /// The notifications held for `conn` while it waited, in order.
    pub(super) fn take_held_notifications(&mut self, conn: u64) -> Vec<(String, i64)> {
        self.held_notifications.remove(&conn).unwrap_or_default()
    }

    pub(super) fn end(&mut self, conn: u64) -> Option<SrvSession> {
        self.held_notifications.remove(&conn);
        let s = self.sessions.remove(&conn)?;
        self.locks.retain(|_, (owner, _)| *owner != conn);
        self.members.retain(|(_, owner), _| *owner != conn);
        self.waiters.retain(|w| w.conn != conn);
        self.woken_shared.retain(|(_, o, _)| *o != conn);
        for owners in self.shared.values_mut() {
            owners.remove(&conn);
        }
        // The pooler's one server connection outlives its clients; it is
        // closed (its locks with it) when no client is left.
        if self.cfg.pooler_one_backend && self.sessions.is_empty() {
            self.locks.clear();
            self.members.clear();
            self.backend_nonce = None;
        }
        Some(s)
    }
}

impl Sim {
    /// A message arrives at the server from process `p`.
    pub(super) fn at_server(&mut self, p: usize, msg: ToServer) {
        match msg {
            ToServer::Connect { conn, settings } => {
                match self.server.connect(conn, p, &settings, self.now) {
                    Err(error) => self.send(p, Ev::AtClient(p, ToClient::Failed { conn, error })),
                    Ok(()) => {
                        self.arm_idle(conn);
                        self.send(p, Ev::AtClient(p, ToClient::Connected { conn }));
                    }
                }
            }
            ToServer::Close { conn } => self.end_session_quietly(conn),
            ToServer::Probe {
                conn,
                query,
                statement,
            } => {
                let result = self.server.probe(&statement);
                let done = self.now + self.server.slow;
                self.report.statements[p] += 1;
                self.reply_at(p, conn, query, done, result);
            }
            ToServer::Query {
                conn,
                query,
                statement,
            } => {
                // Statement faults: see `inject`.
                let injected = self.inject(&statement);
                let ran = injected.ran(statement.clone());
                let Some(executed) = self.server.execute(conn, self.now, &ran) else {
                    return;
                };
                let Executed {
                    done,
                    result,
                    notify,
                    blocks,
                    granted,
                } = executed;
                self.report.statements[p] += 1;
                for (key, token) in granted {
                    if let Some(name) = self.key_names.get(&key).cloned() {
                        self.check_token(p, &name, token);
                    }
                }
                if let (Some((key, timeout)), Injected::Nothing | Injected::Malformed { .. }) =
                    (blocks, injected)
                {
                    let waiter = Waiter {
                        conn,
                        p,
                        query,
                        key,
                        take: matches!(ran, Statement::Take { .. }),
                        injected,
                        since: done,
                        watch_of: match &ran {
                            Statement::Wait { watch_of, .. } => *watch_of,
                            _ => None,
                        },
                    };
                    self.server.block(waiter, done + timeout);
                    self.queue
                        .push(done + timeout, Ev::LockTimeout { conn, query });
                    self.arm_idle(conn);
                    return;
                }
                let (result, notify) = injected.reply(&statement, result, notify);
                self.server.running(conn, query, done);
                let sender = self.server.sessions.get(&conn).map(|s| s.pid);
                for payload in notify {
                    self.notify_listeners(
                        payload,
                        sender.unwrap_or_default(),
                        self.server.cfg.notify_delay,
                    );
                }
                self.arm_idle(conn);
                self.reply_at(p, conn, query, done, result);
                self.wake_waiters();
            }
        }
    }

    /// `NOTIFY lease_handover_v1, payload` from backend `sender`: every
    /// listening session gets it, `after` from now.
    pub(super) fn notify_listeners(&mut self, payload: String, sender: i64, after: Duration) {
        for (conn, p) in self.server.listeners() {
            if self.server.hold_notification(conn, &payload, sender) {
                continue;
            }
            let payload = payload.clone();
            let msg = ToClient::Notify {
                conn,
                payload,
                sender_pid: sender,
            };
            if after.is_zero() {
                self.send(p, Ev::AtClient(p, msg));
            } else {
                self.queue.push(self.now + after, Ev::Deliver(p, msg));
            }
        }
    }

    /// A lock wait ends: one that lasted `deadlock_timeout` ran the deadlock
    /// detector and, with `log_lock_waits = on`, was logged.
    fn lock_wait_ended(&mut self, w: &Waiter) {
        if self.now.saturating_sub(w.since) >= self.server.cfg.deadlock_timeout {
            self.report.lock_waits_past_deadlock_timeout += 1;
        }
    }

    /// Sends a statement's reply, leaving the server at `done`.
    fn reply_at(
        &mut self,
        p: usize,
        conn: u64,
        query: QueryId,
        done: Duration,
        result: Result<Vec<Row>, SessionError>,
    ) {
        let reply = ToClient::Reply {
            conn,
            query,
            result,
        };
        let latency = self.link_latency(p);
        let ev = Ev::AtClient(p, reply);
        if let Some((at, ev)) = self.net.send(p, Direction::ToClient, done, latency, ev) {
            self.queue.push(at, ev);
        }
        // The notifications held while its statement blocked in a wait, sent
        // right behind the reply (the backend flushes them together).
        for (payload, sender_pid) in self.server.take_held_notifications(conn) {
            let msg = ToClient::Notify {
                conn,
                payload,
                sender_pid,
            };
            let ev = Ev::AtClient(p, msg);
            if let Some((at, ev)) = self.net.send(p, Direction::ToClient, done, latency, ev) {
                self.queue.push(at, ev);
            }
        }
    }

    /// Answers every queued wait whose key is free now.
    fn wake_waiters(&mut self) {
        for woken in self.server.woken(self.now) {
            let Woken {
                waiter: w,
                rows,
                runs_at,
                granted,
            } = woken;
            self.lock_wait_ended(&w);
            if let Some((key, token)) = granted {
                if let Some(name) = self.key_names.get(&key).cloned() {
                    self.check_token(w.p, &name, token);
                }
                if let Some(after) = self.terminate_next_taker.take() {
                    let terminate = Fault::Terminate { process: w.p };
                    self.schedule(self.now + after, terminate);
                }
            }
            let result = w.reply(rows);
            let done = runs_at + self.server.slow;
            self.server.unblocked(w.conn, done);
            self.arm_idle(w.conn);
            self.reply_at(w.p, w.conn, w.query, done, result);
        }
    }

    /// A wait's lock timeout, if still queued: the statement catches it
    /// (SQLSTATE 55P03) and answers that the key stayed held.
    pub(super) fn lock_timeout(&mut self, conn: u64, query: QueryId) {
        let Some((w, rows)) = self.server.timed_out(conn, query) else {
            return;
        };
        self.lock_wait_ended(&w);
        let Some(rows) = rows else {
            return;
        };
        let result = w.reply(rows);
        self.server.unblocked(conn, self.now);
        self.arm_idle(conn);
        self.reply_at(w.p, conn, query, self.now, result);
    }

    /// Schedules the idle check of a session, if it can be ended as idle,
    /// and its TCP give-up check.
    pub(super) fn arm_idle(&mut self, conn: u64) {
        if let Some(at) = self.server.idle_deadline(conn) {
            self.queue.push(at, Ev::IdleCheck(conn));
        }
        if let Some(at) = self.server.tcp_deadline(conn) {
            self.queue.push(at, Ev::TcpCheck(conn));
        }
    }

    /// The TCP give-up check: a session whose client has been silent for the
    /// give-up time and cannot answer (its link is partitioned) is ended;
    /// one whose client answers keepalives is checked again later.
    pub(super) fn tcp_check(&mut self, conn: u64) {
        let (Some(deadline), Some(p)) =
            (self.server.tcp_deadline(conn), self.server.process_of(conn))
        else {
            return;
        };
        if deadline > self.now {
            return;
        }
        if self.net.partitioned(p) {
            self.end_session(
                conn,
                "08006",
                "could not receive data from client: Connection timed out",
            );
        } else if let Some(give_up) = self.server.tcp_give_up(conn) {
            self.queue.push(self.now + give_up, Ev::TcpCheck(conn));
        }
    }

    /// Sessions of `p` whose backend is blocked writing a reply too large
    /// for its socket buffer ([`ServerConfig::send_buffer_rows`]) to a
    /// partitioned link.
    pub(super) fn blocked_writes(&self, p: usize) -> Vec<u64> {
        let Some(limit) = self.server.cfg.send_buffer_rows else {
            return Vec::new();
        };
        if !self.net.partitioned(p) {
            return Vec::new();
        }
        let mut blocked: Vec<u64> = (self.net.held(p).iter())
            .filter_map(|ev| match ev {
                Ev::AtClient(
                    _,
                    ToClient::Reply {
                        conn,
                        result: Ok(rows),
                        ..
                    },
                ) if rows.len() > limit => Some(*conn),
                _ => None,
            })
            .collect();
        blocked.dedup();
        blocked
    }

    /// The idle check: ends the session if it has been silent long enough
    /// (a backend blocked in a write is not idle; see
    /// [`ServerConfig::send_buffer_rows`]).
    pub(super) fn idle_check(&mut self, conn: u64) {
        let blocked =
            (self.server.process_of(conn)).is_some_and(|p| self.blocked_writes(p).contains(&conn));
        if blocked {
            return;
        }
        if self.server.idle_expired(conn, self.now) {
            self.end_session(
                conn,
                "57P05",
                "terminating connection due to idle-session timeout",
            );
        }
    }

    fn end_session_quietly(&mut self, conn: u64) {
        self.end_backend(conn);
        self.wake_waiters();
    }

    /// Ends the backend of `conn`, its waits unanswered; the waits its
    /// locks held up are not woken yet.
    fn end_backend(&mut self, conn: u64) {
        if let Some(s) = self.server.end(conn) {
            self.trace(Some(s.p), TraceEvent::SessionEnded { pid: s.pid });
        }
    }

    /// Ends a session actively, telling its client.
    pub(super) fn end_session(&mut self, conn: u64, code: &str, message: &str) {
        self.end_sessions(&[conn], code, message);
    }

    /// Ends sessions actively, at once, telling their clients: a wait of
    /// one that another's end would wake is not answered (PostgreSQL
    /// signals every backend it shuts down or terminates together, and a
    /// backend granted a lock with the signal pending ends before it
    /// answers).
    ///
    /// A statement in flight on an ended session (a blocked wait, or one
    /// still running on a slow server) is answered with the FATAL error, as
    /// PostgreSQL answers it, and the connection's end follows up to
    /// [`FATAL_TO_END`] later: a driver may read that reply before it reads
    /// the end (the machine sees a failed statement), or both at once (it
    /// feeds the end and drops the reply), as a real driver does.
    fn end_sessions(&mut self, conns: &[u64], code: &str, message: &str) {
        let ended: Vec<(u64, usize, Option<QueryId>)> = (conns.iter())
            .filter_map(|c| {
                let p = self.server.process_of(*c)?;
                Some((*c, p, self.server.in_flight(*c, self.now)))
            })
            .collect();
        for (conn, ..) in &ended {
            self.end_backend(*conn);
        }
        self.wake_waiters();
        for (conn, p, in_flight) in ended {
            self.trace(
                Some(p),
                TraceEvent::SessionKilled {
                    code: code.into(),
                    message: message.into(),
                },
            );
            let error = SessionError {
                code: Some(code.into()),
                message: message.into(),
                config: false,
            };
            let mut end_at = self.now;
            if let Some(query) = in_flight {
                // Its reply, scheduled for when the statement would have
                // been done, is never sent.
                let never_sent = |ev: &Ev| {
                    matches!(ev, Ev::AtClient(q, ToClient::Reply { conn: c, query: id, .. })
                        if *q == p && *c == conn && *id == query)
                };
                self.queue.remove_all(never_sent);
                let on_its_way = |ev: &Ev| matches!(ev, Ev::AtClient(q, _) if *q == p);
                let after = self.queue.latest(on_its_way).unwrap_or(self.now);
                self.net.unsend_to_client(p, after);
                let result = Err(error.clone());
                self.send(
                    p,
                    Ev::AtClient(
                        p,
                        ToClient::Reply {
                            conn,
                            query,
                            result,
                        },
                    ),
                );
                // Half the time the driver reads both at once (the end wins).
                if self.fatal_first {
                    end_at += FATAL_TO_END;
                } else if self.chance(0.5) {
                    end_at += self.uniform(FATAL_TO_END);
                }
            }
            let latency = self.link_latency(p);
            let ev = Ev::AtClient(p, ToClient::Ended { conn, error });
            if let Some((at, ev)) = self.net.send(p, Direction::ToClient, end_at, latency, ev) {
                self.queue.push(at, ev);
            }
        }
    }

    /// `pg_terminate_backend` of every session of `p` (`None`: all, as a
    /// shutdown does), at once.
    pub(super) fn terminate(&mut self, p: Option<usize>) {
        let conns = self.server.sessions_of(p);
        self.end_sessions(
            &conns,
            "57P01",
            "terminating connection due to administrator command",
        );
    }

    /// `pg_terminate_backend` of the session on connection `conn`.
    pub(super) fn terminate_session(&mut self, conn: u64) {
        self.end_session(
            conn,
            "57P01",
            "terminating connection due to administrator command",
        );
    }
}

/// The longest time from a FATAL answer to a statement in flight to the
/// connection's end as the client reads it (the backend exits, the kernel
/// closes the socket): see `end_sessions`.
const FATAL_TO_END: Duration = Duration::from_millis(2);

/// The first of `settings` that a server of `version` (`server_version_num`) does not
/// know: `idle_session_timeout` before PostgreSQL 14.
fn unknown_setting(version: i64, settings: &[(&'static str, String)]) -> Option<&'static str> {
    settings
        .iter()
        .map(|(name, _)| *name)
        .find(|name| *name == "idle_session_timeout" && version < 140_000)
}

/// The error of a connection or probe the server refuses: SQLSTATE `code`
/// with `message`.
fn refuse(code: &str, message: &str) -> SessionError {
    SessionError {
        code: Some(code.into()),
        message: message.into(),
        config: false,
    }
}

/// PostgreSQL's error for a setting it does not know, at startup or in `set_config`.
fn unrecognized(name: &str) -> SessionError {
    SessionError {
        code: Some("42704".into()),
        message: format!("unrecognized configuration parameter \"{name}\""),
        config: false,
    }
}
