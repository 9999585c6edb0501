//! The one setup where the steady heartbeat (backend pid + nonce, no `pg_locks`) sees less
//! than the heartbeat that read `pg_locks`: a transaction-mode PgBouncer with ONE server
//! connection, shared by a replica and a client that is not a lease client. Every check
//! passes (the pid never changes; nobody overwrites the nonce), so the replica leads; the
//! other client's `pg_advisory_unlock_all()` then runs on the same backend and frees the
//! replica's lock. A direct replica takes the lease at its next try.
//!
//! Before issue 12 the holder's next heartbeat read `pg_locks`, missed its key and
//! cancelled the job (`not_held`): an overlap of up to a heartbeat interval. The steady
//! heartbeat cannot see it (nothing on the pooled backend says the lock is gone), so
//! every `VERIFY_EVERY`th heartbeat is a verify, which reads `pg_locks`: the holder's job
//! is cancelled within that many heartbeat intervals. Neither makes this setup safe (the
//! overlap starts at the foreign unlock, before any check could run); the README lists a
//! transaction pooler as unsupported. This test pins the bound and prints the overlap.
//!
//! The pooler ignores the `options` startup parameter and the role sets every setting
//! the replica asks for (so the setup's read-back passes): since issue 18 a pooler that
//! REJECTS `options` is found at setup by the pooler probe (a second connection that
//! reads the session's nonce on the one server connection) and refused
//! (`hole7_a_lone_locker_through_transaction_pgbouncer_is_refused` in `holes_cli.rs`);
//! the probe runs only then, so this setup is the one left for the periodic verify.
//!
//! `cargo test -p lease-tests --test heartbeat_pooler -- --nocapture`

use std::path::Path;
use std::time::{Duration, Instant};

use lease_tests::scenario::{Driver, ReplicaConfig};
use lease_tests::{Cluster, PgBouncer, PgBouncerSettings, PoolMode};
use tokio_postgres::NoTls;

const WAIT: Duration = Duration::from_secs(30);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_replica"))
}

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
