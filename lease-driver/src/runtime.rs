//! What a runtime gives the driver: a clock, a timer, and a way to open a
//! [`Session`].
//!
//! This is the whole contract between [`Driver`](crate::Driver) and an async
//! runtime. An adapter implements [`Runtime`] in about a hundred lines; it
//! never sees a lease or a deadline of its own. A session is the one seam
//! between the driver and the server: [`PostgresSession`] is tokio-postgres
//! (every adapter's production path); a test kit may answer with a simulated
//! server instead, under the same driver and core.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use lease_proto::reply::{decode_text_row, Row};
use lease_proto::{SessionError, Statement};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::{AsyncMessage, Client, Config, SimpleQueryMessage};

/// The runtime's clock, shared by the driver, the runs and their leases.
pub(crate) type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The result of [`Runtime::connect`]: an open session, or why not.
pub type Connected = Result<Box<dyn Session>, SessionError>;

/// An async runtime, as the driver needs it.
///
/// `now()` must be the clock that [`Runtime::timer`] fires by (tokio's
/// `Instant` under tokio, so that `tokio::time::pause()` moves both): the
/// machine compares every deadline with it.
pub trait Runtime: Send + Sync + Debug + 'static {
    /// The current time, on the clock the timers use.
    fn now(&self) -> Instant;

    /// A timer that fires at `at`.
    fn timer(&self, at: Instant) -> Pin<Box<dyn Timer>>;

    /// Opens a session with `config` (tokio-postgres's `Config::connect`,
    /// returned as a [`PostgresSession`]): one host (the driver walks a host list
    /// itself, see the crate docs, "Several hosts"), the lease session's
    /// startup options included, `target_session_attrs` always `any` (the
    /// driver checks it after). Also called for the core's pooler probe, a
    /// second short connection to the session's host, and for the watch
    /// session, a second connection to it that only waits. The driver bounds the
    /// attempt; honour `connect_timeout` per address if the runtime can.
    ///
    /// # Cancel safety
    /// Must be cancel-safe: the driver drops the future of an attempt that
    /// ran past its bound, or when it ends, and dropping it must abandon the
    /// attempt (close its socket) and leave nothing behind.
    fn connect(&self, config: Config) -> BoxFuture<Connected>;
}

/// A resettable timer: fires once at its deadline.
pub trait Timer: Send + Debug {
    /// Moves the deadline; a fired timer fires again at the new one.
    fn reset(self: Pin<&mut Self>, at: Instant);

    /// Ready once the deadline has passed.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()>;
}

/// One open database session, as the driver uses it: statements out, their
/// rows back, notifications and the end of the session. Dropping it closes
/// the session (the server releases its locks).
///
/// [`PostgresSession`] implements it over tokio-postgres; a simulated server
/// may implement it too (lease-tokio's and lease-smol's `test-util` kits).
pub trait Session: Send {
    /// Sends `statement` as one simple-protocol query (its
    /// [`Statement::sql`]) and resolves to every row of its result sets,
    /// decoded ([`decode_text_row`]). The future must not borrow the
    /// session: the driver keeps polling [`Session::poll_event`] meanwhile,
    /// and may drop the future (its reply is then never read).
    fn query(&self, statement: &Statement) -> BoxFuture<Result<Vec<Row>, SessionError>>;

    /// libpq's `target_session_attrs=read-only` check: whether the session is
    /// read-only (`SHOW transaction_read_only` is `on`: a hot standby, or a
    /// primary with `default_transaction_read_only`).
    fn read_only(&self) -> BoxFuture<Result<bool, SessionError>>;

    /// The driver's `target_session_attrs=read-write` check: whether the
    /// server is in recovery (`SELECT pg_catalog.pg_is_in_recovery()` is
    /// true: a hot standby). A primary whose sessions default to read-only
    /// (`default_transaction_read_only`, a write freeze) is not: no lease
    /// statement writes (see the crate docs, "Several hosts").
    fn in_recovery(&self) -> BoxFuture<Result<bool, SessionError>>;

    /// The driver's stale-primary check of a host list (see the crate docs,
    /// "Several hosts"): the server's current WAL timeline, `None` on a
    /// server in recovery
    /// ([`PRIMARY_TIMELINE_SQL`](lease_proto::server::PRIMARY_TIMELINE_SQL)).
    /// The default answers an error: a session that cannot tell is logged
    /// once as not checked, never taken for a stale one.
    fn primary_timeline(&self) -> BoxFuture<Result<Option<i64>, SessionError>> {
        Box::pin(async {
            Err(SessionError::other(
                "this session cannot read the server's WAL timeline",
            ))
        })
    }

    /// The server's clock: the value of
    /// [`SERVER_TIME_SQL`](lease_proto::server::SERVER_TIME_SQL), microseconds
    /// since the Unix epoch, read by a schedule's leader (`Locker::schedule`,
    /// feature `schedule`) on a short connection of its own, never the lease
    /// session. The default answers an error with the code [`UNSUPPORTED`]: on
    /// a runtime whose sessions cannot read it, a schedule ends at its first
    /// lead with [`RunError::Config`](crate::RunError::Config).
    fn server_time_micros(&self) -> BoxFuture<Result<i64, SessionError>> {
        Box::pin(async {
            Err(SessionError::server(
                UNSUPPORTED,
                "this runtime's sessions cannot read the server's clock",
            ))
        })
    }

    /// The next notification or notice, or the end of the session; after
    /// [`SessionEvent::Ended`] the session is not polled again.
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<SessionEvent>;
}

/// What a [`Session`] yields besides replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// A `NOTIFY` on a channel the session listens on.
    Notification {
        /// The channel.
        channel: String,
        /// The payload.
        payload: String,
        /// The backend pid of the session that sent it.
        sender_pid: i64,
    },
    /// A notice from the server (logged at `DEBUG`).
    Notice(String),
    /// The session ended: with the error that ended it, or `None` for a
    /// clean end.
    Ended(Option<SessionError>),
}

/// The tokio-postgres [`Session`]: a client and its connection, opened by a
/// runtime (`Config::connect`, or `Config::connect_raw` over its own socket).
pub struct PostgresSession {
    client: Arc<Client>,
    connection: Box<dyn Connection>,
}

impl PostgresSession {
    /// The session of `client` over `connection`.
    pub fn new(client: Client, connection: impl Connection + 'static) -> PostgresSession {
        PostgresSession {
            client: Arc::new(client),
            connection: Box::new(connection),
        }
    }

    /// [`PostgresSession::new`], boxed as [`Runtime::connect`] returns it.
    pub fn boxed(client: Client, connection: impl Connection + 'static) -> Box<dyn Session> {
        Box::new(PostgresSession::new(client, connection))
    }
}

impl Debug for PostgresSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PostgresSession")
    }
}

impl Session for PostgresSession {
    fn query(&self, statement: &Statement) -> BoxFuture<Result<Vec<Row>, SessionError>> {
        let (client, sql) = (self.client.clone(), statement.sql());
        Box::pin(async move { rows(client.simple_query(&sql).await) })
    }

    fn read_only(&self) -> BoxFuture<Result<bool, SessionError>> {
        let client = self.client.clone();
        Box::pin(async move {
            let reply = client.simple_query("SHOW transaction_read_only").await;
            let messages = reply.map_err(|e| session_error(&e))?;
            let on = messages.iter().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(|v| v == "on"),
                _ => None,
            });
            on.ok_or_else(|| SessionError::other("no answer to SHOW transaction_read_only"))
        })
    }

    fn in_recovery(&self) -> BoxFuture<Result<bool, SessionError>> {
        let client = self.client.clone();
        Box::pin(async move { in_recovery(&client).await })
    }

    fn primary_timeline(&self) -> BoxFuture<Result<Option<i64>, SessionError>> {
        let client = self.client.clone();
        Box::pin(async move {
            let reply = client
                .simple_query(lease_proto::server::PRIMARY_TIMELINE_SQL)
                .await;
            let messages = reply.map_err(|e| session_error(&e))?;
            let value = messages.iter().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
                _ => None,
            });
            let value =
                value.ok_or_else(|| SessionError::other("no answer to the timeline query"))?;
            lease_proto::server::primary_timeline(value.as_deref())
                .map_err(|e| SessionError::other(e.to_string()))
        })
    }

    fn server_time_micros(&self) -> BoxFuture<Result<i64, SessionError>> {
        let client = self.client.clone();
        Box::pin(async move {
            let reply = client
                .simple_query(lease_proto::server::SERVER_TIME_SQL)
                .await;
            let messages = reply.map_err(|e| session_error(&e))?;
            let value = messages.iter().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).and_then(|v| v.parse::<i64>().ok()),
                _ => None,
            });
            value.ok_or_else(|| {
                SessionError::other("the server's clock_timestamp() did not come back as a number")
            })
        })
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<SessionEvent> {
        loop {
            let event = match self.connection.poll_message(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => {
                    SessionEvent::Notification {
                        channel: n.channel().to_owned(),
                        payload: n.payload().to_owned(),
                        sender_pid: i64::from(n.process_id()),
                    }
                }
                Poll::Ready(Some(Ok(AsyncMessage::Notice(n)))) => {
                    SessionEvent::Notice(n.message().to_owned())
                }
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(end) => {
                    SessionEvent::Ended(end.and_then(Result::err).map(|e| session_error(&e)))
                }
            };
            return Poll::Ready(event);
        }
    }
}

/// Every row of every result set, decoded.
fn rows(
    reply: Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>,
) -> Result<Vec<Row>, SessionError> {
    let mut rows = Vec::new();
    for message in reply.map_err(|e| session_error(&e))? {
        if let SimpleQueryMessage::Row(row) = message {
            let row = decode_text_row((0..row.len()).map(|i| row.get(i)))
                .map_err(|e| SessionError::other(e.to_string()))?;
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The connection half of a tokio-postgres session, which
/// [`PostgresSession`] polls for notifications and for its end. Implemented
/// for every tokio-postgres `Connection`.
pub trait Connection: Send {
    /// tokio-postgres's `Connection::poll_message`.
    fn poll_message(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<AsyncMessage, tokio_postgres::Error>>>;
}

impl<S, T> Connection for tokio_postgres::Connection<S, T>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    fn poll_message(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<AsyncMessage, tokio_postgres::Error>>> {
        tokio_postgres::Connection::poll_message(self, cx)
    }
}

/// Whether `client`'s server is in recovery (`SELECT pg_catalog.pg_is_in_recovery()`,
/// simple protocol: a hot standby). [`PostgresSession`]'s
/// [`Session::in_recovery`].
pub async fn in_recovery(client: &Client) -> Result<bool, SessionError> {
    let reply = client
        .simple_query("SELECT pg_catalog.pg_is_in_recovery()")
        .await;
    let messages = reply.map_err(|e| session_error(&e))?;
    let on = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).map(|v| v == "t"),
        _ => None,
    });
    on.ok_or_else(|| SessionError::other("no answer to SELECT pg_is_in_recovery()"))
}

/// The code (SQLSTATE `feature_not_supported`) of the error a [`Session`]
/// answers for what its runtime cannot do, such as
/// [`Session::server_time_micros`] by default.
pub const UNSUPPORTED: &str = "0A000";

/// A `read-write` host in recovery: a hot standby.
pub(crate) fn not_a_primary() -> SessionError {
    SessionError::other("the server is in recovery (a hot standby), not a primary")
}

/// The check a lease session gets for `target_session_attrs=read-write`, for a
/// connection of your own (one of [`hosts`](crate::hosts), opened with
/// `target_session_attrs` set to `any`): `Ok` on a primary, read-only by default or
/// not; an error on a server in recovery. See the crate docs, "Several hosts".
pub async fn check_primary(client: &Client) -> Result<(), SessionError> {
    if in_recovery(client).await? {
        return Err(not_a_primary());
    }
    Ok(())
}

/// A tokio-postgres error as the machine wants it: the SQLSTATE and a
/// one-line message, never the connection config. Marked as configuration
/// ([`SessionError::config`]): a TLS failure that is not the network's (a
/// certificate that fails verification, a server without TLS under
/// `sslmode=require`, no TLS connector under `sslmode=require`), and
/// tokio-postgres's "invalid configuration" (a server that asks for a
/// password the configuration does not have) and "authentication error" (an
/// exchange the client refuses, such as `channel_binding=require` against a
/// server that does not bind the channel).
pub fn session_error(e: &tokio_postgres::Error) -> SessionError {
    let message = match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        // "error connecting to server: Connection refused (os error 111)"
        None => {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            message
        }
    };
    let mut message = message.replace(['\r', '\n'], " ");
    if message.ends_with(NO_TLS) {
        message.push_str(NO_TLS_HINT);
    }
    SessionError {
        code: e.code().map(|c| c.code().to_owned()),
        message,
        config: tls_config_error(e) || client_config_error(e) || client_auth_error(e),
    }
}

/// tokio-postgres's cause when `sslmode=require` meets the `NoTls` connector.
const NO_TLS: &str = "no TLS implementation configured";

/// Where to go from [`NO_TLS`].
const NO_TLS_HINT: &str = " (sslmode=require, but this locker was made without TLS: make it with \
    Locker::from_env or Locker::from_conninfo, which set TLS up as libpq does, or with \
    Locker::from_config and a TLS connector)";

/// tokio-postgres's configuration errors found while connecting (its
/// `Kind::Config`, rendered "invalid configuration"; not public as a kind):
/// "password missing" when the server asks for a password that the
/// configuration does not have. Trying again cannot help.
fn client_config_error(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_none() && e.to_string().starts_with("invalid configuration")
}

/// tokio-postgres's own authentication failures while connecting (its
/// `Kind::Authentication`, rendered "authentication error"; the server's are
/// SQLSTATE class 28): the client refuses the server's exchange, such as
/// "server did not use channel binding" under `channel_binding=require`.
/// Trying again cannot help.
fn client_auth_error(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_none() && e.to_string().starts_with("authentication error")
}

/// A TLS error (tokio-postgres renders those as "error performing TLS
/// handshake") whose causes include no network I/O error.
fn tls_config_error(e: &tokio_postgres::Error) -> bool {
    if e.as_db_error().is_some() || !e.to_string().starts_with("error performing TLS handshake") {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if network(io.kind()) {
                return false;
            }
        }
        source = cause.source();
    }
    true
}

/// I/O error kinds that mean the network, not the configuration.
fn network(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | BrokenPipe
            | TimedOut
            | UnexpectedEof
            | Interrupted
    )
}
