//! # lease-proto: the sans-IO core of `lease`
//!
//! A pure state machine that makes a job run on exactly one replica at a time
//! over PostgreSQL session-level advisory locks. It does no I/O, reads no
//! clock, spawns nothing: a driver (`lease-tokio`, `lease-smol`, or your own)
//! feeds it time, replies and job exits, and executes the commands it emits.
//!
//! ```text
//! let mut m = Machine::new(Options::default(), seed)?;
//! let run = m.run(now, LeaseId::named("sweeper")?)?;
//! loop {
//!     while let Some(out) = m.poll_output() {
//!         match out {
//!             Output::Command(c) => execute(c),   // connect, send SQL, start/cancel jobs, finish runs
//!             Output::Event(e) => log(e),
//!         }
//!     }
//!     let input = wait_for_input_until(m.poll_timeout());  // reply, job exit, notification, ... or Tick
//!     m.handle_input(now(), input);
//! }
//! ```
//!
//! ## Guarantees
//!
//! | promise | bound |
//! |---|---|
//! | a job runs only after the server granted its key to this session | always |
//! | a key is released only after its job returned | always |
//! | frozen, partitioned or slow holder: the job is cancelled at `valid_until` = send time of the last confirming statement + validity window (`heartbeat + query_timeout` by default), without any reply | by the holder's own clock |
//! | ...and the server ends its session (releasing the key) no earlier than `idle_session_timeout = validity + guard_margin` after its last statement | zero overlap while clock-rate drift < `margin / (2 validity + margin)` |
//! | session lost (terminated, restart, connection closed) | every job on it cancelled on that input, not at the next heartbeat |
//! | graceful release | standbys wanting the key are notified and try at once |
//! | fencing token | strictly larger than every earlier acquisition's for the key on that server |
//! | statements | one heartbeat per interval and one standby try per tick, however many leases |
//!
//! Setups that cannot give mutual exclusion are refused with a [`Refusal`]:
//! hot standbys, transaction poolers (backend pid changes, startup options
//! rejected or not applied), servers older than 14 (13 without the guard).
//!
//! ## Driving it
//!
//! After every input, drain [`Machine::poll_output`] until `None`, then sleep
//! until [`Machine::poll_timeout`] or the next input, whichever is first, and
//! feed [`Input::Tick`]. Commands:
//! - [`Command::OpenSession`]: connect with [`SessionParams::options_string`]
//!   appended to the startup `options`; report [`Input::SessionOpened`] or
//!   [`Input::SessionLost`]. Watch the connection: any end of it is
//!   [`Input::SessionLost`], reported at once.
//! - [`Command::Query`]: send [`Statement::sql`] with the simple-query
//!   protocol, decode every row with [`decode_text_row`], report
//!   [`Input::Reply`]. Report notifications as [`Input::Notification`].
//! - [`Command::CloseSession`]: drop the connection.
//! - [`Command::StartJob`], [`Command::CancelJob`]: start or cancel the job;
//!   report [`Input::JobExited`] when it returns.
//! - [`Command::FinishRun`]: hand the [`Outcome`] to the caller.
//!
//! The machine owns every deadline (query timeouts, validity, backoff, retry),
//! so a driver needs exactly one timer.
//!
//! ## Simulator
//!
//! With the `sim` feature, the `sim` module simulates a cluster of processes, a
//! PostgreSQL server, the network between them and their faults in virtual
//! time, deterministically from a seed.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod io;
mod key;
mod machine;
mod options;
mod sql;

#[cfg(feature = "sim")]
pub mod sim;

pub use io::{
    Command, DbError, Event, Input, JobExit, Outcome, Output, QueryId, Reason, Refusal, RunId,
    SessionId, SessionParams,
};
pub use key::{key_for_name, LeaseId, NameError};
pub use machine::{
    LeaseState, LeaseStatus, Machine, RunError, SessionState, Status, MIN_SERVER_VERSION,
    MIN_SERVER_VERSION_GUARD, RECONNECT_BASE,
};
pub use options::{
    Options, OptionsError, DEFAULT_GUARD_MARGIN, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_LEASES,
    DEFAULT_QUERY_TIMEOUT, DEFAULT_RETRY_INTERVAL, MAX_MAX_LEASES, RETRY_JITTER,
};
pub use sql::{decode_text_row, DecodeError, Row, Statement, HANDOVER_CHANNEL};

// Drivers move the machine into the task that owns the connection and may
// share it behind a mutex between threads (tokio's multi-threaded runtime):
// it must be Send. Commands and events cross channels to job tasks: Send too.
static_assertions::assert_impl_all!(Machine: Send, Sync);
static_assertions::assert_impl_all!(Output: Send, Sync, Clone);
static_assertions::assert_impl_all!(Input: Send, Sync, Clone);
// Errors go into `Box<dyn Error + Send + Sync>` and anyhow-style wrappers.
static_assertions::assert_impl_all!(RunError: Send, Sync, std::error::Error);
static_assertions::assert_impl_all!(Refusal: Send, Sync, std::error::Error);
