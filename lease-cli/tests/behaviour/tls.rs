//! `lease` over TLS against ephemeral servers with `ssl = on` and
//! certificates generated in the test (the kit's [`Certs`]). Handover times
//! are printed (`cargo test -p lease-cli tls:: -- --nocapture`).

use crate::common::*;
use lease_tests::Certs;
use lease_tests::Cluster;
use lease_tests::Replica;
use std::process::Command;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::Weak;
use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

/// The client certificate's role (`cert` authentication) and the password
/// role (scram, password from a `.pgpass` file).
const CERT_ROLE: &str = "certuser";

const PW_ROLE: &str = "pwuser";

/// Every TCP connection over TLS (`hostssl` only): plaintext is refused.
const HBA: &str = "\
local all all trust
hostssl all certuser 127.0.0.1/32 cert
hostssl all pwuser 127.0.0.1/32 scram-sha-256
hostssl all all 127.0.0.1/32 trust
";

struct Tls {
    certs: Certs,
    cluster: Cluster,
    password: String,
}

/// One TLS server (and its certificates) shared by the tests that run at
/// the same time.
fn tls() -> Arc<Tls> {
    static SHARED: Mutex<Weak<Tls>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = shared.upgrade() {
        return t;
    }
    let certs = Certs::generate(CERT_ROLE).expect("generate certificates");
    let cluster = Cluster::start_tls(&certs, HBA).expect("start a TLS PostgreSQL");
    let password = format!("Pw-{}-{}", std::process::id(), nanos());
    cluster
        .sql(&format!(
            "CREATE ROLE {CERT_ROLE} LOGIN; CREATE ROLE {PW_ROLE} LOGIN PASSWORD '{password}'"
        ))
        .expect("create roles");
    let t = Arc::new(Tls {
        certs,
        cluster,
        password,
    });
    *shared = Arc::downgrade(&t);
    t
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// `lease` with a clean environment; HOME points at the certificates'
/// directory, so no `~/.pgpass` or `~/.postgresql` of the machine counts.
fn lease(home: &std::path::Path) -> Command {
    let mut cmd = crate::common::lease();
    cmd.env("HOME", home);
    cmd
}

/// The child of a handover test: prints `start`, on SIGTERM `stop`.
const ANNOUNCE: &str = r#"echo "start token=$LEASE_TOKEN"; trap "echo stop; exit 0" TERM; while :; do sleep 0.02; done"#;

fn run(home: &std::path::Path, url: &str, name: &str, extra: &[&str]) -> Command {
    run_sh(home, url, name, extra, ANNOUNCE)
}

fn run_sh(home: &std::path::Path, url: &str, name: &str, extra: &[&str], script: &str) -> Command {
    run_sh_with(lease(home), url, &fast_and(extra), name, script)
}

/// The token of a `start token=N` line.
fn token(line: &str) -> i64 {
    line.strip_prefix("start token=")
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("not a start line: {line:?}"))
}

/// What [`lead_fail_over_exit`] measured.
struct Failover {
    /// The first runner's connection line.
    line: String,
    /// SIGTERM to the leader -> the standby's command started.
    handover: Duration,
    /// kill -9 of the leader -> the standby's command started.
    takeover: Duration,
    /// SIGTERM to the last leader -> it exited.
    exit: Duration,
}

/// `lease run` leads, fails over and exits, with the same bounds whatever
/// the transport: A leads; B stands by, polling only every 5 s; SIGTERM to A
/// hands over to B at once (the release notification) and A exits 0; C
/// stands by (polling every 50 ms); kill -9 of B: C leads at its next poll;
/// SIGTERM to C: it exits 0 at once and the lease is free; a command's exit
/// status is `lease run`'s. The token grows at every change of leader.
fn lead_fail_over_exit(home: &std::path::Path, c: &Cluster, url: &str, what: &str) -> Failover {
    let name = unique("tls-failover");
    let wait = |r: &Replica, who: &str, pred: &dyn Fn(&str) -> bool| {
        r.wait_for_line(pred, MS(10_000))
            .unwrap_or_else(|e| panic!("{what}: {who}: {e}\n{:#?}", r.lines()))
    };
    let mut a = Replica::spawn(run(home, url, &name, &[])).expect("spawn a");
    let (_, line) = wait(&a, "a's connection line", &|l| {
        l.contains("contending for the lease")
    });
    let (_, started) = wait(&a, "a leads", &|l| l.starts_with("start"));
    let token_a = token(&started);
    let mut b =
        Replica::spawn(run(home, url, &name, &["--retry-interval", "5s"])).expect("spawn b");
    wait(&b, "b stands by", &|l| l.contains("standing by"));

    // 1. SIGTERM: a graceful handover.
    let signalled = Instant::now();
    a.sigterm().expect("SIGTERM a");
    let (b_started, line_b) = wait(&b, "b takes over", &|l| l.starts_with("start"));
    let handover = b_started.saturating_duration_since(signalled);
    let status = a.wait_exit(MS(5_000)).expect("a exits");
    assert_eq!(status.code(), Some(0), "{what}: a: {:#?}", a.lines());
    let token_b = token(&line_b);
    assert!(token_b > token_a, "{what}: {token_b} <= {token_a}");
    assert!(handover < MS(1_000), "{what}: handover {handover:?}");

    // 2. kill -9 of the leader: the standby leads at its next poll.
    let mut c_run = Replica::spawn(run(home, url, &name, &[])).expect("spawn c");
    wait(&c_run, "c stands by", &|l| l.contains("standing by"));
    let killed = Instant::now();
    b.kill9().expect("SIGKILL b");
    let (c_started, line_c) = wait(&c_run, "c takes over", &|l| l.starts_with("start"));
    let takeover = c_started.saturating_duration_since(killed);
    let _ = b.wait_exit(MS(5_000));
    let token_c = token(&line_c);
    assert!(token_c > token_b, "{what}: {token_c} <= {token_b}");
    // FAST's retry interval, 50 ms, plus the time to notice and start the command.
    assert!(
        takeover < MS(50 + 300),
        "{what}: kill -9 takeover {takeover:?}"
    );

    // 3. SIGTERM to the last leader: it exits 0 at once and releases.
    let signalled = Instant::now();
    c_run.sigterm().expect("SIGTERM c");
    let status = c_run.wait_exit(MS(5_000)).expect("c exits");
    let exit = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "{what}: c: {:#?}", c_run.lines());
    assert!(exit < MS(1_000), "{what}: exit {exit:?}");
    let key = lease_proto::key_for_name(&name);
    let held = c.held_advisory_keys().expect("pg_locks");
    assert!(!held.iter().any(|&(k, _)| k == key), "{what}: still held");

    // 4. A command's exit status is lease run's.
    let mut r = Replica::spawn(run_sh(home, url, &name, &[], "exit 7")).expect("spawn");
    let status = r.wait_exit(MS(10_000)).expect("exits");
    assert_eq!(status.code(), Some(7), "{what}: {:#?}", r.lines());
    Failover {
        line,
        handover,
        takeover,
        exit,
    }
}

#[test]
fn verify_full_against_hostssl_only_leads_fails_over_and_exits_as_plaintext() {
    let t = tls();
    let url = format!(
        "host=localhost port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={}",
        t.cluster.port(),
        t.certs.ca.display()
    );
    let over_tls = lead_fail_over_exit(t.certs.dir(), &t.cluster, &url, "TLS");
    assert!(
        over_tls.line.contains(&format!(
            "TLS required (sslmode=verify-full), certificate chain verified against {} and host \
             name checked",
            t.certs.ca.display()
        )),
        "{}",
        over_tls.line
    );
    let plain = Cluster::start().expect("start a plaintext PostgreSQL");
    let url = format!("{} sslmode=disable", plain.conn_string());
    let plaintext = lead_fail_over_exit(t.certs.dir(), &plain, &url, "plaintext");
    assert!(
        plaintext.line.contains("no TLS (sslmode=disable)"),
        "{}",
        plaintext.line
    );
    for (what, f) in [("TLS verify-full", &over_tls), ("plaintext", &plaintext)] {
        eprintln!(
            "{what}: SIGTERM handover (leader signalled -> standby's command started) {:?}, \
             kill -9 -> standby's command started {:?}, SIGTERM -> exit {:?}",
            f.handover, f.takeover, f.exit
        );
    }
}

/// Runs `lease run` until a line matching `pred` appears (or 15 s), then
/// stops it; returns every line.
fn lines_until(cmd: Command, pred: impl Fn(&str) -> bool) -> (Result<String, String>, Vec<String>) {
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    let found = r
        .wait_for_line(|l| pred(l), MS(15_000))
        .map(|(_, l)| l)
        .map_err(|e| e.to_string());
    let _ = r.sigterm();
    let _ = r.wait_exit(MS(5_000));
    let lines = r.lines().into_iter().map(|l| l.text).collect();
    (found, lines)
}

#[test]
fn a_wrong_ca_fails_with_one_line_naming_the_mode_and_the_reason() {
    let t = tls();
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={}",
        t.cluster.port(),
        t.certs.wrong_ca.display()
    );
    let (found, lines) = lines_until(run(t.certs.dir(), &url, &unique("wrong-ca"), &[]), |l| {
        l.contains("sslmode=verify-full") && l.contains("rejected")
    });
    let line = found.unwrap_or_else(|e| panic!("{e}: {lines:#?}"));
    eprintln!("wrong CA: {line}");
    assert!(
        line.contains(&format!(
            "sslmode=verify-full: the server's certificate is rejected: it is not signed by a CA \
             in {}",
            t.certs.wrong_ca.display()
        )),
        "{line}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("start")), "{lines:#?}");
}

#[test]
fn require_against_a_server_without_tls_fails_clearly() {
    let plain = Cluster::start().expect("start a plaintext PostgreSQL");
    let url = format!("{} sslmode=require", plain.conn_string());
    let home = std::env::temp_dir();
    let (found, lines) = lines_until(run(&home, &url, &unique("no-tls"), &[]), |l| {
        l.contains("server does not support TLS")
    });
    let line = found.unwrap_or_else(|e| panic!("{e}: {lines:#?}"));
    eprintln!("require against plaintext: {line}");
    assert!(!lines.iter().any(|l| l.starts_with("start")), "{lines:#?}");
}

#[test]
fn a_hostssl_only_server_refuses_plaintext() {
    let t = tls();
    let url = format!("{} sslmode=disable", t.cluster.conn_string());
    let (found, lines) = lines_until(run(t.certs.dir(), &url, &unique("plain"), &[]), |l| {
        l.contains("no pg_hba.conf entry")
    });
    let line = found.unwrap_or_else(|e| panic!("{e}: {lines:#?}"));
    eprintln!("plaintext to hostssl-only: {line}");
    assert!(line.contains("no encryption"), "{line}");
    assert!(!lines.iter().any(|l| l.starts_with("start")), "{lines:#?}");
}

/// Fails if any line quotes a PEM file's body (a key or certificate).
fn assert_no_pem(lines: &[String], files: &[&std::path::Path]) {
    for file in files {
        let text = std::fs::read_to_string(file).expect("read PEM");
        for chunk in text
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        {
            for line in lines {
                assert!(
                    !line.contains(&chunk[..16]),
                    "{} quoted: {line}",
                    file.display()
                );
            }
        }
        for line in lines {
            assert!(!line.contains("-----BEGIN"), "PEM in output: {line}");
        }
    }
}

#[test]
fn a_certificate_authenticated_role_leads() {
    let t = tls();
    let url = format!(
        "postgresql://{CERT_ROLE}@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        t.cluster.port(),
        t.certs.ca.display(),
        t.certs.client_cert.display(),
        t.certs.client_key.display()
    );
    let (found, lines) = lines_until(run(t.certs.dir(), &url, &unique("cert"), &[]), |l| {
        l.starts_with("start")
    });
    found.unwrap_or_else(|e| panic!("{e}: {lines:#?}"));
    let contending = lines
        .iter()
        .find(|l| l.contains("contending"))
        .expect("connection line");
    assert!(
        contending.contains(&format!(
            "client certificate {}",
            t.certs.client_cert.display()
        )),
        "{contending}"
    );
    assert_no_pem(
        &lines,
        &[&t.certs.client_key, &t.certs.client_cert, &t.certs.ca],
    );
    // The same with the libpq variables instead of the URL's parameters.
    let mut cmd = run(
        t.certs.dir(),
        &format!(
            "host=localhost port={} user={CERT_ROLE} dbname=postgres",
            t.cluster.port()
        ),
        &unique("cert-env"),
        &[],
    );
    cmd.env("PGSSLMODE", "verify-full")
        .env("PGSSLROOTCERT", &t.certs.ca)
        .env("PGSSLCERT", &t.certs.client_cert)
        .env("PGSSLKEY", &t.certs.client_key);
    let (found, lines) = lines_until(cmd, |l| l.starts_with("start"));
    found.unwrap_or_else(|e| panic!("{e}: {lines:#?}"));
}

#[test]
fn a_password_from_the_password_file_works_and_is_never_printed() {
    use std::os::unix::fs::PermissionsExt;
    let t = tls();
    let passfile = t.certs.dir().join(format!("pgpass-{}", nanos()));
    std::fs::write(
        &passfile,
        format!(
            "# lease test\nother:*:*:*:wrong\n127.0.0.1:{}:postgres:{PW_ROLE}:{}\n",
            t.cluster.port(),
            t.password
        ),
    )
    .expect("write the password file");
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let url = format!(
        "host=127.0.0.1 port={} user={PW_ROLE} dbname=postgres sslmode=require",
        t.cluster.port()
    );
    let name = unique("pgpass");
    let mut cmd = run(t.certs.dir(), &url, &name, &[]);
    cmd.env("PGPASSFILE", &passfile).env("LEASE_LOG", "debug");
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    r.wait_for_line(|l| l.starts_with("start"), MS(15_000))
        .unwrap_or_else(|e| panic!("{e}: {:#?}", r.lines()));
    // `lease status` with the same settings, while it leads.
    let status = lease(t.certs.dir())
        .args(["status", "--database-url", &url, &name])
        .env("PGPASSFILE", &passfile)
        .output()
        .expect("lease status");
    r.sigterm().expect("SIGTERM");
    r.wait_exit(MS(5_000)).expect("exit");
    let mut lines: Vec<String> = r.lines().into_iter().map(|l| l.text).collect();
    let status_out = String::from_utf8_lossy(&status.stdout).into_owned()
        + &String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "{status_out}");
    assert!(status_out.contains(&name), "{status_out}");
    lines.extend(status_out.lines().map(str::to_owned));
    assert!(lines.len() > 5, "{lines:#?}");
    for line in &lines {
        assert!(!line.contains(&t.password), "password printed: {line}");
    }

    // Group-readable: ignored with a warning (libpq's rule), so no password.
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let mut cmd = run(t.certs.dir(), &url, &unique("pgpass-open"), &[]);
    cmd.env("PGPASSFILE", &passfile);
    let (found, lines) = lines_until(cmd, |l| l.contains("group or world access"));
    found.unwrap_or_else(|e| panic!("{e}: {lines:#?}"));
    assert!(!lines.iter().any(|l| l.starts_with("start")), "{lines:#?}");
    for line in &lines {
        assert!(!line.contains(&t.password), "password printed: {line}");
    }
}

#[test]
fn verify_ca_checks_the_chain_but_not_the_host_name() {
    let t = tls();
    // The socket goes to hostaddr; TLS checks the name `host` gives.
    let url = |mode: &str| {
        format!(
            "host=elsewhere.invalid hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
             sslmode={mode} sslrootcert={}",
            t.cluster.port(),
            t.certs.ca.display()
        )
    };
    let (found, lines) = lines_until(
        run(t.certs.dir(), &url("verify-ca"), &unique("ca"), &[]),
        |l| l.starts_with("start"),
    );
    found.unwrap_or_else(|e| panic!("verify-ca: {e}: {lines:#?}"));
    let (found, lines) = lines_until(
        run(t.certs.dir(), &url("verify-full"), &unique("full"), &[]),
        |l| l.contains("sslmode=verify-full") && l.contains("rejected"),
    );
    let line = found.unwrap_or_else(|e| panic!("verify-full: {e}: {lines:#?}"));
    eprintln!("verify-full, wrong name: {line}");
    assert!(
        line.contains("not valid for name \"elsewhere.invalid\""),
        "{line}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("start")), "{lines:#?}");
}

/// A bare `hostaddr` (or `PGHOSTADDR`) with TLS (`sslmode=require`, or the
/// default `prefer` against a server with TLS): psql connects (TLS without
/// SNI, the certificate unchecked under these modes); `lease run` failed
/// with "error performing TLS handshake: no hostname provided for TLS
/// handshake". With `verify-full`, which needs a host name, it is refused at
/// once, naming `host=`.
#[test]
fn a_bare_hostaddr_with_tls_connects_as_libpq_does() {
    let t = tls();
    let home = t.certs.dir();
    let port = t.cluster.port();
    let runs = [
        (
            format!("hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=require"),
            None,
        ),
        (
            format!("hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres"),
            None,
        ),
        (
            format!("port={port} user=postgres dbname=postgres"),
            Some("require"),
        ),
    ];
    for (url, pgsslmode) in runs {
        let mut cmd = lease(home);
        if let Some(mode) = pgsslmode {
            cmd.env("PGHOSTADDR", "127.0.0.1").env("PGSSLMODE", mode);
        }
        cmd.args(["run", "--database-url", &url])
            .args(["--retry-interval", "50ms", "--query-timeout", "1s"])
            .args([&unique("addr"), "--", "sh", "-c", "echo started"]);
        let (status, out, err, _) = try_output(cmd, MS(5_000));
        eprintln!("{url} (PGSSLMODE {pgsslmode:?}): {status:?}\nstdout: {out}\nstderr: {err}");
        assert!(out.contains("started"), "{url}: {err}");
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{err}");
    }
    let url = format!(
        "hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=verify-full \
         sslrootcert={}",
        t.certs.ca.display()
    );
    let mut cmd = lease(home);
    cmd.args(["run", "--database-url", &url]).args([
        &unique("addr"),
        "--",
        "sh",
        "-c",
        "echo started",
    ]);
    let (status, out, err, _) = try_output(cmd, MS(5_000));
    eprintln!("{url}: {status:?}\nstdout: {out}\nstderr: {err}");
    // A bad connection string: exit 2, as for any other.
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("give host="), "{err}");
    assert!(!out.contains("started"), "{out}");
}
