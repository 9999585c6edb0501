//! The error of a resolution: opaque, with a kind and the keyword it is
//! about.

use std::fmt;

/// Why a connection could not be resolved. Its message is one line that
/// names the keyword or variable at fault and where it came from; it never
/// contains a password, a key or a certificate.
#[derive(Clone, PartialEq, Eq)]
pub struct ConninfoError(Box<Inner>);

#[derive(Clone, PartialEq, Eq)]
struct Inner {
    kind: ErrorKind,
    keyword: Option<String>,
    message: String,
}

/// What kind of [`ConninfoError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The string does not parse: an unclosed quote, a parameter without
    /// `=`, a malformed URL.
    Syntax,
    /// A keyword libpq does not know (a typo such as `usr=`).
    UnknownKeyword,
    /// A known keyword (or its variable) with a value it does not take.
    InvalidValue,
    /// A libpq feature this crate does not offer (`service=`, `gssencmode`,
    /// a standby-only `target_session_attrs`, ...).
    Unsupported,
    /// Settings that do not fit together (ports for hosts, `sslkey` without
    /// `sslcert`, `sslrootcert=system` with a weak `sslmode`).
    Inconsistent,
    /// No user name: no `user=`, `PGUSER`, `USER` nor OS user.
    NoUser,
    /// A certificate or key file that cannot be used (missing, unreadable,
    /// malformed, a key readable by others).
    File,
    /// rustls refused the TLS setup.
    Tls,
}

impl ConninfoError {
    pub(crate) fn new(kind: ErrorKind, keyword: Option<&str>, message: impl Into<String>) -> Self {
        ConninfoError(Box::new(Inner {
            kind,
            keyword: keyword.map(str::to_owned),
            message: message.into(),
        }))
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The keyword (`sslmode`, `usr`) or environment variable (`PGPORT`) it
    /// is about, when there is one.
    pub fn keyword(&self) -> Option<&str> {
        self.0.keyword.as_deref()
    }
}

impl fmt::Display for ConninfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl fmt::Debug for ConninfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConninfoError")
            .field("kind", &self.0.kind)
            .field("keyword", &self.0.keyword)
            .field("message", &self.0.message)
            .finish()
    }
}

impl std::error::Error for ConninfoError {}

/// Shorthands for the resolver's errors.
pub(crate) fn err(kind: ErrorKind, keyword: &str, message: impl Into<String>) -> ConninfoError {
    ConninfoError::new(kind, Some(keyword), message)
}
