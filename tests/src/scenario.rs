//! Building blocks of the failover scenarios (`tests/scenarios.rs`): `replica` processes
//! (the binary in `src/bin/replica.rs`) and their parsed output, leadership terms and their
//! overlap, and a blocking admin connection for precise timing.
//!
//! Every time here is `CLOCK_MONOTONIC` in nanoseconds ([`monotonic_nanos`]): the replicas
//! print their own readings, so the events of different processes share one timeline.

use crate::{io_err, monotonic_nanos, KitError, Replica, Stream};
use lease_proto::ServerWait;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// Which driver a replica runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// `lease-tokio`.
    Tokio,
    /// `lease-smol`.
    Smol,
}

impl Driver {
    /// `"tokio"` or `"smol"`, as `replica --driver` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Tokio => "tokio",
            Driver::Smol => "smol",
        }
    }
}

/// Milliseconds as a `Duration`.
pub const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Nanoseconds as milliseconds, for printing.
pub fn ms_f(nanos: i128) -> f64 {
    nanos as f64 / 1e6
}

/// `b - a` in nanoseconds, signed.
pub fn diff(a: u64, b: u64) -> i128 {
    i128::from(b) - i128::from(a)
}

/// `d` in nanoseconds, signed.
pub fn nanos(d: Duration) -> i128 {
    d.as_nanos() as i128
}

/// How to start one `replica` process.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// The driver.
    pub driver: Driver,
    /// Connection string (key-value or URL).
    pub url: String,
    /// Lease name (with `leases > 1`: the prefix of `NAME-0` ..).
    pub lease: String,
    /// How many leases the one locker runs.
    pub leases: usize,
    /// More leases the locker runs, started `also_after` after the others (`--also`).
    pub also: Vec<String>,
    /// When the `also` runs start.
    pub also_after: Duration,
    /// How a standby learns of a freed key ([`lease_proto::Options::server_wait`]):
    /// `--no-wait` for [`ServerWait::Off`], `--no-watch` for [`ServerWait::Idle`].
    pub server_wait: ServerWait,
    /// Standby poll interval.
    pub retry: Duration,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Query timeout.
    pub query_timeout: Duration,
    /// Server guard margin.
    pub guard_margin: Duration,
    /// Server guard on.
    pub guard: bool,
    /// Handover notifications on.
    pub notify: bool,
    /// [`lease_proto::Options::lock_delay`]; `None`: the default.
    pub lock_delay: Option<Duration>,
    /// `application_name`.
    pub app_name: Option<String>,
    /// The job returns after this long.
    pub job_exit_after: Option<Duration>,
    /// Tick period of the job (`ZERO`: no tick lines).
    pub tick: Duration,
    /// Status poll period, the source of the `pid` and `valid` lines (`ZERO`: no poller,
    /// no such lines: [`Node::wait_pid`] then never returns a pid).
    pub status_poll: Duration,
    /// TLS required and verified in full (chain and host name, libpq's `verify-full`)
    /// against the CA certificates in this PEM file; `None`: no TLS.
    pub tls_ca: Option<PathBuf>,
    /// The lease group every run takes part in (`--group`); `None`: none.
    pub group: Option<String>,
}

impl ReplicaConfig {
    /// Fast test settings: retry 200 ms, heartbeat 150 ms, query timeout 400 ms, guard
    /// margin 200 ms, a tick every 50 ms, the status polled every 20 ms.
    pub fn new(driver: Driver, url: impl Into<String>, lease: impl Into<String>) -> Self {
        ReplicaConfig {
            driver,
            url: url.into(),
            lease: lease.into(),
            leases: 1,
            also: Vec::new(),
            also_after: Duration::ZERO,
            server_wait: ServerWait::IdleAndWatch,
            retry: ms(200),
            heartbeat: ms(150),
            query_timeout: ms(400),
            guard_margin: ms(200),
            guard: true,
            notify: true,
            lock_delay: None,
            app_name: None,
            job_exit_after: None,
            tick: ms(50),
            status_poll: ms(20),
            tls_ca: None,
            group: None,
        }
    }

    /// The validity window: heartbeat + query timeout.
    pub fn validity(&self) -> Duration {
        self.heartbeat + self.query_timeout
    }

    /// The server guard (`idle_session_timeout`): validity + guard margin.
    pub fn guard_timeout(&self) -> Duration {
        self.validity() + self.guard_margin
    }

    /// The lease names the replica runs.
    pub fn names(&self) -> Vec<String> {
        if self.leases == 1 {
            vec![self.lease.clone()]
        } else {
            (0..self.leases)
                .map(|i| format!("{}-{i}", self.lease))
                .collect()
        }
    }

    /// The command line.
    pub fn command(&self, bin: &Path) -> Command {
        let mut cmd = Command::new(bin);
        let ms = |d: Duration| d.as_millis().to_string();
        cmd.args(["--driver", self.driver.name(), "--url", &self.url])
            .args(["--lease", &self.lease, "--leases", &self.leases.to_string()])
            .args([
                "--retry",
                &ms(self.retry),
                "--heartbeat",
                &ms(self.heartbeat),
            ])
            .args(["--query-timeout", &ms(self.query_timeout)])
            .args(["--guard-margin", &ms(self.guard_margin)])
            .args(["--tick", &ms(self.tick)])
            .args(["--status-poll", &ms(self.status_poll)]);
        if !self.guard {
            cmd.arg("--no-guard");
        }
        if !self.notify {
            cmd.arg("--no-notify");
        }
        if !self.server_wait.idle() {
            cmd.arg("--no-wait");
        } else if !self.server_wait.watch() {
            cmd.arg("--no-watch");
        }
        for name in &self.also {
            cmd.args(["--also", name]);
        }
        if !self.also.is_empty() {
            cmd.args(["--also-after", &ms(self.also_after)]);
        }
        if let Some(d) = self.lock_delay {
            cmd.args(["--lock-delay", &ms(d)]);
        }
        if let Some(name) = &self.app_name {
            cmd.args(["--app-name", name]);
        }
        if let Some(after) = self.job_exit_after {
            cmd.args(["--job-exit-after", &ms(after)]);
        }
        if let Some(ca) = &self.tls_ca {
            cmd.arg("--tls-ca").arg(ca);
        }
        if let Some(group) = &self.group {
            cmd.args(["--group", group]);
        }
        cmd
    }

    /// Spawns the replica; `label` names it in messages.
    pub fn spawn(&self, bin: &Path, label: &str) -> Result<Node, KitError> {
        self.spawn_wrapped(bin, label, |cmd| cmd)
    }

    /// Like [`ReplicaConfig::spawn`], with the command line passed through `wrap` first
    /// (for example [`crate::NetNs::wrap`], to run the replica in a network namespace).
    pub fn spawn_wrapped(
        &self,
        bin: &Path,
        label: &str,
        wrap: impl FnOnce(Command) -> Command,
    ) -> Result<Node, KitError> {
        let replica = Replica::spawn(wrap(self.command(bin)))?;
        Ok(Node {
            label: format!("{label}({})", self.driver.name()),
            config: Some(self.clone()),
            replica,
            killed: None,
        })
    }
}

/// One parsed stdout line of a replica (see `src/bin/replica.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `ready T`
    Ready {
        /// When.
        t: u64,
    },
    /// `pid BACKEND_PID T`
    Pid {
        /// The backend pid of the new session.
        pid: i32,
        /// When.
        t: u64,
    },
    /// `start LEASE TOKEN T`
    Start {
        /// Lease name.
        lease: String,
        /// Fencing token.
        token: i64,
        /// When.
        t: u64,
    },
    /// `valid LEASE UNTIL T`
    Valid {
        /// Lease name.
        lease: String,
        /// The new `valid_until`.
        until: u64,
        /// When it was seen.
        t: u64,
    },
    /// `tick LEASE T`: a side effect with a valid lease.
    Tick {
        /// Lease name.
        lease: String,
        /// When validity was checked (at or after T).
        t: u64,
    },
    /// `skip LEASE T`: a tick with an invalid lease.
    Skip {
        /// Lease name.
        lease: String,
        /// When.
        t: u64,
    },
    /// `cancel LEASE KIND T`
    Cancel {
        /// Lease name.
        lease: String,
        /// Reason kind (`session-lost`, `validity-expired`, ...).
        kind: String,
        /// When.
        t: u64,
    },
    /// `stop LEASE T`: the job returned.
    Stop {
        /// Lease name.
        lease: String,
        /// When.
        t: u64,
    },
    /// `shutdown T`
    Shutdown {
        /// When.
        t: u64,
    },
    /// `finished LEASE ok|err:MESSAGE T`
    Finished {
        /// Lease name.
        lease: String,
        /// `Err(message)` for a failed run.
        result: Result<(), String>,
        /// When.
        t: u64,
    },
}

impl Event {
    /// Parses one stdout line; `None` for anything else.
    pub fn parse(line: &str) -> Option<Event> {
        let (head, t) = line.rsplit_once(' ')?;
        let t: u64 = t.parse().ok()?;
        let mut words = head.split(' ');
        let word = words.next()?;
        let mut next = || words.next().map(str::to_owned);
        Some(match word {
            "ready" => Event::Ready { t },
            "pid" => Event::Pid {
                pid: next()?.parse().ok()?,
                t,
            },
            "start" => Event::Start {
                lease: next()?,
                token: next()?.parse().ok()?,
                t,
            },
            "valid" => Event::Valid {
                lease: next()?,
                until: next()?.parse().ok()?,
                t,
            },
            "tick" => Event::Tick { lease: next()?, t },
            "skip" => Event::Skip { lease: next()?, t },
            "cancel" => Event::Cancel {
                lease: next()?,
                kind: next()?,
                t,
            },
            "stop" => Event::Stop { lease: next()?, t },
            "shutdown" => Event::Shutdown { t },
            "finished" => {
                let (lease, result) = head["finished ".len()..].split_once(' ')?;
                let result = match result {
                    "ok" => Ok(()),
                    err => Err(err.strip_prefix("err:")?.to_owned()),
                };
                Event::Finished {
                    lease: lease.to_owned(),
                    result,
                    t,
                }
            }
            _ => return None,
        })
    }

    /// When it happened.
    pub fn t(&self) -> u64 {
        match self {
            Event::Ready { t }
            | Event::Pid { t, .. }
            | Event::Start { t, .. }
            | Event::Valid { t, .. }
            | Event::Tick { t, .. }
            | Event::Skip { t, .. }
            | Event::Cancel { t, .. }
            | Event::Stop { t, .. }
            | Event::Shutdown { t }
            | Event::Finished { t, .. } => *t,
        }
    }
}

/// A leadership term of one replica: from its `start` to its `cancel` or `stop`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// The replica's label.
    pub node: String,
    /// Lease name.
    pub lease: String,
    /// Fencing token.
    pub token: i64,
    /// `start` time.
    pub start: u64,
    /// `cancel` time, else `stop` time; `None` while it leads.
    pub end: Option<u64>,
    /// The last `valid_until` printed before the end.
    pub valid_until: Option<u64>,
}

impl Term {
    /// The end in "line" terms: `cancel`/`stop`, or `now` while open.
    pub fn line_end(&self, now: u64) -> u64 {
        self.end.unwrap_or(now)
    }

    /// The end in validity terms: the earlier of the line end and the last `valid_until`.
    pub fn valid_end(&self, now: u64) -> u64 {
        let end = self.line_end(now);
        self.valid_until.map_or(end, |v| v.min(end))
    }
}

/// Nanoseconds during which two terms overlap, given their ends (0 if they do not).
pub fn overlap(a: (u64, u64), b: (u64, u64)) -> u64 {
    a.1.min(b.1).saturating_sub(a.0.max(b.0))
}

/// The largest overlap (in line terms) between terms of one lease held by different
/// replicas, with the two terms.
pub fn worst_overlap(terms: &[Term], now: u64) -> (u64, Option<(Term, Term)>) {
    let mut worst = (0, None);
    for (i, a) in terms.iter().enumerate() {
        for b in &terms[i + 1..] {
            if a.lease != b.lease || a.node == b.node {
                continue;
            }
            let o = overlap((a.start, a.line_end(now)), (b.start, b.line_end(now)));
            if o > worst.0 || (o > 0 && worst.1.is_none()) {
                worst = (o, Some((a.clone(), b.clone())));
            }
        }
    }
    worst
}

/// A running `replica` process, or another process that prints its line protocol
/// ([`Node::adopt`]).
pub struct Node {
    /// `LABEL(driver)`, or the label given to [`Node::adopt`].
    pub label: String,
    /// How it was started; `None` for an adopted process.
    pub config: Option<ReplicaConfig>,
    replica: Replica,
    /// When [`Node::kill9`] sent SIGKILL: the process did nothing after that.
    killed: Option<u64>,
}

impl Node {
    /// Treats `replica`, a process that is no `replica` binary, as a node: its stdout
    /// lines in the `replica` format ([`Event`]; a job's `start` and `stop` lines at
    /// least) make its events and terms. For example `lease run` with a child that prints
    /// them.
    pub fn adopt(replica: Replica, label: impl Into<String>) -> Node {
        Node {
            label: label.into(),
            config: None,
            replica,
            killed: None,
        }
    }

    /// The kit's process handle (signals, exit status, raw lines).
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// Sends SIGKILL and returns when; open terms end then.
    pub fn kill9(&mut self) -> Result<u64, KitError> {
        let t = monotonic_nanos();
        self.replica.kill9()?;
        self.killed.get_or_insert(t);
        Ok(t)
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, KitError> {
        self.replica.wait_exit(timeout)
    }

    /// Every parsed stdout line so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.replica
            .lines()
            .iter()
            .filter(|l| l.stream == Stream::Stdout)
            .filter_map(|l| Event::parse(&l.text))
            .collect()
    }

    /// Every stderr line so far.
    pub fn stderr(&self) -> Vec<String> {
        self.replica
            .lines()
            .into_iter()
            .filter(|l| l.stream == Stream::Stderr)
            .map(|l| l.text)
            .collect()
    }

    /// Waits for the first event (from the start of the output) that `pred` accepts.
    pub fn wait_event(
        &self,
        mut pred: impl FnMut(&Event) -> bool,
        timeout: Duration,
    ) -> Result<Event, KitError> {
        let mut found = None;
        self.replica.wait_for_line(
            |line| match Event::parse(line) {
                Some(e) if pred(&e) => {
                    found = Some(e);
                    true
                }
                _ => false,
            },
            timeout,
        )?;
        found.ok_or_else(|| KitError::Invalid("wait_event matched no event".into()))
    }

    /// Waits for a `start` at or after `after`: `(lease, token, t)`.
    pub fn wait_start(
        &self,
        after: u64,
        timeout: Duration,
    ) -> Result<(String, i64, u64), KitError> {
        match self.wait_event(
            |e| matches!(e, Event::Start { t, .. } if *t >= after),
            timeout,
        )? {
            Event::Start { lease, token, t } => Ok((lease, token, t)),
            _ => unreachable!("matched a start"),
        }
    }

    /// Waits for a `cancel` at or after `after`: `(kind, t)`.
    pub fn wait_cancel(&self, after: u64, timeout: Duration) -> Result<(String, u64), KitError> {
        match self.wait_event(
            |e| matches!(e, Event::Cancel { t, .. } if *t >= after),
            timeout,
        )? {
            Event::Cancel { kind, t, .. } => Ok((kind, t)),
            _ => unreachable!("matched a cancel"),
        }
    }

    /// Waits for a `stop` at or after `after`.
    pub fn wait_stop(&self, after: u64, timeout: Duration) -> Result<u64, KitError> {
        Ok(self
            .wait_event(
                |e| matches!(e, Event::Stop { t, .. } if *t >= after),
                timeout,
            )?
            .t())
    }

    /// Waits for a `pid` line at or after `after`: `(backend pid, t)`.
    pub fn wait_pid(&self, after: u64, timeout: Duration) -> Result<(i32, u64), KitError> {
        match self.wait_event(
            |e| matches!(e, Event::Pid { t, .. } if *t >= after),
            timeout,
        )? {
            Event::Pid { pid, t } => Ok((pid, t)),
            _ => unreachable!("matched a pid"),
        }
    }

    /// Waits for `n` `start` lines in all: the `t` of the n-th.
    pub fn wait_starts(&self, n: usize, timeout: Duration) -> Result<u64, KitError> {
        let mut seen = 0;
        Ok(self
            .wait_event(
                |e| {
                    matches!(e, Event::Start { .. }) && {
                        seen += 1;
                        seen == n
                    }
                },
                timeout,
            )?
            .t())
    }

    /// The backend pid of the latest session, if one was ready.
    pub fn last_pid(&self) -> Option<i32> {
        self.events().iter().rev().find_map(|e| match e {
            Event::Pid { pid, .. } => Some(*pid),
            _ => None,
        })
    }

    /// Every leadership term so far, in start order. A term of a killed replica that
    /// printed no end ends at the kill.
    pub fn terms(&self) -> Vec<Term> {
        let mut done: Vec<Term> = Vec::new();
        let mut open: Vec<Term> = Vec::new();
        for event in self.events() {
            match event {
                Event::Start { lease, token, t } => open.push(Term {
                    node: self.label.clone(),
                    lease,
                    token,
                    start: t,
                    end: None,
                    valid_until: None,
                }),
                Event::Valid { lease, until, .. } => {
                    if let Some(term) = open.iter_mut().find(|o| o.lease == lease) {
                        term.valid_until = Some(until);
                    }
                }
                Event::Cancel { lease, t, .. } => {
                    if let Some(term) = open.iter_mut().find(|o| o.lease == lease) {
                        term.end.get_or_insert(t);
                    }
                }
                Event::Stop { lease, t } => {
                    if let Some(i) = open.iter().position(|o| o.lease == lease) {
                        let mut term = open.remove(i);
                        term.end.get_or_insert(t);
                        done.push(term);
                    }
                }
                _ => {}
            }
        }
        for mut term in open {
            term.end = self.killed.map(|k| k.max(term.start));
            done.push(term);
        }
        done.sort_by_key(|t| t.start);
        done
    }

    /// The terms still open (leading now, as far as the output says).
    pub fn leading(&self) -> Vec<Term> {
        self.terms()
            .into_iter()
            .filter(|t| t.end.is_none())
            .collect()
    }

    /// `cancel` events: `(lease, kind, t)`.
    pub fn cancels(&self) -> Vec<(String, String, u64)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Cancel { lease, kind, t } => Some((lease, kind, t)),
                _ => None,
            })
            .collect()
    }

    /// `finished` events: `(lease, result)`.
    pub fn finished(&self) -> Vec<(String, Result<(), String>)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Finished { lease, result, .. } => Some((lease, result)),
                _ => None,
            })
            .collect()
    }

    /// The last lines of stdout and stderr, for assertion messages.
    pub fn tail(&self) -> String {
        let lines = self.replica.lines();
        let pick = |s: Stream| {
            let v: Vec<&str> = lines
                .iter()
                .filter(|l| l.stream == s)
                .map(|l| l.text.as_str())
                .collect();
            v[v.len().saturating_sub(15)..].join("\n  ")
        };
        format!(
            "--- {} stdout ---\n  {}\n--- {} stderr ---\n  {}",
            self.label,
            pick(Stream::Stdout),
            self.label,
            pick(Stream::Stderr)
        )
    }
}

/// A blocking admin connection (superuser) for precise timing and polling, on a private
/// tokio runtime: cheaper and more precise than [`crate::Cluster::sql`]'s `psql` per call.
/// Blocking: use it from plain `#[test]`s or threads, not from inside an async runtime.
pub struct Admin {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl Admin {
    /// Connects with a key-value connection string, without TLS.
    pub fn connect(conn: &str) -> Result<Admin, KitError> {
        Admin::connect_tls(conn, None)
    }

    /// Connects with a key-value connection string; with `ca`, over TLS (required) verified
    /// in full against the CA certificates in that PEM file ([`crate::tls::client_config`]).
    pub fn connect_tls(conn: &str, ca: Option<&Path>) -> Result<Admin, KitError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(io_err("building the admin runtime"))?;
        let conn = format!("{conn} application_name=lease-tests-scenario-admin");
        let failed = |e: tokio_postgres::Error| KitError::Failed {
            context: "admin connection".into(),
            detail: crate::error_chain(&e),
        };
        let client = match ca {
            None => {
                let (client, connection) = rt
                    .block_on(tokio_postgres::connect(&conn, NoTls))
                    .map_err(failed)?;
                rt.spawn(connection);
                client
            }
            Some(ca) => {
                let tls =
                    tokio_postgres_rustls::MakeRustlsConnect::new(crate::tls::client_config(ca)?);
                let conn = format!("{conn} sslmode=require");
                let (client, connection) = rt
                    .block_on(tokio_postgres::connect(&conn, tls))
                    .map_err(failed)?;
                rt.spawn(connection);
                client
            }
        };
        Ok(Admin { rt, client })
    }

    /// Runs `sql` (simple-query protocol) and returns every row as text columns
    /// ([`text_rows`]).
    pub fn rows(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, KitError> {
        let messages = self
            .rt
            .block_on(self.client.simple_query(sql))
            .map_err(|e| KitError::Failed {
                context: format!("admin query {sql:?}"),
                detail: e.to_string(),
            })?;
        Ok(text_rows(messages))
    }

    /// The first column of every row, parsed as `i64` (NULL and non-numbers skipped).
    pub fn ints(&self, sql: &str) -> Result<Vec<i64>, KitError> {
        Ok(self
            .rows(sql)?
            .into_iter()
            .filter_map(|r| r.first()?.as_deref()?.parse().ok())
            .collect())
    }

    /// Backend pids holding the advisory key `key` (granted), ascending.
    pub fn holders(&self, key: i64) -> Result<Vec<i32>, KitError> {
        Ok(self
            .ints(&format!(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
                 AND granted AND {} = {key} ORDER BY pid",
                lease_proto::server::ADVISORY_KEY_SQL
            ))?
            .into_iter()
            .map(|p| p as i32)
            .collect())
    }

    /// `pg_terminate_backend(pid)` without waiting; whether it was signalled.
    pub fn terminate(&self, pid: i32) -> Result<bool, KitError> {
        let rows = self.rows(&format!("SELECT pg_terminate_backend({pid})"))?;
        Ok(rows.first().and_then(|r| r.first().cloned().flatten()) == Some("t".into()))
    }

    /// The text of the last statement backend `pid` ran (or runs).
    pub fn last_query(&self, pid: i32) -> Result<Option<String>, KitError> {
        Ok(self
            .rows(&format!(
                "SELECT query FROM pg_stat_activity WHERE pid = {pid}"
            ))?
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next().flatten()))
    }

    /// Waits until backend `pid` has run a statement starting with `prefix`; returns when
    /// that was first seen.
    pub fn wait_query(&self, pid: i32, prefix: &str, timeout: Duration) -> Result<u64, KitError> {
        self.wait_query_any(pid, &[prefix], timeout)
    }

    /// Like [`Admin::wait_query`], for a statement starting with any of `prefixes`.
    pub fn wait_query_any(
        &self,
        pid: i32,
        prefixes: &[&str],
        timeout: Duration,
    ) -> Result<u64, KitError> {
        let deadline = monotonic_nanos() + timeout.as_nanos() as u64;
        loop {
            let query = self.last_query(pid)?;
            let t = monotonic_nanos();
            let seen = |q: &str| prefixes.iter().any(|p| q.starts_with(p));
            if query.as_deref().is_some_and(seen) {
                return Ok(t);
            }
            if t > deadline {
                return Err(KitError::Timeout {
                    context: format!("backend {pid} never ran a statement starting {prefixes:?}"),
                    detail: format!("last statement: {query:?}"),
                });
            }
            std::thread::sleep(ms(5));
        }
    }
}

/// The prefix of the standby try statement (`lease_proto::Statement::TryLock`).
pub const TRY_PREFIX: &str = "WITH t AS (SELECT pg_catalog.array_agg(k) AS won";
/// The prefix of a standby's wait on the server (`lease_proto::Statement::Take`, sent
/// only after a try that lost) and of the watch session's (`lease_proto::Statement::Wait`).
pub const WAIT_PREFIX: &str = lease_proto::server::WAIT_PRELUDE_SQL;

/// The rows of a simple-query reply as text columns (`None`: NULL), in order; the
/// command-complete and other messages left out.
pub fn text_rows(messages: Vec<SimpleQueryMessage>) -> Vec<Vec<Option<String>>> {
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}
