//! The configurations in which the checker finds each broken variant
//! ([`Mutation`]) of the machine, the simulated driver and the server
//! model: the fourth review's holes with their fixes reverted among them.
//! Each is a [`Model`] with its mutation planted; the correct code passes
//! the same model (`check/tests/variants.rs`).

use std::time::Duration;

use lease_proto::sim::{Fault, Mutation, SimConfig};
use lease_proto::{Role, ServerWait};

use crate::Model;

/// A broken variant and where the checker finds it.
#[derive(Debug, Clone)]
pub struct Variant {
    /// A short name (the example's argument).
    pub name: &'static str,
    /// The model, its mutation planted.
    pub model: Model,
    /// The breach the counterexample must show: a
    /// [`Violation`](lease_proto::sim::Violation) kind or a checker
    /// property's name.
    pub breach: &'static str,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn variant(
    name: &'static str,
    mutation: Mutation,
    mut model: Model,
    breach: &'static str,
) -> Variant {
    model.mutation = Some(mutation);
    Variant {
        name,
        model,
        breach,
    }
}

/// Every broken variant, in the order of `docs/checker.md`'s table.
pub fn all() -> Vec<Variant> {
    vec![
        lock_delay_only_after_wakes(),
        notify_from_anyone(),
        confirm_at_arrival(),
        no_fast_reconnect(),
        hand_over_unchecked(),
        ignore_promotion(),
        hold_only_since_start(),
        no_pooler_probe(),
        ignore_share(),
        keep_reserved_win(),
        ignore_grantee(),
        watch_acquires(),
        watch_tries(),
        observer_tries(),
        fatal_reply_is_statement_failure(),
        forged_member_counted(),
    ]
}

/// The variant named `name`.
pub fn named(name: &str) -> Option<Variant> {
    all().into_iter().find(|v| v.name == name)
}

/// Terminates and a forged handover notification.
pub fn lock_delay_only_after_wakes() -> Variant {
    let mut model = Model::new(2, 2, 40);
    model.faults = Model::lock_delay_menu(2);
    variant(
        "lock-delay-only-after-wakes",
        Mutation::LockDelayOnlyAfterWakes,
        model,
        "TwoLeaders",
    )
}

/// A forged notification just before the holder's terminate, once the
/// holder is established (the first 24 steps in time order).
pub fn notify_from_anyone() -> Variant {
    let mut model = Model::new(2, 2, 50).with(|cfg| cfg.options.server_wait = ServerWait::Off);
    model.from = 24;
    model.faults = Model::lock_delay_menu(2);
    variant(
        "notify-from-anyone",
        Mutation::NotifyFromAnyone,
        model,
        "TwoLeaders",
    )
}

/// A link that turns slow, then a partition of the holder.
pub fn confirm_at_arrival() -> Variant {
    let mut model = Model::new(2, 2, 50);
    model.from = 24;
    // A round trip 440 ms longer: above the guard margin (200 ms), below
    // the query timeout (500 ms).
    model.faults = vec![
        Fault::Delay {
            process: 0,
            extra: ms(220),
            duration: ms(5000),
        },
        Fault::Partition {
            process: 0,
            duration: ms(2000),
        },
        Fault::Freeze {
            process: 0,
            duration: ms(2000),
        },
    ];
    variant(
        "confirm-at-arrival",
        Mutation::ConfirmAtArrival,
        model,
        "TwoLeaders",
    )
}

/// A server restart; bounded failover.
pub fn no_fast_reconnect() -> Variant {
    let mut model = Model::new(2, 1, 50).with(|cfg| cfg.options.retry_interval = ms(1000));
    // Restarts once the sessions are up (the fast window follows a lost
    // session that was ready).
    model.from = 24;
    // The fast reconnect window's cap (60 ms), the lock delay and 20
    // one-way latencies: a server that is back is led again within that.
    model.failover = Some(ms(100));
    model.faults = vec![
        Fault::ServerRestart { downtime: ms(300) },
        Fault::ServerRestart { downtime: ms(1000) },
    ];
    variant(
        "no-fast-reconnect",
        Mutation::NoFastReconnect,
        model,
        "NoFailover",
    )
}

/// Hole 5 of the fourth review: hand-over requests for a backend that
/// does not wait for the key (none has its pid), twice; bounded failover.
pub fn hand_over_unchecked() -> Variant {
    let mut model = Model::new(2, 2, 40);
    model.from = 24;
    let request = Fault::RequestHandoverToPid {
        lease: 0,
        pid: 99_999,
    };
    model.faults = vec![request.clone(), request];
    variant(
        "hand-over-unchecked",
        Mutation::HandOverUnchecked,
        model,
        "NoFailover",
    )
}

/// A promotion while the primary is frozen (its sessions stay open and
/// silent); no failover bound (the promotion hold keeps every lease unled).
pub fn ignore_promotion() -> Variant {
    let mut model = Model::new(2, 1, 40);
    model.failover = None;
    model.faults = vec![Fault::PromoteFrozenPrimary { lag: 0 }];
    variant(
        "ignore-promotion",
        Mutation::IgnorePromotion,
        model,
        "TwoLeaders",
    )
}

/// Hole 2 of the fourth review: a promotion while the primary is frozen,
/// then a restart of the promoted server.
pub fn hold_only_since_start() -> Variant {
    let mut model = Model::new(2, 2, 40);
    model.failover = None;
    model.faults = vec![
        Fault::PromoteFrozenPrimary { lag: 0 },
        Fault::ServerRestart { downtime: ms(10) },
    ];
    variant(
        "hold-only-since-start",
        Mutation::HoldOnlySinceStart,
        model,
        "TwoLeaders",
    )
}

/// A lone client behind a transaction pooler that runs everything on one
/// server connection and rejects the startup options.
pub fn no_pooler_probe() -> Variant {
    let mut model = Model::new(1, 0, 40).with(|cfg| {
        cfg.server.pooler = true;
        cfg.server.pooler_rejects_options = true;
        cfg.server.pooler_one_backend = true;
    });
    model.failover = None;
    model.faults = Vec::new();
    variant(
        "no-pooler-probe",
        Mutation::NoPoolerProbe,
        model,
        "LedBehindPooler",
    )
}

/// Three members of a lease group of four leases, no fault (the start's
/// orders); fair share.
pub fn ignore_share() -> Variant {
    let mut model = Model::new(3, 0, 12).with(group_of_four);
    model.failover = None;
    model.fair_share = Some(ms(2000));
    model.faults = Vec::new();
    variant("ignore-share", Mutation::IgnoreShare, model, "UnfairShare")
}

/// Two processes in one lease group of four leases, handover notifications on.
pub fn group_of_four(cfg: &mut SimConfig) {
    cfg.group = Some("g".into());
    cfg.leases = (0..4).map(|i| format!("job-{i}")).collect();
    cfg.options.notify_handover = true;
}

/// Three processes, takes queued on the server; a hand-over request to
/// one of the standbys once the holder is established.
pub fn keep_reserved_win() -> Variant {
    let mut model = Model::new(3, 1, 50);
    model.from = 30;
    model.faults = vec![
        Fault::RequestHandover { lease: 0, to: 1 },
        Fault::RequestHandover { lease: 0, to: 2 },
    ];
    variant(
        "keep-reserved-win",
        Mutation::KeepReservedWin,
        model,
        "HandoverMissed",
    )
}

/// Three processes whose jobs return by themselves (graceful releases to
/// takes queued on the server); the next taker's session terminated
/// moments after its grant.
pub fn ignore_grantee() -> Variant {
    let mut model = Model::new(3, 1, 40).with(|cfg| {
        cfg.job_exit_probability = 1.0;
        cfg.job_lifetime = ms(300);
    });
    model.failover = None;
    model.faults = vec![
        Fault::TerminateNextTaker { after: ms(1) },
        Fault::TerminateNextTaker { after: ms(5) },
    ];
    variant(
        "ignore-grantee",
        Mutation::IgnoreGrantee,
        model,
        "TwoLeaders",
    )
}

/// Two processes, two leases: each leads one at the start and wants the
/// other 300 ms later, so each watches the other's (the watch ring).
pub fn ring(cfg: &mut SimConfig) {
    cfg.leases = vec!["job-0".into(), "job-1".into()];
    cfg.run_after = vec![vec![ms(0), ms(300)], vec![ms(300), ms(0)]];
}

/// The watch ring; a crash of either process (back after 300 ms).
pub fn watch_acquires() -> Variant {
    let mut model = Model::new(2, 1, 60).with(ring);
    model.from = 20;
    model.failover = None;
    model.faults = (0..2)
        .map(|process| Fault::Crash {
            process,
            restart_after: Some(ms(300)),
        })
        .collect();
    variant(
        "watch-acquires",
        Mutation::WatchAcquires,
        model,
        "TwoLeaders",
    )
}

/// The watch ring, no fault.
pub fn watch_tries() -> Variant {
    let mut model = Model::new(2, 0, 40).with(ring);
    model.failover = None;
    model.faults = Vec::new();
    variant("watch-tries", Mutation::WatchTries, model, "WatchNotAWait")
}

/// Process 0 observes; a crash of process 1.
pub fn observer_tries() -> Variant {
    let mut model = Model::new(2, 1, 40).with(|cfg| {
        let mut observer = cfg.options.clone();
        observer.role = Role::Observer;
        cfg.process_options = vec![Some(observer)];
    });
    model.faults = vec![Fault::Crash {
        process: 1,
        restart_after: Some(ms(1000)),
    }];
    variant(
        "observer-tries",
        Mutation::ObserverTries,
        model,
        "ObserverLed",
    )
}

/// Jobs stopped as `lease run` stops its command, a command that ignores
/// SIGTERM (300 ms to return), a slow server (statements in flight) and
/// terminates.
pub fn lease_run_jobs(cfg: &mut SimConfig) {
    cfg.stop_as_lease_run = true;
    cfg.job_reaction = ms(300);
    cfg.job_reaction_min = ms(300);
    cfg.options.retry_interval = ms(100);
    cfg.options.heartbeat_interval = ms(200);
    cfg.options.query_timeout = ms(300);
    cfg.options.guard_margin = ms(400);
    // Standbys poll: events all along a statement's time on the server.
    cfg.options.server_wait = ServerWait::Off;
}

/// Hole 1 of the fourth review: `pg_terminate_backend` with a statement in
/// flight (a slow server), jobs stopped as `lease run` stops them.
pub fn fatal_reply_is_statement_failure() -> Variant {
    let mut model = Model::new(2, 2, 40).with(lease_run_jobs);
    model.from = 20;
    model.failover = None;
    model.faults = vec![
        Fault::SlowServer {
            extra: ms(150),
            duration: ms(3000),
        },
        Fault::TerminateFatalFirst { process: 0 },
        Fault::TerminateFatalFirst { process: 1 },
    ];
    variant(
        "fatal-reply-is-statement-failure",
        Mutation::FatalReplyIsStatementFailure,
        model,
        "TwoLeaders",
    )
}

/// Hole 6 of the fourth review: a forged member lock in a lease group of
/// two members and four leases; fair share and bounded failover.
pub fn forged_member_counted() -> Variant {
    let mut model = Model::new(2, 1, 30).with(group_of_four);
    model.failover = None;
    model.fair_share = Some(ms(2000));
    model.faults = vec![
        Fault::ForgedMember { pid: 1 },
        Fault::ForgedMember { pid: 1 << 30 },
    ];
    variant(
        "forged-member-counted",
        Mutation::ForgedMemberCounted,
        model,
        "UnfairShare",
    )
}
