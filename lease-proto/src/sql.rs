//! Every statement the machine sends, and the one row shape they all return.
//!
//! A driver never needs to know what a statement means: it sends
//! [`Statement::sql`] with the simple-query protocol (one round trip, no
//! prepared statements, so it behaves the same through any pooler; the only
//! values in the text are integers the machine formats itself), and hands back
//! every row of every result set, in order, as a [`Row`]: a list of nullable
//! `int8` columns, decoded from text by [`decode_text_row`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};

/// The `pg_locks` key expression as a literal, for `concat!`.
macro_rules! advisory_key {
    () => {
        "((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) \
         OPERATOR(pg_catalog.|) objid::pg_catalog.int8)"
    };
}

/// Granted single-`bigint` advisory locks of the current database, as a
/// subquery with columns `k` (the key) and `pid` (the holder's backend).
macro_rules! this_database_advisory_locks {
    () => {
        concat!(
            "SELECT ",
            advisory_key!(),
            " AS k, pid FROM pg_catalog.pg_locks \
             WHERE locktype OPERATOR(pg_catalog.=) 'advisory' \
             AND objsubid OPERATOR(pg_catalog.=) 1 AND granted \
             AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
             WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())"
        )
    };
}

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

/// The payload on [`HANDOVER_CHANNEL`] that asks the locker leading `key`
/// to hand it over to the lease session of backend `pid` (the rule:
/// the machine's `handover`): `to <key> <pid>`, sent with
/// `SELECT pg_catalog.pg_notify('lease_handover_v1', '<payload>')`.
pub fn handover_request_payload(key: i64, pid: i64) -> String {
    format!("to {key} {pid}")
}

/// The key and the release's moment (`None`: a payload without one) of a
/// release's notification on [`HANDOVER_CHANNEL`].
pub(crate) fn handover_release(payload: &str) -> Option<ReleaseNotice> {
    let mut words = payload.split_whitespace();
    let key = words.next()?.parse().ok()?;
    let at = match words.next() {
        None => None,
        Some(w) => Some(w.parse().ok()?),
    };
    let grantee = match words.next() {
        None => None,
        Some(w) => Some(w.parse::<i64>().ok()?).filter(|&g| g != 0),
    };
    let reserved = match words.next() {
        None => None,
        Some(w) => Some(w.parse::<i64>().ok()?).filter(|&r| r != 0),
    };
    words.next().is_none().then_some(ReleaseNotice {
        key,
        at,
        grantee,
        reserved,
    })
}

/// A release's notification on [`HANDOVER_CHANNEL`] (`<key> <at> [<grantee>
/// [<reserved>]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReleaseNotice {
    /// The released key.
    pub(crate) key: i64,
    /// The release's moment on the server's clock, in fencing-token units
    /// (`None`: a payload without one).
    pub(crate) at: Option<i64>,
    /// The backend the server granted the key to at the release: the first
    /// [`Statement::Take`] in its queue (`None`: no take was first).
    pub(crate) grantee: Option<i64>,
    /// The backend the releasing holder handed the key over to by name, if
    /// it still waited for the key at the release (see `handover`).
    pub(crate) reserved: Option<i64>,
}

/// The key and backend pid of a [`handover_request_payload`].
pub(crate) fn handover_request(payload: &str) -> Option<(i64, i64)> {
    let mut words = payload.trim().strip_prefix("to ")?.split_whitespace();
    let key = words.next()?.parse().ok()?;
    let pid = words.next()?.parse().ok()?;
    words.next().is_none().then_some((key, pid))
}

/// The key and the claiming member's backend pid of a lease group's claim
/// (`claim <key> <pid>`, sent by [`Statement::Members`]).
pub(crate) fn group_claim(payload: &str) -> Option<(i64, i64)> {
    let mut words = payload.trim().strip_prefix("claim ")?.split_whitespace();
    let key = words.next()?.parse().ok()?;
    let pid = words.next()?.parse().ok()?;
    words.next().is_none().then_some((key, pid))
}

/// A [`Statement::Prefer`]'s payload (`prefer <key> <pid> <priority>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Preference {
    pub(crate) key: i64,
    /// The asking standby's lease session backend.
    pub(crate) pid: i64,
    pub(crate) priority: u32,
}

/// The [`Preference`] of a [`Statement::Prefer`]'s payload.
pub(crate) fn handover_preference(payload: &str) -> Option<Preference> {
    let mut words = payload.trim().strip_prefix("prefer ")?.split_whitespace();
    let key = words.next()?.parse().ok()?;
    let pid = words.next()?.parse().ok()?;
    let priority = words
        .next()?
        .parse()
        .ok()
        .filter(|p| *p <= crate::options::MAX_PRIORITY)?;
    words
        .next()
        .is_none()
        .then_some(Preference { key, pid, priority })
}

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
    /// The server's clock ([`super::SERVER_CLOCK_US_SQL`]).
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

/// The setup's first statement: reads `pg_control_checkpoint()` into
/// [`CHECKPOINT_SETTING`]. PUBLIC may execute it by default (measured with a
/// role without privileges on PostgreSQL 15), but a DBA or a managed service
/// may revoke that, and a function the role may not execute fails the whole
/// statement that names it (the check is made when the plan starts, whatever
/// a `CASE` says): the `DO` block catches `insufficient_privilege` and
/// leaves the setting unset (the checkpoint unknown: see
/// `PromotionState::hold`).
const SETUP_CHECKPOINT_PRELUDE: &str =
    "DO $lease$BEGIN PERFORM pg_catalog.set_config('lease.checkpoint', \
     (SELECT pg_catalog.concat(c.timeline_id, ',', pg_catalog.floor(1000 OPERATOR(pg_catalog.*) \
     pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) \
     c.checkpoint_time))::pg_catalog.int8) \
     FROM pg_catalog.pg_control_checkpoint() c), true); \
     EXCEPTION WHEN insufficient_privilege THEN NULL; END$lease$; ";

/// The transaction-local custom setting in which the setup's second
/// statement leaves the age (ms) of the current timeline's history file.
pub const HISTORY_SETTING: &str = "lease.history";

/// The setup's second statement: reads the modification time of the
/// current timeline's history file (`0000000N.history`) with
/// `pg_ls_waldir()` into [`HISTORY_SETTING`] (empty when there is none:
/// timeline 1). Only superusers and members of `pg_monitor` may call it:
/// `insufficient_privilege` leaves the setting unset, and so does
/// `pg_current_wal_lsn()` in recovery (`object_not_in_prerequisite_state`),
/// where the setup refuses anyway. It lists `pg_wal`, once per session.
const SETUP_HISTORY_PRELUDE: &str =
    "DO $lease$BEGIN PERFORM pg_catalog.set_config('lease.history', COALESCE(\
     (SELECT pg_catalog.floor(1000 OPERATOR(pg_catalog.*) pg_catalog.date_part('epoch', \
     pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) w.modification))::pg_catalog.int8\
     ::pg_catalog.text FROM pg_catalog.pg_ls_waldir() w \
     WHERE w.name OPERATOR(pg_catalog.=) pg_catalog.concat(pg_catalog.substr(\
     pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8), '.history')), ''), \
     true); \
     EXCEPTION WHEN insufficient_privilege OR object_not_in_prerequisite_state THEN NULL; \
     END$lease$; ";

/// Field `n` (1 or 2) of [`CHECKPOINT_SETTING`] as an `int8`, NULL when the
/// setting is unset or empty.
macro_rules! checkpoint_field {
    ($n:literal) => {
        concat!(
            "(SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END \
             FROM pg_catalog.split_part(pg_catalog.current_setting('lease.checkpoint', true), \
             ',', ",
            $n,
            ") AS s)"
        )
    };
}

/// The setup's rows of [`crate::reply::PromotionState`] (see `promotion.rs`): WAL
/// received or a transaction replayed since the server started, the current
/// WAL timeline (NULL in recovery, where `pg_current_wal_lsn()` errors), and
/// the latest checkpoint's timeline and age on the server's clock, in ms,
/// from [`SETUP_CHECKPOINT_PRELUDE`] (NULL when it could not read them), and
/// the history file's age from [`SETUP_HISTORY_PRELUDE`] (NULL: none, or
/// not readable).
const SETUP_PROMOTION_SQL: &str = concat!(
    " UNION ALL SELECT 40, (pg_catalog.pg_last_wal_receive_lsn() IS NOT NULL \
     OR pg_catalog.pg_last_xact_replay_timestamp() IS NOT NULL)::pg_catalog.int4::pg_catalog.int8",
    " UNION ALL SELECT 41, CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL \
     ELSE pg_catalog.concat('x', pg_catalog.substr(pg_catalog.pg_walfile_name(\
     pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 END",
    " UNION ALL SELECT 42, ",
    checkpoint_field!(1),
    " UNION ALL SELECT 43, ",
    checkpoint_field!(2),
    " UNION ALL SELECT 44, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' \
     THEN s::pg_catalog.int8 END FROM COALESCE(\
     pg_catalog.current_setting('lease.history', true), '') AS s)",
);

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
    /// The server's clock ([`super::SERVER_CLOCK_US_SQL`]).
    pub const SERVER_CLOCK_US: i64 = 6;
    /// A hand-over asked for whose backend waits for its key
    /// ([`Statement::CheckHandover`](super::Statement::CheckHandover)).
    pub const WAITING: i64 = 7;
}

/// The server's clock, `clock_timestamp()`, in microseconds since the Unix
/// epoch: the reading fencing tokens are made of (less
/// [`TOKEN_CLOCK_OFFSET`]). The setup and the heartbeat answer it, so the
/// machine sees a server clock that stepped back (see
/// [`Event::ServerClockStepped`](crate::Event::ServerClockStepped)).
/// `extract` is grammar, which qualifies it itself.
const SERVER_CLOCK_US_SQL: &str = "(extract(epoch FROM pg_catalog.clock_timestamp()) \
     OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8";

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

/// The session's `deadlock_timeout` in ms, as an expression: its shown
/// value carries its unit (`1s`, `100ms`, `2min`), which the interval input
/// reads under any `IntervalStyle`. Not `pg_settings`, which builds a row for
/// every setting of the server: read in the `DO` block of a statement on the
/// takeover's path it once took 4.5 ms of 8 ms on PostgreSQL 15; this takes
/// microseconds.
const DEADLOCK_TIMEOUT_MS_SQL: &str =
    "(extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval) \
     OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8";

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

/// The granted advisory locks of this backend on `key` in this database (only
/// the exclusive ones, with `exclusive`), as a `SELECT` for `EXISTS`.
fn locks_here(key: i64, exclusive: bool) -> String {
    format!(
        "SELECT FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' \
         AND objsubid OPERATOR(pg_catalog.=) 1 AND granted {}\
         AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() \
         AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
         WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) \
         AND {} OPERATOR(pg_catalog.=) ({key})::pg_catalog.int8",
        if exclusive {
            "AND mode OPERATOR(pg_catalog.<>) 'ShareLock' "
        } else {
            ""
        },
        advisory_key!()
    )
}

/// The advisory locks on key `{a}.k` in this database of backend `pid`
/// (an expression), as a `SELECT` for `EXISTS`: only the waiting ones, or
/// with `granted_too` the granted ones as well.
fn locks_of(a: &str, pid: &str, granted_too: bool) -> String {
    format!(
        "SELECT FROM pg_catalog.pg_locks AS w WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory' \
         AND w.objsubid OPERATOR(pg_catalog.=) 1 {}AND w.pid OPERATOR(pg_catalog.=) {pid} \
         AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
         WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) \
         AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) \
         OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) {a}.k",
        if granted_too {
            ""
        } else {
            "AND NOT w.granted "
        },
    )
}

/// A wait's crowd check, as the first statement of its `DO` block: with
/// `crowd` waiters of `key` or more with a smaller backend pid queued
/// already (ungranted advisory locks on it in `pg_locks`), the block
/// records [`wait_outcome::CROWDED`] and returns without queueing.
fn crowd_check(key: i64, crowd: Option<u32>) -> String {
    crowd.map_or(String::new(), |n| {
        format!(
            "IF {n} OPERATOR(pg_catalog.<=) (SELECT pg_catalog.count(pid) FROM pg_catalog.pg_locks \
             WHERE locktype OPERATOR(pg_catalog.=) 'advisory' \
             AND objsubid OPERATOR(pg_catalog.=) 1 AND NOT granted \
             AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
             WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) \
             AND pid OPERATOR(pg_catalog.<) pg_catalog.pg_backend_pid() \
             AND {} OPERATOR(pg_catalog.=) ({key})::pg_catalog.int8) THEN \
             PERFORM pg_catalog.set_config('{WAIT_SETTING}', '{}', true); RETURN; END IF; ",
            advisory_key!(),
            wait_outcome::CROWDED,
        )
    })
}

/// A transaction-local `lock_timeout` of `ms`, cut to [`wait_limit_ms`] of
/// the session's `deadlock_timeout`, as a statement of a `DO` block.
fn cut_lock_timeout(ms: u64) -> String {
    format!(
        "PERFORM pg_catalog.set_config('lock_timeout', \
         (SELECT (CASE WHEN l OPERATOR(pg_catalog.<) {ms} THEN l ELSE {ms} END)::pg_catalog.text \
         FROM (SELECT CASE WHEN m OPERATOR(pg_catalog.<) 1 THEN 1 ELSE m END AS l \
         FROM (SELECT d OPERATOR(pg_catalog.-) CASE WHEN d OPERATOR(pg_catalog./) 10 \
         OPERATOR(pg_catalog.>) 10 THEN d OPERATOR(pg_catalog./) 10 ELSE 10 END AS m \
         FROM (SELECT {DEADLOCK_TIMEOUT_MS_SQL} AS d) AS s) AS c) AS w), true); ",
        ms = ms.max(1)
    )
}

/// The server-side TCP settings the setup reads back, in the order of
/// [`Options::tcp_settings`](crate::Options::tcp_settings) and of
/// [`SetupReply::tcp_settings`].
pub const TCP_SETTINGS: [&str; 4] = [
    "tcp_user_timeout",
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
];

/// [`NONCE_SETTING`] as a literal, for `concat!`.
macro_rules! nonce_setting {
    () => {
        "lease.nonce"
    };
}

/// The custom setting holding the session's nonce: set by the setup, read
/// by every heartbeat. Another value means another client shares the
/// backend (a transaction pooler).
pub const NONCE_SETTING: &str = nonce_setting!();

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
pub const WAIT_PRELUDE_SQL: &str = concat!(
    "DO $lease$BEGIN PERFORM pg_catalog.set_config('statement_timeout', '0', true); ",
    "BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '250', true); ",
    "EXCEPTION WHEN OTHERS THEN NULL; END; ",
    "BEGIN PERFORM pg_catalog.set_config('transaction_timeout', '0', true); ",
    "EXCEPTION WHEN OTHERS THEN NULL; END; END$lease$; "
);

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
pub const PRIMARY_TIMELINE_SQL: &str = "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL \
     ELSE pg_catalog.concat('x', pg_catalog.substr(pg_catalog.pg_walfile_name(\
     pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 END";

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
pub const ADVISORY_KEY_SQL: &str = advisory_key!();

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
    /// (see [`Options::priority`](crate::Options::priority)): `NOTIFY` on
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

const THIS_DATABASE_ADVISORY_LOCKS: &str = this_database_advisory_locks!();

struct KeyArray<'a>(&'a [i64]);

/// Group ids as the `int4` first halves of their members' locks.
struct GroupArray<'a>(&'a [u32]);

impl fmt::Display for GroupArray<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("'{")?;
        for (i, g) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_char(',')?;
            }
            write!(f, "{}", *g as i32)?;
        }
        f.write_str("}'::pg_catalog.int4[]")
    }
}

impl fmt::Display for KeyArray<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("'{")?;
        for (i, k) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_char(',')?;
            }
            write!(f, "{k}")?;
        }
        f.write_str("}'::pg_catalog.int8[]")
    }
}

/// [`NONCE_SETTING`] as an `int8`, NULL when unset or empty (a placeholder
/// reset by `RESET ALL` reads as the empty string).
const NONCE_VALUE: &str = concat!(
    "(SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END \
     FROM pg_catalog.current_setting('",
    nonce_setting!(),
    "', true) AS s)"
);

impl Statement {
    /// The SQL text to send with the simple-query protocol.
    ///
    /// Every function, relation, type and operator in it is qualified with
    /// `pg_catalog.` (operators as `OPERATOR(pg_catalog.=)`), and none of the
    /// constructs that look an operator up by its bare name (`NULLIF`, `IS
    /// DISTINCT FROM`, `IN`, a simple `CASE`) is used: a role may own a
    /// schema with objects named like `pg_catalog`'s and put it first in its
    /// `search_path` (`pg_catalog` comes first only when the path does not
    /// name it). The session's `search_path` is also forced to `pg_catalog`
    /// ([`SEARCH_PATH`], a startup option or the setup's `set_config`) and
    /// read back by the setup, so a statement that slipped would still
    /// resolve there; a unit test scans every statement for unqualified
    /// names.
    pub fn sql(&self) -> String {
        match self {
            Statement::Listen => format!("LISTEN {HANDOVER_CHANNEL}"),
            Statement::Setup { nonce, settings } => {
                // Settings first, in a statement of their own (one simple
                // query, one round trip): the read-back below sees them.
                let mut sql = format!(
                    "SELECT {}::pg_catalog.int8, pg_catalog.length(pg_catalog.concat(\
                     pg_catalog.set_config('{NONCE_SETTING}', '{nonce}', false)",
                    setup_tag::APPLIED
                );
                for (name, value) in settings {
                    write!(sql, ", pg_catalog.set_config('{name}', '{value}', false)").ok();
                }
                sql.push_str("))::pg_catalog.int8; ");
                // `pg_settings` builds a row for every setting of the server
                // (about 1 ms a read on PostgreSQL 15): read once, for all.
                let setting = |name: &str| {
                    format!(
                        "(SELECT setting::pg_catalog.int8 FROM lease_settings \
                         WHERE name OPERATOR(pg_catalog.=) '{name}')"
                    )
                };
                let names = std::iter::once("idle_session_timeout")
                    .chain(TCP_SETTINGS)
                    .collect::<Vec<_>>()
                    .join(",");
                write!(
                    sql,
                    "WITH lease_settings AS (SELECT name, setting FROM pg_catalog.pg_settings \
                     WHERE name OPERATOR(pg_catalog.=) ANY ('{{{names}}}'::pg_catalog.text[])) \
                     SELECT {}::pg_catalog.int8, \
                     pg_catalog.current_setting('server_version_num')::pg_catalog.int8 \
                     UNION ALL SELECT {}, pg_catalog.pg_is_in_recovery()::pg_catalog.int4::pg_catalog.int8 \
                     UNION ALL SELECT {}, pg_catalog.pg_backend_pid()::pg_catalog.int8 \
                     UNION ALL SELECT {}, {} \
                     UNION ALL SELECT {}, \
                     (pg_catalog.inet_client_addr() IS NULL)::pg_catalog.int4::pg_catalog.int8 \
                     UNION ALL SELECT {}, {NONCE_VALUE} \
                     UNION ALL SELECT {}, (pg_catalog.current_setting('search_path') \
                     OPERATOR(pg_catalog.=) '{SEARCH_PATH}')::pg_catalog.int4::pg_catalog.int8 \
                     UNION ALL SELECT {}, {SERVER_CLOCK_US_SQL}",
                    setup_tag::SERVER_VERSION,
                    setup_tag::IN_RECOVERY,
                    setup_tag::BACKEND_PID,
                    setup_tag::IDLE_SESSION_TIMEOUT_MS,
                    setting("idle_session_timeout"),
                    setup_tag::UNIX_SOCKET,
                    setup_tag::NONCE,
                    setup_tag::SEARCH_PATH,
                    setup_tag::SERVER_CLOCK_US,
                )
                .ok();
                for (i, name) in TCP_SETTINGS.iter().enumerate() {
                    let tag = setup_tag::TCP_FIRST + i as i64;
                    write!(sql, " UNION ALL SELECT {tag}, {}", setting(name)).ok();
                }
                format!(
                    "{SETUP_CHECKPOINT_PRELUDE}{SETUP_HISTORY_PRELUDE}{sql}{SETUP_PROMOTION_SQL}"
                )
            }
            // The aggregate consumes every try before the outer query runs, so
            // clock_timestamp() is read after the last lock of the batch was
            // granted, and only if one was (`extract` is grammar, which
            // qualifies it itself). CASE fixes the order of the checks before each try. The keys this
            // backend already holds (another client's, behind a transaction
            // pooler) are read once, by an uncorrelated subquery (an init
            // plan, evaluated before the first try): a per-key `EXISTS` over
            // pg_locks made the try quadratic in the number of keys.
            Statement::TryLock {
                keys,
                backend_pid,
                nonce,
            } => {
                format!(
                    "WITH t AS (SELECT pg_catalog.array_agg(k) AS won FROM pg_catalog.unnest({a}) AS k \
                     WHERE CASE WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) {backend_pid} \
                     OR coalesce(pg_catalog.current_setting('{NONCE_SETTING}', true) \
                     OPERATOR(pg_catalog.<>) '{nonce}', true) \
                     OR pg_catalog.pg_is_in_recovery() THEN false \
                     WHEN k OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.k \
                     FROM ({THIS_DATABASE_ADVISORY_LOCKS}) AS o \
                     WHERE o.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())) THEN false \
                     ELSE pg_catalog.pg_try_advisory_lock(k) END), \
                     x AS (SELECT t.won, CASE WHEN t.won IS NOT NULL THEN \
                     {TOKEN_CLOCK_OFFSET}::pg_catalog.int8 OPERATOR(pg_catalog.+) \
                     (extract(epoch FROM pg_catalog.clock_timestamp()) \
                     OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 END AS token FROM t) \
                     SELECT NULL::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8, \
                     {NONCE_VALUE} \
                     UNION ALL \
                     SELECT w.k, x.token, NULL FROM x, pg_catalog.unnest(x.won) AS w(k) \
                     UNION ALL \
                     SELECT l.k, NULL, h.pid::pg_catalog.int8 FROM x \
                     CROSS JOIN pg_catalog.unnest({a}) AS l(k) \
                     LEFT JOIN ({THIS_DATABASE_ADVISORY_LOCKS}) AS h ON h.k OPERATOR(pg_catalog.=) l.k \
                     WHERE NOT (l.k OPERATOR(pg_catalog.=) ANY (coalesce(x.won, '{{}}')))",
                a = KeyArray(keys),
                )
            }
            Statement::Heartbeat => format!(
                "SELECT {}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8 \
                 UNION ALL SELECT {}, {NONCE_VALUE} \
                 UNION ALL SELECT {}, {SERVER_CLOCK_US_SQL}",
                heartbeat_tag::BACKEND_PID,
                heartbeat_tag::NONCE,
                heartbeat_tag::SERVER_CLOCK_US,
            ),
            // Three statements, one implicit transaction: the prelude (see
            // `WAIT_PRELUDE_SQL`), the wait, whose lock timeout is caught and
            // recorded in `WAIT_SETTING`, and the reply, read after the wait.
            // The lock timeout: the one asked for, cut to `wait_limit_ms` of
            // the session's deadlock_timeout (ms). With a crowd limit, the
            // waiters already queued for the key are counted first.
            Statement::Wait {
                key,
                timeout_ms,
                crowd,
                watch_of,
            } => format!(
                "{WAIT_PRELUDE_SQL}\
                 DO $lease$BEGIN {crowded}{named}{cut}PERFORM pg_catalog.pg_advisory_xact_lock_shared({key}); \
                 PERFORM pg_catalog.set_config('{WAIT_SETTING}', '1', true); \
                 EXCEPTION WHEN lock_not_available THEN \
                 PERFORM pg_catalog.set_config('{WAIT_SETTING}', '0', true); END$lease$; \
                 SELECT {}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8 \
                 UNION ALL \
                 SELECT {}, {NONCE_VALUE} \
                 UNION ALL \
                 SELECT {}, pg_catalog.current_setting('{WAIT_SETTING}')::pg_catalog.int8 \
                 UNION ALL \
                 SELECT {}, {DEADLOCK_TIMEOUT_MS_SQL}",
                heartbeat_tag::BACKEND_PID,
                heartbeat_tag::NONCE,
                heartbeat_tag::FREED,
                heartbeat_tag::DEADLOCK_TIMEOUT_MS,
                cut = cut_lock_timeout(*timeout_ms),
                crowded = crowd_check(*key, *crowd),
                named = watch_of.map_or(String::new(), |p| format!(
                    "PERFORM pg_catalog.set_config('application_name', pg_catalog.concat('{WATCH_OF}{p}: ', \
                     pg_catalog.current_setting('application_name')), true); "
                )),
            ),
            // The same three statements as a wait's, the checks of a try
            // before the lock, and the token read after it (see `Take`).
            Statement::Take {
                key,
                timeout_ms,
                crowd,
                backend_pid,
                nonce,
            } => format!(
                "{WAIT_PRELUDE_SQL}\
                 DO $lease$BEGIN {crowded}\
                 IF pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) {backend_pid} \
                 OR coalesce(pg_catalog.current_setting('{NONCE_SETTING}', true) \
                 OPERATOR(pg_catalog.<>) '{nonce}', true) OR pg_catalog.pg_is_in_recovery() THEN \
                 PERFORM pg_catalog.set_config('{WAIT_SETTING}', '{held}', true); RETURN; END IF; \
                 IF EXISTS ({any_here}) THEN \
                 PERFORM pg_catalog.set_config('{WAIT_SETTING}', '{held_here}', true); RETURN; END IF; \
                 {cut}BEGIN PERFORM pg_catalog.pg_advisory_lock({key}); \
                 EXCEPTION WHEN lock_not_available THEN NULL; END; \
                 IF EXISTS ({here}) THEN \
                 PERFORM pg_catalog.set_config('{TOKEN_SETTING}', ({TOKEN_CLOCK_OFFSET}::pg_catalog.int8 \
                 OPERATOR(pg_catalog.+) (extract(epoch FROM pg_catalog.clock_timestamp()) \
                 OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8)::pg_catalog.text, true); \
                 PERFORM pg_catalog.set_config('{WAIT_SETTING}', '{freed}', true); \
                 ELSE PERFORM pg_catalog.set_config('{WAIT_SETTING}', '{held}', true); END IF; \
                 END$lease$; \
                 SELECT {}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8 \
                 UNION ALL \
                 SELECT {}, {NONCE_VALUE} \
                 UNION ALL \
                 SELECT {}, pg_catalog.current_setting('{WAIT_SETTING}')::pg_catalog.int8 \
                 UNION ALL \
                 SELECT {}, {DEADLOCK_TIMEOUT_MS_SQL} \
                 UNION ALL \
                 SELECT {}, pg_catalog.current_setting('{TOKEN_SETTING}')::pg_catalog.int8 \
                 WHERE pg_catalog.current_setting('{WAIT_SETTING}') OPERATOR(pg_catalog.=) '{freed}'",
                heartbeat_tag::BACKEND_PID,
                heartbeat_tag::NONCE,
                heartbeat_tag::FREED,
                heartbeat_tag::DEADLOCK_TIMEOUT_MS,
                heartbeat_tag::TOKEN,
                crowded = crowd_check(*key, *crowd),
                here = locks_here(*key, true),
                any_here = locks_here(*key, false),
                cut = cut_lock_timeout(*timeout_ms),
                held = wait_outcome::HELD,
                held_here = wait_outcome::HELD_HERE,
                freed = wait_outcome::FREED,
            ),
            Statement::Prefer { key, priority } => format!(
                "SELECT {}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8 \
                 FROM (SELECT pg_catalog.pg_notify('{HANDOVER_CHANNEL}', pg_catalog.concat(\
                 'prefer ', ({key})::pg_catalog.int8::pg_catalog.text, ' ', \
                 pg_catalog.pg_backend_pid()::pg_catalog.text, ' ', \
                 ({priority})::pg_catalog.int8::pg_catalog.text))) AS n \
                 UNION ALL SELECT {}, {NONCE_VALUE}",
                heartbeat_tag::BACKEND_PID,
                heartbeat_tag::NONCE,
            ),
            // The first ask of each key (in the order given) whose backend
            // waits is answered by its ordinal and announced from this
            // backend as `to <key> <pid>`, at commit.
            Statement::CheckHandover { asks } => {
                let column = |f: fn(&(i64, i64)) -> i64| asks.iter().map(f).collect::<Vec<_>>();
                let asks = format!(
                    "ROWS FROM (pg_catalog.unnest({}), pg_catalog.unnest({})) WITH ORDINALITY",
                    KeyArray(&column(|a| a.0)),
                    KeyArray(&column(|a| a.1)),
                );
                // Per ask: the backend that waits for its key, the named one
                // first, else a watch session that names it, or NULL.
                let waiting = |a: &str| {
                    format!(
                        "coalesce((SELECT {a}.p WHERE EXISTS ({})), (SELECT w.pid::pg_catalog.int8 \
                         FROM pg_catalog.pg_locks AS w JOIN pg_catalog.pg_stat_activity AS s \
                         ON s.pid OPERATOR(pg_catalog.=) w.pid \
                         WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory' \
                         AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted \
                         AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
                         WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) \
                         AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) \
                         OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) {a}.k \
                         AND pg_catalog.starts_with(s.application_name, \
                         pg_catalog.concat('{WATCH_OF}', {a}.p, ':')) LIMIT 1))",
                        locks_of(a, &format!("{a}.p"), false),
                    )
                };
                format!(
                    "{} UNION ALL SELECT {}, (c.o OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) c.w \
                     FROM (SELECT a.o, a.w, pg_catalog.pg_notify('{HANDOVER_CHANNEL}', \
                     pg_catalog.concat('to ', a.k, ' ', a.w)) \
                     FROM (SELECT a.k, a.o, {} AS w FROM {asks} AS a(k, p, o)) AS a \
                     WHERE a.w IS NOT NULL AND NOT EXISTS (SELECT FROM {asks} AS b(k, p, o) \
                     WHERE b.k OPERATOR(pg_catalog.=) a.k AND b.o OPERATOR(pg_catalog.<) a.o \
                     AND {} IS NOT NULL)) AS c",
                    Statement::Heartbeat.sql(),
                    heartbeat_tag::WAITING,
                    waiting("a"),
                    waiting("b"),
                )
            }
            Statement::Verify => format!(
                "{} UNION ALL \
                 SELECT {}, s.k FROM ({THIS_DATABASE_ADVISORY_LOCKS}) AS s \
                 WHERE s.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()",
                Statement::Heartbeat.sql(),
                heartbeat_tag::HELD_KEY,
            ),
            Statement::Members {
                join,
                leave,
                groups,
                keys,
                notify,
                announce,
                claims,
            } => {
                let mut sql = String::new();
                if *notify && !claims.is_empty() {
                    write!(
                        sql,
                        "SELECT {}::pg_catalog.int8, c, \
                         pg_catalog.length(pg_catalog.concat(\
                         pg_catalog.pg_notify('{HANDOVER_CHANNEL}', \
                         pg_catalog.concat('claim ', c, ' ', pg_catalog.pg_backend_pid()))))\
                         ::pg_catalog.int8 \
                         FROM pg_catalog.unnest({}) AS c; ",
                        members_tag::LEFT,
                        KeyArray(claims)
                    )
                    .ok();
                }
                if *notify && !announce.is_empty() {
                    write!(
                        sql,
                        "SELECT {}::pg_catalog.int8, j::pg_catalog.int8, \
                         pg_catalog.length(pg_catalog.concat(\
                         pg_catalog.pg_notify('{HANDOVER_CHANNEL}', \
                         pg_catalog.concat('group ', (j::pg_catalog.int8 \
                         OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.text))))::pg_catalog.int8 \
                         FROM pg_catalog.unnest({}) AS j; ",
                        members_tag::LEFT,
                        GroupArray(announce)
                    )
                    .ok();
                }
                if !join.is_empty() {
                    let announce = if *notify {
                        format!(
                            ", pg_catalog.pg_notify('{HANDOVER_CHANNEL}', \
                             pg_catalog.concat('group ', (j::pg_catalog.int8 \
                             OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.text))"
                        )
                    } else {
                        String::new()
                    };
                    write!(
                        sql,
                        "SELECT {}::pg_catalog.int8, j::pg_catalog.int8, \
                         pg_catalog.length(pg_catalog.concat(pg_catalog.pg_try_advisory_lock(j, \
                         pg_catalog.pg_backend_pid()){announce}))::pg_catalog.int8 \
                         FROM pg_catalog.unnest({}) AS j; ",
                        members_tag::JOINED,
                        GroupArray(join)
                    )
                    .ok();
                }
                if !leave.is_empty() {
                    write!(
                        sql,
                        "SELECT {}::pg_catalog.int8, j::pg_catalog.int8, \
                         pg_catalog.pg_advisory_unlock(j, pg_catalog.pg_backend_pid())\
                         ::pg_catalog.int4::pg_catalog.int8 \
                         FROM pg_catalog.unnest({}) AS j; ",
                        members_tag::LEFT,
                        GroupArray(leave)
                    )
                    .ok();
                }
                let ids: Vec<i64> = groups.iter().map(|g| i64::from(*g)).collect();
                write!(
                    sql,
                    "SELECT {}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8, \
                     {NONCE_VALUE} \
                     UNION ALL \
                     SELECT {}, m.classid::pg_catalog.int8, m.objid::pg_catalog.int8 \
                     FROM pg_catalog.pg_locks AS m \
                     WHERE m.locktype OPERATOR(pg_catalog.=) 'advisory' \
                     AND m.objsubid OPERATOR(pg_catalog.=) 2 AND m.granted \
                     AND m.objid::pg_catalog.int8 OPERATOR(pg_catalog.=) m.pid::pg_catalog.int8 \
                     AND m.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
                     WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) \
                     AND m.classid::pg_catalog.int8 OPERATOR(pg_catalog.=) ANY ({}) \
                     UNION ALL \
                     SELECT {}, l.k, h.pid::pg_catalog.int8 FROM pg_catalog.unnest({}) AS l(k) \
                     LEFT JOIN ({THIS_DATABASE_ADVISORY_LOCKS}) AS h \
                     ON h.k OPERATOR(pg_catalog.=) l.k",
                    members_tag::SESSION,
                    members_tag::MEMBER,
                    KeyArray(&ids),
                    members_tag::HOLDER,
                    KeyArray(keys),
                )
                .ok();
                sql
            }
            Statement::Release {
                keys,
                notify: false,
                ..
            } => format!(
                "SELECT k, pg_catalog.pg_advisory_unlock(k)::pg_catalog.int4::pg_catalog.int8 \
                 FROM pg_catalog.unnest({}) AS k",
                KeyArray(keys)
            ),
            // Two statements, one implicit transaction: a `DO` block unlocks
            // every key, the release's moment read once before the first
            // unlock (on the server's clock in the fencing token's units; 0:
            // not held; before, so that a take granted in an unlock reads its
            // token after it: a join row is read before its row's unlock runs),
            // then reads who holds each key now from `pg_locks` once (the
            // first take in a key's queue is granted it in the unlock) and
            // notifies; the rows come from what it left in
            // `RELEASED_SETTING`.
            Statement::Release {
                keys,
                notify: true,
                reserved,
            } => format!(
                "DO $lease$DECLARE t pg_catalog.int8[]; BEGIN \
                 SELECT pg_catalog.array_agg(CASE WHEN pg_catalog.pg_advisory_unlock(u.k) \
                 THEN c.t ELSE 0 END ORDER BY u.o) \
                 INTO t FROM pg_catalog.unnest({a}) WITH ORDINALITY AS u(k, o), \
                 (SELECT {TOKEN_CLOCK_OFFSET}::pg_catalog.int8 \
                 OPERATOR(pg_catalog.+) (extract(epoch FROM pg_catalog.clock_timestamp()) \
                 OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 AS t) AS c; \
                 PERFORM pg_catalog.pg_notify('{HANDOVER_CHANNEL}', pg_catalog.concat(r.k, ' ', r.t, \
                 CASE WHEN v.k IS NULL THEN ' ' OPERATOR(pg_catalog.||) g.pid::pg_catalog.text \
                 ELSE pg_catalog.concat(' ', coalesce(g.pid, 0), ' ', v.p) END)) \
                 FROM ROWS FROM (pg_catalog.unnest({a}), pg_catalog.unnest(t)) AS r(k, t) \
                 LEFT JOIN ({THIS_DATABASE_ADVISORY_LOCKS} AND mode OPERATOR(pg_catalog.<>) 'ShareLock' \
                 AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()) AS g \
                 ON g.k OPERATOR(pg_catalog.=) r.k \
                 LEFT JOIN (SELECT a.k, a.p FROM ROWS FROM (pg_catalog.unnest({rk}), \
                 pg_catalog.unnest({rp}), pg_catalog.unnest({rq})) AS a(k, p, q) \
                 WHERE EXISTS ({asked}) OR {recent}) AS v ON v.k OPERATOR(pg_catalog.=) r.k \
                 WHERE r.t OPERATOR(pg_catalog.>) 0; \
                 PERFORM pg_catalog.set_config('{RELEASED_SETTING}', \
                 coalesce(t, '{{}}')::pg_catalog.text, true); \
                 END$lease$; \
                 SELECT r.k, (r.t OPERATOR(pg_catalog.>) 0)::pg_catalog.int4::pg_catalog.int8 \
                 FROM ROWS FROM (pg_catalog.unnest({a}), pg_catalog.unnest(\
                 pg_catalog.current_setting('{RELEASED_SETTING}')::pg_catalog.int8[])) AS r(k, t)",
                a = KeyArray(keys),
                rk = KeyArray(&reserved.iter().map(|r| r.0).collect::<Vec<_>>()),
                rp = KeyArray(&reserved.iter().map(|r| r.1).collect::<Vec<_>>()),
                rq = KeyArray(&reserved.iter().map(|r| r.2).collect::<Vec<_>>()),
                asked = locks_of("a", "a.p", true),
                recent = "(a.q OPERATOR(pg_catalog.=) 1 AND EXISTS (SELECT FROM \
                     pg_catalog.pg_stat_activity WHERE pid OPERATOR(pg_catalog.=) a.p))",
            ),
        }
    }
}

/// Why a row could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The zero-based column.
    pub column: usize,
    /// The text that is not a decimal `int8`.
    pub text: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "column {} of a lease reply is not an int8: {:?}",
            self.column, self.text
        )
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one simple-query (text format) row: every column is a decimal
/// `int8` or NULL (`None`).
///
/// # Errors
/// [`DecodeError`] if a column is not a decimal `int8`; a driver reports that
/// as the statement's error.
pub fn decode_text_row<'a>(
    columns: impl IntoIterator<Item = Option<&'a str>>,
) -> Result<Row, DecodeError> {
    columns
        .into_iter()
        .enumerate()
        .map(|(column, text)| match text {
            None => Ok(None),
            Some(t) => t.parse::<i64>().map(Some).map_err(|_| DecodeError {
                column,
                text: t.chars().take(64).collect(),
            }),
        })
        .collect()
}

/// A reply that breaks the rules of its statement.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplyError {
    /// The setup reply lacks a value it must have.
    SetupIncomplete {
        /// What is missing: `"server_version"`, `"in_recovery"` or `"backend_pid"`.
        missing: &'static str,
    },
    /// A heartbeat row is not `(0, pid)`, `(2, nonce)` or `(6, server
    /// clock)`, or a verify row
    /// none of those nor `(1, key)`.
    HeartbeatRow(Row),
    /// A release row is not `(key, 0 or 1)`.
    ReleaseRow(Row),
    /// The reply of [`PRIMARY_TIMELINE_SQL`] is not a positive integer.
    Timeline(String),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::SetupIncomplete { missing } => {
                write!(f, "malformed setup reply: no {missing}")
            }
            ReplyError::HeartbeatRow(row) => write!(f, "malformed heartbeat reply: row {row:?}"),
            ReplyError::ReleaseRow(row) => write!(f, "malformed release reply: row {row:?}"),
            ReplyError::Timeline(text) => {
                write!(
                    f,
                    "malformed WAL timeline: {text:?} is not a positive integer"
                )
            }
        }
    }
}

impl std::error::Error for ReplyError {}

/// The reply to [`Statement::Setup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupReply {
    /// `server_version_num`.
    pub server_version: i64,
    /// `pg_is_in_recovery()`: the server is a hot standby.
    pub in_recovery: bool,
    /// `pg_backend_pid()`.
    pub backend_pid: i64,
    /// `idle_session_timeout` in ms (0: off); `None` when the server has no
    /// such setting (before 14).
    pub idle_session_timeout_ms: Option<i64>,
    /// The [`TCP_SETTINGS`] in the server's units (`None`: not reported).
    /// They read 0 over a Unix socket, where the server ignores them.
    pub tcp_settings: [Option<i64>; 4],
    /// The client is on a Unix socket (`inet_client_addr()` is NULL).
    pub unix_socket: bool,
    /// [`NONCE_SETTING`] read back (`None`: unset).
    pub nonce: Option<i64>,
    /// `search_path` reads back as [`SEARCH_PATH`] (false also when the
    /// row is missing).
    pub search_path_catalog: bool,
    /// What the server shows of a recent promotion (missing rows: never
    /// promoted).
    pub promotion: crate::reply::PromotionState,
    /// The server's clock in microseconds since the Unix epoch, read by the
    /// setup (`None`: no such row).
    pub server_clock_us: Option<i64>,
}

impl SetupReply {
    /// Parses the `(tag, value)` rows. The first row of each tag counts;
    /// other rows are ignored.
    ///
    /// # Errors
    /// [`ReplyError::SetupIncomplete`] when the version, recovery state or
    /// backend pid is missing or NULL.
    pub fn parse(rows: &[Row]) -> Result<SetupReply, ReplyError> {
        let get = |tag: i64| {
            rows.iter()
                .find(|r| r.len() == 2 && r[0] == Some(tag))
                .and_then(|r| r[1])
        };
        let need = |tag: i64, missing: &'static str| {
            get(tag).ok_or(ReplyError::SetupIncomplete { missing })
        };
        Ok(SetupReply {
            server_version: need(setup_tag::SERVER_VERSION, "server_version")?,
            in_recovery: need(setup_tag::IN_RECOVERY, "in_recovery")? != 0,
            backend_pid: need(setup_tag::BACKEND_PID, "backend_pid")?,
            idle_session_timeout_ms: get(setup_tag::IDLE_SESSION_TIMEOUT_MS),
            tcp_settings: std::array::from_fn(|i| get(setup_tag::TCP_FIRST + i as i64)),
            unix_socket: get(setup_tag::UNIX_SOCKET).is_some_and(|u| u != 0),
            nonce: get(setup_tag::NONCE),
            search_path_catalog: get(setup_tag::SEARCH_PATH) == Some(1),
            promotion: crate::reply::PromotionState {
                replayed_since_start: get(setup_tag::REPLAYED_SINCE_START).is_some_and(|r| r != 0),
                wal_timeline: get(setup_tag::WAL_TIMELINE),
                checkpoint_timeline: get(setup_tag::CHECKPOINT_TIMELINE),
                checkpoint_age_ms: get(setup_tag::CHECKPOINT_AGE_MS),
                history_age_ms: get(setup_tag::HISTORY_AGE_MS),
            },
            server_clock_us: get(setup_tag::SERVER_CLOCK_US),
        })
    }

    /// The rows a server sends for this reply.
    pub fn to_rows(&self) -> Vec<Row> {
        vec![
            vec![Some(setup_tag::SERVER_VERSION), Some(self.server_version)],
            vec![
                Some(setup_tag::IN_RECOVERY),
                Some(i64::from(self.in_recovery)),
            ],
            vec![Some(setup_tag::BACKEND_PID), Some(self.backend_pid)],
            vec![
                Some(setup_tag::IDLE_SESSION_TIMEOUT_MS),
                self.idle_session_timeout_ms,
            ],
            vec![
                Some(setup_tag::UNIX_SOCKET),
                Some(i64::from(self.unix_socket)),
            ],
            vec![Some(setup_tag::NONCE), self.nonce],
            vec![
                Some(setup_tag::SEARCH_PATH),
                Some(i64::from(self.search_path_catalog)),
            ],
            vec![
                Some(setup_tag::REPLAYED_SINCE_START),
                Some(i64::from(self.promotion.replayed_since_start)),
            ],
            vec![Some(setup_tag::WAL_TIMELINE), self.promotion.wal_timeline],
            vec![
                Some(setup_tag::CHECKPOINT_TIMELINE),
                self.promotion.checkpoint_timeline,
            ],
            vec![
                Some(setup_tag::CHECKPOINT_AGE_MS),
                self.promotion.checkpoint_age_ms,
            ],
            vec![
                Some(setup_tag::HISTORY_AGE_MS),
                self.promotion.history_age_ms,
            ],
        ]
        .into_iter()
        .chain((self.server_clock_us).map(|c| vec![Some(setup_tag::SERVER_CLOCK_US), Some(c)]))
        .chain(
            (self.tcp_settings.iter().enumerate())
                .map(|(i, v)| vec![Some(setup_tag::TCP_FIRST + i as i64), *v]),
        )
        .collect()
    }
}

/// The reply to [`Statement::TryLock`].
///
/// Rows are `(NULL, backend_pid, nonce)` for the session that answered,
/// `(key, token, NULL)` for a key won and `(key, NULL, holder_pid)` for a key
/// not won. Only one answer per key tried counts: a row for a key
/// not tried, a second row for a key, or a row of any other shape is left out
/// and marks the reply untrusted (some key may be held without the machine
/// knowing: it verifies before anything else).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TryReply {
    /// `(key, fencing token)` of each key won, in row order.
    pub won: Vec<(i64, i64)>,
    /// `(key, holder's backend pid)` of each key not won, in row order; the
    /// pid is `None` when `pg_locks` did not show the holder.
    pub not_won: Vec<(i64, Option<i64>)>,
    /// A row broke the rules above.
    pub untrusted: bool,
    /// `(backend pid, nonce)` of the session that answered, from its row
    /// (the first one counts); `None` if no row had it.
    pub session: Option<(i64, Option<i64>)>,
}

impl TryReply {
    /// Parses the rows of a try of the keys `tried`.
    pub fn parse(tried: &[i64], rows: &[Row]) -> TryReply {
        let tried: BTreeSet<i64> = tried.iter().copied().collect();
        let mut seen = BTreeSet::new();
        let mut reply = TryReply::default();
        for row in rows {
            match row.as_slice() {
                [Some(key), ..] if !tried.contains(key) || !seen.insert(*key) => {
                    reply.untrusted = true
                }
                [Some(key), Some(token), _] => reply.won.push((*key, *token)),
                [Some(key), None, holder] => reply.not_won.push((*key, *holder)),
                [None, Some(pid), nonce] if reply.session.is_none() => {
                    reply.session = Some((*pid, *nonce))
                }
                _ => reply.untrusted = true,
            }
        }
        reply
    }

    /// The keys of `tried` this reply answers neither way.
    pub fn unanswered(&self, tried: &[i64]) -> Vec<i64> {
        let answered: BTreeSet<i64> = (self.won.iter().map(|(k, _)| *k))
            .chain(self.not_won.iter().map(|(k, _)| *k))
            .collect();
        tried
            .iter()
            .copied()
            .filter(|k| !answered.contains(k))
            .collect()
    }

    /// The rows a server sends for this reply: the session, every key won,
    /// then every key not won (`untrusted` is not encoded).
    pub fn to_rows(&self) -> Vec<Row> {
        let session = (self.session.iter()).map(|(pid, nonce)| vec![None, Some(*pid), *nonce]);
        let won = self.won.iter().map(|(k, t)| vec![Some(*k), Some(*t), None]);
        let not_won = (self.not_won.iter()).map(|(k, h)| vec![Some(*k), None, *h]);
        session.chain(won).chain(not_won).collect()
    }
}

/// The reply to [`Statement::Heartbeat`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeartbeatReply {
    /// `pg_backend_pid()` of the session that answered; `None` if no row had it.
    pub backend_pid: Option<i64>,
    /// [`NONCE_SETTING`] of that session; `None` if no row had it or it was unset.
    pub nonce: Option<i64>,
    /// The server's clock in microseconds since the Unix epoch, read by the
    /// statement; `None` if no row had it (a wait's reply has none).
    pub server_clock_us: Option<i64>,
}

impl HeartbeatReply {
    /// Parses the `(0, pid)`, `(2, nonce)` and `(6, server clock)` rows.
    ///
    /// # Errors
    /// [`ReplyError::HeartbeatRow`] for a row of any other shape.
    pub fn parse(rows: &[Row]) -> Result<HeartbeatReply, ReplyError> {
        let mut reply = HeartbeatReply::default();
        for row in rows {
            if !reply.parse_row(row) {
                return Err(ReplyError::HeartbeatRow(row.clone()));
            }
        }
        Ok(reply)
    }

    /// Takes in a `(0, pid)`, `(2, nonce)` or `(6, server clock)` row; false
    /// for any other.
    fn parse_row(&mut self, row: &Row) -> bool {
        match row.as_slice() {
            [Some(heartbeat_tag::BACKEND_PID), Some(p)] => self.backend_pid = Some(*p),
            [Some(heartbeat_tag::NONCE), n] => self.nonce = *n,
            [Some(heartbeat_tag::SERVER_CLOCK_US), Some(c)] => self.server_clock_us = Some(*c),
            _ => return false,
        }
        true
    }

    /// The rows a server sends for this reply.
    pub fn to_rows(&self) -> Vec<Row> {
        let pid = self
            .backend_pid
            .map(|p| vec![Some(heartbeat_tag::BACKEND_PID), Some(p)]);
        let nonce = vec![Some(heartbeat_tag::NONCE), self.nonce];
        let clock =
            (self.server_clock_us).map(|c| vec![Some(heartbeat_tag::SERVER_CLOCK_US), Some(c)]);
        pid.into_iter().chain([nonce]).chain(clock).collect()
    }
}

/// The reply to [`Statement::Wait`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WaitReply {
    /// The session that answered, as for [`Statement::Heartbeat`].
    pub session: HeartbeatReply,
    /// Whether the key was freed (else the wait ended by its lock timeout,
    /// the key held all along, or did not queue: `crowded`); `None`: no such
    /// row.
    pub freed: Option<bool>,
    /// The wait did not queue: as many sessions as its crowd limit already
    /// waited for the key (see [`Statement::Wait`]); `freed` is `false`.
    pub crowded: bool,
    /// The session's `deadlock_timeout` in ms, as the wait read it (see
    /// [`wait_limit_ms`]); `None`: no such row.
    pub deadlock_timeout_ms: Option<i64>,
    /// A [`Statement::Take`] took the key (`freed` is `true`): its fencing
    /// token.
    pub token: Option<i64>,
    /// A [`Statement::Take`] found its key held by its own backend already
    /// and did not wait (`freed` is `false`).
    pub held_here: bool,
}

impl WaitReply {
    /// Parses the `(0, pid)`, `(2, nonce)`, `(3, 1, 0, 2 or 3: freed or
    /// taken, held, crowded, held here)`, `(4, deadlock_timeout in ms)` and
    /// `(5, token)` rows.
    ///
    /// # Errors
    /// [`ReplyError::HeartbeatRow`] for a row of any other shape.
    pub fn parse(rows: &[Row]) -> Result<WaitReply, ReplyError> {
        let mut reply = WaitReply::default();
        for row in rows {
            match row.as_slice() {
                [Some(heartbeat_tag::FREED), Some(f)] => {
                    reply.freed = Some(*f == wait_outcome::FREED);
                    reply.crowded = *f == wait_outcome::CROWDED;
                    reply.held_here = *f == wait_outcome::HELD_HERE;
                    if !(wait_outcome::HELD..=wait_outcome::HELD_HERE).contains(f) {
                        return Err(ReplyError::HeartbeatRow(row.clone()));
                    }
                }
                [Some(heartbeat_tag::DEADLOCK_TIMEOUT_MS), Some(d)] => {
                    reply.deadlock_timeout_ms = Some(*d)
                }
                [Some(heartbeat_tag::TOKEN), Some(t)] => reply.token = Some(*t),
                _ if reply.session.parse_row(row) => {}
                _ => return Err(ReplyError::HeartbeatRow(row.clone())),
            }
        }
        Ok(reply)
    }

    /// The rows a server sends for this reply.
    pub fn to_rows(&self) -> Vec<Row> {
        let freed = (self.freed).map(|f| {
            let v = match (self.crowded, self.held_here, f) {
                (true, _, _) => wait_outcome::CROWDED,
                (_, true, _) => wait_outcome::HELD_HERE,
                (_, _, true) => wait_outcome::FREED,
                _ => wait_outcome::HELD,
            };
            vec![Some(heartbeat_tag::FREED), Some(v)]
        });
        let deadlock = (self.deadlock_timeout_ms)
            .map(|d| vec![Some(heartbeat_tag::DEADLOCK_TIMEOUT_MS), Some(d)]);
        let token = (self.token).map(|t| vec![Some(heartbeat_tag::TOKEN), Some(t)]);
        (self.session.to_rows().into_iter())
            .chain(freed)
            .chain(deadlock)
            .chain(token)
            .collect()
    }
}

/// The reply to [`Statement::Verify`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerifyReply {
    /// The session that answered, as for [`Statement::Heartbeat`].
    pub session: HeartbeatReply,
    /// Every advisory key that session holds in this database.
    pub held: BTreeSet<i64>,
}

impl VerifyReply {
    /// Parses the `(0, pid)`, `(2, nonce)` and `(1, key)` rows.
    ///
    /// # Errors
    /// [`ReplyError::HeartbeatRow`] for a row of any other shape.
    pub fn parse(rows: &[Row]) -> Result<VerifyReply, ReplyError> {
        let mut reply = VerifyReply::default();
        for row in rows {
            match row.as_slice() {
                [Some(heartbeat_tag::HELD_KEY), Some(k)] => {
                    reply.held.insert(*k);
                }
                _ if reply.session.parse_row(row) => {}
                _ => return Err(ReplyError::HeartbeatRow(row.clone())),
            }
        }
        Ok(reply)
    }

    /// The rows a server sends for this reply.
    pub fn to_rows(&self) -> Vec<Row> {
        let held = (self.held.iter()).map(|k| vec![Some(heartbeat_tag::HELD_KEY), Some(*k)]);
        self.session.to_rows().into_iter().chain(held).collect()
    }
}

/// The reply to [`Statement::CheckHandover`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckReply {
    /// What the heartbeat rows say.
    pub session: HeartbeatReply,
    /// The asks confirmed (the first that waits, per key): 1-based ordinal
    /// in the order asked → the backend found waiting (the named one, or a
    /// watch session of its locker).
    pub waiting: BTreeMap<i64, i64>,
}

impl CheckReply {
    /// Parses the heartbeat rows and the `(7, ordinal << 32 | backend)`
    /// rows.
    ///
    /// # Errors
    /// [`ReplyError::HeartbeatRow`] for a row of any other shape.
    pub fn parse(rows: &[Row]) -> Result<CheckReply, ReplyError> {
        let mut reply = CheckReply::default();
        for row in rows {
            match row.as_slice() {
                [Some(heartbeat_tag::WAITING), Some(v)] if *v > 0 => {
                    reply.waiting.insert(v >> 32, v & 0xffff_ffff);
                }
                _ if reply.session.parse_row(row) => {}
                _ => return Err(ReplyError::HeartbeatRow(row.clone())),
            }
        }
        Ok(reply)
    }

    /// The rows a server sends for this reply.
    pub fn to_rows(&self) -> Vec<Row> {
        let waiting = (self.waiting.iter())
            .map(|(o, pid)| vec![Some(heartbeat_tag::WAITING), Some(o << 32 | pid)]);
        self.session.to_rows().into_iter().chain(waiting).collect()
    }
}

/// The reply to [`Statement::Release`].
///
/// The machine does not need it: a key is released once the unlock statement
/// answered, whether or not the server still had it (a key it no longer had
/// was released by the session's end or never taken). Simulators and tests
/// use it to answer and read releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReleaseReply {
    /// `(key, whether this session held it)`, in the order asked.
    pub unlocked: Vec<(i64, bool)>,
}

impl ReleaseReply {
    /// Parses the `(key, 1 or 0)` rows.
    ///
    /// # Errors
    /// [`ReplyError::ReleaseRow`] for a row of any other shape.
    pub fn parse(rows: &[Row]) -> Result<ReleaseReply, ReplyError> {
        let unlocked = rows.iter().map(|row| match row.as_slice() {
            [Some(k), Some(held @ (0 | 1))] => Ok((*k, *held == 1)),
            _ => Err(ReplyError::ReleaseRow(row.clone())),
        });
        Ok(ReleaseReply {
            unlocked: unlocked.collect::<Result<_, _>>()?,
        })
    }

    /// The rows a server sends for this reply.
    pub fn to_rows(&self) -> Vec<Row> {
        let row = |(k, held): &(i64, bool)| vec![Some(*k), Some(i64::from(*held))];
        self.unlocked.iter().map(row).collect()
    }
}

/// The reply to [`Statement::Members`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MembersReply {
    /// `pg_backend_pid()` of the session that answered.
    pub backend_pid: Option<i64>,
    /// [`NONCE_SETTING`] of that session.
    pub nonce: Option<i64>,
    /// `(group id, member pid)` of every member lock read.
    pub members: BTreeSet<(u32, i64)>,
    /// `(key, holder pid)` of every key read; `None`: free.
    pub holders: Vec<(i64, Option<i64>)>,
}

impl MembersReply {
    /// Parses the rows; the join and leave rows carry nothing the machine
    /// reads.
    ///
    /// # Errors
    /// [`ReplyError::HeartbeatRow`] for a row of any other shape.
    pub fn parse(rows: &[Row]) -> Result<MembersReply, ReplyError> {
        let mut reply = MembersReply::default();
        for row in rows {
            match row.as_slice() {
                [Some(members_tag::SESSION), Some(pid), nonce] => {
                    reply.backend_pid = Some(*pid);
                    reply.nonce = *nonce;
                }
                [Some(members_tag::MEMBER), Some(g), Some(pid)] => match u32::try_from(*g) {
                    Ok(g) => {
                        reply.members.insert((g, *pid));
                    }
                    Err(_) => return Err(ReplyError::HeartbeatRow(row.clone())),
                },
                [Some(members_tag::HOLDER), Some(k), holder] => reply.holders.push((*k, *holder)),
                [Some(members_tag::JOINED | members_tag::LEFT), Some(_), Some(_)] => {}
                _ => return Err(ReplyError::HeartbeatRow(row.clone())),
            }
        }
        Ok(reply)
    }

    /// The rows a server sends for this reply (no join or leave rows).
    pub fn to_rows(&self) -> Vec<Row> {
        let session = (self.backend_pid.iter())
            .map(|p| vec![Some(members_tag::SESSION), Some(*p), self.nonce]);
        let members = (self.members.iter())
            .map(|(g, p)| vec![Some(members_tag::MEMBER), Some(i64::from(*g)), Some(*p)]);
        let holders =
            (self.holders.iter()).map(|(k, h)| vec![Some(members_tag::HOLDER), Some(*k), *h]);
        session.chain(members).chain(holders).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name in `sql` that PostgreSQL would look up through the
    /// session's `search_path`: unqualified function calls, casts to
    /// unqualified types, unqualified `pg_*` relations, bare operators, and
    /// the constructs that look up `=` by its bare name (`NULLIF`, `IS
    /// DISTINCT FROM`, `IN`, `BETWEEN`, `LIKE`, a simple `CASE`).
    /// String literals are skipped; a dollar-quoted body is scanned as SQL.
    fn unqualified_names(sql: &str) -> Vec<String> {
        #[derive(Debug, PartialEq)]
        enum Tok {
            Name(Vec<String>),
            Op(String),
            Punct(char),
            Number,
            Str,
        }
        let chars: Vec<char> = sql.chars().collect();
        let mut toks = Vec::new();
        let mut i = 0;
        let op_char = |c: char| "+-*/<>=~!@#%^&|`?".contains(c);
        while i < chars.len() {
            let c = chars[i];
            if c.is_whitespace() {
                i += 1;
            } else if c == '\'' {
                i += 1;
                while i < chars.len() {
                    if chars[i] == '\'' && chars.get(i + 1) == Some(&'\'') {
                        i += 2;
                    } else if chars[i] == '\'' {
                        break;
                    } else {
                        i += 1;
                    }
                }
                i += 1;
                toks.push(Tok::Str);
            } else if c == '$' {
                // A dollar-quote delimiter: its body is SQL (a DO block).
                i += 1;
                while i < chars.len() && chars[i] != '$' {
                    i += 1;
                }
                i += 1;
            } else if c.is_ascii_alphabetic() || c == '_' {
                let mut parts = Vec::new();
                loop {
                    let start = i;
                    while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                        i += 1;
                    }
                    parts.push(chars[start..i].iter().collect::<String>().to_lowercase());
                    let more = chars.get(i) == Some(&'.')
                        && chars
                            .get(i + 1)
                            .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_');
                    if !more {
                        break;
                    }
                    i += 1;
                }
                // `pg_catalog.` before an operator: `OPERATOR(pg_catalog.=)`.
                if chars.get(i) == Some(&'.') && chars.get(i + 1).is_some_and(|c| op_char(*c)) {
                    i += 1;
                    let start = i;
                    while i < chars.len() && op_char(chars[i]) {
                        i += 1;
                    }
                    let op: String = chars[start..i].iter().collect();
                    parts.push(op);
                }
                toks.push(Tok::Name(parts));
            } else if c.is_ascii_digit()
                || (c == '-'
                    && chars.get(i + 1).is_some_and(char::is_ascii_digit)
                    && !matches!(toks.last(), Some(Tok::Name(_) | Tok::Number | Tok::Str)))
            {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
                toks.push(Tok::Number);
            } else if c == ':' && chars.get(i + 1) == Some(&':') {
                i += 2;
                toks.push(Tok::Op("::".into()));
            } else if op_char(c) {
                let start = i;
                while i < chars.len() && op_char(chars[i]) {
                    i += 1;
                }
                toks.push(Tok::Op(chars[start..i].iter().collect()));
            } else {
                i += 1;
                toks.push(Tok::Punct(c));
            }
        }
        const KEYWORDS: &[&str] = &[
            "select", "from", "where", "and", "or", "not", "then", "else", "when", "as", "any",
            "all", "array", "exists", "join", "on", "coalesce", "values", "union", "end", "with",
            "perform", "begin", "is", "null",
            // Grammar, which calls pg_catalog.extract (date_part before 14).
            "extract",
        ];
        const LOOKUPS: &[&str] = &[
            "nullif", "distinct", "in", "between", "like", "ilike", "similar",
        ];
        let catalog = |p: &[String]| p.len() >= 2 && p[0] == "pg_catalog";
        let mut found = Vec::new();
        for (n, tok) in toks.iter().enumerate() {
            let prev = n.checked_sub(1).map(|p| &toks[p]);
            let next = toks.get(n + 1);
            match tok {
                Tok::Name(parts) if catalog(parts) => {}
                Tok::Name(parts) => {
                    let name = parts.join(".");
                    let after_as = matches!(prev, Some(Tok::Name(p)) if p == &["as"]);
                    if matches!(prev, Some(Tok::Op(o)) if o == "::") {
                        found.push(format!("type {name}"));
                    } else if LOOKUPS.contains(&name.as_str()) {
                        found.push(format!("{name} (looks up = by name)"));
                    } else if name == "case"
                        && !matches!(next, Some(Tok::Name(p)) if p == &["when"])
                    {
                        found.push("simple CASE (looks up = by name)".into());
                    } else if name == "operator" {
                        let inner = toks.get(n + 2);
                        if !matches!(inner, Some(Tok::Name(p)) if catalog(p)) {
                            found.push(format!("operator {inner:?}"));
                        }
                    } else if name.starts_with("pg_") {
                        found.push(format!("name {name}"));
                    } else if next == Some(&Tok::Punct('('))
                        && !after_as
                        && !KEYWORDS.contains(&name.as_str())
                    {
                        found.push(format!("function {name}"));
                    }
                }
                Tok::Op(o) if o != "::" => found.push(format!("operator {o}")),
                _ => {}
            }
        }
        found
    }

    #[test]
    fn clock_tokens_are_above_every_token_of_the_scheme_before() {
        // `timeline << 48 | xid` with 48-bit xids, timelines below 256.
        let old_max = (255i64 << 48) | ((1 << 48) - 1);
        assert!(TOKEN_CLOCK_OFFSET > old_max);
        // Room for the clock: 2026 in microseconds, and in 200,000 years.
        let now_us = 1_800_000_000_000_000i64;
        let year_us = 31_557_600_000_000i64;
        assert!(TOKEN_CLOCK_OFFSET
            .checked_add(now_us + 200_000 * year_us)
            .is_some());
        let sql = Statement::TryLock {
            keys: vec![1],
            backend_pid: 7,
            nonce: 9,
        }
        .sql();
        assert!(sql.contains("pg_catalog.clock_timestamp()"), "{sql}");
        assert!(
            sql.contains("OR pg_catalog.pg_is_in_recovery() THEN false"),
            "{sql}"
        );
        // No transaction id, no WAL record: no flush, no synchronous standby.
        for writes in [
            "pg_current_xact_id",
            "txid_current",
            "pg_logical_emit_message",
        ] {
            assert!(!sql.contains(writes), "{sql}");
        }
    }

    #[test]
    fn the_scanner_finds_unqualified_names() {
        for (sql, what) in [
            (
                "SELECT pg_try_advisory_lock(1)",
                "name pg_try_advisory_lock",
            ),
            ("SELECT length('x')", "function length"),
            ("SELECT 1::int8", "type int8"),
            ("SELECT 1 FROM pg_locks", "name pg_locks"),
            ("SELECT 1 WHERE 1 = 1", "operator ="),
            ("SELECT a | b", "operator |"),
            ("SELECT 1 WHERE 1 OPERATOR(evil.=) 1", "operator"),
            ("SELECT nullif(a, '')", "nullif"),
            ("SELECT a IS DISTINCT FROM b", "distinct"),
            ("SELECT 1 WHERE a IN (1, 2)", "in"),
            ("SELECT CASE a WHEN 1 THEN 2 END", "simple CASE"),
            (
                "DO $x$BEGIN PERFORM set_config('a', 'b', true); END$x$",
                "function set_config",
            ),
        ] {
            let found = unqualified_names(sql);
            assert!(
                found.iter().any(|f| f.starts_with(what)),
                "{sql}: {found:?}"
            );
        }
        let clean = "SELECT pg_catalog.length('a = b'), -5, x::pg_catalog.bit(32) \
                     OPERATOR(pg_catalog.|) 1 FROM pg_catalog.unnest(a) AS w(k) \
                     WHERE k OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT 1)) AND coalesce(a, b)";
        assert_eq!(unqualified_names(clean), Vec::<String>::new(), "{clean}");
    }

    /// Every statement, once per variant (the match has no wildcard: a new
    /// variant does not compile until it is listed here).
    fn every_statement() -> Vec<Statement> {
        let all = [
            Statement::Setup {
                nonce: -42,
                settings: vec![
                    ("search_path", SEARCH_PATH.into()),
                    ("idle_session_timeout", "900".into()),
                ],
            },
            Statement::Setup {
                nonce: 1,
                settings: vec![],
            },
            Statement::Listen,
            Statement::TryLock {
                keys: vec![i64::MIN, -1, 7],
                backend_pid: 99,
                nonce: -3,
            },
            Statement::Heartbeat,
            Statement::Verify,
            Statement::Wait {
                key: -5,
                timeout_ms: 2000,
                crowd: None,
                watch_of: Some(77),
            },
            Statement::Wait {
                key: -5,
                timeout_ms: 2000,
                crowd: Some(2),
                watch_of: None,
            },
            Statement::Take {
                key: -5,
                timeout_ms: 900,
                crowd: Some(2),
                backend_pid: 99,
                nonce: -3,
            },
            Statement::Take {
                key: i64::MIN,
                timeout_ms: 1,
                crowd: None,
                backend_pid: 99,
                nonce: 3,
            },
            Statement::Release {
                keys: vec![-1, 2],
                notify: true,
                reserved: vec![],
            },
            Statement::Release {
                keys: vec![-1, 2],
                notify: true,
                reserved: vec![(2, 77, 0), (-1, 78, 79)],
            },
            Statement::Release {
                keys: vec![3],
                notify: false,
                reserved: vec![],
            },
            Statement::Members {
                join: vec![7, u32::MAX],
                leave: vec![9],
                groups: vec![7, u32::MAX],
                keys: vec![-1, 2],
                notify: true,
                announce: vec![7],
                claims: vec![-3, 4],
            },
            Statement::Prefer {
                key: i64::MIN,
                priority: u32::MAX,
            },
            Statement::CheckHandover {
                asks: vec![(5, 77), (i64::MIN, 78)],
            },
            Statement::CheckHandover { asks: vec![] },
        ];
        for s in &all {
            match s {
                Statement::Setup { .. }
                | Statement::Listen
                | Statement::TryLock { .. }
                | Statement::Heartbeat
                | Statement::Verify
                | Statement::Wait { .. }
                | Statement::Take { .. }
                | Statement::Release { .. }
                | Statement::Members { .. }
                | Statement::Prefer { .. }
                | Statement::CheckHandover { .. } => {}
            }
        }
        all.into()
    }

    #[test]
    fn every_statement_qualifies_every_name() {
        let texts = (every_statement().iter())
            .map(Statement::sql)
            .collect::<Vec<_>>()
            .into_iter()
            .chain(
                [
                    crate::inspect::HOLDERS_SQL,
                    WAIT_PRELUDE_SQL,
                    ADVISORY_KEY_SQL,
                    PRIMARY_TIMELINE_SQL,
                ]
                .map(String::from),
            );
        for sql in texts {
            assert_eq!(unqualified_names(&sql), Vec::<String>::new(), "{sql}");
        }
    }

    /// A release names the backend a key is handed over to after the
    /// grantee (0: none); an older payload parses as before.
    #[test]
    fn release_payloads_name_the_reserved_backend() {
        let notice = |grantee, reserved| ReleaseNotice {
            key: -5,
            at: Some(9),
            grantee,
            reserved,
        };
        assert_eq!(handover_release("-5 9"), Some(notice(None, None)));
        assert_eq!(handover_release("-5 9 7"), Some(notice(Some(7), None)));
        assert_eq!(handover_release("-5 9 0 8"), Some(notice(None, Some(8))));
        assert_eq!(handover_release("-5 9 7 8"), Some(notice(Some(7), Some(8))));
        assert_eq!(handover_release("-5 9 7 8 1"), None);
    }

    #[test]
    fn the_primary_timeline_reads_a_positive_integer_or_null() {
        assert_eq!(primary_timeline(None), Ok(None));
        assert_eq!(primary_timeline(Some("1")), Ok(Some(1)));
        assert_eq!(
            primary_timeline(Some("4294967295")),
            Ok(Some(4_294_967_295))
        );
        for bad in ["0", "-1", "", "x2", "1.5"] {
            let parsed = primary_timeline(Some(bad));
            assert!(parsed.is_err(), "{bad:?}: {parsed:?}");
        }
    }

    /// `prefer` payloads parse as nothing else, and other payloads never
    /// as `prefer`: an older locker ignores the new payload, a newer one
    /// reads the old ones as before.
    #[test]
    fn preference_payloads_are_apart_from_the_others() {
        let prefer = "prefer -5 4242 3";
        let asked = Preference {
            key: -5,
            pid: 4242,
            priority: 3,
        };
        assert_eq!(handover_preference(prefer), Some(asked));
        assert_eq!(handover_release(prefer), None);
        assert_eq!(handover_request(prefer), None);
        assert_eq!(group_claim(prefer), None);
        for other in [
            handover_request_payload(-5, 4242),
            "-5 72057594037927936".to_string(),
            "-5".to_string(),
            "group 9".to_string(),
            "claim -5 4242".to_string(),
            "prefer -5 4242".to_string(),
            "prefer -5 4242 -1".to_string(),
            "prefer -5 4242 3 1".to_string(),
            // Above the highest priority: the rank of a `to` request.
            format!("prefer -5 4242 {}", u32::MAX),
        ] {
            assert_eq!(handover_preference(&other), None, "{other}");
        }
        assert_eq!(
            handover_request(&handover_request_payload(-5, 4242)),
            Some((-5, 4242))
        );
    }

    #[test]
    fn decodes_ints_and_nulls() {
        assert_eq!(
            decode_text_row([Some("1"), None, Some("-9223372036854775808")]),
            Ok(vec![Some(1), None, Some(i64::MIN)])
        );
        assert_eq!(
            decode_text_row([Some("1"), Some("x")]),
            Err(DecodeError {
                column: 1,
                text: "x".into()
            })
        );
        assert!(decode_text_row([Some("9223372036854775808")]).is_err());
        assert_eq!(decode_text_row([]), Ok(vec![]));
    }

    #[test]
    fn a_wait_starts_with_its_prelude_and_checks_the_client() {
        let sql = Statement::Wait {
            key: -5,
            timeout_ms: 0,
            crowd: Some(2),
            watch_of: None,
        }
        .sql();
        assert!(sql.starts_with(WAIT_PRELUDE_SQL), "{sql}");
        let check = format!("'client_connection_check_interval', '{WAIT_CONNECTION_CHECK_MS}'");
        assert!(WAIT_PRELUDE_SQL.contains(&check), "{WAIT_PRELUDE_SQL}");
        assert!(
            sql.contains("set_config('lock_timeout', (SELECT (CASE WHEN l OPERATOR(pg_catalog.<) 1 THEN l ELSE 1 END)"),
            "{sql}"
        );
        assert!(sql.contains(DEADLOCK_TIMEOUT_MS_SQL), "{sql}");
        assert!(sql.contains("pg_advisory_xact_lock_shared(-5)"), "{sql}");
        assert!(sql.contains("EXCEPTION WHEN lock_not_available"), "{sql}");
        // The crowd check counts the key's waiters before it queues.
        assert!(sql.contains("NOT granted"), "{sql}");
        assert!(
            sql.contains("IF 2 OPERATOR(pg_catalog.<=) (SELECT"),
            "{sql}"
        );
        for (freed, crowded, held_here, token) in [
            (None, false, false, None),
            (Some(false), false, false, None),
            (Some(true), false, false, None),
            (Some(false), true, false, None),
            (Some(false), false, true, None),
            (Some(true), false, false, Some(TOKEN_CLOCK_OFFSET + 5)),
        ] {
            for deadlock_timeout_ms in [None, Some(1000)] {
                let reply = WaitReply {
                    session: HeartbeatReply {
                        backend_pid: Some(7),
                        nonce: Some(9),
                        ..Default::default()
                    },
                    freed,
                    crowded,
                    deadlock_timeout_ms,
                    token,
                    held_here,
                };
                assert_eq!(WaitReply::parse(&reply.to_rows()), Ok(reply));
            }
        }
        let bad = vec![vec![Some(3), Some(4)]];
        assert!(WaitReply::parse(&bad).is_err());
    }

    #[test]
    fn a_wait_stays_a_tenth_below_deadlock_timeout() {
        assert_eq!(wait_limit_ms(1000), 900);
        assert_eq!(wait_limit_ms(50), 40);
        assert_eq!(wait_limit_ms(10), 1);
        assert_eq!(wait_limit_ms(1), 1);
        assert_eq!(wait_limit_ms(2_147_483_647), 1_932_735_283);
    }

    #[test]
    fn the_setup_reads_the_promotion_state() {
        let sql = Statement::Setup {
            nonce: 1,
            settings: vec![],
        }
        .sql();
        assert!(
            sql.starts_with(&format!(
                "{SETUP_CHECKPOINT_PRELUDE}{SETUP_HISTORY_PRELUDE}"
            )),
            "{sql}"
        );
        assert!(sql.ends_with(SETUP_PROMOTION_SQL), "{sql}");
        for tag in [
            setup_tag::REPLAYED_SINCE_START,
            setup_tag::WAL_TIMELINE,
            setup_tag::CHECKPOINT_TIMELINE,
            setup_tag::CHECKPOINT_AGE_MS,
            setup_tag::HISTORY_AGE_MS,
        ] {
            assert!(
                SETUP_PROMOTION_SQL.contains(&format!("SELECT {tag}, ")),
                "{tag}"
            );
        }
        assert!(SETUP_CHECKPOINT_PRELUDE.contains(&format!("'{CHECKPOINT_SETTING}'")));
        assert!(SETUP_PROMOTION_SQL.contains(&format!("'{CHECKPOINT_SETTING}'")));
        assert!(SETUP_HISTORY_PRELUDE.contains(&format!("'{HISTORY_SETTING}'")));
        assert!(SETUP_PROMOTION_SQL.contains(&format!("'{HISTORY_SETTING}'")));
    }

    #[test]
    fn key_arrays_render_negative_and_extreme_keys() {
        let sql = Statement::Release {
            keys: vec![i64::MIN, -1, 0, i64::MAX],
            notify: false,
            reserved: vec![],
        }
        .sql();
        assert!(
            sql.contains("'{-9223372036854775808,-1,0,9223372036854775807}'::pg_catalog.int8[]")
        );
    }

    #[test]
    fn replies_round_trip() {
        let setup = SetupReply {
            server_version: 170_002,
            in_recovery: false,
            backend_pid: 42,
            idle_session_timeout_ms: Some(900),
            tcp_settings: [Some(1900), Some(2), Some(1), Some(10)],
            unix_socket: false,
            nonce: Some(-7),
            search_path_catalog: true,
            promotion: crate::reply::PromotionState {
                replayed_since_start: true,
                wal_timeline: Some(3),
                checkpoint_timeline: Some(2),
                checkpoint_age_ms: Some(-12),
                history_age_ms: Some(4_000),
            },
            server_clock_us: Some(1_700_000_000_000_000),
        };
        assert_eq!(SetupReply::parse(&setup.to_rows()), Ok(setup));
        let members = MembersReply {
            backend_pid: Some(42),
            nonce: Some(-7),
            members: [(7, 42), (u32::MAX, 43)].into(),
            holders: vec![(1, Some(43)), (2, None)],
        };
        assert_eq!(MembersReply::parse(&members.to_rows()), Ok(members));
        // The join and leave rows carry nothing the machine reads.
        let joined = vec![Some(members_tag::JOINED), Some(-1), Some(1)];
        let left = vec![Some(members_tag::LEFT), Some(9), Some(0)];
        assert_eq!(
            MembersReply::parse(&[joined, left]),
            Ok(MembersReply::default())
        );
        assert!(
            MembersReply::parse(&[vec![Some(members_tag::MEMBER), Some(-1), Some(1)]]).is_err()
        );
        let try_reply = TryReply {
            won: vec![(1, 77)],
            not_won: vec![(2, Some(9)), (3, None)],
            untrusted: false,
            session: Some((42, Some(7))),
        };
        assert_eq!(TryReply::parse(&[1, 2, 3], &try_reply.to_rows()), try_reply);
        let heartbeat = HeartbeatReply {
            backend_pid: Some(42),
            nonce: Some(3),
            server_clock_us: Some(-1),
        };
        assert_eq!(
            HeartbeatReply::parse(&heartbeat.to_rows()),
            Ok(heartbeat.clone())
        );
        let verify = VerifyReply {
            session: heartbeat,
            held: [1, -5].into(),
        };
        assert_eq!(VerifyReply::parse(&verify.to_rows()), Ok(verify.clone()));
        // A held key is no part of a heartbeat's reply.
        assert!(HeartbeatReply::parse(&verify.to_rows()).is_err());
        let release = ReleaseReply {
            unlocked: vec![(1, true), (2, false)],
        };
        assert_eq!(ReleaseReply::parse(&release.to_rows()), Ok(release));
    }

    #[test]
    fn try_reply_counts_one_answer_per_key_tried() {
        let rows = vec![
            vec![Some(1), Some(5), None],
            vec![Some(1), None, Some(3)], // second answer for 1
            vec![Some(4), Some(5), None], // not tried
            vec![Some(2)],                // malformed: 2 stays unanswered
        ];
        let r = TryReply::parse(&[1, 2], &rows);
        assert_eq!(r.won, vec![(1, 5)]);
        assert!(r.not_won.is_empty());
        assert!(r.untrusted);
        assert_eq!(r.unanswered(&[1, 2]), vec![2]);
    }

    #[test]
    fn malformed_replies_are_errors() {
        assert_eq!(
            SetupReply::parse(&[vec![Some(1), Some(170_000)]]),
            Err(ReplyError::SetupIncomplete {
                missing: "in_recovery"
            })
        );
        assert!(HeartbeatReply::parse(&[vec![Some(3), Some(1)]]).is_err());
        assert!(VerifyReply::parse(&[vec![Some(3), Some(1)]]).is_err());
        assert!(ReleaseReply::parse(&[vec![Some(1), Some(2)]]).is_err());
    }

    #[test]
    fn the_key_expression_is_shared() {
        assert!(Statement::Verify.sql().contains(ADVISORY_KEY_SQL));
        // The steady heartbeat reads no pg_locks: its cost does not grow
        // with the locks other sessions hold.
        assert!(!Statement::Heartbeat.sql().contains("pg_locks"));
        assert!(Statement::TryLock {
            keys: vec![1],
            backend_pid: 7,
            nonce: 9,
        }
        .sql()
        .contains(ADVISORY_KEY_SQL));
    }
}
