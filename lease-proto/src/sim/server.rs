//! The PostgreSQL model: sessions, re-entrant advisory locks (one database),
//! `pg_locks`, `idle_session_timeout` (asked for by the session, or imposed
//! by the server on silent sessions), `pg_terminate_backend`, restarts,
//! `LISTEN/NOTIFY`, hot-standby mode and a transaction pooler that moves
//! statements between backends and drops (or rejects) startup options.
//!
//! The rows of every reply are built in one place, [`reply`], also used by
//! the [`Harness`](super::Harness).

use std::collections::BTreeMap;
use std::time::Duration;

use super::net::{Direction, ToClient, ToServer};
use super::{Ev, ServerConfig, Sim, TraceEvent};
use crate::{DbError, Row, Statement};

/// The rows the server answers each statement with (the wire shapes of
/// `sql.rs`), and the errors it sends.
pub(super) mod reply {
    use crate::{DbError, HeartbeatReply, ReleaseReply, Row, SetupReply, TryReply};

    /// `Setup`: version, recovery, backend pid, `idle_session_timeout` (ms).
    pub(crate) fn setup(version: i64, standby: bool, pid: i64, idle_ms: i64) -> Vec<Row> {
        SetupReply {
            server_version: version,
            in_recovery: standby,
            backend_pid: pid,
            idle_session_timeout_ms: Some(idle_ms),
        }
        .to_rows()
    }

    /// `TryLock`: a key won, with the fencing token.
    pub(crate) fn try_won(key: i64, token: i64) -> Row {
        let reply = TryReply {
            won: vec![(key, token)],
            not_won: vec![],
            untrusted: false,
        };
        reply.to_rows().remove(0)
    }

    /// `TryLock`: a key not won, with the holder's pid if known.
    pub(crate) fn try_held(key: i64, holder: Option<i64>) -> Row {
        let reply = TryReply {
            won: vec![],
            not_won: vec![(key, holder)],
            untrusted: false,
        };
        reply.to_rows().remove(0)
    }

    /// `Heartbeat`: the backend pid, then every key the session holds.
    pub(crate) fn heartbeat(pid: i64, keys: impl IntoIterator<Item = i64>) -> Vec<Row> {
        HeartbeatReply {
            backend_pid: Some(pid),
            held: keys.into_iter().collect(),
        }
        .to_rows()
    }

    /// `Release`: whether the session held the key.
    pub(crate) fn release(key: i64, held: bool) -> Row {
        ReleaseReply {
            unlocked: vec![(key, held)],
        }
        .to_rows()
        .remove(0)
    }

    /// `Listen` on a hot standby.
    pub(crate) fn listen_in_recovery() -> DbError {
        DbError {
            code: Some("25006".into()),
            message: "cannot execute LISTEN during recovery".into(),
        }
    }
}

/// A statement the server ran.
#[derive(Debug)]
struct Executed {
    /// When it is done (the reply leaves then).
    done: Duration,
    result: Result<Vec<Row>, DbError>,
    /// Keys whose release notifies listeners, in order.
    notify: Vec<i64>,
}

/// One server session (backend).
#[derive(Debug)]
pub(super) struct SrvSession {
    pub(super) p: usize,
    pub(super) pid: i64,
    idle_timeout: Option<Duration>,
    busy_until: Duration,
    listening: bool,
    statements: u64,
}

/// The server's state.
#[derive(Debug)]
pub(super) struct Server {
    cfg: ServerConfig,
    pub(super) up: bool,
    sessions: BTreeMap<u64, SrvSession>,
    /// key → (owner conn, re-entrancy count)
    locks: BTreeMap<i64, (u64, u32)>,
    next_pid: i64,
    next_xid: i64,
    /// Added processing time of every statement now.
    pub(super) slow: Duration,
}

impl Server {
    pub(super) fn new(cfg: ServerConfig) -> Server {
        Server {
            cfg,
            up: true,
            sessions: BTreeMap::new(),
            locks: BTreeMap::new(),
            next_pid: 1000,
            next_xid: 700,
            slow: Duration::ZERO,
        }
    }

    /// The advisory keys held now.
    pub(super) fn held_keys(&self) -> Vec<i64> {
        self.locks.keys().copied().collect()
    }

    /// Connections of `p`'s sessions (`None`: every session).
    pub(super) fn sessions_of(&self, p: Option<usize>) -> Vec<u64> {
        self.sessions
            .iter()
            .filter(|(_, s)| p.is_none_or(|p| s.p == p))
            .map(|(c, _)| *c)
            .collect()
    }

    /// The process of a session.
    pub(super) fn process_of(&self, conn: u64) -> Option<usize> {
        self.sessions.get(&conn).map(|s| s.p)
    }

    /// A connection attempt: the session, or the error the client gets.
    fn connect(
        &mut self,
        conn: u64,
        p: usize,
        settings: &[(&'static str, String)],
        now: Duration,
    ) -> Result<(), DbError> {
        let refuse = |code: &str, m: &str| DbError {
            code: Some(code.into()),
            message: m.into(),
        };
        if !self.up {
            return Err(refuse("08006", "connection refused"));
        }
        if self.cfg.pooler && self.cfg.pooler_rejects_options && !settings.is_empty() {
            return Err(refuse("08P01", "unsupported startup parameter: options"));
        }
        let idle_timeout = if self.cfg.pooler {
            None
        } else {
            settings
                .iter()
                .find(|(n, _)| *n == "idle_session_timeout")
                .and_then(|(_, v)| v.parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
        };
        self.next_pid += 1;
        self.sessions.insert(
            conn,
            SrvSession {
                p,
                pid: self.next_pid,
                idle_timeout,
                busy_until: now,
                listening: false,
                statements: 0,
            },
        );
        Ok(())
    }

    /// When the session is ended as idle if nothing else happens: the
    /// session's own timeout or the server's silent-session kill, whichever
    /// is shorter.
    fn idle_deadline(&self, conn: u64) -> Option<Duration> {
        let s = self.sessions.get(&conn)?;
        let limit = match (s.idle_timeout, self.cfg.silent_session_kill) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(s.busy_until + limit)
    }

    /// Runs one statement on `conn`.
    fn execute(&mut self, conn: u64, now: Duration, statement: &Statement) -> Option<Executed> {
        let s = self.sessions.get_mut(&conn)?;
        s.statements += 1;
        let stmt_no = s.statements;
        let done = now.max(s.busy_until) + self.slow;
        s.busy_until = done;
        let pid = if self.cfg.pooler {
            s.pid + (stmt_no % 2) as i64 * 7919
        } else {
            s.pid
        };
        let mut notify = Vec::new();
        let rows = match statement {
            Statement::Setup => {
                let ist = s.idle_timeout.map_or(0, |d| d.as_millis() as i64);
                reply::setup(self.cfg.version, self.cfg.standby, pid, ist)
            }
            Statement::Listen => {
                if self.cfg.standby {
                    let result = Err(reply::listen_in_recovery());
                    return Some(Executed {
                        done,
                        result,
                        notify,
                    });
                }
                s.listening = true;
                vec![]
            }
            Statement::TryLock { keys } => {
                let mut won = Vec::new();
                let mut lost = Vec::new();
                for &k in keys {
                    match self.locks.get_mut(&k) {
                        None => {
                            self.locks.insert(k, (conn, 1));
                            won.push(k);
                        }
                        Some((owner, count)) if *owner == conn => {
                            *count += 1;
                            won.push(k);
                        }
                        Some((owner, _)) => lost.push((k, *owner)),
                    }
                }
                if !won.is_empty() {
                    self.next_xid += 1;
                }
                let xid = self.next_xid;
                let mut rows: Vec<Row> = won.into_iter().map(|k| reply::try_won(k, xid)).collect();
                for (k, owner) in lost {
                    let holder = self.sessions.get(&owner).map(|s| s.pid);
                    rows.push(reply::try_held(k, holder));
                }
                rows
            }
            Statement::Heartbeat => {
                let held = self
                    .locks
                    .iter()
                    .filter(|(_, (owner, _))| *owner == conn)
                    .map(|(k, _)| *k);
                reply::heartbeat(pid, held)
            }
            Statement::Release { keys, notify: n } => {
                let mut rows = Vec::new();
                for &k in keys {
                    let held = match self.locks.get_mut(&k) {
                        Some((o, count)) if *o == conn => {
                            *count -= 1;
                            if *count == 0 {
                                self.locks.remove(&k);
                            }
                            if *n {
                                notify.push(k);
                            }
                            true
                        }
                        _ => false,
                    };
                    rows.push(reply::release(k, held));
                }
                rows
            }
        };
        Some(Executed {
            done,
            result: Ok(rows),
            notify,
        })
    }

    /// Listening sessions and their processes.
    fn listeners(&self) -> Vec<(u64, usize)> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.listening)
            .map(|(c, s)| (*c, s.p))
            .collect()
    }

    /// A blocked write of a large reply completed at `now`: the backend is
    /// idle from then.
    pub(super) fn write_done(&mut self, conn: u64, now: Duration) {
        if let Some(s) = self.sessions.get_mut(&conn) {
            s.busy_until = s.busy_until.max(now);
        }
    }

    /// Ends a session: it and its locks are gone.
    fn end(&mut self, conn: u64) -> Option<SrvSession> {
        let s = self.sessions.remove(&conn)?;
        self.locks.retain(|_, (owner, _)| *owner != conn);
        Some(s)
    }
}

impl Sim {
    /// A message arrives at the server from process `p`.
    pub(super) fn at_server(&mut self, p: usize, msg: ToServer) {
        match msg {
            ToServer::Connect { conn, settings } => {
                match self.server.connect(conn, p, &settings, self.now) {
                    Err(error) => self.send(p, Ev::AtClient(p, ToClient::Failed { conn, error })),
                    Ok(()) => {
                        self.arm_idle(conn);
                        self.send(p, Ev::AtClient(p, ToClient::Connected { conn }));
                    }
                }
            }
            ToServer::Close { conn } => self.end_session_quietly(conn),
            ToServer::Query {
                conn,
                query,
                statement,
            } => {
                // Statement faults: see `inject`.
                let injected = self.inject(&statement);
                let ran = injected.ran(statement.clone());
                let Some(executed) = self.server.execute(conn, self.now, &ran) else {
                    return;
                };
                let Executed {
                    done,
                    result,
                    notify,
                } = executed;
                let (result, notify) = injected.reply(&statement, result, notify);
                self.report.statements[p] += 1;
                for key in notify {
                    for (conn, p) in self.server.listeners() {
                        let payload = key.to_string();
                        self.send(p, Ev::AtClient(p, ToClient::Notify { conn, payload }));
                    }
                }
                self.arm_idle(conn);
                let reply = ToClient::Reply {
                    conn,
                    query,
                    result,
                };
                // The reply leaves when the statement is done.
                let latency = self.link_latency(p);
                let ev = Ev::AtClient(p, reply);
                if let Some((at, ev)) = self.net.send(p, Direction::ToClient, done, latency, ev) {
                    self.queue.push(at, ev);
                }
            }
        }
    }

    /// Schedules the idle check of a session, if it can be ended as idle.
    pub(super) fn arm_idle(&mut self, conn: u64) {
        if let Some(at) = self.server.idle_deadline(conn) {
            self.queue.push(at, Ev::IdleCheck(conn));
        }
    }

    /// Sessions of `p` whose backend is blocked writing a reply too large
    /// for its socket buffer ([`ServerConfig::send_buffer_rows`]) to a
    /// partitioned link.
    pub(super) fn blocked_writes(&self, p: usize) -> Vec<u64> {
        let Some(limit) = self.server.cfg.send_buffer_rows else {
            return Vec::new();
        };
        if !self.net.partitioned(p) {
            return Vec::new();
        }
        let mut blocked: Vec<u64> = (self.net.held(p).iter())
            .filter_map(|ev| match ev {
                Ev::AtClient(
                    _,
                    ToClient::Reply {
                        conn,
                        result: Ok(rows),
                        ..
                    },
                ) if rows.len() > limit => Some(*conn),
                _ => None,
            })
            .collect();
        blocked.dedup();
        blocked
    }

    /// The idle check: ends the session if it has been silent long enough
    /// (a backend blocked in a write is not idle; see
    /// [`ServerConfig::send_buffer_rows`]).
    pub(super) fn idle_check(&mut self, conn: u64) {
        let blocked =
            (self.server.process_of(conn)).is_some_and(|p| self.blocked_writes(p).contains(&conn));
        if blocked {
            return;
        }
        if self
            .server
            .idle_deadline(conn)
            .is_some_and(|d| d <= self.now)
        {
            self.end_session(
                conn,
                "57P05",
                "terminating connection due to idle-session timeout",
            );
        }
    }

    fn end_session_quietly(&mut self, conn: u64) {
        if let Some(s) = self.server.end(conn) {
            self.trace(Some(s.p), TraceEvent::SessionEnded { pid: s.pid });
        }
    }

    /// Ends a session actively, telling its client.
    pub(super) fn end_session(&mut self, conn: u64, code: &str, message: &str) {
        if let Some(p) = self.server.process_of(conn) {
            self.end_session_quietly(conn);
            self.trace(
                Some(p),
                TraceEvent::SessionKilled {
                    code: code.into(),
                    message: message.into(),
                },
            );
            let error = DbError {
                code: Some(code.into()),
                message: message.into(),
            };
            self.send(p, Ev::AtClient(p, ToClient::Ended { conn, error }));
        }
    }

    /// `pg_terminate_backend` of every session of `p` (`None`: all).
    pub(super) fn terminate(&mut self, p: Option<usize>) {
        for c in self.server.sessions_of(p) {
            self.end_session(
                c,
                "57P01",
                "terminating connection due to administrator command",
            );
        }
    }
}
