//! # lease-libpq: connect as psql does
//!
//! libpq's connection resolution, without libpq and without a runtime: a
//! connection string, the `PG*` environment and the password file, resolved
//! into a [`tokio_postgres::Config`] and a [`rustls::ClientConfig`] (ring
//! provider) that enforces libpq's `sslmode`. The lease adapters build on it
//! (`Locker::from_env`, `Locker::from_conninfo` in lease-tokio and
//! lease-smol), and so does the `lease` command.
//!
//! ```no_run
//! # fn main() -> Result<(), lease_libpq::ConninfoError> {
//! // PGHOST, PGUSER, PGSSLMODE, ... and ~/.pgpass, as psql reads them:
//! let conninfo = lease_libpq::Conninfo::from_env()?;
//! // Or a string first, the environment filling in what it leaves out:
//! let conninfo: lease_libpq::Conninfo = "host=db.example.com sslmode=verify-full".parse()?;
//! println!("connecting to {conninfo}"); // hosts, user, TLS; never the password
//! let (config, tls) = (conninfo.config(), conninfo.rustls());
//! # let _ = (config, tls); Ok(()) }
//! ```
//!
//! ## Resolution
//!
//! The string wins: a URL (`postgres://user:password@host:port,host2/db?k=v`,
//! percent-encoded) or `key=value` pairs (values quoted with `'`, `\`
//! escapes); a keyword given twice takes its last value. The environment
//! fills in what it leaves out, then libpq's defaults. A variable that is
//! read and whose value is not UTF-8 is an error that names it (never its
//! value), not a silent "unset" ([`env_var`]; [`Conninfo::resolve`] with
//! an environment of your own leaves that to you):
//!
//! | Variable | Keyword | Here |
//! | --- | --- | --- |
//! | `PGHOST` | `host` | yes (comma-separated list, tried in order; default, and for an empty entry (`host=''`), `/var/run/postgresql`, then `/tmp`) |
//! | `PGHOSTADDR` | `hostaddr` | yes (without `host`, the address is also the TLS name, as libpq's TLS without SNI; `verify-full` needs `host`) |
//! | `PGPORT` | `port` | yes (one, or one per host; default 5432; 0 is refused, as in libpq) |
//! | `PGDATABASE` | `dbname` | yes (default: the user) |
//! | `PGUSER` | `user` | yes (default: `$USER`, then the OS user) |
//! | `PGPASSWORD` | `password` | yes (never shown; registered for [`redact`]) |
//! | `PGPASSFILE` | `passfile` | yes (default `~/.pgpass`; see below) |
//! | `PGAPPNAME` | `application_name` | yes |
//! | - | `fallback_application_name` | yes (when neither of the above is given) |
//! | `PGCONNECT_TIMEOUT` | `connect_timeout` | yes (seconds; 1 means 2, 0 or less waits forever, as in libpq) |
//! | `PGOPTIONS` | `options` | yes |
//! | `PGSSLMODE` | `sslmode` | yes (default `prefer`; `verify-full` with `sslrootcert=system`), see "TLS" |
//! | `PGREQUIRESSL` | `requiressl` | no (deprecated in libpq; use `sslmode=require`) |
//! | `PGSSLNEGOTIATION` | `sslnegotiation` | yes (`postgres`, `direct`; `direct` needs `require` or stronger) |
//! | `PGSSLROOTCERT` | `sslrootcert` | yes (a file or `system`; default `~/.postgresql/root.crt` if it exists) |
//! | `PGSSLCERT` | `sslcert` | yes (default `~/.postgresql/postgresql.crt` if it exists) |
//! | `PGSSLKEY` | `sslkey` | yes (PEM, unencrypted; default `~/.postgresql/postgresql.key`) |
//! | - | `sslpassword` | no (encrypted keys are not supported) |
//! | `PGSSLCERTMODE` | `sslcertmode` | no (a client certificate is sent when configured: libpq's `allow`) |
//! | `PGSSLCRL`, `PGSSLCRLDIR` | `sslcrl`, `sslcrldir` | no |
//! | `PGSSLSNI` | `sslsni` | no (SNI is sent for host names, never for IP addresses: libpq's default) |
//! | `PGSSLCOMPRESSION` | `sslcompression` | no (ignored by libpq too) |
//! | `PGSSLMINPROTOCOLVERSION`, `PGSSLMAXPROTOCOLVERSION` | `ssl_min_protocol_version`, `ssl_max_protocol_version` | no: TLS 1.2 and 1.3 (rustls's safe defaults) |
//! | `PGREQUIREPEER` | `requirepeer` | no |
//! | `PGCHANNELBINDING` | `channel_binding` | yes (`disable`, `prefer`, `require`) |
//! | `PGREQUIREAUTH` | `require_auth` | no |
//! | `PGTARGETSESSIONATTRS` | `target_session_attrs` | `any`, `read-write`, `primary` (as `read-write`); the standby values are refused; default `read-write` with several hosts (below) |
//! | `PGLOADBALANCEHOSTS` | `load_balance_hosts` | yes (`disable`, `random`) |
//! | - | `keepalives`, `keepalives_idle`, `keepalives_interval`, `keepalives_count` | yes (idle and interval at most 32767 s, count 1 to 127, Linux's limits: beyond, refused rather than failing every connection) |
//! | - | `tcp_user_timeout` | yes |
//! | `PGGSSENCMODE` | `gssencmode` | no (no GSSAPI) |
//! | `PGKRBSRVNAME`, `PGGSSLIB`, `PGGSSDELEGATION` | `krbsrvname`, `gsslib`, `gssdelegation` | no (no Kerberos / GSSAPI) |
//! | `PGSERVICE`, `PGSERVICEFILE` | `service` | no: `service=` and a set `PGSERVICE` are errors (no service files) |
//! | `PGCLIENTENCODING` | `client_encoding` | no: always UTF8 (tokio-postgres) |
//! | - | `replication` | no |
//! | `PGDATESTYLE`, `PGTZ`, `PGGEQO`, `PGSYSCONFDIR`, `PGLOCALEDIR` | - | not read |
//!
//! A keyword in the string wins over its variable. A keyword marked "no"
//! is refused ([`ErrorKind::Unsupported`]) rather than ignored; any other
//! unknown keyword is an error that names it ([`ErrorKind::UnknownKeyword`],
//! with the likely keyword for a typo: `usr` gives "did you mean `user`?").
//!
//! Two deliberate differences from libpq: with several hosts and no
//! `target_session_attrs`, sessions are `read-write` (libpq: `any`), so
//! that a standby early in a failover list is skipped for the primary; and
//! `target_session_attrs` values that want a standby are refused, since an
//! advisory lock needs the primary.
//!
//! The password file is read as libpq reads it: lines
//! `hostname:port:database:username:password`, `*` matching anything, `\:`
//! and `\\` escapes, the first match winning; ignored, with a warning in
//! [`Conninfo::warnings`], when group or world can read it. A Unix-socket
//! host matches `localhost` when it is a default socket directory. The first
//! host with a matching line gives the password for all of them.
//!
//! ## TLS
//!
//! | sslmode | TLS | server certificate |
//! | --- | --- | --- |
//! | `disable` | never | - |
//! | `allow` | never (libpq would retry with TLS if the server refuses plaintext) | - |
//! | `prefer` (default) | if the server offers it | chain checked only if a root certificate is given (libpq's rule); a failed check fails the attempt instead of falling back to plaintext |
//! | `require` | always | not verified; with a root certificate, as `verify-ca` (libpq's rule) |
//! | `verify-ca` | always | chain checked against the roots, host name not |
//! | `verify-full` | always | chain and host name checked |
//!
//! `verify-full` checks an IP host against the certificate's IP addresses.
//! Roots: `sslrootcert=FILE` (PEM), `sslrootcert=system` (the platform's
//! store, read with rustls-native-certs: `/etc/ssl/certs`, `SSL_CERT_FILE`,
//! `SSL_CERT_DIR`; as in libpq it implies `verify-full` and refuses weaker
//! modes), or `~/.postgresql/root.crt`. A client certificate (`sslcert`,
//! `sslkey`, PEM) is sent when given; the key is refused if group or world
//! can read it (libpq's rule: 0600, or 0640 if owned by root). A root
//! certificate, client certificate or key that is named but cannot be read
//! is an error when the connection is resolved, whatever the mode, even
//! `disable` and `allow` that do not use it (libpq does not read them in
//! those modes, and skips a missing root certificate below `verify-ca`);
//! libpq's default files in `~/.postgresql` are read only in a mode that
//! uses TLS. A rejected server
//! certificate fails the attempt with one line naming the mode and the
//! reason (`sslmode=verify-full: the server's certificate is rejected: it is
//! not signed by a CA in ...`). The server never offers TLS over a Unix
//! socket: use `disable` or `prefer` with a socket host. The
//! [`rustls::ClientConfig`] offers ALPN `postgresql` (what
//! `sslnegotiation=direct` needs).
//!
//! ## Secrets
//!
//! [`Conninfo`]'s `Debug` and `Display` show hosts, ports, database, user
//! and the TLS setup, never the password; no [`ConninfoError`] contains a
//! password, a key or a certificate. Every password found is also registered
//! for [`redact`], which replaces them in any text a program is about to
//! print.
//!
//! A password quoted wrong must not leak through a syntax error either:
//! after a `password` in a `key=value` string (`password=correct horse`,
//! `password='it's'`) or in a URL's query string (`password=abc&def`), an
//! error names the place (`at character 32`) or a known keyword, never the
//! text. A URL with an `@` in its host or database part
//! (`postgres://app:p@ss@host/db`, `postgres://app:ab/cd@host/db`) or a
//! port that is not a number is refused without quoting it: a password
//! containing `/`, `@`, `:` or `&` must be percent-encoded (`%2F`, `%40`,
//! `%3A`, `%26`), as must an `@` in a host or database name (libpq would read
//! the rest of the password as a host, port or database, and name it in
//! errors and log lines).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(html_root_url = "https://docs.rs/lease-libpq/0.1")]
#![warn(missing_docs)]
#![deny(unsafe_code)]

mod error;
mod parse;
mod pgpass;
mod redact;
mod resolve;
mod tls;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use error::{ConninfoError, ErrorKind};
pub use redact::{add_secret, redact};
pub use rustls;
pub use tls::SslMode;
pub use tokio_postgres;

/// A resolved connection: the tokio-postgres configuration, the `sslmode`
/// and the rustls configuration that enforces it, a summary for log lines
/// and the warnings of the resolution. See the crate docs for the rules.
#[derive(Clone)]
pub struct Conninfo {
    config: tokio_postgres::Config,
    sslmode: SslMode,
    rustls: Arc<rustls::ClientConfig>,
    summary: String,
    warnings: Vec<String>,
    /// Where no password was found (`None`: one was).
    password_search: Option<String>,
}

impl Conninfo {
    /// The connection from the process's `PG*` environment and password
    /// file alone, as `psql` with no arguments.
    ///
    /// # Errors
    /// A variable with an invalid value (or one that is not UTF-8),
    /// inconsistent settings, or an unusable certificate or key file: the
    /// message names the variable.
    pub fn from_env() -> Result<Conninfo, ConninfoError> {
        resolve_process(None, "the environment")
    }

    /// The connection from `s` (URL or `key=value`), the process's
    /// environment filling in what it leaves out, as `psql "s"` does.
    ///
    /// # Errors
    /// As [`Conninfo::from_env`], and a string that does not parse or names
    /// an unknown or unsupported keyword: the message names it.
    pub fn parse(s: &str) -> Result<Conninfo, ConninfoError> {
        resolve_process(Some(s), "the connection string")
    }

    /// `string` if any (named `origin` in messages, e.g. `"DATABASE_URL"`),
    /// the process's environment filling in what it leaves out.
    ///
    /// # Errors
    /// As [`Conninfo::parse`]; a variable read whose value is not UTF-8 is
    /// an error that names it (never its value).
    pub fn from_process_env(string: Option<&str>, origin: &str) -> Result<Conninfo, ConninfoError> {
        resolve_process(string, origin)
    }

    /// The general form: `string` if any (named `origin` in messages, e.g.
    /// `"--database-url"`), with the environment `env` (a variable's value,
    /// or `None`; empty values count as unset) instead of the process's.
    ///
    /// # Errors
    /// As [`Conninfo::parse`].
    pub fn resolve(
        string: Option<&str>,
        origin: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Conninfo, ConninfoError> {
        resolve::resolve(string, origin, env)
    }

    /// The tokio-postgres configuration (its `sslmode` is tokio-postgres's
    /// nearest: `disable`, `prefer` or `require`; [`Conninfo::rustls`]
    /// checks the rest).
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The tokio-postgres configuration, by value.
    pub fn into_config(self) -> tokio_postgres::Config {
        self.config
    }

    /// libpq's `sslmode`, as resolved.
    pub fn sslmode(&self) -> SslMode {
        self.sslmode
    }

    /// The rustls configuration to connect with, whatever the mode (a
    /// driver does not use it under `disable`): it verifies what the mode
    /// asks for and sends the client certificate.
    pub fn rustls(&self) -> Arc<rustls::ClientConfig> {
        self.rustls.clone()
    }

    /// Where it points, for log lines: hosts, ports, database, user, and
    /// whether TLS is used and what it verifies. Never the password. Also
    /// the `Display` form.
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// What the user should know but that did not stop the resolution (a
    /// password file with group or world access, ignored as libpq does).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Where a password was looked for and not found, when none was (`None`
    /// when the connection has one), for an error that needs one (the
    /// server asked for a password: tokio-postgres says "password missing"):
    /// `no password in --database-url, nor in PGPASSWORD, nor in the password
    /// file /home/app/.pgpass (the default; no line matches)`. Never a
    /// password.
    pub fn password_search(&self) -> Option<&str> {
        self.password_search.as_deref()
    }
}

impl fmt::Debug for Conninfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The summary, not the config: nothing that could hold a secret.
        f.debug_struct("Conninfo")
            .field("summary", &self.summary)
            .field("warnings", &self.warnings)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Conninfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary)
    }
}

/// [`Conninfo::parse`].
impl FromStr for Conninfo {
    type Err = ConninfoError;

    fn from_str(s: &str) -> Result<Conninfo, ConninfoError> {
        Conninfo::parse(s)
    }
}

/// A process environment variable, as the resolution reads it: `Ok(None)`
/// when unset (or empty), an error naming the variable (never its value)
/// when its value is not UTF-8, rather than a silent "unset" that would
/// connect somewhere else.
///
/// # Errors
/// [`ErrorKind::InvalidValue`], the variable as [`ConninfoError::keyword`].
pub fn env_var(name: &str) -> Result<Option<String>, ConninfoError> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(error::err(
            ErrorKind::InvalidValue,
            name,
            format!(
                "the environment variable {name} is not valid UTF-8 (its value is not shown): \
                 fix or unset it"
            ),
        )),
    }
}

/// Resolves with the process environment: a variable the resolution reads
/// whose value is not UTF-8 is an error naming it ([`env_var`]).
fn resolve_process(string: Option<&str>, origin: &str) -> Result<Conninfo, ConninfoError> {
    let bad = std::cell::RefCell::new(None);
    let lookup = |name: &str| match env_var(name) {
        Ok(v) => v,
        Err(e) => {
            bad.borrow_mut().get_or_insert(e);
            None
        }
    };
    let resolved = resolve::resolve(string, origin, &lookup);
    match bad.into_inner() {
        Some(e) => Err(e),
        None => resolved,
    }
}
