//! The async-io runtime for the driver core: the system clock, async-io's
//! timer, and sessions opened by [`connect`](crate::connect) over async-io
//! sockets.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use lease_driver::{Adapter, BoxFuture, Connected, PostgresSession, Runtime, Timer};
use tokio_postgres::Config;

use crate::connect::{connect, SmolTls};

/// The async-io adapter: names the smol [`Locker`](crate::Locker) and makes
/// its runtime.
#[derive(Debug)]
pub enum SmolAdapter {}

impl<T: SmolTls> Adapter<T> for SmolAdapter {
    type Runtime = Smol<T>;

    fn runtime(tls: T) -> Smol<T> {
        Smol::new(tls)
    }
}

/// The driver core's [`Runtime`] on async-io (smol, or any executor),
/// connecting with `T`.
pub struct Smol<T> {
    tls: T,
}

impl<T> Smol<T> {
    /// The async-io runtime, connecting with `tls`.
    pub fn new(tls: T) -> Smol<T> {
        Smol { tls }
    }
}

impl<T> fmt::Debug for Smol<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Smol")
    }
}

impl<T: SmolTls> Runtime for Smol<T> {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn timer(&self, at: Instant) -> Pin<Box<dyn Timer>> {
        Box::pin(AsyncIoTimer(async_io::Timer::at(at)))
    }

    fn connect(&self, config: Config) -> BoxFuture<Connected> {
        let tls = self.tls.clone();
        Box::pin(async move {
            let (client, connection) = connect(config, tls).await?;
            Ok(PostgresSession::boxed(client, connection))
        })
    }
}

/// async-io's timer as the driver's timer.
#[derive(Debug)]
struct AsyncIoTimer(async_io::Timer);

impl Timer for AsyncIoTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.0.set_at(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}
