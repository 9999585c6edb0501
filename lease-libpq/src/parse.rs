//! The two forms of a connection string, tokenised as libpq does into
//! `(keyword, value)` parameters: `key=value` (values quoted with `'`,
//! `\` escapes) and the URL `postgres[ql]://[user[:password]@][host][:port][,...][/dbname][?k=v&...]`
//! (percent-encoded).

use crate::error::{err, ConninfoError, ErrorKind};
use crate::redact::add_secret;

/// One parameter of a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Param {
    pub key: String,
    pub value: String,
    /// The value as written (quoted or percent-encoded), for redaction.
    pub raw: String,
    /// Where it starts (1-based character), when its keyword and value may
    /// not be quoted in an error: it follows a password in the string (an
    /// unquoted password with spaces, a query-string password with `&`),
    /// so either may be a piece of it.
    pub hidden: Option<usize>,
}

/// The hint of an error that does not quote text that may hold a password.
pub(crate) const NOT_SHOWN: &str = "not shown: it follows a password and may be part of it; \
     quote a password with spaces or quotes in a key=value string (password='it\\'s a secret'), \
     and percent-encode `/`, `@`, `:` and `&` in a URL's password (%2F, %40, %3A, %26)";

/// The parameters of `s`, in order, a later one for the same keyword
/// replacing an earlier one (libpq's rule).
///
/// # Errors
/// [`ErrorKind::Syntax`], naming the parameter where it can.
pub(crate) fn params(s: &str, origin: &str) -> Result<Vec<Param>, ConninfoError> {
    if let Some(scheme) = mistyped_url_scheme(s) {
        // Only the scheme is quoted: what follows may hold a password.
        return Err(syntax(
            origin,
            None,
            &format!(
                "it starts with `{scheme}`, not a URL's `postgres://` or `postgresql://` (a \
                 mistyped URL?), nor a `key=value` string"
            ),
        ));
    }
    let all = match strip_url_prefix(s) {
        Some(rest) => url_params(rest, s.len() - rest.len(), origin)?,
        None => kv_params(s, origin)?,
    };
    let mut out: Vec<Param> = Vec::new();
    for p in all {
        out.retain(|q| q.key != p.key);
        out.push(p);
    }
    Ok(out)
}

/// The start of `s` when it looks like a URL whose scheme is mistyped
/// (`postgres//`, `postgres:/`, `postgresql:\\`): `postgres` or `postgresql`
/// followed by `:`, `/` or `\\` characters other than exactly `://`.
fn mistyped_url_scheme(s: &str) -> Option<&str> {
    let t = s.trim_start();
    let head = t.get(..10).filter(|h| h.eq_ignore_ascii_case("postgresql"));
    let head = head.or_else(|| t.get(..8).filter(|h| h.eq_ignore_ascii_case("postgres")))?;
    let rest = &t[head.len()..];
    let marks = rest.len() - rest.trim_start_matches([':', '/', '\\']).len();
    let scheme = &t[..head.len() + marks];
    (marks > 0 && !(rest.starts_with("://") && head.chars().all(|c| c.is_ascii_lowercase())))
        .then_some(scheme)
}

fn strip_url_prefix(s: &str) -> Option<&str> {
    s.strip_prefix("postgres://")
        .or_else(|| s.strip_prefix("postgresql://"))
}

fn syntax(origin: &str, keyword: Option<&str>, why: &str) -> ConninfoError {
    let message = format!("cannot parse the connection string from {origin}: {why}");
    match keyword {
        Some(k) => err(ErrorKind::Syntax, k, message),
        None => ConninfoError::new(ErrorKind::Syntax, None, message),
    }
}

/// Tokenises a libpq `key=value` string.
fn kv_params(s: &str, origin: &str) -> Result<Vec<Param>, ConninfoError> {
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    loop {
        while b.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        if i >= b.len() {
            return Ok(out);
        }
        let start = i;
        while b.get(i).is_some_and(|&c| !c.is_whitespace() && c != '=') {
            i += 1;
        }
        let key: String = b[start..i].iter().collect();
        // After a password, a word may be a piece of it (`password=correct
        // horse`, `password='it's'`): its place is named, not its text.
        let hidden = out
            .iter()
            .any(|p: &Param| p.key == "password")
            .then_some(start + 1);
        while b.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        if b.get(i) != Some(&'=') {
            // Never quote what follows: it may be a password.
            return Err(match hidden {
                Some(at) => syntax(
                    origin,
                    None,
                    &format!("expected `=` in the word at character {at} ({NOT_SHOWN})"),
                ),
                None => syntax(origin, Some(&key), &format!("expected `=` after `{key}`")),
            });
        }
        i += 1;
        while b.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        let mut value = String::new();
        let raw_start = i;
        if b.get(i) == Some(&'\'') {
            i += 1;
            loop {
                match b.get(i) {
                    None => {
                        return Err(match hidden {
                            Some(at) => syntax(
                                origin,
                                None,
                                &format!(
                                    "the quoted value of the parameter at character {at} is \
                                     not closed ({NOT_SHOWN})"
                                ),
                            ),
                            None => syntax(
                                origin,
                                Some(&key),
                                &format!("the quoted value of `{key}` is not closed"),
                            ),
                        })
                    }
                    Some('\'') => break,
                    Some('\\') => {
                        i += 1;
                        if let Some(&c) = b.get(i) {
                            value.push(c);
                            i += 1;
                        }
                    }
                    Some(&c) => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
            i += 1;
        } else {
            while let Some(&c) = b.get(i) {
                if c.is_whitespace() {
                    break;
                }
                i += 1;
                if c == '\\' {
                    if let Some(&c2) = b.get(i) {
                        value.push(c2);
                        i += 1;
                    }
                } else {
                    value.push(c);
                }
            }
        }
        let raw: String = b[raw_start..i].iter().collect();
        if key == "password" {
            // Registered now: a later error must not leave it unredacted.
            add_secret(&value);
            add_secret(&raw);
        }
        out.push(Param {
            key,
            value,
            raw,
            hidden,
        });
    }
}

/// Tokenises a URL without its scheme.
/// `scheme` is the length of the scheme (`postgres://`) before `rest`.
fn url_params(rest: &str, scheme: usize, origin: &str) -> Result<Vec<Param>, ConninfoError> {
    let mut out = Vec::new();
    let push = |key: &str, raw: &str, out: &mut Vec<Param>| {
        if key == "password" {
            // Registered now: a later error must not leave it unredacted.
            add_secret(&percent_decode(raw));
            add_secret(raw);
        }
        out.push(Param {
            key: key.to_owned(),
            value: percent_decode(raw),
            raw: raw.to_owned(),
            hidden: None,
        });
    };
    // Where `part` (a slice of `rest`) starts in the whole string, 1-based
    // characters (after the scheme's).
    let at = |part: &str| {
        let offset = part.as_ptr() as usize - rest.as_ptr() as usize;
        scheme + rest[..offset].chars().count() + 1
    };
    // libpq: the user info ends at the first `@`, unless a `/` comes first.
    let mut rest = rest;
    if let Some(at) = rest
        .find(['@', '/'])
        .filter(|&i| rest.as_bytes()[i] == b'@')
    {
        let userinfo = &rest[..at];
        rest = &rest[at + 1..];
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (userinfo, None),
        };
        if !user.is_empty() {
            push("user", user, &mut out);
        }
        if let Some(p) = password {
            push("password", p, &mut out);
        }
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (before_query, None),
    };
    // An `@` in the host or database part is a password's (`u:p@ss@h`,
    // `u:ab/cd@h`) more likely than a name's: refused, nothing quoted, since
    // libpq would read a piece of the password as a host, port or database
    // (and name it in errors and log lines).
    if before_query.contains('@') {
        return Err(syntax(
            origin,
            None,
            "the URL has an `@` in its host or database part (not shown: it may hold a piece of \
             the password): a password containing `/`, `@`, `:` or `&` must be percent-encoded \
             (%2F, %40, %3A, %26), as must an `@` in a host or database name",
        ));
    }
    if !authority.is_empty() {
        let (mut hosts, mut ports) = (Vec::new(), Vec::new());
        for one in authority.split(',') {
            let (host, port) = if let Some(v6) = one.strip_prefix('[') {
                let (h, after) = v6.split_once(']').ok_or_else(|| {
                    syntax(
                        origin,
                        Some("host"),
                        "an IPv6 address in the URL lacks its `]`",
                    )
                })?;
                let port = match after {
                    "" => "",
                    p => p.strip_prefix(':').ok_or_else(|| {
                        syntax(
                            origin,
                            Some("host"),
                            "unexpected text after an IPv6 address",
                        )
                    })?,
                };
                (h, port)
            } else {
                one.rsplit_once(':').unwrap_or((one, ""))
            };
            if !port.bytes().all(|b| b.is_ascii_digit()) {
                // Without user info, `user:password` reads as `host:port`.
                return Err(syntax(
                    origin,
                    Some("port"),
                    "a port in the URL is not a number (not shown: it may be a piece of a \
                     password): a password containing `/`, `@`, `:` or `&` must be \
                     percent-encoded (%2F, %40, %3A, %26)",
                ));
            }
            hosts.push(host);
            ports.push(port);
        }
        if hosts.iter().any(|h| !h.is_empty()) {
            push("host", &hosts.join(","), &mut out);
        }
        if ports.iter().any(|p| !p.is_empty()) {
            push("port", &ports.join(","), &mut out);
        }
    }
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        push("dbname", db, &mut out);
    }
    // An `@` anywhere in the query: the user info's password may run into
    // it (`u:p@s?x&y@h`), so no parameter is quoted.
    let mut after_password = query.is_some_and(|q| q.contains('@'));
    for param in query.into_iter().flat_map(|q| q.split('&')) {
        if param.is_empty() {
            continue;
        }
        // After `password=` (an unencoded `&` in it: `password=abc&def`),
        // a parameter is named by its place, never its text.
        let hidden = after_password.then(|| at(param));
        let (k, v) = param.split_once('=').ok_or_else(|| match hidden {
            Some(at) => syntax(
                origin,
                None,
                &format!("the URL parameter at character {at} has no `=` ({NOT_SHOWN})"),
            ),
            None => {
                let k = percent_decode(param);
                syntax(
                    origin,
                    Some(&k),
                    &format!("the URL parameter `{k}` has no `=`"),
                )
            }
        })?;
        let k = percent_decode(k);
        push(&k, v, &mut out);
        if let Some(p) = out.last_mut() {
            p.hidden = hidden;
        }
        after_password |= k == "password";
    }
    Ok(out)
}

/// Decodes `%XX` escapes (invalid ones are kept as written).
pub(crate) fn percent_decode(s: &str) -> String {
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

/// `value` quoted for a `key=value` string.
pub(crate) fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &str) -> Vec<(String, String)> {
        params(s, "test")
            .unwrap()
            .into_iter()
            .map(|p| (p.key, p.value))
            .collect()
    }

    fn p(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kv_quoting_matches_libpq() {
        assert_eq!(
            pairs(r"a=1  b = 'x y\'z' c=d\ e"),
            p(&[("a", "1"), ("b", "x y'z"), ("c", "d e")])
        );
        assert_eq!(pairs("a=1 a=2"), p(&[("a", "2")]));
        let e = params("a='open", "X").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Syntax);
        assert_eq!(e.keyword(), Some("a"));
        let e = params("host=x password Zecret", "X").unwrap_err();
        assert!(
            e.to_string().contains("expected `=` after `password`"),
            "{e}"
        );
        assert!(!e.to_string().contains('Z'), "{e}");
    }

    #[test]
    fn a_mistyped_url_scheme_is_named_without_what_follows() {
        for (s, scheme) in [
            ("postgres//u:Zecret@h/db", "postgres//"),
            ("postgresql//h/db", "postgresql//"),
            ("postgres:/u:Zecret@h/db", "postgres:/"),
            ("postgres:u:Zecret@h", "postgres:"),
            (" postgres:\\\\h/db", "postgres:\\\\"),
            ("POSTGRES://h/db", "POSTGRES://"),
        ] {
            let e = params(s, "X").unwrap_err().to_string();
            assert!(
                e.contains(&format!("it starts with `{scheme}`, not a URL's")),
                "{s}: {e}"
            );
            assert!(!e.contains('Z'), "{e}");
        }
        assert!(params("postgres://h/db", "X").is_ok());
        assert!(params("postgresql://h/db", "X").is_ok());
        assert!(params("host=postgres//x", "X").is_ok());
    }

    #[test]
    fn urls_split_into_keywords() {
        assert_eq!(
            pairs("postgres://bob:pw%41x@db1:5433,[::1]:6,db3/app?sslmode=require&application_name=a%20b"),
            p(&[
                ("user", "bob"),
                ("password", "pwAx"),
                ("host", "db1,::1,db3"),
                ("port", "5433,6,"),
                ("dbname", "app"),
                ("sslmode", "require"),
                ("application_name", "a b"),
            ])
        );
        assert_eq!(pairs("postgresql://"), p(&[]));
        assert_eq!(
            pairs("postgresql:///db?host=%2Ftmp"),
            p(&[("dbname", "db"), ("host", "/tmp")])
        );
        assert_eq!(
            pairs("postgres://u:a?b@h"),
            p(&[("user", "u"), ("password", "a?b"), ("host", "h")])
        );
        let e = params("postgres://h/db?sslmode", "X").unwrap_err();
        assert_eq!(e.keyword(), Some("sslmode"));
        assert_eq!(percent_decode("a%20b%zz%4"), "a b%zz%4");
        assert_eq!(quote(r"it's \ x"), r"'it\'s \\ x'");
    }
}
