//! The connection: `--database-url`, `DATABASE_URL` or the libpq environment,
//! resolved into a [`tokio_postgres::Config`] and a TLS connector; and the
//! redaction of passwords from everything `lease` prints.
//!
//! Resolution follows libpq where tokio-postgres allows it: the string (URL or
//! `key=value`) wins, the `PG*` environment fills in what it leaves out, then
//! libpq's defaults (Unix socket in `/var/run/postgresql`, then `/tmp`; port
//! 5432; user = the OS user; dbname = the user; `sslmode=prefer`; the password
//! from `~/.pgpass`). The keywords tokio-postgres does not know (`sslrootcert`,
//! `sslcert`, `sslkey`, `passfile`, libpq's `sslmode` and
//! `target_session_attrs` values) are taken out of the string and applied
//! here. TLS: see [`crate::tls`]. lease-cli/README.md has the table of every
//! libpq variable and keyword.
//!
//! One deliberate difference: with several hosts named and no
//! `target_session_attrs`, sessions are `read-write` (libpq: `any`), so that a
//! standby early in a failover list is skipped for the primary instead of
//! being retried forever; an explicit value wins.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio_postgres::config::{Host, SslMode, SslNegotiation, TargetSessionAttrs};
use tokio_postgres::Config;

use crate::args::ConnArgs;
use crate::{pgpass, tls};

/// Passwords shorter than this are not redacted from output: replacing every
/// occurrence of a one- or two-character string would garble every line, and
/// the password is never formatted into a line in the first place (redaction
/// is the second line of defence).
const MIN_REDACTED_LEN: usize = 3;

static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Registers a secret that must never be printed: [`redact`] replaces it.
pub fn add_secret(secret: &str) {
    if secret.len() < MIN_REDACTED_LEN {
        return;
    }
    let mut secrets = SECRETS.lock().unwrap_or_else(PoisonError::into_inner);
    if !secrets.iter().any(|s| s == secret) {
        secrets.push(secret.to_owned());
        // Longest first, so that a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every registered secret replaced by `***`.
pub fn redact(text: &str) -> String {
    let secrets = SECRETS.lock().unwrap_or_else(PoisonError::into_inner);
    let mut out = text.to_owned();
    for secret in secrets.iter() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

/// A resolved connection.
#[derive(Clone)]
pub struct Target {
    /// The configuration to connect with.
    pub config: Config,
    /// The TLS connector to connect with (whatever the mode: tokio-postgres
    /// does not call it for `disable`).
    pub tls: tls::Connector,
    /// Where it points, for log lines: hosts, ports, database, user, and
    /// whether TLS is used and what it verifies. Never the password.
    pub summary: String,
    /// What the user should know but that does not stop `lease` (a password
    /// file with group or world access, ignored as libpq does): to log.
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The summary, not the config: nothing that could hold a secret.
        f.debug_struct("Target")
            .field("summary", &self.summary)
            .field("warnings", &self.warnings)
            .finish_non_exhaustive()
    }
}

/// Connects to `target` like the lease session does: each host in turn, each
/// within its share of `timeout` (lease-driver's docs, "Several hosts"), so a
/// host that accepts connections but never answers costs only its share.
/// The connection runs on a spawned task; its handle comes back with the
/// client. `Err` is the last host's error chain (not yet redacted).
pub async fn connect(
    target: &Target,
    timeout: Duration,
) -> Result<
    (
        tokio_postgres::Client,
        tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    ),
    String,
> {
    let hosts = lease_driver::hosts(&target.config, timeout);
    let mut error = "no host given".to_owned();
    for (host, share) in hosts {
        let attempt = host.connect(target.tls.clone());
        let result = match share {
            Some(share) => match tokio::time::timeout(share, attempt).await {
                Ok(r) => r.map_err(|e| error_chain(&e)),
                Err(_) => Err(format!(
                    "connection attempt timed out after {} ms",
                    share.as_millis()
                )),
            },
            None => attempt.await.map_err(|e| error_chain(&e)),
        };
        match result {
            Ok((client, connection)) => return Ok((client, tokio::spawn(connection))),
            Err(e) => error = e,
        }
    }
    Err(error)
}

/// Resolves the connection from the arguments and the process environment.
///
/// # Errors
/// A one-line message (never containing the password) for an unparsable
/// string, an unsupported setting, an unreadable certificate or key, or
/// inconsistent hosts and ports.
pub fn resolve(args: &ConnArgs) -> Result<Target, String> {
    resolve_from(args.database_url.as_deref(), &env)
}

/// A non-empty environment variable.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The libpq keywords taken out of the string before tokio-postgres parses
/// it: it does not know them, or not all of their values.
const TAKEN: [&str; 7] = [
    "keepalives_count",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "passfile",
    "target_session_attrs",
];

/// [`resolve`] with an explicit environment (`lookup` returns non-empty values
/// only), for tests.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_from(
    url: Option<&str>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Target, String> {
    let from_env;
    let (string, origin) = match url {
        Some(u) => (Some(u), "--database-url"),
        None => {
            from_env = lookup("DATABASE_URL");
            (from_env.as_deref(), "DATABASE_URL")
        }
    };
    let (mut config, taken) = match string {
        Some(s) => parse(s, origin)?,
        None => (Config::new(), Vec::new()),
    };
    // A keyword from the string, else its environment variable: the value
    // and where it came from.
    let setting = |key: &str, var: &'static str| -> Option<(String, String)> {
        match taken.iter().rev().find(|(k, _)| k == key) {
            Some((_, v)) => Some((v.clone(), format!("{key} in {origin}"))),
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
        if let Some(name) = lookup("PGAPPNAME") {
            config.application_name(name);
        }
    }
    if config.get_options().is_none() {
        if let Some(options) = lookup("PGOPTIONS") {
            config.options(options);
        }
    }
    // Variables tokio-postgres parses as keywords: applied when the string
    // does not give them (the string's values are not readable back for
    // every keyword, so the string is re-parsed with the variable first).
    for (var, key) in [
        ("PGCHANNELBINDING", "channel_binding"),
        ("PGLOADBALANCEHOSTS", "load_balance_hosts"),
        ("PGSSLNEGOTIATION", "sslnegotiation"),
    ] {
        let in_string = string.is_some_and(|s| mentions(s, key));
        if let (false, Some(value)) = (in_string, lookup(var)) {
            let one: Config = format!("{key}={value}")
                .parse()
                .map_err(|_| format!("invalid {var} {value:?}"))?;
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
    if let Some((_, count)) = taken.iter().rev().find(|(k, _)| k == "keepalives_count") {
        let n = count
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("invalid keepalives_count {count:?} in {origin}"))?;
        config.keepalives_retries(n);
    }
    if config.get_connect_timeout().is_none() {
        if let Some(t) = lookup("PGCONNECT_TIMEOUT") {
            let secs = t
                .trim()
                .parse::<i64>()
                .map_err(|_| format!("invalid PGCONNECT_TIMEOUT {t:?}: expected seconds"))?;
            // libpq: zero or less waits forever; 1 means 2.
            if secs > 0 {
                config.connect_timeout(Duration::from_secs(secs.max(2) as u64));
            }
        }
    }
    let attrs = setting("target_session_attrs", "PGTARGETSESSIONATTRS");
    if let Some((attrs, attrs_origin)) = &attrs {
        config.target_session_attrs(match attrs.as_str() {
            "any" => TargetSessionAttrs::Any,
            // A primary is what the core needs anyway (it refuses a standby);
            // read-write also skips a primary with default_transaction_read_only.
            "read-write" | "primary" => TargetSessionAttrs::ReadWrite,
            "read-only" | "standby" | "prefer-standby" => {
                return Err(format!(
                    "target_session_attrs={attrs} (from {attrs_origin}): a lease needs the \
                     primary (a standby cannot take advisory locks); use any, read-write or \
                     primary"
                ))
            }
            other => {
                return Err(format!(
                    "invalid target_session_attrs {other:?} in {attrs_origin}: expected any, \
                     read-write, primary, read-only, standby or prefer-standby"
                ))
            }
        });
    }

    // Whether no host was named at all (libpq's default sockets).
    let mut default_host = false;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        let addrs = lookup("PGHOSTADDR");
        for addr in addrs.iter().flat_map(|a| a.split(',')) {
            let ip = addr
                .trim()
                .parse()
                .map_err(|_| format!("invalid address {addr:?} in PGHOSTADDR"))?;
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
                        p => p
                            .parse::<u16>()
                            .ok()
                            .filter(|&p| p != 0)
                            .ok_or_else(|| format!("invalid port {p:?} in PGPORT"))?,
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
    // `any`. With `any` a standby listed first (or a demoted old primary)
    // would be connected to and retried forever while the primary is down the
    // list; read-write moves on to the next host. An explicit value wins.
    let several = hosts > 1 && !default_host;
    if attrs.is_none() && several {
        config.target_session_attrs(TargetSessionAttrs::ReadWrite);
    }
    let ports = config.get_ports().len();
    if ports != 1 && ports != hosts {
        return Err(format!(
            "{ports} ports for {hosts} hosts: give one port, or one per host"
        ));
    }
    if config.get_user().is_none() {
        let user = lookup("PGUSER")
            .or_else(|| lookup("USER"))
            .or_else(os_user)
            .ok_or_else(|| {
                "no database user: set PGUSER or give user= in the connection string".to_owned()
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
    if config.get_password().is_none() {
        let passfile = setting("passfile", "PGPASSFILE")
            .map(|(p, _)| PathBuf::from(p))
            .or_else(|| home.as_ref().map(|h| h.join(".pgpass")));
        if let Some(path) = passfile {
            match pgpass::lookup(&path, &config) {
                Ok(Some(password)) => {
                    add_secret(&password);
                    config.password(password);
                }
                Ok(None) => {}
                Err(pgpass::Skipped(why)) => warnings.push(why),
            }
        }
    }

    let tls = tls_settings(&setting, home.as_deref())?;
    config.ssl_mode(tls.mode.ssl_mode());
    if config.get_ssl_negotiation() == SslNegotiation::Direct
        && tls.mode.ssl_mode() != SslMode::Require
    {
        return Err(format!(
            "sslnegotiation=direct (in {origin}) needs sslmode=require, verify-ca or verify-full"
        ));
    }
    let connector = tls.connector()?;
    let mut summary = summary(&config);
    if config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite {
        summary.push_str(match attrs {
            Some(_) => ", read-write sessions only",
            None => ", read-write sessions only (the default with several hosts)",
        });
    }
    let summary = format!("{summary}; {}", tls.describe());
    Ok(Target {
        config,
        tls: connector,
        summary,
        warnings,
    })
}

/// A keyword's value and where it came from, given the keyword and its
/// environment variable.
type Setting<'a> = dyn Fn(&str, &'static str) -> Option<(String, String)> + 'a;

/// The TLS settings: each from the string, else its variable, else libpq's
/// default (`prefer`; the files in `~/.postgresql` when they exist).
fn tls_settings(setting: &Setting<'_>, home: Option<&Path>) -> Result<tls::Settings, String> {
    let dot = |file: &str| home.map(|h| h.join(".postgresql").join(file));
    let roots = match setting("sslrootcert", "PGSSLROOTCERT") {
        Some((v, _)) if v == "system" => Some(tls::Roots::System),
        Some((v, _)) => Some(tls::Roots::File(PathBuf::from(v))),
        None => dot("root.crt")
            .filter(|p| p.is_file())
            .map(tls::Roots::File),
    };
    let mode = match setting("sslmode", "PGSSLMODE") {
        Some((m, mode_origin)) => {
            let mode = tls::Mode::parse(&m).ok_or_else(|| {
                format!(
                    "invalid sslmode {m:?} in {mode_origin}: expected disable, allow, prefer, \
                     require, verify-ca or verify-full"
                )
            })?;
            // libpq: the whole public web's CAs prove nothing without the
            // host name check.
            if roots == Some(tls::Roots::System) && mode != tls::Mode::VerifyFull {
                return Err(format!(
                    "weak sslmode={m} (from {mode_origin}) may not be used with \
                     sslrootcert=system (use verify-full)"
                ));
            }
            mode
        }
        None if roots == Some(tls::Roots::System) => tls::Mode::VerifyFull,
        None => tls::Mode::Prefer,
    };
    let cert = setting("sslcert", "PGSSLCERT");
    let key = setting("sslkey", "PGSSLKEY");
    let client = match (cert, key) {
        (Some((c, _)), Some((k, _))) => Some((PathBuf::from(c), PathBuf::from(k))),
        (Some((c, _)), None) => {
            let k = dot("postgresql.key").ok_or_else(|| {
                "sslcert is given without sslkey, and there is no home directory for the \
                 default ~/.postgresql/postgresql.key"
                    .to_owned()
            })?;
            Some((PathBuf::from(c), k))
        }
        (None, Some((k, key_origin))) => match dot("postgresql.crt").filter(|p| p.is_file()) {
            Some(c) => Some((c, PathBuf::from(k))),
            None => {
                return Err(format!(
                    "sslkey (from {key_origin}) is given without sslcert"
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
    })
}

/// Whether the connection string names `key` (as a `key=` parameter or a
/// URL query parameter); a rough check, enough to let the string win.
fn mentions(s: &str, key: &str) -> bool {
    let needle = format!("{key}=");
    s.match_indices(&needle)
        .any(|(i, _)| i == 0 || matches!(s.as_bytes()[i - 1], b' ' | b'\t' | b'?' | b'&'))
}

/// libpq's default: the Unix socket in `/var/run/postgresql`, then `/tmp`
/// (tokio-postgres tries hosts in order).
fn default_hosts(config: &mut Config) {
    config.host_path(PathBuf::from("/var/run/postgresql"));
    config.host_path(PathBuf::from("/tmp"));
}

/// Parses a URL or `key=value` string; returns the config and the
/// [`TAKEN`] keywords it named (taken out of the string, in order).
fn parse(s: &str, origin: &str) -> Result<(Config, Vec<(String, String)>), String> {
    for secret in raw_passwords(s) {
        add_secret(&secret);
    }
    let (rest, taken) = take_params(s, &TAKEN);
    let config = rest.parse::<Config>().map_err(|e| {
        // The error never quotes the string; redact anyway, and keep one line.
        let mut msg = redact(&error_chain(&e)).replace(['\r', '\n'], " ");
        // "unexpected character ... but got `c`" may quote a password's first
        // character: drop the quote.
        if let Some(i) = msg.find(" but got") {
            msg.truncate(i);
        }
        format!("cannot parse the connection string from {origin}: {msg}")
    })?;
    if let Some(p) = config.get_password() {
        add_secret(&String::from_utf8_lossy(p));
    }
    Ok((config, taken))
}

/// An error and its sources, `: `-separated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The password as written in a URL (`scheme://user:PASSWORD@host`) and in
/// `password=` parameters, before any decoding: what could be echoed.
fn raw_passwords(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(rest) = strip_url_prefix(s) {
        if let Some(at) = rest.find('@') {
            if let Some((_, pw)) = rest[..at].split_once(':') {
                out.push(pw.to_owned());
                out.push(percent_decode(pw));
            }
        }
        if let Some(q) = url_query_start(rest) {
            for param in rest[q + 1..].split('&') {
                if let Some((k, v)) = param.split_once('=') {
                    if percent_decode(k) == "password" {
                        out.push(v.to_owned());
                        out.push(percent_decode(v));
                    }
                }
            }
        }
    } else if let Some(params) = kv_params(s) {
        for p in params {
            if p.key == "password" {
                out.push(p.value);
                out.push(s[p.value_span.0..p.value_span.1].to_owned());
            }
        }
    }
    out
}

fn strip_url_prefix(s: &str) -> Option<&str> {
    s.strip_prefix("postgres://")
        .or_else(|| s.strip_prefix("postgresql://"))
}

/// Where the query string of a URL (without its scheme) starts: the first `?`
/// after the credentials.
fn url_query_start(rest: &str) -> Option<usize> {
    let start = rest.find('@').map_or(0, |at| at + 1);
    rest[start..].find('?').map(|q| q + start)
}

/// Removes every parameter named in `keys` from `s`; returns the rest and
/// the removed `(key, value)` pairs in order.
fn take_params(s: &str, keys: &[&str]) -> (String, Vec<(String, String)>) {
    let mut taken = Vec::new();
    if let Some(rest) = strip_url_prefix(s) {
        let Some(q) = url_query_start(rest) else {
            return (s.to_owned(), taken);
        };
        let prefix_len = s.len() - rest.len();
        let kept: Vec<&str> = rest[q + 1..]
            .split('&')
            .filter(|param| match param.split_once('=') {
                Some((k, v)) if keys.contains(&percent_decode(k).as_str()) => {
                    taken.push((percent_decode(k), percent_decode(v)));
                    false
                }
                _ => true,
            })
            .collect();
        let head = &s[..prefix_len + q];
        let out = if kept.is_empty() {
            head.to_owned()
        } else {
            format!("{head}?{}", kept.join("&"))
        };
        (out, taken)
    } else {
        // Unparsable strings are left to tokio-postgres, which explains why.
        let Some(params) = kv_params(s) else {
            return (s.to_owned(), taken);
        };
        let mut out = String::new();
        let mut last = 0;
        for p in params
            .into_iter()
            .filter(|p| keys.contains(&p.key.as_str()))
        {
            out.push_str(&s[last..p.span.0]);
            last = p.span.1;
            taken.push((p.key, p.value));
        }
        out.push_str(&s[last..]);
        (out, taken)
    }
}

/// One `key=value` parameter, with byte spans into the string.
struct KvParam {
    key: String,
    value: String,
    /// The whole parameter.
    span: (usize, usize),
    /// The value as written (inside quotes, if quoted).
    value_span: (usize, usize),
}

/// Tokenises a libpq `key=value` string the way tokio-postgres does; `None`
/// if it does not parse.
fn kv_params(s: &str) -> Option<Vec<KvParam>> {
    let b: Vec<(usize, char)> = s.char_indices().collect();
    let at = |i: usize| b.get(i).map_or(s.len(), |&(o, _)| o);
    let mut i = 0;
    let mut out = Vec::new();
    loop {
        while b.get(i).is_some_and(|(_, c)| c.is_whitespace()) {
            i += 1;
        }
        if i >= b.len() {
            return Some(out);
        }
        let start = i;
        while b
            .get(i)
            .is_some_and(|&(_, c)| !c.is_whitespace() && c != '=')
        {
            i += 1;
        }
        let key = s[at(start)..at(i)].to_owned();
        while b.get(i).is_some_and(|(_, c)| c.is_whitespace()) {
            i += 1;
        }
        if b.get(i).map(|&(_, c)| c) != Some('=') {
            return None;
        }
        i += 1;
        while b.get(i).is_some_and(|(_, c)| c.is_whitespace()) {
            i += 1;
        }
        let mut value = String::new();
        let value_start;
        let value_end;
        if b.get(i).map(|&(_, c)| c) == Some('\'') {
            i += 1;
            value_start = at(i);
            loop {
                match b.get(i).map(|&(_, c)| c) {
                    None => return None,
                    Some('\'') => break,
                    Some('\\') => {
                        i += 1;
                        if let Some(&(_, c)) = b.get(i) {
                            value.push(c);
                            i += 1;
                        }
                    }
                    Some(c) => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
            value_end = at(i);
            i += 1;
        } else {
            value_start = at(i);
            while let Some(&(_, c)) = b.get(i) {
                if c.is_whitespace() {
                    break;
                }
                i += 1;
                if c == '\\' {
                    if let Some(&(_, c2)) = b.get(i) {
                        value.push(c2);
                        i += 1;
                    }
                } else {
                    value.push(c);
                }
            }
            value_end = at(i);
            if value.is_empty() {
                return None;
            }
        }
        out.push(KvParam {
            key,
            value,
            span: (at(start), at(i)),
            value_span: (value_start, value_end),
        });
    }
}

/// Decodes `%XX` escapes (invalid ones are kept as written).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The OS user name from the password database entry of the effective uid
/// (after `$USER`).
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
        let env = with_env(&[("PGHOST", "elsewhere"), ("DATABASE_URL", "host=ignored")]);
        let t = resolve_from(Some("postgres://bob:pw%41x@127.0.0.1:5433/db"), &env).unwrap();
        assert_eq!(hosts(&t.config), ["127.0.0.1"]);
        assert_eq!(t.config.get_ports(), [5433]);
        assert_eq!(t.config.get_password(), Some(&b"pwAx"[..]));
        let t = resolve_from(None, &env).unwrap();
        assert_eq!(hosts(&t.config), ["ignored"]);
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
                summary.contains("read-write sessions only"),
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
        assert!(t.config.get_hosts().is_empty());
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

    #[test]
    fn bad_strings_are_refused_without_the_password() {
        let none = with_env(&[("USER", "u")]);
        let e = resolve_from(Some("host=h password=SECRETKV bogus=1"), &none).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
        assert!(!e.contains("SECRETKV"), "{e}");
        let e = resolve_from(Some("postgres://u:SECRETURL@h:notaport/db"), &none).unwrap_err();
        assert!(!e.contains("SECRETURL"), "{e}");
        assert_eq!(redact("x SECRETURL SECRETKV"), "x *** ***");
        let e = resolve_from(Some("host=x password Zecret"), &none).unwrap_err();
        assert!(e.contains("expected `=`") && !e.contains('Z'), "{e}");
        let e = resolve_from(Some("host=a,b port=1,2,3"), &none).unwrap_err();
        assert!(e.contains("ports"), "{e}");
    }

    #[test]
    fn kv_tokeniser_matches_libpq_quoting() {
        let p = kv_params(r"a=1  b = 'x y\'z' c=d\ e").unwrap();
        let got: Vec<(&str, &str)> = p.iter().map(|p| (&*p.key, &*p.value)).collect();
        assert_eq!(got, [("a", "1"), ("b", "x y'z"), ("c", "d e")]);
        assert!(kv_params("a='open").is_none());
        assert!(kv_params("a").is_none());
        assert_eq!(percent_decode("a%20b%zz%4"), "a b%zz%4");
    }
}
