//! The simulated PostgreSQL server on its own, sans-IO: the same model the
//! [`Sim`](super::Sim) runs (its `server` module: sessions, re-entrant
//! advisory locks, `pg_locks`, the idle-session guard, terminate, restart,
//! `LISTEN/NOTIFY`, lock waits with their `lock_timeout`, promotion), driven
//! by whoever holds it: inputs carry `now`, outputs are polled, and
//! [`Postgres::poll_timeout`] says when to call [`Postgres::handle_timeout`].
//!
//! The [`Sim`](super::Sim) drives the model through its event queue, with
//! its network, statement faults and checks; this core drives the same
//! model with a timer queue of its own and no network: a caller (a test kit
//! that runs real drivers against it) adds latency, partitions and freezes
//! on its side of the wire.

use std::collections::VecDeque;
use std::time::Duration;

use super::inject::Injected;
use super::net::Queue;
use super::server::{Server, Waiter, Woken};
use super::ServerConfig;
use crate::{reply::Row, QueryId, SessionError, Statement};

/// A connection to the simulated server (one backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// What the server sends, in order; each leaves the server at `at` (a reply
/// leaves when its statement is done, later than `now` under
/// [`Postgres::set_slow`] or behind a lock wait).
#[derive(Debug, Clone, PartialEq)]
pub enum ServerOutput {
    /// A statement's reply.
    Reply {
        /// The session.
        conn: ConnId,
        /// The statement's id, as given to [`Postgres::query`].
        query: QueryId,
        /// When it leaves the server.
        at: Duration,
        /// Its rows, or the error.
        result: Result<Vec<Row>, SessionError>,
    },
    /// A `NOTIFY` on the handover channel for a listening session.
    Notify {
        /// The listening session.
        conn: ConnId,
        /// When it leaves the server.
        at: Duration,
        /// The payload (the key).
        payload: String,
        /// The sender's backend pid.
        sender_pid: i64,
    },
    /// The server ended the session (terminate, the idle guard, a restart):
    /// the client reads this error, then the end of the connection.
    Ended {
        /// The session.
        conn: ConnId,
        /// When it leaves the server.
        at: Duration,
        /// What the client reads.
        error: SessionError,
    },
    /// A try won `key` with this fencing token (for inspection; nothing is
    /// sent).
    Granted {
        /// The session.
        conn: ConnId,
        /// When.
        at: Duration,
        /// The advisory key.
        key: i64,
        /// The fencing token.
        token: i64,
    },
}

/// The server's own deadlines.
#[derive(Debug, Clone)]
enum Deadline {
    Idle(u64),
    LockTimeout(u64, QueryId),
    Up,
}

/// The simulated PostgreSQL server as a sans-IO core. See the module docs.
///
/// ```
/// use std::time::Duration;
/// use lease_proto::sim::{Postgres, ServerConfig, ServerOutput};
/// use lease_proto::{QueryId, Statement};
///
/// let mut pg = Postgres::new(ServerConfig::default());
/// let conn = pg.connect(Duration::ZERO, 0, &[]).unwrap();
/// pg.query(Duration::ZERO, conn, QueryId(1), &Statement::Heartbeat);
/// assert!(matches!(pg.poll_output(), Some(ServerOutput::Reply { result: Ok(_), .. })));
/// ```
#[derive(Debug)]
pub struct Postgres {
    server: Server,
    timers: Queue<Deadline>,
    outputs: VecDeque<ServerOutput>,
    next_conn: u64,
    statements: u64,
}

/// The settings a lease session sends at startup, by name (the model keys
/// them by static names).
const KNOWN_SETTINGS: [&str; 6] = [
    "search_path",
    "idle_session_timeout",
    crate::sql::TCP_SETTINGS[0],
    crate::sql::TCP_SETTINGS[1],
    crate::sql::TCP_SETTINGS[2],
    crate::sql::TCP_SETTINGS[3],
];

impl Postgres {
    /// A server that is up, with no session.
    pub fn new(config: ServerConfig) -> Postgres {
        Postgres {
            server: Server::new(config),
            timers: Queue::new(),
            outputs: VecDeque::new(),
            next_conn: 0,
            statements: 0,
        }
    }

    /// A connection attempt from client `client` (any number the caller
    /// uses to tell its clients apart) with the startup settings
    /// (`-c name=value` of the `options` startup parameter): the session,
    /// or the error the client reads (the server is down, or a setting it
    /// does not know).
    ///
    /// # Errors
    /// The [`SessionError`] the client reads.
    pub fn connect(
        &mut self,
        now: Duration,
        client: usize,
        settings: &[(&str, &str)],
    ) -> Result<ConnId, SessionError> {
        let mut known = Vec::with_capacity(settings.len());
        for (name, value) in settings {
            let Some(name) = KNOWN_SETTINGS.iter().find(|k| *k == name) else {
                return Err(SessionError {
                    code: Some("42704".into()),
                    message: format!("unrecognized configuration parameter \"{name}\""),
                    config: false,
                });
            };
            known.push((*name, (*value).to_string()));
        }
        self.next_conn += 1;
        let conn = self.next_conn;
        self.server.connect(conn, client, &known, now)?;
        self.arm_idle(conn);
        Ok(ConnId(conn))
    }

    /// A statement arrives on `conn`; its reply (now, when done, or when its
    /// lock wait ends) comes out as [`ServerOutput::Reply`]. Nothing comes
    /// out for a session the server has ended.
    pub fn query(&mut self, now: Duration, conn: ConnId, query: QueryId, statement: &Statement) {
        let ConnId(c) = conn;
        let Some(p) = self.server.process_of(c) else {
            return;
        };
        let Some(executed) = self.server.execute(c, now, statement) else {
            return;
        };
        self.statements += 1;
        for (key, token) in executed.granted {
            let at = now;
            self.outputs.push_back(ServerOutput::Granted {
                conn,
                at,
                key,
                token,
            });
        }
        let done = executed.done;
        if let Some((key, timeout)) = executed.blocks {
            let waiter = Waiter {
                conn: c,
                p,
                query,
                key,
                take: matches!(statement, Statement::Take { .. }),
                injected: Injected::Nothing,
                since: done,
                watch_of: match statement {
                    Statement::Wait { watch_of, .. } => *watch_of,
                    _ => None,
                },
            };
            self.server.block(waiter, done + timeout);
            self.timers
                .push(done + timeout, Deadline::LockTimeout(c, query));
            self.arm_idle(c);
            return;
        }
        self.arm_idle(c);
        let result = executed.result;
        self.outputs.push_back(ServerOutput::Reply {
            conn,
            query,
            at: done,
            result,
        });
        // Sent at commit; a listening sender reads its own after its reply
        // (PostgreSQL sends them before its next ReadyForQuery).
        let sender = self.server.pid_of(c).unwrap_or_default();
        let delay = self.server.config().notify_delay;
        for payload in executed.notify {
            self.notify(now + delay, payload, sender);
        }
        self.wake_waiters(now);
    }

    /// The client closed `conn` (or its kernel did): the session and its
    /// locks are gone; nothing is sent.
    pub fn close(&mut self, now: Duration, conn: ConnId) {
        self.server.end(conn.0);
        self.wake_waiters(now);
    }

    /// `pg_terminate_backend` of every session of `client` (see
    /// [`Postgres::connect`]): each ends with 57P01.
    pub fn terminate(&mut self, now: Duration, client: usize) {
        let conns = self.server.sessions_of(Some(client));
        let message = "terminating connection due to administrator command";
        self.end_all(now, &conns, "57P01", message);
    }

    /// A restart: every session ends (57P01, as PostgreSQL's shutdown
    /// terminates them); connection attempts are refused until `now +
    /// downtime`.
    pub fn restart(&mut self, now: Duration, downtime: Duration) {
        let conns = self.server.sessions_of(None);
        let message = "terminating connection due to administrator command";
        self.end_all(now, &conns, "57P01", message);
        self.server.restart(now);
        self.timers.push(now + downtime, Deadline::Up);
    }

    /// The server's clock steps back by `by` now (an operator or NTP
    /// stepping it, a host whose clock is behind): every later reading, the
    /// fencing tokens and the clock the setup and the heartbeat answer, is
    /// that much lower ([`ServerConfig::clock_step_back`] steps it at every
    /// crash and promotion instead).
    pub fn step_clock_back(&mut self, by: Duration) {
        self.server.step_clock_back(by);
    }

    /// Adds `extra` to every statement's processing time (a slow server;
    /// `Duration::ZERO`: as fast as the model).
    pub fn set_slow(&mut self, extra: Duration) {
        self.server.slow = extra;
    }

    /// When [`Postgres::handle_timeout`] must be called next.
    pub fn poll_timeout(&mut self) -> Option<Duration> {
        self.timers.next_at()
    }

    /// Runs every deadline due at `now`: the idle guard ends sessions silent
    /// past their `idle_session_timeout` (57P05), lock waits time out, a
    /// restarted server comes back up.
    pub fn handle_timeout(&mut self, now: Duration) {
        while let Some((_, deadline)) = self.timers.pop_until(now) {
            match deadline {
                Deadline::Idle(c) => {
                    if self.server.idle_expired(c, now) {
                        let m = "terminating connection due to idle-session timeout";
                        self.end(now, c, "57P05", m);
                    }
                }
                Deadline::LockTimeout(c, query) => {
                    let Some((w, Some(rows))) = self.server.timed_out(c, query) else {
                        continue;
                    };
                    self.server.unblocked(c, now);
                    self.arm_idle(c);
                    self.outputs.push_back(ServerOutput::Reply {
                        conn: ConnId(w.conn),
                        query,
                        at: now,
                        result: Ok(rows),
                    });
                    self.deliver_held_notifications(c, now);
                }
                Deadline::Up => self.server.up = true,
            }
        }
    }

    /// The next output, in the order the server sent them.
    pub fn poll_output(&mut self) -> Option<ServerOutput> {
        self.outputs.pop_front()
    }

    /// Every advisory key held now, with the session that holds it.
    pub fn holders(&self) -> Vec<(i64, ConnId)> {
        (self.server.lock_owners().into_iter())
            .filter_map(|(k, c)| Some((k, ConnId(c?))))
            .collect()
    }

    /// Every lease-group member lock held now (see [`Statement::Members`]):
    /// the group, with the session that holds it.
    pub fn members(&self) -> Vec<(u32, ConnId)> {
        (self.server.member_locks().into_iter())
            .filter_map(|(g, c)| Some((g, ConnId(c?))))
            .collect()
    }

    /// The client a session belongs to (see [`Postgres::connect`]), while it
    /// lives.
    pub fn client_of(&self, conn: ConnId) -> Option<usize> {
        self.server.process_of(conn.0)
    }

    /// The backend pid of a session, while it lives.
    pub fn backend_pid(&self, conn: ConnId) -> Option<i64> {
        self.server.pid_of(conn.0)
    }

    /// Statements run so far.
    pub fn statements(&self) -> u64 {
        self.statements
    }

    fn arm_idle(&mut self, conn: u64) {
        if let Some(at) = self.server.idle_deadline(conn) {
            self.timers.push(at, Deadline::Idle(conn));
        }
    }

    fn notify(&mut self, at: Duration, payload: String, sender_pid: i64) {
        for (c, _) in self.server.listeners() {
            // A session blocked in a wait gets it after its reply (see
            // `Server::hold_notification`).
            if self.server.hold_notification(c, &payload, sender_pid) {
                continue;
            }
            self.outputs.push_back(ServerOutput::Notify {
                conn: ConnId(c),
                at,
                payload: payload.clone(),
                sender_pid,
            });
        }
    }

    fn wake_waiters(&mut self, now: Duration) {
        for woken in self.server.woken(now) {
            let Woken {
                waiter: w,
                rows,
                runs_at,
                granted,
            } = woken;
            if let Some((key, token)) = granted {
                self.outputs.push_back(ServerOutput::Granted {
                    conn: ConnId(w.conn),
                    at: now,
                    key,
                    token,
                });
            }
            let done = runs_at + self.server.slow;
            self.server.unblocked(w.conn, done);
            self.arm_idle(w.conn);
            self.outputs.push_back(ServerOutput::Reply {
                conn: ConnId(w.conn),
                query: w.query,
                at: done,
                result: Ok(rows),
            });
            self.deliver_held_notifications(w.conn, done);
        }
    }

    /// The notifications held while `conn` waited, after its reply at `at`.
    fn deliver_held_notifications(&mut self, conn: u64, at: Duration) {
        for (payload, sender_pid) in self.server.take_held_notifications(conn) {
            self.outputs.push_back(ServerOutput::Notify {
                conn: ConnId(conn),
                at,
                payload,
                sender_pid,
            });
        }
    }

    fn end(&mut self, now: Duration, conn: u64, code: &str, message: &str) {
        self.end_all(now, &[conn], code, message);
    }

    /// Ends sessions at once: a wait of one that another's end would wake
    /// is not answered (PostgreSQL signals every backend it shuts down or
    /// terminates together, and a backend granted a lock with the signal
    /// pending ends before it answers).
    fn end_all(&mut self, now: Duration, conns: &[u64], code: &str, message: &str) {
        let ended: Vec<u64> = (conns.iter().copied())
            .filter(|c| self.server.end(*c).is_some())
            .collect();
        self.wake_waiters(now);
        for conn in ended {
            let error = SessionError {
                code: Some(code.into()),
                message: message.into(),
                config: false,
            };
            self.outputs.push_back(ServerOutput::Ended {
                conn: ConnId(conn),
                at: now,
                error,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn setup(pg: &mut Postgres, now: Duration, conn: ConnId, nonce: i64) -> i64 {
        let setup = Statement::Setup {
            nonce,
            settings: vec![],
        };
        pg.query(now, conn, QueryId(1), &setup);
        let Some(ServerOutput::Reply {
            result: Ok(rows), ..
        }) = pg.poll_output()
        else {
            panic!("a setup reply");
        };
        let reply = crate::reply::SetupReply::parse(&rows).expect("a setup reply");
        reply.backend_pid
    }

    #[test]
    fn the_idle_guard_ends_a_silent_session_and_frees_its_keys() {
        let mut pg = Postgres::new(ServerConfig::default());
        let conn = pg.connect(Duration::ZERO, 0, &[("idle_session_timeout", "900")]);
        let conn = conn.expect("up");
        let pid = setup(&mut pg, Duration::ZERO, conn, 5);
        let try_lock = Statement::TryLock {
            keys: vec![42],
            backend_pid: pid,
            nonce: 5,
        };
        pg.query(MS, conn, QueryId(2), &try_lock);
        assert!(matches!(
            pg.poll_output(),
            Some(ServerOutput::Granted { key: 42, .. })
        ));
        assert!(matches!(pg.poll_output(), Some(ServerOutput::Reply { .. })));
        assert_eq!(pg.holders(), [(42, conn)]);
        // The check armed at the setup finds the session heard since.
        pg.handle_timeout(900 * MS);
        assert_eq!(pg.poll_output(), None);
        assert_eq!(pg.poll_timeout(), Some(901 * MS));
        pg.handle_timeout(901 * MS);
        match pg.poll_output() {
            Some(ServerOutput::Ended { error, .. }) => {
                assert_eq!(error.code.as_deref(), Some("57P05"))
            }
            other => panic!("{other:?}"),
        }
        assert!(pg.holders().is_empty());
    }

    #[test]
    fn unknown_settings_and_a_restarting_server_refuse_connections() {
        let mut pg = Postgres::new(ServerConfig::default());
        let e = pg
            .connect(Duration::ZERO, 0, &[("no_such", "1")])
            .unwrap_err();
        assert_eq!(e.code.as_deref(), Some("42704"));
        let conn = pg.connect(Duration::ZERO, 0, &[]).expect("up");
        pg.restart(MS, Duration::from_secs(1));
        assert!(matches!(pg.poll_output(), Some(ServerOutput::Ended { conn: c, .. }) if c == conn));
        assert!(pg.connect(2 * MS, 0, &[]).is_err());
        pg.handle_timeout(Duration::from_secs(2));
        assert!(pg.connect(Duration::from_secs(2), 0, &[]).is_ok());
    }
}
