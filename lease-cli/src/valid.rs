//! `lease valid`: the command asks its runner whether its lease is valid.
//!
//! For each command, `lease run` listens on a Unix socket in a fresh
//! directory of its own (mode 0700) under the temporary directory, named to
//! the command by `LEASE_SOCKET`. Each connection gets one line and is
//! closed:
//!
//! - `valid remaining_ms=MS until_monotonic_ns=NS token=TOKEN`: the lease is
//!   held and valid for MS more milliseconds, until NS on `CLOCK_MONOTONIC`
//!   (system-wide, so the command can compare it with its own clock), the
//!   lease's validity end ([`lease_tokio::Lease::valid_until`]);
//! - `invalid reason=REASON`: lost, expired or being stopped.
//!
//! The answer is the runner's view at that instant: a process that pauses
//! after it may act past the validity end (the fencing token is the remedy).
//! A runner that does not answer (frozen) is an error, never "valid".

use std::io::{self, BufRead, BufReader};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lease_tokio::Lease;
use socket2::{Domain, SockAddr, Socket, Type};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;

use crate::args::ValidArgs;

/// The environment variable that names the socket to the command.
pub const SOCKET_VAR: &str = "LEASE_SOCKET";

/// The runner's answer for `lease` now.
pub fn answer(lease: &Lease) -> String {
    let now = Instant::now();
    match lease.valid_until() {
        Some(until) if lease.is_valid() && until > now => format!(
            "valid remaining_ms={} until_monotonic_ns={} token={}",
            (until - now).as_millis(),
            lease_exec::monotonic_nanos(until),
            lease.token()
        ),
        Some(_) => "invalid reason=expired".to_owned(),
        None => "invalid reason=lost-or-stopping".to_owned(),
    }
}

/// A listening socket for one command: answers until dropped, then removes
/// its directory.
pub struct Answerer {
    dir: PathBuf,
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Answerer {
    /// Binds a socket in a fresh private directory and answers for `lease`.
    ///
    /// # Errors
    /// If the directory or the socket cannot be made.
    pub fn start(lease: &Lease) -> io::Result<Answerer> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        // The key too: the shards of one runner (`--shards`) may share a token.
        let dir = std::env::temp_dir().join(format!(
            "lease-{}-{}-{}-{nanos}",
            std::process::id(),
            lease.key(),
            lease.token()
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("valid.sock");
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
        };
        let lease = lease.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    continue;
                };
                let line = answer(&lease) + "\n";
                // The answer fits in the socket buffer: written at once.
                let _ = conn.try_write(line.as_bytes());
                let _ = conn.shutdown().await;
            }
        });
        Ok(Answerer { dir, path, task })
    }

    /// The socket's path, for [`SOCKET_VAR`].
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Answerer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Runs `lease valid`: 0 valid, 1 not valid, 2 error.
pub fn main(args: ValidArgs) -> i32 {
    let socket = args
        .socket
        .or_else(|| std::env::var_os(SOCKET_VAR).map(PathBuf::from));
    let Some(socket) = socket else {
        eprintln!(
            "lease: error: ${SOCKET_VAR} is not set: run this from inside `lease run`'s command"
        );
        return 2;
    };
    match ask(&socket, args.timeout) {
        Ok(line) => {
            let code = match line.split_ascii_whitespace().next() {
                Some("valid") => 0,
                Some("invalid") => 1,
                _ => {
                    eprintln!("lease: error: unexpected answer from the runner: {line:?}");
                    return 2;
                }
            };
            if !args.quiet {
                println!("{line}");
            }
            code
        }
        Err(e) => {
            eprintln!(
                "lease: error: no answer from the runner at {}: {e}",
                socket.display()
            );
            2
        }
    }
}

/// Asks the runner at `socket`, connecting and reading within `timeout` in
/// all.
fn ask(socket: &Path, timeout: Duration) -> io::Result<String> {
    let deadline = Instant::now() + timeout;
    let timed_out = || {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "timed out after {} (the runner is stopped or starved)",
                humantime::format_duration(timeout)
            ),
        )
    };
    let stream = connect(socket, timeout).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => e,
    })?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out());
    }
    stream.set_read_timeout(Some(left))?;
    let mut line = String::new();
    match BufReader::new(stream).read_line(&mut line) {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(timed_out())
        }
        Err(e) => Err(e),
        Ok(_) => Ok(line.trim_end().to_owned()),
    }
}

/// Connects to `socket` within `timeout`. A stopped runner accepts nothing:
/// once its socket's backlog is full, a plain `connect` waits until it
/// accepts again. The socket's send timeout bounds that wait (Linux gives
/// up with `EAGAIN`, [`io::ErrorKind::WouldBlock`]); a non-blocking connect
/// would fail at once instead.
fn connect(socket: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let s = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    s.set_write_timeout(Some(timeout))?;
    s.connect(&SockAddr::unix(socket)?)?;
    s.set_write_timeout(None)?;
    Ok(s.into())
}
