//! The connection: `--database-url`, `DATABASE_URL` or the libpq environment,
//! resolved into a [`tokio_postgres::Config`]; and the redaction of passwords
//! from everything `lease` prints.
//!
//! Resolution follows libpq where tokio-postgres allows it: the string (URL or
//! `key=value`) wins, the `PG*` environment fills in what it leaves out, then
//! libpq's defaults (Unix socket in `/var/run/postgresql`, then `/tmp`; port
//! 5432; user = the OS user; dbname = the user). TLS is not compiled in:
//! `sslmode` `disable`, `allow` and `prefer` connect without it, `require` and
//! stronger are refused up front.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use tokio_postgres::config::{Host, SslMode, SslNegotiation};
use tokio_postgres::Config;

use crate::args::ConnArgs;

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
#[derive(Debug, Clone)]
pub struct Target {
    /// The configuration to connect with (no TLS: `sslmode` is `disable` or
    /// `prefer`).
    pub config: Config,
    /// Where it points, for log lines: hosts, ports, database, user. Never the
    /// password.
    pub summary: String,
}

/// Resolves the connection from the arguments and the process environment.
///
/// # Errors
/// A one-line message (never containing the password) for an unparsable
/// string, an unsupported `sslmode`, or inconsistent hosts and ports.
pub fn resolve(args: &ConnArgs) -> Result<Target, String> {
    resolve_from(args.database_url.as_deref(), &env)
}

/// A non-empty environment variable.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

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
    let (mut config, sslmode) = match string {
        Some(s) => parse(s, origin)?,
        None => (Config::new(), None),
    };
    if let Some(password) = lookup("PGPASSWORD") {
        add_secret(&password);
        if config.get_password().is_none() {
            config.password(password);
        }
    }

    // sslmode: the string's, else PGSSLMODE, else libpq's default (prefer).
    let (sslmode, sslmode_origin) = match sslmode {
        Some(mode) => (Some(mode), origin),
        None => (lookup("PGSSLMODE"), "PGSSLMODE"),
    };
    let mode = match sslmode.as_deref() {
        None | Some("prefer") => SslMode::Prefer,
        Some("disable" | "allow") => SslMode::Disable,
        Some(m @ ("require" | "verify-ca" | "verify-full")) => {
            return Err(format!(
                "sslmode={m} (from {sslmode_origin}) needs TLS, which this build of lease does not \
                 have; use sslmode=disable or prefer, or reach the server over a trusted network"
            ))
        }
        Some(other) => {
            return Err(format!(
                "invalid sslmode {other:?} in {sslmode_origin}: expected disable, allow, prefer, \
                 require, verify-ca or verify-full"
            ))
        }
    };
    config.ssl_mode(mode);
    if config.get_ssl_negotiation() == SslNegotiation::Direct {
        return Err(format!(
            "sslnegotiation=direct (in {origin}) needs TLS, which this build of lease does not have"
        ));
    }

    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        match lookup("PGHOST") {
            Some(hosts) => {
                for host in hosts.split(',') {
                    if host.is_empty() {
                        default_hosts(&mut config);
                    } else {
                        config.host(host);
                    }
                }
            }
            None => default_hosts(&mut config),
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
    let summary = summary(&config);
    Ok(Target { config, summary })
}

/// libpq's default: the Unix socket in `/var/run/postgresql`, then `/tmp`
/// (tokio-postgres tries hosts in order).
fn default_hosts(config: &mut Config) {
    config.host_path(PathBuf::from("/var/run/postgresql"));
    config.host_path(PathBuf::from("/tmp"));
}

/// Parses a URL or `key=value` string; returns the config and the `sslmode`
/// it named (taken out of the string: tokio-postgres does not know `allow`
/// and `verify-*`, and the mode is applied by the caller).
fn parse(s: &str, origin: &str) -> Result<(Config, Option<String>), String> {
    for secret in raw_passwords(s) {
        add_secret(&secret);
    }
    let (rest, sslmode) = take_sslmode(s);
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
    Ok((config, sslmode))
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

/// Removes every `sslmode` parameter from `s` and returns the last value.
fn take_sslmode(s: &str) -> (String, Option<String>) {
    if let Some(rest) = strip_url_prefix(s) {
        let Some(q) = url_query_start(rest) else {
            return (s.to_owned(), None);
        };
        let prefix_len = s.len() - rest.len();
        let mut mode = None;
        let kept: Vec<&str> = rest[q + 1..]
            .split('&')
            .filter(|param| match param.split_once('=') {
                Some((k, v)) if percent_decode(k) == "sslmode" => {
                    mode = Some(percent_decode(v));
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
        (out, mode)
    } else {
        // Unparsable strings are left to tokio-postgres, which explains why.
        let Some(params) = kv_params(s) else {
            return (s.to_owned(), None);
        };
        let mut out = String::new();
        let mut last = 0;
        let mut mode = None;
        for p in params.into_iter().filter(|p| p.key == "sslmode") {
            out.push_str(&s[last..p.span.0]);
            last = p.span.1;
            mode = Some(p.value);
        }
        out.push_str(&s[last..]);
        (out, mode)
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
        let e = resolve_from(Some("host=h sslmode=require"), &none).unwrap_err();
        assert!(e.contains("needs TLS"), "{e}");
        let e = resolve_from(Some("postgres://h/db?sslmode=verify-full"), &none).unwrap_err();
        assert!(e.contains("needs TLS"), "{e}");
        let e = resolve_from(None, &with_env(&[("PGSSLMODE", "require")])).unwrap_err();
        assert!(e.contains("PGSSLMODE"), "{e}");
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
