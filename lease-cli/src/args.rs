//! The command line: every subcommand, option and help text (clap derive).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use lease_proto::limits::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LOCK_DELAY, DEFAULT_QUERY_TIMEOUT, DEFAULT_RETRY_INTERVAL,
};
use lease_tokio::{GroupId, LeaseId, NameError};

/// Shown under `lease --help`.
/// `--grace` when not given.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// How long `lease status`, `lease handover` and `lease key`'s lookups may take when not
/// told (`--timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `lease status --watch --interval` when not given.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// `lease valid --timeout` when not given.
pub const DEFAULT_VALID_TIMEOUT: Duration = Duration::from_secs(1);

/// A duration as the options take it (`5s`, `20ms`): a default for `--help` and the parser.
fn text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The most `--shards`: a replica alone leads every shard, each a COMMAND, its watchdog
/// and a socket.
pub const MAX_SHARDS: u16 = 256;

const ABOUT: &str =
    "Run a command on exactly one replica at a time, using PostgreSQL advisory locks";

const LONG_ABOUT: &str = "\
Run a command on exactly one replica at a time, using PostgreSQL session-level advisory locks.

Start `lease run NAME -- COMMAND` on every replica: one of them runs COMMAND, the others stand by
and take over when it exits, crashes, is stopped or loses its database session. No schema, no
extra service: just the database you already have.

First time? In a clone of the repository, `cargo run -p lease-bench --bin demo` starts a throwaway
PostgreSQL, runs three replicas of a small job under `lease run` and kills, freezes, partitions and
stops the leader in turn while you watch failover happen.";

const CONNECTION_HELP: &str = "\
CONNECTION (every subcommand):
  --database-url URL, else $DATABASE_URL, else the libpq environment: PGHOST, PGPORT, PGUSER,
  PGPASSWORD, PGPASSFILE (~/.pgpass), PGDATABASE, PGAPPNAME, PGSSLMODE, PGSSLROOTCERT, PGSSLCERT,
  PGSSLKEY, PGCONNECT_TIMEOUT, PGTARGETSESSIONATTRS, ... Both
  postgres://user:password@host:port/dbname URLs and key=value strings (\"host=db1 user=app
  dbname=app\") are accepted; environment variables fill in whatever the string leaves out.
  Defaults as libpq: host = the Unix socket in /var/run/postgresql, then /tmp; port 5432; user =
  the OS user; dbname = the user; sslmode=prefer. TLS is rustls with libpq's sslmode (disable to
  verify-full); sslrootcert is a PEM file or `system`. One difference: with several hosts and no
  target_session_attrs, only primaries are taken (libpq: any), so that a standby early in the
  list is skipped; read-write, for a lease, means a primary, read-only by default or not; an
  explicit value wins. Passwords are never printed.";

const RUN_LONG_ABOUT: &str = "\
Contend for the lease NAME and, while holding it, run COMMAND.

COMMAND is executed directly (no shell), in a new process group, with stdin, stdout and stderr
inherited and four variables added to its environment:
  LEASE_NAME   the lease name
  LEASE_KEY    the 64-bit advisory-lock key (see `lease key`)
  LEASE_TOKEN  the fencing token of this acquisition: larger than every earlier holder's token for
               this key on this server. Pass it to what the job writes to so that a stale leader's
               writes can be rejected.
  LEASE_SOCKET where `lease valid` asks whether the lease is valid now and until when (exit 0
               valid, 1 not, in a few milliseconds): ask before each side effect.

While another replica holds the lease, this one stands by and says on stderr who holds it.

When the lease is lost (session terminated, server restarted, network partition, or the lease not
confirmed within heartbeat-interval + query-timeout), COMMAND's whole tree (its process group
and every other descendant) gets SIGTERM at once and SIGKILL after --grace or at the lease's
kill deadline, whichever is first; once it is gone, `lease run` contends again and starts a fresh
COMMAND on its next win. The kill deadline comes just before the moment the server may hand the
lease to another replica: the send time of the last statement that confirmed the lease +
idle_session_timeout (heartbeat-interval + query-timeout + the guard margin), less the clock
drift the guarantee allows (margin / (2 validity + margin), 3.2% by default), moved forward by
every heartbeat. A lost lease is noticed by the end of its validity at the latest, so COMMAND gets
at least margin x validity / (2 validity + margin) between SIGTERM and SIGKILL (484ms by
default); a --grace set longer than that (not the default) is announced at startup by a warning.
When the session
itself ended (terminated, reset, server restarted), the server has freed the lease already and a
standby that wins it starts after its --lock-delay: SIGKILL comes half of --lock-delay (10ms) after
SIGTERM.
Without the server guard (--no-server-guard) there is no such deadline: SIGKILL comes --grace
after SIGTERM, at the latest --grace after the validity ended.

The deadline is enforced from outside `lease run` too: a small watchdog process (`lease
__watchdog`, in a process group of its own) starts COMMAND and is renewed over a pipe at every
heartbeat. If the renewals stop (`lease run` frozen, starved or deadlocked), the watchdog kills
COMMAND's tree at the kill deadline; if `lease run` dies, at once. The watchdog exits with its
runner.

COMMAND exiting by itself releases the lease and ends `lease run` with its status: 0, N, or 128+S
when killed by signal S. Whatever COMMAND left running (in its group or not) is stopped first
(SIGTERM, SIGKILL after --grace, the lease held meanwhile): nothing of the job outlives the lease.

SIGTERM or SIGINT to `lease run`: when leading, COMMAND's tree gets SIGTERM (SIGKILL after the
full --grace, or at once on a second signal; the lease is held until the tree is gone), the lease
is released (standbys are notified at once) and `lease run` exits 0; when standing by, it exits 0
at once. If the session holding the lease ends during that stop, SIGKILL comes half of
--lock-delay later; if it is given up on (a partition), just before its close at the guard
deadline.

SHARDS: with --shards N, the leases NAME/0 to NAME/N-1 form the lease group NAME. Start the same
NAME and N on every replica: each leads floor(N/R) or ceil(N/R) of the shards over the R live
replicas and runs one COMMAND per shard it leads, each as above (its own watchdog, tree, kill
deadline and LEASE_SOCKET; LEASE_NAME is NAME/I), with LEASE_SHARD (I, 0 to N-1) and
LEASE_SHARDS (N) added. A shard moves when replicas join or leave: its COMMAND is stopped as on
SIGTERM (the lease held until its tree is gone), then started on its new replica. The first
COMMAND that exits by itself ends this replica's part: every other shard's COMMAND is stopped
as on SIGTERM, the leases are released, and `lease run` exits with that COMMAND's status while
the other replicas take its shards. `lease status NAME --shards N` shows who leads which.

TRY: with --try, COMMAND runs only if this runner wins the lease at its first try (its first try of
the lease on its first session), or with --wait D before D has passed since `lease run` started;
otherwise `lease run` exits 3 without running COMMAND and prints one line on stderr naming the
holder: `lease: NAME is held by backend PID (APPLICATION, CLIENT, since T): not run (--try)` (the
server's backend pid and what `lease status NAME` shows of it). Until COMMAND starts, info lines are
held back (printed when it starts, dropped when it does not run); warnings and errors are not. A won
try starts COMMAND as without --try (--lock-delay after the win unless a graceful release announced
it), once: COMMAND's exit ends `lease run` with its status, and a lease lost or handed over while
COMMAND runs stops COMMAND as above and exits with COMMAND's status, or 1 when the stop ended it; it
never stands by again. A database that cannot be reached exits 1 (not 3): at the first failed
attempt without --wait, at the end of D with it; a wrong password or a refused server exits 1 as
without --try. Without --wait, at most 2 x --query-timeout in all (a connection and a try: a
recently promoted server holds tries back, `lease run` then exits 3). With --wait, a win still
waiting out --lock-delay when D ends is released, COMMAND not run. Not with --shards, --observer or
--priority.

SCHEDULES: with --every DURATION or --cron EXPR [--tz ZONE], `lease run` keeps running and the
leader runs COMMAND once per due time, on the database server's clock (read on a connection of
its own every 10 s or sooner; a run starts only on a reading within 50 ms), with LEASE_DUE (the due time,
RFC 3339 UTC) and LEASE_RUN_ID (NAME@<due as Unix seconds>) added. Each run is a COMMAND as
above (watchdog, kill deadline, stopped when the lease is lost); its exit status is logged and
does not end `lease run`. A due time the leader passes over is logged once, with why (--overlap,
a takeover, a stalled leader, --catch-up). Without --state-table a due time runs at most once: a
new leader runs only due times starting 100 ms or more after its grant, so those in between run
nowhere; --catch-up WINDOW runs them after all (at least once: the old leader may have run them).
With --state-table TABLE (`lease schedule init`), each due time is claimed before it runs, by one
fenced statement on a connection of its own: at most once whatever happens, and a new leader runs
what nobody ran within --catch-up (1h by default with a table). Daylight saving time, the claim
and every rule: docs/schedules.md. `lease schedule next` prints the next due times.

Nothing of COMMAND's tree outlives `lease run`, even a descendant that left its process group
and session (setsid, a double fork): the watchdog, COMMAND's parent, is a subreaper
(PR_SET_CHILD_SUBREAPER) so every orphan of the tree becomes its child, and it kills the whole
tree when `lease run` dies, even by SIGKILL; `lease run` is a subreaper too, and COMMAND gets
SIGKILL when the watchdog dies (PR_SET_PDEATHSIG). Only SIGKILL of both leaves escaped
descendants to init. Nothing in `lease run` can act while it is frozen together with the watchdog
and COMMAND (a VM pause, a cgroup freeze): check LEASE_TOKEN where the job writes. COMMAND runs in the
background process group of a terminal: it cannot read the terminal.

An unreachable database is not fatal: `lease run` keeps retrying and says so, with the cause, on
stderr. A configuration error before the first session is: a wrong password, an unknown role or
database, or a failed TLS verification ends `lease run` at once with exit status 1 and one line
(`cannot connect: password authentication failed for user ...`); once the session worked, it is
retried like a network error (a rotated password), logged as an error. A server that cannot give
mutual exclusion is fatal too: a transaction pooler, or PostgreSQL older than 14 (than 13
with --no-server-guard) ends `lease run` with exit status 1. A hot standby (a failover in
progress) is logged as an error and retried.

--metrics-addr IP:PORT (off by default) serves three HTTP paths from `lease run` itself (no thread
of its own; nothing answers while the runner is frozen or dead):
  /metrics  the lease metrics in the Prometheus text format
  /healthz  200 while the database session is ready, or was within --query-timeout +
            --retry-interval (a reconnect); 503 with a one-line reason otherwise
  /leader   200 only while COMMAND runs under a lease that is valid right now; 503 otherwise.
            For a readiness probe or a load balancer that must reach the leader alone: it turns
            503 as soon as the lease is cancelled, and 200 on a new leader only after it holds
            the lease, so two replicas never answer 200 at once.
  /leader/I with --shards: the same for shard I; /leader is then 200 while any shard is led.

EXIT STATUS: COMMAND's status (with --shards, the first to exit by itself; with --every or --cron,
never: COMMAND runs again at the next due time); 0 after a shutdown by signal; 1 when a state
table is missing; 3 with --try when
COMMAND was not run (the lease was held); 1 when the server is refused, the
configuration is wrong (cannot connect) or another error stops the run; 2 for bad usage, a --metrics-addr that cannot be bound included
(nothing is sent to the database); 126 or 127 when COMMAND cannot be executed or is not found.";

const RUN_EXAMPLES: &str = "\
EXAMPLES:
  lease run nightly-sweeper -- ./sweep --batch 500
      On every replica: one runs ./sweep, the others stand by and take over.
  lease run nightly-sweeper -- sh -c 'exec ./sweep --fence \"$LEASE_TOKEN\"'
      Through a shell, to pass the fencing token as an argument.
  lease run nightly-batch --cron '0 3 * * *' --tz Europe/Berlin --state-table lease_schedule -- ./batch
      On every replica: ./batch runs once a night, on the leader, across failovers and deploys.
  lease run nightly-report --try -- ./report
      From cron on every host: one runs ./report, the others exit 3 without running it.
  lease run --shards 8 reindexer -- ./reindex
      Eight shards spread over the live replicas; ./reindex reads LEASE_SHARD.
  lease run nightly-sweeper --priority 1 -- ./sweep
      Lead whenever this replica is up, taking over from priority 0 replicas.
  lease run --metrics-addr 0.0.0.0:9187 nightly-sweeper -- ./sweep
      /healthz for a readiness probe, /leader for a load balancer's check (200 on the
      leader only), /metrics for Prometheus.
  lease valid --quiet && ./side-effect
      Inside COMMAND: act only while the lease is valid.";

/// `lease run --help`'s text after the options: its examples, then the connection rules.
fn run_after_long_help() -> String {
    format!("{RUN_EXAMPLES}\n\n{CONNECTION_HELP}")
}

/// `lease`: the top-level parser.
#[derive(Debug, Parser)]
#[command(
    name = "lease",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = CONNECTION_HELP,
    propagate_version = true,
    arg_required_else_help = true
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Cmd,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Run COMMAND while holding the lease NAME; stand by while another replica holds it
    #[command(
        long_about = RUN_LONG_ABOUT,
        after_long_help = run_after_long_help(),
        override_usage = "lease run [OPTIONS] <NAME> -- <COMMAND> [ARGS]..."
    )]
    Run(Box<RunArgs>),
    /// Show who holds leases: the named ones, or every advisory key held in the database
    #[command(
        long_about = "Show who holds leases and who waits for them.\n\nFor each NAME (or, with no \
                      NAME, for every single-bigint advisory lock held or waited for in the \
                      database): its key, then a line per session: the holder (ROLE holder; \
                      free when nobody holds it) and the sessions waiting for it on the server \
                      (ROLE standby, in queue order: lease standbys waiting on the server, or any \
                      other client blocked on the key; APPLICATION tells), each with its backend \
                      pid, application_name (`lease:NAME` for `lease run`), client address, \
                      SINCE (the session's backend start: a standby stands by since then; a \
                      holder took the key at or after it, the server records no grant time) and \
                      WAIT START (when a standby's current wait began). --json prints one object \
                      per lease and holder with a `standbys` array. The holder's fencing token \
                      is not shown: the server keeps no record of it. With --shards N, each \
                      NAME is the lease group of `lease run NAME --shards N`: first a line per \
                      member (GROUP, its BACKEND PID, APPLICATION, CLIENT, SINCE and LEADS, the \
                      shards it holds), then the leases NAME/0 to NAME/N-1 as above; --json \
                      adds an object per group with a `members` array. \
                      With --watch, queries again every --interval on one session until Ctrl-C, \
                      a line per lease (holder, HELD SINCE as this watch saw it, the standbys' \
                      count and pids): redrawn in place on a terminal, a new table per interval \
                      otherwise. \
                      Exit status 0 when the query ran (with --watch: on Ctrl-C or SIGTERM), \
                      1 when the database could not be queried, 2 for bad usage.",
        after_long_help = CONNECTION_HELP
    )]
    Status(StatusArgs),
    /// Print the 64-bit advisory-lock key of a lease name
    #[command(
        long_about = "Print the 64-bit advisory-lock key of a lease name: the same key \
                      `lease run` and the lease libraries lock, for use with \
                      pg_advisory_lock(bigint) or pg_locks. No database is contacted."
    )]
    Key(KeyArgs),
    /// Hand a lease over to a named standby
    #[command(
        long_about = "Hand lease NAME over to the standby whose lease session is backend PID \
                      (the BACKEND PID column of `lease status NAME`): the holder stops its \
                      command as on SIGTERM (the full --grace), releases the lease, and no \
                      other replica tries it for two of their query timeouts after the \
                      release, so the named standby takes it at once. The holder does so only \
                      once it sees PID wait for NAME on the server (a standby crowded out of \
                      the queue queues when it hears the request); PID that is not even a \
                      session of the database is refused here, and nothing is sent. Waits \
                      until PID holds NAME. Exit status 0 when it does, 1 when PID is no \
                      session of the database, when it did not take NAME within --timeout (the \
                      holder kept leading) or the database could not be queried, 2 for bad \
                      usage.",
        after_long_help = CONNECTION_HELP
    )]
    Handover(HandoverArgs),
    /// A schedule's next due times, and its state table (`lease run --every`/`--cron`)
    #[command(subcommand)]
    Schedule(ScheduleCmd),
    /// From inside COMMAND of `lease run`: is its lease valid now, and until when
    #[command(
        long_about = "From inside COMMAND of `lease run`: ask the runner whether the lease \
                      COMMAND runs under is valid now, and until when. Connects to the runner's \
                      Unix socket named by $LEASE_SOCKET (set for COMMAND and everything it \
                      starts) and prints its one-line answer: `valid remaining_ms=MS \
                      until_monotonic_ns=NS token=TOKEN` (NS on CLOCK_MONOTONIC, system-wide) \
                      or `invalid reason=...`. Takes a few milliseconds, no database contact. \
                      Ask before each side effect that must not overlap another replica's, and \
                      act only on exit status 0; the fencing token ($LEASE_TOKEN) remains the \
                      protection for what a pause after the answer may let through. \
                      Exit status 0 valid, 1 not valid (lost, expired, or stopping), 2 for an \
                      error (no $LEASE_SOCKET, no answer within --timeout: a frozen runner)."
    )]
    Valid(ValidArgs),
}

/// How to reach the database; shared by every subcommand that connects.
#[derive(Debug, Args, Clone, Default)]
pub struct ConnArgs {
    /// PostgreSQL connection: a URL or a key=value string [default: $DATABASE_URL, else PG*]
    ///
    /// A URL (postgres://user:password@host:port/dbname) or a key=value string ("host=db1
    /// user=app dbname=app sslmode=verify-full sslrootcert=ca.pem"); default $DATABASE_URL,
    /// else the libpq environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGPASSFILE/~/.pgpass,
    /// PGDATABASE, PGAPPNAME, PGSSLMODE, PGSSLROOTCERT, PGSSLCERT, PGSSLKEY, ...), which also
    /// fills in what the string leaves out. TLS: rustls, libpq's sslmode (disable to
    /// verify-full).
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
}

/// Options of `lease run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lease name: every replica of one job uses the same name
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The command to run while leading, after `--`, and its arguments (executed directly, no
    /// shell)
    #[arg(
        value_name = "COMMAND",
        last = true,
        required = true,
        num_args = 1..,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,

    #[command(flatten)]
    pub conn: ConnArgs,

    /// Who this replica is, in `lease status`, the logs and the server's
    /// pg_stat_activity: the session's application_name becomes `lease:NAME@ID`
    /// [default: $POD_NAME, else the host name]
    ///
    /// Cut to fit the server's 63 bytes (the lease name is kept whole). Not used when the
    /// connection sets application_name itself (PGAPPNAME, or in the URL).
    #[arg(long, value_name = "ID")]
    pub identity: Option<String>,

    /// How often a standby tries the lease
    ///
    /// Jittered down by up to 20%. Bounds takeover when no handover notification arrives
    /// (the holder crashed, froze or was partitioned), and caps the reconnect backoff.
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_RETRY_INTERVAL),
          value_parser = parse_duration)]
    pub retry_interval: Duration,

    /// How often the holder verifies that its session still holds the lease
    ///
    /// The check proves the session is the same live one (backend pid and session nonce): a
    /// live session keeps its advisory locks. It also keeps the session from looking idle to
    /// the server guard; a runner holding nothing sends only its tries.
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_HEARTBEAT_INTERVAL),
          value_parser = parse_duration)]
    pub heartbeat_interval: Duration,

    /// How long one statement (or connecting) may take
    ///
    /// A statement past it closes the session, which loses the lease: keep it well above the
    /// worst round trip of a healthy server and a busy host. The lease is valid
    /// heartbeat-interval + query-timeout past its last confirmation; COMMAND is stopped when
    /// it could not be confirmed by then.
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_QUERY_TIMEOUT),
          value_parser = parse_duration)]
    pub query_timeout: Duration,

    /// How long COMMAND's tree may take to exit after SIGTERM before SIGKILL [default: 10s]
    ///
    /// In full for graceful stops (a signal to `lease run`, leftovers after COMMAND exited):
    /// the lease is held until the tree is gone. After a lost lease, SIGKILL comes at the
    /// kill deadline if that is sooner (just before the server may hand the lease over; the
    /// guard margin less the drift allowance after the validity ended, at the least): a --grace
    /// given here that is longer than that gets a warning at startup (the default does not:
    /// it is meant for graceful stops); after the session ended, half of --lock-delay after
    /// SIGTERM. Make COMMAND exit promptly on SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub grace: Option<Duration>,

    /// How much longer than the lease validity the server waits before freeing the lease of
    /// a silent holder [default: 1s, or validity / 50 if larger]
    ///
    /// The server ends the session of a frozen or partitioned holder (idle_session_timeout)
    /// heartbeat-interval + query-timeout + guard-margin after its last statement, and COMMAND
    /// gets SIGKILL then at the latest. Longer: more room for COMMAND to stop after SIGTERM on
    /// a lost lease and for clock drift; each extra second delays failover after a partition
    /// or freeze by as much.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub guard_margin: Option<Duration>,

    /// Log only warnings and errors
    #[arg(long, short)]
    pub quiet: bool,

    /// Log format on stderr
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// WEAKER: do not have the server end this session when it goes silent
    ///
    /// Without the server guard (idle_session_timeout), a frozen holder keeps the lease until
    /// it resumes, and a silently partitioned one until TCP keepalives end its session (hours
    /// with Linux defaults), with nobody leading meanwhile. Only for servers that end idle
    /// sessions on their own terms. Allows PostgreSQL 13.
    #[arg(long)]
    pub no_server_guard: bool,

    /// WEAKER: do not notify standbys on a graceful release
    ///
    /// Without the notification (NOTIFY), a standby takes over within one --retry-interval of
    /// a graceful release instead of at once. Not with --shards (a lease group needs it).
    #[arg(long, conflicts_with = "shards")]
    pub no_notify: bool,

    /// How long a standby woken by a freed lease waits before taking it
    ///
    /// A standby waits on the server for the lease and learns the moment it is freed. When
    /// the holder's session was ended by the server (pg_terminate_backend, a reset
    /// connection), the old COMMAND learns at the same moment and may still be stopping: the
    /// new one starts no sooner than this after the lease was freed. A graceful release
    /// (with its notification) is taken at once. Must not exceed --retry-interval.
    ///
    /// It also bounds how long COMMAND gets between SIGTERM and SIGKILL when this runner's own
    /// session ends (half of it): use the same value on every replica (a holder's longer one
    /// is time a standby's shorter one does not wait for).
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_LOCK_DELAY),
          value_parser = parse_duration)]
    pub lock_delay: Duration,

    /// Poll for the lease every --retry-interval instead of waiting on the server
    ///
    /// Waiting on the server takes over within milliseconds of the lease being freed and
    /// costs one statement per --retry-interval, as polling does; turn it off only where a
    /// blocked statement is a problem (a pooler with very few server connections).
    #[arg(long)]
    pub no_wait_on_server: bool,

    /// Never lead: stand by without ever taking the lease, and never run COMMAND
    ///
    /// An observer never tries the lease, never waits for it on the server and never joins
    /// the lease group of --shards (it counts in no share); it reads who holds the lease once
    /// per --retry-interval and logs it, and runs until a signal stops it. For a replica kept
    /// out of leadership (draining, another zone) that still shows in logs and /healthz.
    /// Not with --priority.
    #[arg(long, conflicts_with = "priority")]
    pub observer: bool,

    /// Take the lease over from a holder of a lower priority
    ///
    /// A standby that finds the lease held asks the holder to hand it over; a holder of a
    /// lower --priority does so gracefully (as `lease handover NAME --to PID`: its COMMAND is
    /// stopped, the lease released, and this standby takes it at the release), one of an
    /// equal or higher priority does not. 0 never asks. Not with --shards (the share decides).
    #[arg(long, value_name = "N", default_value_t = 0, conflicts_with = "shards")]
    pub priority: u32,

    /// Run N shards of the job: the leases NAME/0 to NAME/N-1 of the lease group NAME, one
    /// COMMAND per shard this replica leads (1 to 256)
    ///
    /// The rules (the share, LEASE_SHARD and LEASE_SHARDS, moves, the exit status): SHARDS in
    /// `lease run --help`.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=MAX_SHARDS as i64))]
    pub shards: Option<u16>,

    /// Run COMMAND only if the lease is acquired at the first try (or within --wait); exit 3
    /// without running it otherwise, with one line naming the holder
    ///
    /// Won, COMMAND runs once as without --try and `lease run` exits with its status; it never
    /// stands by. An unreachable database exits 1. Not with --shards, --observer or --priority.
    /// The rules and edge cases: TRY in `lease run --help`.
    #[arg(long = "try", id = "try", conflicts_with_all = ["shards", "observer", "priority"])]
    pub try_once: bool,

    /// With --try: wait up to DURATION (from the start of `lease run`) for the lease instead
    /// of giving up at the first try; COMMAND must have started by then
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "try")]
    pub wait: Option<Duration>,

    /// Run COMMAND once per due time, every DURATION on the database server's clock, aligned
    /// to the Unix epoch (`--every 15m`: at :00, :15, :30 and :45 UTC)
    ///
    /// `lease run` then keeps running: the leader runs COMMAND at each due time, with
    /// LEASE_DUE and LEASE_RUN_ID added; COMMAND's exit is logged, it does not end `lease
    /// run`. At least 1s. The rules (overlap, catch-up, a takeover at a due time):
    /// SCHEDULES in `lease run --help`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, group = "schedule",
          conflicts_with_all = ["try", "shards"])]
    pub every: Option<Duration>,

    /// Run COMMAND once per due time of the cron expression EXPR (5 fields: minute hour
    /// day-of-month month day-of-week; or 6, seconds first), in --tz
    ///
    /// As --every otherwise. `lease schedule next --cron EXPR` shows the next due times and
    /// what daylight saving time does to them.
    #[arg(long, value_name = "EXPR", group = "schedule", conflicts_with_all = ["try", "shards"])]
    pub cron: Option<String>,

    /// The IANA time zone of --cron (Europe/Berlin), in the tz database bundled with lease
    /// (never the host's zoneinfo) [default: UTC]
    #[arg(long, value_name = "ZONE", requires = "cron")]
    pub tz: Option<String>,

    /// Start each run up to DURATION after its due time, by a delay fixed per due time (the
    /// same on every replica: a failover never moves a start) [default: none]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "schedule")]
    pub jitter: Option<Duration>,

    /// A due time that comes while the previous run still goes: skip it, queue it (one at
    /// most), or replace the running one (stopped as on SIGTERM, --grace)
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = OverlapArg::Skip,
          requires = "schedule")]
    pub overlap: OverlapArg,

    /// How far back a new leader looks for due times it missed (every replica down, a
    /// deploy, a takeover) [default: none]
    ///
    /// A missed due time in the window may have run on the old leader: a window is
    /// at-least-once for the due times it covers; without one, a due time runs at most once.
    #[arg(long, value_name = "WINDOW", value_parser = parse_duration, requires = "schedule")]
    pub catch_up: Option<Duration>,

    /// Which missed due times in --catch-up run: the latest, all (oldest first, at most 100),
    /// or none [default: latest]
    #[arg(long, value_enum, value_name = "POLICY", requires = "schedule")]
    pub catch_up_policy: Option<CatchUpArg>,

    /// Claim each due time in TABLE before it runs (created by `lease schedule init`): a due
    /// time then starts at most once across failovers, frozen leaders and deploys, and a new
    /// leader runs what nobody ran (--catch-up, default 1h with a table)
    #[arg(long, value_name = "TABLE", requires = "schedule")]
    pub state_table: Option<String>,

    /// With --state-table: a run claimed by a leader that stopped before it finished (a
    /// crash), or whose end could not be recorded, is skipped, or run again by the new leader
    /// (at least once)
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = UnfinishedArg::Skip,
          requires = "state_table")]
    pub unfinished: UnfinishedArg,

    /// Exit 1 when no database session has been ready for DURATION: since the start, or since
    /// the session was last ready [default: retry forever]
    ///
    /// For a caller that must not hang on an unreachable database (cron, CI). The last line
    /// names the last connection error. A leading COMMAND, whose lease went with its session,
    /// is stopped first as on SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub give_up_after: Option<Duration>,

    /// Serve /metrics, /healthz and /leader over HTTP on ADDR (IP:PORT) [default: off]
    ///
    /// GET /metrics: the lease metrics in the Prometheus text format. GET /healthz: 200 while
    /// the database session is ready or has been within --query-timeout + --retry-interval (a
    /// reconnect), 503 with a one-line reason otherwise. GET /leader: 200 only while COMMAND
    /// runs under a lease that is valid right now, 503 otherwise: point a load balancer's
    /// health check at it to reach the leader alone (not a readiness probe: a standby would
    /// never be ready, and a rollout would wait for it); with --shards, GET /leader/I answers so
    /// for shard I, and /leader is 200 while any shard is led. Binds exactly ADDR (no host
    /// names; port 0 picks a free port, logged at startup); served by `lease run` itself, no
    /// thread of its own.
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub metrics_addr: Option<SocketAddr>,
}

/// `lease schedule`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum ScheduleCmd {
    /// Print the next due times of a schedule, in UTC and in its time zone
    #[command(
        long_about = "Print the next due times of a schedule as `lease run --every`/`--cron` \
                      computes them: one line per due time, in UTC and in the schedule's time \
                      zone, with a note where daylight saving time moves or repeats it. With \
                      --name and --jitter, the start of each (the due time plus its fixed \
                      delay). Computed here from this host's clock (`lease run` uses the \
                      database server's); no database is contacted. Exit status 0, 2 for a bad \
                      schedule."
    )]
    Next(NextArgs),
    /// Create the state table of `lease run --state-table`, if it is absent
    #[command(
        long_about = "Create the state table of `lease run --state-table` (one row per \
                      schedule: the last due time claimed, its fencing token, when it started \
                      and finished, its outcome) if no table of that name exists; prints what \
                      it did. `lease schedule ddl` prints the statement instead. Exit status 0, \
                      1 when the database could not be reached or refused, 2 for bad usage.",
        after_long_help = CONNECTION_HELP
    )]
    Init(InitArgs),
    /// Print the statement that creates the state table
    Ddl(DdlArgs),
}

/// Options of `lease schedule init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// The table (TABLE or SCHEMA.TABLE)
    #[arg(long, value_name = "TABLE", default_value = "lease_schedule")]
    pub state_table: String,

    #[command(flatten)]
    pub conn: ConnArgs,

    /// How long connecting and creating may take
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_TIMEOUT),
          value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Options of `lease schedule ddl`.
#[derive(Debug, Args)]
pub struct DdlArgs {
    /// The table (TABLE or SCHEMA.TABLE)
    #[arg(long, value_name = "TABLE", default_value = "lease_schedule")]
    pub state_table: String,
}

/// Options of `lease schedule next`.
#[derive(Debug, Args)]
pub struct NextArgs {
    /// A fixed period, aligned to the Unix epoch (as `lease run --every`)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, group = "spec",
          required_unless_present = "cron")]
    pub every: Option<Duration>,

    /// A cron expression (as `lease run --cron`)
    #[arg(long, value_name = "EXPR", group = "spec")]
    pub cron: Option<String>,

    /// The IANA time zone of --cron, in the tz database bundled with lease [default: UTC]
    #[arg(long, value_name = "ZONE", requires = "cron")]
    pub tz: Option<String>,

    /// How many due times
    #[arg(short = 'n', long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub count: u32,

    /// With --jitter: the lease name, which fixes each due time's delay
    #[arg(long, value_name = "NAME", requires = "jitter")]
    pub name: Option<String>,

    /// As `lease run --jitter`: show each start too
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "name")]
    pub jitter: Option<Duration>,

    /// From this time (RFC 3339, `2026-10-24T12:00:00Z`) instead of now
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
}

/// `lease run --overlap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OverlapArg {
    Skip,
    Queue,
    Replace,
}

/// `lease run --unfinished`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UnfinishedArg {
    Skip,
    Retry,
}

/// `lease run --catch-up-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CatchUpArg {
    Latest,
    All,
    None,
}

/// Options of `lease status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Lease names to show (default: every advisory bigint key held or waited for in this
    /// database)
    #[arg(value_name = "NAME")]
    pub names: Vec<String>,

    /// One JSON object per line instead of a table
    #[arg(long)]
    pub json: bool,

    /// How long connecting and querying may take
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_TIMEOUT),
          value_parser = parse_duration)]
    pub timeout: Duration,

    /// Query again every --interval and redraw the table until Ctrl-C
    ///
    /// One line per lease: NAME, KEY, HELD, the holder's PID, APPLICATION and CLIENT, HELD SINCE
    /// (the time of the first refresh that showed this holder: it took the key after the
    /// refresh before; `before T` when it already held at the first refresh T) and STANDBYS (how many
    /// sessions wait for the key on the server, and their pids). On a terminal the table is
    /// redrawn in place; otherwise (a pipe, a file) a new table, headed by its time, is printed
    /// each interval. The queries share one session; a failed query is retried on a new one at
    /// once, then reported and retried at the next interval. JSON lines are those of a single
    /// query.
    #[arg(long, short)]
    pub watch: bool,

    /// How often --watch queries
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_WATCH_INTERVAL), value_parser = parse_duration,
          requires = "watch")]
    pub interval: Duration,

    /// Show each NAME as the group of `lease run NAME --shards N`: its members (a line each:
    /// backend pid, application, client, the shards it leads), then the leases NAME/0 to
    /// NAME/N-1
    #[arg(long, value_name = "N", requires = "names",
          value_parser = clap::value_parser!(u16).range(1..=MAX_SHARDS as i64))]
    pub shards: Option<u16>,

    /// Also show each schedule's last run from the state table TABLE of `lease run
    /// --state-table` (its due time, outcome, start and end) and its next due time
    #[arg(long, value_name = "TABLE", conflicts_with = "watch")]
    pub state_table: Option<String>,

    #[command(flatten)]
    pub conn: ConnArgs,
}

/// Options of `lease valid`.
#[derive(Debug, Args)]
pub struct ValidArgs {
    /// The runner's socket [default: $LEASE_SOCKET]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<std::path::PathBuf>,

    /// How long connecting to the runner and waiting for its answer may take
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_VALID_TIMEOUT),
          value_parser = parse_duration)]
    pub timeout: Duration,

    /// Print nothing; only the exit status tells
    #[arg(long, short)]
    pub quiet: bool,
}

/// Options of `lease handover`.
#[derive(Debug, Args)]
pub struct HandoverArgs {
    /// The lease name
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The backend pid of the standby's lease session (`lease status NAME`)
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
    pub to: i32,

    /// How long to wait for the named standby to hold the lease
    #[arg(long, value_name = "DURATION", default_value = text(DEFAULT_TIMEOUT),
          value_parser = parse_duration)]
    pub timeout: Duration,

    #[command(flatten)]
    pub conn: ConnArgs,
}

/// Options of `lease key`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The lease name
    #[arg(value_name = "NAME")]
    pub name: String,
}

/// How log lines look on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines
    Text,
    /// One JSON object per line
    Json,
}

/// The leases of `--shards n`: `NAME/0` to `NAME/n-1` ([`LeaseId::shard`]),
/// in the group `NAME`.
pub fn shard_leases(name: &str, n: u16) -> Result<Vec<LeaseId>, String> {
    let group = GroupId::named(name).map_err(|e| e.to_string())?;
    (0..n)
        .map(|i| {
            LeaseId::shard(&group, u32::from(i)).map_err(|e| format!("shard {i} of {name:?}: {e}"))
        })
        .collect()
}

/// The lease NAME names for `lease key` and `lease status`: shard I of the
/// group GROUP when NAME is `GROUP/I` as `--shards` writes it (I in decimal,
/// no leading zero; [`LeaseId::shard`]), so that a shard can be looked up
/// by its name; otherwise the plain lease NAME ([`LeaseId::named`], which
/// refuses any other name ending in `/` and digits). `lease run` and `lease
/// handover` take plain names only.
///
/// # Errors
/// The [`NameError`] of the group's or the lease's name.
pub fn lease_or_shard(name: &str) -> Result<LeaseId, NameError> {
    if let Some((group, index)) = name.rsplit_once('/') {
        let canonical = (index.parse::<u32>().ok()).filter(|i| i.to_string() == index);
        if let Some(i) = canonical {
            return LeaseId::shard(&GroupId::named(group)?, i);
        }
    }
    LeaseId::named(name)
}

/// Parses `--metrics-addr`: an IP address and a port (`127.0.0.1:9187`,
/// `[::]:9187`, `0.0.0.0:9187`); no host name is resolved, so the endpoint
/// binds exactly where it is told.
///
/// # Errors
/// A one-line message.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.trim().parse::<SocketAddr>().map_err(|_| {
        format!(
            "--metrics-addr {s:?}: expected IP:PORT, such as 127.0.0.1:9187 or [::]:9187 (no host \
             names)"
        )
    })
}

/// [`parse_duration`], more than zero.
///
/// # Errors
/// A one-line message.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        Duration::ZERO => Err("must be more than 0".to_owned()),
        d => Ok(d),
    }
}

/// Parses a humantime duration (`200ms`, `5s`, `1m 30s`).
///
/// # Errors
/// A one-line message for anything else.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    /// Far above any sensible value, far below where sums could overflow.
    const MAX: Duration = Duration::from_secs(365 * 86_400);
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (expected a duration such as 200ms, 5s or 1m)"))?;
    if d > MAX {
        return Err("longer than a year".to_owned());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The defaults `--help` states by hand (those of options without a clap
    /// default) are the constants the code uses.
    #[test]
    fn stated_defaults_are_the_constants() {
        let help = Cli::command()
            .find_subcommand_mut("run")
            .expect("run")
            .render_long_help()
            .to_string();
        let grace = format!("SIGTERM before SIGKILL [default: {}]", text(DEFAULT_GRACE));
        assert!(help.contains(&grace), "{help}");
        let margin = format!(
            "[default: {}, or validity / 50",
            text(lease_proto::limits::DEFAULT_GUARD_MARGIN)
        );
        assert!(help.contains(&margin), "{help}");
    }

    #[test]
    fn addresses_parse_exactly() {
        assert_eq!(
            parse_addr("127.0.0.1:9187"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 9187)))
        );
        assert!(parse_addr("[::1]:9187").is_ok());
        assert!(parse_addr("localhost:9187").is_err());
        assert!(parse_addr("127.0.0.1").is_err());
        assert!(parse_addr(":9187").is_err());
    }

    /// `lease key` and `lease status` look a shard up by its name, with the
    /// key `--shards` gives it; a shard form `--shards` never writes is
    /// refused, as is any plain lease name of that form.
    #[test]
    fn shards_are_looked_up_by_their_names() {
        let key = |name: &str| lease_or_shard(name).map(|l| l.key());
        assert_eq!(key("NAME/0"), Ok(lease_proto::key_for_name("NAME/0")));
        assert_eq!(key("NAME/3"), Ok(shard_leases("NAME", 4).unwrap()[3].key()));
        assert_eq!(key("NAME/007"), Err(NameError::ShardForm));
        assert_eq!(key("NAME/+7"), Ok(lease_proto::key_for_name("NAME/+7")));
        assert_eq!(key("NAME/x"), Ok(lease_proto::key_for_name("NAME/x")));
        assert_eq!(key("a/1/2"), Err(NameError::ShardForm));
    }

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("5parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("400years").is_err());
    }

    #[test]
    fn run_needs_the_separator() {
        let ok = Cli::try_parse_from(["lease", "run", "job", "--", "echo", "-n", "hi"]);
        let Ok(Cli {
            command: Cmd::Run(run),
        }) = ok
        else {
            panic!("parse failed: {ok:?}");
        };
        assert_eq!(run.name, "job");
        assert_eq!(run.command, ["echo", "-n", "hi"]);
        assert!(Cli::try_parse_from(["lease", "run", "job", "echo"]).is_err());
        assert!(Cli::try_parse_from(["lease", "run", "job", "--"]).is_err());
        assert!(Cli::try_parse_from(["lease", "run", "job"]).is_err());
    }

    /// `--grace` has no clap default (a given one is told apart from the
    /// default, which never warns): its help states [`DEFAULT_GRACE`].
    #[test]
    fn the_grace_help_states_the_default() {
        let mut cmd = Cli::command();
        let run = cmd.find_subcommand_mut("run").expect("run");
        let grace = (run.get_arguments())
            .find(|a| a.get_id() == "grace")
            .expect("--grace");
        let help = grace.get_help().expect("help").to_string();
        let default = humantime::format_duration(DEFAULT_GRACE).to_string();
        assert!(help.contains(&format!("[default: {default}]")), "{help}");
    }
}
