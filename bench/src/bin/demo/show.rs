//! The demo's orchestration: the database, the replicas, the four scenarios, the timeline
//! and the summary.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::{Duration, Instant};

use lease_tests::{pid_alive, Cluster, FaultProxy, KitError, Mode, Replica, Stream};
use tokio_postgres::config::Host;

use crate::{add_secret, redact, stopped, Args};

/// `lease run`'s environment variable of tracing filter directives: removed, so the
/// replicas log at their default level whatever the caller's environment says.
const LEASE_FILTER_ENV: &str = "LEASE_LOG";

/// Lease intervals of the replicas without `--defaults`: failover within about two seconds.
const RUN_OPTIONS: [&str; 8] = [
    "--retry-interval",
    "200ms",
    "--heartbeat-interval",
    "200ms",
    "--query-timeout",
    "600ms",
    "--grace",
    "1s",
];
/// How long a failover may take before the demo gives up, at [`RUN_OPTIONS`].
const FAILOVER_LIMIT: Duration = Duration::from_secs(15);
/// The same at the defaults (a freeze or a partition: validity + guard margin, 11 to 16 s).
const FAILOVER_LIMIT_AT_DEFAULTS: Duration = Duration::from_secs(60);
/// The timing flags of `lease run` the demo names.
const TIMING_FLAGS: [&str; 4] = [
    "--retry-interval",
    "--heartbeat-interval",
    "--query-timeout",
    "--grace",
];

/// `lease run`'s defaults of [`TIMING_FLAGS`], as `lease run --help` states them (`flag
/// value` pairs; `?` for one it does not state).
fn default_timings(lease: &Path) -> String {
    let help = Command::new(lease)
        .args(["run", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    timings_in(&help)
}

/// The defaults of [`TIMING_FLAGS`] in the text of `lease run --help`.
fn timings_in(help: &str) -> String {
    let value = |flag: &str| {
        let at = help.find(&format!("      {flag} <"))?;
        let rest = &help[at..];
        let d = rest.find("[default: ")?;
        rest[d + "[default: ".len()..]
            .split([']', ','])
            .next()
            .map(str::to_owned)
    };
    (TIMING_FLAGS.iter())
        .map(|f| format!("{f} {}", value(f).unwrap_or_else(|| "?".to_owned())))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why the demo stopped early.
enum DemoError {
    Kit(KitError),
    Interrupted,
    Failed(String),
}

impl From<KitError> for DemoError {
    fn from(e: KitError) -> Self {
        DemoError::Kit(e)
    }
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoError::Kit(e) => write!(f, "{e}"),
            DemoError::Interrupted => f.write_str("interrupted"),
            DemoError::Failed(e) => f.write_str(e),
        }
    }
}

type Result<T> = std::result::Result<T, DemoError>;

/// What a job line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Start,
    Beat,
    Stop,
}

/// One line of a demo job, stamped on arrival.
#[derive(Debug, Clone, Copy)]
struct JobLine {
    at: Instant,
    member: usize,
    token: i64,
    kind: Kind,
    pid: Option<i32>,
}

/// One `lease run` replica.
struct Member {
    name: String,
    replica: Replica,
    /// Its proxy to the database, if the database is on loopback TCP.
    proxy: Option<FaultProxy>,
    /// Lines already looked at.
    seen: usize,
    /// Still counted among the three replicas.
    active: bool,
}

/// How the replicas reach the database.
struct Db {
    /// Keeps a throwaway server alive (dropped last).
    _cluster: Option<Cluster>,
    /// Loopback TCP address to put proxies in front of.
    upstream: Option<std::net::SocketAddr>,
    user: String,
    dbname: String,
    password: Option<String>,
    /// `--database-url` to pass on (via the environment) without proxies.
    url: Option<String>,
    /// Where it points, for the timeline (never the password).
    summary: String,
}

/// One scenario's measurements.
struct Row {
    scenario: &'static str,
    detect: Option<Duration>,
    gap: Option<Duration>,
    overlap: Option<Duration>,
    before: i64,
    after: Option<i64>,
    note: String,
}

struct Demo {
    t0: Instant,
    /// The `lease` binary the replicas run.
    lease: PathBuf,
    /// The job `lease run` runs: this binary, with `--job`.
    job: PathBuf,
    db: Db,
    members: Vec<Member>,
    jobs: Vec<JobLine>,
    verbose: bool,
    /// `--defaults`: the replicas run at `lease run`'s default timings.
    defaults: bool,
    /// How long a failover may take before the demo gives up.
    failover_limit: Duration,
    /// Token of the job the timeline last saw start.
    leader: Option<(usize, i64)>,
}

/// Runs the demo with `lease` as the replicas' runner and `job` (this binary) as their
/// job; returns the exit status.
pub fn main(args: &Args, lease: &Path, job: &Path) -> u8 {
    let t0 = Instant::now();
    let db = if let Some(db) = configured(args) {
        say(t0, &danger_line(&db.summary));
        // Time to read it and press Ctrl-C.
        let until = Instant::now() + DANGER_PAUSE;
        while Instant::now() < until {
            if stopped() {
                say(t0, "interrupted: nothing was started");
                return 130;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if db.upstream.is_none() {
            say(
                t0,
                "(not a loopback TCP address: the replicas connect directly, without proxies)",
            );
        }
        db
    } else {
        say(
            t0,
            "starting a throwaway PostgreSQL (initdb + postgres) ...",
        );
        match Cluster::start() {
            Ok(cluster) => {
                say(
                    t0,
                    &format!(
                        "throwaway PostgreSQL ready on {}:{} (deleted at the end)",
                        cluster.host(),
                        cluster.port()
                    ),
                );
                Db {
                    upstream: Some(([127, 0, 0, 1], cluster.port()).into()),
                    _cluster: Some(cluster),
                    user: "postgres".to_owned(),
                    dbname: "postgres".to_owned(),
                    password: None,
                    url: None,
                    summary: String::new(),
                }
            }
            Err(e) => {
                let e = e.to_string();
                let first = e.lines().next().unwrap_or("failed");
                eprintln!("demo: error: cannot start a throwaway PostgreSQL: {first}");
                eprintln!(
                    "  (install a PostgreSQL server, 14 or newer: on Debian or Ubuntu `sudo \
                     apt-get install postgresql`; or point the demo at a server: cargo run -p \
                     lease-bench --bin demo -- --database-url URL)"
                );
                return 1;
            }
        }
    };
    let mut demo = Demo {
        t0,
        lease: lease.to_owned(),
        job: job.to_owned(),
        db,
        members: Vec::new(),
        jobs: Vec::new(),
        verbose: args.verbose,
        defaults: args.defaults,
        failover_limit: if args.defaults {
            FAILOVER_LIMIT_AT_DEFAULTS
        } else {
            FAILOVER_LIMIT
        },
        leader: None,
    };
    let result = demo.run();
    // Replicas first (their jobs die with them), then proxies, then the server.
    let code = match result {
        Ok(rows) => {
            print_summary(&rows);
            println!(
                "\ndone in {:.1} s. Try it on your job: cargo install --locked --path \
                 lease-cli, then lease run my-job -- ./my-job.sh",
                t0.elapsed().as_secs_f64()
            );
            0
        }
        Err(DemoError::Interrupted) => {
            say(t0, "interrupted: stopping the replicas and the server");
            130
        }
        Err(e) => {
            eprintln!("demo: error: demo failed: {}", redact(&e.to_string()));
            for m in &demo.members {
                let lines = m.replica.lines();
                let tail: Vec<&str> = lines
                    .iter()
                    .rev()
                    .filter(|l| l.stream == Stream::Stderr)
                    .take(5)
                    .map(|l| l.text.as_str())
                    .collect();
                for line in tail.iter().rev() {
                    eprintln!("  {}: {}", m.name, redact(line));
                }
            }
            1
        }
    };
    demo.members.clear();
    code
}

/// The server the demo runs against when `--database-url` names one, else `None`: a
/// throwaway one. Only the flag counts: `DATABASE_URL` and the `PG*` variables are never
/// read (a shell that holds a production URL must not point the demo's kills, freezes
/// and partitions at production), and [`scrub_environment`] keeps them from the replicas.
/// A string this demo cannot parse is passed on to the replicas as it is (`lease run`
/// reports what is wrong with it), without proxies.
fn configured(args: &Args) -> Option<Db> {
    let url = args.database_url.clone()?;
    let config = tokio_postgres::Config::from_str(&url).ok();
    let password = config
        .as_ref()
        .and_then(|c| c.get_password())
        .map(|p| String::from_utf8_lossy(p).into_owned());
    if let Some(pw) = &password {
        add_secret(pw);
    }
    // `lease run`'s default user without PGUSER: the OS user.
    let user = config
        .as_ref()
        .and_then(|c| c.get_user().map(str::to_owned))
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "postgres".to_owned());
    let dbname = config
        .as_ref()
        .and_then(|c| c.get_dbname().map(str::to_owned))
        .unwrap_or_else(|| user.clone());
    let host = match config.as_ref().and_then(|c| c.get_hosts().first()) {
        Some(Host::Tcp(h)) => Some(h.clone()),
        Some(Host::Unix(p)) => Some(p.display().to_string()),
        None => None,
    };
    let port = config
        .as_ref()
        .and_then(|c| c.get_ports().first().copied())
        .unwrap_or(5432);
    let upstream = config.as_ref().and(host.as_deref()).and_then(|h| {
        let ip: IpAddr = if h == "localhost" {
            IpAddr::from([127, 0, 0, 1])
        } else {
            h.parse().ok()?
        };
        ip.is_loopback().then_some(SocketAddr::from((ip, port)))
    });
    let summary = match (&config, &host) {
        (None, _) => "(passed on to `lease run` as it is)".to_owned(),
        (Some(_), Some(h)) => format!("host={h} port={port} dbname={dbname} user={user}"),
        (Some(_), None) => format!("the default socket, port={port} dbname={dbname} user={user}"),
    };
    Some(Db {
        _cluster: None,
        upstream,
        user,
        dbname,
        password,
        url: Some(url),
        summary: redact(&summary),
    })
}

/// How long the demo waits after [`danger_line`] before it starts anything.
const DANGER_PAUSE: Duration = Duration::from_secs(3);

/// The loud line before the demo runs against a server `--database-url` named.
fn danger_line(summary: &str) -> String {
    format!(
        "WARNING: --database-url: NOT a throwaway server. The demo runs three `lease run \
         demo-job` replicas against {summary} and KILLS (SIGKILL), FREEZES (SIGSTOP) and \
         PARTITIONS them from it and stops them, on purpose: their sessions hold and drop the \
         lease demo-job there. Starting in {} s: Ctrl-C to stop.",
        DANGER_PAUSE.as_secs()
    )
}

/// Removes `DATABASE_URL` and every `PG*` variable of this process's environment from
/// `cmd`'s, so that a replica connects only where the demo tells it (its `DATABASE_URL`,
/// set after this) and nothing of the caller's shell fills in a host, a port, a service
/// or a setting.
fn scrub_environment(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        if n == "DATABASE_URL" || n.starts_with("PG") {
            cmd.env_remove(name);
        }
    }
}

/// Prints one timeline line.
fn say(t0: Instant, text: &str) {
    println!("[{:6.2}s] {text}", t0.elapsed().as_secs_f64());
}

fn ms(d: Duration) -> String {
    format!("{}", d.as_millis())
}

impl Demo {
    fn say_at(&self, at: Instant, text: &str) {
        let t = at.saturating_duration_since(self.t0).as_secs_f64();
        println!("[{t:6.2}s] {text}");
    }

    fn say(&self, text: &str) {
        say(self.t0, text);
    }

    fn run(&mut self) -> Result<Vec<Row>> {
        for _ in 0..3 {
            self.spawn_member()?;
        }
        let timings = if self.defaults {
            format!(
                "at lease run's default timings, {}: a frozen or cut-off leader is replaced \
                 11 to 16 s after its last heartbeat",
                default_timings(&self.lease)
            )
        } else {
            format!(
                "at test timings, {}: failover within about 2 s (lease run's defaults are \
                 {}: 11 to 16 s for a freeze or a partition; see them with --defaults)",
                RUN_OPTIONS.join(" "),
                default_timings(&self.lease)
            )
        };
        self.say(&format!(
            "3 replicas of `lease run demo-job -- demo --job` started {timings}; the \
             leader's job prints its fencing token every 100 ms"
        ));
        let mut rows = Vec::new();
        rows.push(self.scenario_kill()?);
        rows.push(self.scenario_freeze()?);
        match self.scenario_partition()? {
            Some(row) => rows.push(row),
            None => self.say(
                "partition skipped: the database is not on a loopback TCP address, so no \
                 proxy can be put in front of it",
            ),
        }
        rows.push(self.scenario_sigterm()?);
        Ok(rows)
    }

    /// Starts one more `lease run` replica (through a new proxy).
    fn spawn_member(&mut self) -> Result<()> {
        let name = format!("r{}", self.members.len() + 1);
        let proxy = match self.db.upstream {
            Some(up) => Some(FaultProxy::start(up)?),
            None => None,
        };
        let mut cmd = Command::new(&self.lease);
        cmd.arg("run")
            .arg("demo-job")
            .args(if self.defaults {
                &[][..]
            } else {
                &RUN_OPTIONS[..]
            })
            .args(["--log-format", "json", "--"])
            .arg(&self.job)
            .arg("--job")
            .env_remove(LEASE_FILTER_ENV);
        scrub_environment(&mut cmd);
        if let Some(proxy) = &proxy {
            let url = format!(
                "host=127.0.0.1 port={} user={} dbname={} sslmode=disable",
                proxy.port(),
                kv_quote(&self.db.user),
                kv_quote(&self.db.dbname)
            );
            cmd.env("DATABASE_URL", url);
            // The password travels in the environment, never in argv.
            if let Some(pw) = &self.db.password {
                cmd.env("PGPASSWORD", pw);
            }
        } else if let Some(url) = &self.db.url {
            cmd.env("DATABASE_URL", url);
        }
        // If the demo dies, its replicas shut down gracefully (SIGTERM).
        // SAFETY: only async-signal-safe prctl in the forked child.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGTERM as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                Ok(())
            });
        }
        let replica = Replica::spawn(cmd)?;
        self.say(&format!("{name} started (pid {})", replica.pid()));
        self.members.push(Member {
            name,
            replica,
            proxy,
            seen: 0,
            active: true,
        });
        Ok(())
    }

    /// Reads new output of every replica into the timeline.
    fn pump(&mut self) -> Result<()> {
        if stopped() {
            return Err(DemoError::Interrupted);
        }
        for i in 0..self.members.len() {
            let lines = self.members[i].replica.lines();
            let new: Vec<_> = lines[self.members[i].seen.min(lines.len())..].to_vec();
            self.members[i].seen = lines.len();
            for line in new {
                match line.stream {
                    Stream::Stdout => self.job_line(i, line.at, &line.text),
                    Stream::Stderr => self.log_line(i, line.at, &line.text),
                }
            }
        }
        Ok(())
    }

    fn job_line(&mut self, member: usize, at: Instant, text: &str) {
        let Some(rest) = text.strip_prefix("demo-worker ") else {
            return;
        };
        let mut token = None;
        let mut pid = None;
        let mut kind = Kind::Beat;
        for word in rest.split_whitespace() {
            match word.split_once('=') {
                Some(("token", t)) => token = t.parse().ok(),
                Some(("pid", p)) => pid = p.parse().ok(),
                _ if word == "started" => kind = Kind::Start,
                _ if word == "stopping" => kind = Kind::Stop,
                _ => {}
            }
        }
        let Some(token) = token else {
            return;
        };
        self.jobs.push(JobLine {
            at,
            member,
            token,
            kind,
            pid,
        });
        let name = self.members[member].name.clone();
        match kind {
            Kind::Start => {
                let pid = pid.map_or_else(String::new, |p| format!(", pid {p}"));
                let mut text = format!("{name} job STARTED  token {token}{pid}");
                if let Some((old, old_token)) = self.leader {
                    let last_old = self
                        .jobs
                        .iter()
                        .filter(|j| j.token == old_token)
                        .map(|j| j.at)
                        .max();
                    if let Some(last) = last_old {
                        text.push_str(&format!(
                            "   <- failover from {} (token {old_token}): {} ms since its \
                             job's last line",
                            self.members[old].name,
                            ms(at.saturating_duration_since(last))
                        ));
                    }
                }
                self.say_at(at, &text);
                self.leader = Some((member, token));
            }
            Kind::Stop => {
                self.say_at(at, &format!("{name} job stopping (token {token}, SIGTERM)"));
            }
            Kind::Beat => {
                if self.leader.is_some_and(|(_, t)| t > token) {
                    self.say_at(
                        at,
                        &format!(
                            "{name} OLD job still printing: token {token} (the leader's is \
                             larger: a fenced store rejects this write)"
                        ),
                    );
                }
            }
        }
    }

    fn log_line(&self, member: usize, at: Instant, text: &str) {
        let name = &self.members[member].name;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
            if self.verbose {
                self.say_at(at, &format!("{name} | {}", redact(text)));
            }
            return;
        };
        let fields = &v["fields"];
        let message = fields["message"].as_str().unwrap_or("");
        let level = v["level"].as_str().unwrap_or("");
        let reason = fields["reason"].as_str();
        let shown = match message {
            "lease acquired" => Some(format!(
                "{name} acquired the lease (token {})",
                fields["token"]
            )),
            "lease lost" => Some(format!("{name} LOST the lease: {}", reason.unwrap_or("?"))),
            "lease released" => Some(format!("{name} released the lease")),
            m if m.starts_with("received SIG") => Some(format!("{name} {m}")),
            m if m.starts_with("cannot reach the database") => {
                Some(format!("{name} cannot reach the database; retrying"))
            }
            _ => None,
        };
        if let Some(shown) = shown {
            self.say_at(at, &shown);
        } else if self.verbose {
            let mut extra = String::new();
            if let Some(obj) = fields.as_object() {
                for (k, val) in obj {
                    if k != "message" {
                        extra.push_str(&format!(" {k}={val}"));
                    }
                }
            }
            self.say_at(at, &redact(&format!("{name} | {level} {message}{extra}")));
        }
    }

    /// Pumps until `cond` holds; `Err` after `limit`.
    fn wait_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut cond: impl FnMut(&Demo) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            self.pump()?;
            if cond(self) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(DemoError::Failed(format!(
                    "{what}: nothing within {} s",
                    limit.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Pumps for `d`.
    fn idle(&mut self, d: Duration) -> Result<()> {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.pump()?;
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Waits for a steady leader: a job that printed recently, with at
    /// least two standbys running. Returns (member, token, job pid).
    fn steady_leader(&mut self) -> Result<(usize, i64, i32)> {
        let mut found = None;
        self.wait_until("waiting for a leader", self.failover_limit, |d| {
            found = d.current_leader();
            found.is_some()
        })?;
        found.ok_or_else(|| DemoError::Failed("no leader".to_owned()))
    }

    /// The member whose job printed a heartbeat within the last 300 ms and
    /// whose token is the largest seen, with its token and job pid.
    fn current_leader(&self) -> Option<(usize, i64, i32)> {
        let max = self.jobs.iter().map(|j| j.token).max()?;
        let recent = self.jobs.iter().rev().find(|j| {
            j.token == max && j.kind == Kind::Beat && j.at.elapsed() < Duration::from_millis(300)
        })?;
        let pid = self
            .jobs
            .iter()
            .find(|j| j.token == max && j.kind == Kind::Start)
            .and_then(|j| j.pid)?;
        self.members[recent.member]
            .active
            .then_some((recent.member, max, pid))
    }

    /// Waits until a job with a token above `old` starts; returns its
    /// member, token and when its first line arrived.
    fn wait_new_leader(&mut self, old: i64, what: &str) -> Result<(usize, i64, Instant)> {
        let mut found = None;
        self.wait_until(what, self.failover_limit, |d| {
            found = d
                .jobs
                .iter()
                .find(|j| j.token > old)
                .map(|j| (j.member, j.token, j.at));
            found.is_some()
        })?;
        found.ok_or_else(|| DemoError::Failed("no new leader".to_owned()))
    }

    /// When the job of `token` printed its stop line.
    fn stop_line(&self, token: i64) -> Option<Instant> {
        self.jobs
            .iter()
            .find(|j| j.token == token && j.kind == Kind::Stop)
            .map(|j| j.at)
    }

    /// How many heartbeats the job of `token` printed after `t`.
    fn beats_after(&self, token: i64, t: Instant) -> usize {
        self.jobs
            .iter()
            .filter(|j| j.token == token && j.kind == Kind::Beat && j.at > t)
            .count()
    }

    /// Gap and overlap between the jobs of tokens `old` and `new`.
    fn measure(
        &self,
        scenario: &'static str,
        fault: Instant,
        old: i64,
        new: i64,
        note: String,
    ) -> Row {
        let first_new = self
            .jobs
            .iter()
            .filter(|j| j.token == new)
            .map(|j| j.at)
            .min();
        let last_old_before = self
            .jobs
            .iter()
            .filter(|j| j.token == old && first_new.is_some_and(|f| j.at <= f))
            .map(|j| j.at)
            .max();
        let last_old_beat = self
            .jobs
            .iter()
            .filter(|j| j.token == old && j.kind == Kind::Beat)
            .map(|j| j.at)
            .max();
        Row {
            scenario,
            detect: first_new.map(|f| f.saturating_duration_since(fault)),
            gap: first_new
                .zip(last_old_before)
                .map(|(f, l)| f.saturating_duration_since(l)),
            overlap: first_new
                .zip(last_old_beat)
                .map(|(f, l)| l.saturating_duration_since(f)),
            before: old,
            after: first_new.map(|_| new),
            note,
        }
    }

    fn header(&self, n: usize, text: &str) {
        println!();
        self.say(&format!("=== {n}. {text}"));
    }

    /// Keeps three replicas running: replaces those that ended.
    fn refill(&mut self) -> Result<()> {
        while self.members.iter().filter(|m| m.active).count() < 3 {
            self.spawn_member()?;
        }
        Ok(())
    }

    fn scenario_kill(&mut self) -> Result<Row> {
        let (m, token, job_pid) = self.steady_leader()?;
        self.idle(Duration::from_millis(500))?;
        let name = self.members[m].name.clone();
        self.header(
            1,
            &format!("SIGKILL the leader {name}: its session ends, the server frees the lock"),
        );
        let fault = Instant::now();
        self.members[m].replica.kill9()?;
        self.members[m].active = false;
        self.say(&format!("{name} killed with SIGKILL"));
        // The job dies with its runner (PR_SET_PDEATHSIG), not with the
        // lease: watch for both at once.
        let mut job_gone = None;
        let mut new = None;
        self.wait_until("failover after SIGKILL", self.failover_limit, |d| {
            if job_gone.is_none() && !pid_alive(job_pid) {
                job_gone = Some(Instant::now());
            }
            new = new.or_else(|| d.jobs.iter().find(|j| j.token > token).map(|j| j.token));
            job_gone.is_some() && new.is_some()
        })?;
        let new = new.unwrap_or(token);
        let note = match job_gone {
            Some(at) => format!(
                "{name}'s job died {} ms after its runner (PR_SET_PDEATHSIG)",
                ms(at.saturating_duration_since(fault))
            ),
            None => String::new(),
        };
        self.say(&note);
        let _ = self.members[m].replica.wait_exit(Duration::from_secs(5));
        self.idle(Duration::from_millis(500))?;
        let row = self.measure("SIGKILL leader", fault, token, new, note);
        self.refill()?;
        Ok(row)
    }

    fn scenario_freeze(&mut self) -> Result<Row> {
        let (m, token, job_pid) = self.steady_leader()?;
        self.idle(Duration::from_millis(500))?;
        let name = self.members[m].name.clone();
        self.header(
            2,
            &format!(
                "freeze the leader {name} and its job (SIGSTOP, like a paused VM): the \
                 server ends its silent session (idle_session_timeout)"
            ),
        );
        let fault = Instant::now();
        freeze_job(job_pid, libc::SIGSTOP);
        self.members[m].replica.sigstop()?;
        self.say(&format!("{name} and its job frozen"));
        let (_, new, _) = self.wait_new_leader(token, "failover after SIGSTOP")?;
        self.idle(Duration::from_millis(500))?;
        self.say(&format!("{name} resumed (SIGCONT)"));
        let resumed = Instant::now();
        self.members[m].replica.sigcont()?;
        freeze_job(job_pid, libc::SIGCONT);
        self.idle(Duration::from_millis(1500))?;
        let late = self.beats_after(token, resumed);
        let note = match self.stop_line(token) {
            Some(at) if late == 0 => format!(
                "on resume {name} found its lease expired and stopped its job {} ms after \
                 SIGCONT, before the job printed again",
                ms(at.saturating_duration_since(resumed))
            ),
            Some(at) => format!(
                "on resume the stale job printed {late} line(s) before {name} stopped it \
                 ({} ms after SIGCONT); its smaller token marks them stale",
                ms(at.saturating_duration_since(resumed))
            ),
            None => format!("{name}'s job printed no stop line after resuming"),
        };
        Ok(self.measure("freeze leader (SIGSTOP)", fault, token, new, note))
    }

    fn scenario_partition(&mut self) -> Result<Option<Row>> {
        let (m, token, _) = self.steady_leader()?;
        if self.members[m].proxy.is_none() {
            return Ok(None);
        }
        self.idle(Duration::from_millis(500))?;
        let name = self.members[m].name.clone();
        self.header(
            3,
            &format!(
                "partition the leader {name} from the database (its proxy black-holes \
                 traffic): it stops its job when it cannot confirm the lease"
            ),
        );
        let fault = Instant::now();
        if let Some(p) = &self.members[m].proxy {
            p.set_mode(Mode::BlackHole);
        }
        self.say(&format!("{name} partitioned"));
        let (_, new, _) = self.wait_new_leader(token, "failover after a partition")?;
        self.idle(Duration::from_millis(500))?;
        if let Some(p) = &self.members[m].proxy {
            p.set_mode(Mode::Pass);
        }
        self.say(&format!("{name}'s partition healed"));
        self.idle(Duration::from_millis(1000))?;
        let first_new = self.jobs.iter().find(|j| j.token == new).map(|j| j.at);
        let note = match (self.stop_line(token), first_new) {
            (Some(stop), Some(first)) if stop <= first => format!(
                "{name} stopped its job {} ms after the partition, {} ms before the next \
                 leader's job started",
                ms(stop.saturating_duration_since(fault)),
                ms(first.saturating_duration_since(stop))
            ),
            (Some(stop), _) => format!(
                "{name} stopped its job {} ms after the partition",
                ms(stop.saturating_duration_since(fault))
            ),
            (None, _) => format!("{name}'s job printed no stop line"),
        };
        Ok(Some(self.measure(
            "partition leader",
            fault,
            token,
            new,
            note,
        )))
    }

    fn scenario_sigterm(&mut self) -> Result<Row> {
        let (m, token, _) = self.steady_leader()?;
        self.idle(Duration::from_millis(500))?;
        let name = self.members[m].name.clone();
        self.header(
            4,
            &format!(
                "SIGTERM the leader {name}: it stops its job, releases the lease and \
                 notifies the standbys"
            ),
        );
        let fault = Instant::now();
        self.members[m].replica.sigterm()?;
        self.members[m].active = false;
        let (_, new, _) = self.wait_new_leader(token, "handover after SIGTERM")?;
        let status = self.members[m].replica.wait_exit(Duration::from_secs(5));
        self.idle(Duration::from_millis(300))?;
        let note = match status {
            Ok(s) => format!("{name} exited ({s})"),
            Err(e) => format!(
                "{name} did not exit: {}",
                e.to_string().lines().next().unwrap_or("")
            ),
        };
        self.say(&note);
        Ok(self.measure("SIGTERM leader (graceful)", fault, token, new, note))
    }
}

/// Sends `sig` to the job's process group (the job leads its own group).
fn freeze_job(pid: i32, sig: libc::c_int) {
    if pid > 1 {
        // SAFETY: kill has no memory-safety preconditions; the pid is the
        // demo job's group, which our replica created.
        unsafe { libc::kill(-pid, sig) };
    }
}

/// A libpq `key=value` value, quoted.
fn kv_quote(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn print_summary(rows: &[Row]) {
    let opt = |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), ms);
    println!();
    println!("SUMMARY (ms measured from the jobs' output lines, stamped on arrival)");
    println!(
        "{:<27} {:>10} {:>8} {:>11} {:>13} {:>12}",
        "scenario", "detect ms", "gap ms", "overlap ms", "token before", "token after"
    );
    for r in rows {
        println!(
            "{:<27} {:>10} {:>8} {:>11} {:>13} {:>12}",
            r.scenario,
            opt(r.detect),
            opt(r.gap),
            opt(r.overlap),
            r.before,
            r.after.map_or_else(|| "-".to_owned(), |t| t.to_string())
        );
    }
    println!();
    println!("detect:  fault injected -> the new leader's job printed its first line");
    println!("gap:     the old job's last line -> the new job's first line (no job running)");
    println!("overlap: the old job still printing after the new job started");
    println!("tokens:  fencing tokens (LEASE_TOKEN); every new leader's is larger, so a store");
    println!("         that keeps the largest token seen rejects a stale leader's writes");
    for r in rows.iter().filter(|r| !r.note.is_empty()) {
        println!("- {}: {}", r.scenario, r.note);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults are read from `lease run --help`'s `[default: D]`, the first after each
    /// flag; a flag it does not list shows `?`.
    #[test]
    fn timings_are_read_from_the_help() {
        let help =
            "      --retry-interval <DURATION>\n          How often\n\n          [default: 5s]\n\
                    \n      --heartbeat-interval <DURATION>\n          [default: 4s]\n\
                    \n      --grace <DURATION>\n          How long [default: 10s]\n";
        assert_eq!(
            timings_in(help),
            "--retry-interval 5s --heartbeat-interval 4s --query-timeout ? --grace 10s"
        );
    }

    /// One test, so that no other test of this binary sees the variables it sets.
    #[test]
    fn the_environment_never_names_the_demos_server() {
        for (k, v) in [
            (
                "DATABASE_URL",
                "postgres://app:hunter22@prod.invalid:6432/app",
            ),
            ("PGHOST", "prod.invalid"),
            ("PGPORT", "6432"),
            ("PGUSER", "app"),
            ("PGDATABASE", "app"),
            ("PGPASSWORD", "hunter22"),
        ] {
            std::env::set_var(k, v);
        }
        let args = |url: Option<&str>| Args {
            verbose: false,
            defaults: false,
            database_url: url.map(str::to_owned),
            lease: None,
        };
        // No flag: the throwaway server, whatever the environment says.
        assert!(configured(&args(None)).is_none());
        // The flag alone names the server; the environment fills in nothing.
        let db = configured(&args(Some("host=127.0.0.1 user=u dbname=d"))).expect("the flag");
        assert_eq!(db.upstream, Some(SocketAddr::from(([127, 0, 0, 1], 5432))));
        assert_eq!((db.user.as_str(), db.dbname.as_str()), ("u", "d"));
        assert_eq!(db.password, None);
        assert_eq!(db.summary, "host=127.0.0.1 port=5432 dbname=d user=u");
        let line = danger_line(&db.summary);
        assert!(line.contains("NOT a throwaway server"), "{line}");
        assert!(line.contains("host=127.0.0.1 port=5432"), "{line}");
        // Nothing of the caller's connection settings reaches a replica.
        let mut cmd = Command::new("lease");
        scrub_environment(&mut cmd);
        let removed: Vec<String> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for k in [
            "DATABASE_URL",
            "PGHOST",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGPASSWORD",
        ] {
            assert!(
                removed.iter().any(|r| r == k),
                "{k} reaches the replicas: {removed:?}"
            );
        }
        assert!(!removed.iter().any(|r| r == "PATH"), "{removed:?}");
    }
}
