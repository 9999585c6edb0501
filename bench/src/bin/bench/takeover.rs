//! Instant takeover (waiting on the server): how soon a standby that waits on the server leads after
//! its holder dies, a herd of standbys on one key, and the lock-delay's effect on the
//! overlap when the server ends the holder's session.
//!
//! Every repetition has a lease name of its own and fresh processes, at the bench's
//! intervals (without `--quick`: the library defaults) and the library's default design
//! (server guard, NOTIFY handover, waiting on the server); the fault falls a random
//! fraction of min(retry interval, 1 s) after the standby (or the whole herd) stands by.
//! The cells of one part run round-robin, repetition by repetition, so that a change of
//! the machine's load spreads over all of them.
//! - **kill**: [`Bench::rep`] of [`Scenario::Kill`] between two `replica` processes at
//!   the default lock-delay, per driver: SIGKILL of the holder → the standby's job
//!   started.
//! - **herd**: a holder and ten standbys on one key, SIGKILL of the holder: the first
//!   start, how many standbys led (one is right), and the statements the standbys sent
//!   in the second after the kill, counted in the server log (`log_statement = all` and
//!   `log_min_duration_statement = 0` for this part: each statement's start and end; the
//!   log line prefix names each session's `application_name`), and where the first
//!   start's time went (the holder's backend gone, the first try sent, the winning
//!   statement answered: a take, or a try).
//! - **lock-delay**: [`Bench::rep`] of [`Scenario::Terminate`] (`pg_terminate_backend`
//!   of the holder's backend) for each of [`LOCK_DELAYS`], between two `replica`
//!   processes of each driver (a cooperative job: it returns when cancelled) and between
//!   two `lease run` processes whose child is [`stamp_child`] (it exits on SIGTERM at
//!   once). Measured: fault → first start, who started first (the old holder
//!   reconnecting, or the standby), fault → the old job's end, and, when the standby
//!   came first, the old job's end − the new job's start (positive: both ran at once).

use crate::duel::Scenario;
use crate::duel::{first_start, Bench, Contender, Rep};
use crate::{failed, Design, Plan, DRIVERS, FAILOVER_DB, R};
use lease_tests::monotonic_nanos;
use lease_tests::scenario::{Driver, Node};
use std::io::Write as _;
use std::process::ExitCode;
use std::thread::sleep;
use std::time::Duration;

/// The lock-delays compared (20 ms is [`lease_proto::limits::DEFAULT_LOCK_DELAY`]).
pub const LOCK_DELAYS: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(5),
    Duration::from_millis(20),
];

/// Standbys in the herd by default (`--herd N`).
pub const HERD: usize = 10;

/// The `pg_terminate_backend` repetitions of one lock-delay and contender.
#[derive(Clone, Debug)]
pub struct DelayCell {
    pub lock_delay: Duration,
    pub who: Contender,
    pub reps: Vec<Rep>,
}

/// One herd repetition.
#[derive(Clone, Debug)]
pub struct HerdRep {
    /// SIGKILL of the holder → the first standby's job start; `None`: none in the window.
    pub first_ns: Option<u64>,
    /// Standbys that started a job after the kill (by the end of the second after it).
    pub leaders: usize,
    /// Backends holding the key at the end of that second.
    pub holders: usize,
    /// Requests for the key waiting (`pg_locks.granted = false`) just before the kill.
    pub waiting_at_kill: usize,
    /// Requests for the key waiting at the end of the second after the kill.
    pub waiting: usize,
    /// Statements the standbys sent in the second after the kill (the holder is dead).
    pub statements: usize,
    /// Statements the holder and the standbys sent in the second before the kill.
    pub statements_before: usize,
    /// The kill and the second after it fell between two rounds of the pollers'
    /// periodic tries.
    pub between_rounds: bool,
    /// The kill → the holder's backend logged its disconnection, in ms (server log).
    pub gone_ms: Option<f64>,
    /// The kill → the first try a standby sent, in ms (server log).
    pub first_try_ms: Option<f64>,
    /// The kill → the end of the statement that won the key (the first statement end, in
    /// the second after the kill, of the backend holding the key at its end: its take, sent
    /// before the kill, or a try), in ms (server log): the lock delay and the job's start
    /// follow.
    pub won_ms: Option<f64>,
    /// The winner's statement was a take (a wait that takes its key), not a try.
    pub won_by_take: Option<bool>,
}

/// Everything this phase measured.
#[derive(Clone, Debug, Default)]
pub struct Takeover {
    /// Per driver: SIGKILL of the holder → the standby's job start.
    pub kill: Vec<(Driver, Vec<Rep>)>,
    /// Per driver: the herd.
    pub herd: Vec<(Driver, Vec<HerdRep>)>,
    /// Standbys in the herd.
    pub herd_size: usize,
    pub delay: Vec<DelayCell>,
}

/// The default design with a lock-delay of `lock_delay` (`None`: the default).
fn library(driver: Driver, lock_delay: Option<Duration>) -> Contender {
    Contender::Replica {
        driver,
        design: Design::Default,
        lock_delay,
    }
}

pub fn run_all(bench: &mut Bench, plan: &Plan) -> R<Takeover> {
    let phase = bench.iv.retry.min(Duration::from_secs(1));
    let mut out = Takeover::default();

    eprintln!(
        "bench: takeover: kill -9 of the holder, {} reps",
        plan.takeover_reps
    );
    out.kill = DRIVERS.iter().map(|&d| (d, Vec::new())).collect();
    for i in 0..plan.takeover_reps {
        for (driver, reps) in &mut out.kill {
            let lease = format!("takeover-kill-{}-{i}", driver.name());
            let who = library(*driver, None);
            reps.push(bench.rep(Scenario::Kill, who, &lease, phase)?);
        }
    }
    for (driver, reps) in &out.kill {
        eprintln!(
            "bench: takeover kill {:<5} gaps ms [{}]",
            driver.name(),
            gaps(reps)
        );
    }

    out.herd_size = plan.herd;
    eprintln!(
        "bench: takeover: a herd of {}, {} reps",
        plan.herd, plan.herd_reps
    );
    set_log_statement(bench, "all")?;
    out.herd = DRIVERS.iter().map(|&d| (d, Vec::new())).collect();
    for i in 0..plan.herd_reps {
        for (driver, reps) in &mut out.herd {
            let lease = format!("takeover-herd-{}-{i}", driver.name());
            reps.push(herd_rep(bench, *driver, &lease, plan.herd, phase)?);
        }
    }
    set_log_statement(bench, "none")?;

    eprintln!(
        "bench: takeover: pg_terminate_backend at lock-delays {:?}, {} reps",
        LOCK_DELAYS, plan.delay_reps
    );
    for lock_delay in LOCK_DELAYS {
        let kinds = DRIVERS.map(|d| library(d, Some(lock_delay)));
        for who in kinds.into_iter().chain([Contender::Cli { lock_delay }]) {
            out.delay.push(DelayCell {
                lock_delay,
                who,
                reps: Vec::new(),
            });
        }
    }
    for i in 0..plan.delay_reps {
        for (c, cell) in out.delay.iter_mut().enumerate() {
            let lease = format!(
                "takeover-delay-{}-{}ms-{c}-{i}",
                cell.who.name().replace(' ', "-"),
                cell.lock_delay.as_millis()
            );
            cell.reps
                .push(bench.rep(Scenario::Terminate, cell.who, &lease, phase)?);
        }
    }
    for cell in &out.delay {
        eprintln!(
            "bench: takeover terminate {:<9} lock-delay {:>2} ms gaps ms [{}]",
            cell.who.name(),
            cell.lock_delay.as_millis(),
            gaps(&cell.reps)
        );
    }
    Ok(out)
}

/// The gaps of `reps` in ms, for the progress lines.
fn gaps(reps: &[Rep]) -> String {
    let text: Vec<String> = (reps.iter())
        .map(|r| {
            r.gap_ns
                .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6))
        })
        .collect();
    text.join(" ")
}

/// `log_statement`, `log_disconnections` and (every statement's end, or none)
/// `log_min_duration_statement` server-wide (the ephemeral server only), the log's times
/// in UTC.
fn set_log_statement(bench: &Bench, value: &str) -> R<()> {
    let cluster = &bench.cluster;
    let (disconnections, durations) = if value == "none" {
        ("off", -1)
    } else {
        ("on", 0)
    };
    cluster
        .sql(&format!("ALTER SYSTEM SET log_statement = '{value}'"))
        .and_then(|_| {
            cluster.sql(&format!(
                "ALTER SYSTEM SET log_disconnections = {disconnections}"
            ))
        })
        .and_then(|_| {
            cluster.sql(&format!(
                "ALTER SYSTEM SET log_min_duration_statement = {durations}"
            ))
        })
        .and_then(|_| cluster.sql("ALTER SYSTEM SET log_timezone = 'UTC'"))
        .and_then(|_| cluster.sql("SELECT pg_reload_conf()"))
        .map(drop)
        .map_err(|e| format!("setting log_statement = {value}: {e}"))
}

/// Where a herd's first start went, in ms after the kill (the log's resolution: 1 ms).
struct HerdTimes {
    /// → the holder's backend logged its disconnection (it had released its locks).
    gone: Option<f64>,
    /// → the first try a standby sent.
    first_try: Option<f64>,
    /// → the end of the winner's first statement after the kill (the one that won).
    won: Option<f64>,
    /// Whether that statement was a take (no try of the winner's before its end).
    won_by_take: Option<bool>,
}

/// From the server log after the herd's kill (`log`, lines of the herd's sessions marked
/// by `mark`; the kill at `wall0`, ms since midnight UTC; `winner`: the backend that holds
/// the key at the end), [`HerdTimes`].
fn herd_log_times(log: Option<&[u8]>, mark: &str, wall0: f64, winner: Option<i64>) -> HerdTimes {
    let app = mark.split(" LOG:").next().unwrap_or(mark);
    let text = String::from_utf8_lossy(log.unwrap_or_default());
    let at = |line: &str| {
        // `2026-12-03 08:23:42.789 UTC [pid] app LOG:  ...`
        let ms = crate::line_seconds_of_day(line, 11..23)? * 1000.0 - wall0;
        Some(if ms < -43_200_000.0 {
            ms + 86_400_000.0
        } else {
            ms
        })
    };
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(app)).collect();
    let gone = (lines.iter())
        .find(|l| l.contains("LOG:  disconnection:"))
        .and_then(|l| at(l));
    let is_try = |l: &&&str| l.contains(mark) && l.contains("pg_try_advisory_lock(");
    let first_try = lines.iter().find(is_try).and_then(|l| at(l));
    // The winner's lines (`... UTC [pid] app LOG: ...`): its first statement end after the
    // kill (`log_statement` logged its text, so its duration line has none), the one that
    // won: its take, queued before the kill and granted at it, or a try it sent after
    // (a try that failed logs an error instead, and has no end here).
    let won = winner.and_then(|pid| {
        let tag = format!(" [{pid}] ");
        let own: Vec<&&str> = lines.iter().filter(|l| l.contains(&tag)).collect();
        // The log's times are whole milliseconds, truncated: a line of the kill's own
        // millisecond reads up to 1 ms before it.
        let end = (own.iter())
            .position(|l| l.contains("LOG:  duration: ") && at(l).is_some_and(|t| t > -1.0))?;
        let by_take = !own[..end].iter().any(is_try);
        Some((at(own[end])?, by_take))
    });
    HerdTimes {
        gone,
        first_try,
        won: won.map(|(t, _)| t),
        won_by_take: won.map(|(_, take)| take),
    }
}

/// The backend that holds `lease`'s key exclusively, if one does (granted: a standby's
/// take waits for it in the same mode).
fn key_holder(bench: &Bench, lease: &str) -> R<Option<i64>> {
    let pid = key_locks(
        bench,
        lease,
        "coalesce(min(pid), 0)",
        "granted AND mode = 'ExclusiveLock'",
    )?;
    Ok((pid != 0).then_some(pid))
}

/// `pg_locks` rows of `lease`'s key, granted or waiting.
fn key_rows(bench: &Bench, lease: &str, granted: bool) -> R<usize> {
    let n = key_locks(bench, lease, "count(*)", &format!("granted = {granted}"))?;
    Ok(n as usize)
}

/// `what` (an aggregate) over the `pg_locks` rows of `lease`'s key that match `filter`.
fn key_locks(bench: &Bench, lease: &str, what: &str, filter: &str) -> R<i64> {
    let sql = format!(
        "SELECT {what} FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
         AND {filter} AND {} = {}",
        lease_proto::server::ADVISORY_KEY_SQL,
        lease_proto::key_for_name(lease)
    );
    let v = bench.admin.one(&sql)?;
    v.parse().map_err(|_| format!("{what} gave {v:?}"))
}

fn herd_rep(
    bench: &mut Bench,
    driver: Driver,
    lease: &str,
    n: usize,
    phase: Duration,
) -> R<HerdRep> {
    let setup = bench.setup_timeout();
    let url = bench.cluster.url(FAILOVER_DB);
    let who = library(driver, None);
    // No status pollers (see `Bench::spawn_unpolled`): the herd needs only `start` lines.
    let mut holder = bench.spawn_unpolled(who, &url, lease, "holder")?;
    holder
        .wait_start(0, setup)
        .map_err(|e| failed("the herd's holder did not start its job", e, &[&holder]))?;
    let spawned = monotonic_nanos();
    let herd = (0..n)
        .map(|i| bench.spawn_unpolled(who, &url, lease, &format!("S{i}")))
        .collect::<R<Vec<Node>>>()?;
    let mut connected = None;
    let nodes: Vec<&Node> = herd.iter().collect();
    // The herd stands by: every standby has a session, and for a second (20 reads) some
    // of them wait on the server and at most twice HERD_WAITERS do (the others poll;
    // more than HERD_WAITERS queue for a moment when checks race, and give way at their
    // next chunk: the kill may fall in such a moment, as it may in production).
    let app = format!("application_name = '{}'", who.app_name(lease));
    let most = (2 * lease_proto::limits::HERD_WAITERS as usize).max(1);
    let deadline = monotonic_nanos() + setup.as_nanos() as u64;
    let mut steady = 0;
    while steady < 20 {
        let waiting = key_rows(bench, lease, false)?;
        let sessions: usize = (bench.admin)
            .one(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE {app}"
            ))?
            .parse()
            .map_err(|e| format!("counting the herd's sessions: {e}"))?;
        if sessions > n {
            connected.get_or_insert_with(monotonic_nanos);
        }
        steady = if sessions > n && (1..=most).contains(&waiting) {
            steady + 1
        } else {
            0
        };
        if monotonic_nanos() > deadline {
            let what = format!("{sessions} sessions (holder and {n} standbys), {waiting} waiting");
            return Err(failed("the herd did not stand by", what, &nodes));
        }
        sleep(Duration::from_millis(50));
    }
    // The pollers' periodic tries come in rounds: each standby's first one falls
    // `retry · (1 − RETRY_JITTER·u)` after its start, its second as long after that. So
    // from the last start + one retry interval to the first start + twice the shortest
    // wait nobody polls: the kill falls there when the herd started quickly enough for
    // the second after it to fit (the statements counted are then the takeover's), else
    // a random fraction of `phase` after the herd stood by.
    let retry = bench.iv.retry.as_nanos() as u64;
    let connected = connected.unwrap_or(spawned);
    let from = connected + retry + 50_000_000;
    let shortest = (retry as f64 * (1.0 - lease_proto::limits::RETRY_JITTER)) as u64;
    let until = (spawned + 2 * shortest).saturating_sub(1_000_000_000);
    let kill_at = if until > from {
        from + ((until - from) as f64 * bench.random()) as u64
    } else {
        monotonic_nanos() + phase.mul_f64(bench.random()).as_nanos() as u64 + 1_000_000_000
    };
    let between_rounds = until > from;
    // The second before the kill, to set against the second after.
    let log_path = bench.cluster.log_path();
    let log_len = || std::fs::metadata(&log_path).map_or(0, |m| m.len() as usize);
    let before_at = kill_at - 1_000_000_000;
    if let Some(left) = before_at.checked_sub(monotonic_nanos()) {
        sleep(Duration::from_nanos(left));
    }
    let before = log_len();
    if let Some(left) = kill_at.checked_sub(monotonic_nanos()) {
        sleep(Duration::from_nanos(left));
    }
    let waiting_at_kill = key_rows(bench, lease, false)?;
    let from = log_len();
    let wall0 = crate::seconds_of_day(std::time::SystemTime::now()) * 1000.0;
    let t0 = holder
        .kill9()
        .map_err(|e| failed("killing the herd's holder", e, &[&holder]))?;
    let second = t0 + 1_000_000_000;
    let deadline = t0 + bench.iv.window().as_nanos() as u64;
    let first = loop {
        let now = monotonic_nanos();
        if let Some((_, t)) = first_start(&nodes, t0) {
            break Some(t - t0);
        }
        if now >= deadline {
            break None;
        }
        sleep(Duration::from_millis(5));
    };
    // The rest of the second after the kill: a second (wrong) leader or a storm of
    // statements would show there.
    if let Some(left) = second.checked_sub(monotonic_nanos()) {
        sleep(Duration::from_nanos(left));
    }
    let text = std::fs::read(&log_path).map_err(|e| format!("reading the server log: {e}"))?;
    let mark = format!(" {} LOG:  statement: ", who.app_name(lease));
    let count = |part: Option<&[u8]>| {
        (String::from_utf8_lossy(part.unwrap_or_default()).lines())
            .filter(|l| l.contains(&mark))
            .count()
    };
    let statements = count(text.get(from..));
    let winner = key_holder(bench, lease)?;
    let times = herd_log_times(text.get(from..), &mark, wall0, winner);
    let statements_before = count(text.get(before..from));
    let leaders = (herd.iter())
        .filter(|n| n.terms().iter().any(|t| t.start >= t0))
        .count();
    let rep = HerdRep {
        first_ns: first,
        leaders,
        holders: key_rows(bench, lease, true)?,
        waiting_at_kill,
        waiting: key_rows(bench, lease, false)?,
        statements,
        statements_before,
        between_rounds,
        gone_ms: times.gone,
        first_try_ms: times.first_try,
        won_ms: times.won,
        won_by_take: times.won_by_take,
    };
    eprintln!(
        "bench: takeover herd {:<5} first start {} ms (holder's backend gone {} ms, first \
         try {} ms, winning {} answered {} ms), {} leader(s), {} holder(s), {} waiting ({} at the kill), {} statements \
         in the second after the kill ({} in the second before){}",
        driver.name(),
        rep.first_ns
            .map_or("-".into(), |g| format!("{:.1}", g as f64 / 1e6)),
        rep.gone_ms.map_or("-".into(), |g| format!("{g:.0}")),
        rep.first_try_ms.map_or("-".into(), |g| format!("{g:.0}")),
        match rep.won_by_take {
            Some(true) => "take",
            Some(false) => "try",
            None => "statement",
        },
        rep.won_ms.map_or("-".into(), |g| format!("{g:.0}")),
        rep.leaders,
        rep.holders,
        rep.waiting,
        rep.waiting_at_kill,
        rep.statements,
        rep.statements_before,
        if rep.between_rounds {
            ", between two polling rounds"
        } else {
            ""
        }
    );
    Ok(rep)
}

/// `bench --stamp-child` ([`crate::STAMP_CHILD`]): the command `lease run` runs in the
/// lock-delay study. Prints `start LEASE_NAME LEASE_TOKEN T` when it runs and `stop
/// LEASE_NAME T` the moment SIGTERM arrives, then exits 0; `T` is `CLOCK_MONOTONIC` in
/// nanoseconds, as the `replica` lines (stdout is `lease run`'s, inherited).
pub fn stamp_child() -> ExitCode {
    // SAFETY: plain libc calls on a local, initialised signal set, before any thread
    // exists; SIGTERM is blocked (so it stays pending until `sigwait` takes it) with
    // its default disposition.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "-".into());
    let (name, token) = (var("LEASE_NAME"), var("LEASE_TOKEN"));
    let line = |text: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
    };
    if !line(format!("start {name} {token} {}", monotonic_nanos())) {
        return ExitCode::FAILURE;
    }
    let mut sig = 0;
    // SAFETY: `set` is a valid signal set and `sig` a valid out-pointer.
    if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
        return ExitCode::FAILURE;
    }
    if line(format!("stop {name} {}", monotonic_nanos())) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
