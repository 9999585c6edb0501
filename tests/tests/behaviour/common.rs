//! What the modules share: the shared test server, short intervals, the `replica`
//! binary, keys, figures, and the macro that runs a scenario with both drivers.

use std::path::Path;
use std::time::Duration;

use lease_proto::Options;
use lease_tests::scenario::{ms_f, Driver, Event, Node};
use lease_tests::KitError;

/// The shared test server at 127.0.0.1:5432 (trust authentication).
pub const DB: &str = "host=127.0.0.1 user=postgres dbname=postgres";

pub const MS: fn(u64) -> Duration = Duration::from_millis;

/// How long to wait for anything that should happen.
pub const WAIT: Duration = Duration::from_secs(30);

pub type Res = Result<(), KitError>;

/// Short intervals: validity 500 ms (heartbeat + query timeout).
pub fn opts() -> Options {
    let mut o = Options::default();
    o.retry_interval = MS(100);
    o.heartbeat_interval = MS(100);
    o.query_timeout = MS(400);
    o.guard_margin = MS(200);
    o
}

/// A `fmt` subscriber for the test's output, filtered by `RUST_LOG`.
pub fn init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The kit's `replica` binary (`src/bin/replica.rs`).
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_replica"))
}

pub fn key(name: &str) -> i64 {
    lease_proto::LeaseId::named(name)
        .expect("valid lease name")
        .key()
}

/// Prints `FIGURE <what>: <value>` on stderr.
pub fn figure(what: &str, value: String) {
    eprintln!("FIGURE {what}: {value}");
}

/// Prints `FIGURE <what>: <value> ms` on stderr.
pub fn fig_ms(what: &str, nanos: i128) {
    figure(what, format!("{:.1} ms", ms_f(nanos)));
}

/// Prints `FIGURE <driver> <what>: <value>` on stderr.
pub fn driver_figure(driver: Driver, what: &str, value: String) {
    eprintln!("FIGURE {:9} {what}: {value}", driver.name());
}

/// Waits until `node` has printed `n` `valid` lines: its heartbeats flow.
pub fn wait_valid_lines(node: &Node, n: usize) -> Res {
    let mut valid = 0;
    node.wait_event(
        |e| {
            matches!(e, Event::Valid { .. }) && {
                valid += 1;
                valid == n
            }
        },
        WAIT,
    )?;
    Ok(())
}

/// The last lines of every node's output, for failure messages.
pub fn tails(nodes: &[&Node]) -> String {
    nodes
        .iter()
        .map(|n| n.tail())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `both_drivers!(a, b)`: for each scenario function `a(Driver) -> Res` of the module, a
/// module `a` with the tests `a::tokio` and `a::smol`.
macro_rules! both_drivers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use lease_tests::scenario::Driver;

            #[test]
            fn tokio() -> Result<(), lease_tests::KitError> {
                super::$name(Driver::Tokio)
            }

            #[test]
            fn smol() -> Result<(), lease_tests::KitError> {
                super::$name(Driver::Smol)
            }
        }
    )*};
}
pub(crate) use both_drivers;

pub fn fast() -> Options {
    let mut o = Options::default();
    o.retry_interval = MS(50);
    o.heartbeat_interval = MS(100);
    o.query_timeout = MS(1_000);
    o
}

/// A lease name no other test (or earlier run) uses.
pub fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{name}-{}-{nanos}", std::process::id())
}

/// The statement's reply, decoded as a driver decodes it.
pub fn run(
    session: &lease_tests::scenario::Admin,
    statement: &lease_proto::Statement,
) -> Result<Vec<lease_proto::reply::Row>, lease_tests::KitError> {
    let rows = session.rows(&statement.sql())?;
    let decoded = (rows.iter())
        .map(|r| lease_proto::reply::decode_text_row(r.iter().map(|c| c.as_deref())))
        .collect::<Result<Vec<_>, _>>();
    decoded.map_err(|e| {
        lease_tests::KitError::Invalid(format!("{statement:?}: undecodable reply: {e}"))
    })
}
