//! The password file (`PGPASSFILE`, `passfile`, default `~/.pgpass`), read
//! as libpq reads it.
//!
//! Lines `hostname:port:database:username:password`; `#` starts a comment
//! line; a field of just `*` matches anything; `\:` and `\\` escape a colon
//! and a backslash; the first matching line wins. The file is ignored, with
//! a warning, if it is not a regular file or if group or world can read or
//! write it (permissions should be 0600 or less). A Unix-socket host matches
//! `localhost` when it is the default socket directory, else its path.
//! tokio-postgres has one password for every host: the first host (in
//! order) that has a matching line gives it.

use std::path::Path;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// The file was ignored: the warning to log.
#[derive(Debug)]
pub(crate) struct Skipped(pub String);

/// The socket directories libpq treats as "localhost" (its compiled-in
/// default: Debian's, and upstream's).
const DEFAULT_SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// The password for `config`'s hosts, ports, database and user in `path`.
/// A missing file is no password, silently (as in libpq).
///
/// # Errors
/// [`Skipped`] when the file exists but is not used.
pub(crate) fn lookup(path: &Path, config: &Config) -> Result<Option<String>, Skipped> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Err(Skipped(format!(
            "password file {} is not a plain file: ignored",
            path.display()
        )));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(Skipped(format!(
                "password file {} has group or world access; permissions should be u=rw (0600) \
                 or less: ignored",
                path.display()
            )));
        }
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        Skipped(format!(
            "password file {} cannot be read ({e}): ignored",
            path.display()
        ))
    })?;
    let user = config.get_user().unwrap_or_default();
    let dbname = config.get_dbname().unwrap_or_default();
    let ports = config.get_ports();
    let hosts: Vec<String> = if config.get_hosts().is_empty() {
        config
            .get_hostaddrs()
            .iter()
            .map(ToString::to_string)
            .collect()
    } else {
        config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(h) => h.clone(),
                Host::Unix(p) => {
                    let p = p.display().to_string();
                    if DEFAULT_SOCKET_DIRS.contains(&p.as_str()) {
                        "localhost".to_owned()
                    } else {
                        p
                    }
                }
            })
            .collect()
    };
    for (i, host) in hosts.iter().enumerate() {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        if let Some(pw) = find(&text, host, &port.to_string(), dbname, user) {
            return Ok(Some(pw));
        }
    }
    Ok(None)
}

/// The password of the first line of `text` matching the four fields.
fn find(text: &str, host: &str, port: &str, dbname: &str, user: &str) -> Option<String> {
    text.lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .find_map(|line| {
            let mut rest = line;
            for want in [host, port, dbname, user] {
                rest = matches(rest, want)?;
            }
            Some(unescape(rest))
        })
}

/// If the first field of `line` matches `want`: the text after its colon.
fn matches<'a>(line: &'a str, want: &str) -> Option<&'a str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut chars = line.char_indices();
    let mut want = want.chars();
    while let Some((i, c)) = chars.next() {
        let c = match c {
            ':' => return want.next().is_none().then(|| &line[i + 1..]),
            '\\' => match chars.next() {
                Some((_, e)) => e,
                None => return None,
            },
            c => c,
        };
        if want.next() != Some(c) {
            return None;
        }
    }
    None
}

/// The password field: up to the first unescaped colon, escapes removed.
fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        match c {
            ':' => break,
            '\\' => match chars.next() {
                Some(e) => out.push(e),
                None => out.push('\\'),
            },
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_wins_with_wildcards_and_escapes() {
        let text = "# comment\n\
                    other:5432:*:*:nope\n\
                    db\\:1:*:app:bob:first\n\
                    *:5432:*:bob:pa\\:ss\\\\word:trailing\n\
                    *:*:*:*:last\n";
        assert_eq!(
            find(text, "db:1", "9", "app", "bob").as_deref(),
            Some("first")
        );
        assert_eq!(
            find(text, "h", "5432", "x", "bob").as_deref(),
            Some("pa:ss\\word")
        );
        assert_eq!(find(text, "h", "1", "x", "eve").as_deref(), Some("last"));
        assert_eq!(find("h:1:d:u\n", "h", "1", "d", "u"), None);
        assert_eq!(find("h:1:d:u:\n", "h", "1", "d", "u").as_deref(), Some(""));
        assert_eq!(find("h*:1:d:u:p\n", "hx", "1", "d", "u"), None);
    }

    #[test]
    fn group_readable_files_are_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lease-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pgpass");
        std::fs::write(&path, "127.0.0.1:5432:db:u:secret\n").unwrap();
        let mut config = Config::new();
        config.host("127.0.0.1").port(5432).dbname("db").user("u");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = lookup(&path, &config).unwrap_err();
        assert!(e.0.contains("group or world access"), "{e:?}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(lookup(&path, &config).unwrap().as_deref(), Some("secret"));
        assert_eq!(lookup(&dir.join("missing"), &config).unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
