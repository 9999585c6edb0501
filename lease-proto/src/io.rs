//! What goes into the machine and what comes out of it.

use std::fmt;
use std::time::Instant;

use crate::key::{GroupId, LeaseId};
use crate::sql::{Row, Statement};

/// Identifies one run (one call of `run` in a driver). Unique per machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(pub u64);

/// Identifies one database session the machine asked for. A driver echoes it
/// in [`Input::SessionOpened`] and [`Input::SessionEnded`]; inputs naming an
/// older session are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

/// Identifies one statement sent. Replies naming any other id are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueryId(pub u64);

/// An error the server (or the driver's client library) reported.
///
/// Carries no connection parameters: drivers must not put passwords in it.
/// Put the server's own message text in `message` (for a server error, its
/// primary message, not a wrapper's rendering): the machine recognises a
/// pooler that rejects startup options by the server's words
/// "unsupported startup parameter".
///
/// [`SessionError::is_configuration`] classifies a failed connection attempt:
/// a configuration error (authentication, unknown database, TLS
/// verification, ...) or a transient one (the network, a restart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionError {
    /// The SQLSTATE code, when the server sent one (`"57P01"`, `"53200"`, ...).
    pub code: Option<String>,
    /// A one-line message.
    pub message: String,
    /// The driver found the connection configuration unusable on its own
    /// side, without a SQLSTATE: a TLS certificate that fails verification,
    /// a server without TLS under `sslmode=require`, an unusable TLS setup.
    /// Set it with [`SessionError::config`]; see [`SessionError::is_configuration`].
    pub config: bool,
}

impl SessionError {
    /// An error without SQLSTATE (I/O, protocol, decoding).
    pub fn other(message: impl Into<String>) -> SessionError {
        SessionError {
            code: None,
            message: message.into(),
            config: false,
        }
    }

    /// An error the server sent, with its SQLSTATE.
    pub fn server(code: impl Into<String>, message: impl Into<String>) -> SessionError {
        SessionError {
            code: Some(code.into()),
            message: message.into(),
            config: false,
        }
    }

    /// A configuration error the driver found without the server's word
    /// (no SQLSTATE): TLS verification failed, the server has no TLS under
    /// `sslmode=require`, a TLS connector could not be built. Trying again
    /// cannot help until the configuration changes.
    pub fn config(message: impl Into<String>) -> SessionError {
        SessionError {
            code: None,
            message: message.into(),
            config: true,
        }
    }

    /// Whether this error, from a connection attempt, means the
    /// configuration is wrong rather than the network or the server being
    /// away: trying again cannot help until someone changes the password,
    /// the role, the database name or the TLS setup.
    ///
    /// Configuration errors are
    /// - SQLSTATE class `28` (invalid authorization: a wrong password,
    ///   an unknown role, no `pg_hba.conf` entry);
    /// - `3D000` (the database does not exist);
    /// - `42501` (insufficient privilege: no `CONNECT` on the database);
    /// - `0A000` (feature not supported, e.g. a protocol or an
    ///   authentication method the client lacks);
    /// - `22023`, `42704`, `42601` and `55P02` (an invalid value, an unknown
    ///   parameter, a malformed argument or a setting that needs a server
    ///   restart, in a startup option);
    /// - errors a driver marked with [`SessionError::config`] (TLS verification).
    ///
    /// Everything else is transient (refused or timed-out connections, a
    /// server starting up or shutting down, too many connections) and is
    /// retried with backoff.
    ///
    /// The locker (its machine) applies it only to a failed connection
    /// attempt: before it has ever had a ready session, every run finishes
    /// with [`Outcome::Config`] (a driver's `RunRejected::Config`); after, the attempt is retried with backoff and
    /// reported loudly ([`Event::ConnectFailed`] with `configuration`).
    #[must_use]
    pub fn is_configuration(&self) -> bool {
        if self.config {
            return true;
        }
        match self.code.as_deref() {
            Some(code) => {
                code.starts_with("28")
                    || matches!(
                        code,
                        "3D000" | "42501" | "0A000" | "22023" | "42704" | "42601" | "55P02"
                    )
            }
            None => false,
        }
    }
}

impl SessionError {
    /// Whether the session this error came from has ended, or may have, so
    /// that the server may have freed its locks: the one rule for "did the
    /// key go with the session", whichever statement or path saw the error.
    ///
    /// - SQLSTATE class `57P` (operator intervention: `57P01`
    ///   `pg_terminate_backend` or a fast shutdown, `57P02` a crash of
    ///   another backend, `57P03`, `57P04` database dropped, `57P05`
    ///   `idle_session_timeout`): PostgreSQL sends these as FATAL, to the
    ///   statement in flight if there is one, and ends the backend;
    /// - SQLSTATE class `08` (connection exception) and `25P03`
    ///   (`idle_in_transaction_session_timeout`, FATAL);
    /// - no SQLSTATE: the driver lost the connection (closed, reset, end of
    ///   file) or could not read the reply; in doubt, the key may be free.
    ///
    /// Every other SQLSTATE is an error of one statement (`57014` a
    /// cancelled statement, `42883` a missing function, ...): the session
    /// goes on, and so do its locks.
    #[must_use]
    pub fn ends_session(&self) -> bool {
        match self.code.as_deref() {
            None => true,
            Some(code) => code.starts_with("57P") || code.starts_with("08") || code == "25P03",
        }
    }
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} (SQLSTATE {code})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobExit {
    /// The job returned successfully.
    Ok,
    /// The job returned an error (the driver keeps the error value).
    Failed,
    /// The job was dropped before it returned (its run was dropped).
    Abandoned,
}

/// An input to [`Machine::handle_input`](crate::Machine::handle_input).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Input {
    /// The job of `run` exited. Ignored unless that job is running.
    JobExited {
        /// The run whose job exited.
        run: RunId,
        /// How it ended.
        exit: JobExit,
    },
    /// Graceful shutdown of one run: its job is cancelled, the run waits for it
    /// to return, releases, and finishes with [`Outcome::Cancelled`].
    Shutdown {
        /// The run to shut down.
        run: RunId,
    },
    /// Close the whole machine: every run is shut down, later runs finish at
    /// once with [`Outcome::Closed`], and the session is closed when no run
    /// remains.
    Close,
    /// The connection asked for by [`SessionCommand::Open`] is established.
    SessionOpened {
        /// The session from the command.
        session: SessionId,
    },
    /// The connection failed to open, or ended (for any reason: the server
    /// ended it, the socket closed, the connection future completed).
    ///
    /// Feed it as soon as the end is read, before any reply of that session
    /// not fed yet, and drop that reply: a server may send a reply just
    /// before it ends the session (a try's "won" answered just before a
    /// `pg_terminate_backend`), and a job must not start on a session whose
    /// end the driver already knows.
    SessionEnded {
        /// The session from [`SessionCommand::Open`].
        session: SessionId,
        /// What the driver saw, if anything.
        error: Option<SessionError>,
    },
    /// The reply to [`SessionCommand::Query`]: every row of every result set, in order.
    Reply {
        /// The query from the command.
        query: QueryId,
        /// Rows, or the statement's error.
        result: Result<Vec<Row>, SessionError>,
    },
    /// A `NOTIFY` arrived on the session.
    Notification {
        /// The channel.
        channel: String,
        /// The payload.
        payload: String,
        /// The backend pid of the session that sent it (the process id of
        /// the server's NotificationResponse). Any role may `NOTIFY` on any
        /// channel: the machine counts a handover notification only from
        /// the holder its standby last saw (see [`Options::lock_delay`](crate::Options::lock_delay)).
        sender_pid: i64,
    },
    /// Time passed (a timer from [`Machine::poll_timeout`](crate::Machine::poll_timeout)
    /// fired, or any wake-up). The machine checks every deadline against `now`.
    Tick,
}

/// Why a job is cancelled, or a lease lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The session ended (connection closed, server terminated it, restart).
    SessionEnded(Option<SessionError>),
    /// A statement did not answer within the query timeout; the session is
    /// given up on (closed once the cancelled jobs returned).
    QueryTimeout,
    /// The lease was not confirmed within its validity window; the session is
    /// given up on (closed once the cancelled jobs returned).
    ValidityExpired,
    /// A verify did not find the key in `pg_locks` for this session. The
    /// verify is sent after a failed or partly answered try, and in place of
    /// every [`VERIFY_EVERY`](crate::limits::VERIFY_EVERY)-th heartbeat (the steady
    /// heartbeat proves only that the session is the same live one).
    NotHeld,
    /// A statement failed, or its reply broke the rules; the session is given
    /// up on (closed once the cancelled jobs returned) because its state
    /// could not be verified.
    QueryFailed(SessionError),
    /// Graceful shutdown of this run was asked.
    Shutdown,
    /// The locker is closing (`close()`).
    Closed,
    /// The server or connection cannot give mutual exclusion.
    Refused(Refusal),
    /// The server is a hot standby (`pg_is_in_recovery()`), often a failover
    /// in progress: the session was closed and the locker tries again after
    /// a backoff.
    InRecovery,
    /// The key goes to another session: the lease's group moved it to another
    /// live member (its share, see `docs/library.md`, "Lease groups"), or a
    /// hand-over request (`lease handover`, a standby of a higher priority)
    /// named a backend that waits for it. The key is released once the job
    /// returned, and the run stands by again.
    HandedOver,
}

impl Reason {
    /// Whether the key may be free on the server already when a lease is
    /// lost for this reason, so that another session may take it at once (a
    /// standby whose wait takes it at the release, after its
    /// [`Options::lock_delay`](crate::Options::lock_delay)) and a job must
    /// stop within that, not at the guard deadline: the session ended (the
    /// server released its locks with it), a statement failed with an error
    /// that ends the session ([`SessionError::ends_session`]: the server's
    /// FATAL answer to a statement in flight when it terminates the backend),
    /// a verify found the key not held,
    /// or a refusal found a transaction pooler under a session that held
    /// keys (the locks sit on a server backend that another client uses, or
    /// that the pooler resets). After the other losses (a statement timed
    /// out or failed with an error of its own, the validity ran out) the session stays open with the
    /// key held until the cancelled jobs have returned or the guard deadline
    /// has come (see [`Deadline::DeferredClose`](crate::Deadline::DeferredClose));
    /// a graceful stop (or a lease group's hand-off) releases the key only
    /// after its job has returned; and
    /// a refusal or a hot standby at setup comes before any key was held.
    ///
    /// Exhaustive on purpose: a new reason must say which it is (`true` is
    /// the safe answer when in doubt).
    pub fn key_may_be_free(&self) -> bool {
        match self {
            Reason::SessionEnded(_) | Reason::NotHeld => true,
            Reason::QueryFailed(error) => error.ends_session(),
            Reason::Refused(refusal) => match refusal {
                Refusal::BackendChanged { .. }
                | Refusal::BackendShared { .. }
                | Refusal::TransactionPooler { .. } => true,
                Refusal::ServerTooOld { .. } | Refusal::StartupOptionsIgnored { .. } => false,
            },
            Reason::QueryTimeout
            | Reason::ValidityExpired
            | Reason::Shutdown
            | Reason::Closed
            | Reason::HandedOver
            | Reason::InRecovery => false,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::SessionEnded(Some(e)) => write!(f, "session ended: {e}"),
            Reason::SessionEnded(None) => f.write_str("session ended"),
            Reason::QueryTimeout => f.write_str("a statement timed out; session given up"),
            Reason::ValidityExpired => f.write_str("validity expired before confirmation"),
            Reason::NotHeld => f.write_str("key no longer held by this session"),
            Reason::QueryFailed(e) => write!(f, "statement failed: {e}"),
            Reason::Shutdown => f.write_str("shutdown requested"),
            Reason::Closed => f.write_str("locker closed"),
            Reason::HandedOver => f.write_str(
                "handed over to another session (a hand-over request, or a lease group's share)",
            ),
            Reason::Refused(r) => write!(f, "{r}"),
            Reason::InRecovery => f.write_str(
                "the server is a hot standby (in recovery): advisory locks there give no mutual exclusion; trying again",
            ),
        }
    }
}

/// A setup that cannot give mutual exclusion. Final for the locker (the
/// machine): every run finishes with [`Outcome::Refused`] (a driver's
/// `RunRejected::Refused`) and later runs are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The server is older than needed: its `server_version_num` is below
    /// [`MIN_SERVER_VERSION_GUARD`](crate::limits::MIN_SERVER_VERSION_GUARD) (14) with
    /// the server guard on, below
    /// [`MIN_SERVER_VERSION`](crate::limits::MIN_SERVER_VERSION) (13) with it off; or
    /// it rejected the guard's `idle_session_timeout` as an unknown setting
    /// (SQLSTATE 42704: PostgreSQL 13 does so at connection startup, before
    /// the setup could read the version).
    ServerTooOld {
        /// `server_version_num` found; `None` when the server rejected
        /// `idle_session_timeout` before its version could be read.
        found: Option<i64>,
        /// Least `server_version_num` needed.
        needed: i64,
    },
    /// The backend pid changed between statements of one session: a
    /// transaction-mode pooler sits in between.
    BackendChanged {
        /// The pid found at setup.
        was: i64,
        /// The pid found later.
        now: i64,
    },
    /// Startup options were rejected or not applied (a pooler in between).
    StartupOptionsIgnored {
        /// What was found.
        detail: String,
    },
    /// Another client shares this session's backend (a transaction pooler):
    /// a statement read another session nonce than the one the setup set,
    /// or a try found the key held by this very backend.
    BackendShared {
        /// What was found.
        detail: String,
    },
    /// A second connection through the same address, opened while the
    /// session was idle, read the session's nonce: it was served by the
    /// session's own server backend, which a transaction-mode pooler hands
    /// to whichever client sends the next statement (the session's locks
    /// and settings stay on that backend, also after the client is gone).
    TransactionPooler {
        /// What the second connection found.
        detail: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::ServerTooOld { found, needed } => {
                match found {
                    Some(found) => write!(f, "PostgreSQL {} is not supported", version(*found))?,
                    None => write!(
                        f,
                        "PostgreSQL older than 14 is not supported (the server does not know \
                         idle_session_timeout, which the server guard sets)"
                    )?,
                }
                write!(f, ": lease needs PostgreSQL {} or newer", version(*needed))?;
                if *needed >= crate::limits::MIN_SERVER_VERSION_GUARD
                    && found.is_none_or(|v| v >= crate::limits::MIN_SERVER_VERSION)
                {
                    write!(
                        f,
                        " (PostgreSQL {} with the server guard off)",
                        version(crate::limits::MIN_SERVER_VERSION)
                    )?;
                }
                Ok(())
            }
            Refusal::BackendChanged { was, now } => write!(
                f,
                "the backend pid changed from {was} to {now} within one session: a transaction pooler is in between; connect directly or through a session-mode pool"
            ),
            Refusal::StartupOptionsIgnored { detail } => write!(
                f,
                "startup options were rejected or not applied ({detail}): a pooler is in between; connect directly or through a session-mode pool"
            ),
            Refusal::BackendShared { detail } => write!(
                f,
                "another client shares this session's backend ({detail}): a transaction pooler is in between; connect directly or through a session-mode pool"
            ),
            Refusal::TransactionPooler { detail } => write!(
                f,
                "a second connection landed on this session's server backend ({detail}): a transaction-mode pooler is in between; connect directly or through a session-mode pool"
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// A `server_version_num` as people write it: 130023 is `13.23`, 140000 `14`,
/// 90624 `9.6.24`.
fn version(num: i64) -> String {
    let (major, minor) = if num >= 100_000 {
        (format!("{}", num / 10_000), num % 10_000)
    } else {
        (format!("{}.{}", num / 10_000, num / 100 % 100), num % 100)
    };
    if minor == 0 {
        major
    } else {
        format!("{major}.{minor}")
    }
}

/// How a run finished. Drivers map every outcome but `Failed`, `Refused` and
/// `Config` to `Ok(())`. Exhaustive on purpose (see [`SessionCommand`]): a
/// driver decides what each outcome means to its caller, so a new one must
/// not compile against an old mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job returned `Ok` while leading: it is finished; the lease was released.
    Completed,
    /// The job returned an error while leading; the lease was released. The
    /// driver returns the job's error.
    Failed,
    /// Graceful shutdown of this run completed.
    Cancelled,
    /// The machine was closed.
    Closed,
    /// The job was abandoned (its run dropped); the lease was released.
    Abandoned,
    /// The setup cannot give mutual exclusion.
    Refused(Refusal),
    /// Before the machine ever had a ready session, a connection attempt
    /// failed with a configuration error ([`SessionError::is_configuration`]:
    /// a wrong password, an unknown role or database, a TLS verification
    /// failure): retrying would not help. The machine stays usable; a later
    /// run connects again.
    Config(SessionError),
}

/// Session parameters the machine asks a driver to connect with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    /// Run-time parameters to set at connection startup, as `(name, value)`.
    /// Send them in the startup packet's `options` as `-c name=value` (append
    /// to any options the user configured). Never apply them with `SET`.
    /// Empty after a pooler rejected the `options` startup parameter: then
    /// send no `options` of the machine's at all (the setup statement
    /// applies the settings).
    pub startup_settings: Vec<(&'static str, String)>,
}

impl SessionParams {
    /// The settings rendered as a libpq `options` string: `-c name=value ...`.
    pub fn options_string(&self) -> String {
        let mut s = String::new();
        for (name, value) in &self.startup_settings {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(&format!("-c {name}={value}"));
        }
        s
    }
}

/// One thing for the driver to do, from
/// [`Machine::poll_output`](crate::Machine::poll_output), which hands them
/// out in the order they must be carried out. Exhaustive on purpose (see
/// [`SessionCommand`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// For the run futures: start or cancel a job, finish a run.
    Run(RunCommand),
    /// For the connection: open, query, close.
    Session(SessionCommand),
    /// For logs and metrics. Asks for no action; a driver may drop it.
    Event(Event),
}

/// A command for the driver's connection, from
/// [`Machine::poll_output`](crate::Machine::poll_output).
///
/// Exhaustive on purpose, as [`RunCommand`] is: a driver must carry out
/// every command, so a new one is a breaking change that a driver's `match`
/// must fail to compile against, never an arm it could skip.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionCommand {
    /// Open a new connection (dropping any previous one) with these
    /// parameters, then report [`Input::SessionOpened`] or
    /// [`Input::SessionEnded`]. The machine times the attempt out itself.
    Open {
        /// Echo in the session inputs.
        session: SessionId,
        /// What to connect with.
        params: SessionParams,
    },
    /// Send a statement on the session, then report [`Input::Reply`]. The
    /// machine times it out itself (by closing the session).
    Query {
        /// Echo in the reply.
        query: QueryId,
        /// The statement; send [`Statement::sql`].
        statement: Statement,
    },
    /// Open a second, short connection exactly like the session's (the same
    /// host, the same parameters), send the statement on it, report its
    /// rows as [`Input::Reply`], then close that connection. The session
    /// itself stays open and idle meanwhile. The machine times it out
    /// itself (by closing the session); a session's close or loss drops it.
    /// Sent once per session, after the setup, when the pooler in between
    /// rejected the startup options: a second client connection that reads
    /// this session's nonce shares its server backend (a transaction
    /// pooler, [`Refusal::TransactionPooler`]).
    Probe {
        /// Echo in the reply.
        query: QueryId,
        /// The statement; send [`Statement::sql`].
        statement: Statement,
    },
    /// Close the session now (drop the connection). Report nothing back.
    Close {
        /// The session to close.
        session: SessionId,
    },
    /// Open the watch session: a second connection exactly like the
    /// session's (the same host, the same parameters and startup options),
    /// then report [`Input::SessionOpened`] or [`Input::SessionEnded`] with
    /// this id, and its end later as for the session. It is independent of
    /// the session: [`SessionCommand::Open`] and [`SessionCommand::Close`]
    /// leave it alone, and its end does not end the session. Sent only
    /// while the session is open. The machine times the attempt out itself
    /// (by closing it). Only [`SessionCommand::WatchQuery`] statements go on
    /// it; see the `watch` rule in the machine's docs
    /// ([`ServerWait::IdleAndWatch`](crate::ServerWait::IdleAndWatch)).
    OpenWatch {
        /// Echo in the session inputs.
        session: SessionId,
    },
    /// Send a statement (a [`Statement::Wait`]) on the watch session
    /// `session`, then report [`Input::Reply`]. At most one is in flight on
    /// it; the session's own statement may be in flight meanwhile. The
    /// machine times it out itself (by closing the watch session).
    WatchQuery {
        /// The watch session from [`SessionCommand::OpenWatch`].
        session: SessionId,
        /// Echo in the reply.
        query: QueryId,
        /// The statement; send [`Statement::sql`].
        statement: Statement,
    },
    /// Close the watch session now (drop its connection). Report nothing back.
    CloseWatch {
        /// The watch session to close.
        session: SessionId,
    },
}

/// A command for the runs (the futures that run jobs), from
/// [`Machine::poll_output`](crate::Machine::poll_output). Exhaustive on purpose
/// (see [`SessionCommand`]).
#[derive(Debug, Clone, PartialEq)]
pub enum RunCommand {
    /// Start (or restart) the job of `run`: it now leads.
    StartJob {
        /// The run.
        run: RunId,
        /// Its lease.
        lease: LeaseId,
        /// The fencing token of this acquisition:
        /// [`TOKEN_CLOCK_OFFSET`](crate::server::TOKEN_CLOCK_OFFSET) plus the
        /// server's clock in microseconds, read after the lock was granted
        /// (see [`Statement::TryLock`]). Promised: larger than every earlier
        /// acquisition's token for this key, across server crashes and
        /// restarts, promotions (synchronous or asynchronous replication),
        /// `pg_upgrade` and a move into a new cluster, and larger than every
        /// token of the `timeline << 48 | xid` scheme before it, while the
        /// clock of the server that grants the key is not behind the clock
        /// that made the previous token by the time between the two
        /// acquisitions (at least a round trip and the lock delay; across a
        /// failover, the time from the last acquisition on the old primary
        /// to the first on the new one) or more.
        ///
        /// Keys won by one batched try share the same token: tokens order
        /// acquisitions of one key, they do not identify a lease across keys.
        token: i64,
        /// Until when the lease is valid unless confirmed again.
        valid_until: Instant,
    },
    /// Cancel the job of `run`; report [`Input::JobExited`] when it returns.
    CancelJob {
        /// The run.
        run: RunId,
        /// Why.
        reason: Reason,
    },
    /// The run is over: return its outcome to the caller.
    Finish {
        /// The run.
        run: RunId,
        /// How it ended.
        outcome: Outcome,
    },
}

/// Something that happened, for logs and metrics.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A connection attempt starts.
    SessionOpening {
        /// The session.
        session: SessionId,
        /// Consecutive failed attempts before this one.
        failures: u32,
    },
    /// The session passed setup and is in use.
    SessionReady {
        /// The session.
        session: SessionId,
        /// The server's backend pid.
        backend_pid: i64,
        /// The server's `server_version_num`.
        server_version: i64,
    },
    /// A connection attempt failed (the session never opened). The machine
    /// tries again after a backoff, unless `configuration` is set before it
    /// ever had a ready session: then every run finishes with
    /// [`Outcome::Config`].
    ConnectFailed {
        /// The session asked for.
        session: SessionId,
        /// What the driver saw (a timeout: "connection attempt timed out").
        error: SessionError,
        /// [`SessionError::is_configuration`]: a wrong password, role, database
        /// or TLS setup. After a ready session this is retried; log it
        /// loudly (a rotated password, a dropped role).
        configuration: bool,
        /// Consecutive failed attempts, this one included.
        failures: u32,
        /// The machine tries again after a backoff; `false`: a configuration
        /// error before any ready session, every run finished with
        /// [`Outcome::Config`].
        retried: bool,
    },
    /// The session ended or was closed; every lease on it is lost.
    SessionLost {
        /// The session.
        session: SessionId,
        /// Why.
        reason: Reason,
    },
    /// The session was closed because no run needs it.
    SessionIdle {
        /// The session.
        session: SessionId,
    },
    /// A run won its lease.
    Acquired {
        /// The run.
        run: RunId,
        /// The lease.
        lease: LeaseId,
        /// The fencing token.
        token: i64,
    },
    /// A run lost its lease; its job is cancelled.
    Lost {
        /// The run.
        run: RunId,
        /// The lease.
        lease: LeaseId,
        /// Why.
        reason: Reason,
    },
    /// A run released its lease after its job returned.
    Released {
        /// The run.
        run: RunId,
        /// The lease.
        lease: LeaseId,
    },
    /// A run stands by: the key is held elsewhere. Emitted when the run starts
    /// waiting and when the holder changes.
    StandingBy {
        /// The run.
        run: RunId,
        /// The lease.
        lease: LeaseId,
        /// The holder's backend pid, when `pg_locks` showed it.
        holder_pid: Option<i64>,
    },
    /// A handover notification for a wanted key came from another backend
    /// than the holder the standby last saw (`pg_locks` in its last try):
    /// not a graceful release of that holder (any role may `NOTIFY`, and a
    /// late one may come from an earlier holder), so it was ignored; a key
    /// freed meanwhile is tried, and a win waits out the lock delay.
    NotificationIgnored {
        /// The key named in the payload.
        key: i64,
        /// The backend that sent it.
        sender_pid: i64,
        /// The holder the standby last saw, if `pg_locks` showed one.
        holder_pid: Option<i64>,
    },
    /// The watch session's wait woke: the key was freed (see
    /// [`Statement::Wait`](crate::Statement::Wait)); a try follows on the
    /// lease session.
    KeyFreed {
        /// The key.
        key: i64,
    },
    /// A standby's wait on the server took its key the moment it was freed
    /// (see [`Statement::Take`](crate::Statement::Take)): a win, as a try's;
    /// its job starts after the lock delay, unless the release was graceful.
    KeyTaken {
        /// The key.
        key: i64,
    },
    /// A try or a take won a key that a hand-over to another backend was
    /// asked for meanwhile (`lease handover --to`, a preferred standby's
    /// request): its job does not start, and the key is released at once,
    /// with the notification that tells that backend to take it.
    WinDeclined {
        /// The key.
        key: i64,
        /// The backend it is reserved for.
        to_pid: i64,
    },
    /// A wait failed otherwise than by its lock timeout; the session polls
    /// from now on.
    WaitFailed {
        /// The error.
        error: SessionError,
    },
    /// A wait blocked the session while something else needed it (a new
    /// run, a notification for another key, no run left): the session was
    /// closed, holding nothing.
    WaitInterrupted {
        /// The session.
        session: SessionId,
    },
    /// The watch session (see
    /// [`ServerWait::IdleAndWatch`](crate::ServerWait::IdleAndWatch)) failed to
    /// open, ended, or timed out: it opens again no sooner than the next
    /// periodic try; meanwhile the locker polls for the leases it wants.
    WatchSessionLost {
        /// The watch session.
        session: SessionId,
        /// What the driver saw, if anything.
        error: Option<SessionError>,
    },
    /// A try statement failed; held keys are verified before anything else.
    TryFailed {
        /// The error.
        error: SessionError,
    },
    /// A key this session held without knowing (a lock statement that failed
    /// part-way) was found and is being unlocked.
    UnknownKeyReleased {
        /// The key.
        key: i64,
    },
    /// The server is a hot standby (in recovery): the session is closed and
    /// the machine tries again after a backoff. Log it loudly: leases wait
    /// until a primary is reached.
    InRecovery {
        /// The session.
        session: SessionId,
    },
    /// The server was promoted recently (see
    /// [`PromotionState`](crate::reply::PromotionState)): the session tries no key
    /// for `hold`, until every holder of the old primary must have stopped
    /// ([`Options::promotion_hold`](crate::Options::promotion_hold) after
    /// the promotion). It heartbeats meanwhile.
    PromotionHold {
        /// The session.
        session: SessionId,
        /// How long from the setup's reply.
        hold: std::time::Duration,
    },
    /// The promotion hold of this session ([`Event::PromotionHold`]) has
    /// passed: the session tries keys again. Emitted when the machine next
    /// picks a statement after the hold's end (at the retry deadline that
    /// ends it); not for a session lost during the hold.
    PromotionHoldEnded {
        /// The session.
        session: SessionId,
    },
    /// The server's clock (`clock_timestamp()`, which fencing tokens are
    /// made of) stepped back, against this locker's monotonic clock, by more
    /// than the bound: the guard margin in force plus the drift the
    /// guarantee allows ([`Options::drift_bound`](crate::Options::drift_bound))
    /// over the time since the reading compared with, whatever the round
    /// trips (each reading is placed anywhere between its statement's send
    /// and reply). Fencing tokens this server grants may be below tokens
    /// granted before the step: a fence may reject the legitimate leader
    /// until the server's clock passes the stored token's time (see the
    /// crate's `docs/fencing.md`). Reported once per step; log it loudly.
    ServerClockStepped {
        /// The session whose reply showed the step.
        session: SessionId,
        /// How far back, at least (the round trips and the drift allowed
        /// are not counted in it).
        back: std::time::Duration,
        /// The reading compared with came from an earlier session (a
        /// restart, a failover, another host): a new session's setup.
        across_sessions: bool,
    },
    /// A pooler rejected the `options` startup parameter: the machine
    /// connects again without it and applies the settings by statement.
    StartupOptionsRejected {
        /// The session whose connection failed.
        session: SessionId,
        /// The error.
        error: SessionError,
    },
    /// The machine refuses this setup; see [`Refusal`].
    Refused {
        /// Why.
        refusal: Refusal,
    },
    /// A lease group's membership read on this session showed other members
    /// than the read before it on this session: a member joined or left (the
    /// first read of a session shows every member as joined, this session
    /// among them: its member id is its backend pid). See the crate's
    /// `docs/library.md`, "Lease groups".
    GroupMembers {
        /// The group.
        group: GroupId,
        /// The members now: their ids (backend pids), this session's included.
        members: Vec<i64>,
        /// Members the read before did not show.
        joined: Vec<i64>,
        /// Members of the read before that are gone.
        left: Vec<i64>,
    },
    /// A lease this locker leads is handed over: to the lease group member
    /// that owns it in the group's share, or to the backend a hand-over
    /// request named. The job is cancelled ([`Reason::HandedOver`]), the key
    /// released once it returned (then [`Event::Released`]), and the other
    /// side takes it.
    HandedOver {
        /// The run.
        run: RunId,
        /// The lease.
        lease: LeaseId,
        /// Where it goes: the owner's member id, or the backend the request
        /// named (a backend pid either way).
        to: i64,
        /// A hand-over request asked for it
        /// ([`handover_request_payload`](crate::server::handover_request_payload)),
        /// not the group's share.
        requested: bool,
    },
    /// A hand-over of a lease this locker leads was asked for backend `to`,
    /// and no check found that backend waiting for the key within the ask's
    /// window (a mistyped pid, a backend gone, a forged request): the job
    /// goes on, nothing was handed over (see `handover`).
    HandoverDeclined {
        /// The lease's key.
        key: i64,
        /// The backend the request named.
        to: i64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_may_be_free_after_a_session_end_a_failed_verify_or_a_pooler() {
        let pooler = [
            Refusal::BackendChanged { was: 1, now: 2 },
            Refusal::BackendShared { detail: "x".into() },
            Refusal::TransactionPooler { detail: "x".into() },
        ];
        let at_setup = [
            Refusal::ServerTooOld {
                found: Some(130_000),
                needed: 140_000,
            },
            Refusal::StartupOptionsIgnored { detail: "x".into() },
        ];
        // The server's FATAL answer to a statement in flight: the session is
        // ending and its locks with it.
        let fatal = ["57P01", "57P02", "57P05", "08006"]
            .map(|code| Reason::QueryFailed(SessionError::server(code, "terminating connection")));
        let free = [Reason::SessionEnded(None), Reason::NotHeld]
            .into_iter()
            .chain(fatal)
            .chain(pooler.into_iter().map(Reason::Refused));
        let held = [
            Reason::QueryTimeout,
            Reason::ValidityExpired,
            Reason::QueryFailed(SessionError::server("57014", "canceling statement")),
            Reason::QueryFailed(SessionError::server("42883", "function does not exist")),
            Reason::Shutdown,
            Reason::Closed,
            Reason::InRecovery,
        ]
        .into_iter()
        .chain(at_setup.into_iter().map(Reason::Refused));
        for reason in free {
            assert!(reason.key_may_be_free(), "{reason:?}");
        }
        for reason in held {
            assert!(!reason.key_may_be_free(), "{reason:?}");
        }
    }
}
