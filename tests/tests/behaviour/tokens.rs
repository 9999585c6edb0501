//! Fencing tokens on a real PostgreSQL, across what operators do to a server, and a
//! winning try that no synchronous standby can hold up.
//!
//! - Tokens grow per key across an immediate-mode stop or a crash of the server, the
//!   promotion of a lagging asynchronous standby, a `pg_upgrade` of a cluster that was once
//!   promoted (the upgrade starts a new cluster on WAL timeline 1), a migration into a new
//!   cluster (transaction ids restart), and the promotion of a synchronous standby.
//! - With `synchronous_standby_names` naming a standby that is down, a winning try that
//!   wrote WAL would wait in `SyncRep` holding its key; no lease statement writes WAL, so
//!   none waits and no lease is stranded.
//!
//! Figures are printed as `FIGURE <what>: <value>` lines on stderr (`--nocapture`).

use crate::common::*;
use lease_tests::monotonic_nanos;
use lease_tests::scenario::diff;
use lease_tests::scenario::ms;
use lease_tests::scenario::ms_f;
use lease_tests::scenario::Admin;
use lease_tests::scenario::Driver;
use lease_tests::scenario::Event;
use lease_tests::scenario::Node;
use lease_tests::scenario::ReplicaConfig;
use lease_tests::Cluster;
use lease_tests::KitError;
use std::time::Duration;
use std::time::Instant;

/// `(token, t)` of the `n`-th `start` line (1-based) of `node`.
fn nth_start(node: &Node, n: usize) -> Result<(i64, u64), KitError> {
    let t = node.wait_starts(n, WAIT)?;
    let token = node
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Start { token, .. } => Some(*token),
            _ => None,
        })
        .nth(n - 1)
        .expect("the n-th start was seen");
    Ok((token, t))
}

/// The first token not strictly above every token before it: `(index, token, max before)`.
fn first_not_increasing(tokens: &[i64]) -> Option<(usize, i64, i64)> {
    (1..tokens.len()).find_map(|i| {
        let before = tokens[..i].iter().copied().max().unwrap_or(i64::MIN);
        (tokens[i] <= before).then_some((i, tokens[i], before))
    })
}

/// How many times `tokens_repeat_after_server_crash` takes the server down right after
/// an acquisition.
const CRASH_ROUNDS: usize = 5;

/// A replica acquires; right after its job starts the server goes down without flushing
/// (alternately `pg_ctl stop -m immediate`-like SIGQUIT and SIGKILL of every server
/// process), comes back, and the replica acquires again. Each token must be above every
/// earlier one; the acquiring transaction's commit is asynchronous (it writes no WAL of
/// its own), so after recovery the server hands out the same xid again.
#[test]
fn tokens_repeat_after_server_crash() -> Res {
    let mut cluster = Cluster::start()?;
    let a = ReplicaConfig::new(Driver::Tokio, cluster.conn_string(), "job").spawn(bin(), "A")?;
    let mut tokens = Vec::new();
    let mut log = Vec::new();
    for round in 1..=CRASH_ROUNDS {
        let (token, start) = nth_start(&a, round)?;
        let t_down = monotonic_nanos();
        let how = if round % 2 == 1 {
            cluster.stop()?;
            "immediate stop"
        } else {
            cluster.crash()?;
            "SIGKILL crash"
        };
        tokens.push(token);
        log.push(format!(
            "token {token}, then {how} {:.1} ms after the job started",
            ms_f(diff(start, t_down))
        ));
        cluster.start_again()?;
    }
    let (token, _) = nth_start(&a, CRASH_ROUNDS + 1)?;
    tokens.push(token);
    log.push(format!("token {token} (after the last restart)"));
    figure("crash: tokens", format!("{tokens:?}"));
    if let Some((i, token, before)) = first_not_increasing(&tokens) {
        panic!(
            "token {token} (acquisition {}) is not above the earlier maximum {before}: \
             tokens {tokens:?}\n  {}\n{}",
            i + 1,
            log.join("\n  "),
            a.tail()
        );
    }
    Ok(())
}

/// How many acquisitions the primary makes while its standby is down, in
/// `tokens_go_backwards_after_promotion`.
const LAGGED_ACQUISITIONS: usize = 3;

/// A primary with an asynchronous streaming standby. The standby has replayed the first
/// acquisition, then stops; the primary hands out more tokens and stops too; the standby
/// starts without a reachable primary and is promoted. A lease acquired there must carry a
/// token above every token of the old primary; today the promoted server's xids continue
/// from what it replayed, so it goes backwards.
#[test]
fn tokens_go_backwards_after_promotion() -> Res {
    let mut primary = Cluster::start()?;
    let mut standby = primary.start_standby()?;
    let admin = Admin::connect(&primary.conn_string())?;
    let a = ReplicaConfig::new(Driver::Tokio, primary.conn_string(), "job").spawn(bin(), "A")?;
    let (first, _) = nth_start(&a, 1)?;
    // The standby replays the first acquisition, then stops: from here on it lags. The
    // wait is for a WAL switch after it (flushed at once, no xid consumed: the tokens are
    // xids): the replay reaches the end of the switched-out segment that pg_switch_wal
    // returns. The insert position is no target: past the header of a new page it stays
    // out of the replay's reach until a later record (about 12 s: most of this test).
    let switched = primary.sql("SELECT pg_switch_wal()")?;
    let deadline = Instant::now() + WAIT;
    while standby.sql(&format!(
        "SELECT pg_last_wal_replay_lsn() >= '{switched}'::pg_lsn"
    ))? != "t"
    {
        assert!(
            Instant::now() < deadline,
            "the standby did not replay up to {switched}"
        );
        std::thread::sleep(ms(20));
    }
    standby.stop()?;
    let mut old = vec![first];
    let mut terminated = None;
    for n in 2..=LAGGED_ACQUISITIONS + 1 {
        // A's current session, as the server sees it (A may print its start before its pid).
        let deadline = Instant::now() + WAIT;
        let pid = loop {
            match admin.holders(key("job"))?[..] {
                [pid] if Some(pid) != terminated => break pid,
                _ => assert!(Instant::now() < deadline, "A holds no key\n{}", a.tail()),
            }
            std::thread::sleep(ms(5));
        };
        assert!(admin.terminate(pid)?, "backend {pid} was not signalled");
        terminated = Some(pid);
        let (token, _) = nth_start(&a, n)?;
        old.push(token);
    }
    drop(admin);
    primary.stop()?;
    standby.start_again()?;
    standby.promote()?;
    let timelines = standby.sql("SELECT timeline_id FROM pg_control_checkpoint()")?;
    let c = ReplicaConfig::new(Driver::Tokio, standby.conn_string(), "job").spawn(bin(), "C")?;
    let (new, _) = nth_start(&c, 1)?;
    let old_max = old.iter().copied().max().unwrap_or(i64::MIN);
    figure(
        "promotion: tokens",
        format!(
            "old primary {old:?} (standby stopped after {first}), promoted standby \
             (timeline {timelines}) {new}"
        ),
    );
    assert!(
        new > old_max,
        "the promoted standby's token {new} is not above the old primary's tokens {old:?} \
         (the standby replayed up to the acquisition with token {first}, then lagged; \
         promoted on timeline {timelines})\n{}\n{}",
        a.tail(),
        c.tail()
    );
    Ok(())
}

/// The token of the `n`-th `start` line (1-based) of `node`.
fn nth_token(node: &Node, n: usize) -> Result<i64, KitError> {
    node.wait_starts(n, WAIT)?;
    Ok(node
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Start { token, .. } => Some(*token),
            _ => None,
        })
        .nth(n - 1)
        .expect("the n-th start was seen"))
}

/// Acquires once with a new replica on `cluster`, stops it: its token.
fn acquire_once(cluster: &Cluster, label: &str) -> Result<i64, KitError> {
    let mut node =
        ReplicaConfig::new(Driver::Tokio, cluster.conn_string(), "job").spawn(bin(), label)?;
    let token = nth_token(&node, 1)?;
    node.kill9()?;
    node.wait_exit(WAIT)?;
    Ok(token)
}

/// Burns `n` transaction ids (one committed transaction each).
fn burn_xids(cluster: &Cluster, n: u32) -> Res {
    cluster
        .sql(&format!(
            "DO $$BEGIN FOR i IN 1..{n} LOOP PERFORM pg_current_xact_id(); COMMIT; \
             END LOOP; END$$"
        ))
        .map(drop)
}

fn timeline(cluster: &Cluster) -> Result<String, KitError> {
    cluster.sql("SELECT timeline_id FROM pg_control_checkpoint()")
}

/// A primary, its standby promoted (timeline 2), a lease acquired there; then the
/// promoted cluster is upgraded with `pg_upgrade` (a new cluster: timeline 1). The first
/// token on the upgraded cluster must be above the one before the upgrade.
#[test]
fn tokens_grow_across_pg_upgrade_of_a_promoted_cluster() -> Res {
    let mut primary = Cluster::start()?;
    let mut standby = primary.start_standby()?;
    let first = acquire_once(&primary, "A")?;
    primary.stop()?;
    standby.promote()?;
    let promoted_timeline = timeline(&standby)?;
    let before = acquire_once(&standby, "B")?;
    let mut upgraded = standby.pg_upgrade()?;
    let upgraded_timeline = timeline(&upgraded)?;
    let after = acquire_once(&upgraded, "C")?;
    figure(
        "pg_upgrade: tokens",
        format!(
            "{first} on the primary, {before} on the promoted standby (timeline \
             {promoted_timeline}), {after} after pg_upgrade (timeline {upgraded_timeline})"
        ),
    );
    assert!(
        before > first && after > before,
        "tokens do not grow: {first} on the primary, {before} on the promoted standby \
         (timeline {promoted_timeline}), {after} after pg_upgrade (timeline \
         {upgraded_timeline})"
    );
    upgraded.stop()?;
    Ok(())
}

/// A migration into a new cluster (dump and restore, or a logical-replication cut-over: a
/// lease has no schema to move, so a new cluster is what the replicas find). Transaction
/// ids restart there; the first token must still be above the old cluster's.
#[test]
fn tokens_grow_across_a_migration_into_a_new_cluster() -> Res {
    let mut old = Cluster::start()?;
    // An old cluster has used some transaction ids.
    burn_xids(&old, 2000)?;
    let before = acquire_once(&old, "A")?;
    let old_xid = old.sql("SELECT pg_current_xact_id()")?;
    old.stop()?;
    let new = Cluster::start()?;
    let new_xid = new.sql("SELECT pg_current_xact_id()")?;
    let after = acquire_once(&new, "B")?;
    figure(
        "migration: tokens",
        format!(
            "{before} on the old cluster (next xid {old_xid}), {after} on the new one \
             (next xid {new_xid})"
        ),
    );
    assert!(
        after > before,
        "the new cluster's token {after} is not above the old cluster's {before} (xids: \
         old {old_xid}, new {new_xid})"
    );
    Ok(())
}

/// Promotion under synchronous replication. A primary whose every commit waits for its
/// streaming standby (`synchronous_standby_names = '*'`) hands out tokens, crashes, and
/// the standby is promoted: its first token is above them.
#[test]
fn tokens_grow_across_promotion_of_a_synchronous_standby() -> Res {
    let mut primary = Cluster::start()?;
    let standby = primary.start_standby()?;
    primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")?;
    primary.sql("SELECT pg_reload_conf()")?;
    let deadline = Instant::now() + WAIT;
    while primary.sql("SELECT string_agg(sync_state, ',') FROM pg_stat_replication")? != "sync" {
        assert!(
            Instant::now() < deadline,
            "the standby did not become synchronous"
        );
        std::thread::sleep(ms(50));
    }
    let before: Vec<i64> = (0..3)
        .map(|i| acquire_once(&primary, &format!("A{i}")))
        .collect::<Result<_, _>>()?;
    primary.crash()?;
    standby.promote()?;
    let after = acquire_once(&standby, "C")?;
    figure(
        "synchronous promotion: tokens",
        format!(
            "{before:?} on the primary, {after} on the promoted standby (timeline {})",
            timeline(&standby)?
        ),
    );
    let mut all = before.clone();
    all.push(after);
    assert!(
        all.windows(2).all(|w| w[1] > w[0]),
        "tokens do not grow: {before:?} on the primary, then {after} on the promoted standby"
    );
    Ok(())
}

/// Before tokens came from the server's clock, the winning try made a transaction id,
/// which a hot standby refuses (`cannot assign TransactionIds during recovery`): a try
/// that reached a standby past the setup's recovery check failed. The clock token
/// needs no xid, so the try checks recovery itself: on a hot standby it wins nothing
/// and takes nothing.
#[test]
fn a_try_on_a_hot_standby_takes_nothing() -> Res {
    let primary = Cluster::start()?;
    let standby = primary.start_standby()?;
    let session = Admin::connect(&standby.conn_string())?;
    let nonce = 77;
    let rows = session.rows(&format!(
        "SELECT pg_catalog.set_config('{}', '{nonce}', false), pg_catalog.pg_backend_pid()",
        lease_proto::server::NONCE_SETTING
    ))?;
    let pid: i64 = rows[0][1]
        .as_deref()
        .and_then(|p| p.parse().ok())
        .expect("pid");
    let key = 4242;
    let sql = lease_proto::Statement::TryLock {
        keys: vec![key],
        backend_pid: pid,
        nonce,
    }
    .sql();
    let reply = session.rows(&sql)?;
    let held = standby.held_advisory_keys()?;
    figure(
        "a try on a hot standby",
        format!("rows {reply:?}, advisory locks {held:?}"),
    );
    let won = reply
        .iter()
        .any(|r| r[0].as_deref() == Some("4242") && r[1].is_some());
    assert!(
        !won && held.is_empty(),
        "the try won on a hot standby: rows {reply:?}, advisory locks there {held:?}"
    );
    Ok(())
}

/// `synchronous_standby_names` names a standby that is down. A locker leads one lease;
/// then a second lease of the same locker (same session) is acquired. It must be
/// acquired, and the first lease must not be lost; no backend waits in `SyncRep`.
#[test]
fn a_down_synchronous_standby_strands_no_lease() -> Res {
    let cluster = Cluster::start()?;
    let config = ReplicaConfig {
        leases: 2,
        ..ReplicaConfig::new(Driver::Tokio, cluster.conn_string(), "job")
    };
    // The first lease before the setting, on a locker of its own; the second locker runs
    // both leases: the one free key is tried once the setting is in force.
    let first = ReplicaConfig::new(Driver::Tokio, cluster.conn_string(), "job-1");
    let mut holder = first.spawn(bin(), "H")?;
    nth_token(&holder, 1)?;
    cluster.sql("ALTER SYSTEM SET synchronous_standby_names = 'ghost'")?;
    cluster.sql("SELECT pg_reload_conf()")?;
    let deadline = Instant::now() + WAIT;
    while cluster.sql("SHOW synchronous_standby_names")? != "ghost" {
        assert!(Instant::now() < deadline, "the setting did not apply");
        std::thread::sleep(ms(20));
    }
    let a = config.spawn(bin(), "A")?;
    // A wins job-0 (free) and stands by for job-1.
    let won = a.wait_event(
        |e| matches!(e, Event::Start { .. }),
        Duration::from_secs(10),
    );
    let sync_rep =
        cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")?;
    assert!(
        won.is_ok() && sync_rep == "0",
        "with a down synchronous standby A did not lead job-0 within 10 s ({won:?}); \
         backends waiting in SyncRep: {sync_rep}\n{}",
        a.tail()
    );
    // The holder of job-1 leaves: A takes it on the same session and keeps job-0.
    holder.kill9()?;
    holder.wait_exit(WAIT)?;
    a.wait_starts(2, WAIT)
        .map_err(|e| KitError::Invalid(format!("{e}\n{}", a.tail())))?;
    std::thread::sleep(ms(1000));
    let cancels = a.cancels();
    let sync_rep =
        cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")?;
    figure(
        "down synchronous standby",
        format!(
            "A's starts {:?}, cancels {cancels:?}, backends in SyncRep {sync_rep}",
            a.events()
                .iter()
                .filter(|e| matches!(e, Event::Start { .. }))
                .collect::<Vec<_>>()
        ),
    );
    assert!(
        cancels.is_empty() && sync_rep == "0",
        "A lost a lease ({cancels:?}) or a backend waits in SyncRep ({sync_rep})\n{}",
        a.tail()
    );
    // A graceful stop releases both keys with their NOTIFY (a transaction with an xid
    // but no WAL of its own: no SyncRep wait either) and exits.
    let mut a = a;
    a.replica().sigterm()?;
    a.wait_exit(Duration::from_secs(10))
        .map_err(|e| KitError::Invalid(format!("{e}\n{}", a.tail())))?;
    let held = cluster.held_advisory_keys()?;
    assert!(
        held.is_empty(),
        "keys still held after A's graceful stop: {held:?}"
    );
    Ok(())
}

/// The token expression of the winning try before tokens came from the server's
/// clock: the WAL timeline and a transaction id, with a WAL record whose commit
/// waits for its flush (and for synchronous standbys).
const XID_TOKEN_SQL: &str = "(SELECT ((('x' OPERATOR(pg_catalog.||) \
     pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))\
     ::pg_catalog.bit(32)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 48) OPERATOR(pg_catalog.|) \
     (pg_catalog.pg_current_xact_id()::pg_catalog.text::pg_catalog.int8 \
     OPERATOR(pg_catalog.&) 281474976710655)) \
     WHERE pg_catalog.pg_logical_emit_message(true, 'lease', '') IS NOT NULL)";

/// What the winning try costs on the machine's PostgreSQL (127.0.0.1:5432, its own
/// durability settings): the median and p90 of `ROUNDS` wins of a free key (each
/// followed by an unlock, not timed), interleaved: `SELECT 1` (a round trip), the try
/// of today, and the try from before the clock token (its token expression swapped
/// in, with `synchronous_commit = on` as its sessions had it). A figure, not an
/// assertion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figure_winning_try_latency() {
    const ROUNDS: usize = 300;
    let db = "host=127.0.0.1 user=postgres dbname=postgres";
    let Ok((client, connection)) = tokio_postgres::connect(db, tokio_postgres::NoTls).await else {
        eprintln!("FIGURE winning try: no server on 127.0.0.1:5432, skipped");
        return;
    };
    tokio::spawn(connection);
    let nonce = 4242;
    let rows = client
        .simple_query(&format!(
            "SELECT pg_catalog.set_config('lease.nonce', '{nonce}', false), \
             pg_catalog.set_config('synchronous_commit', 'on', false), \
             pg_catalog.pg_backend_pid()"
        ))
        .await
        .expect("setup");
    let pid: i64 = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(2)?.parse().ok(),
            _ => None,
        })
        .expect("pid");
    let key = 0x6c65_6173_6500_0000 + i64::from(std::process::id() as i32);
    let try_sql = lease_proto::Statement::TryLock {
        keys: vec![key],
        backend_pid: pid,
        nonce,
    }
    .sql();
    let clock = format!(
        "{}::pg_catalog.int8 OPERATOR(pg_catalog.+) (extract(epoch FROM \
         pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8",
        lease_proto::server::TOKEN_CLOCK_OFFSET
    );
    assert!(try_sql.contains(&clock), "{try_sql}");
    let xid_try_sql = try_sql.replace(&clock, XID_TOKEN_SQL);
    let mut times: [Vec<Duration>; 3] = Default::default();
    for _ in 0..ROUNDS {
        for (i, sql) in ["SELECT 1", &try_sql, &xid_try_sql].into_iter().enumerate() {
            let t = Instant::now();
            let rows = client.simple_query(sql).await.expect("statement");
            times[i].push(t.elapsed());
            if i == 0 {
                continue;
            }
            let won = rows.iter().any(|m| {
                matches!(m, tokio_postgres::SimpleQueryMessage::Row(r)
                    if r.get(0) == Some(&*key.to_string()) && r.get(1).is_some())
            });
            assert!(won, "the try did not win the free key {key}");
            client
                .simple_query(&format!("SELECT pg_catalog.pg_advisory_unlock({key})"))
                .await
                .expect("unlock");
        }
    }
    // Where the clock try's time goes, on the server.
    let mut summary = Vec::new();
    for sql in [&try_sql, &xid_try_sql] {
        let explained = client
            .simple_query(&format!("EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) {sql}"))
            .await
            .expect("explain");
        client
            .simple_query(&format!("SELECT pg_catalog.pg_advisory_unlock({key})"))
            .await
            .expect("unlock");
        summary.push(
            explained
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                    _ => None,
                })
                .filter(|l| l.contains(" Time: "))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    figure("winning try on the server (clock; xid)", summary.join("; "));
    let settings = client
        .simple_query("SELECT current_setting('fsync'), current_setting('wal_sync_method')")
        .await
        .expect("settings");
    let shown: Vec<String> = settings
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(format!(
                "fsync={} wal_sync_method={}",
                r.get(0).unwrap_or("?"),
                r.get(1).unwrap_or("?")
            )),
            _ => None,
        })
        .collect();
    for (i, what) in [
        "SELECT 1",
        "winning try (clock token)",
        "winning try (xid token, before)",
    ]
    .into_iter()
    .enumerate()
    {
        let t = &mut times[i];
        t.sort();
        figure(
            what,
            format!(
                "median {:?}, p90 {:?} over {ROUNDS} ({})",
                t[ROUNDS / 2],
                t[ROUNDS * 9 / 10],
                shown.join(" ")
            ),
        );
    }
}
