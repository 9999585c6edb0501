//! Resolution: the string's keywords, then the `PG*` environment, then
//! libpq's defaults, into a [`Conninfo`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_postgres::config::{Host, SslNegotiation, TargetSessionAttrs};
use tokio_postgres::Config;

use crate::error::{err, ConninfoError, ErrorKind};
use crate::parse::{params, quote, Param, NOT_SHOWN};
use crate::redact::add_secret;
use crate::tls::{self, Roots, SslMode};
use crate::Conninfo;

/// Keywords handed to tokio-postgres as they are.
const PASSED: [&str; 17] = [
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "channel_binding",
    "load_balance_hosts",
];

/// Keywords applied here: tokio-postgres does not know them, or not all of
/// their values.
const TAKEN: [&str; 8] = [
    "keepalives_count",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "passfile",
    "target_session_attrs",
    "fallback_application_name",
];

/// libpq keywords that are refused rather than ignored.
const UNSUPPORTED: [&str; 20] = [
    "service",
    "gssencmode",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "sslpassword",
    "sslcertmode",
    "sslcompression",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "requirepeer",
    "require_auth",
    "client_encoding",
    "replication",
    "min_protocol_version",
    "max_protocol_version",
    "requiressl",
];

/// libpq's default hosts: the Unix socket directories, in order.
const DEFAULT_SOCKETS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// Linux's limits for `TCP_KEEPIDLE` and `TCP_KEEPINTVL` (seconds) and
/// `TCP_KEEPCNT`: beyond them every connection attempt fails with EINVAL.
const MAX_KEEPALIVE_SECS: u64 = 32767;
const MAX_KEEPALIVES_COUNT: u32 = 127;

/// Resolves `string` (from `origin`) with the environment `lookup`.
pub(crate) fn resolve(
    string: Option<&str>,
    origin: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Conninfo, ConninfoError> {
    let lookup = |name: &str| lookup(name).filter(|v| !v.is_empty());
    if lookup("PGSERVICE").is_some() {
        return Err(err(
            ErrorKind::Unsupported,
            "PGSERVICE",
            "PGSERVICE is set, but service files are not supported: unset it and give the \
             settings in the connection string or the PG* variables",
        ));
    }
    let given = match string {
        Some(s) => params(s, origin)?,
        None => Vec::new(),
    };
    let (mut config, taken) = split(&given, origin)?;
    let named = |key: &str| given.iter().any(|p| p.key == key);
    // A keyword from the string, else its environment variable: the value
    // and where it came from.
    let setting = |key: &str, var: &'static str| -> Option<(String, String)> {
        match taken.iter().find(|p| p.key == key) {
            Some(p) => Some((p.value.clone(), format!("{key} in {origin}"))),
            None => lookup(var).map(|v| (v, var.to_owned())),
        }
    };
    let mut warnings = Vec::new();
    if let Some(password) = lookup("PGPASSWORD") {
        add_secret(&password);
        if config.get_password().is_none() {
            config.password(password);
        }
    }
    if config.get_application_name().is_none() {
        let fallback = taken
            .iter()
            .find(|p| p.key == "fallback_application_name")
            .map(|p| p.value.clone());
        if let Some(name) = lookup("PGAPPNAME").or(fallback) {
            config.application_name(name);
        }
    }
    if config.get_options().is_none() {
        if let Some(options) = lookup("PGOPTIONS") {
            config.options(options);
        }
    }
    // Variables whose values tokio-postgres parses: applied when the string
    // does not give the keyword.
    for (var, key) in [
        ("PGCHANNELBINDING", "channel_binding"),
        ("PGLOADBALANCEHOSTS", "load_balance_hosts"),
        ("PGSSLNEGOTIATION", "sslnegotiation"),
    ] {
        if let (false, Some(value)) = (named(key), lookup(var)) {
            let one: Config = format!("{key}={}", quote(&value)).parse().map_err(|_| {
                err(
                    ErrorKind::InvalidValue,
                    var,
                    format!("invalid {var} {value:?}"),
                )
            })?;
            match key {
                "channel_binding" => {
                    config.channel_binding(one.get_channel_binding());
                }
                "load_balance_hosts" => {
                    config.load_balance_hosts(one.get_load_balance_hosts());
                }
                _ => {
                    config.ssl_negotiation(one.get_ssl_negotiation());
                }
            }
        }
    }
    // libpq's name for tokio-postgres's keepalives_retries (no variable).
    if let Some(p) = taken.iter().find(|p| p.key == "keepalives_count") {
        let n = p.value.trim().parse::<u32>().map_err(|_| {
            err(
                ErrorKind::InvalidValue,
                "keepalives_count",
                match p.hidden {
                    Some(_) => format!("invalid keepalives_count in {origin} ({NOT_SHOWN})"),
                    None => format!("invalid keepalives_count {:?} in {origin}", p.value),
                },
            )
        })?;
        if !(1..=MAX_KEEPALIVES_COUNT).contains(&n) {
            return Err(err(
                ErrorKind::InvalidValue,
                "keepalives_count",
                format!(
                    "keepalives_count {n} in {origin} is out of range: 1 to \
                     {MAX_KEEPALIVES_COUNT} (the kernel's limit)"
                ),
            ));
        }
        config.keepalives_retries(n);
    }
    let max_keepalive = Duration::from_secs(MAX_KEEPALIVE_SECS);
    for (key, value) in [
        ("keepalives_idle", Some(config.get_keepalives_idle())),
        ("keepalives_interval", config.get_keepalives_interval()),
    ] {
        if let Some(secs) = value.filter(|&v| v > max_keepalive) {
            return Err(err(
                ErrorKind::InvalidValue,
                key,
                format!(
                    "{key} {} in {origin} is out of range: at most {MAX_KEEPALIVE_SECS} seconds \
                     (the kernel's limit)",
                    secs.as_secs()
                ),
            ));
        }
    }
    if config.get_ports().contains(&0) {
        // libpq: "invalid port number"; as PGPORT=0 below.
        return Err(err(
            ErrorKind::InvalidValue,
            "port",
            format!("invalid port 0 in {origin}"),
        ));
    }
    if config.get_connect_timeout().is_none() {
        if let Some(t) = lookup("PGCONNECT_TIMEOUT") {
            let secs = t.trim().parse::<i64>().map_err(|_| {
                err(
                    ErrorKind::InvalidValue,
                    "PGCONNECT_TIMEOUT",
                    format!("invalid PGCONNECT_TIMEOUT {t:?}: expected seconds"),
                )
            })?;
            // libpq: zero or less waits forever (tokio-postgres's parse of
            // the string's keyword, too).
            if secs > 0 {
                config.connect_timeout(Duration::from_secs(secs as u64));
            }
        }
    }
    // libpq: 1 means 2, from the string or the variable.
    if config.get_connect_timeout() == Some(&Duration::from_secs(1)) {
        config.connect_timeout(Duration::from_secs(2));
    }
    let attrs = setting("target_session_attrs", "PGTARGETSESSIONATTRS");
    if let Some((attrs, attrs_origin)) = &attrs {
        config.target_session_attrs(match attrs.as_str() {
            "any" => TargetSessionAttrs::Any,
            // A primary is what a lease needs (a standby is refused). The
            // driver checks ReadWrite as libpq's `primary` (not in recovery):
            // no lease statement writes, so a primary whose sessions default
            // to read-only is kept (lease-driver's docs, "Several hosts").
            "read-write" | "primary" => TargetSessionAttrs::ReadWrite,
            "read-only" | "standby" | "prefer-standby" => {
                return Err(err(
                    ErrorKind::Unsupported,
                    "target_session_attrs",
                    format!(
                        "target_session_attrs={attrs} (from {attrs_origin}): a lease needs the \
                         primary (a standby cannot take advisory locks); use any, read-write or \
                         primary"
                    ),
                ))
            }
            other => {
                return Err(err(
                    ErrorKind::InvalidValue,
                    "target_session_attrs",
                    format!(
                        "invalid target_session_attrs {other:?} in {attrs_origin}: expected any, \
                         read-write, primary, read-only, standby or prefer-standby"
                    ),
                ))
            }
        });
    }

    // Whether no host was named at all (libpq's default sockets), or only
    // empty ones (`host=''`: libpq's default too).
    let mut default_host = given
        .iter()
        .any(|p| p.key == "host" && p.value.split(',').all(str::is_empty))
        && !named("hostaddr");
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        let addrs = lookup("PGHOSTADDR");
        for addr in addrs.iter().flat_map(|a| a.split(',')) {
            let ip = addr.trim().parse().map_err(|_| {
                err(
                    ErrorKind::InvalidValue,
                    "PGHOSTADDR",
                    format!("invalid address {addr:?} in PGHOSTADDR"),
                )
            })?;
            config.hostaddr(ip);
        }
        match lookup("PGHOST") {
            None if addrs.is_some() => {}
            Some(hosts) => {
                for host in hosts.split(',') {
                    if host.is_empty() {
                        default_hosts(&mut config);
                    } else {
                        config.host(host);
                    }
                }
            }
            None => {
                default_host = true;
                default_hosts(&mut config);
            }
        }
    }
    if config.get_ports().is_empty() {
        match lookup("PGPORT") {
            Some(ports) => {
                for port in ports.split(',') {
                    let port = match port.trim() {
                        "" => 5432,
                        p => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
                            err(
                                ErrorKind::InvalidValue,
                                "PGPORT",
                                format!("invalid port {p:?} in PGPORT"),
                            )
                        })?,
                    };
                    config.port(port);
                }
            }
            None => {
                config.port(5432);
            }
        }
    }
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
    // Several hosts named and no target_session_attrs: read-write, not libpq's
    // `any` (see the crate docs).
    let several = hosts > 1 && !default_host;
    if attrs.is_none() && several {
        config.target_session_attrs(TargetSessionAttrs::ReadWrite);
    }
    let ports = config.get_ports().len();
    if ports != 1 && ports != hosts {
        return Err(err(
            ErrorKind::Inconsistent,
            "port",
            format!("{ports} ports for {hosts} hosts: give one port, or one per host"),
        ));
    }
    if config.get_user().is_none() {
        let user = lookup("PGUSER")
            .or_else(|| lookup("USER"))
            .or_else(os_user)
            .ok_or_else(|| {
                err(
                    ErrorKind::NoUser,
                    "user",
                    "no database user: set PGUSER or give user= in the connection string",
                )
            })?;
        config.user(user);
    }
    if config.get_dbname().is_none() {
        let dbname = lookup("PGDATABASE").or_else(|| config.get_user().map(str::to_owned));
        if let Some(dbname) = dbname {
            config.dbname(dbname);
        }
    }
    let home = lookup("HOME").map(PathBuf::from);
    let mut password_search = None;
    if config.get_password().is_none() {
        let passfile = setting("passfile", "PGPASSFILE");
        let file = match &passfile {
            Some((p, from)) => Some((PathBuf::from(p), from.clone())),
            None => home
                .as_ref()
                .map(|h| (h.join(".pgpass"), "the default".to_owned())),
        };
        // Where no password was found, for an error that needs one.
        let mut searched = match string {
            Some(_) => format!("no password in {origin}, nor in PGPASSWORD"),
            None => "no password in PGPASSWORD".to_owned(),
        };
        match file {
            Some((path, from)) => match crate::pgpass::lookup(&path, &config) {
                Ok(Some(password)) => {
                    add_secret(&password);
                    config.password(password);
                }
                Ok(None) => {
                    let how = if path.exists() {
                        "no line matches"
                    } else {
                        "no such file"
                    };
                    searched.push_str(&format!(
                        ", nor in the password file {} ({from}; {how})",
                        path.display()
                    ));
                    password_search = Some(searched);
                }
                Err(crate::pgpass::Skipped(why)) => {
                    searched.push_str(&format!(", and {why}"));
                    password_search = Some(searched);
                    warnings.push(why);
                }
            },
            None => {
                searched.push_str(", and no password file (neither PGPASSFILE nor HOME is set)");
                password_search = Some(searched);
            }
        }
    }

    let tls = tls_settings(&setting, home.as_deref())?;
    config.ssl_mode(tls.mode.tokio_postgres());
    if config.get_ssl_negotiation() == SslNegotiation::Direct
        && tls.mode.tokio_postgres() != tokio_postgres::config::SslMode::Require
    {
        return Err(err(
            ErrorKind::Inconsistent,
            "sslnegotiation",
            format!(
                "sslnegotiation=direct (in {origin}) needs sslmode=require, verify-ca or \
                 verify-full"
            ),
        ));
    }
    let rustls = tls.client_config()?;
    if config.get_hosts().is_empty() && !config.get_hostaddrs().is_empty() {
        // A bare hostaddr: libpq does TLS without a host name (no SNI, the
        // name unchecked below verify-full); tokio-postgres wants one, so
        // the address is the name (rustls sends no SNI for an address).
        if tls.mode == SslMode::VerifyFull {
            return Err(err(
                ErrorKind::Inconsistent,
                "hostaddr",
                format!(
                    "sslmode=verify-full checks the server's host name, but only hostaddr is given \
                     (in {origin} or PGHOSTADDR): give host= (the name in the server's \
                     certificate) along with hostaddr"
                ),
            ));
        }
        for addr in config.get_hostaddrs().to_vec() {
            config.host(addr.to_string());
        }
    }
    let mut summary = summary(&config);
    if config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite {
        summary.push_str(match attrs {
            Some(_) => ", primaries only: a standby is skipped",
            None => ", primaries only: a standby is skipped (the default with several hosts)",
        });
    }
    let summary = format!("{summary}; {}", tls.describe());
    Ok(Conninfo {
        config,
        sslmode: tls.mode,
        rustls,
        summary,
        warnings,
        password_search,
    })
}

/// The tokio-postgres configuration of the [`PASSED`] parameters, and the
/// [`TAKEN`] ones; any other keyword is refused, named.
fn split(given: &[Param], origin: &str) -> Result<(Config, Vec<Param>), ConninfoError> {
    let mut passed = Vec::new();
    let mut taken = Vec::new();
    for p in given {
        if p.key == "password" {
            add_secret(&p.value);
            add_secret(&p.raw);
        }
        let key = p.key.as_str();
        if PASSED.contains(&key) {
            passed.push(p.clone());
        } else if TAKEN.contains(&key) {
            taken.push(p.clone());
        } else if key == "service" {
            return Err(err(
                ErrorKind::Unsupported,
                "service",
                format!(
                    "`service` (in {origin}): service files are not supported; give the \
                     settings in the connection string or the PG* variables"
                ),
            ));
        } else if UNSUPPORTED.contains(&key) {
            return Err(err(
                ErrorKind::Unsupported,
                key,
                format!("the libpq keyword `{key}` (in {origin}) is not supported"),
            ));
        } else if let Some(at) = p.hidden {
            // The likely keyword only: it says nothing of the text.
            let hint = nearest(key)
                .map(|k| format!("did you mean `{k}`? or "))
                .unwrap_or_default();
            return Err(ConninfoError::new(
                ErrorKind::UnknownKeyword,
                None,
                format!("unknown keyword at character {at} in {origin} ({hint}{NOT_SHOWN})"),
            ));
        } else {
            let hint = nearest(key)
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            return Err(err(
                ErrorKind::UnknownKeyword,
                key,
                format!("unknown keyword `{key}` in {origin}{hint}"),
            ));
        }
    }
    default_empty_hosts(&mut passed);
    let passed: Vec<&Param> = passed.iter().collect();
    let kv = |ps: &[&Param]| {
        ps.iter()
            .map(|p| format!("{}={}", p.key, quote(&p.value)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let config = match kv(&passed).parse::<Config>() {
        Ok(config) => config,
        Err(_) => {
            // Which one: each alone.
            let bad = passed
                .iter()
                .find(|p| kv(&[p]).parse::<Config>().is_err())
                .copied();
            return Err(match bad {
                Some(p) if p.key == "password" => err(
                    ErrorKind::InvalidValue,
                    "password",
                    format!("invalid password in {origin}"),
                ),
                Some(p) if p.hidden.is_some() => err(
                    ErrorKind::InvalidValue,
                    &p.key,
                    format!("invalid value for `{}` in {origin} ({NOT_SHOWN})", p.key),
                ),
                Some(p) => err(
                    ErrorKind::InvalidValue,
                    &p.key,
                    format!("invalid value {:?} for `{}` in {origin}", p.value, p.key),
                ),
                None => ConninfoError::new(
                    ErrorKind::Inconsistent,
                    None,
                    format!("the connection string from {origin} is not usable"),
                ),
            });
        }
    };
    Ok((config, taken))
}

/// The known keyword closest to `key`, if it is a likely typo (edit
/// distance at most 2).
fn nearest(key: &str) -> Option<&'static str> {
    PASSED
        .iter()
        .chain(&TAKEN)
        .map(|k| (distance(key, k), *k))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (prev + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// A keyword's value and where it came from, given the keyword and its
/// environment variable.
type Setting<'a> = dyn Fn(&str, &'static str) -> Option<(String, String)> + 'a;

/// The TLS settings: each from the string, else its variable, else libpq's
/// default (`prefer`; the files in `~/.postgresql` when they exist).
fn tls_settings(
    setting: &Setting<'_>,
    home: Option<&Path>,
) -> Result<tls::Settings, ConninfoError> {
    let dot = |file: &str| home.map(|h| h.join(".postgresql").join(file));
    let roots = match setting("sslrootcert", "PGSSLROOTCERT") {
        Some((v, _)) if v == "system" => Some(Roots::System),
        Some((v, _)) => Some(Roots::File(PathBuf::from(v))),
        None => dot("root.crt").filter(|p| p.is_file()).map(Roots::File),
    };
    let mode = match setting("sslmode", "PGSSLMODE") {
        Some((m, mode_origin)) => {
            let keyword = if mode_origin == "PGSSLMODE" {
                "PGSSLMODE"
            } else {
                "sslmode"
            };
            let mode = SslMode::parse(&m).ok_or_else(|| {
                err(
                    ErrorKind::InvalidValue,
                    keyword,
                    format!(
                        "invalid sslmode {m:?} in {mode_origin}: expected disable, allow, \
                         prefer, require, verify-ca or verify-full"
                    ),
                )
            })?;
            // libpq: the whole public web's CAs prove nothing without the
            // host name check.
            if roots == Some(Roots::System) && mode != SslMode::VerifyFull {
                return Err(err(
                    ErrorKind::Inconsistent,
                    keyword,
                    format!(
                        "weak sslmode={m} (from {mode_origin}) may not be used with \
                         sslrootcert=system (use verify-full)"
                    ),
                ));
            }
            mode
        }
        None if roots == Some(Roots::System) => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    let roots_named =
        matches!(roots, Some(Roots::File(_))) && setting("sslrootcert", "PGSSLROOTCERT").is_some();
    let cert = setting("sslcert", "PGSSLCERT");
    let key = setting("sslkey", "PGSSLKEY");
    let client_named = cert.is_some() || key.is_some();
    let client = match (cert, key) {
        (Some((c, _)), Some((k, _))) => Some((PathBuf::from(c), PathBuf::from(k))),
        (Some((c, _)), None) => {
            let k = dot("postgresql.key").ok_or_else(|| {
                err(
                    ErrorKind::Inconsistent,
                    "sslkey",
                    "sslcert is given without sslkey, and there is no home directory for the \
                     default ~/.postgresql/postgresql.key",
                )
            })?;
            Some((PathBuf::from(c), k))
        }
        (None, Some((k, key_origin))) => match dot("postgresql.crt").filter(|p| p.is_file()) {
            Some(c) => Some((c, PathBuf::from(k))),
            None => {
                return Err(err(
                    ErrorKind::Inconsistent,
                    "sslcert",
                    format!("sslkey (from {key_origin}) is given without sslcert"),
                ))
            }
        },
        // libpq's default: used when the certificate exists.
        (None, None) => match (dot("postgresql.crt"), dot("postgresql.key")) {
            (Some(c), Some(k)) if c.is_file() => Some((c, k)),
            _ => None,
        },
    };
    Ok(tls::Settings {
        mode,
        roots,
        client,
        named: (roots_named, client_named),
    })
}

/// libpq's default: the Unix socket in `/var/run/postgresql`, then `/tmp`
/// (tokio-postgres tries hosts in order).
fn default_hosts(config: &mut Config) {
    for path in DEFAULT_SOCKETS {
        config.host_path(PathBuf::from(path));
    }
}

/// libpq: an empty entry in the string's `host` list (`host=''`,
/// `host=a,`, `postgresql://[]/db`) is the default, the Unix socket
/// directories; with one port per host, its port goes with each of them.
/// Not with `hostaddr`, which then gives the address.
fn default_empty_hosts(passed: &mut [Param]) {
    if passed.iter().any(|p| p.key == "hostaddr") {
        return;
    }
    let Some(h) = passed.iter().position(|p| p.key == "host") else {
        return;
    };
    let hosts: Vec<String> = passed[h].value.split(',').map(str::to_owned).collect();
    if !hosts.iter().any(String::is_empty) {
        return;
    }
    let ports = passed.iter().position(|p| p.key == "port");
    let port_count = ports.map_or(0, |p| passed[p].value.split(',').count());
    if hosts.iter().all(String::is_empty) && port_count <= 1 {
        // `host=''`, `host=,`: the default, once.
        passed[h].value = DEFAULT_SOCKETS.join(",");
        return;
    }
    let expand = |items: &[String], default: &dyn Fn(&str) -> Vec<String>| -> String {
        hosts
            .iter()
            .zip(items)
            .flat_map(|(host, item)| match host.is_empty() {
                true => default(item),
                false => vec![item.clone()],
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    passed[h].value = expand(&hosts, &|_| {
        DEFAULT_SOCKETS.iter().map(|s| (*s).to_owned()).collect()
    });
    if let Some(p) = ports {
        let ports: Vec<String> = passed[p].value.split(',').map(str::to_owned).collect();
        if hosts.len() > 1 && ports.len() == hosts.len() {
            passed[p].value = expand(&ports, &|port| vec![port.to_owned(); DEFAULT_SOCKETS.len()]);
        }
    }
}

/// The OS user name from the password database entry of the effective uid
/// (after `$USER`).
#[allow(unsafe_code)]
fn os_user() -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: an all-zero passwd is a valid value to be overwritten.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call, `buf` is writable for its
    // length, and `result` is only read after a successful return.
    let rc = unsafe {
        libc::getpwuid_r(
            libc::geteuid(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: on success pw_name points to a NUL-terminated string in `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// `host H port P, database D, user U` (hosts and ports comma-separated).
fn summary(config: &Config) -> String {
    let mut hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(h) => h.clone(),
            Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    if hosts.is_empty() {
        hosts = config
            .get_hostaddrs()
            .iter()
            .map(ToString::to_string)
            .collect();
    }
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "host {} port {}, database {}, user {}",
        hosts.join(","),
        ports.join(","),
        config.get_dbname().unwrap_or("?"),
        config.get_user().unwrap_or("?")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::redact;
    use tokio_postgres::config::SslMode;

    fn resolve_from(
        url: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Conninfo, String> {
        resolve(url, "--database-url", env).map_err(|e| e.to_string())
    }

    fn with_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn hosts(c: &Config) -> Vec<String> {
        c.get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(h) => h.clone(),
                Host::Unix(p) => p.display().to_string(),
            })
            .collect()
    }

    #[test]
    fn defaults_follow_libpq() {
        let t = resolve_from(None, &with_env(&[("USER", "alice")])).unwrap();
        assert_eq!(hosts(&t.config), ["/var/run/postgresql", "/tmp"]);
        assert_eq!(t.config.get_ports(), [5432]);
        assert_eq!(t.config.get_user(), Some("alice"));
        assert_eq!(t.config.get_dbname(), Some("alice"));
        assert_eq!(t.config.get_ssl_mode(), SslMode::Prefer);
    }

    #[test]
    fn environment_fills_in() {
        let env = with_env(&[
            ("PGHOST", "db1,db2"),
            ("PGPORT", "6432"),
            ("PGUSER", "app"),
            ("PGDATABASE", "appdb"),
            ("PGPASSWORD", "hunter22"),
            ("PGSSLMODE", "allow"),
        ]);
        let t = resolve_from(None, &env).unwrap();
        assert_eq!(hosts(&t.config), ["db1", "db2"]);
        assert_eq!(t.config.get_ports(), [6432]);
        assert_eq!(t.config.get_user(), Some("app"));
        assert_eq!(t.config.get_dbname(), Some("appdb"));
        assert_eq!(t.config.get_password(), Some(&b"hunter22"[..]));
        assert_eq!(t.config.get_ssl_mode(), SslMode::Disable);
        assert!(!t.summary.contains("hunter22"));
        assert_eq!(redact("pw hunter22 here"), "pw *** here");
    }

    #[test]
    fn the_string_wins_over_the_environment() {
        let env = with_env(&[("PGHOST", "elsewhere"), ("PGPORT", "1")]);
        let t = resolve_from(Some("postgres://bob:pw%41x@127.0.0.1:5433/db"), &env).unwrap();
        assert_eq!(hosts(&t.config), ["127.0.0.1"]);
        assert_eq!(t.config.get_ports(), [5433]);
        assert_eq!(t.config.get_password(), Some(&b"pwAx"[..]));
        let t = resolve_from(None, &env).unwrap();
        assert_eq!(hosts(&t.config), ["elsewhere"]);
        assert_eq!(t.config.get_ports(), [1]);
    }

    #[test]
    fn sslmode_is_checked() {
        let none = with_env(&[("USER", "u")]);
        let t = resolve_from(Some("host=h sslmode=require"), &none).unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Require);
        assert!(
            t.summary
                .contains("TLS required (sslmode=require), server certificate not verified"),
            "{}",
            t.summary
        );
        let e = resolve_from(Some("postgres://h/db?sslmode=verify-full"), &none)
            .err()
            .unwrap();
        assert!(
            e.contains("sslmode=verify-full needs root certificates"),
            "{e}"
        );
        let e = resolve_from(None, &with_env(&[("PGSSLMODE", "bogus")]))
            .err()
            .unwrap();
        assert!(e.contains("PGSSLMODE"), "{e}");
        let e = resolve_from(Some("host=h sslmode=require sslrootcert=system"), &none)
            .err()
            .unwrap();
        assert!(e.contains("weak sslmode=require"), "{e}");
        let e = resolve_from(Some("host=h sslrootcert=/nonexistent/ca.pem"), &none)
            .err()
            .unwrap();
        assert!(e.starts_with("sslrootcert /nonexistent/ca.pem"), "{e}");
        let t = resolve_from(
            Some("postgres://h/db?sslmode=allow&application_name=x"),
            &none,
        )
        .unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Disable);
        assert_eq!(t.config.get_application_name(), Some("x"));
        let t = resolve_from(Some("host=h sslmode='disable' user=z"), &none).unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Disable);
        assert_eq!(t.config.get_user(), Some("z"));
        assert!(
            t.summary.ends_with("; no TLS (sslmode=disable)"),
            "{}",
            t.summary
        );
    }

    #[test]
    fn several_hosts_default_to_read_write_unless_told() {
        let env = with_env(&[("USER", "u")]);
        let attrs = |s: &str, env: &dyn Fn(&str) -> Option<String>| {
            let t = resolve_from(Some(s), env).unwrap();
            (t.config.get_target_session_attrs(), t.summary)
        };
        for s in [
            "host=a,b",
            "host=a,b port=1,2",
            "postgresql://a:1,b:2/db",
            "hostaddr=10.0.0.1,10.0.0.2",
            "host=a,b target_session_attrs=read-write",
            "host=a,b target_session_attrs=primary",
        ] {
            let (a, summary) = attrs(s, &env);
            assert_eq!(a, TargetSessionAttrs::ReadWrite, "{s}");
            assert!(
                summary.contains("primaries only: a standby is skipped"),
                "{s}: {summary}"
            );
            assert_eq!(
                summary.contains("(the default with several hosts)"),
                !s.contains("target_session_attrs"),
                "{s}: {summary}"
            );
        }
        // One host, libpq's default sockets, or an explicit value: as given
        // (libpq's default `any`).
        for s in [
            "host=a",
            "user=u",
            "host=a,b target_session_attrs=any",
            "postgresql://a,b/db?target_session_attrs=any",
        ] {
            let (a, summary) = attrs(s, &env);
            assert_eq!(a, TargetSessionAttrs::Any, "{s}");
            assert!(!summary.contains("read-write"), "{s}: {summary}");
        }
        // The variables: hosts from PGHOST count; PGTARGETSESSIONATTRS wins.
        let env = with_env(&[("USER", "u"), ("PGHOST", "a,b")]);
        assert_eq!(attrs("", &env).0, TargetSessionAttrs::ReadWrite);
        let env = with_env(&[
            ("USER", "u"),
            ("PGHOST", "a,b"),
            ("PGTARGETSESSIONATTRS", "any"),
        ]);
        assert_eq!(attrs("", &env).0, TargetSessionAttrs::Any);
        // The string's keyword wins over the variable.
        assert_eq!(
            attrs("target_session_attrs=read-write", &env).0,
            TargetSessionAttrs::ReadWrite
        );
    }

    #[test]
    fn libpq_variables_fill_in() {
        let env = with_env(&[
            ("USER", "u"),
            ("PGAPPNAME", "mine"),
            ("PGCONNECT_TIMEOUT", "1"),
            ("PGTARGETSESSIONATTRS", "primary"),
        ]);
        let t = resolve_from(Some("host=h"), &env).unwrap();
        assert_eq!(t.config.get_application_name(), Some("mine"));
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&Duration::from_secs(2))
        );
        assert_eq!(
            t.config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        let t = resolve_from(Some("host=h application_name=s connect_timeout=7"), &env).unwrap();
        assert_eq!(t.config.get_application_name(), Some("s"));
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&Duration::from_secs(7))
        );
        let env2 = with_env(&[
            ("USER", "u"),
            ("PGHOSTADDR", "127.0.0.1"),
            ("PGOPTIONS", "-c work_mem=8MB"),
            ("PGCHANNELBINDING", "disable"),
        ]);
        let t = resolve_from(Some("keepalives_count=4"), &env2).unwrap();
        assert_eq!(
            t.config.get_hostaddrs(),
            ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
        // A bare hostaddr: the address is also the TLS name (libpq does TLS
        // without one; tokio-postgres wants one).
        assert_eq!(t.config.get_hosts(), [Host::Tcp("127.0.0.1".to_owned())]);
        assert_eq!(t.config.get_options(), Some("-c work_mem=8MB"));
        assert_eq!(t.config.get_keepalives_retries(), Some(4));
        assert_eq!(
            t.config.get_channel_binding(),
            tokio_postgres::config::ChannelBinding::Disable
        );
        let t = resolve_from(Some("host=h channel_binding=require"), &env2).unwrap();
        assert_eq!(
            t.config.get_channel_binding(),
            tokio_postgres::config::ChannelBinding::Require
        );
        let e = resolve_from(Some("host=h target_session_attrs=standby"), &env)
            .err()
            .unwrap();
        assert!(e.contains("needs the primary"), "{e}");
    }

    #[test]
    fn the_password_file_is_read_when_no_password_is_given() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lease-conn-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pass");
        std::fs::write(&path, "h:5432:d:u:FromPassFile\\1\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file = path.display().to_string();
        let env = with_env(&[("PGPASSFILE", &file)]);
        let t = resolve_from(Some("host=h user=u dbname=d"), &env).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"FromPassFile1"[..]));
        assert_eq!(redact("x FromPassFile1"), "x ***");
        let t = resolve_from(Some("host=h user=u dbname=d password=given"), &env).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"given"[..]));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let t = resolve_from(
            Some(&format!("host=h user=u dbname=d passfile={file}")),
            &with_env(&[]),
        )
        .unwrap();
        assert_eq!(t.config.get_password(), None);
        assert!(
            t.warnings[0].contains("group or world access"),
            "{:?}",
            t.warnings
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Where a password was looked for, named when none was found.
    #[test]
    fn the_password_search_names_where_it_looked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lease-conn-search-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing").display().to_string();
        let env = with_env(&[("PGPASSFILE", &missing)]);
        let t = resolve_from(Some("host=h user=u dbname=d"), &env).unwrap();
        assert_eq!(
            t.password_search(),
            Some(&*format!(
                "no password in --database-url, nor in PGPASSWORD, nor in the password file \
                 {missing} (PGPASSFILE; no such file)"
            ))
        );
        let path = dir.join("pass");
        std::fs::write(&path, "other:5432:d:u:Nope\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file = path.display().to_string();
        let t = resolve_from(
            Some(&format!("host=h user=u dbname=d passfile={file}")),
            &with_env(&[]),
        )
        .unwrap();
        let search = t.password_search().unwrap();
        assert!(
            search.ends_with("(passfile in --database-url; no line matches)"),
            "{search}"
        );
        let t = resolve_from(None, &with_env(&[("USER", "u"), ("HOME", "/nonexistent")])).unwrap();
        assert_eq!(
            t.password_search(),
            Some("no password in PGPASSWORD, nor in the password file /nonexistent/.pgpass (the default; no such file)")
        );
        let t = resolve_from(None, &with_env(&[("USER", "u")])).unwrap();
        assert!(t
            .password_search()
            .unwrap()
            .ends_with("neither PGPASSFILE nor HOME is set)"));
        let t = resolve_from(Some("host=h user=u password=given"), &env).unwrap();
        assert_eq!(t.password_search(), None);
        let t = resolve_from(Some("host=h user=u"), &with_env(&[("PGPASSWORD", "pw")])).unwrap();
        assert_eq!(t.password_search(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_strings_are_refused_without_the_password() {
        let none = with_env(&[("USER", "u")]);
        // After a password, a word may be a piece of it: its place is named.
        let e = resolve_from(Some("host=h password=SECRETKV bogus=1"), &none).unwrap_err();
        assert!(e.contains("unknown keyword at character 26"), "{e}");
        assert!(!e.contains("SECRETKV") && !e.contains("bogus"), "{e}");
        let e = resolve_from(Some("host=h password=SECRETKV sslmod=require"), &none).unwrap_err();
        assert!(e.contains("(did you mean `sslmode`? or not shown"), "{e}");
        let e = resolve_from(Some("host=h bogus=1 password=SECRETKV"), &none).unwrap_err();
        assert!(e.contains("unknown keyword `bogus`"), "{e}");
        let e = resolve_from(Some("postgres://u:SECRETURL@h:notaport/db"), &none).unwrap_err();
        assert!(!e.contains("SECRETURL"), "{e}");
        assert_eq!(redact("x SECRETURL SECRETKV"), "x *** ***");
        let e = resolve_from(Some("host=x password Zecret"), &none).unwrap_err();
        assert!(e.contains("expected `=`") && !e.contains('Z'), "{e}");
        let e = resolve_from(Some("host=a,b port=1,2,3"), &none).unwrap_err();
        assert!(e.contains("ports"), "{e}");
    }

    #[test]
    fn keywords_are_named_in_errors() {
        let none = with_env(&[("USER", "u")]);
        let e = resolve(Some("host=h usr=app"), "the string", &none).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownKeyword);
        assert_eq!(e.keyword(), Some("usr"));
        assert_eq!(
            e.to_string(),
            "unknown keyword `usr` in the string (did you mean `user`?)"
        );
        let e = resolve(Some("postgres://h/db?sslmod=require"), "X", &none).unwrap_err();
        assert_eq!(
            (e.kind(), e.keyword()),
            (ErrorKind::UnknownKeyword, Some("sslmod"))
        );
        let e = resolve(Some("host=h service=prod"), "X", &none).unwrap_err();
        assert_eq!(
            (e.kind(), e.keyword()),
            (ErrorKind::Unsupported, Some("service"))
        );
        assert!(
            e.to_string().contains("service files are not supported"),
            "{e}"
        );
        let e = resolve(None, "X", &with_env(&[("PGSERVICE", "prod")])).unwrap_err();
        assert_eq!(e.keyword(), Some("PGSERVICE"));
        let e = resolve(Some("host=h port=x5"), "X", &none).unwrap_err();
        assert_eq!(
            (e.kind(), e.keyword()),
            (ErrorKind::InvalidValue, Some("port"))
        );
        assert!(e.to_string().contains("\"x5\""), "{e}");
        let e = resolve(Some("host=h sslmode=verify_full"), "X", &none).unwrap_err();
        assert_eq!(
            (e.kind(), e.keyword()),
            (ErrorKind::InvalidValue, Some("sslmode"))
        );
        let e = resolve(Some("host=h gssencmode=disable"), "X", &none).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
    }

    #[test]
    fn debug_and_display_never_show_the_password() {
        let none = with_env(&[("USER", "u")]);
        let t = resolve(
            Some("host=h password=Sekrit-991 sslmode=disable"),
            "X",
            &none,
        )
        .unwrap();
        for text in [format!("{t:?}"), t.to_string()] {
            assert!(!text.contains("Sekrit-991"), "{text}");
            assert!(text.contains("host h"), "{text}");
        }
    }
}
