//! The replies: each statement's rows decoded into what the machine reads
//! (and, for simulated servers, encoded back: `to_rows`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::{heartbeat_tag, members_tag, setup_tag, wait_outcome, Row};

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
    /// The reply of [`PRIMARY_TIMELINE_SQL`](super::PRIMARY_TIMELINE_SQL) is not a positive integer.
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

/// The reply to [`Statement::Setup`](super::Statement::Setup).
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
    /// The [`TCP_SETTINGS`](super::TCP_SETTINGS) in the server's units (`None`: not reported).
    /// They read 0 over a Unix socket, where the server ignores them.
    pub tcp_settings: [Option<i64>; 4],
    /// The client is on a Unix socket (`inet_client_addr()` is NULL).
    pub unix_socket: bool,
    /// [`NONCE_SETTING`](super::NONCE_SETTING) read back (`None`: unset).
    pub nonce: Option<i64>,
    /// `search_path` reads back as [`SEARCH_PATH`](super::SEARCH_PATH) (false also when the
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

/// The reply to [`Statement::TryLock`](super::Statement::TryLock).
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

/// The reply to [`Statement::Heartbeat`](super::Statement::Heartbeat).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeartbeatReply {
    /// `pg_backend_pid()` of the session that answered; `None` if no row had it.
    pub backend_pid: Option<i64>,
    /// [`NONCE_SETTING`](super::NONCE_SETTING) of that session; `None` if no row had it or it was unset.
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

/// The reply to [`Statement::Wait`](super::Statement::Wait).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WaitReply {
    /// The session that answered, as for [`Statement::Heartbeat`](super::Statement::Heartbeat).
    pub session: HeartbeatReply,
    /// Whether the key was freed (else the wait ended by its lock timeout,
    /// the key held all along, or did not queue: `crowded`); `None`: no such
    /// row.
    pub freed: Option<bool>,
    /// The wait did not queue: as many sessions as its crowd limit already
    /// waited for the key (see [`Statement::Wait`](super::Statement::Wait)); `freed` is `false`.
    pub crowded: bool,
    /// The session's `deadlock_timeout` in ms, as the wait read it (see
    /// [`wait_limit_ms`](super::wait_limit_ms)); `None`: no such row.
    pub deadlock_timeout_ms: Option<i64>,
    /// A [`Statement::Take`](super::Statement::Take) took the key (`freed` is `true`): its fencing
    /// token.
    pub token: Option<i64>,
    /// A [`Statement::Take`](super::Statement::Take) found its key held by its own backend already
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

/// The reply to [`Statement::Verify`](super::Statement::Verify).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerifyReply {
    /// The session that answered, as for [`Statement::Heartbeat`](super::Statement::Heartbeat).
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

/// The reply to [`Statement::CheckHandover`](super::Statement::CheckHandover).
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

/// The reply to [`Statement::Release`](super::Statement::Release).
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

/// The reply to [`Statement::Members`](super::Statement::Members).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MembersReply {
    /// `pg_backend_pid()` of the session that answered.
    pub backend_pid: Option<i64>,
    /// [`NONCE_SETTING`](super::NONCE_SETTING) of that session.
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
