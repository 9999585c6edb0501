//! Errors a user can see, against real servers, with both drivers: a wrong
//! password, an unknown role or database make `run` return the configuration
//! error at once (well under 2 s); a closed port is retried, with the cause
//! in `status().last_error`.

use std::future::Future;
use std::time::{Duration, Instant};

use lease_tests::Cluster;

/// The shared test server (trust authentication).
const DB: &str = "host=127.0.0.1 user=postgres dbname=postgres";
const BOUND: Duration = Duration::from_secs(2);
const PASSWORD: &str = "right-Secret-7781";
const WRONG: &str = "wrong-Secret-4410";

fn opts() -> lease_proto::Options {
    lease_proto::Options {
        retry_interval: Duration::from_millis(100),
        heartbeat_interval: Duration::from_millis(100),
        query_timeout: Duration::from_millis(400),
        guard_margin: Duration::from_millis(200),
        ..lease_proto::Options::default()
    }
}

/// What one run against `conn` came to within `wait`.
#[derive(Debug)]
enum Ran {
    /// The run returned this error after this long.
    Failed(String, Duration, bool),
    /// Still running at `wait`; the status's last error then.
    Running(Option<String>),
}

/// One driver's way to run a lease whose job never returns.
trait Driver {
    const NAME: &'static str;
    fn run(conn: &str, wait: Duration) -> Ran;
}

struct Tokio;
struct Smol;

impl Driver for Tokio {
    const NAME: &'static str = "tokio";
    fn run(conn: &str, wait: Duration) -> Ran {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        rt.block_on(async {
            let (locker, driver) = lease_tokio::Locker::connect(conn, opts()).expect("connect");
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
    fn run(conn: &str, wait: Duration) -> Ran {
        smol::block_on(async {
            let (locker, driver) = lease_smol::Locker::connect(conn, opts()).expect("connect");
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
            let config = matches!(e, lease_tokio::RunError::Config(_));
            Ran::Failed(e.to_string(), start.elapsed(), config)
        }
        Some(Ok(())) => panic!("the run returned Ok"),
        None => Ran::Running(status().last_error.map(|l| l.error.to_string())),
    }
}

fn fails_at_once<D: Driver>(conn: &str, words: &str) {
    match D::run(conn, Duration::from_secs(5)) {
        Ran::Failed(message, took, config) => {
            eprintln!("{}: {message} after {took:?}", D::NAME);
            assert!(config, "{}: a configuration error: {message}", D::NAME);
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
