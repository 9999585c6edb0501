//! Connecting as psql does, with both drivers, against real servers:
//! `Locker::from_env` reaches a TLS-only server (`hostssl`, SCRAM password)
//! with `PGSSLMODE=verify-full`, `PGSSLROOTCERT` and the password from a
//! `PGPASSFILE` and acquires a lease; the first errors a new user meets name
//! their cause and fail at once (a missing password, a misspelt keyword,
//! `sslmode=require` without TLS).

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use lease_tests::{Certs, Cluster};

use crate::common::{init, opts};

/// The process environment is shared by every test of this file: whoever
/// sets `PG*` variables, or starts a program that reads them (the kit's
/// `psql`), holds this.
static ENV: Mutex<()> = Mutex::new(());

const PASSWORD: &str = "libpq-Secret-5127";
/// A configuration error comes back at once; a retried one would still be
/// running at this bound.
const BOUND: Duration = Duration::from_secs(5);

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("libpq-{name}-{}-{nanos}", std::process::id())
}

/// What a run whose job returns at once came to within [`BOUND`].
#[derive(Debug, PartialEq)]
enum Ran {
    /// The job ran and returned.
    Led,
    /// `RunError::Config`, with its message.
    Config(String),
    /// Another error.
    Failed(String),
    /// Still trying at the bound; the status's last error then.
    Running(Option<String>),
}

/// Runs one lease on a tokio locker (its driver spawned) within [`BOUND`].
fn run_tokio<T: lease_tokio::TokioTls>(
    made: Result<(lease_tokio::Locker, lease_tokio::Driver<T>), lease_tokio::Error>,
) -> Ran {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (locker, driver) = made.expect("a locker");
        tokio::spawn(driver);
        let run = locker.run(&unique("tokio"), |_| async { Ok::<(), String>(()) });
        let ran = tokio::time::timeout(BOUND, run).await;
        ran_of(ran.ok(), &locker.status())
    })
}

/// Runs one lease on a smol locker (its driver on the same executor) within
/// [`BOUND`].
fn run_smol<T: lease_smol::SmolTls>(
    made: Result<(lease_smol::Locker, lease_smol::Driver<T>), lease_smol::Error>,
) -> Ran {
    smol::block_on(async {
        let (locker, driver) = made.expect("a locker");
        let driver = smol::spawn(driver);
        let run = locker.run(&unique("smol"), |_| async { Ok::<(), String>(()) });
        let ran = within(BOUND, run).await;
        let ran = ran_of(ran, &locker.status());
        drop(locker);
        drop(driver);
        ran
    })
}

async fn within<F: Future>(bound: Duration, f: F) -> Option<F::Output> {
    use futures_lite::FutureExt as _;
    async { Some(f.await) }
        .or(async {
            smol::Timer::after(bound).await;
            None
        })
        .await
}

fn ran_of(
    ran: Option<Result<(), lease_tokio::RunError<String>>>,
    status: &lease_tokio::Status,
) -> Ran {
    match ran {
        Some(Ok(())) => Ran::Led,
        Some(Err(lease_tokio::RunError::Config(e))) => Ran::Config(e.to_string()),
        Some(Err(e)) => Ran::Failed(e.to_string()),
        None => Ran::Running(status.last_error.as_ref().map(|e| format!("{e:?}"))),
    }
}

fn password_cluster() -> Cluster {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start_password_auth().expect("start a cluster");
    cluster
        .sql(&format!("CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'"))
        .expect("create role");
    cluster
}

/// TCP over TLS only; `app` authenticates with a SCRAM password (`postgres`
/// stays trusted for the kit's `psql`).
const TLS_HBA: &str = "local all all trust\n\
                       hostssl all postgres 127.0.0.1/32 trust\n\
                       hostssl all app 127.0.0.1/32 scram-sha-256\n";

/// A TLS-only server, its certificates, and a password file for `app`.
struct TlsServer {
    cluster: Cluster,
    certs: Certs,
    passfile: std::path::PathBuf,
}

impl TlsServer {
    fn start() -> TlsServer {
        use std::os::unix::fs::PermissionsExt;
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let certs = Certs::generate("nobody").expect("certificates");
        let cluster = Cluster::start_tls(&certs, TLS_HBA).expect("a TLS-only PostgreSQL");
        cluster
            .sql(&format!("CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'"))
            .expect("create role");
        let passfile = std::env::temp_dir().join(format!(
            "lease-libpq-pgpass-{}-{}",
            std::process::id(),
            cluster.port()
        ));
        std::fs::write(
            &passfile,
            format!(
                "# libpq's format\nlocalhost:{}:postgres:app:{PASSWORD}\n",
                cluster.port()
            ),
        )
        .expect("write the password file");
        std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600))
            .expect("chmod the password file");
        TlsServer {
            cluster,
            certs,
            passfile,
        }
    }

    /// Calls `make` (a `from_env`) with the environment psql would need and
    /// nothing else of libpq's: no password in it.
    fn with_env<T>(&self, make: impl FnOnce() -> T) -> T {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let vars = [
            ("PGHOST", "localhost".to_owned()),
            ("PGPORT", self.cluster.port().to_string()),
            ("PGUSER", "app".to_owned()),
            ("PGDATABASE", "postgres".to_owned()),
            ("PGSSLMODE", "verify-full".to_owned()),
            ("PGSSLROOTCERT", self.certs.ca.display().to_string()),
            ("PGPASSFILE", self.passfile.display().to_string()),
        ];
        let saved: Vec<_> = vars
            .iter()
            .map(|(k, _)| (*k, std::env::var_os(k)))
            .chain([("PGPASSWORD", std::env::var_os("PGPASSWORD"))])
            .collect();
        std::env::remove_var("PGPASSWORD");
        for (k, v) in &vars {
            std::env::set_var(k, v);
        }
        let made = make();
        for (k, v) in saved {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
        made
    }

    /// The server's word that a session of `app` ran over TLS.
    fn app_used_tls(&self) -> bool {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let n = self
            .cluster
            .sql(
                "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.usename = 'app' AND s.ssl",
            )
            .expect("query pg_stat_ssl");
        n.trim() != "0"
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.passfile);
    }
}

/// The test options with a query timeout (which bounds a connection attempt) of 2 s: a TLS
/// handshake and a SCRAM exchange by the debug build on a loaded 2-core machine took more than
/// the usual 400 ms, every attempt for 5 s, once (the run then never led).
fn tls_opts() -> lease_proto::Options {
    let mut o = opts();
    o.query_timeout = Duration::from_secs(2);
    o
}

#[test]
fn tokio_from_env_verify_full_with_a_pgpass_password_acquires_a_lease() {
    init();
    let server = TlsServer::start();
    let made = server.with_env(|| lease_tokio::Locker::from_env(tls_opts()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let ran = rt.block_on(async {
        let (locker, driver) = made.expect("a locker");
        tokio::spawn(driver);
        let server = &server;
        let run = locker.run(&unique("tokio-env"), |lease| async move {
            assert!(lease.token() > 0);
            let tls = tokio::task::block_in_place(|| server.app_used_tls());
            if tls {
                Ok(())
            } else {
                Err("the lease session is not over TLS".to_owned())
            }
        });
        let ran = tokio::time::timeout(BOUND, run).await;
        ran_of(ran.ok(), &locker.status())
    });
    // The job led, and found its own session over TLS.
    assert_eq!(ran, Ran::Led);
}

#[test]
fn smol_from_env_verify_full_with_a_pgpass_password_acquires_a_lease() {
    init();
    let server = TlsServer::start();
    let made = server.with_env(|| lease_smol::Locker::from_env(tls_opts()));
    let ran = smol::block_on(async {
        let (locker, driver) = made.expect("a locker");
        let driver = smol::spawn(driver);
        let server = &server;
        let run = locker.run(&unique("smol-env"), |lease| async move {
            assert!(lease.token() > 0);
            // Blocks this thread only: the driver runs on smol's executor.
            if server.app_used_tls() {
                Ok(())
            } else {
                Err("the lease session is not over TLS".to_owned())
            }
        });
        let ran = within(BOUND, run).await;
        let ran = ran_of(ran, &locker.status());
        drop(locker);
        drop(driver);
        ran
    });
    assert_eq!(ran, Ran::Led);
}

/// The same server refuses a wrong CA with `verify-full`: from_env's TLS
/// really verifies (a configuration error, at once).
#[test]
fn from_env_verify_full_refuses_a_wrong_ca() {
    init();
    let server = TlsServer::start();
    let wrong = server.certs.wrong_ca.display().to_string();
    let made = server.with_env(|| {
        std::env::set_var("PGSSLROOTCERT", &wrong);
        lease_tokio::Locker::from_env(opts())
    });
    match run_tokio(made) {
        Ran::Config(e) => assert!(e.contains("not signed by a CA in"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// No password anywhere, and a server that asks for one: a configuration
/// error, at once, that says so.
#[test]
fn no_password_fails_at_once() {
    init();
    let cluster = password_cluster();
    let conn = format!(
        "host=127.0.0.1 port={} user=app dbname=postgres",
        cluster.port()
    );
    for (driver, ran) in [
        (
            "tokio",
            run_tokio(lease_tokio::Locker::without_tls(&conn, opts())),
        ),
        (
            "smol",
            run_smol(lease_smol::Locker::without_tls(&conn, opts())),
        ),
    ] {
        match ran {
            Ran::Config(e) => assert!(e.contains("password missing"), "{driver}: {e}"),
            other => panic!("{driver}: {other:?}"),
        }
    }
}

/// A misspelt keyword is named in the error.
#[test]
fn a_bad_keyword_is_named() {
    let Err(e) = lease_tokio::Locker::without_tls("host=127.0.0.1 usr=app", opts()) else {
        panic!("accepted");
    };
    assert!(e.to_string().contains("`usr`"), "{e}");
    let Err(e) = lease_smol::Locker::without_tls("host=127.0.0.1 usr=app", opts()) else {
        panic!("accepted");
    };
    assert!(e.to_string().contains("`usr`"), "{e}");
    // The libpq constructors name it too, with the keyword meant.
    let Err(e) = lease_tokio::Locker::from_conninfo("host=127.0.0.1 usr=app", opts()) else {
        panic!("accepted");
    };
    assert_eq!(
        e.to_string(),
        "invalid connection configuration: unknown keyword `usr` in the connection string \
         (did you mean `user`?)"
    );
}

/// `Locker::from_conninfo` (and `from_env`) logs where it connects and what of TLS, as `lease
/// run`'s first line does: `lease connects to host ...; no TLS (sslmode=disable)`.
#[test]
fn the_libpq_constructors_log_whether_tls_is_used() {
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    for (mode, words) in [
        ("disable", "no TLS (sslmode=disable)"),
        (
            "require",
            "TLS required (sslmode=require), server certificate not verified",
        ),
    ] {
        let conn = format!("host=127.0.0.1 user=app dbname=app sslmode={mode}");
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let tokio = lease_tokio::Locker::from_conninfo(&conn, opts()).map(|_| ());
            let smol = lease_smol::Locker::from_conninfo(&conn, opts()).map(|_| ());
            assert!(tokio.is_ok() && smol.is_ok(), "{tokio:?} {smol:?}");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("lease connects to"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        for line in lines {
            assert!(line.contains(" INFO ") && line.contains(words), "{line}");
        }
    }
}

/// `sslmode=require` on a constructor without TLS: the error points to the
/// constructors that have it.
#[test]
fn require_without_tls_points_to_from_env() {
    init();
    let conn = "host=127.0.0.1 user=postgres dbname=postgres sslmode=require";
    for (driver, ran) in [
        (
            "tokio",
            run_tokio(lease_tokio::Locker::without_tls(conn, opts())),
        ),
        (
            "smol",
            run_smol(lease_smol::Locker::without_tls(conn, opts())),
        ),
    ] {
        match ran {
            Ran::Config(e) => assert!(
                e.contains("no TLS implementation configured") && e.contains("Locker::from_env"),
                "{driver}: {e}"
            ),
            other => panic!("{driver}: {other:?}"),
        }
    }
}
