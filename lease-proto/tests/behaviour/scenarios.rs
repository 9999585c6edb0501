//! Deterministic failover scenarios in the simulator, one fault each, with the
//! bound each one promises. Timings are printed; bounds are asserted.

use crate::common::*;
use lease_proto::sim::DriverBug;
use lease_proto::sim::Fault;
use lease_proto::sim::Mutation;
use lease_proto::sim::Report;
use lease_proto::sim::ServerConfig;
use lease_proto::sim::Sim;
use lease_proto::sim::SimConfig;
use lease_proto::sim::TraceEvent;
use lease_proto::sim::Violation;
use lease_proto::Options;
use lease_proto::Outcome;
use lease_proto::Refusal;
use std::time::Duration;
use std::time::Instant;

fn cfg() -> SimConfig {
    SimConfig::default()
}

/// The process that leads `job` at the end of `until`, stepping 1 ms.
fn leader(sim: &Sim, n: usize) -> Option<usize> {
    (0..n).find(|p| sim.leads(*p, "job"))
}

/// Runs until some process other than `not` leads; returns when.
fn takeover(sim: &mut Sim, not: usize, limit: Duration) -> Option<(usize, Duration)> {
    let start = sim.now();
    while sim.now() < start + limit {
        let t = sim.now() + ms(1);
        sim.run_until(t);
        if let Some(p) = (0..3).find(|p| *p != not && sim.leads(*p, "job")) {
            return Some((p, sim.now()));
        }
    }
    None
}

fn assert_clean(r: &Report) {
    assert!(
        r.violations.is_empty(),
        "violations: {:#?}\n{}",
        r.violations,
        r.trace_text()
    );
}

#[test]
fn steady_state_one_leader_and_few_statements() {
    let mut sim = Sim::new(cfg(), Instant::now());
    sim.run_until(ms(10_000));
    let leaders: Vec<usize> = (0..3).filter(|p| sim.leads(*p, "job")).collect();
    assert_eq!(leaders.len(), 1, "{}", sim.report().trace_text());
    let r = sim.finish(ms(10_000), ms(2_000));
    assert_clean(&r);
    assert_eq!(r.acquisitions["job"], 1);
    // 10 s at 200 ms: ~50 heartbeats (+ ~55 tries for standbys), each one statement.
    eprintln!("statements per process in 10 s: {:?}", r.statements);
    assert!(r.statements.iter().all(|s| *s < 130), "{:?}", r.statements);
    for outcomes in &r.outcomes {
        assert_eq!(outcomes, &vec![("job".to_string(), Outcome::Closed)]);
    }
}

#[test]
fn graceful_completion_hands_over_by_notify_within_a_few_latencies() {
    let mut c = cfg();
    c.job_exit_probability = 1.0;
    c.job_lifetime = ms(1000);
    c.full_trace = true;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(100));
    let first = leader(&sim, 3).expect("a leader");
    // The first job completes by itself within 1 s; the next one starts via NOTIFY.
    let (next, at) = takeover(&mut sim, first, ms(2000)).expect("handover");
    let r = sim.finish(ms(6000), ms(2000));
    assert_clean(&r);
    let ended = r
        .trace
        .iter()
        .filter(|l| matches!(&l.event, TraceEvent::JobExited { lease, .. } if lease == "job"))
        .map(|l| l.at)
        .next()
        .unwrap();
    let gap = at - ended;
    eprintln!(
        "handover p{first} -> p{next}: {:.2} ms after the job returned",
        gap.as_secs_f64() * 1e3
    );
    assert!(
        gap < ms(20),
        "handover took {gap:?}, a poll would take ~200 ms"
    );
    assert!(r
        .outcomes
        .iter()
        .flatten()
        .any(|(_, o)| matches!(o, Outcome::Completed | Outcome::Failed)));
}

#[test]
fn frozen_holder_is_replaced_after_the_guard_with_zero_overlap() {
    let mut sim = Sim::new(cfg(), Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(
        ms(1000),
        Fault::Freeze {
            process: holder,
            duration: ms(5000),
        },
    );
    let (next, at) = takeover(&mut sim, holder, ms(4000)).expect("takeover during the freeze");
    let o = sim_options();
    let bound = o.guard_timeout() + o.retry_interval + ms(20);
    eprintln!(
        "frozen holder p{holder}: p{next} leads {:.1} ms after the freeze (bound {bound:?})",
        (at - ms(1000)).as_secs_f64() * 1e3
    );
    assert!(at - ms(1000) <= bound);
    // The server's idle clock starts at the last heartbeat, up to one interval before the freeze.
    assert!(
        at - ms(1000) >= o.guard_timeout() - o.heartbeat_interval,
        "took over before the guard"
    );
    let r = sim.finish(ms(8000), ms(2000));
    assert_clean(&r);
}

#[test]
fn partitioned_holder_is_replaced_after_the_guard_with_zero_overlap() {
    let mut sim = Sim::new(cfg(), Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(
        ms(1000),
        Fault::Partition {
            process: holder,
            duration: ms(5000),
        },
    );
    let (next, at) = takeover(&mut sim, holder, ms(4000)).expect("takeover during the partition");
    eprintln!(
        "partitioned holder p{holder}: p{next} leads {:.1} ms after the partition",
        (at - ms(1000)).as_secs_f64() * 1e3
    );
    let r = sim.finish(ms(8000), ms(2000));
    assert_clean(&r);
    assert!(
        !r.max_overlap.contains_key("job"),
        "overlap {:?}",
        r.max_overlap
    );
}

#[test]
fn terminated_holder_learns_at_once() {
    let mut c = cfg();
    c.full_trace = true;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(ms(1000), Fault::Terminate { process: holder });
    sim.run_until(ms(1005));
    assert!(
        !sim.leads(holder, "job"),
        "holder still leads 5 ms after terminate"
    );
    let r = sim.finish(ms(3000), ms(2000));
    assert_clean(&r);
    eprintln!("overlap after terminate: {:?}", r.max_overlap);
}

/// The lock delay: the standby waiting on the server is woken the moment the
/// terminated holder's key is freed, which is when the holder learns of it;
/// its job (stopping within `job_reaction`, 5 ms) would still run beside the
/// new one if the standby tried at once. Without the delay, two leaders.
#[test]
fn without_the_lock_delay_a_terminated_holders_job_overlaps_the_next() {
    let mut c = cfg();
    c.options.lock_delay = Duration::ZERO;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(ms(1000), Fault::Terminate { process: holder });
    let r = sim.finish(ms(3000), ms(2000));
    eprintln!("lock delay 0: overlap after terminate {:?}", r.max_overlap);
    assert!(
        (r.violations.iter()).any(|v| matches!(v, Violation::TwoLeaders { .. })),
        "{:?}",
        r.violations
    );
}

#[test]
fn crashed_holder_is_replaced_within_a_retry_interval() {
    let mut sim = Sim::new(cfg(), Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(
        ms(1000),
        Fault::Crash {
            process: holder,
            restart_after: Some(ms(500)),
        },
    );
    let (_, at) = takeover(&mut sim, holder, ms(1000)).expect("takeover");
    eprintln!(
        "crash: takeover after {:.1} ms",
        (at - ms(1000)).as_secs_f64() * 1e3
    );
    assert!(at - ms(1000) <= sim_options().retry_interval + ms(10));
    let r = sim.finish(ms(3000), ms(2000));
    assert_clean(&r);
}

#[test]
fn server_restart_leaves_exactly_one_leader() {
    let mut sim = Sim::new(cfg(), Instant::now());
    sim.run_until(ms(1000));
    sim.schedule(ms(1000), Fault::ServerRestart { downtime: ms(700) });
    sim.run_until(ms(4000));
    let leaders: Vec<usize> = (0..3).filter(|p| sim.leads(*p, "job")).collect();
    assert_eq!(leaders.len(), 1);
    let r = sim.finish(ms(4000), ms(2000));
    assert_clean(&r);
}

#[test]
fn slow_replies_below_the_query_timeout_lose_nothing() {
    let mut sim = Sim::new(cfg(), Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(
        ms(1000),
        Fault::SlowServer {
            extra: ms(300),
            duration: ms(3000),
        },
    );
    sim.run_until(ms(5000));
    assert!(sim.leads(holder, "job"));
    let r = sim.finish(ms(5000), ms(2000));
    assert_clean(&r);
    assert_eq!(r.acquisitions["job"], 1, "{}", r.trace_text());
}

fn sim_options() -> Options {
    cfg().options
}

#[test]
fn pooler_and_old_server_are_refused() {
    for (server, want) in [
        (
            ServerConfig {
                pooler: true,
                ..ServerConfig::default()
            },
            (|o: &Outcome| matches!(o, Outcome::Refused(Refusal::StartupOptionsIgnored { .. })))
                as fn(&Outcome) -> bool,
        ),
        (
            // Options rejected: the settings go into the setup statement,
            // then the pooler moves the heartbeat to another backend.
            ServerConfig {
                pooler: true,
                pooler_rejects_options: true,
                ..ServerConfig::default()
            },
            |o: &Outcome| matches!(o, Outcome::Refused(Refusal::BackendChanged { .. })),
        ),
        (
            // PostgreSQL 13 rejects the server guard's idle_session_timeout in the
            // startup packet (SQLSTATE 42704): refused as too old, not a wrong password.
            ServerConfig {
                version: 130_000,
                ..ServerConfig::default()
            },
            |o: &Outcome| matches!(o, Outcome::Refused(Refusal::ServerTooOld { .. })),
        ),
        (
            // PostgreSQL 12 the same.
            ServerConfig {
                version: 120_000,
                ..ServerConfig::default()
            },
            |o: &Outcome| matches!(o, Outcome::Refused(Refusal::ServerTooOld { .. })),
        ),
        (
            // Behind a pooler that rejects startup options, the settings go into
            // the setup statement, whose set_config fails the same way.
            ServerConfig {
                version: 130_000,
                pooler: true,
                pooler_rejects_options: true,
                ..ServerConfig::default()
            },
            |o: &Outcome| matches!(o, Outcome::Refused(Refusal::ServerTooOld { .. })),
        ),
    ] {
        let mut c = cfg();
        // Settings applied by statement pass the setup; the statements
        // after it find the pooler (a lease may be won on the way, never
        // by two at once: the properties check that).
        let by_statement = server.pooler_rejects_options && server.version >= 140_000;
        c.server = server;
        let mut sim = Sim::new(c, Instant::now());
        sim.run_until(ms(1000));
        let r = sim.finish(ms(1000), ms(500));
        assert_clean(&r);
        for outcomes in &r.outcomes {
            assert_eq!(outcomes.len(), 1);
            assert!(want(&outcomes[0].1), "{outcomes:?}\n{}", r.trace_text());
        }
        if !by_statement {
            assert_eq!(r.acquisitions.get("job"), None);
        }
    }
}

#[test]
fn pooler_without_guard_is_refused() {
    // The pooler drops the TCP settings (checked with the guard off too).
    let mut c = cfg();
    c.options.server_guard = false;
    c.server = ServerConfig {
        pooler: true,
        ..ServerConfig::default()
    };
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(2000));
    let r = sim.finish(ms(2000), ms(500));
    assert_clean(&r);
    for outcomes in &r.outcomes {
        assert!(
            matches!(
                outcomes[0].1,
                Outcome::Refused(Refusal::StartupOptionsIgnored { .. })
            ),
            "{outcomes:?}"
        );
    }
}

// ---- the checks can fail ---------------------------------------------------

#[test]
fn broken_a_server_that_kills_silent_sessions_early_breaks_strong_safety() {
    // Guard off and a server that ends silent sessions after 300 ms (shorter
    // than the 700 ms validity): a frozen holder's lock goes while its lease
    // is still valid by its own clock.
    let mut c = cfg();
    c.options.server_guard = false;
    c.server.silent_session_kill = Some(ms(300));
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(
        ms(1000),
        Fault::Freeze {
            process: holder,
            duration: ms(2000),
        },
    );
    let r = sim.finish(ms(4000), ms(1000));
    assert!(
        r.violations.iter().any(Violation::is_safety),
        "{:?}",
        r.violations
    );
}

#[test]
fn broken_guard_off_never_fails_over_from_a_frozen_holder() {
    let mut c = cfg();
    c.options.server_guard = false;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(
        ms(1000),
        Fault::Freeze {
            process: holder,
            duration: ms(10_000),
        },
    );
    assert_eq!(takeover(&mut sim, holder, ms(5000)), None);
}

#[test]
fn broken_drift_beyond_the_bound_breaks_strong_safety() {
    // 700 ms validity and a 200 ms margin allow 200/1600 = 12.5 % drift; a
    // slow holder clock beyond it outlives the server guard.
    let mut found = false;
    for seed in 0..20 {
        let mut c = cfg();
        c.seed = seed;
        c.drift = 0.4;
        let mut sim = Sim::new(c, Instant::now());
        sim.run_until(ms(1000));
        let Some(holder) = leader(&sim, 3) else {
            continue;
        };
        sim.schedule(
            ms(1000),
            Fault::Freeze {
                process: holder,
                duration: ms(3000),
            },
        );
        let r = sim.finish(ms(5000), ms(1000));
        found |= r.violations.iter().any(Violation::is_safety);
    }
    assert!(found, "no seed showed the drift violation");
}

#[test]
fn broken_driver_bugs_are_caught() {
    let early: fn(&Violation) -> bool = |v| matches!(v, Violation::ReleaseWhileJobRuns { .. });
    let lost: fn(&Violation) -> bool = |v| matches!(v, Violation::NeverFinished { .. });
    for (bug, want) in [
        (DriverBug::ReportExitEarly, early),
        (DriverBug::LoseJobExits, lost),
    ] {
        let mut c = cfg();
        c.bug = Some(bug);
        let mut sim = Sim::new(c, Instant::now());
        sim.run_until(ms(1000));
        let holder = leader(&sim, 3).unwrap();
        sim.schedule(ms(1000), Fault::Terminate { process: holder });
        let r = sim.finish(ms(2000), ms(1000));
        assert!(r.violations.iter().any(want), "{bug:?}: {:?}", r.violations);
    }
    let mut c = cfg();
    c.bug = Some(DriverBug::IgnoreCloseSession);
    c.options.server_guard = false;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(1000));
    assert!(leader(&sim, 3).is_some());
    // The holder gives up its session when a statement times out (a slow
    // server); the buggy driver keeps the connection, and its locks stay on
    // the server. (A partition no longer shows it: the session's TCP
    // settings end a partitioned client's session at about the guard.)
    sim.schedule(
        ms(1000),
        Fault::SlowServer {
            extra: ms(1000),
            duration: ms(1500),
        },
    );
    let r = sim.finish(ms(4000), ms(1000));
    assert!(
        r.violations
            .iter()
            .any(|v| matches!(v, Violation::LockLeaked { .. })),
        "{:?}",
        r.violations
    );
}

#[test]
fn broken_a_stuck_driver_clock_is_reported_as_a_stall() {
    // The driver hands the machine the same instant at every wake-up: the
    // machine's deadline never comes, and the timer is due again at once.
    // The simulator used to re-arm it at the same virtual instant forever.
    let mut c = cfg();
    c.bug = Some(DriverBug::FrozenClock);
    let r = Sim::new(c, Instant::now()).finish(ms(2000), ms(1000));
    assert!(
        r.violations
            .iter()
            .any(|v| matches!(v, Violation::Stalled { .. })),
        "{:?}",
        r.violations
    );
}

/// In the simulator, a server whose TCP gives up on a silent client after
/// 300 ms (a role's `tcp_keepalives_*` / `tcp_user_timeout`), shorter than
/// the 700 ms validity. A partitioned holder's session ends while its lease
/// is still valid by its own clock, unless the session sets its own TCP
/// settings (no earlier than the guard), as the machine does.
fn partitioned_holder_under_server_tcp_give_up(bug: Option<DriverBug>) -> Report {
    let mut c = cfg();
    c.server.tcp_give_up = Some(ms(300));
    c.bug = bug;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(1000));
    let holder = leader(&sim, 3).unwrap();
    sim.schedule(
        ms(1000),
        Fault::Partition {
            process: holder,
            duration: ms(2000),
        },
    );
    sim.finish(ms(4000), ms(1000))
}

#[test]
fn server_tcp_give_up_cannot_end_a_partitioned_holders_session_early() {
    let r = partitioned_holder_under_server_tcp_give_up(None);
    assert!(
        !r.violations.iter().any(Violation::is_safety),
        "{:?}\n{}",
        r.violations,
        r.trace_text()
    );
}

#[test]
fn broken_sessions_without_tcp_settings_break_strong_safety() {
    let r = partitioned_holder_under_server_tcp_give_up(Some(DriverBug::NoTcpSettings));
    assert!(
        r.violations.iter().any(Violation::is_safety),
        "{:?}\n{}",
        r.violations,
        r.trace_text()
    );
}

/// In the simulator, the server crashes right after an acquisition (losing
/// unflushed transaction ids), then a replica lagging by 3 transaction ids
/// is promoted. Every acquisition's token is checked against every earlier
/// one of the lease ([`Violation::TokenNotIncreasing`]).
fn tokens_across_crash_and_promotion(legacy_tokens: bool) -> Report {
    let mut c = cfg();
    c.server.legacy_tokens = legacy_tokens;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(500));
    sim.schedule(ms(500), Fault::ServerCrash { downtime: ms(300) });
    sim.schedule(
        ms(2000),
        Fault::Promote {
            lag: 3,
            downtime: ms(300),
        },
    );
    sim.finish(ms(4000), ms(1000))
}

#[test]
fn tokens_strictly_increase_across_server_crash_and_promotion() {
    let r = tokens_across_crash_and_promotion(false);
    assert_clean(&r);
    assert!(r.acquisitions["job"] >= 3, "{}", r.trace_text());
}

#[test]
fn broken_tokens_without_wal_record_or_timeline_repeat_or_go_backwards() {
    let r = tokens_across_crash_and_promotion(true);
    let bad: Vec<&Violation> = (r.violations.iter())
        .filter(|v| matches!(v, Violation::TokenNotIncreasing { .. }))
        .collect();
    assert!(bad.len() >= 2, "{:?}\n{}", r.violations, r.trace_text());
}

/// In the simulator, a hot standby is retried, not refused; once promoted,
/// some process leads.
#[test]
fn a_hot_standby_is_retried_until_promoted() {
    let mut c = cfg();
    c.server.standby = true;
    let mut sim = Sim::new(c, Instant::now());
    sim.schedule(
        ms(1000),
        Fault::Promote {
            lag: 0,
            downtime: ms(100),
        },
    );
    sim.run_until(ms(1000));
    assert_eq!(leader(&sim, 3), None);
    sim.run_until(ms(3000));
    assert!(leader(&sim, 3).is_some(), "{}", sim.report().trace_text());
    let r = sim.finish(ms(3000), ms(1000));
    assert_clean(&r);
    assert!(
        r.trace_text().contains("InRecovery"),
        "no InRecovery event: {}",
        r.trace_text()
    );
}

/// In the simulator, clients share the one backend of a transaction
/// pooler, every setting set by the role, so the setup passes. The session
/// nonce (checked by every try and heartbeat) and the try's own-backend
/// check refuse them; never two leaders.
#[test]
fn clients_sharing_one_backend_are_refused_by_the_nonce() {
    let mut c = cfg();
    c.server.pooler_one_backend = true;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(2000));
    let r = sim.finish(ms(2000), ms(1000));
    assert_clean(&r);
    let shared = (r.outcomes.iter().flatten())
        .filter(|(_, o)| matches!(o, Outcome::Refused(Refusal::BackendShared { .. })))
        .count();
    assert!(shared >= 2, "{:?}\n{}", r.outcomes, r.trace_text());
}

#[test]
fn a_rotated_password_does_not_stop_a_fleet_that_had_sessions() {
    let mut sim = Sim::new(cfg(), Instant::now());
    sim.run_until(ms(1_000));
    let first = leader(&sim, 3).expect("a leader");
    // Authentication fails for 3 s; meanwhile the server restarts, so every
    // process reconnects into the failures.
    sim.schedule(
        ms(1_000),
        Fault::AuthFailing {
            duration: ms(3_000),
        },
    );
    sim.schedule(ms(1_200), Fault::ServerRestart { downtime: ms(100) });
    sim.run_until(ms(3_900));
    assert!(
        (0..3).all(|p| !sim.leads(p, "job")),
        "nobody leads while no session can open"
    );
    let (next, at) = takeover(&mut sim, usize::MAX, ms(3_000)).expect("leads again");
    eprintln!("after the password works again: process {next} leads at {at:?} (first {first})");
    let r = sim.finish(ms(8_000), ms(2_000));
    // No run finished with a configuration error (the checks would say so).
    assert_clean(&r);
    for outcomes in &r.outcomes {
        assert!(
            outcomes
                .iter()
                .all(|(_, o)| !matches!(o, Outcome::Config(_))),
            "{outcomes:?}"
        );
    }
}

/// In the simulator, a LONE client behind a transaction pooler that rejects the startup
/// options (the settings go by statement, so the setup passes) and runs everything on
/// one server connection. No other client overwrites the nonce and the pid never
/// changes, so nothing on the session itself shows the pooler; the pooler probe does: a
/// second connection, opened while the session is idle, lands on the same backend and
/// reads this session's nonce. The client is refused and never leads.
fn lone_client_behind_a_one_backend_pooler(mutation: Option<Mutation>) -> Report {
    let mut c = cfg();
    c.processes = 1;
    c.server.pooler = true;
    c.server.pooler_rejects_options = true;
    c.server.pooler_one_backend = true;
    c.mutation = mutation;
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(2000));
    sim.finish(ms(2000), ms(1000))
}

#[test]
fn a_lone_client_behind_a_one_backend_pooler_is_refused_by_the_probe() {
    let r = lone_client_behind_a_one_backend_pooler(None);
    assert_clean(&r);
    assert_eq!(r.acquisitions.get("job"), None, "{}", r.trace_text());
    let refused = (r.outcomes.iter().flatten())
        .filter(|(_, o)| matches!(o, Outcome::Refused(Refusal::TransactionPooler { .. })))
        .count();
    assert_eq!(refused, 1, "{:?}\n{}", r.outcomes, r.trace_text());
}

/// The broken variant: without the probe the lone client leads behind the pooler.
#[test]
fn broken_without_the_pooler_probe_a_lone_client_leads_behind_a_transaction_pooler() {
    let r = lone_client_behind_a_one_backend_pooler(Some(Mutation::NoPoolerProbe));
    assert!(
        r.acquisitions.get("job").is_some_and(|n| *n > 0),
        "{:?}\n{}",
        r.outcomes,
        r.trace_text()
    );
}

/// A herd of `standbys` standbys of one lease (library default intervals, standbys started
/// after the holder, in turn); the holder crashes at 20 s. Returns the statements every
/// standby sent in the 200 ms after the crash, how long until one led, and how many
/// statements that one sent from the crash until it led.
fn herd_takeover(standbys: usize) -> (u64, Duration, u64) {
    let n = standbys + 1;
    let mut c = cfg();
    c.seed = 7;
    c.processes = n;
    c.options = Options::default();
    c.run_after = (0..n)
        .map(|p| {
            vec![if p == 0 {
                ms(0)
            } else {
                ms(200 + 37 * p as u64)
            }]
        })
        .collect();
    let crash = ms(20_000);
    let mut sim = Sim::new(c, Instant::now());
    sim.schedule(
        crash,
        Fault::Crash {
            process: 0,
            restart_after: None,
        },
    );
    sim.run_until(crash - ms(1));
    assert!(sim.leads(0, "job"), "the first process leads");
    let at_crash: Vec<u64> = (0..n).map(|p| sim.statements(p)).collect();
    let before: u64 = at_crash[1..].iter().sum();
    let mut led = None;
    while sim.now() < crash + ms(200) {
        let t = sim.now() + ms(1);
        sim.run_until(t);
        if led.is_none() {
            if let Some(p) = (1..n).find(|p| sim.leads(*p, "job")) {
                led = Some((sim.now() - crash, sim.statements(p) - at_crash[p]));
            }
        }
    }
    let after: u64 = (1..n).map(|p| sim.statements(p)).sum();
    let r = sim.finish(ms(25_000), ms(2000));
    assert_clean(&r);
    let (took, winner_sent) = led.expect("a standby leads within 200 ms");
    (after - before, took, winner_sent)
}

/// The statements of a takeover do not grow with the standbys: at most
/// `HERD_WAITERS` of them wait on the key at once (a wait finds that many
/// already waiting and does not queue: its standby polls instead), so a crash
/// wakes that many, not every standby.
#[test]
fn a_takeover_costs_as_many_statements_with_twenty_standbys_as_with_three() {
    let (three, took3, _) = herd_takeover(3);
    let (twenty, took20, _) = herd_takeover(20);
    eprintln!(
        "takeover after a crash: 3 standbys {three} statements, led after {took3:?}; \
         20 standbys {twenty} statements, led after {took20:?}"
    );
    assert!(
        twenty <= three + 2,
        "20 standbys sent {twenty} statements, 3 sent {three}"
    );
}

/// A crashed holder's lease goes to the standby first in the key's queue by the very
/// statement it waited with: the server grants it the key as the crash frees it, and its
/// job starts the lock delay after that reply, with no try after a wake (a round trip and
/// a statement less on the takeover's path). Checked with 1 standby and with 20.
#[test]
fn the_wait_the_crash_ends_takes_the_key_without_another_statement() {
    for standbys in [1, 20] {
        let (_, took, winner_sent) = herd_takeover(standbys);
        eprintln!(
            "{standbys} standbys: led {took:?} after the crash; \
             the winner sent {winner_sent} statements meanwhile"
        );
        assert_eq!(
            winner_sent, 0,
            "{standbys} standbys: the winner sent {winner_sent} statements between the \
             crash and its job's start"
        );
    }
}

/// Two members of a group of four leases: process 0 leads them all, process 1's runs start
/// at 1 s and it is frozen (SIGSTOP) 60 ms after its first membership read showed both, for
/// 3.5 s: process 0 hands it its two keys, which stay free past the bound (two retry
/// intervals and two query timeouts, 1.4 s here), so process 0 takes them back and offers
/// them no more while the membership holds. Process 1 has no statement in flight through
/// the freeze (one would time out at the thaw, and its next session is another member),
/// and the validity (5 s) keeps the server guard (5.2 s) from ending its idle session, so
/// the membership stays the same. Returns how many of the leases each process leads 6 s
/// (30 retry intervals) after the thaw.
fn frozen_owner_share() -> Vec<usize> {
    let mut c = cfg();
    c.processes = 2;
    c.group = Some("g".into());
    c.leases = (0..4).map(|i| format!("job-{i}")).collect();
    c.run_after = vec![vec![], vec![ms(1000); 4]];
    c.options.validity = Some(ms(5000));
    c.full_trace = true;
    let leases = c.leases.clone();
    let mut sim = Sim::new(c, Instant::now());
    sim.run_until(ms(1000));
    let joined = |sim: &Sim| {
        sim.report().trace.iter().any(|l| {
            l.process == Some(1)
                && matches!(
                    &l.event,
                    TraceEvent::Machine(lease_proto::Event::GroupMembers { members, .. })
                        if members.len() == 2
                )
        })
    };
    while !joined(&sim) {
        assert!(sim.now() < ms(2000), "process 1 never read both members");
        let t = sim.now() + ms(1);
        sim.run_until(t);
    }
    let thaw = sim.now() + ms(3560);
    sim.schedule(
        sim.now() + ms(60),
        Fault::Freeze {
            process: 1,
            duration: ms(3500),
        },
    );
    sim.run_until(thaw + ms(6000));
    let counts: Vec<usize> = (0..2)
        .map(|p| leases.iter().filter(|l| sim.leads(p, l)).count())
        .collect();
    let r = sim.finish(thaw + ms(8000), ms(2000));
    assert_clean(&r);
    counts
}

/// A member frozen past the free bound gets its share back when it thaws: it claims its
/// keys on the handover channel and the holder hands them over. Without handover
/// notifications no claim could go out, and process 0 kept all four for good (`[4, 0]`):
/// so a lease group needs them (`groups::a_group_run_without_handover_notifications_is_
/// refused`).
#[test]
fn a_member_frozen_past_the_free_bound_gets_its_share_back() {
    assert_eq!(frozen_owner_share(), vec![2, 2]);
}

/// Every [`lease_proto::Event::ServerClockStepped`] of a run: `(process,
/// back, across_sessions)`.
fn clock_steps(r: &Report) -> Vec<(usize, Duration, bool)> {
    (r.trace.iter())
        .filter_map(|l| match (&l.event, l.process) {
            (
                TraceEvent::Machine(lease_proto::Event::ServerClockStepped {
                    back,
                    across_sessions,
                    ..
                }),
                Some(p),
            ) => Some((p, *back, *across_sessions)),
            _ => None,
        })
        .collect()
}

/// A server clock 30 s behind after a crash (a restart with a stepped clock)
/// or a promotion (a standby whose clock is behind): every process sees it
/// once, at its new session's setup, as at least 29.5 s back (the round
/// trips and the drift allowed are not counted in it), and never again while the clock stays
/// there. The same faults without a step, with clock drift at 80 % of the
/// bound (12.5 % here), are never reported.
#[test]
fn a_server_clock_stepped_back_is_reported_once_per_process() {
    for fault in [
        Fault::ServerCrash { downtime: ms(300) },
        Fault::Promote {
            lag: 0,
            downtime: ms(300),
        },
    ] {
        for (step, drift) in [(Duration::from_secs(30), 0.0), (Duration::ZERO, 0.1)] {
            let mut c = cfg();
            c.drift = drift;
            c.full_trace = true;
            c.server.clock_step_back = step;
            let mut sim = Sim::new(c.clone(), Instant::now());
            sim.schedule(ms(2000), fault.clone());
            let r = sim.finish(ms(10_000), ms(1000));
            let steps = clock_steps(&r);
            if step.is_zero() {
                assert_clean(&r);
                assert_eq!(steps, vec![], "{fault:?}: no step, drift {drift}");
                continue;
            }
            for p in 0..c.processes {
                let mine: Vec<_> = steps.iter().filter(|s| s.0 == p).collect();
                assert_eq!(mine.len(), 1, "{fault:?}, process {p}: {steps:?}");
                let (_, back, across) = *mine[0];
                assert!(across, "{fault:?}: {steps:?}");
                // A lower bound: less the round trips and the drift the
                // bound allows (12.5 %) over the time since the reading
                // before the fault (a heartbeat interval and the downtime).
                assert!(back <= step && back > step - ms(500), "{fault:?}: {back:?}");
            }
        }
    }
}
