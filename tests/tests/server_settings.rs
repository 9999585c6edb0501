//! Issue 18: server settings a role can change under the lease, on a real PostgreSQL.
//!
//! - Hole 3: `search_path` shadowing. A role that owns a schema can put functions and
//!   operators named like `pg_catalog`'s in it and make that schema come first in its
//!   `search_path` (`ALTER ROLE ... SET search_path = evil, pg_catalog`: `pg_catalog` is
//!   searched first only when the path does not name it). Unqualified names in the
//!   lease's statements then resolve to the role's objects. The session forces
//!   `search_path = pg_catalog` (startup option, read back in the setup) and every name
//!   in every statement is `pg_catalog.`-qualified.
//!
//! Figures are printed as `FIGURE <what>: <value>` lines on stderr (`--nocapture`).

use lease_tests::scenario::{ms, Admin, Driver, Event, Node, ReplicaConfig};
use lease_tests::{Cluster, KitError};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long to wait for anything that should happen.
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

fn figure(what: &str, value: String) {
    eprintln!("FIGURE {what}: {value}");
}

/// The non-superuser role of hole 3, owner of schema [`SCHEMA`].
const ROLE: &str = "app";
/// The role's schema, first in its `search_path`.
const SCHEMA: &str = "evil";

/// A cluster where [`ROLE`] owns [`SCHEMA`], created `objects` in it (as itself, no
/// superuser involved) and put it first in its own `search_path`; the connection string
/// of the role.
fn shadowing_cluster(objects: &str) -> Result<(Cluster, String), KitError> {
    let cluster = Cluster::start()?;
    cluster.sql(&format!(
        "CREATE ROLE {ROLE} LOGIN; CREATE SCHEMA {SCHEMA} AUTHORIZATION {ROLE}"
    ))?;
    let url = format!(
        "host={} port={} user={ROLE} dbname=postgres",
        cluster.host(),
        cluster.port()
    );
    let role = Admin::connect(&url)?;
    role.rows(objects)?;
    role.rows(&format!(
        "ALTER ROLE {ROLE} SET search_path = {SCHEMA}, pg_catalog"
    ))?;
    drop(role);
    // What a new session of the role sees.
    let session = Admin::connect(&url)?;
    let shown = session.rows("SHOW search_path")?;
    figure(
        "a new session of the role has search_path",
        format!("{shown:?}"),
    );
    Ok((cluster, url))
}

fn starts(node: &Node) -> Vec<i64> {
    node.events()
        .iter()
        .filter_map(|e| match e {
            Event::Start { token, .. } => Some(*token),
            _ => None,
        })
        .collect()
}

/// Hole 3 (functions): the role's `evil.pg_try_advisory_lock(bigint)` answers true and
/// takes nothing. Two replicas of the role: the first leads with the key held on the
/// server, the second never leads while the first holds it.
#[test]
fn hole3_search_path_function_shadow() -> Res {
    let (cluster, url) = shadowing_cluster(&format!(
        "CREATE FUNCTION {SCHEMA}.pg_try_advisory_lock(bigint) RETURNS boolean \
         LANGUAGE sql AS 'select true'"
    ))?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let config = ReplicaConfig::new(Driver::Tokio, url, "job");
    let a = config.spawn(bin(), "A")?;
    a.wait_start(0, WAIT)?;
    let b = config.spawn(bin(), "B")?;
    b.wait_pid(0, WAIT)?;
    // B tries every retry interval (200 ms) and waits on the server in between: give it
    // many tries.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && starts(&b).is_empty() {
        std::thread::sleep(ms(20));
    }
    let holders = admin.holders(key("job"))?;
    let advisory = admin.ints("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")?;
    figure(
        "shadowed pg_try_advisory_lock",
        format!(
            "A's starts {:?}, B's starts {:?}, holders of the key {holders:?}, advisory \
             locks on the server {advisory:?}",
            starts(&a),
            starts(&b)
        ),
    );
    assert!(
        starts(&b).is_empty(),
        "B led while A leads: A's tokens {:?}, B's {:?}; holders of the key on the server \
         {holders:?}, advisory locks in pg_locks {advisory:?}\n{}\n{}",
        starts(&a),
        starts(&b),
        a.tail(),
        b.tail()
    );
    assert_eq!(
        holders,
        a.last_pid().into_iter().collect::<Vec<_>>(),
        "A's backend holds the key"
    );
    Ok(())
}

/// Hole 3 (operators): the role's `evil.|(bigint, bigint)` answers 1. A replica of the
/// role acquires, its session is terminated, it acquires again: the second token must
/// be above the first (and the key held on the server by its backend).
#[test]
fn hole3_search_path_operator_shadow() -> Res {
    let (cluster, url) = shadowing_cluster(&format!(
        "CREATE FUNCTION {SCHEMA}.or_one(bigint, bigint) RETURNS bigint \
         LANGUAGE sql AS 'select 1::pg_catalog.int8'; \
         CREATE OPERATOR {SCHEMA}.| (leftarg = bigint, rightarg = bigint, \
         function = {SCHEMA}.or_one)"
    ))?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let a = ReplicaConfig::new(Driver::Smol, url, "job").spawn(bin(), "A")?;
    a.wait_start(0, WAIT)?;
    let deadline = Instant::now() + WAIT;
    let pid = loop {
        if let [pid] = admin.holders(key("job"))?[..] {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "A leads but no backend holds the key: tokens {:?}\n{}",
            starts(&a),
            a.tail()
        );
        std::thread::sleep(ms(10));
    };
    admin.terminate(pid)?;
    a.wait_starts(2, WAIT)?;
    let tokens = starts(&a);
    figure("shadowed |: tokens", format!("{tokens:?}"));
    assert!(
        tokens[1] > tokens[0],
        "the second token {} is not above the first {}: tokens {tokens:?}\n{}",
        tokens[1],
        tokens[0],
        a.tail()
    );
    Ok(())
}
