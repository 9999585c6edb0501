//! The tests, written once: `super::lease` is the driver crate, `super::rt` its
//! runtime (see `main.rs`).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smol::channel::{bounded, unbounded};
use smol::future;
use tokio_postgres::NoTls;

use super::lease::{
    Error, Lease, LeaseId, LeaseState, Locker, NameError, Options, Reason, RunError, SessionState,
};
use super::rt::{self, sleep, timeout};
use crate::drivers::{holders_seen_by, init, key, opts, Res, SetOnDrop, DB, MS};

/// A lease name unique to this runtime, test and run.
fn unique(name: &str) -> String {
    crate::drivers::unique(rt::NAME, name)
}

/// A locker over [`DB`], its driver running detached.
fn locker(options: Options) -> Locker {
    rt::connect(DB, options).expect("connect a locker")
}

/// How many sessions hold `key`, seen from another session.
async fn holders(key: i64) -> i64 {
    holders_seen_by(&rt::client().await, key).await
}

/// Spawns a run of `name` on `locker` whose job returns `Ok` when cancelled,
/// and waits until the job has started: the run's task.
async fn spawn_leading(locker: &Locker, name: &str) -> rt::Task<Result<(), RunError<String>>> {
    let (started, started_rx) = unbounded();
    let (locker, name) = (locker.clone(), name.to_owned());
    let run = rt::spawn(async move {
        locker
            .run(&name, move |lease| {
                let started = started.clone();
                async move {
                    started.try_send(()).unwrap();
                    lease.cancelled().await;
                    Res::Ok(())
                }
            })
            .await
    });
    started_rx.recv().await.unwrap();
    run
}

/// Waits until `f` holds, at most `limit`.
async fn eventually<F: Future<Output = bool>>(limit: Duration, f: impl Fn() -> F) {
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        sleep(MS(5)).await;
    }
}

#[test]
fn acquires_and_job_sees_token_and_validity() {
    rt::block_on(async {
        init();
        let locker = locker(opts());
        let name = unique("acquire");
        let k = key(&name);
        let seen = Arc::new(Mutex::new(None));
        let result = locker
            .run(&name, |lease| {
                let seen = seen.clone();
                async move {
                    let now = Instant::now();
                    let held = holders(lease.key()).await;
                    *seen.lock().unwrap() = Some((
                        lease.name().to_owned(),
                        lease.token(),
                        lease.valid_until(),
                        lease.is_valid(),
                        lease.is_cancelled(),
                        now,
                        held,
                    ));
                    Ok::<(), String>(())
                }
            })
            .await;
        assert_eq!(result, Ok(()));
        let (lname, token, valid_until, valid, cancelled, now, held) =
            seen.lock().unwrap().take().unwrap();
        assert_eq!(lname, name);
        assert!(token > 0, "token {token}");
        assert!(
            valid_until.is_some_and(|v| v > now),
            "valid_until {valid_until:?} not after {now:?}"
        );
        assert!(valid && !cancelled);
        assert_eq!(held, 1, "the key was not held while the job ran");
        assert_eq!(
            holders(k).await,
            0,
            "the key was not released after the job returned"
        );
        assert!(locker.status().leases.is_empty());
    })
}

#[test]
fn standby_takes_over_by_notify_when_the_leader_returns() {
    rt::block_on(async {
        init();
        let name = unique("handover");
        let a = locker(opts());
        // The standby polls only every 5 s: a fast takeover can only come from NOTIFY.
        let b = locker(Options::default());
        let (a_started, a_started_rx) = unbounded();
        let (a_finish, a_finish_rx) = bounded::<()>(1);
        let a_returned = Arc::new(Mutex::new(None));
        let a_run = {
            let (a, name, a_returned) = (a.clone(), name.clone(), a_returned.clone());
            rt::spawn(async move {
                a.run(&name, move |_lease| {
                    let (a_started, rx, a_returned) =
                        (a_started.clone(), a_finish_rx.clone(), a_returned.clone());
                    async move {
                        a_started.try_send(()).unwrap();
                        rx.recv().await.unwrap();
                        *a_returned.lock().unwrap() = Some(Instant::now());
                        Ok::<(), String>(())
                    }
                })
                .await
            })
        };
        a_started_rx.recv().await.unwrap();
        let b_started = Arc::new(Mutex::new(None));
        let b_run = {
            let (b, name, b_started) = (b.clone(), name.clone(), b_started.clone());
            rt::spawn(async move {
                b.run(&name, move |lease| {
                    let b_started = b_started.clone();
                    async move {
                        *b_started.lock().unwrap() = Some((Instant::now(), lease.token()));
                        Ok::<(), String>(())
                    }
                })
                .await
            })
        };
        sleep(MS(300)).await;
        assert!(
            b_started.lock().unwrap().is_none(),
            "the standby ran while the leader held the key"
        );
        // The standby's status names the holder: the leader's backend.
        let holder = match a.status().session {
            SessionState::Ready { backend_pid } => backend_pid,
            other => panic!("the leader's session is {other:?}"),
        };
        assert_eq!(
            b.status().leases[0].state,
            LeaseState::Standby {
                holder_pid: Some(holder)
            }
        );
        a_finish.try_send(()).unwrap();
        assert_eq!(a_run.await, Ok(()));
        assert_eq!(timeout(MS(2000), b_run).await.unwrap(), Ok(()));
        let returned = a_returned.lock().unwrap().unwrap();
        let (started, _) = b_started.lock().unwrap().unwrap();
        let handover = started - returned;
        println!("handover: {:.2} ms", handover.as_secs_f64() * 1e3);
        assert!(
            handover < MS(200),
            "handover took {handover:?}: NOTIFY did not wake the standby"
        );
    })
}

#[test]
fn one_locker_refuses_a_second_run_of_a_lease_and_bad_names() {
    rt::block_on(async {
        init();
        let options = {
            let mut o = opts();
            o.max_leases = 2;
            o
        };
        let locker = locker(options);
        let name = unique("twice");
        let first = spawn_leading(&locker, &name).await;
        let second = locker.run(&name, |_| async { Ok::<(), String>(()) }).await;
        assert_eq!(
            second,
            Err(RunError::AlreadyRunning(LeaseId::named(&name).unwrap()))
        );
        let raw = locker.run_lease(
            LeaseId::raw(key(&name)),
            std::future::pending(),
            |_| async { Res::Ok(()) },
        );
        assert!(
            matches!(raw.await, Err(RunError::AlreadyRunning(_))),
            "same key under another name"
        );
        let empty = locker.run("  ", |_| async { Res::Ok(()) }).await;
        assert_eq!(empty, Err(RunError::Name(NameError::Empty)));
        // max_leases = 2: one more run fits, a third does not.
        let other = unique("twice-other");
        let (go, go_rx) = bounded::<()>(1);
        let fits = {
            let locker = locker.clone();
            let shutdown = async move { go_rx.recv().await.unwrap() };
            rt::spawn(async move {
                let job = |lease: Lease| async move {
                    lease.cancelled().await;
                    Res::Ok(())
                };
                locker.run_until(&other, shutdown, job).await
            })
        };
        let l = locker.clone();
        eventually(MS(1000), || async { l.status().leases.len() == 2 }).await;
        let third = locker
            .run(&unique("twice-third"), |_| async { Res::Ok(()) })
            .await;
        assert_eq!(third, Err(RunError::TooManyLeases { cap: 2 }));
        go.try_send(()).unwrap();
        assert_eq!(fits.await, Ok(()));
        locker.close().await;
        assert_eq!(first.await, Ok(()));
    })
}

#[test]
fn close_makes_running_runs_return_ok() {
    rt::block_on(async {
        init();
        let locker = locker(opts());
        let names = [unique("close-a"), unique("close-b")];
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let (started, started_rx) = unbounded();
        let mut runs = Vec::new();
        for name in &names {
            let (locker, name, reasons, started) = (
                locker.clone(),
                name.clone(),
                reasons.clone(),
                started.clone(),
            );
            runs.push(rt::spawn(async move {
                locker
                    .run(&name, move |lease| {
                        let (reasons, started) = (reasons.clone(), started.clone());
                        async move {
                            started.try_send(()).unwrap();
                            let reason = lease.cancelled().await;
                            assert!(
                                lease.is_cancelled()
                                    && !lease.is_valid()
                                    && lease.valid_until().is_none()
                            );
                            reasons.lock().unwrap().push(reason);
                            Ok::<(), String>(())
                        }
                    })
                    .await
            }));
        }
        started_rx.recv().await.unwrap();
        started_rx.recv().await.unwrap();
        assert_eq!(holders(key(&names[0])).await, 1);
        timeout(MS(2000), locker.close()).await.expect("close hung");
        for run in runs {
            assert_eq!(run.await, Ok(()));
        }
        assert_eq!(
            *reasons.lock().unwrap(),
            vec![Reason::Closed, Reason::Closed]
        );
        for name in &names {
            assert_eq!(holders(key(name)).await, 0);
        }
        let called = Arc::new(Mutex::new(false));
        let late = locker.run(&unique("close-late"), |_| {
            *called.lock().unwrap() = true;
            async { Res::Ok(()) }
        });
        assert_eq!(timeout(MS(100), late).await.unwrap(), Ok(()));
        assert!(!*called.lock().unwrap(), "a job ran after close");
    })
}

#[test]
fn dropping_a_run_future_releases_the_key() {
    rt::block_on(async {
        init();
        let locker = locker(opts());
        let name = unique("drop");
        let k = key(&name);
        let dropped = Arc::new(Mutex::new(false));
        let (started, started_rx) = unbounded();
        let run = locker.run(&name, |_lease| {
            let (guard, started) = (SetOnDrop(dropped.clone()), started.clone());
            async move {
                let _guard = guard;
                started.try_send(()).unwrap();
                std::future::pending::<Res>().await // ignores cancellation
            }
        });
        // The run future is dropped as soon as its job has started.
        let returned = future::or(async { Some(run.await) }, async {
            started_rx.recv().await.unwrap();
            None
        })
        .await;
        assert!(returned.is_none(), "the run returned {returned:?}");
        assert!(
            *dropped.lock().unwrap(),
            "the job future was not dropped with its run"
        );
        let t0 = Instant::now();
        eventually(MS(1000), || async { holders(k).await == 0 }).await;
        println!(
            "drop -> released: {:.2} ms",
            t0.elapsed().as_secs_f64() * 1e3
        );
        // The server freed the key when the release ran; the locker forgets the run when
        // the release's reply reaches it, moments later (CI once read the status between).
        eventually(MS(1000), || async { locker.status().leases.is_empty() }).await;
        // The key is free for the next run.
        assert_eq!(locker.run(&name, |_| async { Res::Ok(()) }).await, Ok(()));
    })
}

#[test]
fn job_error_is_returned_and_the_key_released() {
    rt::block_on(async {
        init();
        let locker = locker(opts());
        let name = unique("error");
        let mut calls = 0;
        let result = locker
            .run(&name, |_| {
                calls += 1;
                async { Err::<(), _>("boom".to_owned()) }
            })
            .await;
        assert_eq!(result, Err(RunError::Job("boom".to_owned())));
        assert_eq!(calls, 1);
        assert_eq!(holders(key(&name)).await, 0);
        let e: Box<dyn std::error::Error> = Box::new(RunError::Job(std::io::Error::other("disk")));
        assert_eq!(e.to_string(), "disk");
    })
}

#[test]
fn terminated_backend_cancels_the_job_at_once_and_the_run_reacquires() {
    rt::block_on(async {
        init();
        // Heartbeat every 2 s: a cancellation within tens of ms comes from the
        // connection's end, not from a heartbeat or the validity deadline.
        let options = {
            let mut o = opts();
            o.heartbeat_interval = MS(2000);
            o
        };
        let locker = locker(options);
        let name = unique("terminate");
        let (events, events_rx) = unbounded();
        let run = {
            let (locker, name) = (locker.clone(), name.clone());
            rt::spawn(async move {
                let mut call = 0;
                locker
                    .run(&name, move |lease| {
                        call += 1;
                        let events = events.clone();
                        async move {
                            let started = ("started", lease.token(), None, Instant::now());
                            events.try_send(started).unwrap();
                            if call == 1 {
                                let reason = lease.cancelled().await;
                                assert!(!lease.is_valid());
                                let cancelled =
                                    ("cancelled", lease.token(), Some(reason), Instant::now());
                                events.try_send(cancelled).unwrap();
                            }
                            Ok::<(), String>(())
                        }
                    })
                    .await
            })
        };
        let (_, token1, _, _) = events_rx.recv().await.unwrap();
        let SessionState::Ready { backend_pid } = locker.status().session else {
            panic!("session not ready: {:?}", locker.status());
        };
        let other = rt::client().await;
        let t0 = Instant::now();
        let terminated: bool = other
            .query_one(
                "SELECT pg_terminate_backend($1::int)",
                &[&(backend_pid as i32)],
            )
            .await
            .unwrap()
            .get(0);
        assert!(terminated);
        let (what, _, reason, at) = timeout(MS(1000), events_rx.recv()).await.unwrap().unwrap();
        assert_eq!(what, "cancelled");
        let cancel = at - t0;
        println!(
            "terminate -> cancel: {:.2} ms ({reason:?})",
            cancel.as_secs_f64() * 1e3
        );
        assert!(
            matches!(reason, Some(Reason::SessionEnded(_))),
            "{reason:?}"
        );
        assert!(cancel < MS(100), "cancellation took {cancel:?}");
        let (what, token2, _, _) = timeout(MS(3000), events_rx.recv()).await.unwrap().unwrap();
        assert_eq!(what, "started");
        assert!(
            token2 > token1,
            "fencing token did not grow: {token1} then {token2}"
        );
        assert_eq!(run.await, Ok(()));
    })
}

#[test]
fn run_until_shuts_down_gracefully() {
    rt::block_on(async {
        init();
        let locker = locker(opts());
        let name = unique("shutdown");
        let (stop, stop_rx) = bounded::<()>(1);
        let (started, started_rx) = unbounded();
        let returned = Arc::new(Mutex::new(None));
        let run = {
            let (locker, name, returned) = (locker.clone(), name.clone(), returned.clone());
            rt::spawn(async move {
                let signal = async move { stop_rx.recv().await.unwrap() };
                locker
                    .run_until(&name, signal, move |lease| {
                        let (started, returned) = (started.clone(), returned.clone());
                        async move {
                            started.try_send(()).unwrap();
                            let reason = lease.cancelled().await;
                            sleep(MS(50)).await; // finishing up: the key stays held
                            assert_eq!(holders(lease.key()).await, 1);
                            *returned.lock().unwrap() = Some(reason);
                            Ok::<(), String>(())
                        }
                    })
                    .await
            })
        };
        started_rx.recv().await.unwrap();
        stop.try_send(()).unwrap();
        assert_eq!(timeout(MS(2000), run).await.unwrap(), Ok(()));
        assert_eq!(*returned.lock().unwrap(), Some(Reason::Shutdown));
        assert_eq!(holders(key(&name)).await, 0);
        // A signal that fires while standing by ends the run without a job.
        let holder = spawn_leading(&locker, &name).await;
        let standby = self::locker(opts());
        let r = standby.run_until(&name, sleep(MS(200)), |_| async {
            panic!("standby ran") as Res
        });
        assert_eq!(timeout(MS(1000), r).await.unwrap(), Ok(()));
        locker.close().await;
        assert_eq!(holder.await, Ok(()));
    })
}

#[test]
fn unreachable_server_does_not_fail_and_keeps_retrying() {
    rt::block_on(async {
        init();
        let locker = rt::connect(
            "host=127.0.0.1 port=1 user=postgres dbname=postgres",
            opts(),
        )
        .unwrap();
        let run = rt::spawn(locker.run(&unique("unreachable"), |_| async {
            panic!("ran without a server") as Res
        }));
        sleep(MS(300)).await;
        assert!(!run.is_finished(), "the run ended without a server");
        let status = locker.status();
        assert_eq!(status.leases.len(), 1);
        match status.session {
            // 50 ms first backoff, doubling: at least three attempts in 300 ms.
            SessionState::Backoff { failures, .. } => {
                assert!(failures >= 2, "only {failures} attempts")
            }
            SessionState::Connecting => {}
            other => panic!("unexpected session state {other:?}"),
        }
        run.cancel().await;
    })
}

#[test]
fn dropping_the_driver_ends_pending_runs() {
    rt::block_on(async {
        init();
        let name = unique("driver-drop");
        let holder = locker(opts());
        let (started, started_rx) = unbounded();
        let held = {
            let (holder, name) = (holder.clone(), name.clone());
            rt::spawn(async move {
                holder
                    .run(&name, move |lease| {
                        let started = started.clone();
                        async move {
                            started.try_send(()).unwrap();
                            let reason = lease.cancelled().await;
                            Err::<(), _>(format!("{reason}"))
                        }
                    })
                    .await
            })
        };
        started_rx.recv().await.unwrap();
        let (standby, driver) = rt::new(opts());
        let waiting = {
            let (standby, name) = (standby.clone(), name.clone());
            rt::spawn(async move { standby.run(&name, |_| async { Res::Ok(()) }).await })
        };
        sleep(MS(200)).await;
        driver.cancel().await;
        assert_eq!(
            timeout(MS(1000), waiting).await.unwrap(),
            Err(RunError::DriverStopped)
        );
        // A job that returns an error once closed still ends its run with Ok.
        holder.close().await;
        assert_eq!(held.await, Ok(()));
    })
}

#[test]
fn dropping_the_leaders_driver_cancels_its_job() {
    rt::block_on(async {
        init();
        let name = unique("driver-drop-leader");
        let (locker, driver) = rt::new(opts());
        let run = spawn_leading(&locker, &name).await;
        driver.cancel().await;
        assert_eq!(
            timeout(MS(1000), run).await.unwrap(),
            Err(RunError::DriverStopped)
        );
        eventually(MS(1000), || async { holders(key(&name)).await == 0 }).await;
    })
}

#[test]
fn the_driver_ends_when_every_locker_is_dropped() {
    rt::block_on(async {
        init();
        let (locker, driver) = rt::new(opts());
        assert_eq!(
            locker.run(&unique("last"), |_| async { Res::Ok(()) }).await,
            Ok(())
        );
        drop(locker);
        timeout(MS(1000), driver)
            .await
            .expect("the driver did not end");
    })
}

#[test]
fn construction_errors_are_typed_and_hide_passwords() {
    rt::block_on(async {
        let bad = {
            let mut o = opts();
            o.retry_interval = Duration::ZERO;
            o
        };
        assert!(matches!(rt::connect(DB, bad), Err(Error::Options(_))));
        for s in [
            "postgres://u:hunter2@localhost:notaport/db",
            "host=h password=hunter2 port=x",
            "password='hunter2",
        ] {
            match rt::connect(s, opts()) {
                Err(Error::Config(msg)) => assert!(!msg.contains("hunter2"), "{msg}"),
                other => panic!("{s}: {other:?}"),
            }
        }
        assert!(matches!(
            rt::connect("user=postgres", opts()),
            Err(Error::Config(_))
        ));
    })
}

/// Hosts in order, one port per host, `hostaddr` instead of resolving, Unix sockets
/// by directory.
#[test]
fn connects_over_hosts_in_order_hostaddr_and_unix_sockets() {
    rt::block_on(async {
        init();
        let mut configs = vec![
            // The first host refuses; the second is the server.
            "host=127.0.0.1,localhost port=1,5432 user=postgres dbname=postgres".to_owned(),
            // Never resolved: hostaddr is used (the name would serve TLS).
            "host=db.invalid hostaddr=127.0.0.1 user=postgres dbname=postgres".to_owned(),
            "postgres://postgres@127.0.0.1:5432/postgres?connect_timeout=2&keepalives_idle=30"
                .to_owned(),
        ];
        let dir = "/var/run/postgresql";
        if std::path::Path::new(dir).join(".s.PGSQL.5432").exists() {
            configs.push(format!("host={dir} user=postgres dbname=postgres"));
        } else {
            println!("no Unix socket in {dir}: not tried");
        }
        for config in &configs {
            let locker = rt::connect(config, opts()).unwrap();
            let run = locker.run(&unique("hosts"), |lease| async move {
                assert!(lease.is_valid());
                Res::Ok(())
            });
            assert_eq!(timeout(MS(3000), run).await, Ok(Ok(())), "{config}");
        }
    })
}

#[test]
fn heartbeats_keep_a_long_job_valid() {
    rt::block_on(async {
        init();
        let locker = locker(opts());
        let result = locker
            .run(&unique("long"), |lease| async move {
                let first = lease.valid_until().unwrap();
                // Three validity windows (500 ms each): only heartbeats keep it valid.
                let end = Instant::now() + MS(1500);
                while Instant::now() < end {
                    if !lease.is_valid() || lease.is_cancelled() {
                        return Err(format!("lease invalid at {:?}", lease.valid_until()));
                    }
                    sleep(MS(20)).await;
                }
                let last = lease.valid_until().unwrap();
                if last < first + MS(900) {
                    return Err(format!("valid_until moved only {:?}", last - first));
                }
                Ok(())
            })
            .await;
        assert_eq!(result, Ok(()));
    })
}

#[test]
fn handles_are_shareable_and_the_driver_spawnable() {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    fn spawnable<T: Future<Output = ()> + Send + 'static>() {}
    shareable::<Locker>();
    shareable::<Lease>();
    spawnable::<super::lease::Driver<NoTls>>();
}

/// What every connection attempt would fail on fails at construction (the
/// driver core checks the host lists, for both runtimes).
#[test]
fn construction_rejects_host_lists_every_attempt_would_fail_on() {
    for s in [
        "host=a,b hostaddr=127.0.0.1 user=postgres",
        "host=a,b,c port=1,2 user=postgres",
    ] {
        assert!(
            matches!(rt::connect(s, opts()), Err(Error::Config(_))),
            "{s}"
        );
    }
}

/// Lease sessions carry `application_name` "lease@" and the process's
/// identity unless the configuration names one, so operators can tell them
/// apart in `pg_stat_activity`.
#[test]
fn sessions_are_named_lease_unless_configured() {
    rt::block_on(async {
        init();
        let other = rt::client().await;
        let named = match lease_tokio::identity() {
            Some(id) => format!("lease@{id}"),
            None => "lease".to_owned(),
        };
        for (config, expected) in [
            (DB.to_string(), named.as_str()),
            (
                format!("{DB} application_name=billing-worker"),
                "billing-worker",
            ),
        ] {
            let locker = rt::connect(&config, opts()).expect("connect");
            let (started, started_rx) = bounded::<()>(1);
            let name = unique("appname");
            let run = {
                let (locker, name) = (locker.clone(), name.clone());
                rt::spawn(async move {
                    locker
                        .run(&name, move |lease| {
                            let started = started.clone();
                            async move {
                                let _ = started.try_send(());
                                lease.cancelled().await;
                                Ok::<(), String>(())
                            }
                        })
                        .await
                })
            };
            timeout(MS(3000), started_rx.recv()).await.unwrap().unwrap();
            let SessionState::Ready { backend_pid } = locker.status().session else {
                panic!("session not ready: {:?}", locker.status());
            };
            let found: String = other
                .query_one(
                    "SELECT application_name FROM pg_stat_activity WHERE pid = $1::int",
                    &[&(backend_pid as i32)],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(found, expected, "for {config}");
            locker.close().await;
            assert_eq!(run.await, Ok(()));
        }
    })
}

/// A frozen first host in a multi-host configuration must not block failover. Primary A,
/// hot standby B; B is promoted, then A's server is frozen (SIGSTOP of its postmaster
/// and every child: the kernel still accepts TCP connections on A's port, nothing
/// answers the startup). A locker on `host=A,B target_session_attrs=read-write` with no
/// `connect_timeout` must give A only its share of the attempt and lead on B. Before the
/// fix every attempt spent the whole query timeout on A (tokio: `connect_timeout` bounds
/// only the TCP connect; smol: no bound without it) and B was never tried.
#[test]
fn a_frozen_first_host_does_not_block_failover_to_the_next() {
    rt::block_on(async {
        init();
        let a = lease_tests::Cluster::start().expect("primary A");
        let b = a.start_standby().expect("hot standby B");
        b.promote().expect("promote B");
        let frozen = a.freeze().expect("freeze A");
        let config = format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
             target_session_attrs=read-write",
            a.port(),
            b.port()
        );
        let options = {
            let mut o = opts();
            o.query_timeout = MS(2_000);
            o
        };
        let locker = rt::connect(&config, options).expect("a locker");
        let t0 = Instant::now();
        let run = locker.run(&unique("frozen-first-host"), |_| async { Res::Ok(()) });
        let result = timeout(MS(15_000), run).await;
        let took = t0.elapsed();
        let last_error = locker.status().last_error.map(|e| e.error.to_string());
        println!(
            "frozen first host, promoted second: {result:?} after {:.0} ms (last error: \
             {last_error:?})",
            took.as_secs_f64() * 1e3
        );
        assert_eq!(
            result,
            Ok(Ok(())),
            "no lead on the promoted second host while the first is frozen; last error: \
             {last_error:?}"
        );
        drop(frozen);
    })
}

/// `target_session_attrs=read-write` skips a hot standby listed first, on every runtime
/// (the driver runs the check itself; lease-smol's `connect_raw` never did, so a standby
/// first in the list was connected to, found in recovery and retried forever).
#[test]
fn read_write_skips_a_standby_listed_first() {
    leads_on_the_primary_after_a_standby("standby-first", |_| {});
}

/// A write freeze before a cut-over (`ALTER ROLE … SET default_transaction_read_only =
/// on` on the primary) must not stop a lease on a multi-host configuration with
/// `target_session_attrs=read-write`: no lease statement writes, so the driver looks for
/// a primary (`pg_is_in_recovery()` false), not a read-write session. A hot standby listed
/// first is still skipped. Before the fix both hosts failed the check ("database does not
/// allow writes") and the run retried forever.
#[test]
fn read_write_leads_on_a_primary_whose_role_defaults_to_read_only() {
    leads_on_the_primary_after_a_standby("read-only-role", |primary| {
        primary
            .sql("ALTER ROLE postgres SET default_transaction_read_only = on")
            .expect("the write freeze");
    });
}

/// A hot standby listed first, then its primary (`prepare`d after the standby started),
/// with `target_session_attrs=read-write`: a run of lease `name` leads on the primary
/// within 10 s.
fn leads_on_the_primary_after_a_standby(name: &str, prepare: impl FnOnce(&lease_tests::Cluster)) {
    rt::block_on(async {
        init();
        let primary = lease_tests::Cluster::start().expect("a primary");
        let standby = primary.start_standby().expect("a hot standby");
        prepare(&primary);
        let config = format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
             target_session_attrs=read-write",
            standby.port(),
            primary.port()
        );
        let locker = rt::connect(&config, opts()).expect("a locker");
        let run = locker.run(&unique(name), |_| async { Res::Ok(()) });
        let result = timeout(MS(10_000), run).await;
        let last_error = locker.status().last_error.map(|e| e.error.to_string());
        assert_eq!(
            result,
            Ok(Ok(())),
            "{name}: no lead on the primary listed after a standby; last error: {last_error:?}"
        );
    })
}

/// What the stale-primary check costs: with several hosts, a lease session that
/// opens on one of them asks every other listed host for its WAL timeline on a short
/// connection of its own, in parallel, before the session's setup. A primary A and its hot
/// standby B: a run with `host=A,B` against one with `host=A` alone, the time from the run
/// to its job's start, 10 rounds each (the figure), and the sessions B saw (one per round
/// with the list, none alone).
#[test]
fn the_stale_primary_check_costs_a_connection_per_other_host() {
    rt::block_on(async {
        init();
        let primary = lease_tests::Cluster::start().expect("a primary");
        let standby = primary.start_standby().expect("a hot standby");
        let alone = format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres target_session_attrs=read-write",
            primary.port()
        );
        let list = format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
             target_session_attrs=read-write",
            primary.port(),
            standby.port()
        );
        // Sessions established on B (PostgreSQL 14+), the psql call itself included.
        let sessions = || -> i64 {
            let out = standby
                .sql("SELECT sessions FROM pg_stat_database WHERE datname = 'postgres'")
                .expect("B's sessions");
            out.parse().expect("a count")
        };
        let before = sessions();
        let mut took: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for round in 0..20 {
            let (which, url) = if round % 2 == 0 {
                (0, &alone)
            } else {
                (1, &list)
            };
            let locker = rt::connect(url, opts()).expect("a locker");
            let start = Instant::now();
            let (tx, rx) = unbounded();
            let run = locker.run(&unique("check-cost"), move |_| {
                let tx = tx.clone();
                async move {
                    tx.try_send(Instant::now()).unwrap();
                    Res::Ok(())
                }
            });
            let result = timeout(MS(10_000), run).await;
            assert_eq!(result, Ok(Ok(())), "round {round}");
            let started = rx.recv().await.unwrap();
            took[which].push((started - start).as_secs_f64() * 1e3);
            locker.close().await;
        }
        // Shared statistics are flushed within a second of a session's end.
        sleep(MS(1_500)).await;
        let on_b = sessions() - before - 1;
        for t in &mut took {
            t.sort_by(f64::total_cmp);
        }
        eprintln!(
            "FIGURE {} run -> job start, host=A: median {:.1} ms (max {:.1}); host=A,B (B a \
             standby): median {:.1} ms (max {:.1}); sessions B saw over the 10 rounds with \
             the list: {on_b}",
            rt::NAME,
            took[0][5],
            took[0][9],
            took[1][5],
            took[1][9],
        );
        assert_eq!(on_b, 10, "one connection to B per session with the list");
        // A listed host that accepts connections but never answers (a frozen server)
        // after the one the session opens on: the setup waits its share for it.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "host=127.0.0.1,127.0.0.1 port={},{} connect_timeout=1 user=postgres \
             dbname=postgres target_session_attrs=read-write",
            primary.port(),
            silent.local_addr().unwrap().port()
        );
        let locker = rt::connect(&url, opts()).expect("a locker");
        let start = Instant::now();
        let run = locker.run(&unique("check-cost-silent"), |_| async { Res::Ok(()) });
        assert_eq!(timeout(MS(10_000), run).await, Ok(Ok(())));
        let took = start.elapsed();
        locker.close().await;
        let share = MS(1_000).min(opts().query_timeout / 2);
        eprintln!(
            "FIGURE {} run -> job end, host=A,F (F accepts connections, never answers; \
             share {share:?}): {:.1} ms",
            rt::NAME,
            took.as_secs_f64() * 1e3
        );
        assert!(took >= share, "{took:?}: the check did not wait for F");
    })
}

/// `connect_timeout` bounds each host's whole attempt (as in libpq), on every runtime: a
/// first host that accepts connections but never answers does not stall failover.
#[test]
fn connect_timeout_moves_on_from_a_host_that_never_answers() {
    rt::block_on(async {
        init();
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let config = format!(
            "host=127.0.0.1,127.0.0.1 port={port},5432 connect_timeout=1 \
             user=postgres dbname=postgres"
        );
        let options = {
            let mut o = opts();
            o.query_timeout = MS(3000);
            o
        };
        let locker = rt::connect(&config, options).unwrap();
        let t0 = Instant::now();
        let run = locker.run(&unique("silent"), |_| async { Res::Ok(()) });
        assert_eq!(rt::timeout(MS(2500), run).await, Ok(Ok(())));
        println!(
            "silent first host -> led on the second: {:.0} ms",
            t0.elapsed().as_secs_f64() * 1e3
        );
        assert!(t0.elapsed() >= MS(1000), "the silent host answered?");
    })
}

/// A lease group spreads its leases over the lockers that run them: two lockers
/// running the same 4 leases in one group lead 2 each; when one stops its runs, the
/// other leads all 4.
#[test]
fn a_group_spreads_its_leases_over_two_lockers() {
    rt::block_on(async {
        init();
        let group = unique("group");
        let names: Vec<String> = (0..4).map(|i| format!("{group}-{i}")).collect();
        let (a, b) = (locker(opts()), locker(opts()));
        assert_eq!(a.group(&group).id().map(|g| g.name()), Ok(group.as_str()));
        let spawn_all = |l: &Locker| -> Vec<rt::Task<Result<(), RunError<String>>>> {
            (names.iter())
                .map(|name| {
                    let (g, name) = (l.group(&group), name.clone());
                    rt::spawn(async move {
                        g.run(&name, |lease| async move {
                            lease.cancelled().await;
                            Res::Ok(())
                        })
                        .await
                    })
                })
                .collect()
        };
        let leading = |l: &Locker| {
            (l.status().leases.iter())
                .filter(|s| matches!(s.state, LeaseState::Leading { .. }))
                .count()
        };
        let runs_a = spawn_all(&a);
        let runs_b = spawn_all(&b);
        eventually(MS(10_000), || async {
            leading(&a) == 2 && leading(&b) == 2
        })
        .await;
        for run in runs_b {
            run.cancel().await;
        }
        eventually(MS(10_000), || async { leading(&a) == 4 }).await;
        for name in &names {
            assert_eq!(holders(key(name)).await, 1, "{name} held once");
        }
        // A bad group name is the run's error.
        let bad = a.group("").run("x", |_| async { Res::Ok(()) }).await;
        assert!(
            matches!(bad, Err(RunError::Name(NameError::Empty))),
            "{bad:?}"
        );
        for run in runs_a {
            run.cancel().await;
        }
    })
}
