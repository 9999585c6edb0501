//! Lockers behind PgBouncer on real servers: session mode leads; two lockers through a
//! transaction-mode pooler never both lead; a lone locker through one is refused by the
//! pooler probe; and on a pooled backend shared with a client that is not a lease client,
//! a foreign unlock is found by the periodic verify.

use crate::common::*;
use lease_tests::scenario::Driver;
use lease_tests::scenario::ReplicaConfig;
use lease_tests::Cluster;
use lease_tests::PgBouncer;
use lease_tests::PgBouncerSettings;
use lease_tests::PoolMode;
use lease_tokio::Locker;
use lease_tokio::RunError;
use std::convert::Infallible;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;
use tokio_postgres::NoTls;

/// A session-mode PgBouncer (what the docs recommend) must work.
#[tokio::test]
async fn locker_through_session_mode_pgbouncer_leads() {
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let pgb = PgBouncer::start(&c, PoolMode::Session).expect("start pgbouncer");
    let (locker, driver) = Locker::without_tls(&pgb.conn_string(), fast()).expect("locker");
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

/// A session-mode PgBouncer whose pool is as large as its lease sessions (here one server
/// connection, one locker): the locker's session holds the only server connection, so the
/// pooler probe's second connection waits for one until the query timeout, every attempt.
/// The locker cannot lead there (the probe is how it tells a session pooler from a
/// transaction pooler); what it must do is say why: its last error (and the "lease
/// session lost" line) names the pooler probe and a pool with no free server connection,
/// not only "a statement timed out". Before the fix it said only "a statement timed
/// out; session given up", every attempt.
#[tokio::test]
async fn a_session_pool_with_no_free_connection_is_named_as_the_cause() {
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let settings = PgBouncerSettings {
        pool_size: 1,
        ..PgBouncerSettings::default()
    };
    let pgb = PgBouncer::start_with(&c, PoolMode::Session, &settings).expect("pgbouncer");
    let (locker, driver) = Locker::without_tls(&pgb.conn_string(), fast()).expect("locker");
    let driver = tokio::spawn(driver);
    let run = locker.run(&unique("full-session-pool"), |_lease| async {
        Ok::<(), Infallible>(())
    });
    // Query timeout 1 s: a few probes time out meanwhile.
    let result = tokio::time::timeout(MS(3_500), run).await;
    let last_error = locker.status().last_error.map(|e| e.error.to_string());
    drop(locker);
    let _ = tokio::time::timeout(MS(5_000), driver).await;
    eprintln!("a full session pool: {result:?}, last error: {last_error:?}");
    assert!(
        result.is_err(),
        "led through a full session pool? {result:?}"
    );
    let last_error = last_error.expect("no error recorded");
    assert!(
        last_error.contains("pooler probe") && last_error.contains("no free server connection"),
        "the last error does not name the full pool: {last_error}"
    );
}

/// A transaction-mode PgBouncer that ignores `options`, with the guard set by
/// `ALTER ROLE` to the exact value asked for, one server connection: two
/// lockers through it must never both lead.
#[tokio::test]
async fn two_lockers_through_transaction_pgbouncer_never_both_lead() {
    two_lockers_through_transaction_pgbouncer(false).await;
}

/// Every check of the setup passed: as above, and the role also sets the TCP
/// settings to the values asked for, so only the session nonce (read by every
/// try and heartbeat) and the try's own-backend check are left.
#[tokio::test]
async fn two_lockers_through_transaction_pgbouncer_with_every_setting_by_role() {
    two_lockers_through_transaction_pgbouncer(true).await;
}

/// The two transaction-mode PgBouncer cases above; `tcp_by_role`: the role
/// also sets the TCP settings.
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
        let (locker, driver) = Locker::without_tls(&pgb.conn_string(), fast()).expect("locker");
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

/// A LONE locker through a transaction-mode PgBouncer with its default settings (it
/// rejects the `options` startup parameter, so the settings go by statement and the
/// setup passes; nobody else shares the backend, so no nonce is overwritten and the pid
/// never changes). It must be refused as a transaction pooler before it leads, and no
/// key of it may stay on the pooled backend. Before the fix it led (the job ran) and
/// its key stayed on the pooled server connection.
#[tokio::test]
async fn a_lone_locker_through_transaction_pgbouncer_is_refused() {
    let c = Cluster::start().expect("start an ephemeral PostgreSQL");
    let pgb = PgBouncer::start(&c, PoolMode::Transaction).expect("pgbouncer");
    let (locker, driver) = Locker::without_tls(&pgb.conn_string(), fast()).expect("locker");
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

/// The one setup where the steady heartbeat (backend pid + nonce, no `pg_locks`) sees less
/// than the heartbeat that read `pg_locks`: a transaction-mode PgBouncer with ONE server
/// connection, shared by a replica and a client that is not a lease client. Every check
/// passes (the pid never changes; nobody overwrites the nonce), so the replica leads; the
/// other client's `pg_advisory_unlock_all()` then runs on the same backend and frees the
/// replica's lock. A direct replica takes the lease at its next try.
///
/// A heartbeat that read `pg_locks` every time would have missed its key and
/// cancelled the job (`not_held`): an overlap of up to a heartbeat interval. The steady
/// heartbeat cannot see it (nothing on the pooled backend says the lock is gone), so
/// every `VERIFY_EVERY`th heartbeat is a verify, which reads `pg_locks`: the holder's job
/// is cancelled within that many heartbeat intervals. Neither makes this setup safe (the
/// overlap starts at the foreign unlock, before any check could run); the README lists a
/// transaction pooler as unsupported. This test pins the bound and prints the overlap.
///
/// The pooler ignores the `options` startup parameter and the role sets every setting
/// the replica asks for (so the setup's read-back passes): a pooler that
/// REJECTS `options` is found at setup by the pooler probe (a second connection that
/// reads the session's nonce on the one server connection) and refused
/// (`a_lone_locker_through_transaction_pgbouncer_is_refused` above);
/// the probe runs only then, so this setup is the one left for the periodic verify.
///
/// `cargo test -p lease-tests poolers::a_foreign_unlock -- --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_foreign_unlock_on_a_shared_pooled_backend_is_found_by_the_periodic_verify() {
    let cluster = Cluster::start().expect("an ephemeral cluster");
    // The replicas' options (ReplicaConfig::new), for the settings the role sets.
    let options = {
        let mut o = lease_proto::Options::default();
        o.retry_interval = Duration::from_millis(200);
        o.heartbeat_interval = Duration::from_millis(150);
        o.query_timeout = Duration::from_millis(400);
        o.guard_margin = Duration::from_millis(200);
        o
    };
    let guard = options.guard_timeout().as_millis();
    let mut role = vec![
        "search_path = pg_catalog".to_owned(),
        format!("idle_session_timeout = {guard}"),
    ];
    for (name, value) in options.tcp_settings() {
        role.push(format!("{name} = {value}"));
    }
    for setting in role {
        cluster
            .sql(&format!("ALTER ROLE postgres SET {setting}"))
            .expect("ALTER ROLE");
    }
    let one = PgBouncerSettings {
        pool_size: 1,
        ignore_startup_parameters: vec!["extra_float_digits".into(), "options".into()],
    };
    let bouncer =
        PgBouncer::start_with(&cluster, PoolMode::Transaction, &one).expect("a pgbouncer");
    let pooled = ReplicaConfig::new(Driver::Tokio, bouncer.conn_string(), "job")
        .spawn(bin(), "pooled")
        .expect("the pooled replica");
    pooled
        .wait_starts(1, WAIT)
        .unwrap_or_else(|e| panic!("the pooled replica leads: {e}\n{}", pooled.tail()));

    // Another client of the pooler: its statement runs on the replica's backend.
    let (client, connection) = tokio_postgres::connect(&bouncer.conn_string(), NoTls)
        .await
        .expect("a foreign client of the pooler");
    tokio::spawn(connection);
    client
        .simple_query("SELECT pg_advisory_unlock_all()")
        .await
        .expect("the foreign unlock");

    let direct = ReplicaConfig::new(Driver::Tokio, cluster.conn_string(), "job")
        .spawn(bin(), "direct")
        .expect("the direct replica");
    direct
        .wait_starts(1, WAIT)
        .unwrap_or_else(|e| panic!("the direct replica leads: {e}\n{}", direct.tail()));
    let both_since = Instant::now();
    // The replicas' heartbeat interval (ReplicaConfig::new): 150 ms.
    let bound =
        Duration::from_millis(150) * lease_proto::limits::VERIFY_EVERY + Duration::from_millis(500);
    let cancelled = loop {
        if let Some(cancel) = pooled.cancels().into_iter().next() {
            break cancel;
        }
        assert!(
            both_since.elapsed() < bound,
            "the pooled holder still leads {bound:?} after the direct one started\n{}",
            pooled.tail()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let overlap = both_since.elapsed();
    eprintln!(
        "FIGURE foreign unlock on the pooled backend: the pooled holder's job cancelled \
         ({}) {} ms after the direct one started (bound {} ms)",
        cancelled.1,
        overlap.as_millis(),
        bound.as_millis()
    );
    assert_eq!(cancelled.1, "not-held", "{}", pooled.tail());
    for mut node in [pooled, direct] {
        let _ = node.kill9();
    }
}
