//! `lease run` behind PgBouncer: session mode works; a transaction-mode pooler that ignores
//! the startup options never gives two leaders, and a lone `lease run` through one is
//! refused by the pooler probe.

use crate::common::*;
use lease_proto::key_for_name;
use lease_proto::Options;
use lease_tests::Cluster;
use lease_tests::PgBouncer;
use lease_tests::PgBouncerSettings;
use lease_tests::PoolMode;
use lease_tests::Replica;

/// A session-mode PgBouncer (what the docs recommend) must work: the
/// settings go by a statement after connecting when startup options are
/// rejected, are verified, and the run leads.
#[test]
fn session_mode_pgbouncer_leads() {
    let c = cluster();
    let pgb = PgBouncer::start(&c, PoolMode::Session).expect("start pgbouncer");
    let name = unique("hole4-session");
    let cmd = run_sh(&pgb.url(), &FAST[..6], &name, "echo started");
    let (status, out, err, took) = try_output(cmd, MS(15_000));
    let status_text = exit_text(status);
    eprintln!("session-mode PgBouncer: lease run: {status_text} after {took:?}");
    assert!(
        status.is_some_and(|s| s.success()) && out.contains("started"),
        "through a session-mode PgBouncer `lease run` ended ({status_text}) after {took:?} \
         without running its command; last stderr line: {}",
        err.lines().last().unwrap_or("")
    );
}

/// A transaction-mode PgBouncer told to ignore `options`, with the guard set
/// by `ALTER ROLE` to exactly the value the lease asks for and one server
/// connection: two `lease run`s through it must never both lead (the machine
/// must see that clients share a backend and refuse).
#[test]
fn transaction_pgbouncer_ignoring_options_never_gives_two_leaders() {
    // Its own server: the role setting must not leak to other tests.
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let guard = {
        let mut o = Options::default();
        o.retry_interval = MS(50);
        o.heartbeat_interval = MS(100);
        o.query_timeout = MS(1_000);
        o
    }
    .guard_timeout()
    .as_millis();
    c.sql(&format!(
        "ALTER ROLE postgres SET idle_session_timeout = {guard}"
    ))
    .expect("ALTER ROLE");
    let settings = PgBouncerSettings {
        pool_size: 1,
        ignore_startup_parameters: vec!["extra_float_digits".into(), "options".into()],
    };
    let pgb = PgBouncer::start_with(&c, PoolMode::Transaction, &settings).expect("pgbouncer");
    let dir = Dir::new("hole4-txn");
    let (fa, fb) = (dir.file("a"), dir.file("b"));
    let name = unique("hole4-txn");
    let a = Replica::spawn(run_sh(&pgb.url(), &FAST[..6], &name, &stamper(&fa, false))).expect("a");
    let b = Replica::spawn(run_sh(&pgb.url(), &FAST[..6], &name, &stamper(&fb, false))).expect("b");
    let ra = started(&a, MS(8_000));
    let rb = started(&b, MS(5_000));
    // Watch for 2 s: a fixed runner may find out at its next heartbeat.
    let watch = MS(2_000);
    std::thread::sleep(watch);
    let holders: Vec<i32> = c
        .held_advisory_keys()
        .expect("pg_locks")
        .into_iter()
        .filter(|&(k, _)| k == key_for_name(&name))
        .map(|(_, pid)| pid)
        .collect();
    let (sa, sb) = (stamps(&fa), stamps(&fb));
    let overlap = match (sa.first(), sa.last(), sb.first(), sb.last()) {
        (Some(&a0), Some(&a1), Some(&b0), Some(&b1)) => ms_between(a0.max(b0), a1.min(b1)),
        _ => 0.0,
    };
    eprintln!(
        "transaction-mode PgBouncer (options ignored, ALTER ROLE idle_session_timeout = \
         {guard}, pool size 1): a {ra:?}, b {rb:?}, both commands ran together {overlap:.0} ms \
         (watched {watch:?}); backends holding the key: {holders:?}"
    );
    assert!(
        overlap <= 0.0,
        "two leaders through a transaction-mode PgBouncer: a (pid, token) {ra:?}, b {rb:?}; \
         their commands ran together for {overlap:.0} ms of the {watch:?} watched; backends \
         holding the key in pg_locks: {holders:?} (one server connection)\n--- a's stderr ---\n{}\n--- b's \
         stderr ---\n{}",
        stderr_of(&a),
        stderr_of(&b),
    );
}

/// A lone `lease run` through a transaction-mode PgBouncer with its default settings
/// (it rejects `options`; the settings go by statement and the setup passes; nobody
/// shares its backend) must not run its command: it exits 1, its last line naming the
/// transaction pooler. Before the fix it led and ran the command.
#[test]
fn lone_lease_run_through_transaction_pgbouncer_is_refused() {
    let c = cluster();
    let pgb = PgBouncer::start(&c, PoolMode::Transaction).expect("start pgbouncer");
    let name = unique("hole7-lone");
    let cmd = run_sh(&pgb.url(), &FAST[..6], &name, "echo started");
    let (status, out, err, took) = try_output(cmd, MS(15_000));
    let status_text = exit_text(status);
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("ERROR")).collect();
    eprintln!(
        "a lone lease run through a transaction-mode PgBouncer: {status_text} after {took:?}; \
         stdout {out:?}; error lines: {errors:?}"
    );
    assert!(
        status.and_then(|s| s.code()) == Some(1)
            && !out.contains("started")
            && errors
                .last()
                .is_some_and(|l| l.contains("transaction-mode pooler")),
        "through a transaction-mode PgBouncer a lone `lease run` ended ({status_text}) after \
         {took:?}, stdout {out:?}, error lines {errors:?}; stderr:\n{err}"
    );
}
