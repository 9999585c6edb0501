//! Logging to stderr: a `tracing` subscriber (text or JSON) whose every line
//! passes through [`conn::redact`](crate::conn::redact), and a layer that
//! picks the holder's backend pid out of lease-tokio's "standing by" events.

use std::io::{self, IsTerminal, Write};

use tokio::sync::mpsc::UnboundedSender;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::Registry;

use crate::args::LogFormat;
use crate::conn::redact;

/// Environment variable with `tracing` filter directives that replace the
/// default level (e.g. `LEASE_LOG=lease_driver=debug`).
pub const FILTER_ENV: &str = "LEASE_LOG";

/// Installs the global subscriber: `info` and up (`warn` and up when
/// `quiet`), unless [`FILTER_ENV`] says otherwise. With `holders`, the
/// holder pid of every lease-tokio "standing by" event is sent there (even
/// when `quiet`).
pub fn init(quiet: bool, format: LogFormat, holders: Option<UnboundedSender<i64>>) {
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
            .with_writer(RedactingStderr)
            .with_ansi(ansi)
            .with_target(false)
            .with_filter(filter())
    });
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(RedactingStderr)
            .with_current_span(false)
            .with_span_list(false)
            .with_filter(filter())
    });
    let subscriber = Registry::default()
        .with(holders.map(|tx| HolderLayer { tx }))
        .with(text)
        .with(json);
    // Fails only if a subscriber is already set: keep that one.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Writes each formatted event to stderr with secrets redacted. The fmt layer
/// writes one event per `write` call, so a secret cannot straddle two calls.
#[derive(Clone, Copy)]
struct RedactingStderr;

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = RedactingStderr;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

impl Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = redact(&String::from_utf8_lossy(buf));
        io::stderr().lock().write_all(text.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// Sends the `holder_pid` field of lease-tokio events.
struct HolderLayer {
    tx: UnboundedSender<i64>,
}

impl<S: Subscriber> Layer<S> for HolderLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("lease_driver") {
            return;
        }
        let mut visitor = HolderPid(None);
        event.record(&mut visitor);
        if let Some(pid) = visitor.0 {
            let _ = self.tx.send(pid);
        }
    }
}

struct HolderPid(Option<i64>);

impl Visit for HolderPid {
    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "holder_pid" {
            self.0 = Some(value);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "holder_pid" {
            self.0 = i64::try_from(value).ok();
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}
