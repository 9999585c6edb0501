//! Moving a lease to a new cluster (a dump/restore into another server) as the runbook in
//! docs/operating.md ("Moving to a new cluster") says, with two throwaway clusters and
//! three `lease run` replicas: behind a hold on the new cluster (a rolling re-point), or
//! after stopping every replica. Each command stamps a file named by its pid every 10 ms,
//! and no two commands may have run at once. The control re-points one by one without
//! the hold: two leaders, one per cluster, during the rollout.

use std::time::{Duration, Instant};

use lease_tests::{Cluster, Replica, Stream};

use crate::common::*;

/// Prints `pid=$$ token=$LEASE_TOKEN`, then stamps `DIR/$$` every 10 ms until SIGTERM.
fn stamper(dir: &Dir) -> String {
    format!(
        r#"echo "pid=$$ token=$LEASE_TOKEN"; while :; do date +%s%N >> {}/$$; sleep 0.01; done"#,
        dir.path().display()
    )
}

/// `key` of each command a replica started (its `pid=` lines).
fn started(r: &Replica, key: &str) -> Vec<i64> {
    r.lines()
        .iter()
        .filter(|l| l.stream == Stream::Stdout && l.text.starts_with("pid="))
        .filter_map(|l| field(&l.text, key))
        .collect()
}

/// Waits until the replicas together started `n` commands.
fn wait_commands(rs: &[Replica], n: usize, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if rs.iter().map(|r| started(r, "pid").len()).sum::<usize>() >= n {
            return true;
        }
        std::thread::sleep(MS(5));
    }
    false
}

/// `lease status --json` of `name` on `url`: whether it is held, and its standbys.
fn status(url: &str, name: &str) -> (bool, usize) {
    let out = lease()
        .args(["status", "--json", "--database-url", url, name])
        .output()
        .expect("run lease status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
    let standbys = v["standbys"].as_array().map_or(0, Vec::len);
    (v["held"] == true, standbys)
}

/// Waits until `lease status` on `url` shows `name` free: no holder, no standby.
fn wait_free(url: &str, name: &str) {
    let start = Instant::now();
    while status(url, name) != (false, 0) {
        assert!(start.elapsed() < MS(10_000), "{url} still shows the lease");
        std::thread::sleep(MS(50));
    }
}

/// SIGTERM to a replica; it exits 0.
fn stop(r: &mut Replica) {
    r.sigterm().expect("SIGTERM");
    let code = r.wait_exit(MS(15_000)).expect("the replica exits");
    assert_eq!(code.code(), Some(0), "{}", stderr_of(r));
}

/// How the replicas move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// The runbook's first way: a hold on the new cluster from before the first move
    /// until the old cluster shows the lease free; the replicas move one by one.
    BehindAHold,
    /// The runbook's second way: every replica stopped, the old cluster shows the lease
    /// free, then every replica started on the new one.
    StopEveryReplicaFirst,
    /// The control: one by one, nothing else.
    Rolling,
}

/// What a move measured.
struct Moved {
    /// The worst overlap between two commands, ms (negative: the smallest gap).
    worst: f64,
    /// From the old cluster's last stamp to the new cluster's first, ms.
    leaderless_ms: f64,
}

/// Three replicas on one cluster, moved to another as `how` says (one by one: SIGTERM,
/// exit, start on the new cluster, 300 ms between).
fn move_replicas(how: Move) -> Moved {
    let old = Cluster::start().expect("start the old cluster");
    let new = Cluster::start().expect("start the new cluster");
    let (old_url, new_url) = (old.url("postgres"), new.url("postgres"));
    let dir = Dir::new("migration");
    let name = unique("migration");
    let script = stamper(&dir);
    let mut on_old: Vec<Replica> = (0..3)
        .map(|_| Replica::spawn(run_sh(&old_url, &FAST, &name, &script)).expect("spawn"))
        .collect();
    assert!(wait_commands(&on_old, 1, MS(10_000)), "nobody led");
    for r in &on_old {
        r.wait_for_line(
            |l| l.contains("standing by") || l.starts_with("pid="),
            MS(10_000),
        )
        .expect("each replica leads or stands by");
    }
    // The leader's command has stamped (the stop-first move stops it at once).
    let start = Instant::now();
    while intervals(dir.path()).is_empty() {
        assert!(
            start.elapsed() < MS(5_000),
            "the leader's command never stamped"
        );
        std::thread::sleep(MS(5));
    }

    // The hold: a `lease run` on the new cluster, before any replica moves.
    let hold = (how == Move::BehindAHold).then(|| {
        let mut cmd = lease();
        cmd.arg("run")
            .args(["--database-url", &new_url])
            .args(FAST)
            .args([&name, "--", "sleep", "100000"]);
        let h = Replica::spawn(cmd).expect("spawn the hold");
        h.wait_for_line(|l| l.contains("leading: started"), MS(10_000))
            .expect("the hold leads on the new cluster");
        assert_eq!(status(&new_url, &name), (true, 0), "the hold holds");
        h
    });

    let mut on_new: Vec<Replica> = Vec::new();
    let start = Instant::now();
    if how == Move::StopEveryReplicaFirst {
        on_old.iter().for_each(|r| r.sigterm().expect("SIGTERM"));
        on_old.iter_mut().for_each(stop);
        wait_free(&old_url, &name);
    }
    for r in &mut on_old {
        if how != Move::StopEveryReplicaFirst {
            stop(r);
        }
        let moved = Replica::spawn(run_sh(&new_url, &FAST, &name, &script)).expect("spawn");
        if hold.is_some() {
            moved
                .wait_for_line(|l| l.contains("standing by"), MS(10_000))
                .expect("a moved replica stands by behind the hold");
        }
        on_new.push(moved);
        std::thread::sleep(MS(300));
    }
    let took_ms = start.elapsed().as_secs_f64() * 1e3;
    // The old cluster shows the lease free; then the hold's release.
    wait_free(&old_url, &name);
    if let Some(mut h) = hold {
        stop(&mut h);
    }
    assert!(
        wait_commands(&on_new, 1, MS(10_000)),
        "nobody leads on the new cluster"
    );
    std::thread::sleep(MS(300));
    on_new.iter_mut().for_each(stop);

    let all = intervals(dir.path());
    let pids = |rs: &[Replica]| -> Vec<i32> {
        rs.iter()
            .flat_map(|r| started(r, "pid"))
            .map(|p| p as i32)
            .collect()
    };
    let (olds, news) = (pids(&on_old), pids(&on_new));
    let last_old = olds.iter().filter_map(|p| all.get(p)).map(|i| i.1).max();
    let first_new = news.iter().filter_map(|p| all.get(p)).map(|i| i.0).min();
    let (worst, p, q) = worst_overlap(dir.path()).expect("two commands stamped");
    let leaderless_ms = match (last_old, first_new) {
        (Some(l), Some(f)) => ms_between(l, f),
        _ => f64::NAN,
    };
    let last_old_token = on_old.iter().flat_map(|r| started(r, "token")).max();
    let first_new_token = on_new.iter().flat_map(|r| started(r, "token")).min();
    eprintln!(
        "{how:?}: 3 replicas moved to a new cluster in {took_ms:.0} ms; commands on the old \
         cluster {olds:?}, on the new {news:?}; worst overlap {worst:.1} ms ({p}, {q}); from \
         the old cluster's last stamp to the new one's first: {leaderless_ms:.1} ms; tokens \
         {last_old_token:?} (old's last) -> {first_new_token:?} (new's first)"
    );
    if how != Move::Rolling {
        // Tokens grow across the move: they are the server's clock (docs/guarantees.md).
        assert!(
            last_old_token < first_new_token,
            "{last_old_token:?} {first_new_token:?}"
        );
    }
    Moved {
        worst,
        leaderless_ms,
    }
}

/// The runbook's first way: no two commands at once.
#[test]
fn a_rolling_move_to_a_new_cluster_behind_a_hold_never_overlaps() {
    let m = move_replicas(Move::BehindAHold);
    assert!(m.worst < 0.0, "two commands at once for {:.1} ms", m.worst);
    assert!(m.leaderless_ms > 0.0, "{}", m.leaderless_ms);
}

/// The runbook's second way: no two commands at once.
#[test]
fn a_move_to_a_new_cluster_after_stopping_every_replica_never_overlaps() {
    let m = move_replicas(Move::StopEveryReplicaFirst);
    assert!(m.worst < 0.0, "two commands at once for {:.1} ms", m.worst);
    assert!(m.leaderless_ms > 0.0, "{}", m.leaderless_ms);
}

/// The control: a rolling re-point without the hold gives two leaders, one per cluster
/// (the measure sees an overlap when there is one).
#[test]
fn control_a_rolling_move_without_the_hold_has_two_leaders() {
    let m = move_replicas(Move::Rolling);
    assert!(
        m.worst > 0.0,
        "no overlap without the hold: {:.1} ms",
        m.worst
    );
}
