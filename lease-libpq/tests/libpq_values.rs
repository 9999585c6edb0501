//! Values libpq refuses, or reads otherwise than a literal reading would:
//! refused here at resolution with one clear error (never accepted and then
//! failed on every connection attempt), or given libpq's meaning.

use lease_libpq::{Conninfo, ErrorKind, SslMode};
use std::time::Duration;
use tokio_postgres::config::Host;

fn env(name: &str) -> Option<String> {
    (name == "USER").then(|| "u".to_owned())
}

fn resolve(s: &str) -> Result<Conninfo, lease_libpq::ConninfoError> {
    Conninfo::resolve(Some(s), "--database-url", &env)
}

/// The error text of resolving `s`, or the summary when it resolves.
fn text_of(s: &str) -> String {
    match resolve(s) {
        Ok(c) => format!("Ok: {c} / {c:?}"),
        Err(e) => format!("Err: {e} / {e:?}"),
    }
}

/// libpq: an empty `host` is the default (the Unix socket directories), as
/// an empty `PGHOST` is here; in the string it was a TCP host named ""
/// whose lookup failed on every attempt, retried for ever by `lease run`.
#[test]
fn an_empty_host_is_libpqs_default() {
    for s in [
        "host='' user=u",
        "host=, user=u",
        "postgresql://[]/db?user=u",
    ] {
        let text = text_of(s);
        eprintln!("{s:?} -> {text}");
        assert!(
            text.starts_with("Ok: host /var/run/postgresql,/tmp port 5432,"),
            "{s:?}: {text}"
        );
    }
    // Not several hosts: libpq's `any`, as for the default.
    let c = resolve("host=''").unwrap();
    assert!(!c.summary().contains("primaries only"), "{c}");
    // An empty entry in a list, its port with each socket directory.
    let c = resolve("host=a,,b port=1,2,3").unwrap();
    assert!(
        c.summary()
            .starts_with("host a,/var/run/postgresql,/tmp,b port 1,2,2,3,"),
        "{c}"
    );
}

/// `port=0` in the string: libpq refuses it ("invalid port number"), and so
/// does this crate for `PGPORT=0`; from the string it was accepted, and
/// `lease run` retried "Connection refused" for ever.
#[test]
fn port_zero_in_the_string_is_refused_as_in_pgport() {
    let from_env = Conninfo::resolve(Some("host=h user=u"), "X", &|n: &str| {
        (n == "PGPORT").then(|| "0".to_owned())
    });
    assert!(from_env.is_err(), "PGPORT=0 is refused");
    for s in [
        "host=h user=u port=0",
        "postgres://u@h:0/db",
        "host=a,b port=5432,0",
    ] {
        let e = resolve(s).unwrap_err();
        eprintln!("{s:?} -> {e}");
        assert_eq!(
            (e.kind(), e.keyword()),
            (ErrorKind::InvalidValue, Some("port"))
        );
        assert!(e.to_string().contains("invalid port 0"), "{e}");
    }
}

/// Linux caps `TCP_KEEPIDLE` and `TCP_KEEPINTVL` at 32767 s and
/// `TCP_KEEPCNT` at 1..=127: beyond, every connection attempt failed with
/// "Invalid argument (os error 22)", retried for ever.
#[test]
fn out_of_range_keepalives_are_refused() {
    for (opt, keyword) in [
        ("keepalives_idle=40000", "keepalives_idle"),
        ("keepalives_interval=40000", "keepalives_interval"),
        ("keepalives_count=4000000000", "keepalives_count"),
        ("keepalives_count=128", "keepalives_count"),
        ("keepalives_count=0", "keepalives_count"),
    ] {
        let e = resolve(&format!("host=h {opt}")).unwrap_err();
        eprintln!("{opt} -> {e}");
        assert_eq!(
            (e.kind(), e.keyword()),
            (ErrorKind::InvalidValue, Some(keyword))
        );
        assert!(e.to_string().contains("out of range"), "{e}");
    }
    let c = resolve("host=h keepalives_idle=32767 keepalives_interval=32767 keepalives_count=127")
        .unwrap();
    assert_eq!(c.config().get_keepalives_idle(), Duration::from_secs(32767));
    assert_eq!(c.config().get_keepalives_retries(), Some(127));
}

/// The crate docs: `connect_timeout` "(seconds; 1 means 2, 0 or less waits
/// forever, as in libpq)": it was applied to `PGCONNECT_TIMEOUT` only; in
/// the string, 1 stayed 1 s.
#[test]
fn connect_timeout_one_means_two_in_the_string_too() {
    let c = resolve("host=h user=u connect_timeout=1").unwrap();
    assert_eq!(
        c.config().get_connect_timeout(),
        Some(&Duration::from_secs(2))
    );
    let c = resolve("postgres://h/db?connect_timeout=1").unwrap();
    assert_eq!(
        c.config().get_connect_timeout(),
        Some(&Duration::from_secs(2))
    );
    let c = resolve("host=h connect_timeout=3").unwrap();
    assert_eq!(
        c.config().get_connect_timeout(),
        Some(&Duration::from_secs(3))
    );
    assert_eq!(
        resolve("host=h connect_timeout=0")
            .unwrap()
            .config()
            .get_connect_timeout(),
        None
    );
}

/// The crate docs: "A root certificate, client certificate or key that is
/// named but cannot be read is an error when the connection is resolved,
/// whatever the mode". Under `sslmode=disable` (and `allow`) they were not
/// read at all, and a missing file resolved without a word.
#[test]
fn a_named_but_missing_certificate_is_an_error_whatever_the_mode() {
    for mode in ["disable", "allow"] {
        for (files, keyword) in [
            (
                "sslcert=/nonexistent/client.crt sslkey=/nonexistent/client.key",
                "sslcert",
            ),
            ("sslrootcert=/nonexistent/root.crt", "sslrootcert"),
        ] {
            let s = format!("host=h user=u sslmode={mode} {files}");
            let e = resolve(&s).unwrap_err();
            eprintln!("{s:?} -> {e}");
            assert_eq!((e.kind(), e.keyword()), (ErrorKind::File, Some(keyword)));
        }
    }
}

/// libpq's default files in `~/.postgresql` are read only in a mode that
/// uses TLS: unusable ones (here not PEM) do not stop `disable` or `allow`,
/// the way around them, as in libpq.
#[test]
fn unusable_default_certificate_files_do_not_stop_a_mode_without_tls() {
    use std::os::unix::fs::PermissionsExt;
    let home = std::env::temp_dir().join(format!("lease-libpq-home-{}", std::process::id()));
    let dot = home.join(".postgresql");
    std::fs::create_dir_all(&dot).unwrap();
    for file in ["root.crt", "postgresql.crt", "postgresql.key"] {
        let path = dot.join(file);
        std::fs::write(&path, "not PEM").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let home_text = home.display().to_string();
    let env = |name: &str| match name {
        "USER" => Some("u".to_owned()),
        "HOME" => Some(home_text.clone()),
        _ => None,
    };
    let resolve = |s: &str| Conninfo::resolve(Some(s), "--database-url", &env);
    for mode in ["disable", "allow"] {
        let r = resolve(&format!("host=h sslmode={mode}"));
        assert!(r.is_ok(), "{mode}: {:?}", r.err().map(|e| e.to_string()));
    }
    let e = resolve("host=h sslmode=require").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::File, "{e}");
    std::fs::remove_dir_all(&home).unwrap();
}

/// A bare `hostaddr` (or `PGHOSTADDR`) with TLS: libpq does TLS without a
/// host name (no SNI; the name is not checked below verify-full); here
/// tokio-postgres refused the handshake ("no hostname provided for TLS
/// handshake") on every attempt. The address is now the TLS name; with
/// verify-full, which needs a name, it is refused at resolution.
#[test]
fn a_bare_hostaddr_gets_a_tls_name_and_verify_full_wants_a_host() {
    let addr: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    for mode in ["require", "prefer", "verify-ca", "disable"] {
        let c = match resolve(&format!("hostaddr=127.0.0.1 sslmode={mode}")) {
            Ok(c) => c,
            // verify-ca wants roots first, as ever.
            Err(e) if mode == "verify-ca" => {
                assert_eq!(e.keyword(), Some("sslrootcert"));
                continue;
            }
            Err(e) => panic!("{mode}: {e}"),
        };
        assert_eq!(c.config().get_hostaddrs(), [addr]);
        assert_eq!(
            c.config().get_hosts(),
            [Host::Tcp("127.0.0.1".to_owned())],
            "{mode}"
        );
        assert!(c.summary().starts_with("host 127.0.0.1 port 5432,"), "{c}");
    }
    let from_env = Conninfo::resolve(None, "X", &|n: &str| match n {
        "USER" => Some("u".to_owned()),
        "PGHOSTADDR" => Some("127.0.0.1".to_owned()),
        "PGSSLMODE" => Some("require".to_owned()),
        _ => None,
    })
    .unwrap();
    assert_eq!(from_env.sslmode(), SslMode::Require);
    assert_eq!(from_env.config().get_hosts().len(), 1);
    let e = resolve("hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=system").unwrap_err();
    assert_eq!(
        (e.kind(), e.keyword()),
        (ErrorKind::Inconsistent, Some("hostaddr"))
    );
    assert!(e.to_string().contains("give host="), "{e}");
}
