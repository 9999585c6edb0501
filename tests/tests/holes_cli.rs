//! Issue 11, reproduced first: hole 4 with the tokio driver's `Locker` against
//! real servers and PgBouncer. Each test failed on the code it was written
//! against and passes since the fix; run them with
//! `cargo test -p lease-tests --test holes_cli -- --nocapture`.
//!
//! The same holes (and hole 3) with real `lease run` processes are in
//! `lease-cli/tests/holes.rs`: only that package's tests get the `lease`
//! binary's path (`CARGO_BIN_EXE_lease`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_tests::{Cluster, PgBouncer, PgBouncerSettings, PoolMode};
use lease_tokio::{Locker, Options, RunError};

const MS: fn(u64) -> Duration = Duration::from_millis;

fn fast() -> Options {
    let mut o = Options::default();
    o.retry_interval = MS(50);
    o.heartbeat_interval = MS(100);
    o.query_timeout = MS(1_000);
    o
}

/// A lease name no other test (or earlier run) uses.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{name}-{}-{nanos}", std::process::id())
}

/// Hole 4: a session-mode PgBouncer (what the docs recommend) must work.
#[tokio::test]
async fn hole4_locker_through_session_mode_pgbouncer_leads() {
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let pgb = PgBouncer::start(&c, PoolMode::Session).expect("start pgbouncer");
    let (locker, driver) = Locker::connect(&pgb.conn_string(), fast()).expect("locker");
    tokio::spawn(driver);
    let run = locker.run(&unique("hole4-session"), |_lease| async {
        Ok::<(), Infallible>(())
    });
    let result = tokio::time::timeout(MS(10_000), run).await;
    eprintln!("session-mode PgBouncer: {result:?}");
    assert!(
        matches!(result, Ok(Ok(()))),
        "a locker through a session-mode PgBouncer did not lead: {result:?}"
    );
}

/// Hole 4: a hot standby reached first is retryable: the run keeps retrying
/// and leads once the server is promoted, instead of `RunError::Refused`.
#[tokio::test]
async fn hole4_locker_on_a_hot_standby_leads_once_promoted() {
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let standby = c.start_standby().expect("start a hot standby");
    let (locker, driver) = Locker::connect(&standby.conn_string(), fast()).expect("locker");
    tokio::spawn(driver);
    let name = unique("hole4-standby");
    let started = tokio::time::Instant::now();
    let run = tokio::spawn(async move {
        let r = locker
            .run(&name, |_lease| async { Ok::<(), Infallible>(()) })
            .await;
        (r, started.elapsed())
    });
    tokio::time::sleep(MS(1_000)).await;
    let finished_before_promotion = run.is_finished();
    standby.sql("SELECT pg_promote()").expect("promote");
    let result = tokio::time::timeout(MS(10_000), run).await;
    eprintln!(
        "hot standby promoted after 1 s (run finished before: {finished_before_promotion}): \
         {result:?}"
    );
    let outcome = match result {
        Ok(Ok((r, took))) => Some((r, took)),
        _ => None,
    };
    assert!(
        matches!(outcome, Some((Ok(()), _))),
        "a locker on a hot standby promoted after 1 s did not lead: (result, after) \
         {outcome:?}, finished before the promotion: {finished_before_promotion}"
    );
}

/// Hole 4: a transaction-mode PgBouncer that ignores `options`, with the guard
/// set by `ALTER ROLE` to the exact value asked for, one server connection:
/// two lockers through it must never both lead.
#[tokio::test]
async fn hole4_two_lockers_through_transaction_pgbouncer_never_both_lead() {
    two_lockers_through_transaction_pgbouncer(false).await;
}

/// Hole 4, every check of the setup passed: as above, and the role also sets
/// the TCP settings to the values asked for, so only the session nonce (read by
/// every try and heartbeat) and the try's own-backend check are left.
#[tokio::test]
async fn hole4_two_lockers_through_transaction_pgbouncer_with_every_setting_by_role() {
    two_lockers_through_transaction_pgbouncer(true).await;
}

/// The two hole-4 PgBouncer cases; `tcp_by_role`: the role also sets the TCP
/// settings.
async fn two_lockers_through_transaction_pgbouncer(tcp_by_role: bool) {
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let guard = fast().guard_timeout().as_millis();
    c.sql(&format!(
        "ALTER ROLE postgres SET idle_session_timeout = {guard}"
    ))
    .expect("ALTER ROLE");
    if tcp_by_role {
        for (name, value) in fast().tcp_settings() {
            c.sql(&format!("ALTER ROLE postgres SET {name} = {value}"))
                .expect("ALTER ROLE");
        }
    }
    let settings = PgBouncerSettings {
        pool_size: 1,
        ignore_startup_parameters: vec!["extra_float_digits".into(), "options".into()],
    };
    let pgb = PgBouncer::start_with(&c, PoolMode::Transaction, &settings).expect("pgbouncer");
    let name = unique("hole4-txn");
    let leading = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (locker, driver) = Locker::connect(&pgb.conn_string(), fast()).expect("locker");
        tokio::spawn(driver);
        let (name, leading, most, tokens) =
            (name.clone(), leading.clone(), most.clone(), tokens.clone());
        runs.push(tokio::spawn(async move {
            let job = |lease: lease_tokio::Lease| {
                let (leading, most, tokens) = (leading.clone(), most.clone(), tokens.clone());
                async move {
                    let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(lease.token());
                    tokio::select! {
                        _ = lease.cancelled() => {}
                        () = tokio::time::sleep(MS(2_000)) => {}
                    }
                    leading.fetch_sub(1, Ordering::SeqCst);
                    Ok::<(), Infallible>(())
                }
            };
            tokio::time::timeout(MS(8_000), locker.run(&name, job)).await
        }));
    }
    let mut results: Vec<Result<Result<(), RunError<Infallible>>, String>> = Vec::new();
    for run in runs {
        results.push(match run.await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err("timed out".into()),
            Err(e) => Err(e.to_string()),
        });
    }
    let most = most.load(Ordering::SeqCst);
    let tokens = tokens.lock().unwrap_or_else(|e| e.into_inner()).clone();
    eprintln!(
        "transaction-mode PgBouncer (options ignored, ALTER ROLE idle_session_timeout = \
         {guard}, TCP settings by role: {tcp_by_role}, pool size 1): at most {most} leading at once, tokens {tokens:?}, results \
         {results:?}"
    );
    assert!(
        most <= 1,
        "{most} lockers led at once through a transaction-mode PgBouncer with one server \
         connection: tokens {tokens:?}, results {results:?}"
    );
}

/// Issue 18 hole 7: a LONE locker through a transaction-mode PgBouncer with its default
/// settings (it rejects the `options` startup parameter, so the settings go by
/// statement and the setup passes; nobody else shares the backend, so no nonce is
/// overwritten and the pid never changes). It must be refused as a transaction pooler
/// before it leads, and no key of it may stay on the pooled backend. Before the fix it
/// led (the job ran) and its key stayed on the pooled server connection.
#[tokio::test]
async fn hole7_a_lone_locker_through_transaction_pgbouncer_is_refused() {
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let pgb = PgBouncer::start(&c, PoolMode::Transaction).expect("pgbouncer");
    let (locker, driver) = Locker::connect(&pgb.conn_string(), fast()).expect("locker");
    let driver = tokio::spawn(driver);
    let name = unique("hole7-lone");
    let key = lease_proto::key_for_name(&name);
    let led = Arc::new(AtomicUsize::new(0));
    let job = {
        let led = led.clone();
        move |_lease: lease_tokio::Lease| {
            led.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), Infallible>(()) }
        }
    };
    let result = tokio::time::timeout(MS(10_000), locker.run(&name, job)).await;
    let led = led.load(Ordering::SeqCst);
    drop(locker);
    let _ = tokio::time::timeout(MS(5_000), driver).await;
    let holders: Vec<i32> = c
        .held_advisory_keys()
        .expect("pg_locks")
        .into_iter()
        .filter(|&(k, _)| k == key)
        .map(|(_, pid)| pid)
        .collect();
    eprintln!(
        "a lone locker through a transaction-mode PgBouncer: {result:?}, the job ran {led} \
         times, backends holding the key afterwards: {holders:?}"
    );
    assert!(
        matches!(
            result,
            Ok(Err(RunError::Refused(
                lease_tokio::Refusal::TransactionPooler { .. }
            )))
        ) && led == 0,
        "a lone locker through a transaction-mode PgBouncer was not refused as a \
         transaction pooler: {result:?}, the job ran {led} times"
    );
    assert!(holders.is_empty(), "the key stayed on backends {holders:?}");
}
