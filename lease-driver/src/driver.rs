//! The driver future: the connection, the one query in flight, the one timer.
//!
//! Poll order, every round: take the session commands the core routed here
//! and carry them out; poll the connection attempt, the connection
//! (notifications, its end), the watch session (its attempt, its end, its
//! wait) and the query, feeding each result to the core;
//! then read the core's next deadline and poll the timer for it. The clock
//! is read by [`Inner::input`](crate::shared::Inner::input) when each input
//! is fed, before the timer is polled.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use lease_proto::{reply::Row, Input, QueryId, SessionCommand, SessionError, SessionId};
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::Config;

use crate::hosts::{self, Opened};
use crate::metrics::Sent;
use crate::runtime::{BoxFuture, Runtime, Session, SessionEvent, Timer};
use crate::shared::Inner;

type Reply = BoxFuture<Result<Vec<Row>, SessionError>>;
/// The one timer and the deadline it is armed for (`None`: fired).
type Armed = (Pin<Box<dyn Timer>>, Option<Instant>);

/// Inputs fed in one poll before yielding to the runtime.
const BUDGET: usize = 64;

/// Runs the database side of a [`Locker`](crate::Locker): connects, sends the
/// core's statements, watches the connection and keeps its timer.
///
/// Every run waits for it: poll it to completion on the runtime it was made
/// for (spawn it, or poll it beside your runs). It spawns nothing. It ends
/// after [`Locker::close`](crate::Locker::close), or once every `Locker`
/// handle is dropped and no run remains. Dropping it early ends the session
/// (the server releases every key) and every pending run returns
/// [`RunError::DriverStopped`](crate::RunError::DriverStopped) once its job
/// has returned.
///
/// # Cancel safety
/// Not cancel-safe: it is meant to be polled to its end. Dropping it (a
/// losing `select!` branch) ends the session as above; poll it in a `select!`
/// only by reference (`&mut driver`), keeping it for the next loop.
#[must_use = "the driver does nothing unless polled: spawn it"]
pub struct Driver<R: Runtime> {
    inner: Arc<Inner>,
    runtime: Arc<R>,
    config: Config,
    conn: Conn,
    /// The one statement in flight, when it was sent (for the metrics).
    query: Option<(QueryId, Sent, Reply)>,
    /// The one probe in flight: a statement on a second connection.
    probe: Option<(QueryId, Reply)>,
    /// The watch session: a second connection that only waits.
    watch: Watch,
    /// Its one statement in flight.
    watch_query: Option<(QueryId, Reply)>,
    /// Made at the first deadline.
    timer: Option<Armed>,
    closing: bool,
    /// A listed host's WAL timeline could not be read: the stale-primary
    /// check said so once (`hosts::open_lease_session`).
    unchecked: Arc<AtomicBool>,
}

// No field is pinned structurally: the futures are boxed, the rest moves freely.
impl<R: Runtime> Unpin for Driver<R> {}

impl<R: Runtime> fmt::Debug for Driver<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("runtime", &self.runtime)
            .field("session", &self.session())
            .finish_non_exhaustive()
    }
}

enum Conn {
    Down,
    Opening(SessionId, BoxFuture<Result<Opened, SessionError>>),
    /// The session, and the host (one host's configuration, the session's
    /// startup options included) it opened on.
    Up(SessionId, Box<dyn Session>, Box<Config>),
}

/// The watch session's connection ([`SessionCommand::OpenWatch`]): opened on
/// the session's host with its parameters; nothing else is shared.
enum Watch {
    Down,
    Opening(SessionId, BoxFuture<Result<Opened, SessionError>>),
    Up(SessionId, Box<dyn Session>),
}

impl<R: Runtime> Driver<R> {
    pub(crate) fn new(inner: Arc<Inner>, runtime: Arc<R>, config: Config) -> Self {
        Driver {
            inner,
            runtime,
            config,
            conn: Conn::Down,
            query: None,
            probe: None,
            watch: Watch::Down,
            watch_query: None,
            timer: None,
            closing: false,
            unchecked: Arc::default(),
        }
    }

    /// Carries out one session command of the core.
    fn execute(&mut self, command: SessionCommand) {
        match command {
            SessionCommand::Open { session, params } => {
                let mut config = self.config.clone();
                let extra = params.options_string();
                if !extra.is_empty() {
                    let options = match config.get_options() {
                        Some(user) if !user.trim().is_empty() => format!("{user} {extra}"),
                        _ => extra,
                    };
                    config.options(options);
                }
                self.query = None;
                self.probe = None;
                // Each host in turn, each within its share of the attempt.
                let hosts = hosts::split(&config, crate::shared::seed());
                let attempt = self.inner.lock().machine.options().query_timeout;
                let connect_timeout = config.get_connect_timeout().copied();
                let share = hosts::share(connect_timeout, hosts.len(), attempt);
                let opening = hosts::open_lease_session(
                    self.runtime.clone(),
                    hosts,
                    share,
                    self.unchecked.clone(),
                );
                self.conn = Conn::Opening(session, Box::pin(opening));
            }
            SessionCommand::Query { query, statement } => match &self.conn {
                Conn::Up(_, session, _) => {
                    let reply = session.query(&statement);
                    let sent = Sent::new(self.inner.clock(), &statement);
                    self.query = Some((query, sent, reply));
                }
                _ => {
                    let result = Err(SessionError::other("no open session"));
                    self.inner.input(Input::Reply { query, result });
                }
            },
            SessionCommand::Probe { query, statement } => match &self.conn {
                Conn::Up(.., host) => {
                    let (runtime, mut host) = (self.runtime.clone(), (**host).clone());
                    // The host passed its check when the session opened.
                    host.target_session_attrs(TargetSessionAttrs::Any);
                    let reply = async move {
                        // The session's own host and parameters; the machine
                        // times the whole probe out (and says what a probe
                        // that got no answer most likely means).
                        let (_, mut session) = hosts::open(runtime, vec![host], None).await?;
                        let reply = session.query(&statement);
                        hosts::alone(&mut *session, reply).await
                    };
                    self.probe = Some((query, Box::pin(reply)));
                }
                _ => {
                    let result = Err(SessionError::other("no open session"));
                    self.inner.input(Input::Reply { query, result });
                }
            },
            SessionCommand::Close { session } => {
                if self.session() == Some(session) {
                    self.close();
                }
            }
            SessionCommand::OpenWatch { session } => match &self.conn {
                Conn::Up(.., host) => {
                    let (runtime, mut host) = (self.runtime.clone(), (**host).clone());
                    // The host passed its check when the session opened; the
                    // machine times the attempt out.
                    host.target_session_attrs(TargetSessionAttrs::Any);
                    let opening = hosts::open(runtime, vec![host], None);
                    self.watch_query = None;
                    self.watch = Watch::Opening(session, Box::pin(opening));
                }
                _ => {
                    let error = Some(SessionError::other("no open session"));
                    self.inner.input(Input::SessionEnded { session, error });
                }
            },
            SessionCommand::WatchQuery {
                session,
                query,
                statement,
            } => match &self.watch {
                Watch::Up(id, watch) if *id == session => {
                    self.watch_query = Some((query, watch.query(&statement)));
                }
                _ => {
                    let result = Err(SessionError::other("no open watch session"));
                    self.inner.input(Input::Reply { query, result });
                }
            },
            SessionCommand::CloseWatch { session } => {
                if let Watch::Opening(id, _) | Watch::Up(id, ..) = &self.watch {
                    if *id == session {
                        self.watch = Watch::Down;
                        self.watch_query = None;
                    }
                }
            }
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
        self.probe = None;
        self.conn = Conn::Down;
    }

    /// Polls the connection attempt, the connection and the query; feeds what
    /// they yield.
    fn poll_io(&mut self, cx: &mut Context<'_>) {
        if let Conn::Opening(session, connecting) = &mut self.conn {
            if let Poll::Ready(result) = connecting.as_mut().poll(cx) {
                let session = *session;
                match result {
                    Ok((host, opened)) => {
                        // Every line that says where the session is names it.
                        self.inner.lock().set_host(Some(hosts::label(&host)));
                        self.conn = Conn::Up(session, opened, Box::new(host));
                        self.inner.input(Input::SessionOpened { session });
                    }
                    Err(error) => {
                        self.close();
                        let error = Some(error);
                        self.inner.input(Input::SessionEnded { session, error });
                    }
                }
            }
        }
        while let Conn::Up(session, opened, _) = &mut self.conn {
            let session = *session;
            match opened.poll_event(cx) {
                Poll::Pending => break,
                // The sender's backend: the machine counts a handover
                // notification only from the holder its standby saw.
                Poll::Ready(SessionEvent::Notification {
                    channel,
                    payload,
                    sender_pid,
                }) => {
                    self.inner.input(Input::Notification {
                        channel,
                        payload,
                        sender_pid,
                    });
                }
                Poll::Ready(SessionEvent::Notice(notice)) => {
                    tracing::debug!(
                        session = session.0,
                        notice = notice.as_str(),
                        "server notice"
                    );
                }
                // Any end of the connection: the session and its keys are
                // gone. Polled before the query, and `close` drops it: a
                // reply read with the end (a "won" the server sent just
                // before terminating the session) is never fed.
                Poll::Ready(SessionEvent::Ended(error)) => {
                    self.close();
                    self.inner.input(Input::SessionEnded { session, error });
                }
            }
        }
        self.poll_watch(cx);
        if let Some((_, reply)) = &mut self.probe {
            if let Poll::Ready(result) = reply.as_mut().poll(cx) {
                if let Some((query, _)) = self.probe.take() {
                    self.inner.input(Input::Reply { query, result });
                }
            }
        }
        if let Some((_, _, reply)) = &mut self.query {
            if let Poll::Ready(result) = reply.as_mut().poll(cx) {
                if let Some((query, sent, _)) = self.query.take() {
                    sent.replied(self.inner.clock(), &result);
                    self.inner.input(Input::Reply { query, result });
                }
            }
        }
    }

    /// Polls the watch session's attempt, its connection (for its end) and
    /// its wait, as for the session.
    fn poll_watch(&mut self, cx: &mut Context<'_>) {
        if let Watch::Opening(session, opening) = &mut self.watch {
            if let Poll::Ready(result) = opening.as_mut().poll(cx) {
                let session = *session;
                match result {
                    Ok((_, opened)) => {
                        self.watch = Watch::Up(session, opened);
                        self.inner.input(Input::SessionOpened { session });
                    }
                    Err(error) => {
                        self.watch = Watch::Down;
                        let error = Some(error);
                        self.inner.input(Input::SessionEnded { session, error });
                    }
                }
            }
        }
        while let Watch::Up(session, watch) = &mut self.watch {
            let session = *session;
            match watch.poll_event(cx) {
                Poll::Pending => break,
                // It listens to nothing: notices only.
                Poll::Ready(SessionEvent::Notification { .. } | SessionEvent::Notice(_)) => {}
                Poll::Ready(SessionEvent::Ended(error)) => {
                    self.watch = Watch::Down;
                    self.watch_query = None;
                    self.inner.input(Input::SessionEnded { session, error });
                }
            }
        }
        if let Some((_, reply)) = &mut self.watch_query {
            if let Poll::Ready(result) = reply.as_mut().poll(cx) {
                if let Some((query, _)) = self.watch_query.take() {
                    self.inner.input(Input::Reply { query, result });
                }
            }
        }
    }

    /// Arms the one timer at the core's next deadline; feeds `Tick` when it fires.
    fn poll_timer(&mut self, cx: &mut Context<'_>) {
        let Some(at) = self.inner.lock().machine.poll_timeout() else {
            return;
        };
        let runtime = &self.runtime;
        let (timer, armed) = self
            .timer
            .get_or_insert_with(|| (runtime.timer(at), Some(at)));
        if *armed != Some(at) {
            timer.as_mut().reset(at);
            *armed = Some(at);
        }
        if timer.as_mut().poll(cx).is_ready() {
            // A fired timer is re-armed next time, even for the same deadline.
            *armed = None;
            self.inner.input(Input::Tick);
        }
    }

    /// The driver is ending: its session goes with it, so the core learns it
    /// lost every lease before the socket closes; every waiter wakes.
    fn stop(&mut self) {
        let mut s = self.inner.lock();
        if s.driver_gone {
            return;
        }
        s.metrics.driver_stopped();
        if let Conn::Opening(session, _) | Conn::Up(session, ..) = &self.conn {
            let error = Some(SessionError::other("the lease driver stopped"));
            s.input(Input::SessionEnded {
                session: *session,
                error,
            });
        }
        s.driver_gone = true;
        s.session.clear();
        s.wake_all();
    }
}

impl<R: Runtime> Future for Driver<R> {
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

impl<R: Runtime> Drop for Driver<R> {
    fn drop(&mut self) {
        self.stop();
    }
}
