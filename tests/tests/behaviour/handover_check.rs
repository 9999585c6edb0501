//! The hand-over check and the release's reservation on a real server (the rule:
//! lease-proto's `machine/handover.rs`). A request counts only for a backend that waits
//! for that key, or for the named backend's own watch session; a release names a backend
//! only if it is in that key's queue (or holds it). Found by a review of the first
//! version, which confirmed a waiter of any key of the holder's and reserved a key for
//! any backend still connected.

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::Statement;
use lease_tests::scenario::Admin;
use lease_tests::Cluster;
use lease_tests::KitError;
use std::time::{Duration, Instant};

/// A `psql` that listens on the handover channel for 1.5 s (it prints the notifications
/// after its next command).
fn listen(cluster: &Cluster) -> Result<std::process::Child, KitError> {
    std::process::Command::new("psql")
        .args([
            "-X",
            "-d",
            &cluster.conn_string(),
            "-c",
            "LISTEN lease_handover_v1",
            "-c",
            "SELECT pg_sleep(1.5)",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| KitError::Invalid(format!("psql: {e}")))
}

fn waits(admin: &Admin, pid: i64) -> Result<(), KitError> {
    let start = Instant::now();
    while admin.ints(&format!(
        "SELECT count(*)::int8 FROM pg_locks WHERE NOT granted AND pid = {pid}"
    ))?[0]
        == 0
    {
        assert!(start.elapsed() < Duration::from_secs(10), "never waits");
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// A holder of two keys (shards, several leases) is asked to hand k1 to a backend that
/// waits for k2 (a standby of another lease, or a hostile role's own session blocked on
/// the other key): the check must not confirm it, since that backend is not in k1's queue
/// and never takes k1; the holder would hand k1 over and its release would reserve k1 for
/// a backend that never takes it (two query timeouts unled, repeatable).
#[test]
fn a_backend_waiting_for_another_key_of_the_holder_does_not_confirm_an_ask() -> Res {
    let cluster = Cluster::start()?;
    let s = Admin::connect(&cluster.conn_string())?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let _holder = s.ints("SELECT pg_backend_pid()::int8")?[0];
    let (k1, k2) = (key("r5-1"), key("r5-2"));
    s.rows(&format!(
        "SELECT pg_advisory_lock({k1}), pg_advisory_lock({k2})"
    ))?;
    let waiter = Admin::connect(&cluster.conn_string())?;
    let waiter_pid = waiter.ints("SELECT pg_backend_pid()::int8")?[0];
    let t = std::thread::spawn(move || {
        let r = waiter.rows(&format!("SELECT pg_advisory_lock({k2})"));
        (waiter, r)
    });
    waits(&admin, waiter_pid)?;
    let rows = run(
        &s,
        &Statement::CheckHandover {
            asks: vec![(k1, waiter_pid)],
        },
    )?;
    let reply = CheckReply::parse(&rows).map_err(|e| KitError::Invalid(e.to_string()))?;
    s.rows("SELECT pg_advisory_unlock_all()")?;
    let (_waiter, r) = t.join().expect("waiter");
    r?;
    assert_eq!(
        reply.waiting,
        Default::default(),
        "the ask to hand k1 to backend {waiter_pid}, which waits for k2 only, was confirmed"
    );
    Ok(())
}

/// The release of a key handed over by name names the backend again only if it is
/// still in that key's queue: a backend that is connected but waits for nothing (its
/// wait was cancelled after the check, a forger's own idle session) must not be named,
/// or every standby leaves the free key alone for two query timeouts.
#[test]
fn a_release_does_not_reserve_the_key_for_a_connected_backend_that_does_not_wait() -> Res {
    let cluster = Cluster::start()?;
    let s = Admin::connect(&cluster.conn_string())?;
    let idle = Admin::connect(&cluster.conn_string())?;
    let idle_pid = idle.ints("SELECT pg_backend_pid()::int8")?[0];
    let k = key("r5-3");
    s.rows(&format!("SELECT pg_advisory_lock({k})"))?;
    // A listener (psql prints the notifications after its next command).
    let listener = listen(&cluster)?;
    std::thread::sleep(Duration::from_millis(500));
    run(
        &s,
        &Statement::Release {
            keys: vec![k],
            notify: true,
            reserved: vec![(k, idle_pid, 0)],
        },
    )?;
    let out = listener.wait_with_output().expect("psql");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find(|l| l.contains("Asynchronous notification"))
        .unwrap_or_else(|| panic!("no notification: {text}"))
        .to_string();
    drop(idle);
    assert!(
        !line.contains(&format!(" {idle_pid}\"")),
        "the release reserves the free key for backend {idle_pid}, which waits for nothing: {line}"
    );
    Ok(())
}

/// Review 5, cost and SQL: the check with 4 asks while 4,000 foreign advisory locks and
/// 50 waiters stand; its duration against a plain heartbeat's, and its announcement.
#[test]
fn the_checks_cost_with_many_locks() -> Res {
    let cluster = Cluster::start()?;
    let s = Admin::connect(&cluster.conn_string())?;
    let other = Admin::connect(&cluster.conn_string())?;
    other.rows("SELECT pg_advisory_lock(k) FROM generate_series(1, 4000) AS k")?;
    let (k1, k2) = (key("r5c-1"), key("r5c-2"));
    s.rows(&format!(
        "SELECT pg_advisory_lock({k1}), pg_advisory_lock({k2})"
    ))?;
    let mut waiters = Vec::new();
    let mut threads = Vec::new();
    for i in 0..50 {
        let w = Admin::connect(&cluster.conn_string())?;
        let pid = w.ints("SELECT pg_backend_pid()::int8")?[0];
        let k = if i % 2 == 0 { k1 } else { k2 };
        // Each waiter unlocks as soon as it is granted, so the queue drains in
        // whatever order the server granted it (joining them in spawn order while
        // each held its key until joined deadlocked when two queued out of order).
        threads.push(std::thread::spawn(move || {
            let _ = w.rows(&format!("SELECT pg_advisory_lock({k})"));
            let _ = w.rows("SELECT pg_advisory_unlock_all()");
            w
        }));
        waiters.push(pid);
    }
    for &p in &waiters {
        waits(&s, p)?;
    }
    let asks = vec![(k1, 99_991), (k1, 99_993), (k1, 99_994), (k1, 99_995)];
    let time = |st: &Statement| -> Result<f64, KitError> {
        let t = Instant::now();
        for _ in 0..20 {
            run(&s, st)?;
        }
        Ok(t.elapsed().as_secs_f64() * 1000.0 / 20.0)
    };
    let hb = time(&Statement::Heartbeat)?;
    let check = time(&Statement::CheckHandover { asks })?;
    eprintln!("FIGURE heartbeat {hb:.2} ms, check (4 asks, 4,000 foreign locks, 50 waiters) {check:.2} ms");
    s.rows("SELECT pg_advisory_unlock_all()")?;
    other.rows("SELECT pg_advisory_unlock_all()")?;
    for t in threads {
        t.join().expect("waiter");
    }
    Ok(())
}

/// Review 5, SQL: a confirmed check announces `to KEY PID` from the holder's backend.
#[test]
fn a_confirmed_check_announces_the_hand_over() -> Res {
    let cluster = Cluster::start()?;
    let s = Admin::connect(&cluster.conn_string())?;
    let pid = s.ints("SELECT pg_backend_pid()::int8")?[0];
    let k1 = key("r5n-1");
    s.rows(&format!("SELECT pg_advisory_lock({k1})"))?;
    let waiter = Admin::connect(&cluster.conn_string())?;
    let waiter_pid = waiter.ints("SELECT pg_backend_pid()::int8")?[0];
    let t = std::thread::spawn(move || {
        let _ = waiter.rows(&format!("SELECT pg_advisory_lock({k1})"));
        waiter
    });
    waits(&s, waiter_pid)?;
    let listener = listen(&cluster)?;
    std::thread::sleep(Duration::from_millis(500));
    let rows = run(
        &s,
        &Statement::CheckHandover {
            asks: vec![(k1, 99_999), (k1, waiter_pid)],
        },
    )?;
    let reply = CheckReply::parse(&rows).map_err(|e| KitError::Invalid(e.to_string()))?;
    let out = listener.wait_with_output().expect("psql");
    s.rows("SELECT pg_advisory_unlock_all()")?;
    let _ = t.join();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(reply.waiting, [(2, waiter_pid)].into());
    assert!(
        text.contains(&format!(
            "payload \"to {k1} {waiter_pid}\" received from server process with PID {pid}"
        )),
        "{text}"
    );
    Ok(())
}

/// A watch session's wait names its lease session in its `application_name`: a check
/// confirms an ask through the watch session only when the ask names that lease session
/// (a negative ordinal: the other backend waits), never when a `prefer` from another
/// backend names that watch session (any role may send one, naming any waiter it sees in
/// `pg_locks`).
#[test]
fn a_watch_session_counts_only_for_its_own_lease_session() -> Res {
    let cluster = Cluster::start()?;
    let s = Admin::connect(&cluster.conn_string())?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let k = key("watch-of");
    s.rows(&format!("SELECT pg_advisory_lock({k})"))?;
    let watch = Admin::connect(&cluster.conn_string())?;
    let w = watch.ints("SELECT pg_backend_pid()::int8")?[0];
    let (own, forger) = (4_000_001, 4_000_002);
    let waiting = std::thread::spawn(move || {
        let wait = Statement::Wait {
            key: k,
            timeout_ms: 5_000,
            crowd: None,
            watch_of: Some(own),
        };
        watch.rows(&wait.sql())
    });
    waits(&admin, w)?;
    let check = |asks| -> Result<CheckReply, KitError> {
        let rows = run(&s, &Statement::CheckHandover { asks })?;
        CheckReply::parse(&rows).map_err(|e| KitError::Invalid(e.to_string()))
    };
    let forged = check(vec![(k, forger)])?;
    let its_own = check(vec![(k, own)])?;
    waiting.join().expect("wait")?;
    assert_eq!(
        forged.waiting,
        Default::default(),
        "a forged prefer counted: {forged:?}"
    );
    assert_eq!(its_own.waiting, [(1, w)].into(), "{its_own:?}");
    Ok(())
}
