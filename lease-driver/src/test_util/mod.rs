//! A test kit: the real [`Locker`] and [`Driver`] over an
//! in-process simulated PostgreSQL server, with faults, inspection and
//! checks, in the runtime's time (feature `test-util`).
//!
//! The server is [`lease_proto::sim::Postgres`], the model the simulator
//! runs (advisory locks, the idle-session guard, terminate, restart,
//! `LISTEN/NOTIFY`, lock waits); the kit adds the wire between each locker
//! and it (latency, partitions, freezes). Nothing above the [`Session`] is
//! simulated: the driver, the core and your job are the production code.
//! Everything is deterministic from the seed under a runtime whose clock is
//! virtual (tokio's `start_paused`, lease-smol's `test_util::block_on`); the
//! adapters' `test_util` modules name the types for their runtime
//! ([`TestAdapter`]).
//!
//! The kit has no task or thread of its own: every simulated session (and
//! every inspection) brings the server and the wire up to the runtime's
//! `now` and arms a timer at their next event.

mod checks;
pub mod nemesis;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use lease_proto::reply::Row;
use lease_proto::server::HANDOVER_CHANNEL;
use lease_proto::sim::{ConnId, Postgres, ServerConfig, ServerOutput};
use lease_proto::{key_for_name, QueryId, SessionError, Statement};
use tokio_postgres::Config;

use crate::runtime::{BoxFuture, Connected, Runtime, Session, SessionEvent, Timer};
use crate::shared::Inner;
use crate::{Driver, Locker, Options};

pub use checks::{Breach, FencedStore, JobLog, JobRun, Rejected, Running, Write};

/// The one-way latency of every link unless [`TestServer::slow`] says
/// otherwise: 1 ms (tokio's timers have a millisecond's resolution).
pub const DEFAULT_LATENCY: Duration = Duration::from_millis(1);

/// An adapter with a test kit: the runtime its [`TestServer`]'s lockers run
/// on. Implemented by `lease_tokio::TokioAdapter` (tokio's clock, virtual
/// under `start_paused`) and `lease_smol::SmolAdapter` (the kit's virtual
/// clock inside `lease_smol::test_util::block_on`).
pub trait TestAdapter: 'static {
    /// The runtime: its clock and timer (the kit opens the sessions itself,
    /// so its `connect` is never called).
    type TestRuntime: Runtime;

    /// The runtime for a server made now ([`TestServer::new`]), on the
    /// current thread.
    fn test_runtime() -> Self::TestRuntime;
}

/// A simulated PostgreSQL server and the network to it, on the test runtime
/// of adapter `A` (`lease_tokio::TokioAdapter`, `lease_smol::SmolAdapter`):
/// make lockers with [`TestServer::locker`], inject faults, inspect what
/// happened. Cheap to clone; clones share the server.
pub struct TestServer<A: TestAdapter> {
    runtime: Arc<A::TestRuntime>,
    state: Arc<Mutex<State>>,
    adapter: PhantomData<fn() -> A>,
}

impl<A: TestAdapter> Clone for TestServer<A> {
    fn clone(&self) -> Self {
        TestServer {
            runtime: self.runtime.clone(),
            state: self.state.clone(),
            adapter: PhantomData,
        }
    }
}

impl<A: TestAdapter> fmt::Debug for TestServer<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("TestServer")
            .field("now", &s.now)
            .field("lockers", &s.links.len())
            .finish_non_exhaustive()
    }
}

/// A statement a locker sent, as the server received it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Sent {
    /// The locker (its number: [`TestServer::locker`] counts from 0).
    pub locker: usize,
    /// When the locker sent it (time since the server was made).
    pub at: Duration,
    /// The statement.
    pub statement: Statement,
}

/// A lease the server granted: a try that won.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    /// The locker.
    pub locker: usize,
    /// The lease's advisory key ([`lease_proto::key_for_name`]).
    pub key: i64,
    /// The fencing token.
    pub token: i64,
    /// When (time since the server was made).
    pub at: Duration,
}

impl<A: TestAdapter> TestServer<A> {
    /// A server that is up, with no locker yet, deterministic from `seed`
    /// (the lockers' cores and the network's jitter draw from it). Its time
    /// zero is the runtime's `now`.
    pub fn new(seed: u64) -> Self {
        let runtime = Arc::new(A::test_runtime());
        let state = State::new(seed, runtime.now());
        TestServer {
            runtime,
            state: Arc::new(Mutex::new(state)),
            adapter: PhantomData,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The state, brought up to now.
    fn now_state(&self) -> MutexGuard<'_, State> {
        let mut s = self.lock();
        s.advance(self.runtime.now());
        s
    }

    /// Time since the server was made, on the runtime's clock.
    pub fn now(&self) -> Duration {
        self.now_state().now
    }

    /// A new locker over this server (numbered from 0 in creation order)
    /// and its driver, which the caller must run (spawn it) as in
    /// production. The locker and the driver are the real ones; only the
    /// session is simulated.
    ///
    /// # Errors
    /// [`crate::Error::Options`] for inconsistent options.
    pub fn locker(
        &self,
        options: Options,
    ) -> Result<(Locker<A>, SimDriver<A::TestRuntime>), crate::Error> {
        let (index, seed) = {
            let mut s = self.lock();
            s.links.push(Link::default());
            let seed = rand(&mut s.rng);
            (s.links.len() - 1, seed)
        };
        let runtime = SimRuntime {
            inner: self.runtime.clone(),
            state: self.state.clone(),
            locker: index,
        };
        let config: Config = "host=simulated user=sim dbname=sim"
            .parse()
            .map_err(|_| crate::Error::Config("test config".into()))?;
        let (locker, driver) = Locker::build(runtime, config, options, seed)?;
        self.lock().links[index].inner = Arc::downgrade(locker.inner());
        let driver = SimDriver {
            driver: Some(driver),
            state: self.state.clone(),
            locker: index,
        };
        Ok((locker, driver))
    }

    /// The number of `locker` (from 0, in creation order).
    ///
    /// # Panics
    /// If `locker` was not made by this server.
    pub fn index<B>(&self, locker: &Locker<B>) -> usize {
        self.lock()
            .index_of(locker.inner())
            .expect("a locker of this TestServer")
    }

    // ---- faults ---------------------------------------------------------

    /// `pg_terminate_backend` on every session of `locker`: it reads
    /// 57P01 and the server releases its keys at once.
    pub fn terminate<B>(&self, locker: &Locker<B>) {
        let i = self.index(locker);
        let mut s = self.now_state();
        let now = s.now;
        s.pg.terminate(now, i);
        s.drain_pg();
        s.poke();
    }

    /// Black-holes the link of `locker` both ways for `duration`: bytes wait
    /// and flow again on healing; neither side sees anything. The server's
    /// idle-session guard ends the silent session meanwhile (its end reaches
    /// the locker when the link heals).
    pub fn partition<B>(&self, locker: &Locker<B>, duration: Duration) {
        let i = self.index(locker);
        let mut s = self.now_state();
        s.links[i].partitions += 1;
        let at = s.now + duration;
        s.schedule(at, Heal::Partition(i));
        s.poke();
    }

    /// Freezes `locker` for `duration`, as a paused process, on its side of
    /// the wire: its driver's timer does not fire, its session neither sends
    /// nor receives (the server's guard ends it). Your job is NOT frozen
    /// (the kit cannot stop a future of yours): it runs on while its lease
    /// expires unseen — the pause no client can beat, which fencing tokens
    /// are for ([`FencedStore`]).
    pub fn freeze<B>(&self, locker: &Locker<B>, duration: Duration) {
        let i = self.index(locker);
        let mut s = self.now_state();
        let until = s.now + duration;
        let link = &mut s.links[i];
        link.frozen_until = link.frozen_until.max(until);
        s.schedule(until, Heal::Freeze(i));
        s.poke();
    }

    /// The one-way latency of every link from now on (default
    /// [`DEFAULT_LATENCY`]).
    pub fn slow(&self, latency: Duration) {
        let mut s = self.now_state();
        s.latency = latency;
        s.poke();
    }

    /// Crashes the process of `locker`: its driver stops at once, and its
    /// kernel closes its session (the server releases its keys when the
    /// close arrives). The kit cannot kill your job: it is cancelled as
    /// when a driver stops, and its run returns
    /// [`RunError::DriverStopped`](crate::RunError::DriverStopped) once it
    /// returned; drop (abort) the run's task too for a hard kill.
    pub fn crash<B>(&self, locker: &Locker<B>) {
        let i = self.index(locker);
        let mut s = self.now_state();
        s.links[i].crashed = true;
        if let Some(w) = s.links[i].driver.take() {
            w.wake();
        }
    }

    /// Refuses every connection attempt for `duration`, as a server at
    /// `max_connections` does (53300, "sorry, too many clients already"):
    /// open sessions go on. A schedule's leader, whose clock reads open
    /// connections of their own, cannot read the server's clock meanwhile.
    pub fn refuse_connections(&self, duration: Duration) {
        let mut s = self.now_state();
        s.refusing_until = s.now + duration;
        s.poke();
    }

    /// Restarts the server: every session ends (57P01); connection attempts
    /// are refused for `downtime`.
    pub fn restart(&self, downtime: Duration) {
        let mut s = self.now_state();
        let now = s.now;
        s.pg.restart(now, downtime);
        s.drain_pg();
        s.poke();
    }

    // ---- inspection -----------------------------------------------------

    /// The locker whose session holds lease `name` on the server now.
    pub fn holder(&self, name: &str) -> Option<usize> {
        let key = key_for_name(name);
        let s = self.now_state();
        (s.pg.holders().into_iter())
            .find(|(k, _)| *k == key)
            .and_then(|(_, conn)| s.pg.client_of(conn))
    }

    /// Every lease key held now, with the locker that holds it.
    pub fn holders(&self) -> Vec<(i64, usize)> {
        let s = self.now_state();
        (s.pg.holders().into_iter())
            .filter_map(|(k, conn)| Some((k, s.pg.client_of(conn)?)))
            .collect()
    }

    /// Every lease granted so far, in order.
    pub fn grants(&self) -> Vec<Grant> {
        self.now_state().grants.clone()
    }

    /// The fencing tokens granted for lease `name`, in order, with the
    /// locker each went to.
    pub fn tokens(&self, name: &str) -> Vec<(usize, i64)> {
        let key = key_for_name(name);
        (self.grants().into_iter())
            .filter(|g| g.key == key)
            .map(|g| (g.locker, g.token))
            .collect()
    }

    /// How many connections the lockers have opened so far (lease, watch
    /// and a schedule's clock reads alike): the cost a change to when a
    /// locker connects shows in.
    pub fn connections(&self) -> u64 {
        lock(&self.state).next_session
    }

    /// Every statement sent so far, in order.
    pub fn statements(&self) -> Vec<Sent> {
        self.now_state().statements.clone()
    }

    /// A log your job reports to ([`JobLog::start`]), for the checks.
    pub fn job_log(&self) -> JobLog {
        let log = JobLog::new(self.clock());
        self.lock().logs.push(log.clone());
        log
    }

    /// A store that accepts a write only with a fencing token at least the
    /// newest it has seen ([`FencedStore`]).
    pub fn fenced_store<T: Send + 'static>(&self) -> FencedStore<T> {
        FencedStore::new(self.clock())
    }

    /// The checks of `store`'s accepted writes against the grants: every
    /// accepted write carried the newest token of its lease granted by then
    /// (a write under an older token, or none, is a stale write that a
    /// store without fencing would have taken).
    pub fn check_newest_token<T: Send + 'static>(
        &self,
        store: &FencedStore<T>,
        lease: &str,
    ) -> Vec<Breach> {
        let key = key_for_name(lease);
        let grants: Vec<Grant> = self.grants().into_iter().filter(|g| g.key == key).collect();
        checks::newest_token(&store.accepted_marks(), &grants)
    }

    /// Runs `f` with the server's core (for what the kit does not expose).
    pub fn with_postgres<T>(&self, f: impl FnOnce(&mut Postgres) -> T) -> T {
        f(&mut self.now_state().pg)
    }

    fn clock(&self) -> checks::Clock {
        let (runtime, state) = (self.runtime.clone(), self.state.clone());
        Arc::new(move || {
            let mut s = lock(&state);
            s.advance(runtime.now());
            s.now
        })
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

fn rand(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---- the state: server, wire, sessions ----------------------------------

/// One locker's link to the server and its process.
#[derive(Default)]
struct Link {
    inner: Weak<Inner>,
    partitions: u32,
    frozen_until: Duration,
    crashed: bool,
    /// The driver's waker, for a crash.
    driver: Option<Waker>,
    /// Messages sent while partitioned or frozen, in order.
    held: Vec<Wire>,
    last_up: Duration,
    last_down: Duration,
}

impl Link {
    fn blocked(&self, now: Duration) -> bool {
        self.partitions > 0 || self.frozen_until > now
    }
}

#[derive(Debug)]
enum Wire {
    Up(usize, u64, Up),
    Down(usize, u64, Down),
}

#[derive(Debug)]
enum Up {
    Connect(Vec<(String, String)>),
    Query(QueryId, Statement),
    Close,
}

#[derive(Debug)]
enum Down {
    Connected,
    Failed(SessionError),
    Reply(QueryId, Result<Vec<Row>, SessionError>),
    Notify(String, i64),
    Ended(SessionError),
}

#[derive(Debug)]
enum Heal {
    Partition(usize),
    Freeze(usize),
}

enum Event {
    Wire(Wire),
    Heal(Heal),
}

/// A session as its client sees it.
#[derive(Default)]
struct Sess {
    conn: Option<ConnId>,
    opened: Option<Result<(), SessionError>>,
    replies: BTreeMap<QueryId, Result<Vec<Row>, SessionError>>,
    events: VecDeque<SessionEvent>,
    wakers: Vec<Waker>,
    next_query: u64,
    /// The client dropped it: its close is on the wire.
    gone: bool,
}

impl Sess {
    fn wait(&mut self, waker: &Waker) {
        if !self.wakers.iter().any(|w| w.will_wake(waker)) {
            self.wakers.push(waker.clone());
        }
    }
}

struct State {
    base: Instant,
    now: Duration,
    pg: Postgres,
    rng: u64,
    latency: Duration,
    /// Until when connection attempts are refused ([`TestServer::refuse_connections`]).
    refusing_until: Duration,
    links: Vec<Link>,
    /// Messages in flight and heals, by time (FIFO among equal times).
    events: BTreeMap<(Duration, u64), Event>,
    seq: u64,
    sessions: BTreeMap<u64, (usize, Sess)>,
    by_conn: BTreeMap<ConnId, u64>,
    next_session: u64,
    statements: Vec<Sent>,
    grants: Vec<Grant>,
    /// The job logs, stamped with cancellations as time moves.
    logs: Vec<JobLog>,
}

impl State {
    fn new(seed: u64, base: Instant) -> State {
        State {
            base,
            now: Duration::ZERO,
            pg: Postgres::new(ServerConfig::default()),
            rng: seed ^ 0x5eed,
            latency: DEFAULT_LATENCY,
            refusing_until: Duration::ZERO,
            links: Vec::new(),
            events: BTreeMap::new(),
            seq: 0,
            sessions: BTreeMap::new(),
            by_conn: BTreeMap::new(),
            next_session: 0,
            statements: Vec::new(),
            grants: Vec::new(),
            logs: Vec::new(),
        }
    }

    fn index_of(&self, inner: &Arc<Inner>) -> Option<usize> {
        (self.links.iter()).position(|l| std::ptr::eq(l.inner.as_ptr(), Arc::as_ptr(inner)))
    }

    /// Wakes every session and driver: something from outside (a fault)
    /// changed what happens next, so every pump re-arms.
    fn poke(&mut self) {
        for (_, sess) in self.sessions.values_mut() {
            for w in sess.wakers.drain(..) {
                w.wake();
            }
        }
        for link in &self.links {
            if let Some(w) = &link.driver {
                w.wake_by_ref();
            }
        }
    }

    fn schedule(&mut self, at: Duration, heal: Heal) {
        self.seq += 1;
        self.events.insert((at, self.seq), Event::Heal(heal));
    }

    /// When the next message arrives, heal happens or server deadline falls.
    fn next_event(&mut self) -> Option<Duration> {
        let wire = self.events.keys().next().map(|(t, _)| *t);
        match (wire, self.pg.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Processes everything due by `now`, in time order.
    fn advance(&mut self, now: Instant) {
        let now = now.saturating_duration_since(self.base).max(self.now);
        loop {
            let wire = self.events.keys().next().map(|(t, _)| *t);
            let server = self.pg.poll_timeout();
            match (wire, server) {
                (_, Some(t)) if t <= now && wire.is_none_or(|w| t <= w) => {
                    self.now = t;
                    self.pg.handle_timeout(t);
                    self.drain_pg();
                }
                (Some(t), _) if t <= now => {
                    self.now = t;
                    let Some((_, event)) = self.events.pop_first() else {
                        break;
                    };
                    match event {
                        Event::Wire(w) => self.arrive(t, w),
                        Event::Heal(h) => self.heal(t, h),
                    }
                }
                _ => break,
            }
        }
        self.now = now;
        for log in &self.logs {
            log.note(now);
        }
    }

    /// Sends `wire` on its locker's link at `from`.
    fn send(&mut self, from: Duration, wire: Wire) {
        let (i, up) = match &wire {
            Wire::Up(i, ..) => (*i, true),
            Wire::Down(i, ..) => (*i, false),
        };
        if self.links[i].blocked(from) {
            self.links[i].held.push(wire);
            return;
        }
        let jitter = Duration::from_nanos(rand(&mut self.rng) % 200_000);
        let latency = self.latency + jitter;
        let link = &mut self.links[i];
        let last = if up {
            &mut link.last_up
        } else {
            &mut link.last_down
        };
        let at = (from + latency).max(*last);
        *last = at;
        self.seq += 1;
        self.events.insert((at, self.seq), Event::Wire(wire));
    }

    fn heal(&mut self, now: Duration, heal: Heal) {
        let i = match heal {
            Heal::Partition(i) => {
                let link = &mut self.links[i];
                link.partitions = link.partitions.saturating_sub(1);
                i
            }
            Heal::Freeze(i) => i,
        };
        if self.links[i].blocked(now) {
            return;
        }
        for wire in std::mem::take(&mut self.links[i].held) {
            self.send(now, wire);
        }
    }

    /// A message arrives at its end.
    fn arrive(&mut self, now: Duration, wire: Wire) {
        match wire {
            Wire::Up(i, id, up) => {
                let conn = self.sessions.get(&id).and_then(|(_, s)| s.conn);
                match up {
                    Up::Connect(settings) => {
                        let settings: Vec<(&str, &str)> = (settings.iter())
                            .map(|(n, v)| (n.as_str(), v.as_str()))
                            .collect();
                        let attempt = if now < self.refusing_until {
                            Err(SessionError {
                                code: Some("53300".into()),
                                message: "sorry, too many clients already".into(),
                                config: false,
                            })
                        } else {
                            self.pg.connect(now, i, &settings)
                        };
                        let down = match attempt {
                            Ok(conn) => {
                                self.by_conn.insert(conn, id);
                                if let Some((_, s)) = self.sessions.get_mut(&id) {
                                    s.conn = Some(conn);
                                }
                                Down::Connected
                            }
                            Err(e) => Down::Failed(e),
                        };
                        self.send(now, Wire::Down(i, id, down));
                    }
                    Up::Query(query, statement) => {
                        if let Some(conn) = conn {
                            self.pg.query(now, conn, query, &statement);
                        }
                    }
                    Up::Close => {
                        if let Some(conn) = conn {
                            self.pg.close(now, conn);
                        }
                        self.sessions.remove(&id);
                    }
                }
                self.drain_pg();
            }
            Wire::Down(_, id, down) => {
                let Some((_, s)) = self.sessions.get_mut(&id) else {
                    return;
                };
                if s.gone {
                    return;
                }
                match down {
                    Down::Connected => s.opened = Some(Ok(())),
                    Down::Failed(e) => s.opened = Some(Err(e)),
                    Down::Reply(query, result) => {
                        s.replies.insert(query, result);
                    }
                    Down::Notify(payload, sender_pid) => {
                        s.events.push_back(SessionEvent::Notification {
                            channel: HANDOVER_CHANNEL.to_string(),
                            payload,
                            sender_pid,
                        });
                    }
                    Down::Ended(e) => s.events.push_back(SessionEvent::Ended(Some(e))),
                }
                for w in s.wakers.drain(..) {
                    w.wake();
                }
            }
        }
    }

    /// Sends what the server sent, each when it leaves the server.
    fn drain_pg(&mut self) {
        while let Some(out) = self.pg.poll_output() {
            let (conn, at, down) = match out {
                ServerOutput::Reply {
                    conn,
                    query,
                    at,
                    result,
                } => (conn, at, Down::Reply(query, result)),
                ServerOutput::Notify {
                    conn,
                    at,
                    payload,
                    sender_pid,
                } => (conn, at, Down::Notify(payload, sender_pid)),
                ServerOutput::Ended { conn, at, error } => (conn, at, Down::Ended(error)),
                ServerOutput::Granted {
                    conn,
                    at,
                    key,
                    token,
                } => {
                    if let Some(&(locker, _)) =
                        (self.by_conn.get(&conn)).and_then(|id| self.sessions.get(id))
                    {
                        self.grants.push(Grant {
                            locker,
                            key,
                            token,
                            at,
                        });
                    }
                    continue;
                }
            };
            let Some(&id) = self.by_conn.get(&conn) else {
                continue;
            };
            let Some(&(i, _)) = self.sessions.get(&id) else {
                continue;
            };
            self.send(at, Wire::Down(i, id, down));
        }
    }
}

// ---- the runtime, the session, the driver --------------------------------

/// The runtime of a kit's locker: the adapter's clock, its timer (held while
/// the locker is frozen) and sessions on the simulated server.
pub struct SimRuntime<R> {
    inner: Arc<R>,
    state: Arc<Mutex<State>>,
    locker: usize,
}

impl<R: Runtime> fmt::Debug for SimRuntime<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimRuntime")
            .field("runtime", &self.inner)
            .field("locker", &self.locker)
            .finish()
    }
}

impl<R: Runtime> Runtime for SimRuntime<R> {
    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn timer(&self, at: Instant) -> Pin<Box<dyn Timer>> {
        Box::pin(FrozenTimer {
            timer: self.inner.timer(at),
            at,
            armed: at,
            runtime: self.inner.clone(),
            state: self.state.clone(),
            locker: self.locker,
        })
    }

    fn connect(&self, config: Config) -> BoxFuture<Connected> {
        let settings = parse_options(config.get_options().unwrap_or_default());
        let mut s = lock(&self.state);
        s.advance(self.inner.now());
        s.next_session += 1;
        let id = s.next_session;
        s.sessions.insert(id, (self.locker, Sess::default()));
        let now = s.now;
        s.send(now, Wire::Up(self.locker, id, Up::Connect(settings)));
        drop(s);
        Box::pin(Connecting {
            pump: Pump::new(self.inner.clone(), self.state.clone()),
            locker: self.locker,
            id: Some(id),
        })
    }
}

/// `-c name=value ...` (the machine's startup settings) as pairs.
fn parse_options(options: &str) -> Vec<(String, String)> {
    let mut words = options.split_whitespace();
    let mut settings = Vec::new();
    while let Some(word) = words.next() {
        let pair = match word.strip_prefix("-c") {
            Some("") => words.next(),
            Some(rest) => Some(rest),
            None => None,
        };
        if let Some((name, value)) = pair.and_then(|p| p.split_once('=')) {
            settings.push((name.to_string(), value.to_string()));
        }
    }
    settings
}

/// Brings the kit up to the runtime's now and keeps a timer armed at its
/// next event, so that whoever polls it wakes when something happens.
struct Pump<R: Runtime> {
    runtime: Arc<R>,
    state: Arc<Mutex<State>>,
    timer: Option<(Pin<Box<dyn Timer>>, Instant)>,
}

impl<R: Runtime> Pump<R> {
    fn new(runtime: Arc<R>, state: Arc<Mutex<State>>) -> Self {
        Pump {
            runtime,
            state,
            timer: None,
        }
    }

    /// Advances the kit, arms the timer; then `f` on the state.
    fn poll<T>(&mut self, cx: &mut Context<'_>, f: impl FnOnce(&mut State, &Waker) -> T) -> T {
        loop {
            let next = {
                let mut s = lock(&self.state);
                s.advance(self.runtime.now());
                let next = s.next_event().map(|t| s.base + t);
                match next {
                    None => return f(&mut s, cx.waker()),
                    Some(at) => at,
                }
            };
            let runtime = &self.runtime;
            let (timer, armed) = self
                .timer
                .get_or_insert_with(|| (runtime.timer(next), next));
            if *armed != next {
                timer.as_mut().reset(next);
                *armed = next;
            }
            if timer.as_mut().poll(cx).is_pending() {
                let mut s = lock(&self.state);
                s.advance(self.runtime.now());
                return f(&mut s, cx.waker());
            }
        }
    }
}

/// A connection attempt in flight.
struct Connecting<R: Runtime> {
    pump: Pump<R>,
    locker: usize,
    /// `None` once it resolved.
    id: Option<u64>,
}

impl<R: Runtime> Future for Connecting<R> {
    type Output = Connected;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Connected> {
        let this = self.get_mut();
        let Some(id) = this.id else {
            return Poll::Pending;
        };
        let opened = this.pump.poll(cx, |s, waker| {
            let (_, sess) = s.sessions.get_mut(&id)?;
            let opened = sess.opened.take();
            if opened.is_none() {
                sess.wait(waker);
            }
            opened
        });
        let Some(opened) = opened else {
            return Poll::Pending;
        };
        this.id = None;
        Poll::Ready(match opened {
            Ok(()) => Ok(Box::new(SimSession {
                pump: Pump::new(this.pump.runtime.clone(), this.pump.state.clone()),
                locker: this.locker,
                id,
            })),
            Err(e) => {
                lock(&this.pump.state).sessions.remove(&id);
                Err(e)
            }
        })
    }
}

impl<R: Runtime> Drop for Connecting<R> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            close(&self.pump, self.locker, id);
        }
    }
}

/// The client closes session `id` (or its kernel does): the close goes on
/// the wire now; nothing more reaches the client. The other sessions are
/// woken to arm their timers at its arrival: the closing side may have no
/// timer left (a crashed locker), and nothing else would move the kit's time
/// there.
fn close<R: Runtime>(pump: &Pump<R>, locker: usize, id: u64) {
    let mut s = lock(&pump.state);
    s.advance(pump.runtime.now());
    let Some((_, sess)) = s.sessions.get_mut(&id) else {
        return;
    };
    sess.gone = true;
    let now = s.now;
    s.send(now, Wire::Up(locker, id, Up::Close));
    s.poke();
}

/// The simulated server's wall clock at its time zero (a schedule's due times
/// are on it): 2026-01-01T00:00:00Z, as a time since the Unix epoch.
pub const SIM_EPOCH: Duration = Duration::from_secs(1_767_225_600);

/// A session on the simulated server.
struct SimSession<R: Runtime> {
    pump: Pump<R>,
    locker: usize,
    id: u64,
}

impl<R: Runtime> Session for SimSession<R> {
    fn query(&self, statement: &Statement) -> BoxFuture<Result<Vec<Row>, SessionError>> {
        let mut s = lock(&self.pump.state);
        s.advance(self.pump.runtime.now());
        let now = s.now;
        let query = match s.sessions.get_mut(&self.id) {
            Some((_, sess)) => {
                sess.next_query += 1;
                QueryId(sess.next_query)
            }
            None => QueryId(0),
        };
        s.statements.push(Sent {
            locker: self.locker,
            at: now,
            statement: statement.clone(),
        });
        let up = Up::Query(query, statement.clone());
        s.send(now, Wire::Up(self.locker, self.id, up));
        drop(s);
        let mut pump = Pump::new(self.pump.runtime.clone(), self.pump.state.clone());
        let id = self.id;
        Box::pin(std::future::poll_fn(move |cx| {
            pump.poll(cx, |s, waker| {
                let Some((_, sess)) = s.sessions.get_mut(&id) else {
                    return Poll::Pending;
                };
                match sess.replies.remove(&query) {
                    Some(result) => Poll::Ready(result),
                    None => {
                        sess.wait(waker);
                        Poll::Pending
                    }
                }
            })
        }))
    }

    fn read_only(&self) -> BoxFuture<Result<bool, SessionError>> {
        Box::pin(async { Ok(false) })
    }

    fn in_recovery(&self) -> BoxFuture<Result<bool, SessionError>> {
        Box::pin(async { Ok(false) })
    }

    /// The server's clock: [`SIM_EPOCH`] plus its time, answered at once.
    fn server_time_micros(&self) -> BoxFuture<Result<i64, SessionError>> {
        let mut s = lock(&self.pump.state);
        s.advance(self.pump.runtime.now());
        let micros = SIM_EPOCH.as_micros() + s.now.as_micros();
        Box::pin(async move { Ok(i64::try_from(micros).unwrap_or(i64::MAX)) })
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<SessionEvent> {
        let id = self.id;
        self.pump.poll(cx, |s, waker| {
            let Some((_, sess)) = s.sessions.get_mut(&id) else {
                return Poll::Ready(SessionEvent::Ended(None));
            };
            match sess.events.pop_front() {
                Some(event) => Poll::Ready(event),
                None => {
                    sess.wait(waker);
                    Poll::Pending
                }
            }
        })
    }
}

impl<R: Runtime> Drop for SimSession<R> {
    fn drop(&mut self) {
        close(&self.pump, self.locker, self.id);
    }
}

/// The runtime's timer, held while its locker is frozen.
struct FrozenTimer<R> {
    timer: Pin<Box<dyn Timer>>,
    at: Instant,
    armed: Instant,
    runtime: Arc<R>,
    state: Arc<Mutex<State>>,
    locker: usize,
}

impl<R: Runtime> fmt::Debug for FrozenTimer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrozenTimer").field("at", &self.at).finish()
    }
}

impl<R: Runtime> Timer for FrozenTimer<R> {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.at = at;
        self.armed = at;
        self.timer.as_mut().reset(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let thaw = {
            let mut s = lock(&self.state);
            s.advance(self.runtime.now());
            let until = s.links[self.locker].frozen_until;
            (until > s.now).then(|| s.base + until)
        };
        let due = match thaw {
            Some(thaw) => thaw.max(self.at),
            None => self.at,
        };
        if due != self.armed {
            self.armed = due;
            self.timer.as_mut().reset(due);
        }
        self.timer.as_mut().poll(cx)
    }
}

/// The driver of a kit's locker: the real [`Driver`], which the kit stops
/// when the locker crashes ([`TestServer::crash`]). Run it as the real one
/// (spawn it).
#[must_use = "the driver does nothing unless polled: spawn it"]
pub struct SimDriver<R: Runtime> {
    driver: Option<Driver<SimRuntime<R>>>,
    state: Arc<Mutex<State>>,
    locker: usize,
}

impl<R: Runtime> fmt::Debug for SimDriver<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDriver")
            .field("locker", &self.locker)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> Future for SimDriver<R> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut s = lock(&self.state);
            let link = &mut s.links[self.locker];
            if !link.crashed {
                link.driver = Some(cx.waker().clone());
            }
            if link.crashed {
                drop(s);
                // The process is gone: its driver with it, its session closed.
                self.driver = None;
                return Poll::Ready(());
            }
        }
        match &mut self.driver {
            Some(driver) => Pin::new(driver).poll(cx),
            None => Poll::Ready(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_options_parse_as_the_machine_writes_them() {
        let got = parse_options("-c search_path=pg_catalog -c idle_session_timeout=900");
        let want = [
            ("search_path", "pg_catalog"),
            ("idle_session_timeout", "900"),
        ];
        let want: Vec<(String, String)> = (want.iter())
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
    }
}
