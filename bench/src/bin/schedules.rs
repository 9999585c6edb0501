//! 1,000 schedules over 3 replicas, at rest, at the library defaults: how many
//! statements the server runs per interval and how many sessions each replica
//! keeps. Each replica is a process of this binary with one `Locker` that
//! declares every schedule (`Locker::schedule`, `every 1h`, so nothing is due
//! while it measures).
//!
//! ```text
//! cargo run --release -p lease-bench --bin schedules -- [--schedules N] [--replicas R]
//!     [--settle SECS] [--measure SECS] [--url URL] [--group]
//! ```
//!
//! With `--group` the schedules are in one lease group (`Group::schedule`), which spreads
//! them over the replicas. The replicas use the database `lease_bench_schedules` (created if absent) on the server
//! of `--url` (default: 127.0.0.1:5432, user postgres), so the server's per-database
//! counters (`pg_stat_database`: committed and rolled-back transactions, each statement
//! being one) count the replicas' statements alone. Sessions per replica come from
//! `pg_stat_activity` by `application_name` (the most of the samples taken while
//! measuring).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lease_tokio::{Locker, Options, Schedule};
use tokio_postgres::NoTls;

const DB: &str = "lease_bench_schedules";

struct Args {
    schedules: usize,
    replicas: usize,
    settle: Duration,
    measure: Duration,
    url: String,
    /// The schedules in one lease group (`Group::schedule`).
    group: bool,
}

fn parse() -> Result<(Option<usize>, Args), String> {
    let mut replica = None;
    let mut args = Args {
        schedules: 1_000,
        replicas: 3,
        settle: Duration::from_secs(20),
        measure: Duration::from_secs(60),
        url: "host=127.0.0.1 port=5432 user=postgres".to_owned(),
        group: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let number = |v: String, name: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{name}: not a number: {v}"))
        };
        match a.as_str() {
            "--replica" => replica = Some(number(value("--replica")?, "--replica")? as usize),
            "--schedules" => args.schedules = number(value(&a)?, &a)? as usize,
            "--replicas" => args.replicas = number(value(&a)?, &a)? as usize,
            "--settle" => args.settle = Duration::from_secs(number(value(&a)?, &a)?),
            "--measure" => args.measure = Duration::from_secs(number(value(&a)?, &a)?),
            "--url" => args.url = value(&a)?,
            "--group" => args.group = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok((replica, args))
}

fn main() {
    let (replica, args) = match parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("schedules: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let result = match replica {
        Some(i) => rt.block_on(run_replica(i, &args)),
        None => rt.block_on(measure(&args)),
    };
    if let Err(e) = result {
        eprintln!("schedules: {e}");
        std::process::exit(1);
    }
}

/// One replica: every schedule on one locker, for ever.
async fn run_replica(i: usize, args: &Args) -> Result<(), String> {
    let url = format!("{} dbname={DB} application_name=replica-{i}", args.url);
    let (locker, driver) =
        Locker::without_tls(&url, Options::default()).map_err(|e| e.to_string())?;
    tokio::spawn(driver);
    let mut tasks = Vec::new();
    for s in 0..args.schedules {
        let (locker, group) = (locker.clone(), args.group);
        let every = Schedule::every(Duration::from_secs(3600)).map_err(|e| e.to_string())?;
        let name = format!("sched-{s}");
        let job = |_run| async { Ok::<(), String>(()) };
        tasks.push(tokio::spawn(async move {
            if group {
                locker.group("schedules").schedule(&name, every, job).await
            } else {
                locker.schedule(&name, every, job).await
            }
        }));
    }
    for t in tasks {
        if let Ok(Err(e)) = t.await {
            return Err(e.to_string());
        }
    }
    Ok(())
}

struct Replicas(Vec<Child>);

impl Drop for Replicas {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn client(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    tokio::spawn(conn);
    Ok(client)
}

async fn one_i64(c: &tokio_postgres::Client, sql: &str) -> Result<i64, String> {
    let row = c
        .query_one(sql, &[])
        .await
        .map_err(|e| format!("{sql}: {e}"))?;
    Ok(row.get::<_, i64>(0))
}

/// Starts the replicas, waits until every schedule has a leader and the fleet
/// settled, then counts for `--measure`.
async fn measure(args: &Args) -> Result<(), String> {
    let admin = client(&format!("{} dbname=postgres", args.url)).await?;
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&DB])
        .await
        .map_err(|e| e.to_string())?;
    if exists.is_none() {
        admin
            .batch_execute(&format!("CREATE DATABASE {DB}"))
            .await
            .map_err(|e| e.to_string())?;
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut replicas = Replicas(Vec::new());
    for i in 0..args.replicas {
        let child = Command::new(&exe)
            .args(["--replica", &i.to_string()])
            .args(["--schedules", &args.schedules.to_string()])
            .args(["--url", &args.url])
            .args(args.group.then_some("--group"))
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting replica {i}: {e}"))?;
        replicas.0.push(child);
    }
    let started = Instant::now();
    let held_sql = format!(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
         WHERE d.datname = '{DB}' AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    );
    loop {
        let held = one_i64(&admin, &held_sql).await?;
        if held >= args.schedules as i64 {
            println!(
                "every schedule led {:.1} s after the replicas started",
                started.elapsed().as_secs_f64()
            );
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "only {held} of {} schedules led after 120 s",
                args.schedules
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(args.settle).await;
    let xacts_sql = format!(
        "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = '{DB}'"
    );
    let sessions_sql = format!(
        "SELECT application_name, count(*)::int8 FROM pg_stat_activity \
         WHERE datname = '{DB}' GROUP BY 1 ORDER BY 1"
    );
    let leaders_sql = format!(
        "SELECT a.application_name, count(*)::int8 FROM pg_locks l \
         JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE a.datname = '{DB}' AND l.locktype = 'advisory' AND l.granted \
         AND l.objsubid = 1 GROUP BY 1 ORDER BY 1"
    );
    // The counters are per backend and reach the shared statistics when a
    // backend goes idle (at least once a second): read them a second apart.
    let _ = admin.batch_execute("SELECT pg_stat_clear_snapshot()").await;
    let before = one_i64(&admin, &xacts_sql).await?;
    let t0 = Instant::now();
    let mut most: std::collections::BTreeMap<String, i64> = Default::default();
    while t0.elapsed() < args.measure {
        for row in admin
            .query(&sessions_sql, &[])
            .await
            .map_err(|e| e.to_string())?
        {
            let (name, n): (String, i64) = (row.get(0), row.get(1));
            let m = most.entry(name).or_default();
            *m = (*m).max(n);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = admin.batch_execute("SELECT pg_stat_clear_snapshot()").await;
    let after = one_i64(&admin, &xacts_sql).await?;
    let secs = t0.elapsed().as_secs_f64();
    let per_interval =
        (after - before) as f64 / secs * Options::default().heartbeat_interval.as_secs_f64();
    let leaders: Vec<(String, i64)> = (admin.query(&leaders_sql, &[]).await)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    println!(
        "{} schedules over {} replicas at rest, {secs:.0} s: {} statements ({per_interval:.1} per \
         5 s interval, the default heartbeat and retry interval)",
        args.schedules,
        args.replicas,
        after - before
    );
    println!("sessions per replica (most seen): {most:?}");
    println!("leases held per replica: {leaders:?}");
    Ok(())
}
