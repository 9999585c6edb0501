//! The driver future: the connection, the one query in flight, the one timer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lease_proto::{decode_text_row, Command, DbError, Input, QueryId, Row, SessionId};
use tokio::time::Sleep;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, Connection, SimpleQueryMessage, Socket};

use crate::shared::Inner;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Connected<S> = Result<(Client, Connection<Socket, S>), tokio_postgres::Error>;
type Reply = BoxFuture<Result<Vec<Row>, DbError>>;

/// What [`Locker::new`](crate::Locker::new) accepts: any tokio-postgres TLS
/// connector usable from a spawned task (`NoTls`, `tokio-postgres-rustls`,
/// `postgres-native-tls`, ...). Implemented for every such type.
pub trait MakeTls:
    MakeTlsConnect<Socket, Stream: Send, TlsConnect: Send + TlsConnect<Socket, Future: Send>>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> MakeTls for T where
    T: MakeTlsConnect<Socket, Stream: Send, TlsConnect: Send + TlsConnect<Socket, Future: Send>>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Inputs fed in one poll before yielding to the runtime.
const BUDGET: usize = 64;

/// Runs the database side of a [`Locker`](crate::Locker): connects, sends the
/// core's statements, watches the connection and keeps its timer.
///
/// Every run waits for it: poll it to completion (`tokio::spawn(driver)`, or
/// use [`Locker::spawn`](crate::Locker::spawn)). It spawns nothing. It ends
/// after [`Locker::close`](crate::Locker::close), or once every `Locker` handle
/// is dropped and no run remains. Dropping it early ends the session (the
/// server releases every key) and every pending run returns
/// [`RunError::DriverStopped`](crate::RunError::DriverStopped) once its job
/// has returned.
#[must_use = "the driver does nothing unless polled: spawn it, or use Locker::spawn"]
pub struct Driver<T: MakeTls> {
    inner: Arc<Inner>,
    config: Config,
    tls: T,
    conn: Conn<T::Stream>,
    query: Option<(QueryId, Reply)>,
    sleep: Option<Pin<Box<Sleep>>>,
    closing: bool,
}

// No field is pinned structurally: the futures are boxed, the rest moves freely.
impl<T: MakeTls> Unpin for Driver<T> {}

enum Conn<S> {
    Down,
    Opening(SessionId, BoxFuture<Connected<S>>),
    Up(SessionId, Arc<Client>, Box<Connection<Socket, S>>),
}

impl<T: MakeTls> Driver<T> {
    pub(crate) fn new(inner: Arc<Inner>, config: Config, tls: T) -> Self {
        let (conn, query, sleep) = (Conn::Down, None, None);
        Driver {
            inner,
            config,
            tls,
            conn,
            query,
            sleep,
            closing: false,
        }
    }

    /// Carries out one session command of the core.
    fn execute(&mut self, command: Command) {
        match command {
            Command::OpenSession { session, params } => {
                let mut config = self.config.clone();
                let extra = params.options_string();
                if !extra.is_empty() {
                    let options = match config.get_options() {
                        Some(user) if !user.trim().is_empty() => format!("{user} {extra}"),
                        _ => extra,
                    };
                    config.options(options);
                }
                let tls = self.tls.clone();
                self.query = None;
                self.conn =
                    Conn::Opening(session, Box::pin(async move { config.connect(tls).await }));
            }
            Command::Query { query, statement } => match &self.conn {
                Conn::Up(_, client, _) => {
                    let (client, sql) = (client.clone(), statement.sql());
                    let reply = async move { rows(client.simple_query(&sql).await) };
                    self.query = Some((query, Box::pin(reply)));
                }
                _ => {
                    let result = Err(DbError::other("no open session"));
                    self.inner.input(Input::Reply { query, result });
                }
            },
            Command::CloseSession { session } => {
                if self.session() == Some(session) {
                    self.close();
                }
            }
            // Job commands go to the run futures, never here.
            Command::StartJob { .. } | Command::CancelJob { .. } | Command::FinishRun { .. } => {}
        }
    }

    fn session(&self) -> Option<SessionId> {
        match &self.conn {
            Conn::Down => None,
            Conn::Opening(id, _) | Conn::Up(id, ..) => Some(*id),
        }
    }

    fn close(&mut self) {
        self.query = None;
        self.conn = Conn::Down;
    }

    /// Polls the connection attempt, the connection and the query; feeds what
    /// they yield.
    fn poll_io(&mut self, cx: &mut Context<'_>) {
        if let Conn::Opening(session, connecting) = &mut self.conn {
            if let Poll::Ready(result) = connecting.as_mut().poll(cx) {
                let session = *session;
                match result {
                    Ok((client, connection)) => {
                        self.conn = Conn::Up(session, Arc::new(client), Box::new(connection));
                        self.inner.input(Input::SessionOpened { session });
                    }
                    Err(e) => {
                        self.close();
                        let error = Some(db_error(&e));
                        self.inner.input(Input::SessionLost { session, error });
                    }
                }
            }
        }
        while let Conn::Up(session, _, connection) = &mut self.conn {
            let session = *session;
            match connection.poll_message(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => {
                    let (channel, payload) = (n.channel().to_owned(), n.payload().to_owned());
                    self.inner.input(Input::Notification { channel, payload });
                }
                Poll::Ready(Some(Ok(AsyncMessage::Notice(n)))) => {
                    tracing::debug!(session = session.0, notice = n.message(), "server notice");
                }
                Poll::Ready(Some(Ok(_))) => {}
                // Any end of the connection: the session and its keys are gone.
                Poll::Ready(end) => {
                    self.close();
                    let error = end.and_then(Result::err).map(|e| db_error(&e));
                    self.inner.input(Input::SessionLost { session, error });
                }
            }
        }
        if let Some((query, reply)) = &mut self.query {
            if let Poll::Ready(result) = reply.as_mut().poll(cx) {
                let query = *query;
                self.query = None;
                self.inner.input(Input::Reply { query, result });
            }
        }
    }

    /// Arms the one timer at the core's next deadline; feeds `Tick` when it fires.
    fn poll_timer(&mut self, cx: &mut Context<'_>) {
        let Some(at) = self.inner.lock().machine.poll_timeout() else {
            return;
        };
        let at = tokio::time::Instant::from_std(at);
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if sleep.deadline() != at {
            sleep.as_mut().reset(at);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            self.inner.input(Input::Tick);
        }
    }
}

impl<T: MakeTls> Future for Driver<T> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        for _ in 0..BUDGET {
            let commands = {
                let mut s = this.inner.lock();
                if s.machine.is_closed() {
                    drop(s);
                    this.stop();
                    return Poll::Ready(());
                }
                s.driver = None;
                s.dirty = false;
                if s.lockers_gone && !this.closing {
                    this.closing = true;
                    s.input(Input::Close);
                }
                std::mem::take(&mut s.session)
            };
            for command in commands {
                this.execute(command);
            }
            this.poll_io(cx);
            this.poll_timer(cx);
            // Sleep unless an input arrived meanwhile (from here or a run).
            let mut s = this.inner.lock();
            if !s.dirty && s.session.is_empty() {
                s.driver = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<T: MakeTls> Driver<T> {
    /// The driver is ending: its session goes with it, so the core learns it
    /// lost every lease before the socket closes; every waiter wakes.
    fn stop(&mut self) {
        let mut s = self.inner.lock();
        if s.driver_gone {
            return;
        }
        if let Conn::Opening(session, _) | Conn::Up(session, ..) = &self.conn {
            let error = Some(DbError::other("the lease driver stopped"));
            s.input(Input::SessionLost {
                session: *session,
                error,
            });
        }
        s.driver_gone = true;
        s.session.clear();
        s.wake_all();
    }
}

impl<T: MakeTls> Drop for Driver<T> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every row of every result set, decoded.
fn rows(
    reply: Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>,
) -> Result<Vec<Row>, DbError> {
    let mut rows = Vec::new();
    for message in reply.map_err(|e| db_error(&e))? {
        if let SimpleQueryMessage::Row(row) = message {
            let row = decode_text_row((0..row.len()).map(|i| row.get(i)))
                .map_err(|e| DbError::other(e.to_string()))?;
            rows.push(row);
        }
    }
    Ok(rows)
}

/// SQLSTATE and a one-line message; never the connection config.
pub(crate) fn db_error(e: &tokio_postgres::Error) -> DbError {
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
    DbError {
        code: e.code().map(|c| c.code().to_owned()),
        message: message.replace(['\r', '\n'], " "),
    }
}
