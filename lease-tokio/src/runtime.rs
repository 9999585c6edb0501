//! The tokio runtime for the driver core: tokio's clock and timer, and
//! tokio-postgres's own `Config::connect`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use lease_driver::{
    session_error, Adapter, BoxFuture, Connected, Driver, PostgresSession, Runtime, Spawn, Timer,
};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Config, Socket};

/// What [`Locker::from_config`](crate::Locker::from_config) accepts: any tokio-postgres TLS
/// connector usable from a spawned task (`NoTls`, `tokio-postgres-rustls`,
/// `postgres-native-tls`, ...). Implemented for every such type.
pub trait TokioTls:
    MakeTlsConnect<Socket, Stream: Send, TlsConnect: Send + TlsConnect<Socket, Future: Send>>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> TokioTls for T where
    T: MakeTlsConnect<Socket, Stream: Send, TlsConnect: Send + TlsConnect<Socket, Future: Send>>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// The tokio adapter: names the tokio [`Locker`](crate::Locker) and makes its
/// runtime.
#[derive(Debug)]
pub enum TokioAdapter {}

impl<T: TokioTls> Adapter<T> for TokioAdapter {
    type Runtime = Tokio<T>;

    fn runtime(tls: T) -> Tokio<T> {
        Tokio::new(tls)
    }
}

impl Spawn for TokioAdapter {
    fn spawn<R: Runtime>(driver: Driver<R>) {
        tokio::spawn(driver);
    }
}

/// The driver core's [`Runtime`] on tokio, connecting with `T`.
///
/// Time is tokio's: under `tokio::time::pause()` the locker's clock and its
/// timer move together.
pub struct Tokio<T> {
    tls: T,
}

impl<T> Tokio<T> {
    /// The tokio runtime, connecting with `tls`.
    pub fn new(tls: T) -> Tokio<T> {
        Tokio { tls }
    }
}

impl<T> fmt::Debug for Tokio<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tokio")
    }
}

impl<T: TokioTls> Runtime for Tokio<T> {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn timer(&self, at: Instant) -> Pin<Box<dyn Timer>> {
        Box::pin(Sleep(Box::pin(tokio::time::sleep_until(at.into()))))
    }

    fn connect(&self, config: Config) -> BoxFuture<Connected> {
        let tls = self.tls.clone();
        Box::pin(async move {
            let (client, connection) = config.connect(tls).await.map_err(|e| session_error(&e))?;
            Ok(PostgresSession::boxed(client, connection))
        })
    }
}

/// tokio's `Sleep` as the driver's timer.
#[derive(Debug)]
struct Sleep(Pin<Box<tokio::time::Sleep>>);

impl Timer for Sleep {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.0.as_mut().reset(at.into());
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}
