//! Logging to stderr: a `tracing` subscriber (text or JSON) whose every line
//! passes through [`conn::redact`](crate::conn::redact); usage errors; exit statuses.

use std::io::{self, IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use tracing::{Level, Metadata};

use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::registry::Registry;

use crate::args::LogFormat;
use crate::conn::redact;

/// Environment variable with `tracing` filter directives that replace the
/// default level (e.g. `LEASE_LOG=lease_driver=debug`).
pub const FILTER_ENV: &str = "LEASE_LOG";

/// Exit status for an error that is not bad usage.
pub const EXIT_FAILURE: i32 = 1;

/// Prints a one-line usage error (`lease: error: ...`) and returns `code`.
/// Registered secrets are redacted.
pub fn usage_error(code: i32, message: &str) -> i32 {
    let message = redact(message).replace(['\r', '\n'], " ");
    eprintln!("lease: error: {message}");
    code
}

/// A duration as log lines and endpoint bodies show it: to the millisecond
/// (`1s 250ms`, not `1s 250ms 3us 417ns`).
pub fn millis(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64))
}

/// Installs the global subscriber: `info` and up (`warn` and up when
/// `quiet`), unless [`FILTER_ENV`] says otherwise.
pub fn init(quiet: bool, format: LogFormat) {
    let default = if quiet {
        LevelFilter::WARN
    } else {
        LevelFilter::INFO
    };
    let filter = || {
        std::env::var(FILTER_ENV)
            .ok()
            .and_then(|d| EnvFilter::try_new(d).ok())
            .unwrap_or_else(|| EnvFilter::new(default.to_string()))
    };
    let ansi = io::stderr().is_terminal();
    let text = (format == LogFormat::Text).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(RedactingStderr { holdable: false })
            .with_ansi(ansi)
            .with_target(false)
            .with_filter(filter())
    });
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(RedactingStderr { holdable: false })
            .with_current_span(false)
            .with_span_list(false)
            .with_filter(filter())
    });
    let subscriber = Registry::default().with(text).with(json);
    // Fails only if a subscriber is already set: keep that one.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// What `lease run` hands its watchdogs for their log setup
/// ([`lease_exec::Command::watchdog_log`]): `quiet,json`, `text`, ...
pub fn watchdog_config(quiet: bool, format: LogFormat) -> String {
    let format = match format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    if quiet {
        format!("quiet,{format}")
    } else {
        format.to_owned()
    }
}

/// A watchdog's log setup from [`watchdog_config`]'s string (text, not
/// quiet, for anything else).
pub fn init_watchdog(config: &str) {
    let words: Vec<&str> = config.split(',').collect();
    let format = if words.contains(&"json") {
        LogFormat::Json
    } else {
        LogFormat::Text
    };
    init(words.contains(&"quiet"), format);
}

/// Info (and more verbose) lines held back by [`hold_info`]: `Some` while held.
static HELD: Mutex<Option<Vec<u8>>> = Mutex::new(None);

/// From now on, lines at `INFO` and below are held back (warnings and errors
/// are not) until [`release_held`] prints them or [`drop_held`] drops them:
/// `lease run --try` says nothing but its one line when it does not run.
pub fn hold_info() {
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    held.get_or_insert_with(Vec::new);
}

/// Prints the lines held back since [`hold_info`], in order, and stops holding.
pub fn release_held() {
    let held = HELD.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(lines) = held {
        let _ = io::stderr().lock().write_all(&lines);
    }
}

/// Drops the lines held back since [`hold_info`]; lines after it are held too.
pub fn drop_held() {
    if let Some(lines) = HELD.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        lines.clear();
    }
}

/// Writes each formatted event to stderr with secrets redacted. The fmt layer
/// writes one event per `write` call, so a secret cannot straddle two calls.
/// `holdable`: an `INFO` (or more verbose) event, held back while
/// [`hold_info`] is in force.
#[derive(Clone, Copy)]
struct RedactingStderr {
    holdable: bool,
}

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = RedactingStderr;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        RedactingStderr {
            holdable: *meta.level() >= Level::INFO,
        }
    }
}

impl Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = redact(&String::from_utf8_lossy(buf));
        if self.holdable {
            let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(lines) = held.as_mut() {
                lines.extend_from_slice(text.as_bytes());
                return Ok(buf.len());
            }
        }
        io::stderr().lock().write_all(text.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
