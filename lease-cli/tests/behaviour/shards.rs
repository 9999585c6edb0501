//! `lease run --shards`: three replicas share eight shards, each shard's command runs on
//! exactly one of them, a killed replica's shards move to the others, and no shard ever
//! runs twice at once; `lease status --shards` shows the group. The intervals are the
//! group tests' (retry 200 ms, heartbeat 150 ms, query timeout 400 ms). Figures:
//! `FIGURE shards ...` on stderr.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use crate::common::*;
use lease_proto::group_id_for_name;
use lease_tests::{Cluster, Replica};

const INTERVALS: [&str; 6] = [
    "--retry-interval",
    "200ms",
    "--heartbeat-interval",
    "150ms",
    "--query-timeout",
    "400ms",
];

/// Each shard's command: takes the shard's `flock` without waiting (a shard run twice
/// at once, its whole tree included, finds it taken and says `overlap`), appends `start
/// SHARD TOKEN REPLICA NS SHARDS NAME`, asks `lease valid` (`invalid ...` if it is not),
/// and appends `stop SHARD TOKEN REPLICA NS` on SIGTERM. The trap comes first: a shard
/// handed over within a moment of its start (a loaded machine) got SIGTERM before a later
/// trap, died without its stop line, and its term looked still running.
fn script(dir: &Path) -> String {
    let dir = dir.display();
    let lease = env!("CARGO_BIN_EXE_lease");
    format!(
        r#"trap 'echo "stop $LEASE_SHARD $LEASE_TOKEN $REPLICA $(date +%s%N)" >> {dir}/log; exit 0' TERM
exec 9>>{dir}/lock.$LEASE_SHARD
flock -n 9 || echo "overlap $LEASE_SHARD $LEASE_TOKEN $REPLICA" >> {dir}/log
echo "start $LEASE_SHARD $LEASE_TOKEN $REPLICA $(date +%s%N) $LEASE_SHARDS $LEASE_NAME" >> {dir}/log
{lease} valid -q || echo "invalid $LEASE_SHARD $LEASE_TOKEN $REPLICA" >> {dir}/log
while :; do sleep 0.02; done"#
    )
}

/// `lease run ... --shards N NAME` as replica `label` (its commands' `$REPLICA`).
fn replica(c: &Cluster, name: &str, shards: u16, dir: &Path, label: &str) -> Replica {
    let shards = shards.to_string();
    let args: Vec<&str> = INTERVALS.into_iter().chain(["--shards", &shards]).collect();
    let mut cmd = run_sh(&c.url("postgres"), &args, name, &script(dir));
    cmd.env("REPLICA", label);
    Replica::spawn(cmd).expect("spawn lease run --shards")
}

fn label_index(labels: &[&str], label: &str) -> usize {
    labels.iter().position(|l| *l == label).expect("a label")
}

/// One run of a shard's command: from its `start` line to its `stop` line (`None`:
/// still running, or killed with its runner).
#[derive(Debug, Clone)]
struct Term {
    shard: u16,
    token: i64,
    replica: String,
    start: u128,
    stop: Option<u128>,
}

/// Every term in the log, in start order, and the `overlap` and `invalid` lines.
fn terms(dir: &Path) -> (Vec<Term>, Vec<String>) {
    let text = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    let mut terms: Vec<Term> = Vec::new();
    let mut overlaps = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some("start") if w.len() >= 5 => terms.push(Term {
                shard: w[1].parse().expect("shard"),
                token: w[2].parse().expect("token"),
                replica: w[3].to_owned(),
                start: w[4].parse().expect("ns"),
                stop: None,
            }),
            Some("stop") if w.len() >= 5 => {
                let (shard, token): (u16, i64) = (w[1].parse().unwrap(), w[2].parse().unwrap());
                if let Some(t) = (terms.iter_mut())
                    .find(|t| t.shard == shard && t.token == token && t.replica == w[3])
                {
                    t.stop = Some(w[4].parse().expect("ns"));
                }
            }
            Some("overlap" | "invalid") => overlaps.push(line.to_owned()),
            _ => {}
        }
    }
    terms.sort_by_key(|t| t.start);
    (terms, overlaps)
}

/// The running terms (no stop, the replica not in `dead`), by shard.
fn running<'a>(terms: &'a [Term], dead: &[&str]) -> BTreeMap<u16, Vec<&'a Term>> {
    let mut out: BTreeMap<u16, Vec<&Term>> = BTreeMap::new();
    for t in terms {
        if t.stop.is_none() && !dead.contains(&t.replica.as_str()) {
            out.entry(t.shard).or_default().push(t);
        }
    }
    out
}

/// Waits until each of the `shards` runs exactly once, on the live replicas (`labels`),
/// with these counts (sorted), unchanged for 500 ms; returns the running terms. On
/// failure the message has every replica's stderr (`replicas`: what `lease run` logged of
/// each hand-off, loss and kill).
fn settle(
    dir: &Path,
    shards: u16,
    (labels, replicas): (&[&str], &[Replica]),
    dead: &[&str],
    counts: &[usize],
) -> BTreeMap<u16, Term> {
    let start = Instant::now();
    let mut stable: Option<(Instant, String)> = None;
    loop {
        let (all, overlaps) = terms(dir);
        assert!(overlaps.is_empty(), "{overlaps:?}");
        let now = running(&all, dead);
        let once = now.len() == usize::from(shards) && now.values().all(|t| t.len() == 1);
        let mut per: Vec<usize> = (labels.iter())
            .map(|l| now.values().flatten().filter(|t| t.replica == *l).count())
            .collect();
        per.sort_unstable();
        if once && per == counts {
            let key = format!("{now:?}");
            match &stable {
                Some((since, k)) if *k == key && since.elapsed() >= MS(500) => {
                    return now.into_iter().map(|(s, t)| (s, t[0].clone())).collect();
                }
                Some((_, k)) if *k == key => {}
                _ => stable = Some((Instant::now(), key)),
            }
        } else {
            stable = None;
        }
        if start.elapsed() >= MS(20_000) {
            let logs: Vec<String> = (replicas.iter())
                .map(|r| format!("--- a replica's stderr ---\n{}", stderr_of(r)))
                .collect();
            panic!(
                "not settled at {counts:?} on {labels:?}: {per:?}, {now:#?}\n{}",
                logs.join("\n")
            );
        }
        std::thread::sleep(MS(20));
    }
}

/// Three replicas of `lease run --shards 8`: 3/3/2 shards, each once; `kill -9` of the
/// runner of three → its commands are killed by their watchdogs and its shards start on
/// the others (4/4); SIGTERM stops the rest (exit 0). Over the whole run no shard's
/// commands overlapped (their `flock`, and each term's stop before the next start) and
/// each shard's tokens increased.
#[test]
fn three_replicas_share_eight_shards_and_take_over_a_killed_one() {
    let c = cluster();
    let name = unique("shards");
    let dir = Dir::new("shards");
    let labels = ["a", "b", "c"];
    let began = now_nanos();
    let mut replicas: Vec<Replica> = (labels.iter())
        .map(|l| replica(&c, &name, 8, dir.path(), l))
        .collect();
    let before = settle(dir.path(), 8, (&labels, &replicas), &[], &[2, 3, 3]);
    let last = before.values().map(|t| t.start).max().unwrap_or(began);
    eprintln!(
        "FIGURE shards 3 replicas started together: 3/3/2, the last shard's command started {:.0} ms after their start",
        ms_between(began, last)
    );
    for (label, r) in labels.iter().zip(&mut replicas) {
        assert!(r.is_alive(), "{label} exited: {}", stderr_of(r));
    }
    let (all, _) = terms(dir.path());
    assert!(
        std::fs::read_to_string(dir.file("log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("start "))
            .all(|l| l.contains(&format!(" 8 {name}/"))),
        "LEASE_SHARDS or LEASE_NAME: {all:?}"
    );

    // The victim: a replica with three shards.
    let victim = *(labels.iter())
        .find(|l| before.values().filter(|t| t.replica == **l).count() == 3)
        .expect("a replica with three shards");
    let moved: Vec<u16> = (before.values())
        .filter(|t| t.replica == victim)
        .map(|t| t.shard)
        .collect();
    let survivors: Vec<&str> = labels.iter().copied().filter(|l| *l != victim).collect();
    let v = label_index(&labels, victim);
    let killed = now_nanos();
    replicas[v].kill9().expect("kill -9");
    let after = settle(dir.path(), 8, (&survivors, &replicas), &[victim], &[4, 4]);
    let mut worst = 0.0f64;
    for shard in &moved {
        let t = &after[shard];
        assert!(t.start > killed, "shard {shard} did not move: {t:?}");
        let ms = ms_between(killed, t.start);
        worst = worst.max(ms);
        eprintln!(
            "FIGURE shards kill9 shard {shard} started on {} {ms:.1} ms after the kill",
            t.replica
        );
    }
    eprintln!(
        "FIGURE shards kill9 all {} moved shards started within {worst:.1} ms",
        moved.len()
    );
    assert!(
        worst < 2_000.0,
        "moved shards started {worst:.1} ms after the kill"
    );

    // SIGTERM to one survivor: its commands stop, it exits 0, the last replica runs all 8.
    let (stopped, last) = (survivors[0], survivors[1]);
    let (s, l) = (label_index(&labels, stopped), label_index(&labels, last));
    for i in [s, l] {
        let alive = replicas[i].is_alive();
        assert!(alive, "{} exited: {}", labels[i], stderr_of(&replicas[i]));
    }
    let handed: Vec<u16> = (after.values())
        .filter(|t| t.replica == stopped)
        .map(|t| t.shard)
        .collect();
    let termed = now_nanos();
    replicas[s].sigterm().expect("SIGTERM");
    let status = replicas[s].wait_exit(MS(10_000)).expect("exit");
    assert_eq!(
        status.code(),
        Some(0),
        "{stopped}: {}",
        stderr_of(&replicas[s])
    );
    let exited = now_nanos();
    let alone = settle(
        dir.path(),
        8,
        (&[last], &replicas),
        &[victim, stopped],
        &[8],
    );
    let taken = handed
        .iter()
        .map(|s| alone[s].start)
        .max()
        .unwrap_or(exited);
    eprintln!(
        "FIGURE shards sigterm {stopped} exited 0 {:.1} ms after SIGTERM; its {} shards all \
         started on {last} {:.1} ms after its exit (bound: --retry-interval 200 ms)",
        ms_between(termed, exited),
        handed.len(),
        ms_between(exited, taken)
    );
    replicas[l].sigterm().expect("SIGTERM");
    let status = replicas[l].wait_exit(MS(10_000)).expect("exit");
    assert_eq!(
        status.code(),
        Some(0),
        "{last}: {}",
        stderr_of(&replicas[l])
    );

    // Every shard's terms, in start order: tokens increase, and each term stopped
    // before the next started (a killed one has no stop: its flock covers it).
    let (all, overlaps) = terms(dir.path());
    assert!(overlaps.is_empty(), "{overlaps:?}");
    for shard in 0..8 {
        let list: Vec<&Term> = all.iter().filter(|t| t.shard == shard).collect();
        for w in list.windows(2) {
            assert!(w[0].token < w[1].token, "shard {shard}: tokens {list:#?}");
            if let Some(stop) = w[0].stop {
                assert!(stop <= w[1].start, "shard {shard} overlapped: {list:#?}");
            } else {
                assert_eq!(w[0].replica, victim, "shard {shard}: {list:#?}");
                assert!(killed <= w[1].start, "shard {shard}: {list:#?}");
            }
        }
        let last = list.last().expect("the shard ran");
        assert!(last.stop.is_some(), "shard {shard} not stopped: {list:#?}");
    }
    eprintln!(
        "FIGURE shards {} terms over 8 shards, none overlapping",
        all.len()
    );
}

/// `lease status NAME --shards 4` with two replicas: a line per member (its backend
/// pid, application, and the shards it leads), then each shard's holder (one of the
/// members) and waiters; `--json` the same; the unnamed listing names the shards' keys.
#[test]
fn status_shows_the_group() {
    let c = cluster();
    let name = unique("shardstatus");
    let dir = Dir::new("shardstatus");
    let labels = ["a", "b"];
    let mut replicas: Vec<Replica> = (labels.iter())
        .map(|l| replica(&c, &name, 4, dir.path(), l))
        .collect();
    let running = settle(dir.path(), 4, (&labels, &replicas), &[], &[2, 2]);
    let members: Vec<i32> = (c.sql(&format!(
        "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
         AND granted AND classid = {} ORDER BY 1",
        group_id_for_name(&name)
    )))
    .expect("query pg_locks")
    .lines()
    .map(|l| l.parse().expect("a pid"))
    .collect();
    assert_eq!(members.len(), 2, "{members:?}");
    let status = |args: &[&str]| {
        let mut cmd = lease();
        cmd.arg("status")
            .args(["--database-url", &c.conn_string()])
            .args(args);
        let (st, out, err, _) = output(cmd, MS(10_000));
        assert!(st.success(), "{st}: {err}");
        out
    };

    let text = status(&["--shards", "4", &name]);
    eprintln!("{text}");
    let mut blocks = text.split("\n\n");
    let group = blocks.next().expect("the members' table");
    let leases = blocks.next().expect("the leases' table");
    let mut led = Vec::new();
    for line in group.lines().skip(1) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[0], name, "{line}");
        let pid: i32 = cells[1].parse().expect("a pid");
        assert!(members.contains(&pid), "{line}: members {members:?}");
        assert_eq!(cells[2], app(&name), "{line}");
        assert_eq!(cells[5], "2:", "{line}");
        led.extend(
            cells[6]
                .split(',')
                .map(|s| (s.parse::<u16>().expect("shard"), pid)),
        );
    }
    led.sort_unstable();
    assert_eq!(led.len(), 4, "{group}");
    for (shard, pid) in &led {
        let row = (leases.lines())
            .find(|l| l.starts_with(&format!("{name}/{shard} ")) && l.contains(" holder "))
            .unwrap_or_else(|| panic!("no holder of shard {shard}: {leases}"));
        assert_eq!(
            row.split_whitespace().nth(3),
            Some(&*pid.to_string()),
            "{row}"
        );
    }
    // Each shard's command runs on the replica whose member session holds it.
    let by_replica: BTreeMap<&str, Vec<u16>> = labels
        .iter()
        .map(|l| {
            let mut s: Vec<u16> = (running.values())
                .filter(|t| t.replica == *l)
                .map(|t| t.shard)
                .collect();
            s.sort_unstable();
            (*l, s)
        })
        .collect();
    for pid in &members {
        let mut s: Vec<u16> = led
            .iter()
            .filter(|(_, p)| p == pid)
            .map(|(s, _)| *s)
            .collect();
        s.sort_unstable();
        assert!(
            by_replica.values().any(|v| *v == s),
            "{by_replica:?} vs {led:?}"
        );
    }

    let json = status(&["--json", "--shards", "4", &name]);
    let lines: Vec<serde_json::Value> = (json.lines())
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), 5, "{json}");
    let g = &lines[0];
    assert_eq!(g["group"], name.as_str());
    assert_eq!(g["group_id"], group_id_for_name(&name));
    assert_eq!(g["shards"], 4);
    let m = g["members"].as_array().expect("members");
    assert_eq!(m.len(), 2, "{g}");
    for member in m {
        assert_eq!(member["leads"].as_array().map(Vec::len), Some(2), "{g}");
        assert_eq!(member["application_name"], app(&name).as_str());
    }
    for (i, v) in lines[1..].iter().enumerate() {
        assert_eq!(v["name"], format!("{name}/{i}").as_str(), "{v}");
        assert_eq!(v["held"], true, "{v}");
    }

    // With no name, every shard's key is named after the group's `lease:NAME`.
    let every = status(&["--json"]);
    for shard in 0..4 {
        let want = format!("{name}/{shard}");
        assert!(
            every.lines().any(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
                v["name"] == want.as_str()
            }),
            "{want} not in {every}"
        );
    }
    for r in &mut replicas {
        r.sigterm().expect("SIGTERM");
        assert_eq!(r.wait_exit(MS(10_000)).expect("exit").code(), Some(0));
    }
}
