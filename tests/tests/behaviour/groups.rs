//! Lease groups against real PostgreSQL: three `replica` processes run the same 12
//! leases in one group (`--group`), with the scenarios' fast test intervals (retry
//! 200 ms, heartbeat 150 ms, query timeout 400 ms). They settle at 4/4/4; after a
//! kill -9 of one, the other two lead its 4 leases again and settle at 6/6; the killed
//! one restarts and they settle at 4/4/4 again. Every lease's terms, over the whole
//! run, never overlap (a term ends when its job returned, or at the kill) and their
//! fencing tokens increase. Figures: `FIGURE <driver> group ...` on stderr.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::*;
use lease_tests::monotonic_nanos;
use lease_tests::scenario::{diff, ms_f, Driver, Event, Node, ReplicaConfig};
use lease_tests::{Cluster, KitError};

const GROUP: &str = "reconcilers";
const LEASES: usize = 12;

/// One job's term: its lease, token, start, and when its job returned (or its process
/// was killed; `None`: still running).
#[derive(Debug, Clone)]
struct Term {
    node: String,
    lease: String,
    token: i64,
    start: u64,
    end: Option<u64>,
}

/// Every term of `node` from its output (`killed`: when it was killed, if it was).
fn terms(node: &Node, label: &str, killed: Option<u64>) -> Vec<Term> {
    let mut done = Vec::new();
    let mut open: Vec<Term> = Vec::new();
    for e in node.events() {
        match e {
            Event::Start { lease, token, t } => open.push(Term {
                node: label.into(),
                lease,
                token,
                start: t,
                end: None,
            }),
            Event::Stop { lease, t } => {
                if let Some(i) = open.iter().position(|o| o.lease == lease) {
                    let mut term = open.remove(i);
                    term.end = Some(t);
                    done.push(term);
                }
            }
            _ => {}
        }
    }
    for mut term in open {
        term.end = killed.map(|k| k.max(term.start));
        done.push(term);
    }
    done
}

/// How many leases each node leads now (a job started and not cancelled).
fn counts(nodes: &[&Node]) -> Vec<usize> {
    nodes.iter().map(|n| n.leading().len()).collect()
}

/// Waits until the nodes lead exactly `want` leases each (every lease led once);
/// returns when, or fails with the counts seen last.
fn wait_counts(nodes: &[&Node], want: &[usize], what: &str) -> Result<u64, KitError> {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = counts(nodes);
        if now == want {
            return Ok(monotonic_nanos());
        }
        if Instant::now() > deadline {
            return Err(timeout(
                &format!("{what}: leading {now:?}, expected {want:?}"),
                nodes,
            ));
        }
        std::thread::sleep(MS(10));
    }
}

fn timeout(context: &str, nodes: &[&Node]) -> KitError {
    KitError::Timeout {
        context: context.into(),
        detail: tails(nodes),
    }
}

/// Overlap and token order of every lease's terms over all nodes: the longest
/// overlap (ns) of two terms of one lease, and the leases whose tokens did not
/// increase in start order.
fn check_terms(all: &[Term]) -> (u64, Vec<String>) {
    let mut by_lease: BTreeMap<&str, Vec<&Term>> = BTreeMap::new();
    for t in all {
        by_lease.entry(&t.lease).or_default().push(t);
    }
    let mut worst = 0;
    let mut out_of_order = Vec::new();
    for (lease, mut ts) in by_lease {
        ts.sort_by_key(|t| t.start);
        for pair in ts.windows(2) {
            let end = pair[0].end.unwrap_or(u64::MAX);
            worst = worst.max(end.saturating_sub(pair[1].start));
            if pair[1].token <= pair[0].token {
                out_of_order.push(format!(
                    "{lease}: {} token {} then {} token {}",
                    pair[0].node, pair[0].token, pair[1].node, pair[1].token
                ));
            }
        }
    }
    (worst, out_of_order)
}

fn group_replica(driver: Driver, url: String) -> ReplicaConfig {
    ReplicaConfig {
        leases: LEASES,
        group: Some(GROUP.into()),
        ..ReplicaConfig::new(driver, url, "reconciler")
    }
}

/// Members of the group on the server: its two-int advisory locks.
fn members(admin: &lease_tests::scenario::Admin) -> Result<i64, KitError> {
    let gid = lease_proto::group_id_for_name(GROUP);
    let sql = format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
         AND granted AND classid::int8 = {gid}"
    );
    Ok(admin.ints(&sql)?.first().copied().unwrap_or(0))
}

fn three_members_share_twelve_leases(driver: Driver) -> Res {
    init();
    let cluster = Cluster::start()?;
    let admin = lease_tests::scenario::Admin::connect(&cluster.conn_string())?;
    let cfg = group_replica(driver, cluster.conn_string());
    let fig = |what: &str, value: String| driver_figure(driver, &format!("group {what}"), value);

    // Three members start together: 4/4/4.
    let t0 = monotonic_nanos();
    let a = cfg.spawn(bin(), "a")?;
    let b = cfg.spawn(bin(), "b")?;
    let mut c = cfg.spawn(bin(), "c")?;
    let settled = wait_counts(&[&a, &b, &c], &[4, 4, 4], "settle")?;
    fig(
        "settle 3 members",
        format!("{:.1} ms", ms_f(diff(t0, settled))),
    );
    assert_eq!(
        members(&admin)?,
        3,
        "three member locks (objsubid 2) in pg_locks"
    );
    // Each member holds leases and wants others: a lease session and a watch
    // session each.
    let sessions = admin.ints(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
         AND backend_type = 'client backend'",
    )?;
    fig("sessions of 3 members", format!("{sessions:?}"));
    let starts_before = |nodes: &[&Node]| -> usize {
        nodes
            .iter()
            .map(|n| {
                (n.events().iter())
                    .filter(|e| matches!(e, Event::Start { .. }))
                    .count()
            })
            .sum()
    };
    let moved_to_settle = starts_before(&[&a, &b, &c]) - LEASES;
    fig("leases moved to settle", moved_to_settle.to_string());
    // Settled: nothing moves for a while (no hand-off in a settled group).
    let quiet = starts_before(&[&a, &b, &c]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        starts_before(&[&a, &b, &c]),
        quiet,
        "a settled group moved a lease\n{}",
        tails(&[&a, &b, &c])
    );

    // kill -9 of c: its 4 leases are led again by a and b, then 6/6.
    let c_leases: Vec<String> = c.leading().into_iter().map(|t| t.lease).collect();
    let t_kill = c.kill9()?;
    let c_terms = terms(&c, "c", Some(t_kill));
    // The first start of each of c's leases on a or b after the kill.
    let first_start = |lease: &str| -> Option<u64> {
        (a.events().into_iter().chain(b.events()))
            .filter_map(|e| match e {
                Event::Start { lease: l, t, .. } if l == lease && t > t_kill => Some(t),
                _ => None,
            })
            .min()
    };
    let deadline = Instant::now() + WAIT;
    let taken: Vec<i128> = loop {
        let found: Vec<Option<u64>> = c_leases.iter().map(|l| first_start(l)).collect();
        if found.iter().all(Option::is_some) {
            break found
                .into_iter()
                .flatten()
                .map(|t| diff(t_kill, t))
                .collect();
        }
        if Instant::now() > deadline {
            return Err(timeout("c's leases led again after the kill", &[&a, &b]));
        }
        std::thread::sleep(MS(5));
    };
    let takeover = taken.iter().copied().max().unwrap_or(0);
    fig(
        "takeover after kill -9 (slowest of 4)",
        format!("{:.1} ms", ms_f(takeover)),
    );
    let even = wait_counts(&[&a, &b], &[6, 6], "6/6 after the kill")?;
    fig(
        "6/6 after kill -9",
        format!("{:.1} ms", ms_f(diff(t_kill, even))),
    );
    // Polling: a survivor reads the membership at most a retry interval after the
    // kill, and the key it now owns is tried in the same round (two statements).
    let bound = cfg.retry + cfg.query_timeout * 2;
    assert!(
        takeover < bound.as_nanos() as i128,
        "takeover {:.1} ms, bound {bound:?}",
        ms_f(takeover)
    );

    let before = starts_before(&[&a, &b]);
    fig(
        "leases moved by the kill",
        (before - (quiet - c_terms.len())).to_string(),
    );
    // c restarts: back to 4/4/4.
    let t_restart = monotonic_nanos();
    let c2 = cfg.spawn(bin(), "c2")?;
    let settled = wait_counts(&[&a, &b, &c2], &[4, 4, 4], "settle after restart")?;
    fig(
        "settle after restart",
        format!("{:.1} ms", ms_f(diff(t_restart, settled))),
    );
    let moved = starts_before(&[&a, &b]) - before + starts_before(&[&c2]);
    fig("leases moved by the restart", moved.to_string());
    let handed = (a.cancels().into_iter().chain(b.cancels()))
        .filter(|(_, kind, t)| kind == "handed-over" && *t > t_restart)
        .count();
    fig("hand-offs by the restart", handed.to_string());
    assert!(moved >= 4, "c2 leads 4, so at least 4 moved");
    assert_eq!(members(&admin)?, 3, "three member locks again");

    // Over the whole run: no overlap, tokens increasing.
    let mut all = c_terms;
    all.extend(terms(&a, "a", None));
    all.extend(terms(&b, "b", None));
    all.extend(terms(&c2, "c2", None));
    let (overlap, out_of_order) = check_terms(&all);
    fig(
        "worst overlap of a lease",
        format!("{:.3} ms", ms_f(overlap as i128)),
    );
    assert_eq!(overlap, 0, "terms overlapped\n{}", tails(&[&a, &b, &c2]));
    assert!(out_of_order.is_empty(), "tokens: {out_of_order:?}");
    fig("terms checked", all.len().to_string());
    drop((a, b, c2));
    Ok(())
}

both_drivers!(three_members_share_twelve_leases);
