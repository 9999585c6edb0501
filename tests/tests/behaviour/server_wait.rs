//! A standby's wait on the server that takes its key (`pg_advisory_lock` under
//! `lock_timeout`), against a real PostgreSQL, with both drivers: a crashed holder's key
//! is taken by the wait itself, with no statement after it; a client holding the key
//! shared does not make a standby spin, a vanished waiter leaves no backend, a role's
//! `statement_timeout` keeps the wait, a standby at rest logs no errors, a pooled waiter
//! does not starve other clients; only the holder's own handover notification, naming the
//! standby as the release's grantee, skips the lock delay; a take queued behind a late
//! shared waiter is granted when it commits; and no wait lasts `deadlock_timeout`, so
//! `log_lock_waits = on` does not flood the server log. Figures are printed as `FIGURE`
//! lines (`--nocapture`).

use crate::common::*;
use lease_tests::monotonic_nanos;
use lease_tests::scenario::diff;
use lease_tests::scenario::ms;
use lease_tests::scenario::ms_f;
use lease_tests::scenario::nanos;
use lease_tests::scenario::Admin;
use lease_tests::scenario::Driver;
use lease_tests::scenario::Node;
use lease_tests::scenario::ReplicaConfig;
use lease_tests::Cluster;
use lease_tests::KitError;
use std::time::Duration;
use std::time::Instant;

/// A standby at the library's standby defaults (retry 10 s, the default lock delay).
fn standby(driver: Driver, cluster: &Cluster) -> ReplicaConfig {
    ReplicaConfig {
        retry: ms(10_000),
        heartbeat: ms(2000),
        ..ReplicaConfig::new(driver, cluster.conn_string(), "job")
    }
}

/// Backends of `lease-replica` sessions, and how many of them wait on a lock.
fn replica_backends(admin: &Admin) -> Result<(i64, i64), KitError> {
    let row = admin.ints(
        "SELECT count(*)::int8 FROM pg_stat_activity WHERE application_name = 'lease-replica' \
         UNION ALL SELECT count(*) FILTER (WHERE wait_event_type = 'Lock')::int8 \
         FROM pg_stat_activity WHERE application_name = 'lease-replica'",
    )?;
    Ok((row[0], row[1]))
}

/// The lease statements (tries and takes) of replica sessions in the server log since
/// byte `from`.
fn lease_statements(cluster: &Cluster, from: usize) -> Result<(usize, usize), KitError> {
    let text = std::fs::read(cluster.log_path()).map_err(|e| KitError::Failed {
        context: "reading the server log".into(),
        detail: e.to_string(),
    })?;
    let text = String::from_utf8_lossy(&text[from.min(text.len())..]).into_owned();
    let lines = text.lines().filter(|l| l.contains("LOG:  statement: "));
    let (mut tries, mut takes) = (0, 0);
    for l in lines {
        if l.contains("pg_try_advisory_lock(") {
            tries += 1;
        } else if l.contains("pg_catalog.pg_advisory_lock(") {
            takes += 1;
        }
    }
    Ok((tries, takes))
}

/// A crashed holder's key goes to the waiting standby by its wait itself: the server
/// grants the take the key as the holder's backend ends, and the standby's job starts the
/// lock delay after that reply, with no statement in between (before, the wait only woke,
/// and a try followed: a round trip more, and a herd's woken waiters' shared locks in its
/// way). Counted in the server log (`log_statement = all`): the tries and takes from the
/// kill -9 to the standby's start.
fn a_crashed_holders_key_is_taken_by_the_wait_itself(driver: Driver) -> Res {
    let cluster = Cluster::start()?;
    cluster.sql("ALTER SYSTEM SET log_statement = 'all'")?;
    cluster.sql("SELECT pg_reload_conf()")?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let mut holder = ReplicaConfig::new(driver, cluster.conn_string(), "job").spawn(bin(), "H")?;
    holder.wait_start(0, WAIT)?;
    let node = standby(driver, &cluster).spawn(bin(), "S")?;
    until_waiting(&admin, 1)?;
    std::thread::sleep(ms(200));
    let from = log_len(&cluster);
    let t_kill = holder.kill9()?;
    let (_, _, start) = node.wait_start(t_kill, WAIT)?;
    let (tries, takes) = lease_statements(&cluster, from)?;
    driver_figure(
        driver,
        "kill -9 of the holder -> the waiting standby's start; statements meanwhile",
        format!(
            "{:.1} ms; {tries} tries, {takes} takes",
            ms_f(diff(t_kill, start))
        ),
    );
    assert_eq!(
        tries, 0,
        "the standby tried after its wait ended: the wait did not take the key"
    );
    Ok(())
}

fn log_len(cluster: &Cluster) -> usize {
    std::fs::metadata(cluster.log_path()).map_or(0, |m| m.len() as usize)
}

/// A client that is not a lease client holds the lease's key SHARED. A shared wait of the
/// standby was granted at once, and every try after it lost: at the default lock delay
/// the standby once spun, a wait and a try every ~20 ms, ~90 statements a second against
/// one per retry interval at rest. A take blocks behind the shared lock as behind a
/// holder: one per chunk below `deadlock_timeout` (about 4 in 3 s).
fn a_shared_holder_does_not_make_a_standby_spin(driver: Driver) -> Res {
    let cluster = Cluster::start()?;
    let foreign = Admin::connect(&cluster.conn_string())?;
    foreign.rows(&format!("SELECT pg_advisory_lock_shared({})", key("job")))?;
    cluster.sql("ALTER SYSTEM SET log_statement = 'all'")?;
    cluster.sql("SELECT pg_reload_conf()")?;
    std::thread::sleep(ms(200));
    let from = log_len(&cluster);
    let node = standby(driver, &cluster).spawn(bin(), "S")?;
    node.wait_pid(0, WAIT)?;
    let t0 = Instant::now();
    std::thread::sleep(ms(3000));
    let (tries, takes) = lease_statements(&cluster, from)?;
    let secs = t0.elapsed().as_secs_f64();
    driver_figure(
        driver,
        "foreign shared holder: standby statements in ~3 s (retry 10 s)",
        format!("{tries} tries, {takes} takes ({secs:.1} s)"),
    );
    assert!(
        node.terms().is_empty(),
        "the standby led beside a shared holder"
    );
    assert!(
        tries + takes <= 8,
        "{tries} tries and {takes} takes in {secs:.1} s: the standby spins"
    );
    Ok(())
}

/// Standbys that vanish while they wait (kill -9, or a process that closes its
/// connection) leave their backends queued on the key, holding a connection slot each,
/// until the wait's lock timeout, up to a retry interval (10 s by default): the server
/// reads nothing from the client while a statement blocks. A rolling restart of a fleet of
/// standbys thus needs twice its connections for that long. The wait now has the server
/// check the client connection while it blocks (`client_connection_check_interval`).
/// Five standbys, of which `HERD_WAITERS` (2) wait on the server (the others poll).
fn a_vanished_waiter_leaves_no_backend(driver: Driver) -> Res {
    let cluster = Cluster::start()?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let holder = ReplicaConfig::new(driver, cluster.conn_string(), "job").spawn(bin(), "H")?;
    holder.wait_start(0, WAIT)?;
    let mut herd: Vec<Node> = Vec::new();
    for i in 0..5 {
        herd.push(standby(driver, &cluster).spawn(bin(), &format!("S{i}"))?);
    }
    until_waiting(&admin, i64::from(lease_proto::limits::HERD_WAITERS))?;
    let t_kill = monotonic_nanos();
    for node in &mut herd {
        node.kill9()?;
    }
    for node in &mut herd {
        node.wait_exit(WAIT)?;
    }
    let deadline = Instant::now() + ms(12_000);
    let gone = loop {
        let (_, waiting) = replica_backends(&admin)?;
        if waiting == 0 {
            break monotonic_nanos();
        }
        assert!(Instant::now() < deadline, "the orphaned waits never ended");
        std::thread::sleep(ms(20));
    };
    let lasted = diff(t_kill, gone);
    driver_figure(
        driver,
        "5 standbys (2 waiting) killed -> the waiters' backends gone",
        format!("{:.1} ms", ms_f(lasted)),
    );
    assert!(
        lasted < nanos(ms(2000)),
        "the killed standbys' backends stayed queued for {:.1} ms",
        ms_f(lasted)
    );
    Ok(())
}

/// A `statement_timeout` set for the role (common in production: here 3 s) shorter than
/// the retry interval ended every wait with 57014 before its lock timeout; a wait that
/// fails so turns waiting off for the session, and the standby silently went back to
/// polling: a kill -9 was taken over at the next poll, up to 10 s later. The wait now
/// sets its own statement timeout (its lock timeout bounds it).
fn a_role_statement_timeout_keeps_the_wait(driver: Driver) -> Res {
    let cluster = Cluster::start()?;
    cluster.sql("ALTER ROLE postgres SET statement_timeout = '3s'")?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let mut holder = ReplicaConfig::new(driver, cluster.conn_string(), "job").spawn(bin(), "H")?;
    holder.wait_start(0, WAIT)?;
    let node = standby(driver, &cluster).spawn(bin(), "S")?;
    until_waiting(&admin, 1)?;
    // Past the role's statement timeout, well before the standby's next poll.
    std::thread::sleep(ms(4000));
    let t_kill = holder.kill9()?;
    let (_, _, start) = node.wait_start(t_kill, WAIT)?;
    let takeover = diff(t_kill, start);
    driver_figure(
        driver,
        "role statement_timeout 3 s: kill -9 -> standby start",
        format!("{:.1} ms", ms_f(takeover)),
    );
    assert!(
        takeover < nanos(ms(1000)),
        "takeover took {:.1} ms: the standby was polling",
        ms_f(takeover)
    );
    Ok(())
}

/// A standby at rest waits on the server, each wait ending by its lock timeout at the
/// retry deadline. Each such end was an `ERROR:  canceling statement due to lock timeout`
/// with the statement's text in the server's log (at the server's default
/// `log_min_error_statement`): one per standby per retry interval, forever (10 standbys at
/// the default 5 s: 172,800 a day), which error-rate alerts and log volume notice. The
/// wait now catches its lock timeout and says so in its reply.
fn a_standby_at_rest_logs_no_errors(driver: Driver) -> Res {
    let cluster = Cluster::start()?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let holder = ReplicaConfig::new(driver, cluster.conn_string(), "job").spawn(bin(), "H")?;
    holder.wait_start(0, WAIT)?;
    let from = log_len(&cluster);
    let node = ReplicaConfig {
        retry: ms(300),
        ..ReplicaConfig::new(driver, cluster.conn_string(), "job")
    }
    .spawn(bin(), "S")?;
    until_waiting(&admin, 1)?;
    std::thread::sleep(ms(3000));
    let text = std::fs::read(cluster.log_path()).map_err(|e| KitError::Failed {
        context: "reading the server log".into(),
        detail: e.to_string(),
    })?;
    let text = String::from_utf8_lossy(&text[from.min(text.len())..]).into_owned();
    let errors = text.lines().filter(|l| l.contains("ERROR:")).count();
    driver_figure(
        driver,
        "standby at rest, retry 300 ms: ERROR lines in the server log in 3 s",
        errors.to_string(),
    );
    assert!(node.terms().is_empty());
    // Between two waits the standby is not waiting for a round trip: look again for a
    // moment rather than sample once.
    let settle = Instant::now() + ms(1000);
    let mut waiting = replica_backends(&admin)?.1;
    while waiting != 1 && Instant::now() < settle {
        std::thread::sleep(ms(5));
        waiting = replica_backends(&admin)?.1;
    }
    assert_eq!(waiting, 1, "the standby does not wait on the server");
    assert_eq!(
        errors,
        0,
        "{}",
        text.lines()
            .filter(|l| l.contains("ERROR:"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// Behind a transaction pooler with ONE server connection shared only with clients that
/// are not lease clients (the case the lease cannot detect: same backend pid, same nonce),
/// a waiting standby would occupy that server connection back to back, each wait up to a
/// retry interval, so every other client's statement would wait in the pooler's queue for
/// up to that long (measured before the fix: 1,990 ms at a 2 s retry; polling: 8.5 ms).
/// The pooler rejects the startup options, so the standby knows it is behind one and
/// polls. Now it goes no further than its setup: the pooler probe's second connection
/// lands on the one server connection and reads the standby's nonce, so it is refused as a
/// transaction pooler (exit 1) and never waits or tries there; the other client is not
/// held up either way.
fn pooled_waiter_does_not_starve_other_clients(driver: Driver) -> Res {
    use lease_tests::{PgBouncer, PgBouncerSettings, PoolMode};
    let cluster = Cluster::start()?;
    let one = PgBouncerSettings {
        pool_size: 1,
        ..PgBouncerSettings::default()
    };
    let bouncer = PgBouncer::start_with(&cluster, PoolMode::Transaction, &one)?;
    let holder = ReplicaConfig::new(driver, cluster.conn_string(), "job").spawn(bin(), "H")?;
    holder.wait_start(0, WAIT)?;
    let retry = ms(2000);
    let mut node = ReplicaConfig {
        retry,
        ..ReplicaConfig::new(driver, bouncer.conn_string(), "job")
    }
    .spawn(bin(), "S")?;
    let status = node.wait_exit(WAIT)?;
    assert_eq!(status.code(), Some(1), "{}", node.tail());
    assert!(
        (node.stderr().iter()).any(|l| l.contains("transaction-mode pooler")),
        "{}",
        node.tail()
    );
    let other = Admin::connect(&bouncer.conn_string())?;
    let t0 = Instant::now();
    let mut worst = Duration::ZERO;
    while t0.elapsed() < ms(1000) {
        let t = Instant::now();
        other.rows("SELECT 1")?;
        worst = worst.max(t.elapsed());
        std::thread::sleep(ms(50));
    }
    driver_figure(
        driver,
        "transaction pooler, one server connection: another client's worst SELECT 1 (retry 2 s)",
        format!("{:.1} ms", worst.as_secs_f64() * 1000.0),
    );
    assert!(node.terms().is_empty());
    assert!(
        worst < retry / 4,
        "another client of the pooler waited {worst:?} for the waiting standby's server connection"
    );
    Ok(())
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

/// The server log from byte `from` on.
fn log_since(cluster: &Cluster, from: usize) -> Result<String, KitError> {
    let text = std::fs::read(cluster.log_path()).map_err(|e| KitError::Failed {
        context: "reading the server log".into(),
        detail: e.to_string(),
    })?;
    Ok(String::from_utf8_lossy(&text[from.min(text.len())..]).into_owned())
}

/// Any role may `NOTIFY lease_handover_v1, '<key>'`. Sent just before
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
    driver_figure(
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
/// release notifies, naming the waiting standby's backend as the one it granted the key
/// to, read from `pg_locks` after the unlock) still skips the lock delay.
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
    // A validity window above the lock delay (a win is held back that long
    // within it): a 3 s query timeout.
    let standby = ReplicaConfig {
        retry: ms(5000),
        query_timeout: ms(3000),
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
    driver_figure(
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

/// With `log_lock_waits = on`, a wait that blocks past `deadlock_timeout` (1 s) writes
/// "still waiting" to the server log (LOG, DETAIL, CONTEXT and the statement), and
/// again every 250 ms (the wait's client connection check re-logs it) until its lock
/// timeout: measured before the fix, 24 entries in 10.5 s at a 2 s retry. The wait now
/// stays below the server's `deadlock_timeout` (in chunks) and is never logged. Also
/// measured: the standby's statements per retry interval.
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
        .filter(|l| l.contains("LOG:  statement: ") && l.contains("pg_catalog.pg_advisory_lock("))
        .count();
    let per_retry = waits as f64 * retry.as_secs_f64() / secs;
    driver_figure(
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
    // Between two chunks (180 ms each under a 200 ms deadlock_timeout) the standby is not
    // waiting for a round trip: look again for a moment rather than sample once.
    let settle = Instant::now() + ms(1000);
    let mut waiting = waiting_replicas(&admin)?;
    while waiting < 1 && Instant::now() < settle {
        std::thread::sleep(ms(5));
        waiting = waiting_replicas(&admin)?;
    }
    assert_eq!(waiting.min(1), 1, "the standby does not wait on the server");
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

/// Sessions waiting for the key's release (ungranted advisory locks on it).
fn queued_on(admin: &Admin, k: i64) -> Result<i64, KitError> {
    let n = admin.ints(&format!(
        "SELECT count(*)::int8 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
         AND NOT granted AND {} = {k}",
        lease_proto::server::ADVISORY_KEY_SQL
    ))?;
    Ok(n.first().copied().unwrap_or(0))
}

/// A take queued behind another waiter's shared lock: a client that waits for the key
/// shared in a transaction (a watch session, or not a lease client), queued first, and
/// commits 50 ms after its grant. The release grants the shared waiter first; the take
/// conflicts with it and stays queued (and with it a try of anyone else loses), and is
/// granted the moment the shared waiter commits: the standby leads the lock delay after
/// that. (With waits that only woke, the standby's try once lost to such a lock again and
/// again and waited for its periodic try, 10 s here.)
fn a_take_behind_a_late_shared_waiter_is_granted_when_it_commits(driver: Driver) -> Res {
    let cluster = Cluster::start()?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let k = key("job");
    let holder = Admin::connect(&cluster.conn_string())?;
    holder.rows(&format!("SELECT pg_advisory_lock({k})"))?;
    let hold = ms(50);
    let conn = cluster.conn_string();
    let late = std::thread::spawn(move || -> Result<u64, KitError> {
        let late = Admin::connect(&conn)?;
        late.rows("SET lock_timeout = '20s'")?;
        late.rows("BEGIN")?;
        late.rows(&format!("SELECT pg_advisory_xact_lock_shared({k})"))?;
        let granted = monotonic_nanos();
        std::thread::sleep(hold);
        late.rows("COMMIT")?;
        Ok(granted)
    });
    let deadline = Instant::now() + WAIT;
    while queued_on(&admin, k)? != 1 {
        if Instant::now() > deadline {
            return Err(KitError::Invalid("the late waiter never queued".into()));
        }
        std::thread::sleep(ms(5));
    }
    let node = standby(driver, &cluster).spawn(bin(), "S")?;
    while queued_on(&admin, k)? != 2 {
        if Instant::now() > deadline {
            return Err(KitError::Invalid("the standby never queued".into()));
        }
        std::thread::sleep(ms(5));
    }
    let t0 = monotonic_nanos();
    holder.rows(&format!("SELECT pg_advisory_unlock({k})"))?;
    let started = node.wait_start(t0, ms(15_000));
    let granted = late
        .join()
        .map_err(|_| KitError::Invalid("the late waiter panicked".into()))??;
    let (_, _, t) = started?;
    let took = diff(t0, t);
    driver_figure(
        driver,
        "release with a shared waiter queued first that commits 50 ms late -> the standby's \
         job start",
        format!(
            "{:.1} ms (the late waiter granted {:.1} ms after the release)",
            ms_f(took),
            ms_f(diff(t0, granted))
        ),
    );
    assert!(
        took >= nanos(hold),
        "the standby led {:.1} ms after the release, before the shared waiter committed",
        ms_f(took)
    );
    let bound = hold + lease_proto::limits::DEFAULT_LOCK_DELAY + ms(1000);
    assert!(
        took <= bound.as_nanos() as i128,
        "the standby led {:.1} ms after the release, above {:.1} ms",
        ms_f(took),
        ms_f(bound.as_nanos() as i128)
    );
    Ok(())
}

/// A take reports the key taken only if this statement took it: `lease.freed` and
/// `lease.token` set beforehand by the session, its role or its database (here the
/// session) report nothing while another session holds the key.
#[test]
fn a_preset_outcome_setting_takes_nothing() -> Res {
    let cluster = Cluster::start()?;
    let k = key("job");
    let holder = Admin::connect(&cluster.conn_string())?;
    holder.rows(&format!("SELECT pg_advisory_lock({k})"))?;
    let session = Admin::connect(&cluster.conn_string())?;
    let pid = session.ints("SELECT pg_backend_pid()::int8")?[0];
    session.rows(&format!(
        "SELECT set_config('{}', '7', false)",
        lease_proto::server::NONCE_SETTING
    ))?;
    let take = lease_proto::Statement::Take {
        key: k,
        timeout_ms: 50,
        crowd: None,
        backend_pid: pid,
        nonce: 7,
    }
    .sql();
    for (freed, token) in [("1", "123"), ("1", "0"), ("3", "5")] {
        session.rows(&format!(
            "SELECT set_config('{}', '{freed}', false), set_config('{}', '{token}', false)",
            lease_proto::server::WAIT_SETTING,
            lease_proto::server::TOKEN_SETTING,
        ))?;
        let rows = session.rows(&take)?;
        let reply: Vec<Vec<Option<i64>>> = (rows.iter())
            .map(|r| r.iter().map(|c| c.as_deref()?.parse().ok()).collect())
            .collect();
        let reply = lease_proto::reply::WaitReply::parse(&reply).expect("a take's reply");
        assert_eq!(
            (reply.freed, reply.token, reply.held_here),
            (Some(false), None, false),
            "preset {freed}/{token} made the take report something: {rows:?}"
        );
    }
    Ok(())
}

/// The statements read the session's `deadlock_timeout` from its shown value
/// (`1s`, `100ms`), not from `pg_settings` (which cost a try after a wake 4.5 ms):
/// every unit reads as the ms `pg_settings` gives, under every `IntervalStyle`.
#[test]
fn a_wait_reads_deadlock_timeout_in_every_unit() -> Res {
    // A cluster of its own: .ci/test-versions runs it on every version.
    let cluster = Cluster::start()?;
    let session = Admin::connect(&cluster.conn_string())?;
    let wait = lease_proto::Statement::Wait {
        key: key("deadlock-timeout-units"),
        timeout_ms: 5,
        crowd: None,
        watch_of: None,
    }
    .sql();
    for style in ["postgres", "postgres_verbose", "sql_standard", "iso_8601"] {
        for value in [
            "1ms",
            "25ms",
            "1s",
            "1500ms",
            "2min",
            "1h",
            "1d",
            "2147483647ms",
        ] {
            session.rows(&format!(
                "SET IntervalStyle = {style}; SET deadlock_timeout = '{value}'"
            ))?;
            let want = session
                .ints("SELECT setting::int8 FROM pg_settings WHERE name = 'deadlock_timeout'")?;
            let rows = session.rows(&wait)?;
            let read = rows
                .iter()
                .find(|r| r[0].as_deref() == Some("4"))
                .and_then(|r| r[1].as_deref()?.parse::<i64>().ok());
            assert_eq!(read, want.first().copied(), "{style}, {value}: {rows:?}");
        }
    }
    Ok(())
}

both_drivers!(
    a_crashed_holders_key_is_taken_by_the_wait_itself,
    a_shared_holder_does_not_make_a_standby_spin,
    a_vanished_waiter_leaves_no_backend,
    a_role_statement_timeout_keeps_the_wait,
    a_standby_at_rest_logs_no_errors,
    pooled_waiter_does_not_starve_other_clients,
    a_forged_notification_does_not_skip_the_lock_delay,
    the_holders_own_notification_skips_the_lock_delay,
    a_waiting_standby_does_not_flood_log_lock_waits,
    a_shorter_deadlock_timeout_shortens_the_waits,
    a_take_behind_a_late_shared_waiter_is_granted_when_it_commits,
);
