//! The `lease` command without a password for a server that asks for one
//! (no `password=`, no `PGPASSWORD`, no password file): exit 1 at once with
//! one line that says so and where it looked, instead of retrying forever.

use std::time::{Duration, Instant};

use lease_tests::{Cluster, Replica};

use crate::common;

#[test]
fn no_password_exits_1_at_once_naming_it() {
    let c = Cluster::start_password_auth().expect("start a cluster");
    c.sql("CREATE ROLE app LOGIN PASSWORD 'cli-Secret-3318'")
        .expect("create role");
    // A home without a password file.
    let home = std::env::temp_dir().join(format!("lease-cli-nopass-{}", std::process::id()));
    std::fs::create_dir_all(&home).expect("a home");
    let mut cmd = common::lease();
    cmd.env("HOME", &home)
        .env_remove("PGPASSFILE")
        .args(["run", "--database-url"])
        .arg(format!(
            "host=127.0.0.1 port={} user=app dbname=postgres",
            c.port()
        ))
        .args(["--retry-interval", "50ms", "--query-timeout", "1s"])
        .args(["job", "--", "sleep", "30"]);
    let start = Instant::now();
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    let status = r.wait_exit(Duration::from_secs(5));
    let _ = r.wait_for_line(|_| false, Duration::from_millis(200));
    let lines: Vec<String> = r.lines().into_iter().map(|l| l.text).collect();
    let _ = std::fs::remove_dir_all(&home);
    let status = status.unwrap_or_else(|e| panic!("lease did not exit ({e:?}): {lines:#?}"));
    assert_eq!(status.code(), Some(1), "{lines:#?}");
    assert!(start.elapsed() < Duration::from_secs(3), "{lines:#?}");
    let errors: Vec<&String> = lines.iter().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line: {lines:#?}");
    assert!(
        errors[0].contains("cannot connect: invalid configuration: password missing"),
        "{}",
        errors[0]
    );
    // Where it looked: the string, PGPASSWORD, the password file (here: none in HOME).
    let pgpass = home.join(".pgpass");
    assert!(
        errors[0].contains(&format!(
            "the server asks for a password, and there is no password in --database-url, nor \
             in PGPASSWORD, nor in the password file {} (the default; no such file)",
            pgpass.display()
        )),
        "{}",
        errors[0]
    );
}

/// `DATABASE_URL` with one non-UTF-8 byte was treated as unset: `lease
/// status` connected to the PG* defaults instead (here the test cluster) and
/// reported on the wrong database, exit 0, without a word about
/// DATABASE_URL. Now an error that names it, never its value; the same for a
/// `PG*` variable.
#[test]
fn a_non_utf8_database_url_or_pg_variable_is_an_error_naming_it() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let c = common::cluster();
    let mut bad = b"host=127.0.0.1 port=1 dbname=prodSECRET".to_vec();
    bad.push(0xff);
    let bad = OsString::from_vec(bad);
    for var in ["DATABASE_URL", "PGDATABASE"] {
        let mut cmd = common::lease();
        cmd.arg("status")
            .env_remove("DATABASE_URL")
            .env("PGHOST", "127.0.0.1")
            .env("PGPORT", c.port().to_string())
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres")
            .env(var, &bad);
        let (status, out, err, _) = common::output(cmd, Duration::from_secs(10));
        eprintln!("{var}: exit {status}\nstdout: {out}\nstderr: {err}");
        assert_ne!(status.code(), Some(0), "stdout: {out} stderr: {err}");
        assert!(
            err.contains(&format!("{var} is not valid UTF-8")),
            "stderr: {err}"
        );
        assert!(!err.contains("prodSECRET") && !out.contains("prodSECRET"));
    }
}
