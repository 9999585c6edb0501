//! Errors a user can see, against real servers, with both drivers: a wrong
//! password, an unknown role or database make `run` return the configuration
//! error at once (well under 2 s); a closed port is retried, with the cause
//! in `status().last_error`.

use crate::common::*;
use lease_tests::Cluster;
use std::future::Future;
use std::time::Duration;
use std::time::Instant;

const BOUND: Duration = Duration::from_secs(2);

const PASSWORD: &str = "right-Secret-7781";

const WRONG: &str = "wrong-Secret-4410";

fn opts() -> lease_proto::Options {
    let mut o = lease_proto::Options::default();
    o.retry_interval = Duration::from_millis(100);
    o.heartbeat_interval = Duration::from_millis(100);
    o.query_timeout = Duration::from_millis(400);
    o.guard_margin = Duration::from_millis(200);
    o
}

/// What one run against `conn` came to within `wait`.
#[derive(Debug)]
enum Ran {
    /// The run returned this error after this long, of this kind.
    Failed(String, Duration, Kind),
    /// Still running at `wait`; the status's last error then.
    Running(Option<String>),
}

/// The kind of a run's error.
#[derive(Debug, PartialEq)]
enum Kind {
    /// `RunError::Config`.
    Config,
    /// `RunError::Refused`.
    Refused,
    Other,
}

/// One driver's way to run a lease whose job never returns.
trait Driver {
    const NAME: &'static str;
    fn run(conn: &str, wait: Duration) -> Ran {
        Self::run_with(conn, wait, opts())
    }
    fn run_with(conn: &str, wait: Duration, opts: lease_proto::Options) -> Ran;
}

struct Tokio;

struct Smol;

impl Driver for Tokio {
    const NAME: &'static str = "tokio";
    fn run_with(conn: &str, wait: Duration, opts: lease_proto::Options) -> Ran {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        rt.block_on(async {
            let (locker, driver) = lease_tokio::Locker::without_tls(conn, opts).expect("connect");
            tokio::spawn(driver);
            let run = locker.run("errors", |lease| async move {
                lease.cancelled().await;
                Ok::<(), std::io::Error>(())
            });
            ran(run, || locker.status(), tokio::time::sleep(wait)).await
        })
    }
}

impl Driver for Smol {
    const NAME: &'static str = "smol";
    fn run_with(conn: &str, wait: Duration, opts: lease_proto::Options) -> Ran {
        smol::block_on(async {
            let (locker, driver) = lease_smol::Locker::without_tls(conn, opts).expect("connect");
            smol::spawn(driver).detach();
            let run = locker.run("errors", |lease| async move {
                lease.cancelled().await;
                Ok::<(), std::io::Error>(())
            });
            let timer = async {
                smol::Timer::after(wait).await;
            };
            ran(run, || locker.status(), timer).await
        })
    }
}

async fn ran<E: std::fmt::Display>(
    run: impl Future<Output = Result<(), lease_tokio::RunError<E>>>,
    status: impl Fn() -> lease_proto::Status,
    timer: impl Future<Output = ()>,
) -> Ran {
    let start = Instant::now();
    let run = async { Some(run.await) };
    let timer = async {
        timer.await;
        None
    };
    match futures_lite::future::or(run, timer).await {
        Some(Err(e)) => {
            let kind = match e {
                lease_tokio::RunError::Config(_) => Kind::Config,
                lease_tokio::RunError::Refused(_) => Kind::Refused,
                _ => Kind::Other,
            };
            Ran::Failed(e.to_string(), start.elapsed(), kind)
        }
        Some(Ok(())) => panic!("the run returned Ok"),
        // Still running: the last error, or (none) whether the lease is held.
        None => Ran::Running(status().last_error.map(|l| l.error.to_string())),
    }
}

fn fails_at_once<D: Driver>(conn: &str, words: &str) {
    match D::run(conn, Duration::from_secs(5)) {
        Ran::Failed(message, took, kind) => {
            eprintln!("{}: {message} after {took:?}", D::NAME);
            assert_eq!(
                kind,
                Kind::Config,
                "{}: a configuration error: {message}",
                D::NAME
            );
            assert!(took < BOUND, "{}: took {took:?}", D::NAME);
            assert!(message.starts_with("cannot connect: "), "{message}");
            assert!(message.contains(words), "{}: {message}", D::NAME);
            assert!(!message.contains(WRONG) && !message.contains(PASSWORD));
        }
        Ran::Running(last) => panic!("{}: still retrying; last error {last:?}", D::NAME),
    }
}

fn password_cluster() -> Cluster {
    let cluster = Cluster::start_password_auth().expect("start a cluster");
    cluster
        .sql(&format!("CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'"))
        .expect("create role");
    cluster
}

fn wrong_password<D: Driver>() {
    let cluster = password_cluster();
    let conn = format!(
        "host=127.0.0.1 port={} user=app password={WRONG} dbname=postgres",
        cluster.port()
    );
    fails_at_once::<D>(&conn, "password authentication failed for user \"app\"");
    // The right password works (the cluster is not broken otherwise).
    let conn = format!(
        "host=127.0.0.1 port={} user=app password={PASSWORD} dbname=postgres",
        cluster.port()
    );
    match D::run(&conn, Duration::from_millis(800)) {
        Ran::Running(None) => {}
        other => panic!("{}: the right password: {other:?}", D::NAME),
    }
}

fn unknown_role<D: Driver>() {
    let conn = format!("{DB} user=lease_no_such_role_{}", std::process::id());
    fails_at_once::<D>(&conn, "does not exist");
}

fn unknown_database<D: Driver>() {
    let conn = format!("{DB} dbname=lease_no_such_db_{}", std::process::id());
    fails_at_once::<D>(&conn, "does not exist");
}

fn closed_port<D: Driver>() {
    // Bound then dropped: nobody listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let conn = format!("host=127.0.0.1 port={port} user=postgres connect_timeout=1");
    match D::run(&conn, Duration::from_millis(1500)) {
        Ran::Running(Some(last)) => {
            eprintln!("{}: still retrying, last error: {last}", D::NAME);
            assert!(last.to_lowercase().contains("refused"), "{last}");
        }
        other => panic!("{}: {other:?}", D::NAME),
    }
}

#[test]
fn tokio_wrong_password() {
    wrong_password::<Tokio>();
}

#[test]
fn smol_wrong_password() {
    wrong_password::<Smol>();
}

#[test]
fn tokio_unknown_role() {
    unknown_role::<Tokio>();
}

#[test]
fn smol_unknown_role() {
    unknown_role::<Smol>();
}

#[test]
fn tokio_unknown_database() {
    unknown_database::<Tokio>();
}

#[test]
fn smol_unknown_database() {
    unknown_database::<Smol>();
}

#[test]
fn tokio_closed_port_keeps_retrying() {
    closed_port::<Tokio>();
}

#[test]
fn smol_closed_port_keeps_retrying() {
    closed_port::<Smol>();
}

/// Without a TLS connector, `sslmode=require` cannot be met: a configuration
/// error the driver marks itself (no SQLSTATE), returned at once.
fn tls_required<D: Driver>() {
    fails_at_once::<D>(&format!("{DB} sslmode=require"), "TLS");
}

#[test]
fn tokio_tls_required_without_a_connector() {
    tls_required::<Tokio>();
}

#[test]
fn smol_tls_required_without_a_connector() {
    tls_required::<Smol>();
}

/// PostgreSQL 13 (fetched by .ci/install-deps) rejects the server guard's
/// `idle_session_timeout` in the startup packet (SQLSTATE 42704): the run
/// returns the refusal naming the version lease needs, at once, instead of a
/// "cannot connect" that reads like a wrong setting. With the guard off, 13
/// is supported and the lease is held.
fn postgres_13<D: Driver>() {
    let cluster = Cluster::start_version(13).expect("start PostgreSQL 13");
    let conn = format!("{DB} port={}", cluster.port());
    match D::run(&conn, Duration::from_secs(5)) {
        Ran::Failed(message, took, kind) => {
            eprintln!("{}: {message} after {took:?}", D::NAME);
            assert_eq!(kind, Kind::Refused, "{}: a refusal: {message}", D::NAME);
            assert!(took < BOUND, "{}: took {took:?}", D::NAME);
            assert!(
                message.contains("lease needs PostgreSQL 14 or newer"),
                "{}: {message}",
                D::NAME
            );
        }
        Ran::Running(last) => panic!("{}: still retrying; last error {last:?}", D::NAME),
    }
    assert!(cluster.held_advisory_keys().expect("pg_locks").is_empty());
    // Behind a session-mode pgbouncer, which rejects the startup options, the
    // settings go into the setup statement: its set_config fails the same way.
    let bouncer = lease_tests::PgBouncer::start(&cluster, lease_tests::PoolMode::Session)
        .expect("start pgbouncer");
    match D::run(&bouncer.conn_string(), Duration::from_secs(5)) {
        Ran::Failed(message, took, kind) => {
            eprintln!("{} via pgbouncer: {message} after {took:?}", D::NAME);
            assert_eq!(kind, Kind::Refused, "{}: a refusal: {message}", D::NAME);
            assert!(took < BOUND, "{}: took {took:?}", D::NAME);
            assert!(message.contains("lease needs PostgreSQL 14 or newer"));
        }
        Ran::Running(last) => panic!(
            "{} via pgbouncer: still retrying; last error {last:?}",
            D::NAME
        ),
    }
    let no_guard = {
        let mut o = opts();
        o.server_guard = false;
        o
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let watch = std::thread::spawn({
        let cluster_port = cluster.port();
        move || {
            // The lease shows in pg_locks while the run below goes on.
            let admin = lease_tests::scenario::Admin::connect(&format!("{DB} port={cluster_port}"))
                .expect("admin connection");
            let held = (0..40).any(|_| {
                std::thread::sleep(Duration::from_millis(50));
                let rows = admin
                    .rows("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
                    .expect("pg_locks");
                rows[0][0].as_deref() != Some("0")
            });
            tx.send(held).expect("send");
        }
    });
    match D::run_with(&conn, Duration::from_millis(2500), no_guard) {
        Ran::Running(None) => {}
        other => panic!("{}: PostgreSQL 13 without the guard: {other:?}", D::NAME),
    }
    watch.join().expect("watcher");
    assert!(
        rx.recv().expect("watcher's answer"),
        "{}: never held",
        D::NAME
    );
}

#[test]
fn tokio_postgres_13_is_refused_with_the_version_needed() {
    postgres_13::<Tokio>();
}

#[test]
fn smol_postgres_13_is_refused_with_the_version_needed() {
    postgres_13::<Smol>();
}
