//! The runner's errors.

use std::fmt;
use std::io;

/// Why a call on the runner's side failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The watchdog could not be started, or did not say it was ready in
    /// time (then it was killed).
    Start(io::Error),
    /// The watchdog could not start the command: the operating system's
    /// error of its spawn (`NotFound`: no such program; `PermissionDenied`:
    /// not executable; ...). Nothing runs.
    Spawn(io::Error),
    /// The watchdog cannot be told or did not answer as it should: it is
    /// gone (its command dies with it), its pipe is full (it is not
    /// reading), or it said something else or nothing in time. A deadline
    /// may not be renewed: stop the command.
    Lost(io::Error),
    /// The call does not fit the watchdog's state: `arm` or `disarm` before
    /// `spawn`, or a second `spawn`.
    Misuse(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Start(e) => write!(f, "cannot start the watchdog: {e}"),
            Error::Spawn(e) => write!(f, "cannot start the command: {e}"),
            Error::Lost(e) => write!(f, "the watchdog does not answer: {e}"),
            Error::Misuse(what) => write!(f, "watchdog misused: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Start(e) | Error::Spawn(e) | Error::Lost(e) => Some(e),
            Error::Misuse(_) => None,
        }
    }
}
