//! Server settings a role can change under the lease, on a real PostgreSQL.
//!
//! - Server TCP settings (`tcp_keepalives_*`, `tcp_user_timeout`) of the lease's role must
//!   not end a partitioned holder's session before the server guard (the session sets and
//!   verifies its own). The holder runs in a network namespace whose veth link is cut by
//!   iptables DROP at the ingress of both ends, so the server's kernel sees a real
//!   partition (a userspace proxy would keep acknowledging); the `control_*` test is the
//!   same partition without role settings.
//! - `search_path` shadowing. A role that owns a schema can put functions and
//!   operators named like `pg_catalog`'s in it and make that schema come first in its
//!   `search_path` (`ALTER ROLE ... SET search_path = evil, pg_catalog`: `pg_catalog` is
//!   searched first only when the path does not name it). Unqualified names in the
//!   lease's statements then resolve to the role's objects. The session forces
//!   `search_path = pg_catalog` (startup option, read back in the setup) and every name
//!   in every statement is `pg_catalog.`-qualified.
//!
//! Figures are printed as `FIGURE <what>: <value>` lines on stderr (`--nocapture`).

use crate::common::*;
use lease_tests::monotonic_nanos;
use lease_tests::scenario::diff;
use lease_tests::scenario::ms;
use lease_tests::scenario::ms_f;
use lease_tests::scenario::nanos;
use lease_tests::scenario::worst_overlap;
use lease_tests::scenario::Admin;
use lease_tests::scenario::Driver;
use lease_tests::scenario::Event;
use lease_tests::scenario::Node;
use lease_tests::scenario::ReplicaConfig;
use lease_tests::scenario::Term;
use lease_tests::Cluster;
use lease_tests::KitError;
use lease_tests::NetNs;
use std::time::Duration;
use std::time::Instant;

/// The role the replicas of the TCP-settings tests log in as (its settings are the
/// point of the test).
const TCP_ROLE: &str = "lease_app";

/// The TCP settings on [`TCP_ROLE`]: the server probes an idle connection after 1 s, every
/// 1 s, gives up after 2 unanswered probes, and drops a connection whose data stays
/// unacknowledged for 500 ms.
const ROLE_TCP_SETTINGS: [(&str, &str); 4] = [
    ("tcp_keepalives_idle", "1"),
    ("tcp_keepalives_interval", "1"),
    ("tcp_keepalives_count", "2"),
    ("tcp_user_timeout", "500"),
];

/// The replicas of the TCP-settings tests: heartbeat 1 s, query timeout 2 s (validity
/// 3 s), guard margin 1 s (`idle_session_timeout` 4 s): the server's keepalive give-up
/// (about 2-3 s after the last packet) comes before the guard.
fn netns_replica(url: String) -> ReplicaConfig {
    ReplicaConfig {
        heartbeat: ms(1000),
        query_timeout: ms(2000),
        guard_margin: ms(1000),
        ..ReplicaConfig::new(Driver::Tokio, url, "job")
    }
}

/// What one netns partition run measured; times are from the cut, in ns.
struct PartitionRun {
    /// Worst overlap of the two replicas' terms (start to cancel), ns.
    overlap: u64,
    /// The old holder's last confirmed validity deadline.
    deadline: i128,
    /// The old holder's job cancelled, and why.
    cancel: i128,
    kind: String,
    /// The old holder's backend gone from `pg_locks`.
    session_gone: i128,
    /// The standby's job started.
    standby_start: i128,
    /// The guard the holder's session was opened with.
    guard: Duration,
    /// Everything above as text, with the replicas' output.
    context: String,
}

/// The holder (A) in a network namespace, the standby (B) on loopback, both logging in as
/// [`TCP_ROLE`]; with `role_tcp_settings` the role carries [`ROLE_TCP_SETTINGS`]. The link is
/// cut once A's heartbeats flow; the run ends when A's job was cancelled and B leads.
fn netns_partition(role_tcp_settings: bool) -> Result<PartitionRun, KitError> {
    let mut ns = NetNs::create()?;
    let cluster = Cluster::start_listening(ns.host_addr(), &ns.network())?;
    cluster.sql(&format!("CREATE ROLE {TCP_ROLE} LOGIN"))?;
    if role_tcp_settings {
        for (name, value) in ROLE_TCP_SETTINGS {
            cluster.sql(&format!("ALTER ROLE {TCP_ROLE} SET {name} = {value}"))?;
        }
    }
    let admin = Admin::connect(&cluster.conn_string())?;
    // What a new session of the role gets (over loopback TCP, like the standby's).
    let role_session = Admin::connect(&format!(
        "host=127.0.0.1 port={} user={TCP_ROLE} dbname=postgres",
        cluster.port()
    ))?;
    let shown: Vec<String> = ROLE_TCP_SETTINGS
        .iter()
        .map(|(name, _)| {
            let rows = role_session.rows(&format!("SHOW {name}"))?;
            let value = rows.first().and_then(|r| r[0].clone()).unwrap_or_default();
            Ok(format!("{name}={value}"))
        })
        .collect::<Result<_, KitError>>()?;
    drop(role_session);
    figure("netns: a new session of the role has", shown.join(" "));

    let holder = netns_replica(format!(
        "host={} port={} user={TCP_ROLE} dbname=postgres",
        ns.host_addr(),
        cluster.port()
    ));
    let standby = netns_replica(format!(
        "host=127.0.0.1 port={} user={TCP_ROLE} dbname=postgres",
        cluster.port()
    ));
    let (validity, guard) = (holder.validity(), holder.guard_timeout());
    let a = holder.spawn_wrapped(bin(), "A", |cmd| ns.wrap(cmd))?;
    a.wait_start(0, WAIT)?;
    let (a_pid, _) = a.wait_pid(0, WAIT)?;
    let b = standby.spawn(bin(), "B")?;
    b.wait_pid(0, WAIT)?;
    // Heartbeats flow: valid_until has moved at least twice.
    wait_valid_lines(&a, 3)?;
    assert_eq!(admin.holders(key("job"))?, vec![a_pid], "A holds the key");

    let t_cut = monotonic_nanos();
    ns.partition()?;
    // Watch the old session hold the key until B leads and A's job was cancelled.
    let mut gone = None;
    let deadline = Instant::now() + WAIT;
    loop {
        let b_started = b.events().iter().any(|e| matches!(e, Event::Start { .. }));
        let a_cancelled = a.cancels().iter().any(|c| c.2 >= t_cut);
        if b_started && a_cancelled {
            break;
        }
        if gone.is_none() && !admin.holders(key("job"))?.contains(&a_pid) {
            gone = Some(monotonic_nanos());
        }
        assert!(
            Instant::now() < deadline,
            "after the cut, B did not lead or A's job was not cancelled within {WAIT:?}\n{}",
            tails(&[&a, &b])
        );
        std::thread::sleep(ms(5));
    }
    let (_, _, b_start) = b.wait_start(0, WAIT)?;
    let (kind, a_cancel) = a.wait_cancel(t_cut, WAIT)?;
    let a_term = a.terms().into_iter().next().expect("A's term");
    let a_until = a_term.valid_until.expect("A printed valid_until");
    let gone = gone.unwrap_or(b_start);
    let mut terms: Vec<Term> = a.terms().into_iter().chain(b.terms()).collect();
    terms.sort_by_key(|t| t.start);
    let (overlap, _) = worst_overlap(&terms, monotonic_nanos());
    // Why the server ended the holder's session, in its own words.
    let server_log = std::fs::read_to_string(cluster.log_path()).unwrap_or_default();
    let why: Vec<&str> = server_log
        .lines()
        .filter(|l| l.contains(&format!("[{a_pid}]")))
        .collect();
    figure(
        "netns partition: server log of the holder's backend",
        why.join(" | "),
    );
    let run = PartitionRun {
        overlap,
        deadline: diff(t_cut, a_until),
        cancel: diff(t_cut, a_cancel),
        kind,
        session_gone: diff(t_cut, gone),
        standby_start: diff(t_cut, b_start),
        guard,
        context: String::new(),
    };
    let context = format!(
        "cut at 0 ms (role TCP settings: {}; validity {validity:?}, guard \
         idle_session_timeout {guard:?}): holder's validity deadline {:.1} ms, holder's \
         session gone from pg_locks {:.1} ms, standby's job started {:.1} ms, holder's job \
         cancelled {:.1} ms ({}): both jobs ran for {:.1} ms\nserver log of the holder's \
         backend:\n  {}\n{}",
        if role_tcp_settings {
            shown.join(" ")
        } else {
            "none".to_owned()
        },
        ms_f(run.deadline),
        ms_f(run.session_gone),
        ms_f(run.standby_start),
        ms_f(run.cancel),
        run.kind,
        ms_f(overlap as i128),
        why.join("\n  "),
        tails(&[&a, &b])
    );
    for (what, t) in [
        ("holder's last validity deadline", run.deadline),
        ("holder's session gone from pg_locks", run.session_gone),
        ("standby's job started", run.standby_start),
        ("holder's job cancelled", run.cancel),
    ] {
        fig_ms(&format!("netns partition: cut -> {what}"), t);
    }
    fig_ms("netns partition: overlap of the two jobs", overlap as i128);
    Ok(PartitionRun { context, ..run })
}

/// With the role's keepalives at 1 s x 2 and a 500 ms user timeout, the server drops the
/// partitioned holder's session about 2-3 s after the cut, long before its 4 s guard, and
/// the standby leads while the holder's job still runs until its validity ends.
#[test]
fn role_tcp_keepalives_end_partitioned_session_early() -> Res {
    let run = netns_partition(true)?;
    assert_eq!(
        run.overlap,
        0,
        "the standby's job started {:.1} ms before the partitioned holder's job was \
         cancelled: {}",
        ms_f(run.overlap as i128),
        run.context
    );
    Ok(())
}

/// The control of the test above: the same partition without role TCP settings. Only the
/// server guard ends the holder's session, after the holder's validity: no overlap.
#[test]
fn control_netns_partition_without_role_tcp_settings() -> Res {
    let run = netns_partition(false)?;
    assert_eq!(
        run.overlap,
        0,
        "overlap {:.1} ms: {}",
        ms_f(run.overlap as i128),
        run.context
    );
    assert!(
        run.standby_start > run.cancel && run.standby_start > run.deadline,
        "{}",
        run.context
    );
    // The guard counts from the holder's last statement, at most a heartbeat before the cut.
    assert!(
        run.session_gone > nanos(run.guard) - nanos(ms(1000)) - nanos(ms(150)),
        "the session ended before the guard could have: {}",
        run.context
    );
    assert!(
        run.kind == "validity-expired" || run.kind == "query-timeout",
        "{}",
        run.context
    );
    Ok(())
}

/// The non-superuser role of the `search_path` shadowing tests, owner of schema [`SCHEMA`].
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

/// A shadowing function: the role's `evil.pg_try_advisory_lock(bigint)` answers true
/// and takes nothing. Two replicas of the role: the first leads with the key held on
/// the server, the second never leads while the first holds it.
#[test]
fn search_path_function_shadow() -> Res {
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

/// A shadowing operator: the role's `evil.|(bigint, bigint)` answers 1. A replica of
/// the role acquires, its session is terminated, it acquires again: the second token
/// must be above the first (and the key held on the server by its backend).
#[test]
fn search_path_operator_shadow() -> Res {
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
