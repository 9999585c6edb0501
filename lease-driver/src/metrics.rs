//! Every metric of the crate, derived in this one module from what the drain
//! rule routes (the core's events and run commands, the inputs fed to it) and
//! from the driver's own statement timing. Built only with the `metrics`
//! feature; without it every hook below is an empty inline function on a
//! zero-sized type, and no clock is read for it.
//!
//! The set is documented in docs/metrics.md.

pub(crate) use imp::{Metrics, Sent};

#[cfg(feature = "metrics")]
pub use imp::describe_metrics;

#[cfg(feature = "metrics")]
mod imp {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::sync::Mutex;
    use std::time::Instant;

    use ::metrics::{
        counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
    };
    use lease_proto::{
        reply::Row, Event, Input, LeaseId, Reason, RunCommand, RunId, SessionError, Statement,
    };

    use crate::runtime::Clock;

    /// Registers the name, unit and help text of every metric with the
    /// installed recorder (an exporter prints them as `# HELP` lines).
    ///
    /// Every `Locker` constructor calls it; call it yourself if you install
    /// the recorder after creating the locker.
    pub fn describe_metrics() {
        describe_gauge!(
            "lease_leader",
            "1 while this process holds the lease (acquired, not yet lost or released), else 0"
        );
        describe_gauge!(
            "lease_fencing_token",
            "Fencing token of this process's latest acquisition of the lease"
        );
        describe_counter!("lease_acquisitions_total", "Acquisitions of the lease");
        describe_counter!(
            "lease_losses_total",
            "Leases lost while held (the job was cancelled), by reason"
        );
        describe_counter!(
            "lease_releases_total",
            "Leases released by this process after its job returned"
        );
        describe_histogram!(
            "lease_standby_duration_seconds",
            Unit::Seconds,
            "Time from a run starting to contend (its start, or its job's return after a loss) to its acquisition"
        );
        describe_histogram!(
            "lease_job_stop_duration_seconds",
            Unit::Seconds,
            "Time from a job's cancellation (loss detected, shutdown or close) to its return, by reason"
        );
        describe_counter!(
            "lease_session_connects_total",
            "Database sessions that connected and passed setup"
        );
        describe_counter!(
            "lease_session_failures_total",
            "Database sessions (or connection attempts) that ended unasked, by class"
        );
        describe_gauge!(
            "lease_sessions_ready",
            "Lease sessions of this process that are ready (1 per connected locker)"
        );
        describe_histogram!(
            "lease_statement_duration_seconds",
            Unit::Seconds,
            "Time from sending a statement to its reply, by statement kind"
        );
        describe_counter!(
            "lease_statement_errors_total",
            "Statements answered with an error, by statement kind"
        );
        describe_gauge!(
            "lease_group_members",
            "Members of the lease group in each locker's last membership read (itself included), summed over the process's lockers in the group"
        );
        describe_gauge!(
            "lease_group_leases_held",
            "Leases of the lease group this process holds"
        );
        describe_counter!(
            "lease_server_clock_steps_total",
            "Steps back of the database server's clock (the fencing tokens' source) beyond the guard margin, seen by this process's lockers"
        );
        describe_counter!(
            "lease_group_handoffs_total",
            "Leases of the group this process handed over to the member owning them, by cause"
        );
    }

    /// What the metrics remember of one live run.
    #[derive(Default)]
    struct RunTimes {
        /// Known from the run's first acquisition.
        lease: String,
        /// Contending since (cleared at acquisition).
        standby_since: Option<Instant>,
        /// Cancelled at, and why (cleared when the job returns).
        cancelled: Option<(Instant, &'static str)>,
        /// Counted in `lease_leader` (acquired, not yet lost or released).
        leading: bool,
        /// The run's lease group, by id.
        group: Option<u32>,
        /// The group's members when the run last acquired its lease.
        members_at_acquisition: BTreeSet<i64>,
    }

    /// What the metrics remember of one lease group of the locker's runs.
    #[derive(Default)]
    struct GroupTimes {
        /// Its name (the label), from its first membership event.
        name: String,
        /// The members of the last read on the current session.
        members: BTreeSet<i64>,
        /// What this locker added to `lease_group_members`.
        counted: usize,
        /// Its live runs.
        runs: usize,
    }

    impl GroupTimes {
        /// Moves this locker's part of `lease_group_members` to `n`.
        fn count(&mut self, n: usize) {
            if n != self.counted && !self.name.is_empty() {
                let delta = n as i64 - self.counted as i64;
                level("lease_group_members", Some(("group", &self.name)), delta);
            }
            self.counted = n;
        }
    }

    /// Per-locker metric state, in the shared state.
    #[derive(Default)]
    pub(crate) struct Metrics {
        runs: HashMap<RunId, RunTimes>,
        /// The lease groups of the runs, by id.
        groups: HashMap<u32, GroupTimes>,
        /// The driver is ending: the session loss that follows is not a fault.
        driver_stopped: bool,
        /// Counted in `lease_sessions_ready`.
        ready: bool,
        /// Runs finished in this drain, forgotten at its end.
        finished: Vec<RunId>,
    }

    impl Metrics {
        /// At every locker's construction: describes the metrics to the
        /// recorder installed now.
        pub(crate) fn new() -> Metrics {
            describe_metrics();
            Metrics::default()
        }

        /// A run (in lease group `group`, by id) was registered with the core.
        pub(crate) fn run_started(&mut self, run: RunId, group: Option<u32>, now: Instant) {
            if let Some(g) = group {
                self.groups.entry(g).or_default().runs += 1;
            }
            let times = RunTimes {
                standby_since: Some(now),
                group,
                ..RunTimes::default()
            };
            self.runs.insert(run, times);
        }

        /// An input about to be fed to the core.
        pub(crate) fn input(&mut self, clock: &Clock, input: &Input) {
            let Input::JobExited { run, .. } = input else {
                return;
            };
            let Some(times) = self.runs.get_mut(run) else {
                return;
            };
            let now = clock();
            if let Some((at, reason)) = times.cancelled.take() {
                let lease = times.lease.clone();
                histogram!("lease_job_stop_duration_seconds", "lease" => lease, "reason" => reason)
                    .record(now.saturating_duration_since(at));
            }
            // After a loss the run contends again; otherwise it finishes and
            // is forgotten.
            times.standby_since = Some(now);
        }

        /// A run command the drain rule routed.
        pub(crate) fn run_command(&mut self, clock: &Clock, command: &RunCommand) {
            match command {
                RunCommand::CancelJob { run, reason } => {
                    if let Some(times) = self.runs.get_mut(run) {
                        let reason = reason_label(reason, self.driver_stopped);
                        times.cancelled.get_or_insert((clock(), reason));
                    }
                }
                // Its last event (a release) comes later in this drain.
                RunCommand::Finish { run, .. } => self.finished.push(*run),
                RunCommand::StartJob { .. } => {}
            }
        }

        /// An event the drain rule routed. The summed gauges move through
        /// [`level`], so that several lockers of one process add up (one's
        /// late loss detection cannot zero another's acquisition of the same
        /// lease).
        pub(crate) fn event(&mut self, clock: &Clock, event: &Event) {
            match event {
                Event::Acquired { run, lease, token } => {
                    let name = lease.name().to_owned();
                    counter!("lease_acquisitions_total", "lease" => name.clone()).increment(1);
                    // Tokens are transaction ids: exact in an f64 below 2^53.
                    gauge!("lease_fencing_token", "lease" => name.clone()).set(*token as f64);
                    if let Some(times) = self.runs.get_mut(run) {
                        if !times.leading {
                            times.leading = true;
                            level("lease_leader", Some(("lease", &name)), 1);
                            if let Some(g) = lease.group() {
                                level("lease_group_leases_held", Some(("group", g.name())), 1);
                            }
                        }
                        if let Some(g) = times.group.and_then(|g| self.groups.get(&g)) {
                            times.members_at_acquisition.clone_from(&g.members);
                        }
                        if let Some(since) = times.standby_since.take() {
                            histogram!("lease_standby_duration_seconds", "lease" => name.clone())
                                .record(clock().saturating_duration_since(since));
                        }
                        times.lease = name;
                    }
                }
                Event::Lost { run, lease, reason } => {
                    let name = lease.name().to_owned();
                    let reason = reason_label(reason, self.driver_stopped);
                    counter!("lease_losses_total", "lease" => name.clone(), "reason" => reason)
                        .increment(1);
                    self.not_leading(*run, lease);
                }
                Event::Released { run, lease } => {
                    let name = lease.name().to_owned();
                    counter!("lease_releases_total", "lease" => name).increment(1);
                    self.not_leading(*run, lease);
                }
                Event::GroupMembers { group, members, .. } => {
                    let g = self.groups.entry(group.id()).or_default();
                    if g.name.is_empty() {
                        g.name = group.name().to_owned();
                    }
                    g.members = members.iter().copied().collect();
                    g.count(members.len());
                }
                Event::HandedOver {
                    run,
                    lease,
                    to,
                    requested,
                } => {
                    if let (Some(times), Some(g)) = (self.runs.get(run), lease.group()) {
                        let cause = if *requested {
                            "requested"
                        } else {
                            let now = self.groups.get(&g.id()).map(|g| &g.members);
                            handoff_cause(&times.members_at_acquisition, now, *to)
                        };
                        let group = g.name().to_owned();
                        counter!("lease_group_handoffs_total", "group" => group, "cause" => cause)
                            .increment(1);
                    }
                }
                Event::SessionReady { .. } => {
                    counter!("lease_session_connects_total").increment(1);
                    if !self.ready {
                        self.ready = true;
                        level("lease_sessions_ready", None, 1);
                    }
                }
                Event::SessionLost { reason, .. } => {
                    self.not_ready();
                    self.no_members();
                    if !self.driver_stopped {
                        let class = session_class(reason);
                        counter!("lease_session_failures_total", "class" => class).increment(1);
                    }
                }
                Event::ConnectFailed { error, .. } if !self.driver_stopped => {
                    let class = connect_class(error);
                    counter!("lease_session_failures_total", "class" => class).increment(1);
                }
                Event::SessionIdle { .. } => {
                    self.not_ready();
                    self.no_members();
                }
                Event::ServerClockStepped { .. } => {
                    counter!("lease_server_clock_steps_total").increment(1);
                }
                _ => {}
            }
        }

        /// The drain routed everything.
        pub(crate) fn drained(&mut self) {
            for run in self.finished.drain(..) {
                let group = self.runs.remove(&run).and_then(|t| t.group);
                // The last run of a group: this locker is no member any more.
                if let Some(id) = group {
                    if let Some(g) = self.groups.get_mut(&id) {
                        g.runs = g.runs.saturating_sub(1);
                        if g.runs == 0 {
                            g.count(0);
                            self.groups.remove(&id);
                        }
                    }
                }
            }
        }

        fn not_leading(&mut self, run: RunId, lease: &LeaseId) {
            if let Some(times) = self.runs.get_mut(&run) {
                if std::mem::take(&mut times.leading) {
                    level("lease_leader", Some(("lease", lease.name())), -1);
                    if let Some(g) = lease.group() {
                        level("lease_group_leases_held", Some(("group", g.name())), -1);
                    }
                }
            }
        }

        /// The session ended: so did its memberships (the next session is
        /// another member, and reads again).
        fn no_members(&mut self) {
            for g in self.groups.values_mut() {
                g.members.clear();
                g.count(0);
            }
        }

        fn not_ready(&mut self) {
            if std::mem::take(&mut self.ready) {
                level("lease_sessions_ready", None, -1);
            }
        }

        /// The driver is ending; the session loss it feeds next is its own doing.
        pub(crate) fn driver_stopped(&mut self) {
            self.driver_stopped = true;
        }
    }

    /// Moves a summed gauge (`lease_leader`, `lease_group_leases_held`,
    /// `lease_group_members`, `lease_sessions_ready`) by `delta` and records
    /// its process-wide level with `set`. The level lives here, not in the
    /// recorder: a recorder installed after a locker connected or acquired
    /// reads the true level at the next move (an increment made before it
    /// existed would be lost, and the decrement after it would take the gauge
    /// below zero).
    fn level(name: &'static str, label: Option<(&'static str, &str)>, delta: i64) {
        static LEVELS: Mutex<BTreeMap<(&str, String), i64>> = Mutex::new(BTreeMap::new());
        let mut levels = LEVELS.lock().unwrap_or_else(|e| e.into_inner());
        let key = (name, label.map_or_else(String::new, |(_, v)| v.to_owned()));
        let now = levels.get(&key).copied().unwrap_or(0) + delta;
        // Set under the lock: two lockers' moves reach the recorder in order.
        match label {
            Some((k, v)) => gauge!(name, k => v.to_owned()).set(now as f64),
            None => gauge!(name).set(now as f64),
        }
        if now == 0 {
            levels.remove(&key);
        } else {
            levels.insert(key, now);
        }
    }

    /// A statement in flight: its kind and when it was sent.
    pub(crate) struct Sent {
        kind: &'static str,
        at: Instant,
    }

    impl Sent {
        /// The driver sends `statement` now.
        pub(crate) fn new(clock: &Clock, statement: &Statement) -> Sent {
            let kind = match statement {
                Statement::Setup { .. } => "setup",
                Statement::Listen => "listen",
                Statement::TryLock { .. } => "try",
                Statement::Heartbeat => "heartbeat",
                Statement::Verify => "verify",
                Statement::Release { .. } => "release",
                Statement::Members { .. } => "members",
                Statement::Prefer { .. } => "prefer",
                Statement::CheckHandover { .. } => "check_handover",
                Statement::Wait { .. } => "wait",
                Statement::Take { .. } => "take",
            };
            Sent { kind, at: clock() }
        }

        /// Its reply arrived.
        pub(crate) fn replied(self, clock: &Clock, result: &Result<Vec<Row>, SessionError>) {
            let elapsed = clock().saturating_duration_since(self.at);
            histogram!("lease_statement_duration_seconds", "statement" => self.kind)
                .record(elapsed);
            if result.is_err() {
                counter!("lease_statement_errors_total", "statement" => self.kind).increment(1);
            }
        }
    }

    /// Why a lease moved to member `to`: it joined since this process
    /// acquired the lease (`then`: the members at the acquisition), or else a
    /// member left since (`now`: the members of the last read), or else the
    /// share moved it between members that stayed.
    fn handoff_cause(then: &BTreeSet<i64>, now: Option<&BTreeSet<i64>>, to: i64) -> &'static str {
        if !then.contains(&to) {
            "joined"
        } else if now.is_some_and(|now| then.iter().any(|m| !now.contains(m))) {
            "left"
        } else {
            "rebalanced"
        }
    }

    /// The fixed label set for a [`Reason`].
    fn reason_label(reason: &Reason, driver_stopped: bool) -> &'static str {
        match reason {
            Reason::SessionEnded(_) if driver_stopped => "driver_stopped",
            // The server ended the session: its FATAL error reaches the
            // statement in flight if there is one, else the connection.
            Reason::SessionEnded(Some(e)) | Reason::QueryFailed(e) if terminated(e) => "terminated",
            Reason::SessionEnded(_) => "session_lost",
            Reason::QueryTimeout => "query_timeout",
            Reason::ValidityExpired => "validity_expired",
            Reason::NotHeld => "not_held",
            Reason::QueryFailed(_) => "query_failed",
            Reason::Shutdown => "shutdown",
            Reason::Closed => "closed",
            Reason::Refused(_) => "refused",
            Reason::HandedOver => "handed_over",
            _ => "other",
        }
    }

    /// The class of a failed connection attempt ([`Event::ConnectFailed`]).
    fn connect_class(error: &SessionError) -> &'static str {
        // The machine's own words when the attempt outlived the query timeout.
        if error.code.is_none() && error.message.starts_with("connection attempt timed out") {
            return "timeout";
        }
        // Marked by the driver: TLS verification and the like.
        if error.config {
            return "config";
        }
        session_class(&Reason::SessionEnded(Some(error.clone())))
    }

    /// The fixed class set for why a session ended.
    fn session_class(reason: &Reason) -> &'static str {
        match reason {
            Reason::SessionEnded(None) => "network",
            Reason::SessionEnded(Some(e)) => match e.code.as_deref() {
                // No SQLSTATE: I/O (refused, reset, EOF), TLS, protocol.
                None => "network",
                // The server is starting up or shutting down.
                Some("57P03") => "unavailable",
                Some(_) if terminated(e) => "terminated",
                Some(code) => match code.get(..2) {
                    Some("08") => "network",
                    Some("28") => "auth",
                    // Unknown database, bad startup parameter, unsupported feature.
                    Some("3D" | "22" | "42" | "0A") => "config",
                    // Too many connections, out of memory or disk.
                    Some("53") => "unavailable",
                    _ => "other",
                },
            },
            Reason::QueryFailed(e) if terminated(e) => "terminated",
            Reason::QueryTimeout => "timeout",
            Reason::ValidityExpired => "validity_expired",
            Reason::QueryFailed(_) => "query_failed",
            Reason::Refused(_) => "refused",
            _ => "other",
        }
    }

    /// The server ended the session (SQLSTATE 57P01 admin shutdown or
    /// `pg_terminate_backend`, 57P02 crash, 57P04 database dropped, 57P05
    /// `idle_session_timeout`).
    fn terminated(e: &SessionError) -> bool {
        e.code.as_deref().is_some_and(|c| c.starts_with("57P"))
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    //! The `metrics` feature is off: nothing is kept, read or recorded.

    use std::time::Instant;

    use lease_proto::{reply::Row, Event, Input, RunCommand, RunId, SessionError, Statement};

    use crate::runtime::Clock;

    pub(crate) struct Metrics;

    impl Metrics {
        #[inline(always)]
        pub(crate) fn new() -> Metrics {
            Metrics
        }
        #[inline(always)]
        pub(crate) fn run_started(&mut self, _: RunId, _: Option<u32>, _: Instant) {}
        #[inline(always)]
        pub(crate) fn input(&mut self, _: &Clock, _: &Input) {}
        #[inline(always)]
        pub(crate) fn run_command(&mut self, _: &Clock, _: &RunCommand) {}
        #[inline(always)]
        pub(crate) fn event(&mut self, _: &Clock, _: &Event) {}
        #[inline(always)]
        pub(crate) fn drained(&mut self) {}
        #[inline(always)]
        pub(crate) fn driver_stopped(&mut self) {}
    }

    pub(crate) struct Sent;

    // Nothing is kept per statement or per locker.
    const _: () = assert!(std::mem::size_of::<Sent>() == 0 && std::mem::size_of::<Metrics>() == 0);

    impl Sent {
        #[inline(always)]
        pub(crate) fn new(_: &Clock, _: &Statement) -> Sent {
            Sent
        }
        #[inline(always)]
        pub(crate) fn replied(self, _: &Clock, _: &Result<Vec<Row>, SessionError>) {}
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use ::metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };
    use lease_proto::{Event, Reason, SessionId, Statement};

    use super::{Metrics, Sent};
    use crate::runtime::Clock;

    /// A registry like an exporter's: one lookup per record, an atomic per
    /// histogram; and every value `lease_sessions_ready` was given, in order,
    /// as a gauge that starts at 0 when the registry is installed.
    #[derive(Default)]
    struct Registry {
        histograms: Mutex<HashMap<Key, Arc<Sum>>>,
        ready: Arc<Values>,
        clock_steps: Arc<Count>,
    }

    #[derive(Default)]
    struct Count(AtomicU64);

    impl CounterFn for Count {
        fn increment(&self, v: u64) {
            self.0.fetch_add(v, Ordering::Relaxed);
        }
        fn absolute(&self, v: u64) {
            self.0.store(v, Ordering::Relaxed);
        }
    }

    #[derive(Default)]
    struct Sum(AtomicU64);

    impl HistogramFn for Sum {
        fn record(&self, v: f64) {
            self.0.fetch_add(v.to_bits() & 1, Ordering::Relaxed);
        }
    }

    #[derive(Default)]
    struct Values(Mutex<Vec<f64>>);

    impl GaugeFn for Values {
        fn increment(&self, v: f64) {
            let mut values = self.0.lock().unwrap();
            let last = values.last().copied().unwrap_or(0.0);
            values.push(last + v);
        }
        fn decrement(&self, v: f64) {
            self.increment(-v);
        }
        fn set(&self, v: f64) {
            self.0.lock().unwrap().push(v);
        }
    }

    impl Recorder for Registry {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            if key.name() == "lease_server_clock_steps_total" {
                Counter::from_arc(self.clock_steps.clone())
            } else {
                Counter::noop()
            }
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            if key.name() == "lease_sessions_ready" {
                Gauge::from_arc(self.ready.clone())
            } else {
                Gauge::noop()
            }
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            let mut map = self.histograms.lock().unwrap_or_else(|e| e.into_inner());
            Histogram::from_arc(map.entry(key.clone()).or_default().clone())
        }
    }

    #[test]
    fn a_recorder_installed_after_a_session_connected_reads_the_true_level() {
        let clock: Clock = Arc::new(Instant::now);
        let ready = |session| Event::SessionReady {
            session: SessionId(session),
            backend_pid: 1,
            server_version: 150000,
        };
        let lost = |session| Event::SessionLost {
            session: SessionId(session),
            reason: Reason::Closed,
        };
        // Two lockers connect before the application installs its recorder.
        let (mut a, mut b) = (Metrics::new(), Metrics::new());
        a.event(&clock, &ready(1));
        b.event(&clock, &ready(2));
        let registry = Registry::default();
        ::metrics::with_local_recorder(&registry, || {
            a.event(&clock, &lost(1));
            a.event(&clock, &ready(3));
            b.event(&clock, &lost(2));
        });
        // Lost one of two, reconnected, lost the other: 1, 2, 1.
        assert_eq!(*registry.ready.0.lock().unwrap(), [1.0, 2.0, 1.0]);
        // The level outlives the recorder: the test leaves it at 0.
        a.event(&clock, &lost(3));
    }

    #[test]
    fn every_server_clock_step_is_counted() {
        let clock: Clock = Arc::new(Instant::now);
        let step = Event::ServerClockStepped {
            session: SessionId(1),
            back: std::time::Duration::from_secs(30),
            across_sessions: true,
        };
        let registry = Registry::default();
        let mut m = Metrics::new();
        ::metrics::with_local_recorder(&registry, || {
            m.event(&clock, &step);
            m.event(&clock, &step);
        });
        assert_eq!(registry.clock_steps.0.load(Ordering::Relaxed), 2);
    }

    fn per_statement_ns(n: u32) -> f64 {
        let clock: Clock = Arc::new(Instant::now);
        let ok = Ok(Vec::new());
        let start = Instant::now();
        for _ in 0..n {
            let sent = Sent::new(&clock, std::hint::black_box(&Statement::Heartbeat));
            sent.replied(&clock, std::hint::black_box(&ok));
        }
        start.elapsed().as_nanos() as f64 / f64::from(n)
    }

    /// The two clock reads alone.
    fn clock_ns(n: u32) -> f64 {
        let clock: Clock = Arc::new(Instant::now);
        let start = Instant::now();
        for _ in 0..n {
            let sent = std::hint::black_box(clock());
            std::hint::black_box(clock().saturating_duration_since(sent));
        }
        start.elapsed().as_nanos() as f64 / f64::from(n)
    }

    /// What the metrics add to each statement: the two hooks the driver calls
    /// around it. `cargo test -p lease-driver --features metrics --release --lib
    /// -- --ignored --nocapture statement_overhead`
    #[test]
    #[ignore = "a microbenchmark; run it in release"]
    fn statement_overhead() {
        const N: u32 = 1_000_000;
        let clock = clock_ns(N);
        let none = per_statement_ns(N);
        let registry = Registry::default();
        let recorded = ::metrics::with_local_recorder(&registry, || per_statement_ns(N));
        println!(
            "per statement: {none:.0} ns without a recorder, {recorded:.0} ns with a registry \
             ({clock:.0} ns of it the two clock reads)"
        );
    }
}
