//! What a runtime gives the driver: a clock, a timer, and a way to connect.
//!
//! This is the whole contract between [`Driver`](crate::Driver) and an async
//! runtime. An adapter implements [`Runtime`] in about a hundred lines; it
//! never sees a statement, a lease or a deadline of its own.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use lease_proto::SessionError;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::{AsyncMessage, Client, Config};

/// The runtime's clock, shared by the driver, the runs and their leases.
pub(crate) type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The result of [`Runtime::connect`]: a client and its connection, or why not.
pub type Connected = Result<(Client, Box<dyn Connection>), SessionError>;

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

    /// Opens a session with `config`: one host (the driver walks a host list
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

/// The connection half of a session: polled by the driver for notifications
/// and for its end. Implemented for every tokio-postgres `Connection`.
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

/// A tokio-postgres error as the machine wants it: the SQLSTATE and a
/// one-line message, never the connection config. Marked as configuration
/// ([`SessionError::config`]): a TLS failure that is not the network's (a
/// certificate that fails verification, a server without TLS under
/// `sslmode=require`, no TLS connector under `sslmode=require`), and
/// tokio-postgres's "invalid configuration" (a server that asks for a
/// password the configuration does not have).
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
        config: tls_config_error(e) || client_config_error(e),
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
