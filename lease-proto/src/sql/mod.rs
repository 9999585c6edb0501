//! Every statement the machine sends, and the one row shape they all return.
//!
//! A driver never needs to know what a statement means: it sends
//! [`Statement::sql`] with the simple-query protocol (one round trip, no
//! prepared statements, so it behaves the same through any pooler; the only
//! values in the text are integers the machine formats itself), and hands back
//! every row of every result set, in order, as a [`Row`]: a list of nullable
//! `int8` columns, decoded from text by [`decode_text_row`].
//!
//! Where things are:
//!
//! - `templates/*.sql`: the SQL itself, as SQL, one file per family of
//!   statements (those that share a proof share a file); `template.rs` is the
//!   one rule for filling them in, and `templates/rendered.sql` is every
//!   statement as sent (checked by a test: a change to the SQL shows in its
//!   diff, and the file runs in psql);
//! - `render.rs`: which template each [`Statement`] is, with what values;
//! - `reply.rs`: each statement's reply, decoded (and encoded, for simulated
//!   servers);
//! - `notice.rs`: the payloads on [`HANDOVER_CHANNEL`];
//! - this file: the statements and the names they share with the server
//!   (settings, row tags, the channel).

mod notice;
mod render;
mod reply;
pub(crate) mod template;

pub use notice::handover_request_payload;
pub(crate) use notice::{Notice, Preference, ReleaseNotice};
pub use reply::*;

/// The LISTEN/NOTIFY channel of graceful handovers. The payload is the
/// released key in decimal and the moment of the release on the server's
/// clock, in the units of the fencing token ([`TOKEN_CLOCK_OFFSET`] plus
/// microseconds), space-separated, then the backend pid that holds the key
/// exclusively right after the unlock, if one does: the first
/// [`Statement::Take`] in its queue, granted it in the unlock itself (or a
/// try, or a client that is not a lease client, in the moment between; a
/// locker before 0.2 ignores such a payload), then, when the key is handed
/// over by name, the backend it is reserved for (the grantee then `0` if
/// there is none; a locker before 0.3 ignores such a payload, and waits
/// out the lock delay as after a crash); also `group <id>`
/// (a lease group's announcement), `to <key> <pid>` (a hand-over asked
/// for: [`handover_request_payload`]), `claim <key> <pid>` (a lease
/// group's owner claims its key: [`Statement::Members`]) and `prefer <key>
/// <pid> <priority>` (a standby of a higher priority asks for it:
/// [`Statement::Prefer`]). A locker ignores a payload it does not know, so
/// an older one ignores `prefer`.
pub const HANDOVER_CHANNEL: &str = "lease_handover_v1";

/// One result row: every column is a nullable `int8`.
pub type Row = Vec<Option<i64>>;

/// The tags of the setup statement's `(tag, value)` rows.
mod setup_tag {
    pub const SERVER_VERSION: i64 = 1;
    pub const IN_RECOVERY: i64 = 2;
    pub const BACKEND_PID: i64 = 3;
    pub const IDLE_SESSION_TIMEOUT_MS: i64 = 4;
    /// Tags 5 to 8: the settings of [`super::TCP_SETTINGS`], in order.
    pub const TCP_FIRST: i64 = 5;
    pub const UNIX_SOCKET: i64 = 9;
    pub const NONCE: i64 = 10;
    /// 1 when `search_path` reads back as [`super::SEARCH_PATH`].
    pub const SEARCH_PATH: i64 = 11;
    /// The server's clock (the `server_clock_us` fragment).
    pub const SERVER_CLOCK_US: i64 = 12;
    /// The row of the statement that applies settings; ignored.
    pub const APPLIED: i64 = 0;
    /// Tags 40 to 44: [`crate::reply::PromotionState`]'s fields, in order.
    pub const REPLAYED_SINCE_START: i64 = 40;
    pub const WAL_TIMELINE: i64 = 41;
    pub const CHECKPOINT_TIMELINE: i64 = 42;
    pub const CHECKPOINT_AGE_MS: i64 = 43;
    pub const HISTORY_AGE_MS: i64 = 44;
}

/// The transaction-local custom setting in which the setup's first
/// statement leaves the latest checkpoint's timeline and age (ms), as
/// `timeline,age`, for its rows to read.
pub const CHECKPOINT_SETTING: &str = "lease.checkpoint";

/// The transaction-local custom setting in which the setup's second
/// statement leaves the age (ms) of the current timeline's history file.
pub const HISTORY_SETTING: &str = "lease.history";

/// The tags of the heartbeat and verify statements' `(tag, value)` rows.
mod heartbeat_tag {
    pub const BACKEND_PID: i64 = 0;
    pub const HELD_KEY: i64 = 1;
    pub const NONCE: i64 = 2;
    /// A wait's outcome: 1 when the key was freed, 0 at its lock timeout.
    pub const FREED: i64 = 3;
    /// The session's `deadlock_timeout` in ms, read by a wait.
    pub const DEADLOCK_TIMEOUT_MS: i64 = 4;
    /// The fencing token of the key a [`Statement::Take`](super::Statement::Take)
    /// took.
    pub const TOKEN: i64 = 5;
    /// The server's clock (the `server_clock_us` fragment).
    pub const SERVER_CLOCK_US: i64 = 6;
    /// A hand-over asked for whose backend waits for its key
    /// ([`Statement::CheckHandover`](super::Statement::CheckHandover)).
    pub const WAITING: i64 = 7;
}

/// The outcomes of a wait in its `FREED` row ([`WAIT_SETTING`]).
mod wait_outcome {
    /// Ended by its lock timeout: the key was held all along.
    pub const HELD: i64 = 0;
    /// The key was freed ([`Statement::Wait`](super::Statement::Wait)), or
    /// taken ([`Statement::Take`](super::Statement::Take)).
    pub const FREED: i64 = 1;
    /// Did not queue: the key has enough waiters (the crowd check).
    pub const CROWDED: i64 = 2;
    /// A take found the key held by its own backend already: another
    /// client's lock on a shared backend (a transaction pooler).
    pub const HELD_HERE: i64 = 3;
}

/// The tags of the [`Statement::Members`] rows.
mod members_tag {
    pub const SESSION: i64 = 0;
    pub const MEMBER: i64 = 1;
    pub const HOLDER: i64 = 2;
    pub const JOINED: i64 = 3;
    pub const LEFT: i64 = 4;
}

/// The longest `lock_timeout` a [`Statement::Wait`] runs with under a
/// server `deadlock_timeout` of `deadlock_timeout_ms`: that less a tenth,
/// at least 10 ms (and at least 1 ms in all). A lock wait that reaches
/// `deadlock_timeout` runs the deadlock detector, and with
/// `log_lock_waits = on` writes "still waiting" to the server log (LOG,
/// DETAIL, CONTEXT and the statement), again at every client connection
/// check ([`WAIT_CONNECTION_CHECK_MS`]) until it ends. Both timers start
/// when the lock wait begins, so a lock timeout this much shorter always
/// fires first. The statement computes the same on the server, from the
/// session's own `deadlock_timeout` when the wait starts.
pub fn wait_limit_ms(deadlock_timeout_ms: i64) -> i64 {
    let margin = (deadlock_timeout_ms / 10).max(10);
    deadlock_timeout_ms.saturating_sub(margin).max(1)
}

/// How a watch session's `application_name` begins during its waits: then
/// the backend pid of its lease session, `: ` and its own
/// `application_name` ([`Statement::Wait`]).
pub const WATCH_OF: &str = "lease watch of ";

/// The transaction-local custom setting in which a [`Statement::Wait`]
/// leaves its outcome for its last statement to read.
pub const WAIT_SETTING: &str = "lease.freed";

/// The transaction-local custom setting in which a [`Statement::Release`]
/// with `notify` leaves, key by key, the moment it unlocked it (0: it did
/// not hold it), for its last statement to answer.
pub const RELEASED_SETTING: &str = "lease.released";

/// The transaction-local custom setting in which a [`Statement::Take`] that
/// took its key leaves the fencing token, read right after the grant.
pub const TOKEN_SETTING: &str = "lease.token";

/// The server-side TCP settings the setup reads back, in the order of
/// [`Options::tcp_settings`](crate::Options::tcp_settings) and of
/// [`SetupReply::tcp_settings`].
pub const TCP_SETTINGS: [&str; 4] = [
    "tcp_user_timeout",
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
];

/// The custom setting holding the session's nonce: set by the setup, read
/// by every heartbeat. Another value means another client shares the
/// backend (a transaction pooler).
pub const NONCE_SETTING: &str = "lease.nonce";

/// The `search_path` of every lease session: only `pg_catalog`, so no
/// object of the role's own can shadow a name the statements use (they
/// qualify every name too: see [`Statement::sql`]). Set at startup (or by
/// the setup) with the other settings and read back by the setup.
pub const SEARCH_PATH: &str = "pg_catalog";

/// The SQLSTATE of a lock timeout (`lock_not_available`), which a
/// [`Statement::Wait`] catches and answers as "held all along".
pub const LOCK_TIMEOUT_SQLSTATE: &str = "55P03";

/// How often the server checks, while a [`Statement::Wait`] blocks, that
/// the client is still connected (`client_connection_check_interval`, in
/// ms): a waiting backend reads nothing from its client, so without it a
/// standby that vanished (killed, or a session closed to interrupt its wait)
/// left its backend queued, holding a connection slot, until the lock
/// timeout (up to a retry interval).
pub const WAIT_CONNECTION_CHECK_MS: u64 = 250;

/// The statement a [`Statement::Wait`] starts with, in the same simple query
/// (one implicit transaction, no rows): transaction-local settings that the
/// server reads when the next statement starts, so a `set_config` inside the
/// wait itself would come too late. `statement_timeout` off (a role's or
/// database's shorter one would cancel every wait before its lock timeout,
/// which bounds it, and turn waiting off), and the client connection check
/// ([`WAIT_CONNECTION_CHECK_MS`]; Linux servers only: elsewhere the server
/// rejects it, and the wait goes on without it), and PostgreSQL 17's
/// `transaction_timeout` off for the same reason as `statement_timeout`
/// (older servers reject the name: nothing to turn off there).
pub const WAIT_PRELUDE_SQL: &str = template::raw(include_str!("templates/wait_prelude.sql"));

/// What a fencing token adds to the server's clock (microseconds since
/// 1970): 2^56, above every token of the scheme before it (`timeline << 48 |
/// xid`, below 2^56 for timelines below 256), so a fleet upgraded replica
/// by replica never sees a new token below an old one; 2^63 - 2^56 leaves
/// room for about 290,000 years of microseconds. See [`Statement::TryLock`].
pub const TOKEN_CLOCK_OFFSET: i64 = 1 << 56;

/// The stale-primary check of a host list (the driver's, when a lease
/// session opens on one host of several): the server's current WAL timeline
/// (the first 8 hex digits of `pg_walfile_name(pg_current_wal_lsn())`, one
/// more at every promotion, at once), or NULL on a server in recovery, where
/// `pg_current_wal_lsn()` errors (the `CASE` never calls it there). Every
/// function it names is executable by PUBLIC by default (measured with a
/// role without privileges on PostgreSQL 15: unlike `pg_ls_waldir()`, no
/// `pg_monitor` needed); where a DBA revoked that, the statement fails with
/// `insufficient_privilege` and the driver logs once that the check is off.
/// One row, one column; [`primary_timeline`] reads it.
pub const PRIMARY_TIMELINE_SQL: &str =
    template::raw(include_str!("templates/primary_timeline.sql"));

/// The server's clock (`clock_timestamp()`) in microseconds since the Unix
/// epoch, one `int8` column: what a schedule's leader reads (lease-proto's
/// `schedule::Estimate`). Every name schema-qualified (`search_path` cannot
/// redirect it); writes nothing. Sent on a connection of its own, never the
/// lease session.
pub const SERVER_TIME_SQL: &str = "SELECT (pg_catalog.date_part('epoch', \
                                   pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) \
                                   1000000)::pg_catalog.int8";

/// The reply of [`PRIMARY_TIMELINE_SQL`], its one column as text (`None`:
/// NULL): `Ok(None)` on a server in recovery, `Ok(Some(timeline))` on a
/// primary.
pub fn primary_timeline(value: Option<&str>) -> Result<Option<i64>, ReplyError> {
    match value {
        None => Ok(None),
        Some(text) => match text.parse::<i64>() {
            Ok(t) if t >= 1 => Ok(Some(t)),
            _ => Err(ReplyError::Timeline(text.to_owned())),
        },
    }
}

/// The expression of an advisory lock's `bigint` key over the `pg_locks`
/// columns (`pg_advisory_lock(bigint)` stores the key's high half in
/// `classid` and its low half in `objid`, with `objsubid = 1`). Parenthesised,
/// so it can stand anywhere in an expression:
/// `... WHERE locktype = 'advisory' AND objsubid = 1 AND {ADVISORY_KEY_SQL} = $1`.
pub const ADVISORY_KEY_SQL: &str = template::raw(include_str!("templates/advisory_key.sql"));

/// A statement of the machine, in structured form.
///
/// Drivers use only [`Statement::sql`]; the simulator interprets the
/// structure. Exhaustive on purpose, as the commands are: a server model
/// must answer every statement, so a new one must fail to compile there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// First statement of every session. It sets [`NONCE_SETTING`] to
    /// `nonce` and each of `settings` (`set_config(name, value, false)`:
    /// the session's startup options could not carry them), then answers
    /// `(tag, value)` rows with the server version, recovery state, backend
    /// pid, `idle_session_timeout` in ms, the [`TCP_SETTINGS`], whether the
    /// client is on a Unix socket, the nonce read back, whether
    /// `search_path` reads back as [`SEARCH_PATH`], and what the server
    /// shows of a recent promotion ([`crate::reply::PromotionState`], read first
    /// into [`CHECKPOINT_SETTING`] and [`HISTORY_SETTING`]): see [`SetupReply`].
    Setup {
        /// The session's nonce.
        nonce: i64,
        /// Settings to apply by statement, as `(name, value)`.
        settings: Vec<(&'static str, String)>,
    },
    /// `LISTEN` on [`HANDOVER_CHANNEL`], after a successful setup when
    /// handover notifications are on. No rows.
    Listen,
    /// One batched try of every key a standby wants, on the session set up
    /// with `backend_pid` and `nonce`. The first row is `(NULL,
    /// pg_backend_pid(), nonce)` ([`NONCE_SETTING`], NULL when unset); then
    /// `(key, token, NULL)` for keys won and `(key, NULL, holder_pid)` for
    /// keys not won.
    ///
    /// Nothing is tried unless the backend pid and the nonce are those of
    /// the setup, and a key this backend already holds is not tried again
    /// (it answers with this backend as the holder): behind a transaction
    /// pooler another client's lock on the same backend would otherwise be
    /// "won" again (advisory locks are re-entrant). Nor is anything tried
    /// on a server in recovery (a hot standby grants advisory locks
    /// independently of its primary; the setup refuses one, and the try
    /// checks again, as the transaction id the token once needed did).
    ///
    /// The fencing token is [`TOKEN_CLOCK_OFFSET`] plus the server's clock
    /// (`clock_timestamp()`) in microseconds, read after every lock of the
    /// batch was granted: after the previous holder's unlock, which came at
    /// least a round trip after that holder's own reading (its client got
    /// the reply, then sent the unlock). The statement assigns no
    /// transaction id and writes no WAL, so it waits for no flush and no
    /// synchronous standby, and nothing a crash, a promotion, `pg_upgrade`
    /// or a move into a new cluster resets enters the token. The condition:
    /// the clock of the server that grants a key must not be behind the
    /// clock that made the key's previous token by the time between the two
    /// acquisitions or more (a clock stepped back, or a promoted replica
    /// whose clock is behind the old primary's).
    TryLock {
        /// Keys to try, none of them held by this session.
        keys: Vec<i64>,
        /// The backend pid the setup reported.
        backend_pid: i64,
        /// The nonce the setup set.
        nonce: i64,
    },
    /// The steady heartbeat: proves the session is the same one and alive.
    /// A `(0, pg_backend_pid())` row and a `(2, nonce)` row
    /// ([`NONCE_SETTING`], NULL when unset); see [`HeartbeatReply`].
    ///
    /// It reads no `pg_locks`, so its cost does not grow with the locks the
    /// server holds: a live session loses a session-level advisory lock only
    /// by its own unlock or by ending, and an answer from the same backend
    /// with the same nonce proves it did neither (the machine unlocks only
    /// by [`Statement::Release`], whose failure ends the session, and the
    /// nonce tells another lease client on the same backend). What a failed,
    /// unanswered or malformed statement may have left on the server is
    /// read by [`Statement::Verify`] instead.
    Heartbeat,
    /// Verifies the session after a statement whose effect is unknown (a
    /// try that failed or was answered only in part): what
    /// [`Statement::Heartbeat`] answers, then one `(1, key)` row per
    /// advisory key this session holds in this database according to
    /// `pg_locks`; see [`VerifyReply`].
    Verify,
    /// The watch session's wait: waits on the server until `key` is free,
    /// without taking it: a shared
    /// transaction-level lock on the key (`pg_advisory_xact_lock_shared`)
    /// queues behind the holder's exclusive lock, is granted the moment the
    /// holder unlocks it or its session ends, and is gone when the
    /// statement's transaction ends, before the reply is read. Nothing is
    /// left on the server whatever happens to the statement (an error, a
    /// cancel, a closed connection: a transaction-level lock cannot
    /// outlive its transaction). A woken waiter holds its shared lock from
    /// the release until its backend runs and commits: microseconds on an
    /// idle server, milliseconds on a busy one, during which another
    /// session's plain try of the key loses (a [`Statement::Take`] queued
    /// behind it is granted after it).
    ///
    /// Bounded on the server by a transaction-local `lock_timeout` of
    /// `timeout_ms`, cut to [`wait_limit_ms`] of the session's
    /// `deadlock_timeout` (read by the statement itself, so a reload that
    /// changes it counts at the next wait): the wait never reaches the
    /// deadlock detector nor, with `log_lock_waits = on`, the server log; a
    /// standby waits a retry interval in such chunks. The reply also
    /// carries the `deadlock_timeout` it read ([`WaitReply`]), so the machine
    /// sizes its next waits. The wait runs in a `DO` block that catches its lock
    /// timeout (`lock_not_available`), so a wait that times out is no
    /// `ERROR` in the server's log (one per standby per retry interval
    /// otherwise), and answers what [`Statement::Heartbeat`] answers plus
    /// whether the key was freed ([`WaitReply`]), read after the wait, so a
    /// reply also proves the session. Any error reply, SQLSTATE
    /// [`LOCK_TIMEOUT_SQLSTATE`] included (the statement catches it, so only
    /// a server or proxy that does not run it as sent could send it), turns
    /// waiting off for the session.
    ///
    /// A wait never acquires: a freed key is taken by the
    /// [`Statement::TryLock`] the lease session sends next, whose send time
    /// confirms it like any other try.
    ///
    /// With `crowd`, the wait first counts the sessions with a smaller
    /// backend pid already waiting for the key (ungranted advisory locks on
    /// it in `pg_locks`) and, with that many or more, does not queue: it
    /// answers at once that the key is crowded ([`WaitReply::crowded`]), and
    /// its standby polls. The waiters settle on the standbys with the
    /// smallest pids (those never give way, whatever the timing, so waits
    /// checked at the same moment cannot all give way), and a freed key
    /// wakes about that many standbys, however many there are.
    Wait {
        /// The key to wait for.
        key: i64,
        /// The statement's `lock_timeout`, in ms (at least 1).
        timeout_ms: u64,
        /// Queue only behind fewer than this many waiters (see above).
        crowd: Option<u32>,
        /// The backend pid of the lease session this watch session serves:
        /// for the wait's transaction its `application_name` reads `lease
        /// watch of <pid>: ` and what it was (any role may read it in
        /// `pg_stat_activity`), so that a holder can tell that this session
        /// waits for the lease session `pid` (see
        /// [`Statement::CheckHandover`]).
        watch_of: Option<i64>,
    },
    /// Waits on the server until `key` is free and takes it in the same
    /// statement: a session-level exclusive `pg_advisory_lock` queues behind
    /// the holder's lock, and the server grants it to the first session in
    /// the key's queue the moment the holder unlocks it or its session ends
    /// (a plain try of another session loses meanwhile: PostgreSQL queues a
    /// request behind conflicting waiters, and grants at the release, in the
    /// releasing backend). The other sessions in the queue go on waiting,
    /// now behind the new holder: a release wakes one standby, and the key
    /// is taken one round trip after it, with no try to follow.
    ///
    /// What [`Statement::Wait`] does around its wait (the prelude, the
    /// `lock_timeout` cut below `deadlock_timeout`, the crowd check, the
    /// timeout caught in a `DO` block, the reply that proves the session),
    /// and what [`Statement::TryLock`] checks before it locks: nothing is
    /// waited for unless the backend pid and the nonce are those of the
    /// setup and the server is not in recovery, and a key this backend holds
    /// already (another client's, behind a transaction pooler) is not taken
    /// again: the reply says so ([`WaitReply::held_here`]). A lock timeout
    /// that fires as the lock is granted raises `lock_not_available` with the
    /// lock kept, so whether this backend holds the key is read from
    /// `pg_locks` after the wait either way. If it does, the fencing token is
    /// read then, as a try's is (after the grant, so after the previous
    /// holder's unlock), and the reply carries it ([`WaitReply::token`]).
    ///
    /// Only a session that holds nothing sends it (a wait of a session
    /// with a lease would block its heartbeats), and never the watch
    /// session (it never acquires). A reply lost or failed leaves the key
    /// maybe taken: the machine verifies, as after a failed try.
    Take {
        /// The key to wait for and take.
        key: i64,
        /// The statement's `lock_timeout`, in ms (at least 1).
        timeout_ms: u64,
        /// Queue only behind fewer than this many waiters (see
        /// [`Statement::Wait`]).
        crowd: Option<u32>,
        /// The backend pid the setup reported.
        backend_pid: i64,
        /// The nonce the setup set.
        nonce: i64,
    },
    /// Unlocks keys: one `(key, 1 or 0)` row per key, 1 when it was held.
    /// With `notify`, each key actually unlocked is announced on
    /// [`HANDOVER_CHANNEL`], with the release's moment (read once, before
    /// the first unlock) and, read from `pg_locks` once every key is unlocked, the
    /// backend that holds it exclusively then (the first [`Statement::Take`]
    /// in its queue is granted it in the unlock itself): a standby that took
    /// the key reads its own pid there, one whose take was granted later
    /// (behind another standby that took it first) reads another.
    ///
    /// A key handed over by name names, in its notification, the backend it
    /// is reserved for, but only if that backend holds or waits for the key
    /// once it is unlocked, or, for a hand-over confirmed moments ago (less
    /// than a query timeout: its wait may be between two chunks), is still
    /// connected (`pg_stat_activity`).
    Release {
        /// Keys to unlock.
        keys: Vec<i64>,
        /// Whether to `NOTIFY` standbys.
        notify: bool,
        /// The keys handed over by name: `(key, backend, 1 if the hand-over
        /// was confirmed moments ago, else 0)` (with `notify` only).
        reserved: Vec<(i64, i64, i64)>,
    },
    /// A lease group's membership read (see `docs/library.md`, "Lease
    /// groups"). First joins each group of `join`: a session-level two-int
    /// advisory lock `(group id, pg_backend_pid())` (`objsubid` 2 in
    /// `pg_locks`, a space apart from the lease keys' one-`bigint` locks),
    /// taken once per session and freed with it; with `notify`, the join is
    /// announced on [`HANDOVER_CHANNEL`] with the payload `group <id>`, so
    /// members read again at once, and so is each group of `announce` (a
    /// member left it: the others take its leases at once), and each key of
    /// `claims`, with the payload `claim <key> <pg_backend_pid()>` (the
    /// member owns the key by the share and reads it held by another member
    /// past the bound: the holder hands it over). Leaves each group of
    /// `leave` (unlocks its lock). Then answers `(0, pg_backend_pid(), NULL)`, one `(1,
    /// group id, member pid)` row per member lock of `groups` granted in
    /// this database to the backend it names (a lock `(group id, n)` held by
    /// a backend whose pid is not `n` is forged, as any role can take one,
    /// and is not a member), and one `(2, key, holder pid or NULL)` row per key of
    /// `keys`; the first row is `(0, pg_backend_pid(), nonce)`
    /// ([`NONCE_SETTING`], NULL when unset), so a reply proves the session
    /// as a [`Statement::Heartbeat`] does. It tries no lease key.
    Members {
        /// Groups to join (their ids).
        join: Vec<u32>,
        /// Groups to leave.
        leave: Vec<u32>,
        /// Groups whose members to read.
        groups: Vec<u32>,
        /// Keys whose holders to read.
        keys: Vec<i64>,
        /// Whether to announce the joins.
        notify: bool,
        /// Groups to announce (with `notify`) whether joined now or not.
        announce: Vec<u32>,
        /// Keys to claim (with `notify`).
        claims: Vec<i64>,
    },
    /// A standby of `priority` asks the holder of `key` to hand it over
    /// (see [`Role::Candidate`](crate::Role::Candidate)): `NOTIFY` on
    /// [`HANDOVER_CHANNEL`] with the payload `prefer <key>
    /// <pg_backend_pid()> <priority>`, then what [`Statement::Heartbeat`]
    /// answers ([`HeartbeatReply`]). It tries no key.
    Prefer {
        /// The key asked for.
        key: i64,
        /// The asking standby's priority.
        priority: u32,
    },
    /// A holder's heartbeat that also checks the hand-overs asked of it:
    /// for each `(key, backend)`, whether that backend, or a watch session
    /// of its locker (one whose `application_name` reads [`WATCH_OF`] and
    /// that backend's pid, see [`Statement::Wait`]), waits for the key (an
    /// ungranted advisory lock on it in `pg_locks`). What
    /// [`Statement::Heartbeat`] answers, then, for each key, the first ask
    /// that waits: a `(7, ordinal << 32 | the backend that waits)` row
    /// (ordinal 1-based, in the order given, [`CheckReply`]), announced on
    /// [`HANDOVER_CHANNEL`] as `to <key> <the backend that waits>` from this
    /// backend. It tries no key.
    CheckHandover {
        /// The hand-overs asked for.
        asks: Vec<(i64, i64)>,
    },
}

#[cfg(test)]
mod tests;
