//! What the `lease` command tests share: the binary with a clean environment, a shared
//! ephemeral server, unique lease names, the fast intervals, `lease run` of a shell script,
//! its output, stamp directories and small parsers.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lease_tests::{pid_alive, Cluster, Replica, Stream};

/// Every variable `lease` reads that the machine running the tests might
/// have set: libpq's, `DATABASE_URL` and `LEASE_LOG`.
pub const ENVIRONMENT: [&str; 18] = [
    "DATABASE_URL",
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGDATABASE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGSSLCERT",
    "PGSSLKEY",
    "PGPASSFILE",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
    "PGTARGETSESSIONATTRS",
    "PGHOSTADDR",
    "PGOPTIONS",
    "LEASE_LOG",
    "POD_NAME",
];

/// `lease` with a clean environment (none of [`ENVIRONMENT`] inherited).
pub fn lease() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    for var in ENVIRONMENT {
        cmd.env_remove(var);
    }
    cmd
}

/// The application_name `lease run NAME` gives its session here: `lease:NAME@HOST`
/// (the default `--identity`, the host name: [`ENVIRONMENT`] clears `POD_NAME`).
pub fn app(name: &str) -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(rc, 0, "gethostname");
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let host = String::from_utf8_lossy(&buf[..end]).into_owned();
    lease_proto::inspect::lease_application_name_of(name, Some(&host))
}

/// One server shared by the tests that run at the same time;
/// stopped when the last of them is done.
pub fn cluster() -> Arc<Cluster> {
    static SHARED: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = shared.upgrade() {
        return c;
    }
    let c = Arc::new(Cluster::start().expect("start an ephemeral PostgreSQL"));
    *shared = Arc::downgrade(&c);
    c
}

/// A lease name no other test (or earlier run) uses.
pub fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{name}-{}-{nanos}", std::process::id())
}

pub const MS: fn(u64) -> Duration = Duration::from_millis;

/// Fast lease intervals for the tests (the first six leave `--grace` at its default).
pub const FAST: [&str; 8] = [
    "--retry-interval",
    "50ms",
    "--heartbeat-interval",
    "100ms",
    "--query-timeout",
    "1s",
    "--grace",
    "300ms",
];

/// [`FAST`] less the options that `extra` sets, then `extra`.
pub fn fast_and<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let fast = FAST
        .chunks(2)
        .filter(|kv| !extra.contains(&kv[0]))
        .flatten();
    fast.copied().chain(extra.iter().copied()).collect()
}

/// `CMD run --database-url URL ARGS... NAME -- sh -c SCRIPT`.
pub fn run_sh_with(
    mut cmd: Command,
    url: &str,
    args: &[&str],
    name: &str,
    script: &str,
) -> Command {
    cmd.arg("run")
        .args(["--database-url", url])
        .args(args)
        .arg(name)
        .args(["--", "sh", "-c", script]);
    cmd
}

/// `lease run --database-url URL ARGS... NAME -- sh -c SCRIPT`.
pub fn run_sh(url: &str, args: &[&str], name: &str, script: &str) -> Command {
    run_sh_with(lease(), url, args, name, script)
}

/// `lease run --database-url <cluster> FAST... extra... NAME -- sh -c SCRIPT`.
pub fn fast_sh(c: &Cluster, name: &str, extra: &[&str], script: &str) -> Command {
    run_sh(&c.url("postgres"), &fast_and(extra), name, script)
}

/// A replica's stdout and stderr, a line each.
pub fn texts(r: &Replica) -> (String, String) {
    let mut out = String::new();
    let mut err = String::new();
    for l in r.lines() {
        let s = if l.stream == Stream::Stdout {
            &mut out
        } else {
            &mut err
        };
        s.push_str(&l.text);
        s.push('\n');
    }
    (out, err)
}

/// Runs `cmd` for at most `limit`: its status (`None`: still running), stdout, stderr, time.
pub fn try_output(cmd: Command, limit: Duration) -> (Option<ExitStatus>, String, String, Duration) {
    let start = Instant::now();
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    let status = r.wait_exit(limit).ok();
    let elapsed = start.elapsed();
    // The output pipes close right after the exit; give the readers a moment.
    let _ = r.wait_for_line(|_| false, MS(200));
    let (out, err) = texts(&r);
    (status, out, err, elapsed)
}

/// Runs `cmd` to completion (at most `limit`): status, stdout, stderr, time.
pub fn output(cmd: Command, limit: Duration) -> (ExitStatus, String, String, Duration) {
    let (status, out, err, elapsed) = try_output(cmd, limit);
    (status.expect("lease exits"), out, err, elapsed)
}

/// Every stderr line of a replica, for failure messages.
pub fn stderr_of(r: &Replica) -> String {
    r.lines()
        .iter()
        .filter(|l| l.stream == Stream::Stderr)
        .map(|l| l.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of `key=` in a line of `key=value` words.
pub fn field(line: &str, key: &str) -> Option<i64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Waits until `pid` is gone; returns when that was seen.
pub fn gone_at(pid: i32, limit: Duration) -> Option<Instant> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !pid_alive(pid) {
            return Some(Instant::now());
        }
        std::thread::sleep(MS(1));
    }
    None
}

/// Waits until `pid` is gone; whether it went within `limit`.
pub fn wait_gone(pid: i32, limit: Duration) -> bool {
    gone_at(pid, limit).is_some()
}

/// A fresh directory for stamp files; removed on drop.
pub struct Dir(PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let path = std::env::temp_dir().join(unique(name));
        fs::create_dir(&path).expect("create a temporary directory");
        Dir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `exit status: N`, `signal: S`, or `still running` for messages.
pub fn exit_text(status: Option<ExitStatus>) -> String {
    status.map_or_else(|| "still running".to_owned(), |s| s.to_string())
}

/// Waits for the `pid=... token=...` line of the command: (pid, token).
pub fn started(r: &Replica, limit: Duration) -> Result<(i32, i64), String> {
    r.wait_for_line(|l| l.starts_with("pid="), limit)
        .map(|(_, l)| {
            (
                field(&l, "pid").unwrap_or(0) as i32,
                field(&l, "token").unwrap_or(0),
            )
        })
        .map_err(|e| e.to_string())
}

/// The stamps in `file`, in nanoseconds since the epoch.
pub fn stamps(file: &Path) -> Vec<u128> {
    fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (s, ns) = l.trim().split_once('.')?;
            Some(s.parse::<u128>().ok()? * 1_000_000_000 + ns.parse::<u128>().ok()?)
        })
        .collect()
}

/// A command that prints `pid=$$ token=$LEASE_TOKEN`, then stamps `file`
/// every 50 ms; with `ignore_term` it (and everything it starts) ignores
/// SIGTERM.
pub fn stamper(file: &Path, ignore_term: bool) -> String {
    let trap = if ignore_term { r#"trap "" TERM; "# } else { "" };
    format!(
        r#"echo "pid=$$ token=$LEASE_TOKEN"; {trap}while :; do date +%s.%N >> {}; sleep 0.05; done"#,
        file.display()
    )
}

/// Signed milliseconds from `a` to `b` (nanosecond stamps).
pub fn ms_between(a: u128, b: u128) -> f64 {
    (b as f64 - a as f64) / 1e6
}

pub fn last_stderr_line(r: &Replica) -> String {
    r.lines()
        .iter()
        .rev()
        .find(|l| l.stream == Stream::Stderr && !l.text.trim().is_empty())
        .map_or_else(String::new, |l| l.text.clone())
}

pub fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Waits until `file` has a stamp; returns the first one.
pub fn first_stamp(file: &Path, limit: Duration) -> Option<u128> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(&t) = stamps(file).first() {
            return Some(t);
        }
        std::thread::sleep(MS(5));
    }
    None
}

pub fn held(c: &Cluster, key: i64) -> bool {
    c.held_advisory_keys()
        .expect("query pg_locks")
        .iter()
        .any(|&(k, _)| k == key)
}

/// Short intervals for the failover tests, with the default `--grace` (10 s):
/// validity 700 ms, guard (`idle_session_timeout`) 1 s.
pub const SHORT: [&str; 8] = [
    "--retry-interval",
    "100ms",
    "--heartbeat-interval",
    "200ms",
    "--query-timeout",
    "500ms",
    "--guard-margin",
    "300ms",
];

/// Each command's stamps (nanoseconds since the epoch) by its pid.
pub fn intervals(dir: &Path) -> BTreeMap<i32, (u128, u128)> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let stamps: Vec<u128> = fs::read_to_string(entry.path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if let (Some(&first), Some(&last)) = (stamps.first(), stamps.last()) {
            out.insert(pid, (first, last));
        }
    }
    out
}

/// The longest time (ms) two commands' intervals overlapped (negative: the
/// smallest gap between one's last and the next one's first stamp), with the
/// pair.
pub fn worst_overlap(dir: &Path) -> Option<(f64, i32, i32)> {
    let all: Vec<(i32, (u128, u128))> = intervals(dir).into_iter().collect();
    let mut worst: Option<(f64, i32, i32)> = None;
    for (i, &(p, (f1, l1))) in all.iter().enumerate() {
        for &(q, (f2, l2)) in &all[i + 1..] {
            let overlap = (l1.min(l2) as f64 - f1.max(f2) as f64) / 1e6;
            if worst.is_none_or(|(w, _, _)| overlap > w) {
                worst = Some((overlap, p, q));
            }
        }
    }
    worst
}
