//! The driver starts no thread: everything runs on `futures_lite`'s
//! `block_on` with a `LocalExecutor` on the test's own thread, and the only
//! thread that may appear is async-io's reactor ("async-io").
//!
//! Alone in its own test binary, so that no other test's threads come and go
//! while it counts the threads of the process (`/proc/self/task`).
#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use async_io::{Async, Timer};
use futures_lite::future;
use lease_smol::{Locker, Options, Reason, SessionState};
use smol::channel::unbounded;
use smol::LocalExecutor;
use tokio_util::compat::FuturesAsyncReadCompatExt;

const DB: &str = "host=127.0.0.1 user=postgres dbname=postgres";
const MS: fn(u64) -> Duration = Duration::from_millis;

/// The threads of this process: id -> name.
fn threads() -> BTreeMap<u64, String> {
    let mut threads = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").expect("read /proc/self/task") {
        let path = task.expect("a task").path();
        let Some(id) = path.file_name().and_then(|n| n.to_str()?.parse().ok()) else {
            continue;
        };
        // A thread may end between the listing and this read.
        if let Ok(name) = std::fs::read_to_string(path.join("comm")) {
            threads.insert(id, name.trim_end().to_owned());
        }
    }
    threads
}

#[test]
fn no_thread_but_async_io_while_leading_and_failing_over() {
    let before = threads();
    let mut seen = before.clone();
    let mut most = before.len();
    let mut sample = || {
        let now = threads();
        most = most.max(now.len());
        seen.extend(now);
    };
    let options = {
        let mut o = Options::default();
        o.retry_interval = MS(100);
        o.heartbeat_interval = MS(100);
        o.query_timeout = MS(400);
        o.guard_margin = MS(200);
        o
    };
    let nanos = std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    let name = format!("threads-{}-{nanos}", std::process::id());
    let (locker, driver) = Locker::without_tls(DB, options).unwrap();
    let ex = LocalExecutor::new();
    ex.spawn(driver).detach();
    future::block_on(ex.run(async {
        let (events, events_rx) = unbounded();
        let run = ex.spawn(locker.run(&name, move |lease| {
            let events = events.clone();
            async move {
                events.try_send((lease.token(), None)).unwrap();
                let reason = lease.cancelled().await;
                events.try_send((lease.token(), Some(reason))).unwrap();
                Ok::<(), String>(())
            }
        }));
        let (token1, _) = events_rx.recv().await.unwrap();
        sample();
        let SessionState::Ready { backend_pid } = locker.status().session else {
            panic!("session not ready: {:?}", locker.status());
        };
        // Fail over: end the leader's session from another one.
        let stream = Async::<TcpStream>::connect(([127, 0, 0, 1], 5432))
            .await
            .unwrap();
        let config: tokio_postgres::Config = DB.parse().unwrap();
        let (client, connection) = config
            .connect_raw(stream.compat(), tokio_postgres::NoTls)
            .await
            .unwrap();
        ex.spawn(connection).detach();
        client
            .simple_query(&format!("SELECT pg_terminate_backend({backend_pid})"))
            .await
            .unwrap();
        let (_, reason) = events_rx.recv().await.unwrap();
        assert!(
            matches!(reason, Some(Reason::SessionEnded(_))),
            "{reason:?}"
        );
        sample();
        let (token2, _) = events_rx.recv().await.unwrap();
        assert!(token2 > token1, "{token1} then {token2}");
        sample();
        // Lead a while: heartbeats, timer.
        let end = Instant::now() + MS(500);
        while Instant::now() < end {
            Timer::after(MS(50)).await;
            sample();
        }
        locker.close().await;
        assert_eq!(run.await, Ok(()));
        sample();
        println!("fencing tokens {token1} then {token2}");
    }));
    let new: Vec<&String> = seen
        .iter()
        .filter(|(id, _)| !before.contains_key(id))
        .map(|(_, name)| name)
        .collect();
    println!(
        "threads before: {} {:?}; most while leading and failing over: {most}; new: {new:?}",
        before.len(),
        before.values().collect::<Vec<_>>()
    );
    assert!(
        new.iter().all(|name| *name == "async-io") && new.len() <= 1,
        "threads other than async-io's reactor appeared: {new:?}"
    );
    assert!(most <= before.len() + 1, "{most} threads");
}
