//! Every statement the core sends runs on a real server as sent, and its reply parses
//! and says what the statement did. The simulator interprets the statements' structure,
//! not their text, and the scanner of unqualified names reads the text without running
//! it: a release that notified through `pg_catalog.unnest(a, b)` (PostgreSQL has the
//! several-array form only unqualified, as `ROWS FROM`'s shorthand) passed both and failed
//! on every server (the payloads themselves: `server_wait`'s graceful release, whose
//! standby reads its own backend as the grantee). `.ci/test-versions` runs this on every
//! version.

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::server::SEARCH_PATH;
use lease_proto::Statement;
use lease_tests::scenario::Admin;
use lease_tests::Cluster;
use lease_tests::KitError;

#[test]
fn every_statement_runs_on_the_server_and_its_reply_parses() -> Res {
    let cluster = Cluster::start()?;
    let s = Admin::connect(&cluster.conn_string())?;
    let other = Admin::connect(&cluster.conn_string())?;
    let pid = s.ints("SELECT pg_backend_pid()::int8")?[0];
    let nonce = 7;
    let (k1, k2, k3, held) = (key("s-1"), key("s-2"), key("s-3"), key("s-held"));
    other.rows(&format!("SELECT pg_advisory_lock({held})"))?;
    // A forged member of group 9: a member lock whose second half is not the
    // holder's own backend pid (any role may take it).
    let forged = 4_194_304 + 12_345;
    other.rows(&format!("SELECT pg_advisory_lock(9, {forged})"))?;
    // A standby of `s`'s keys: it waits for k2 from the hand-over check on, and is
    // granted it at the last release.
    let waiter = Admin::connect(&cluster.conn_string())?;
    let waiter_pid = waiter.ints("SELECT pg_backend_pid()::int8")?[0];
    let waiting = std::sync::Mutex::new(Some(waiter));
    let parse_err = |what: &str, e: ReplyError| KitError::Invalid(format!("{what}: {e}"));
    let all = [
        Statement::Setup {
            nonce,
            settings: vec![("search_path", SEARCH_PATH.into())],
        },
        Statement::Listen,
        Statement::TryLock {
            keys: vec![k1, k2, held],
            backend_pid: pid,
            nonce,
        },
        Statement::Heartbeat,
        Statement::Verify,
        Statement::Wait {
            key: held,
            timeout_ms: 20,
            crowd: Some(2),
            watch_of: Some(pid),
        },
        Statement::Take {
            key: held,
            timeout_ms: 20,
            crowd: Some(2),
            backend_pid: pid,
            nonce,
        },
        Statement::Take {
            key: k3,
            timeout_ms: 20,
            crowd: Some(2),
            backend_pid: pid,
            nonce,
        },
        Statement::Take {
            key: k3,
            timeout_ms: 20,
            crowd: None,
            backend_pid: pid,
            nonce,
        },
        Statement::Members {
            join: vec![9],
            leave: vec![],
            groups: vec![9],
            keys: vec![k1, held],
            notify: true,
            announce: vec![9],
            claims: vec![k1],
        },
        Statement::Prefer {
            key: held,
            priority: 3,
        },
        // The waiter waits for k2: its ask for k2 is confirmed (the first of k2's that
        // waits), not a backend that does not exist, nor one for k1 (it waits for another
        // key), nor this session for k3 (no watch session names it).
        Statement::CheckHandover {
            asks: vec![(k2, 99_999), (k2, waiter_pid), (k1, waiter_pid), (k3, pid)],
        },
        Statement::Release {
            keys: vec![k1],
            notify: false,
            reserved: vec![],
        },
        Statement::Release {
            keys: vec![k2, k3, held],
            notify: true,
            reserved: vec![(k2, waiter_pid, 0), (k3, 99_999, 0)],
        },
    ];
    let mut waiter_thread = None;
    let mut takes = 0;
    // The server's clock as the setup and the heartbeat answer it (µs since
    // the epoch): this host's clock, the server being local.
    let host_us = || {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.expect("after 1970").as_micros() as i64
    };
    let near_host = |what: &str, clock: Option<i64>| {
        let clock = clock.unwrap_or_else(|| panic!("{what}: no server clock row"));
        let off = (clock - host_us()).abs();
        assert!(
            off < 5_000_000,
            "{what}: server clock {clock} is {off} µs off"
        );
    };
    for statement in &all {
        let check = matches!(statement, Statement::CheckHandover { .. });
        if let Some(waiter) = waiting.lock().unwrap().take_if(|_| check) {
            waiter_thread = Some(std::thread::spawn(move || {
                waiter.rows(&format!("SELECT pg_advisory_lock({k2})"))
            }));
            // Until the server shows it waiting.
            let start = std::time::Instant::now();
            while other.ints(&format!(
                "SELECT count(*)::int8 FROM pg_locks WHERE NOT granted AND pid = {waiter_pid}"
            ))?[0]
                == 0
            {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(10),
                    "never waits"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let rows = run(&s, statement)?;
        match statement {
            Statement::Setup { .. } => {
                let setup = SetupReply::parse(&rows).map_err(|e| parse_err("setup", e))?;
                assert_eq!(setup.backend_pid, pid);
                assert_eq!(setup.nonce, Some(nonce));
                near_host("setup", setup.server_clock_us);
            }
            Statement::Listen => assert!(rows.is_empty(), "{rows:?}"),
            Statement::TryLock { keys, .. } => {
                let reply = TryReply::parse(keys, &rows);
                assert_eq!(reply.won.len(), 2, "{reply:?}");
                assert_eq!(reply.not_won.len(), 1, "{reply:?}");
                assert!(!reply.untrusted, "{reply:?}");
            }
            Statement::Heartbeat | Statement::Prefer { .. } => {
                let reply = HeartbeatReply::parse(&rows).map_err(|e| parse_err("heartbeat", e))?;
                assert_eq!((reply.backend_pid, reply.nonce), (Some(pid), Some(nonce)));
                if *statement == Statement::Heartbeat {
                    near_host("heartbeat", reply.server_clock_us);
                }
            }
            Statement::Verify => {
                let reply = VerifyReply::parse(&rows).map_err(|e| parse_err("verify", e))?;
                assert!(reply.held.contains(&k1) && reply.held.contains(&k2));
                near_host("verify", reply.session.server_clock_us);
            }
            Statement::Wait { .. } => {
                let reply = WaitReply::parse(&rows).map_err(|e| parse_err("wait", e))?;
                assert_eq!(reply.freed, Some(false), "{reply:?}");
                assert!(reply.deadlock_timeout_ms.is_some(), "{reply:?}");
            }
            Statement::Take { key, .. } => {
                let reply = WaitReply::parse(&rows).map_err(|e| parse_err("take", e))?;
                let want = match (*key == held, takes) {
                    // Held by another session: its lock timeout.
                    (true, _) => (Some(false), false, false),
                    // Free: taken, with its token.
                    (false, 0) => (Some(true), true, false),
                    // Held by this backend already.
                    (false, _) => (Some(false), false, true),
                };
                if *key != held {
                    takes += 1;
                }
                let got = (reply.freed, reply.token.is_some(), reply.held_here);
                assert_eq!(got, want, "{statement:?}: {reply:?}");
            }
            Statement::Members { .. } => {
                let reply = MembersReply::parse(&rows).map_err(|e| parse_err("members", e))?;
                assert!(reply.members.contains(&(9, pid)), "{reply:?}");
                assert!(
                    !reply.members.iter().any(|&(_, m)| m == forged),
                    "a forged member lock (group 9, objid {forged}, held by another backend) \
                     counted as a member: {reply:?}"
                );
                let other_pid = other.ints("SELECT pg_backend_pid()::int8")?[0];
                assert!(
                    reply.holders.contains(&(held, Some(other_pid))),
                    "{reply:?}"
                );
            }
            Statement::CheckHandover { .. } => {
                let reply = CheckReply::parse(&rows).map_err(|e| parse_err("check", e))?;
                let s = &reply.session;
                assert_eq!((s.backend_pid, s.nonce), (Some(pid), Some(nonce)));
                assert_eq!(reply.waiting, [(2, waiter_pid)].into(), "{reply:?}");
            }
            Statement::Release { keys, notify, .. } => {
                let reply = ReleaseReply::parse(&rows).map_err(|e| parse_err("release", e))?;
                let want: Vec<(i64, bool)> = keys.iter().map(|k| (*k, *k != held)).collect();
                assert_eq!(reply.unlocked, want, "notify {notify}");
            }
        }
    }
    // The waiter was granted k2 at the last release.
    let granted = waiter_thread
        .expect("the check ran")
        .join()
        .expect("waiter");
    granted?;
    Ok(())
}
