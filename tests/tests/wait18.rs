//! Issue 18's holes in the standby's wait, against a real PostgreSQL (branch wait): a
//! forged `NOTIFY` that skipped the lock delay (hole 10) and a wait that outlived
//! `deadlock_timeout`, flooding a server log with `log_lock_waits = on` (hole 8). Each
//! test failed before its fix. Figures are printed as `FIGURE` lines (`--nocapture`).

use lease_tests::scenario::{diff, ms, ms_f, Admin, Driver, ReplicaConfig};
use lease_tests::{monotonic_nanos, Cluster, KitError};
use std::path::Path;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

type Res = Result<(), KitError>;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_replica"))
}

fn key(name: &str) -> i64 {
    lease_proto::LeaseId::named(name)
        .expect("valid lease name")
        .key()
}

fn figure(driver: Driver, what: &str, value: String) {
    eprintln!("FIGURE {:9} {what}: {value}", driver.name());
}

/// How many `lease-replica` backends wait on a lock.
fn waiting_replicas(admin: &Admin) -> Result<i64, KitError> {
    let n = admin.ints(
        "SELECT count(*)::int8 FROM pg_stat_activity \
         WHERE application_name = 'lease-replica' AND wait_event_type = 'Lock'",
    )?;
    Ok(n.first().copied().unwrap_or(0))
}

/// Waits until `n` replica backends wait on a lock.
fn until_waiting(admin: &Admin, n: i64) -> Res {
    let deadline = Instant::now() + WAIT;
    while waiting_replicas(admin)? != n {
        if Instant::now() > deadline {
            return Err(KitError::Invalid(format!("never {n} waiting replicas")));
        }
        std::thread::sleep(ms(5));
    }
    Ok(())
}

fn log_len(cluster: &Cluster) -> usize {
    std::fs::metadata(cluster.log_path()).map_or(0, |m| m.len() as usize)
}

/// The server log from byte `from` on.
fn log_since(cluster: &Cluster, from: usize) -> Result<String, KitError> {
    let text = std::fs::read(cluster.log_path()).map_err(|e| KitError::Failed {
        context: "reading the server log".into(),
        detail: e.to_string(),
    })?;
    Ok(String::from_utf8_lossy(&text[from.min(text.len())..]).into_owned())
}

/// Hole 10: any role may `NOTIFY lease_handover_v1, '<key>'`. Sent just before
/// `pg_terminate_backend` of the holder, it reached the waiting standby as a graceful
/// release, so the standby tried the moment its wait woke, skipping the lock delay
/// (measured before the fix: the standby led 3.8 ms after the holder's SIGTERM). The
/// notification's sender pid is not the holder the standby saw: ignored now, and the
/// standby starts no sooner than the lock delay after the terminate. The lock delay is
/// 300 ms here so that a loaded machine cannot blur the two.
fn a_forged_notification_does_not_skip_the_lock_delay(driver: Driver) -> Res {
    let cluster = Cluster::start()?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let holder = ReplicaConfig::new(driver, cluster.conn_string(), "job").spawn(bin(), "H")?;
    holder.wait_start(0, WAIT)?;
    let lock_delay = ms(300);
    let standby = ReplicaConfig {
        retry: ms(5000),
        lock_delay: Some(lock_delay),
        ..ReplicaConfig::new(driver, cluster.conn_string(), "job")
    }
    .spawn(bin(), "S")?;
    until_waiting(&admin, 1)?;
    let pid = *(admin.holders(key("job"))?.first())
        .ok_or_else(|| KitError::Invalid("nobody holds the key".into()))?;
    // The holder frozen, so that it cannot reconnect and take the key back while the
    // standby waits out the lock delay.
    holder.replica().sigstop()?;
    // Another client, not a lease client: a forged handover notification, then the
    // terminate, as two statements (a NOTIFY is delivered when its transaction commits).
    let forger = Admin::connect(&cluster.conn_string())?;
    forger.rows(&format!("NOTIFY lease_handover_v1, '{}'", key("job")))?;
    let terminated = monotonic_nanos();
    admin.rows(&format!("SELECT pg_terminate_backend({pid})"))?;
    let started = standby.wait_start(terminated, WAIT).map(|(_, _, t)| t);
    holder.replica().sigcont()?;
    let started = started?;
    let after = diff(terminated, started);
    figure(
        driver,
        "forged NOTIFY, then terminate of the holder: standby starts after (lock delay 300 ms)",
        format!("{:.1} ms", ms_f(after)),
    );
    assert!(
        after >= lock_delay.as_nanos() as i128,
        "the standby started {:.1} ms after the terminate, within the lock delay of {lock_delay:?}: \
         the forged notification was taken for a graceful release",
        ms_f(after)
    );
    Ok(())
}

/// Control for the test above: the holder's own graceful release (its job returns; the
/// release notifies) still skips the lock delay.
fn the_holders_own_notification_skips_the_lock_delay(driver: Driver) -> Res {
    let cluster = Cluster::start()?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let holder = ReplicaConfig {
        job_exit_after: Some(ms(2500)),
        ..ReplicaConfig::new(driver, cluster.conn_string(), "job")
    }
    .spawn(bin(), "H")?;
    let (_, _, held) = holder.wait_start(0, WAIT)?;
    let lock_delay = ms(2000);
    let standby = ReplicaConfig {
        retry: ms(5000),
        lock_delay: Some(lock_delay),
        ..ReplicaConfig::new(driver, cluster.conn_string(), "job")
    }
    .spawn(bin(), "S")?;
    until_waiting(&admin, 1)?;
    let (_, _, started) = standby.wait_start(held, WAIT)?;
    let stopped = (holder.terms().first())
        .and_then(|t| t.end)
        .ok_or_else(|| KitError::Invalid("the holder's term never ended".into()))?;
    let after = diff(stopped, started);
    figure(
        driver,
        "graceful release: standby starts after the holder's job returned (lock delay 2 s)",
        format!("{:.1} ms", ms_f(after)),
    );
    assert!(
        after < lock_delay.as_nanos() as i128,
        "the standby waited the lock delay after a graceful release: {:.1} ms",
        ms_f(after)
    );
    Ok(())
}

/// Hole 8: with `log_lock_waits = on`, a wait that blocks past `deadlock_timeout` (1 s)
/// writes "still waiting" to the server log (LOG, DETAIL, CONTEXT and the statement),
/// and again every 250 ms (the wait's client connection check re-logs it) until its
/// lock timeout: measured before the fix, 24 entries in 10.5 s at a 2 s retry. The wait
/// now stays below the server's `deadlock_timeout` (in chunks) and is never logged.
/// Also measured: the standby's statements per retry interval.
fn a_waiting_standby_does_not_flood_log_lock_waits(driver: Driver) -> Res {
    standby_under_log_lock_waits(driver, None)
}

/// The same under a server `deadlock_timeout` of 200 ms, changed by a reload: the wait
/// reads it itself, so its chunks shrink with it (180 ms), and nothing is logged.
fn a_shorter_deadlock_timeout_shortens_the_waits(driver: Driver) -> Res {
    standby_under_log_lock_waits(driver, Some(ms(200)))
}

fn standby_under_log_lock_waits(driver: Driver, deadlock_timeout: Option<Duration>) -> Res {
    let cluster = Cluster::start()?;
    if let Some(d) = deadlock_timeout {
        cluster.sql(&format!(
            "ALTER SYSTEM SET deadlock_timeout = '{}ms'",
            d.as_millis()
        ))?;
    }
    cluster.sql("ALTER SYSTEM SET log_lock_waits = on")?;
    cluster.sql("ALTER SYSTEM SET log_statement = 'all'")?;
    cluster.sql("SELECT pg_reload_conf()")?;
    std::thread::sleep(ms(200));
    let admin = Admin::connect(&cluster.conn_string())?;
    let holder = ReplicaConfig::new(driver, cluster.conn_string(), "job").spawn(bin(), "H")?;
    holder.wait_start(0, WAIT)?;
    let retry = ms(3000);
    let standby = ReplicaConfig {
        retry,
        ..ReplicaConfig::new(driver, cluster.conn_string(), "job")
    }
    .spawn(bin(), "S")?;
    until_waiting(&admin, 1)?;
    let from = log_len(&cluster);
    let t0 = Instant::now();
    std::thread::sleep(ms(6500));
    let text = log_since(&cluster, from)?;
    let secs = t0.elapsed().as_secs_f64();
    let still_waiting: Vec<&str> = (text.lines())
        .filter(|l| l.contains("still waiting for"))
        .collect();
    let statements = (text.lines())
        .filter(|l| l.contains("lease-replica LOG:  statement: "))
        .count();
    let waits = (text.lines())
        .filter(|l| l.contains("LOG:  statement: ") && l.contains("pg_advisory_xact_lock_shared("))
        .count();
    let per_retry = waits as f64 * retry.as_secs_f64() / secs;
    figure(
        driver,
        &format!(
            "log_lock_waits on, deadlock_timeout {}, standby waiting (retry 3 s): \"still waiting\" entries, waits",
            deadlock_timeout.map_or("1 s (default)".to_string(), |d| format!("{d:?}"))
        ),
        format!(
            "{} entries, {waits} waits in {secs:.1} s ({per_retry:.2} waits per retry interval; {statements} statements logged in all)",
            still_waiting.len()
        ),
    );
    assert!(standby.terms().is_empty());
    assert_eq!(
        waiting_replicas(&admin)?.min(1),
        1,
        "the standby does not wait on the server"
    );
    assert!(
        still_waiting.is_empty(),
        "{} \"still waiting\" entries in {secs:.1} s:\n{}",
        still_waiting.len(),
        still_waiting
            .iter()
            .take(3)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

macro_rules! both_drivers {
    ($($name:ident),* $(,)?) => {
        mod tokio_driver {
            $(#[test] fn $name() -> super::Res { super::$name(super::Driver::Tokio) })*
        }
        mod smol_driver {
            $(#[test] fn $name() -> super::Res { super::$name(super::Driver::Smol) })*
        }
    };
}

both_drivers!(
    a_forged_notification_does_not_skip_the_lock_delay,
    the_holders_own_notification_skips_the_lock_delay,
    a_waiting_standby_does_not_flood_log_lock_waits,
    a_shorter_deadlock_timeout_shortens_the_waits,
);
