//! # lease-proto: the sans-IO core of `lease`
//!
//! A pure state machine that makes a job run on exactly one replica at a time
//! over PostgreSQL session-level advisory locks. It does no I/O, reads no
//! clock, spawns nothing: a driver (`lease-tokio`, `lease-smol`, or your own)
//! feeds it time, replies and job exits, and executes the commands it emits.
//!
//! ## The drain rule
//!
//! After **every** input (a run, a reply, a job exit, a notification, a
//! tick), drain [`Machine::poll_output`] until it returns `None`, carrying
//! out each [`Output`] as it comes: run commands (jobs to start and cancel,
//! runs to finish), session commands (connect, send a statement, close) and
//! events (logs, metrics), already in the order they must be carried out.
//! Then read the clock, and sleep until
//! [`Machine::poll_timeout`] or the next input, whichever comes first; when the
//! timer fires, feed [`Input::Tick`]. The machine checks every deadline
//! against the `now` it is given, so a late or spurious tick is harmless;
//! [`Machine::timeout_reason`] tells which [`Deadline`] the deadline is.
//! The whole loop of a driver, compiled:
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use lease_proto::{Event, Input, LeaseId, Machine, Options, Output, RunCommand, SessionCommand};
//!
//! # fn execute_session(_: SessionCommand) {}
//! # fn execute_run(_: RunCommand) {}
//! # fn log(_: Event) {}
//! # fn wait_for_input_until(_: Option<Instant>) -> Option<Input> { None }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut machine = Machine::new(Options::default(), 0x5eed)?;
//! let _run = machine.run(Instant::now(), LeaseId::named("sweeper")?)?;
//! loop {
//!     // The drain rule: every output, in the order given.
//!     while let Some(output) = machine.poll_output() {
//!         match output {
//!             Output::Run(c) => execute_run(c), // StartJob, CancelJob, Finish
//!             Output::Session(c) => execute_session(c), // Open, Query, Close
//!             Output::Event(e) => log(e),
//!         }
//!     }
//!     if machine.is_closed() {
//!         return Ok(());
//!     }
//!     // A reply, job exit, notification, ... or `None` when the deadline passed.
//!     let input = wait_for_input_until(machine.poll_timeout()).unwrap_or(Input::Tick);
//!     machine.handle_input(Instant::now(), input);
//!     # let _ = Duration::ZERO;
//! }
//! # }
//! ```
//!
//! ## The machine's methods, by class
//!
//! | class | methods | when |
//! |---|---|---|
//! | inputs | [`Machine::run`], [`Machine::handle_input`] | each with the current time |
//! | output | [`Machine::poll_output`] | after every input, until it is `None` |
//! | timer | [`Machine::poll_timeout`], [`Machine::timeout_reason`] | after draining |
//! | queries | [`Machine::status`], [`Machine::valid_until`], [`Machine::is_valid`], [`Machine::is_closed`], [`Machine::options`] | any time; they change nothing |
//!
//! ## Guarantees
//!
//! What the machine promises, each promise with its bound, its conditions and
//! the tests behind it, is in `docs/guarantees.md` of the repository (the one
//! home of every guarantee; how the fencing token is made:
//! [`RunCommand::StartJob`]).
//!
//! Setups that cannot give mutual exclusion are refused with a [`Refusal`]:
//! transaction poolers (backend pid changes, settings not applied, another
//! client's session nonce on the backend), servers older than 14 (13 without
//! the guard). A pooler that rejects startup options gets the settings in the
//! setup statement instead ([`Event::StartupOptionsRejected`]), verified the
//! same way, and then the pooler probe ([`SessionCommand::Probe`]): a second
//! connection, opened while the session is idle, that reads the session's
//! nonce was handed the session's own server backend, as a transaction
//! pooler does ([`Refusal::TransactionPooler`]). A hot standby is not final
//! ([`Event::InRecovery`]): the session is closed and the machine tries again
//! after a backoff. A newly promoted primary is not tried until every holder
//! of the old primary must have stopped ([`Event::PromotionHold`],
//! [`PromotionState`](reply::PromotionState), [`Options::promotion_hold`]): advisory locks are not
//! replicated.
//!
//! ## Carrying out the commands
//!
//! - [`SessionCommand::Open`]: connect with [`SessionParams::options_string`]
//!   appended to the startup `options`; report [`Input::SessionOpened`] or
//!   [`Input::SessionEnded`]. Watch the connection: any end of it is
//!   [`Input::SessionEnded`], reported at once, before any reply of that
//!   session not reported yet (drop that reply).
//! - [`SessionCommand::Query`]: send [`Statement::sql`] with the simple-query
//!   protocol, decode every row with [`decode_text_row`](reply::decode_text_row), report
//!   [`Input::Reply`]. Report notifications as [`Input::Notification`],
//!   with the sender's backend pid from the server's NotificationResponse.
//!   What the rows mean is the machine's business: each statement's reply
//!   has one type with its one parser ([`SetupReply`](reply::SetupReply), [`TryReply`](reply::TryReply),
//!   [`HeartbeatReply`](reply::HeartbeatReply), [`VerifyReply`](reply::VerifyReply), [`ReleaseReply`](reply::ReleaseReply)); a simulated server answers with
//!   their `to_rows`.
//! - [`SessionCommand::Probe`]: as `Query`, but on a second connection opened
//!   like the session's (same host, same parameters) and closed after its
//!   reply.
//! - [`SessionCommand::Close`]: drop the connection.
//! - [`SessionCommand::OpenWatch`], [`SessionCommand::WatchQuery`],
//!   [`SessionCommand::CloseWatch`]: the same for the watch session, a
//!   second connection opened like the session's (same host, same
//!   parameters), kept apart from it: one statement in flight on each, its
//!   end reported as [`Input::SessionEnded`] with its own id.
//! - [`RunCommand::StartJob`], [`RunCommand::CancelJob`]: start or cancel the
//!   job; report [`Input::JobExited`] when it returns.
//! - [`RunCommand::Finish`]: hand the [`Outcome`] to the caller.
//!
//! The machine owns every deadline (query timeouts, validity, backoff, retry),
//! so a driver needs exactly one timer.
//!
//! ## Reading the lock table yourself
//!
//! [`ADVISORY_KEY_SQL`](server::ADVISORY_KEY_SQL) is the `pg_locks` expression of a lease's key, and
//! [`holders_sql`](inspect::holders_sql) lists who holds which key and which sessions wait for it (the
//! standbys waiting on the server; rows of [`HolderRow`](inspect::HolderRow)), as
//! `lease status` shows it; a [`LockTable`](inspect::LockTable) groups one read's
//! rows into each lease's holders and waiters.
//!
//! ## Simulator
//!
//! With the `sim` feature, the `sim` module simulates a cluster of processes, a
//! PostgreSQL server, the network between them and their faults in virtual
//! time, deterministically from a seed.

#![forbid(unsafe_code)]
// docs.rs (nightly): items behind a feature say which (`doc_cfg` marks them by
// itself; `doc_auto_cfg` was merged into it).
#![cfg_attr(docsrs, feature(doc_cfg))]
// Where a dependent crate's docs link to this one's when this one is not
// documented beside it (`cargo doc --no-deps` of the dependent alone): its
// docs.rs pages for this minor version, not a dead relative path. Raise it
// with the version.
#![doc(html_root_url = "https://docs.rs/lease-proto/0.1")]
#![warn(missing_docs)]

mod io;
mod key;
mod machine;
mod options;
mod promotion;
#[macro_use]
mod sql;

pub mod inspect;
#[cfg(feature = "schedule")]
#[cfg_attr(docsrs, doc(cfg(feature = "schedule")))]
pub mod schedule;
#[cfg(feature = "sim")]
pub mod sim;

/// The unit tests' property runs: a fixed random seed, as the behaviour suite's
/// (`rng_seed` in tests/behaviour/common.rs, docs/simulator.md), so a run on
/// unchanged code draws the same cases; `PROPTEST_RNG_SEED=N` or `=random` changes it.
#[cfg(test)]
fn proptest_config() -> proptest::test_runner::Config {
    use proptest::test_runner::RngSeed;
    let rng_seed = match std::env::var("PROPTEST_RNG_SEED") {
        Err(_) => RngSeed::Fixed(20_261_206),
        Ok(s) if s.eq_ignore_ascii_case("random") => RngSeed::Random,
        Ok(s) => match s.parse() {
            Ok(n) => RngSeed::Fixed(n),
            Err(_) => panic!("PROPTEST_RNG_SEED={s}: expected a u64 or `random`"),
        },
    };
    proptest::test_runner::Config {
        rng_seed,
        ..proptest::test_runner::Config::default()
    }
}

pub use io::{
    Event, Input, JobExit, Outcome, Output, QueryId, Reason, Refusal, RunCommand, RunId,
    SessionCommand, SessionError, SessionId, SessionParams,
};
pub use key::{group_id_for_name, key_for_name, GroupId, LeaseId, NameError};
pub use machine::{
    group_share, Deadline, LastError, LeaseState, LeaseStatus, Machine, RunRejected, SessionState,
    Status,
};
pub use options::{Options, OptionsError, Role, ServerWait};
pub use sql::Statement;

/// Every statement's reply: one type each, with its one parser (`parse`)
/// and its encoder for simulated servers (`to_rows`), and the text decoding
/// of a row. What the rows mean is the machine's business; a driver only
/// decodes them ([`decode_text_row`](reply::decode_text_row)).
pub mod reply {
    pub use crate::promotion::PromotionState;
    pub use crate::sql::{
        decode_text_row, CheckReply, DecodeError, HeartbeatReply, MembersReply, ReleaseReply,
        ReplyError, Row, SetupReply, TryReply, VerifyReply, WaitReply,
    };
}

/// The machine's bounds and defaults, in one place: what [`Options`]
/// defaults to, what it accepts, and the fixed constants of the rules.
pub mod limits {
    pub use crate::machine::{
        ASK_AGAIN_CAP, CHECK_BURST, CHECK_EVERY, FAST_RECONNECT_CAP, FAST_RECONNECT_WINDOW,
        HERD_WAITERS, MAX_ASKS, MAX_ASKS_PER_KEY, MIN_SERVER_VERSION, MIN_SERVER_VERSION_GUARD,
        MIN_WAIT, RECONNECT_BASE, TAKE_NOTICES, VERIFY_EVERY, WAKE_BUDGET,
    };
    pub use crate::options::{
        DEFAULT_GUARD_MARGIN, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LOCK_DELAY, DEFAULT_MAX_LEASES,
        DEFAULT_QUERY_TIMEOUT, DEFAULT_RETRY_INTERVAL, MAX_GUARD_TIMEOUT,
        MAX_HEARTBEAT_PER_QUERY_TIMEOUT, MAX_MAX_LEASES, MAX_PRIORITY, MIN_GUARD_MARGIN,
        MIN_HEARTBEAT_INTERVAL, MIN_LOCK_DELAY, MIN_QUERY_TIMEOUT, MIN_RETRY_INTERVAL,
        RETRY_JITTER,
    };
}

/// What the statements name and read on the server: settings, the
/// notification channel, the key expression, SQLSTATEs, the token's clock
/// offset, the wait's connection check. For drivers, tools and simulated
/// servers; a lease user needs none of it.
pub mod server {
    pub use crate::sql::{
        handover_request_payload, primary_timeline, wait_limit_ms, ADVISORY_KEY_SQL,
        CHECKPOINT_SETTING, HANDOVER_CHANNEL, HISTORY_SETTING, LOCK_TIMEOUT_SQLSTATE,
        NONCE_SETTING, PRIMARY_TIMELINE_SQL, SEARCH_PATH, SERVER_TIME_SQL, TCP_SETTINGS,
        TOKEN_CLOCK_OFFSET, TOKEN_SETTING, WAIT_CONNECTION_CHECK_MS, WAIT_PRELUDE_SQL,
        WAIT_SETTING, WATCH_OF,
    };
}

// Drivers move the machine into the task that owns the connection and may
// share it behind a mutex between threads (tokio's multi-threaded runtime):
// it must be Send. Commands and events cross channels to job tasks: Send too.
static_assertions::assert_impl_all!(Machine: Send, Sync);
static_assertions::assert_impl_all!(SessionCommand: Send, Sync, Clone);
static_assertions::assert_impl_all!(RunCommand: Send, Sync, Clone);
static_assertions::assert_impl_all!(Event: Send, Sync, Clone);
static_assertions::assert_impl_all!(Input: Send, Sync, Clone);
static_assertions::assert_impl_all!(Deadline: Send, Sync, Copy, Ord);
// Errors go into `Box<dyn Error + Send + Sync>` and anyhow-style wrappers.
static_assertions::assert_impl_all!(RunRejected: Send, Sync, std::error::Error);
static_assertions::assert_impl_all!(Refusal: Send, Sync, std::error::Error);
static_assertions::assert_impl_all!(reply::ReplyError: Send, Sync, std::error::Error);
static_assertions::assert_impl_all!(inspect::InspectError: Send, Sync, std::error::Error);
