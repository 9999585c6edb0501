//! `lease run --metrics-addr` and `lease status --watch` against ephemeral
//! PostgreSQL servers (the workspace's test kit). The endpoints are read with
//! a plain TCP client. Measured figures are printed with `eprintln!` (see them
//! with `cargo test -p lease-cli endpoints:: -- --nocapture`).

use crate::common::*;
use lease_proto::key_for_name;
use lease_tests::Cluster;
use lease_tests::FaultProxy;
use lease_tests::Mode;
use lease_tests::Replica;
use std::io::Read;
use std::io::Write;
use std::net::SocketAddr;
use std::net::TcpListener;
use std::net::TcpStream;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

/// The sampling period of `/leader` (the resolution of the gaps measured).
const SAMPLE: Duration = Duration::from_millis(10);

/// The tests of this module run one at a time: each measures timings (a flip
/// within 100 ms, gaps at 10 ms resolution) that a second test's processes
/// starting beside it on a small machine would blur.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A loopback address with a port free right now.
fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("its address")
}

/// `lease run` of `sleep 1000` with the endpoint on `addr`.
fn runner(url: &str, name: &str, addr: SocketAddr) -> Replica {
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", url])
        // Validity 1.1 s, guard deadline 300 ms later.
        .args(fast_and(&["--guard-margin", "300ms"]))
        .args(["--metrics-addr", &addr.to_string()])
        .arg(name)
        .args(["--", "sleep", "1000"]);
    Replica::spawn(cmd).expect("spawn lease run")
}

/// One GET with a plain TCP client: the status code and the body, or `None`
/// when nothing answers (refused, reset, timed out).
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, MS(200)).ok()?;
    s.set_read_timeout(Some(MS(1_000))).ok()?;
    s.set_write_timeout(Some(MS(1_000))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((code, body))
}

fn code(addr: SocketAddr, path: &str) -> Option<u16> {
    get(addr, path).map(|(c, _)| c)
}

/// Waits until `GET path` answers `want`; returns when.
fn wait_code(addr: SocketAddr, path: &str, want: u16, limit: Duration) -> Instant {
    let start = Instant::now();
    loop {
        if code(addr, path) == Some(want) {
            return Instant::now();
        }
        assert!(
            start.elapsed() < limit,
            "{addr}{path} did not answer {want} within {limit:?} (last: {:?})",
            get(addr, path)
        );
        std::thread::sleep(MS(2));
    }
}

/// The value of the sample `name{labels...}` in a Prometheus text body (0
/// when absent: a counter not yet incremented).
fn metric(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0.0)
}

fn scrape(addr: SocketAddr) -> String {
    match get(addr, "/metrics") {
        Some((200, body)) => body,
        other => panic!("{addr}/metrics: {other:?}"),
    }
}

/// Scrapes `/metrics` in a loop until stopped; keeps the last answer (the
/// last scrape of a runner that exits).
struct LastScrape {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Option<String>>,
}

impl LastScrape {
    fn start(addr: SocketAddr) -> LastScrape {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        // One scrape before returning: the thread may start late.
        let first = Some(scrape(addr));
        let thread = std::thread::spawn(move || {
            let mut last = first;
            while !flag.load(Ordering::Relaxed) {
                if let Some((200, body)) = get(addr, "/metrics") {
                    last = Some(body);
                }
            }
            last
        });
        LastScrape { stop, thread }
    }

    fn finish(self) -> Option<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().ok().flatten()
    }
}

fn holder_pid(c: &Cluster, name: &str) -> Option<i32> {
    let key = key_for_name(name);
    c.held_advisory_keys()
        .expect("query pg_locks")
        .into_iter()
        .find_map(|(k, pid)| (k == key).then_some(pid))
}

/// The counters move through a graceful handover and a terminated session:
/// an acquisition on the standby, a release on the leader (its last scrape,
/// the endpoint being served until the session is closed), a loss by reason
/// `terminated` after `pg_terminate_backend`; `/leader` flips at the release,
/// not after the leader's validity (1.1 s) or guard: within 500 ms (the flip is
/// printed; it is tens of ms on an idle host, and includes b's command start).
#[test]
fn metrics_move_through_a_handover_and_a_terminate() {
    let _serial = serial();
    let start = Instant::now();
    let c = cluster();
    let url = c.url("postgres");
    let name = unique("metrics");
    let lease = [("lease", name.as_str())];
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let mut a = runner(&url, &name, addr_a);
    wait_code(addr_a, "/leader", 200, MS(10_000));
    let b = runner(&url, &name, addr_b);
    b.wait_for_line(|l| l.contains("the lease is held by"), MS(10_000))
        .expect("b stands by");
    assert_eq!(code(addr_b, "/healthz"), Some(200));
    assert_eq!(code(addr_b, "/leader"), Some(503));

    let before_a = scrape(addr_a);
    let before_b = scrape(addr_b);
    assert_eq!(metric(&before_a, "lease_acquisitions_total", &lease), 1.0);
    assert_eq!(metric(&before_a, "lease_leader", &lease), 1.0);
    assert_eq!(metric(&before_a, "lease_sessions_ready", &[]), 1.0);
    assert_eq!(metric(&before_b, "lease_acquisitions_total", &lease), 0.0);
    assert_eq!(metric(&before_b, "lease_leader", &lease), 0.0);
    let token_a = metric(&before_a, "lease_fencing_token", &lease);

    // Graceful handover: SIGTERM to the leader.
    let last_a = LastScrape::start(addr_a);
    let sent = Instant::now();
    a.sigterm().expect("SIGTERM a");
    let mut a_off = None;
    let mut b_on = None;
    while b_on.is_none() && sent.elapsed() < MS(5_000) {
        let t = Instant::now();
        if a_off.is_none() && code(addr_a, "/leader") != Some(200) {
            a_off = Some(t);
        }
        if code(addr_b, "/leader") == Some(200) {
            b_on = Some(Instant::now());
        }
        std::thread::sleep(MS(1));
    }
    let a_off = a_off.expect("a's /leader stops answering 200");
    let b_on = b_on.expect("b's /leader answers 200");
    a.wait_exit(MS(5_000)).expect("a exits");
    let last_a = last_a.finish().expect("a was scraped");
    // The window with no leader: from a's 503 to b's 200. It includes a's
    // stopping its command and reaping its watchdog before the release (a
    // scheduling wait for two other processes: tens of ms on a loaded host).
    // The flip is measured from the handover itself, the release (a's
    // "lease released" line, stamped when the test read it), to b's 200:
    // b's acquisition, watchdog and command start.
    let window = b_on.saturating_duration_since(a_off);
    let (released, _) = a
        .wait_for_line(|l| l.contains("lease released"), MS(1_000))
        .expect("a logs its release");
    let flip = b_on.saturating_duration_since(released);
    let after_b = scrape(addr_b);
    let token_b = metric(&after_b, "lease_fencing_token", &lease);
    eprintln!(
        "graceful handover: a's /leader off {:?} after SIGTERM, b's on {:?} after SIGTERM: \
         no leader for {window:?}, flip {flip:?} after a's release; a's last scrape: releases {} leader {}; b: acquisitions {} leader {} \
         token {token_a} -> {token_b}",
        a_off - sent,
        b_on - sent,
        metric(&last_a, "lease_releases_total", &lease),
        metric(&last_a, "lease_leader", &lease),
        metric(&after_b, "lease_acquisitions_total", &lease),
        metric(&after_b, "lease_leader", &lease),
    );
    // Where the time went, from both runners' log lines.
    let steps = |r: &Replica| {
        r.lines()
            .into_iter()
            .filter(|l| {
                [
                    "SIGTERM",
                    "stopped",
                    "released",
                    "acquired",
                    "leading: started",
                ]
                .iter()
                .any(|w| l.text.contains(w))
            })
            .map(|l| {
                let at = l.at.saturating_duration_since(sent).as_secs_f64() * 1e3;
                let what = l.text.split_once("Z ").map_or(&*l.text, |(_, t)| t);
                format!(
                    "  {at:+7.1} ms {}\n",
                    what.chars().take(90).collect::<String>()
                )
            })
            .collect::<String>()
    };
    if flip > MS(30) || window > MS(30) {
        eprintln!("a:\n{}b:\n{}", steps(&a), steps(&b));
    }
    assert!(
        flip <= MS(500) && window <= MS(1_000),
        "/leader flipped {flip:?} after the release, no leader for {window:?}\n--- a ---\n{}--- b ---\n{}",
        stderr_of(&a),
        stderr_of(&b)
    );
    // a exits right after closing its session, milliseconds after the
    // release: its last scrape may come just before the release (then it
    // still leads) or after it (released, not leading), never anything else.
    // (The library's tests/tests/metrics.rs checks the release in a process
    // that lives on.)
    let released = metric(&last_a, "lease_releases_total", &lease);
    let leading = metric(&last_a, "lease_leader", &lease);
    eprintln!(
        "a's last scrape {} the release",
        if released == 1.0 {
            "saw"
        } else {
            "came before"
        }
    );
    assert!(
        (released, leading) == (1.0, 0.0) || (released, leading) == (0.0, 1.0),
        "a's last scrape: releases {released}, leader {leading}"
    );
    assert_eq!(
        metric(&last_a, "lease_losses_total", &[("reason", "shutdown")]),
        0.0,
        "a graceful release is not a loss"
    );
    assert_eq!(metric(&after_b, "lease_acquisitions_total", &lease), 1.0);
    assert_eq!(metric(&after_b, "lease_leader", &lease), 1.0);
    assert_eq!(
        metric(&after_b, "lease_standby_duration_seconds_count", &lease),
        1.0
    );
    assert!(token_b > token_a, "tokens {token_a} -> {token_b}");

    // The server ends b's session: a loss by reason `terminated`, and b wins
    // again (no other replica is left).
    let pid = holder_pid(&c, &name).expect("b holds the lease");
    assert!(c.terminate_backend(pid).expect("terminate"), "terminated");
    let terminated = Instant::now();
    let deadline = terminated + MS(10_000);
    let after = loop {
        let body = scrape(addr_b);
        if metric(&body, "lease_acquisitions_total", &lease) >= 2.0
            && code(addr_b, "/leader") == Some(200)
        {
            break body;
        }
        assert!(Instant::now() < deadline, "b did not win again:\n{body}");
        std::thread::sleep(MS(10));
    };
    let lost = [("lease", name.as_str()), ("reason", "terminated")];
    eprintln!(
        "terminate: b leads again {:?} after pg_terminate_backend; losses{{terminated}} {} \
         session failures{{terminated}} {} connects {} job stops{{terminated}} {}",
        terminated.elapsed(),
        metric(&after, "lease_losses_total", &lost),
        metric(
            &after,
            "lease_session_failures_total",
            &[("class", "terminated")]
        ),
        metric(&after, "lease_session_connects_total", &[]),
        metric(&after, "lease_job_stop_duration_seconds_count", &lost),
    );
    assert_eq!(metric(&after, "lease_losses_total", &lost), 1.0);
    assert_eq!(
        metric(
            &after,
            "lease_session_failures_total",
            &[("class", "terminated")]
        ),
        1.0
    );
    assert_eq!(metric(&after, "lease_session_connects_total", &[]), 2.0);
    assert_eq!(
        metric(&after, "lease_job_stop_duration_seconds_count", &lost),
        1.0
    );
    assert_eq!(metric(&after, "lease_releases_total", &lease), 0.0);
    assert_eq!(metric(&after, "lease_leader", &lease), 1.0);
    assert!(
        !after.contains("postgres://"),
        "no connection string in /metrics"
    );
    drop(b);
    eprintln!("metrics test: {:?}", start.elapsed());
}

/// One sample of both replicas' `/leader`: when, and each code.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    a: Option<u16>,
    b: Option<u16>,
}

/// Samples both `/leader` endpoints every [`SAMPLE`] until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    fn start(a: SocketAddr, b: SocketAddr) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (flag, out) = (stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let at = Instant::now();
                let sample = Sample {
                    at,
                    a: code(a, "/leader"),
                    b: code(b, "/leader"),
                };
                out.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
                next += SAMPLE;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        Sampler {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// The samples taken from `since` on.
    fn since(&self, since: Instant) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.iter().filter(|s| s.at >= since).copied().collect()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the samples of one fault show: samples where neither replica
/// answered 200 (the failover gap), and any where both did.
struct Phase {
    name: &'static str,
    samples: usize,
    neither: Vec<Duration>,
    both: Vec<Duration>,
}

impl Phase {
    fn of(name: &'static str, fault: Instant, samples: &[Sample]) -> Phase {
        let ms = |s: &Sample| s.at.saturating_duration_since(fault);
        Phase {
            name,
            samples: samples.len(),
            neither: samples
                .iter()
                .filter(|s| s.a != Some(200) && s.b != Some(200))
                .map(ms)
                .collect(),
            both: samples
                .iter()
                .filter(|s| s.a == Some(200) && s.b == Some(200))
                .map(ms)
                .collect(),
        }
    }

    fn report(&self) -> String {
        let span = |v: &[Duration]| match (v.first(), v.last()) {
            (Some(f), Some(l)) => {
                let (f, l) = (f.as_secs_f64() * 1e3, l.as_secs_f64() * 1e3);
                format!("{} samples, {f:.1} .. {l:.1} ms after the fault", v.len())
            }
            _ => "none".to_owned(),
        };
        format!(
            "{}: {} samples; neither 200: {}; both 200: {}",
            self.name,
            self.samples,
            span(&self.neither),
            span(&self.both)
        )
    }
}

/// Waits until one replica's `/leader` answers 200 (and says which).
fn wait_leader(a: SocketAddr, b: SocketAddr, limit: Duration) -> SocketAddr {
    let start = Instant::now();
    loop {
        for addr in [a, b] {
            if code(addr, "/leader") == Some(200) {
                return addr;
            }
        }
        assert!(start.elapsed() < limit, "no leader within {limit:?}");
        std::thread::sleep(MS(2));
    }
}

/// Waits until the replica on `addr` stands by: healthy, not leading.
fn wait_standby(r: &Replica, addr: SocketAddr) {
    r.wait_for_line(|l| l.contains("the lease is held by"), MS(15_000))
        .expect("the replica stands by");
    wait_code(addr, "/healthz", 200, MS(5_000));
    assert_eq!(code(addr, "/leader"), Some(503));
}

/// `/leader` is never 200 on both replicas at once, and on neither only in
/// the failover gap, through a graceful handover, a kill -9 and a partition
/// (each replica reaches the server through its own FaultProxy; the leader's
/// is black-holed). Sampled every 10 ms.
#[test]
fn leader_endpoint_answers_200_on_one_replica_at_most() {
    let _serial = serial();
    let start = Instant::now();
    let c = cluster();
    let upstream = SocketAddr::from(([127, 0, 0, 1], c.port()));
    let proxies = [
        FaultProxy::start(upstream).expect("proxy a"),
        FaultProxy::start(upstream).expect("proxy b"),
    ];
    let urls = proxies
        .each_ref()
        .map(|p| format!("postgres://postgres@127.0.0.1:{}/postgres", p.port()));
    let name = unique("leader");
    let addrs = [free_addr(), free_addr()];
    let mut replicas = [Some(runner(&urls[0], &name, addrs[0])), None::<Replica>];
    wait_code(addrs[0], "/leader", 200, MS(10_000));
    let b = runner(&urls[1], &name, addrs[1]);
    wait_standby(&b, addrs[1]);
    replicas[1] = Some(b);
    let sampler = Sampler::start(addrs[0], addrs[1]);
    let index = |addr: SocketAddr| usize::from(addr == addrs[1]);
    let mut phases = Vec::new();

    // 1. Graceful handover: SIGTERM to the leader; restart it as a standby.
    let leader = index(wait_leader(addrs[0], addrs[1], MS(1_000)));
    let fault = Instant::now();
    if let Some(r) = &replicas[leader] {
        r.sigterm().expect("SIGTERM");
    }
    wait_code(addrs[1 - leader], "/leader", 200, MS(5_000));
    let settled = Instant::now();
    if let Some(mut r) = replicas[leader].take() {
        r.wait_exit(MS(5_000)).expect("the old leader exits");
    }
    phases.push((
        Phase::of("graceful", fault, &sampler.since(fault)),
        settled - fault,
    ));
    let r = runner(&urls[leader], &name, addrs[leader]);
    wait_standby(&r, addrs[leader]);
    replicas[leader] = Some(r);

    // 2. kill -9 of the leader; restart it as a standby.
    let leader = 1 - leader;
    assert_eq!(code(addrs[leader], "/leader"), Some(200));
    let fault = Instant::now();
    if let Some(r) = &replicas[leader] {
        r.kill9().expect("SIGKILL");
    }
    wait_code(addrs[1 - leader], "/leader", 200, MS(10_000));
    let settled = Instant::now();
    if let Some(mut r) = replicas[leader].take() {
        r.wait_exit(MS(5_000)).expect("the killed leader is gone");
    }
    phases.push((
        Phase::of("kill -9", fault, &sampler.since(fault)),
        settled - fault,
    ));
    let r = runner(&urls[leader], &name, addrs[leader]);
    wait_standby(&r, addrs[leader]);
    replicas[leader] = Some(r);

    // 3. Partition of the leader (black hole); heal once the other leads.
    let leader = 1 - leader;
    assert_eq!(code(addrs[leader], "/leader"), Some(200));
    let fault = Instant::now();
    proxies[leader].set_mode(Mode::BlackHole);
    wait_code(addrs[1 - leader], "/leader", 200, MS(15_000));
    let settled = Instant::now();
    let partition = sampler.since(fault);
    proxies[leader].set_mode(Mode::Pass);
    phases.push((Phase::of("partition", fault, &partition), settled - fault));
    let off = partition
        .iter()
        .find(|s| [s.a, s.b][leader] != Some(200))
        .map(|s| s.at - fault);
    if let Some(r) = &replicas[leader] {
        wait_standby(r, addrs[leader]);
    }
    let all = sampler.since(start);
    drop(sampler);
    let whole = Phase::of("whole test (times from its start)", start, &all);
    eprintln!("{}", whole.report());

    let mut failed = Vec::new();
    if !whole.both.is_empty() {
        failed.push("both answered 200 (whole test)".to_owned());
    }
    for (phase, settled) in &phases {
        eprintln!(
            "{} (new leader answered 200 {:.1} ms after the fault)",
            phase.report(),
            settled.as_secs_f64() * 1e3
        );
        if !phase.both.is_empty() {
            failed.push(format!("{}: both answered 200", phase.name));
        }
        // Neither answers only in the gap: from the fault until the new leader answers.
        if phase.neither.last().is_some_and(|l| *l > *settled + SAMPLE) {
            failed.push(format!(
                "{}: neither answered 200 after the handover",
                phase.name
            ));
        }
    }
    eprintln!(
        "partition: the partitioned leader's /leader went off {:?} ms after the cut \
         (validity 1.1 s, guard deadline 1.4 s after its last statement); test {:?}",
        off.map(|d| d.as_millis()),
        start.elapsed()
    );
    assert!(failed.is_empty(), "{failed:?}");
}

/// `lease status --watch` off a terminal prints a table per interval on one
/// session, reconnects when the server ends it, and exits 0 on SIGINT.
#[test]
fn status_watch_prints_a_table_per_interval_until_sigint() {
    let _serial = serial();
    let c = cluster();
    let name = unique("watch");
    let addr = free_addr();
    let leader = runner(&c.url("postgres"), &name, addr);
    wait_code(addr, "/leader", 200, MS(10_000));
    let mut cmd = lease();
    cmd.args(["status", "--database-url", &c.url("postgres")])
        .args(["--watch", "--interval", "100ms"])
        .arg(&name);
    let mut watch = Replica::spawn(cmd).expect("spawn lease status --watch");
    let mut tables = 0;
    watch
        .wait_for_line(
            |l| {
                tables += usize::from(l.starts_with("every 100ms at "));
                tables >= 4
            },
            MS(10_000),
        )
        .expect("four tables");
    // One session across refreshes; when the server ends it, the next
    // refresh connects again instead of showing an error.
    let sessions = c
        .backends_by_application_name("lease status")
        .expect("backends");
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(
        c.terminate_by_application_name("lease status").ok(),
        Some(1)
    );
    let mut after = 0;
    watch
        .wait_for_line(
            |l| {
                after += usize::from(l.starts_with("every 100ms at "));
                after >= 7
            },
            MS(10_000),
        )
        .expect("three more tables");
    watch.sigint().expect("SIGINT");
    let status = watch.wait_exit(MS(5_000)).expect("exits on SIGINT");
    let lines: Vec<String> = watch.lines().into_iter().map(|l| l.text).collect();
    let rows = lines
        .iter()
        .filter(|l| l.starts_with(&name) && l.contains(" yes "))
        .count();
    assert_eq!(status.code(), Some(0), "{lines:#?}");
    assert!(rows >= 7, "a held row per table: {lines:#?}");
    assert!(
        !lines.iter().any(|l| l.contains("cannot query")),
        "a terminated session is replaced: {lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains('\x1b')),
        "no ANSI off a terminal"
    );
    drop(leader);
}

/// A bad `--metrics-addr`, or one already bound, is bad usage: exit 2 before
/// any database contact (the database URL points at a port nothing listens
/// on, and nothing waits for it).
#[test]
fn a_bad_or_busy_metrics_addr_exits_2_at_once() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy = taken.local_addr().expect("its address").to_string();
    let nobody = free_addr();
    for addr in ["localhost:9187", "127.0.0.1", busy.as_str()] {
        let start = Instant::now();
        let out = lease()
            .args(["run", "--database-url"])
            .arg(format!("postgres://u:sekrit@{nobody}/db"))
            .args(["--metrics-addr", addr, "job", "--", "true"])
            .output()
            .expect("run lease");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{addr}: {err}");
        assert!(err.contains("--metrics-addr"), "{addr}: {err}");
        assert!(!err.contains("sekrit"), "{addr}: {err}");
        assert!(start.elapsed() < MS(2_000), "{addr}: {:?}", start.elapsed());
    }
}

/// `--shards 4 --metrics-addr` on two replicas: once settled at two shards each, every
/// `/leader/I` is 200 on exactly one replica, `/leader` is 200 on both (each leads a shard),
/// a shard out of range is 404, and `/metrics` has each shard's `lease_leader` and the
/// group's `lease_group_leases_held`; after a replica's SIGTERM the other answers 200 for
/// every shard.
#[test]
fn shards_have_a_leader_endpoint_each_and_their_metrics() {
    let _serial = serial();
    let c = cluster();
    let url = c.url("postgres");
    let name = unique("shards-endpoints");
    let addrs = [free_addr(), free_addr()];
    let spawn = |addr: SocketAddr| {
        let mut cmd = lease();
        cmd.arg("run")
            .args(["--database-url", &url])
            .args([
                "--retry-interval",
                "200ms",
                "--heartbeat-interval",
                "150ms",
                "--query-timeout",
                "400ms",
                "--grace",
                "300ms",
                "--shards",
                "4",
            ])
            .args(["--metrics-addr", &addr.to_string()])
            .arg(&name)
            .args(["--", "sleep", "1000"]);
        Replica::spawn(cmd).expect("spawn lease run --shards")
    };
    let mut a = spawn(addrs[0]);
    let b = spawn(addrs[1]);
    // Who answers 200 for each shard, until the share holds (2 each, every shard led once).
    let owners = |addrs: &[SocketAddr]| -> Vec<Vec<usize>> {
        (0..4)
            .map(|i| {
                (0..addrs.len())
                    .filter(|&r| code(addrs[r], &format!("/leader/{i}")) == Some(200))
                    .collect()
            })
            .collect()
    };
    let start = Instant::now();
    loop {
        let o = owners(&addrs);
        let each = |r: usize| o.iter().filter(|v| v.as_slice() == [r]).count();
        if o.iter().all(|v| v.len() == 1) && each(0) == 2 && each(1) == 2 {
            break;
        }
        assert!(start.elapsed() < MS(20_000), "never settled: {o:?}");
        std::thread::sleep(MS(50));
    }
    for addr in addrs {
        let (code_all, body) = get(addr, "/leader").expect("/leader");
        assert_eq!(code_all, 200, "{body}");
        assert!(body.starts_with("leader of 2 of 4 shards: "), "{body}");
        for bad in ["/leader/4", "/leader/01", "/leader/x", "/leader/"] {
            assert_eq!(code(addr, bad), Some(404), "{bad}");
        }
        let metrics = scrape(addr);
        let held: f64 = (0..4)
            .map(|i| {
                metric(
                    &metrics,
                    "lease_leader",
                    &[("lease", &format!("{name}/{i}"))],
                )
            })
            .sum();
        assert_eq!(held, 2.0, "{metrics}");
        assert_eq!(
            metric(&metrics, "lease_group_leases_held", &[("group", &name)]),
            2.0
        );
        let (healthz, body) = get(addr, "/healthz").expect("/healthz");
        assert_eq!(healthz, 200, "{body}");
        assert!(body.contains("leading 2 of 4 shards"), "{body}");
    }
    a.sigterm().expect("SIGTERM a");
    a.wait_exit(MS(10_000)).expect("a exits");
    let start = Instant::now();
    while owners(&addrs[1..]).iter().any(|v| v.len() != 1) {
        assert!(start.elapsed() < MS(10_000), "b did not take every shard");
        std::thread::sleep(MS(50));
    }
    let (_, body) = get(addrs[1], "/leader").expect("/leader");
    assert!(
        body.starts_with("leader of 4 of 4 shards: 0,1,2,3"),
        "{body}"
    );
    let _ = b.sigterm();
}

/// A runner that never connected exports the series the alert rules need at 0 (a counter or
/// level the driver never moved would be absent): `lease_leader` and `lease_acquisitions_total`
/// of its lease, `lease_sessions_ready`, `lease_server_clock_steps_total`. The database URL
/// points at a port nothing listens on.
#[test]
fn a_runner_exports_its_levels_at_0_before_it_ever_connected() {
    let nobody = free_addr();
    let addr = free_addr();
    let name = unique("zero");
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", &format!("postgres://u@{nobody}/db")])
        .args(FAST)
        .args([
            "--metrics-addr",
            &addr.to_string(),
            &name,
            "--",
            "sleep",
            "1000",
        ]);
    let r = Replica::spawn(cmd).expect("spawn lease run");
    r.wait_for_line(|l| l.contains("cannot reach the database"), MS(10_000))
        .expect("it fails to connect");
    let body = scrape(addr);
    for series in [
        format!("lease_leader{{lease=\"{name}\"}} 0"),
        format!("lease_acquisitions_total{{lease=\"{name}\"}} 0"),
        "lease_sessions_ready 0".to_owned(),
        "lease_server_clock_steps_total 0".to_owned(),
    ] {
        assert!(
            body.lines().any(|l| l == series),
            "no `{series}` in:\n{body}"
        );
    }
    assert!(
        metric(
            &body,
            "lease_session_failures_total",
            &[("class", "network")]
        ) >= 1.0
    );
    drop(r);
}

/// `/healthz` is 200 while the session is ready, stays 200 within the
/// tolerance (--query-timeout + --retry-interval = 1.05 s) of a lost server,
/// then turns 503 with a one-line reason; `/leader` is 503 meanwhile. Unknown
/// paths are 404.
#[test]
fn healthz_turns_503_once_the_database_is_gone_for_longer_than_a_reconnect() {
    let _serial = serial();
    let c = cluster();
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], c.port()))).expect("proxy");
    let url = format!(
        "postgres://postgres:sekrit@127.0.0.1:{}/postgres",
        proxy.port()
    );
    let name = unique("healthz");
    let addr = free_addr();
    let r = runner(&url, &name, addr);
    wait_code(addr, "/leader", 200, MS(10_000));
    let (code_ok, body_ok) = get(addr, "/healthz").expect("healthz");
    assert_eq!(code_ok, 200, "{body_ok}");
    assert_eq!(code(addr, "/nope"), Some(404));
    let cut = Instant::now();
    proxy.set_mode(Mode::BlackHole);
    wait_code(addr, "/leader", 503, MS(5_000));
    let leader_off = cut.elapsed();
    let off = wait_code(addr, "/healthz", 503, MS(10_000));
    let (_, body) = get(addr, "/healthz").expect("healthz");
    eprintln!(
        "black hole: /leader 503 after {leader_off:?}, /healthz 503 after {:?}: {body:?} \
         (was {body_ok:?})",
        off - cut
    );
    assert!(
        off - cut >= MS(1_000),
        "503 within the tolerance: {:?}",
        off - cut
    );
    assert_eq!(body.trim_end().lines().count(), 1, "{body:?}");
    assert!(!body.contains("sekrit"), "{body:?}");
    proxy.set_mode(Mode::Pass);
    wait_code(addr, "/healthz", 200, MS(15_000));
    drop(r);
}
