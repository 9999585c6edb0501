//! lease-driver's metrics (feature `metrics`, enabled for this package's tests)
//! against the local PostgreSQL at 127.0.0.1:5432, recorded by a small test
//! recorder: an acquisition, a loss by `pg_terminate_backend` of the locker's
//! backend and the re-acquisition after it, then a graceful release; a lease
//! group's join and leave.

use crate::common::*;
use lease_tokio::Locker;
use lease_tokio::Options;
use lease_tokio::Reason;
use lease_tokio::SessionState;
use metrics::Counter;
use metrics::CounterFn;
use metrics::Gauge;
use metrics::GaugeFn;
use metrics::Histogram;
use metrics::HistogramFn;
use metrics::Key;
use metrics::KeyName;
use metrics::Metadata;
use metrics::Recorder;
use metrics::SharedString;
use metrics::Unit;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

/// Everything recorded under one key: a counter's total, a gauge's every value
/// in order, a histogram's samples.
#[derive(Default, Debug, Clone)]
struct Series {
    total: u64,
    values: Vec<f64>,
}

#[derive(Default)]
struct Cell(Mutex<Series>);

impl Cell {
    fn with(&self, f: impl FnOnce(&mut Series)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        self.with(|s| s.total += n);
    }
    fn absolute(&self, n: u64) {
        self.with(|s| s.total = n);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, v: f64) {
        self.with(|s| s.values.push(s.values.last().copied().unwrap_or(0.0) + v));
    }
    fn decrement(&self, v: f64) {
        self.with(|s| s.values.push(s.values.last().copied().unwrap_or(0.0) - v));
    }
    fn set(&self, v: f64) {
        self.with(|s| s.values.push(v));
    }
}

impl HistogramFn for Cell {
    fn record(&self, v: f64) {
        self.with(|s| s.values.push(v));
    }
}

/// Keys as `name{label=value,...}`, labels sorted.
#[derive(Default)]
struct TestRecorder {
    cells: Mutex<HashMap<String, Arc<Cell>>>,
    described: Mutex<HashMap<String, Option<Unit>>>,
}

fn key_string(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl TestRecorder {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells.entry(key_string(key)).or_default().clone()
    }

    fn describe(&self, name: KeyName, unit: Option<Unit>) {
        let mut described = self.described.lock().unwrap_or_else(|e| e.into_inner());
        described.insert(name.as_str().to_owned(), unit);
    }

    /// The series under `name{labels}` (labels as `k=v`, sorted), empty if none.
    fn get(&self, name: &str, labels: &[&str]) -> Series {
        let mut labels = labels.to_vec();
        labels.sort();
        let key = format!("{name}{{{}}}", labels.join(","));
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells
            .get(&key)
            .map(|c| c.0.lock().unwrap().clone())
            .unwrap_or_default()
    }

    fn names(&self) -> Vec<String> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = cells.keys().cloned().collect();
        names.sort();
        names
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(name, unit);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(name, unit);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(name, unit);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

/// The process-wide recorder, installed once. Tests tell their series apart
/// by their unique lease names.
fn recorder() -> &'static TestRecorder {
    static RECORDER: OnceLock<&'static TestRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(recorder).expect("no other recorder in this test binary");
        recorder
    })
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("metrics-{name}-{}-{nanos}", std::process::id())
}

/// Polls `cond` every 10 ms until it holds, or fails after 10 s with `what`.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(MS(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisition_loss_by_terminate_and_release_move_the_metrics() {
    let rec = recorder();
    let name = unique("handover");
    let lease = format!("lease={name}");
    let lease = lease.as_str();
    let connects_before = rec.get("lease_session_connects_total", &[]).total;
    let terminated_before = rec
        .get("lease_session_failures_total", &["class=terminated"])
        .total;

    let (locker, driver) = Locker::without_tls(DB, opts()).expect("locker");
    tokio::spawn(driver);
    // The job reports each acquisition's token and why it was cancelled.
    let (tokens_tx, mut tokens) = mpsc::unbounded_channel::<i64>();
    let (reasons_tx, mut reasons) = mpsc::unbounded_channel::<Reason>();
    let (stop_tx, stop) = oneshot::channel::<()>();
    let run = tokio::spawn(locker.run_until(
        &name,
        async move {
            let _ = stop.await;
        },
        move |lease| {
            let (tokens_tx, reasons_tx) = (tokens_tx.clone(), reasons_tx.clone());
            async move {
                let _ = tokens_tx.send(lease.token());
                let reason = lease.cancelled().await;
                // Measurable time from the cancellation to the job's return.
                tokio::time::sleep(MS(20)).await;
                let _ = reasons_tx.send(reason);
                Ok::<(), std::convert::Infallible>(())
            }
        },
    ));

    // 1. Acquisition.
    let first = tokio::time::timeout(Duration::from_secs(10), tokens.recv())
        .await
        .expect("acquired within 10 s")
        .expect("a token");
    assert_eq!(rec.get("lease_acquisitions_total", &[lease]).total, 1);
    assert_eq!(rec.get("lease_leader", &[lease]).values, [1.0]);
    assert_eq!(
        rec.get("lease_fencing_token", &[lease]).values,
        [first as f64]
    );
    assert_eq!(
        rec.get("lease_standby_duration_seconds", &[lease])
            .values
            .len(),
        1
    );
    assert!(rec.get("lease_session_connects_total", &[]).total > connects_before);
    // Process-wide: this test's locker counts one.
    let ready = rec.get("lease_sessions_ready", &[]).values;
    assert!(ready.last().is_some_and(|&v| v >= 1.0), "{ready:?}");
    for statement in ["setup", "listen", "try"] {
        let samples = rec.get(
            "lease_statement_duration_seconds",
            &[&format!("statement={statement}")],
        );
        assert!(!samples.values.is_empty(), "no {statement} statement timed");
        assert!(
            samples.values.iter().all(|&s| (0.0..10.0).contains(&s)),
            "{samples:?}"
        );
    }
    let heartbeat = ["statement=heartbeat"];
    until("a timed heartbeat", || {
        !rec.get("lease_statement_duration_seconds", &heartbeat)
            .values
            .is_empty()
    })
    .await;

    // 2. A loss: the server terminates the locker's backend.
    let SessionState::Ready { backend_pid } = locker.status().session else {
        panic!("session not ready: {:?}", locker.status());
    };
    let (client, connection) = tokio_postgres::connect(DB, tokio_postgres::NoTls)
        .await
        .expect("observer connects");
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT pg_terminate_backend($1::int)",
            &[&(backend_pid as i32)],
        )
        .await
        .expect("pg_terminate_backend");
    assert!(
        row.get::<_, bool>(0),
        "backend {backend_pid} not terminated"
    );
    let reason = tokio::time::timeout(Duration::from_secs(10), reasons.recv())
        .await
        .expect("cancelled within 10 s")
        .expect("a reason");
    assert!(
        matches!(reason, Reason::SessionEnded(_) | Reason::QueryFailed(_)),
        "{reason:?}"
    );
    let second = tokio::time::timeout(Duration::from_secs(10), tokens.recv())
        .await
        .expect("re-acquired within 10 s")
        .expect("a token");
    assert!(second > first, "token {second} after {first}");
    let terminated = ["reason=terminated", lease];
    assert_eq!(rec.get("lease_losses_total", &terminated).total, 1);
    assert_eq!(rec.get("lease_acquisitions_total", &[lease]).total, 2);
    assert_eq!(rec.get("lease_leader", &[lease]).values, [1.0, 0.0, 1.0]);
    assert_eq!(
        rec.get("lease_fencing_token", &[lease]).values,
        [first as f64, second as f64]
    );
    assert_eq!(
        rec.get("lease_standby_duration_seconds", &[lease])
            .values
            .len(),
        2
    );
    let stop_times = rec
        .get("lease_job_stop_duration_seconds", &terminated)
        .values;
    assert_eq!(stop_times.len(), 1, "{stop_times:?}");
    assert!((0.015..5.0).contains(&stop_times[0]), "{stop_times:?}");
    assert!(
        rec.get("lease_session_failures_total", &["class=terminated"])
            .total
            > terminated_before
    );
    assert_eq!(rec.get("lease_releases_total", &[lease]).total, 0);

    // 3. A graceful release.
    stop_tx.send(()).expect("run alive");
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("run returned within 10 s")
        .expect("run task")
        .expect("run Ok");
    assert_eq!(rec.get("lease_releases_total", &[lease]).total, 1);
    assert_eq!(
        rec.get("lease_leader", &[lease]).values,
        [1.0, 0.0, 1.0, 0.0]
    );
    let shutdown = ["reason=shutdown", lease];
    assert_eq!(
        rec.get("lease_job_stop_duration_seconds", &shutdown)
            .values
            .len(),
        1
    );
    let release = ["statement=release"];
    assert!(!rec
        .get("lease_statement_duration_seconds", &release)
        .values
        .is_empty());
    // No loss besides the termination.
    let losses: Vec<String> = rec
        .names()
        .into_iter()
        .filter(|k| k.starts_with("lease_losses_total{") && k.contains(&name))
        .collect();
    assert_eq!(
        losses,
        [format!(
            "lease_losses_total{{lease={name},reason=terminated}}"
        )]
    );
}

/// A lease group's metrics. One locker alone leads the group's 4 leases (1
/// member, 4 held); a second locker of this process joins and the first hands
/// it 2 (cause `joined`: it joined after they were acquired), each reading 2
/// members (the gauges of one process's lockers add up: 4); the second closes,
/// its session and member lock go, and the first leads all 4 again (no
/// hand-off: the free keys are its own at its next read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_group_join_and_leave_move_the_group_metrics() {
    let rec = recorder();
    let group = unique("group");
    let label = format!("group={group}");
    let g = [label.as_str()];
    let names: Vec<String> = (0..4).map(|i| format!("{group}-{i}")).collect();
    let last = |name: &str| rec.get(name, &g).values.last().copied().unwrap_or(0.0);
    let handoffs = |cause: &str| {
        let cause = format!("cause={cause}");
        rec.get("lease_group_handoffs_total", &[&label, &cause])
            .total
    };
    let leading = |name: &String| {
        let lease = format!("lease={name}");
        rec.get("lease_leader", &[&lease])
            .values
            .last()
            .copied()
            .unwrap_or(0.0)
    };
    let member = || {
        let (locker, driver) = Locker::without_tls(DB, opts()).expect("locker");
        tokio::spawn(driver);
        for name in &names {
            let run = locker.group(&group).run(name, |lease| async move {
                lease.cancelled().await;
                Ok::<(), std::convert::Infallible>(())
            });
            tokio::spawn(run);
        }
        locker
    };

    // 1. Alone: one member, every lease held here.
    let first = member();
    until("the first member leading 4", || {
        last("lease_group_leases_held") == 4.0 && last("lease_group_members") == 1.0
    })
    .await;

    // 2. A second member joins: 2 handed over to it, each sees 2 members, and
    // the two handed-over jobs' stops are timed (recorded when each job has
    // returned, a moment after the hand-off counts).
    let second = member();
    let handed = || {
        (names.iter())
            .map(|n| {
                let lease = format!("lease={n}");
                (rec.get(
                    "lease_job_stop_duration_seconds",
                    &[&lease, "reason=handed_over"],
                ))
                .values
                .len()
            })
            .sum::<usize>()
    };
    until(
        "two hand-offs to the joined member, their stops timed",
        || {
            handoffs("joined") == 2
                && last("lease_group_members") == 4.0
                && last("lease_group_leases_held") == 4.0
                && names.iter().all(|n| leading(n) == 1.0)
                && handed() == 2
        },
    )
    .await;

    // 3. The second leaves: the first leads all 4 again, sees 1 member.
    second.close().await;
    until("the first member alone again, leading 4", || {
        last("lease_group_members") == 1.0
            && last("lease_group_leases_held") == 4.0
            && names.iter().all(|n| leading(n) == 1.0)
    })
    .await;
    assert_eq!(handoffs("joined"), 2);
    assert_eq!(handoffs("left") + handoffs("rebalanced"), 0);
    first.close().await;
    until("no member left in this process", || {
        last("lease_group_members") == 0.0 && last("lease_group_leases_held") == 0.0
    })
    .await;
}

/// Every metric has its unit and help registered at locker construction, and
/// every name follows the Prometheus conventions.
#[test]
fn every_metric_is_described_with_its_unit() {
    let rec = recorder();
    let _locker = Locker::without_tls(DB, Options::default()).expect("locker");
    let described = rec.described.lock().unwrap().clone();
    let expected = [
        "lease_leader",
        "lease_fencing_token",
        "lease_acquisitions_total",
        "lease_losses_total",
        "lease_releases_total",
        "lease_standby_duration_seconds",
        "lease_job_stop_duration_seconds",
        "lease_session_connects_total",
        "lease_session_failures_total",
        "lease_sessions_ready",
        "lease_statement_duration_seconds",
        "lease_statement_errors_total",
        "lease_group_members",
        "lease_group_leases_held",
        "lease_group_handoffs_total",
        "lease_server_clock_steps_total",
    ];
    let mut names: Vec<&str> = described.keys().map(String::as_str).collect();
    names.sort();
    let mut want = expected.to_vec();
    want.sort();
    assert_eq!(names, want);
    for (name, unit) in &described {
        if name.ends_with("_seconds") {
            assert_eq!(*unit, Some(Unit::Seconds), "{name}");
        }
    }
}

/// Connection failures are classed from their SQLSTATE or its absence: an
/// unknown role (28000), an unknown database (3D000), a closed port (no
/// SQLSTATE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_are_classed() {
    let rec = recorder();
    let cases = [
        (
            "auth",
            "host=127.0.0.1 user=lease_metrics_no_such_role dbname=postgres",
        ),
        (
            "config",
            "host=127.0.0.1 user=postgres dbname=lease_metrics_no_such_db",
        ),
        (
            "network",
            "host=127.0.0.1 port=1 user=postgres dbname=postgres",
        ),
    ];
    for (class, conn) in cases {
        let label = format!("class={class}");
        let before = rec.get("lease_session_failures_total", &[&label]).total;
        let (locker, driver) = Locker::without_tls(conn, opts()).expect("locker");
        tokio::spawn(driver);
        let name = unique(class);
        let run = tokio::spawn(locker.run(&name, |_| async { Ok::<(), String>(()) }));
        until(&format!("a {class} failure"), || {
            rec.get("lease_session_failures_total", &[&label]).total > before
        })
        .await;
        run.abort();
        assert_eq!(
            rec.get("lease_acquisitions_total", &[&format!("lease={name}")])
                .total,
            0
        );
    }
}
