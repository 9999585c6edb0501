//! `lease` over TLS against ephemeral servers with `ssl = on` and
//! certificates generated in the test (the kit's [`Certs`]). Handover times
//! are printed (`cargo test -p lease-cli --test tls -- --nocapture`).

use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lease_tests::{Certs, Cluster, Replica};

const MS: fn(u64) -> Duration = Duration::from_millis;
const FAST: [&str; 8] = [
    "--retry-interval",
    "50ms",
    "--heartbeat-interval",
    "100ms",
    "--query-timeout",
    "1s",
    "--grace",
    "300ms",
];

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

fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), nanos())
}

/// `lease` with a clean environment; HOME points at the certificates'
/// directory, so no `~/.pgpass` or `~/.postgresql` of the machine counts.
fn lease(home: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    for var in [
        "DATABASE_URL",
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGPASSWORD",
        "PGDATABASE",
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGSSLCERT",
        "PGSSLKEY",
        "PGPASSFILE",
        "PGAPPNAME",
        "PGCONNECT_TIMEOUT",
        "PGTARGETSESSIONATTRS",
        "LEASE_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HOME", home);
    cmd
}

/// The child of a handover test: prints `start`, on SIGTERM `stop`.
const ANNOUNCE: &str = r#"echo "start token=$LEASE_TOKEN"; trap "echo stop; exit 0" TERM; while :; do sleep 0.02; done"#;

fn run(home: &std::path::Path, url: &str, name: &str, extra: &[&str]) -> Command {
    let mut cmd = lease(home);
    let fast = FAST
        .chunks(2)
        .filter(|kv| !extra.contains(&kv[0]))
        .flatten();
    cmd.arg("run")
        .args(["--database-url", url])
        .args(fast)
        .args(extra)
        .arg(name)
        .args(["--", "sh", "-c", ANNOUNCE]);
    cmd
}

/// Leads with A, stands by with B (polling only every 5 s), SIGTERMs A:
/// the time from the signal to B's command starting. Returns it and A's
/// connection line.
fn handover(home: &std::path::Path, url: &str, what: &str) -> (Duration, String) {
    let name = unique("tls-handover");
    let a = Replica::spawn(run(home, url, &name, &[])).expect("spawn a");
    let (_, contending) = a
        .wait_for_line(|l| l.contains("contending for the lease"), MS(10_000))
        .expect("a's connection line");
    a.wait_for_line(|l| l.starts_with("start"), MS(10_000))
        .unwrap_or_else(|e| panic!("a leads over {what}: {e}\n{:#?}", a.lines()));
    let b = Replica::spawn(run(home, url, &name, &["--retry-interval", "5s"])).expect("spawn b");
    b.wait_for_line(|l| l.contains("standing by"), MS(10_000))
        .expect("b stands by");
    let signalled = Instant::now();
    a.sigterm().expect("SIGTERM a");
    let (started, _) = b
        .wait_for_line(|l| l.starts_with("start"), MS(10_000))
        .expect("b takes over");
    b.sigterm().expect("SIGTERM b");
    (started.saturating_duration_since(signalled), contending)
}

#[test]
fn verify_full_leads_and_hands_over_as_fast_as_plaintext() {
    let t = tls();
    let url = format!(
        "host=localhost port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={}",
        t.cluster.port(),
        t.certs.ca.display()
    );
    let (over_tls, line) = handover(t.certs.dir(), &url, "TLS");
    assert!(
        line.contains(&format!(
            "TLS required (sslmode=verify-full), certificate chain verified against {} and host \
             name checked",
            t.certs.ca.display()
        )),
        "{line}"
    );
    let plain = Cluster::start().expect("start a plaintext PostgreSQL");
    let url = format!("{} sslmode=disable", plain.conn_string());
    let (plaintext, line) = handover(t.certs.dir(), &url, "plaintext");
    assert!(line.contains("no TLS (sslmode=disable)"), "{line}");
    eprintln!("SIGTERM handover (leader signalled -> standby's command started): TLS verify-full {over_tls:?}, plaintext {plaintext:?}");
    assert!(over_tls < MS(1_000), "{over_tls:?}");
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
