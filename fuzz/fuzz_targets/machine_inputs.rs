//! Fuzz target `machine_inputs`: arbitrary input sequences into one
//! [`Machine`], the coverage-guided counterpart of the
//! `arbitrary_inputs_keep_every_rule` property in `lease-proto/tests/behaviour/arbitrary_inputs.rs`
//! (its findings, reduced, are `lease-proto/tests/behaviour/fuzz_regressions.rs`).
//!
//! The fuzzer picks valid [`Options`] (derived from bytes; inputs whose options
//! fail [`Options::validate`] are skipped), a jitter seed, and a sequence of
//! steps: runs by one of a few names, by a raw key or by an arbitrary name;
//! job exits, shutdowns and closes for run ids near the real ones; sessions
//! opened or lost with ids near (mostly equal to) the current one; replies and
//! errors for query ids near the current one, with plausible rows built from
//! the statement in flight; notifications; time moving forward by zero or
//! more, jumping exactly onto the machine's deadline, or handing in a stale
//! instant.
//!
//! Plausible rows are what a server would answer, built with the typed
//! encoders (`SetupReply::to_rows` and the others): most of the time from the
//! session the machine set up (the nonce its setup statement carries, the
//! backend pid the setup reported, the backend pid and nonce its try carries,
//! the TCP settings and guard the options ask for), so inputs get past setup
//! to tries, jobs, heartbeats, releases and waits; sometimes with another
//! pid, a wrong or missing nonce, a missing setting, a row left out or
//! doubled, or with `extra` rows of any width appended or alone, so malformed
//! replies stay reachable. A wait is answered with the heartbeat's rows and
//! its outcome (woken, or held at its lock timeout), a take likewise (taken
//! with its token, held, crowded, held by this backend, the outcome or the
//! token left out), or either failed with SQLSTATE 55P03 (a server that does
//! not catch the lock timeout) or any other error.
//!
//! After every step it checks:
//! - no panic;
//! - every command passes the shared [`Harness`]'s observer (one statement in
//!   flight, no re-entrant try, no unlock under a running job, each run
//!   finished once...);
//! - [`Machine::poll_timeout`] is never in the past, and a driver that wakes
//!   at the deadline it was given does not spin there: after at most a few
//!   ticks at that same instant the deadline moves on;
//! - a lease the machine calls valid belongs to a running job, was won on the
//!   session that is still current, and is valid no longer than the validity
//!   window past the last statement sent;
//! - a job starts only in the step that answers the try or take in flight
//!   (or ends its reply's hold-back), valid no longer than the validity
//!   window past that statement's send time: in particular after the watch
//!   session's woken wait no job starts before a try was sent and answered
//!   (a watch session's wait never acquires).
//!
//! With `LEASE_FUZZ_STATS` set in its environment the target also counts how
//! far inputs get (sessions ready, jobs started, waits woken...) and prints
//! the counts when the process exits, e.g. after
//! `LEASE_FUZZ_STATS=1 cargo fuzz run --sanitizer none machine_inputs CORPUS -- -runs=0`
//! (every input of CORPUS once). Off, it costs one atomic load per input.

#![no_main]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use lease_proto::sim::{Command, Harness};
use lease_proto::{
    key_for_name,
    limits::DEFAULT_LOCK_DELAY,
    reply::{HeartbeatReply, MembersReply, ReleaseReply, Row, SetupReply, TryReply, VerifyReply},
    server::{HANDOVER_CHANNEL, LOCK_TIMEOUT_SQLSTATE},
    Event, Input, JobExit, LeaseId, Options, QueryId, RunId, ServerWait, SessionError, SessionId,
    Statement,
};
use libfuzzer_sys::fuzz_target;

/// Counts of how far inputs get, for one-off runs with `LEASE_FUZZ_STATS` set.
mod stats {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::OnceLock;

    /// What is counted: the index of each in [`NAMES`].
    #[derive(Clone, Copy)]
    pub enum Mark {
        Ready,
        Refused,
        Try,
        StartJob,
        Heartbeat,
        Verify,
        CancelJob,
        Release,
        Released,
        Wait,
        Woken,
        WaitTimedOut,
        WaitFailed,
        WaitInterrupted,
    }

    pub const N: usize = 14;
    const NAMES: [&str; N] = [
        "session ready",
        "refused",
        "try sent",
        "job started",
        "heartbeat sent",
        "verify sent",
        "job cancelled",
        "release sent",
        "lease released",
        "wait sent",
        "wait woken",
        "wait timed out (held)",
        "wait failed",
        "wait interrupted",
    ];

    /// One input's counts.
    #[derive(Default)]
    pub struct Seen([u32; N]);

    impl Seen {
        pub fn mark(&mut self, m: Mark) {
            self.0[m as usize] += 1;
        }
    }

    static ENABLED: OnceLock<bool> = OnceLock::new();
    static INPUTS: AtomicU64 = AtomicU64::new(0);
    static HIT: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
    static TOTAL: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

    extern "C" {
        fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
    }

    extern "C" fn print() {
        let inputs = INPUTS.load(Relaxed);
        eprintln!("machine_inputs stats: {inputs} inputs (inputs with it / total)");
        for (i, name) in NAMES.iter().enumerate() {
            let (hit, total) = (HIT[i].load(Relaxed), TOTAL[i].load(Relaxed));
            let pct = 100.0 * hit as f64 / inputs.max(1) as f64;
            eprintln!("  {name:<24} {hit:>9} ({pct:5.1} %) / {total:>10}");
        }
    }

    fn enabled() -> bool {
        *ENABLED.get_or_init(|| {
            let on = std::env::var_os("LEASE_FUZZ_STATS").is_some();
            // SAFETY: `print` only reads atomics and writes to stderr.
            if on && unsafe { atexit(print) } != 0 {
                eprintln!("machine_inputs stats: atexit failed, no counts will be printed");
            }
            on
        })
    }

    /// Adds one input's counts, if counting is on.
    pub fn add(seen: &Seen) {
        if !enabled() {
            return;
        }
        INPUTS.fetch_add(1, Relaxed);
        for (i, &n) in seen.0.iter().enumerate() {
            if n > 0 {
                HIT[i].fetch_add(1, Relaxed);
                TOTAL[i].fetch_add(u64::from(n), Relaxed);
            }
        }
    }
}

use stats::Mark;

/// Most steps of one input; longer inputs are cut.
const MAX_STEPS: usize = 400;
/// How many ticks at one instant a driver may need before the deadline moves.
const MAX_TICKS_AT_ONE_INSTANT: usize = 4;

/// One fuzz input.
#[derive(Arbitrary, Debug)]
struct Case {
    options: OptionBytes,
    seed: u64,
    steps: Vec<Step>,
}

/// The raw material of [`Options`]; not every value is valid.
#[derive(Arbitrary, Debug)]
struct OptionBytes {
    retry_interval: Dur,
    heartbeat_interval: Dur,
    query_timeout: Dur,
    validity: Option<Dur>,
    server_guard: bool,
    guard_margin: Dur,
    notify_handover: bool,
    max_leases: u8,
    /// `server_wait` `Off` for 192 and above (one in four), else the default
    /// `IdleAndWatch` (an exhausted input, all zeros, waits).
    poll: u8,
    /// 0: the default lock delay, 1: none, otherwise `n / 255` of the retry
    /// interval (never above it: those options are refused).
    lock_delay: u8,
}

/// A duration of up to about 33 s, with sub-millisecond precision (the guard
/// timeout rounds to whole milliseconds).
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Dur(u16, u8);

impl Dur {
    fn get(self) -> Duration {
        Duration::from_micros(u64::from(self.0) * 500 + u64::from(self.1 % 4) * 125)
    }
}

impl OptionBytes {
    fn options(&self) -> Options {
        let retry_interval = self.retry_interval.get();
        {
            let mut o = Options::default();
            o.retry_interval = retry_interval;
            o.heartbeat_interval = self.heartbeat_interval.get();
            o.query_timeout = self.query_timeout.get();
            o.validity = self.validity.map(Dur::get);
            o.server_guard = self.server_guard;
            o.guard_margin = self.guard_margin.get();
            o.notify_handover = self.notify_handover;
            o.max_leases = usize::from(self.max_leases);
            o.server_wait = if self.poll < 192 {
                ServerWait::IdleAndWatch
            } else {
                ServerWait::Off
            };
            o.lock_delay = match self.lock_delay {
                0 => DEFAULT_LOCK_DELAY.min(retry_interval),
                1 => Duration::ZERO,
                n => retry_interval * u32::from(n) / 255,
            };
            o
        }
    }
}

/// What happens next.
#[derive(Arbitrary, Debug)]
enum Step {
    /// `Machine::run` of a lease.
    Run(Lease),
    /// The job of a run near the real ones exits.
    Exit { run: u8, exit: Exit },
    /// Graceful shutdown of a run near the real ones.
    Shutdown { run: u8 },
    /// Close the machine.
    Close,
    /// A session near the current one opened.
    Opened { delta: i8 },
    /// A session near the current one was lost.
    Lost { delta: i8, error: Option<Error> },
    /// A reply for a query near the current one.
    Reply { delta: i8, rows: Rows },
    /// A statement error for a query near the current one.
    Failed { delta: i8, error: Error },
    /// A notification, from backend `self.pid + 1 + sender / 8`: the range
    /// the holders of the try replies come from.
    Notify {
        channel: Channel,
        payload: Payload,
        sender: u8,
    },
    /// Time moves forward by this many milliseconds (zero included), then a tick.
    Advance { ms: u16 },
    /// Time moves forward by this many microseconds, then a tick.
    AdvanceMicros { us: u16 },
    /// Time jumps exactly onto `poll_timeout()`, then a tick.
    ToDeadline,
    /// The driver hands in instants this many milliseconds older than the
    /// latest one (a `now` taken before a lock was acquired), then a tick.
    Stale { ms: u16 },
}

/// Which lease a run is for.
#[derive(Arbitrary, Debug)]
enum Lease {
    /// `k0` .. `k3`.
    Named(u8),
    /// A raw key.
    Raw(i64),
    /// The raw key of `k0` .. `k3`: the same lock under another name.
    RawOfName(u8),
    /// Any name (often refused by `LeaseId::named`).
    Name(String),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Exit {
    Ok,
    Failed,
    Abandoned,
}

/// A server or client error.
#[derive(Arbitrary, Debug)]
struct Error {
    code: Code,
    message: Message,
}

#[derive(Arbitrary, Debug)]
enum Code {
    None,
    /// SQLSTATE 55P03: how a wait's lock timeout ends it.
    LockTimeout,
    /// One of the SQLSTATEs a lease session sees.
    Known(u8),
    Other(String),
}

const SQLSTATES: &[&str] = &[
    "57P01", "57P05", "57P02", "57P03", "53200", "53300", "08006", "08P01", "08001", "25006",
    "40001", "40P01", "55P03", "42501", "XX000",
];

#[derive(Arbitrary, Debug)]
enum Message {
    /// What PgBouncer says when it rejects the `options` startup parameter.
    StartupRejected,
    /// What PostgreSQL says when a statement's `lock_timeout` ends it.
    LockTimeout,
    Other(String),
}

impl Error {
    fn session_error(&self) -> SessionError {
        let code = match &self.code {
            Code::None => None,
            Code::LockTimeout => Some(LOCK_TIMEOUT_SQLSTATE.to_string()),
            Code::Known(i) => Some(SQLSTATES[usize::from(*i) % SQLSTATES.len()].to_string()),
            Code::Other(s) => Some(s.clone()),
        };
        let message = match &self.message {
            Message::StartupRejected => "unsupported startup parameter: options".to_string(),
            Message::LockTimeout => "canceling statement due to lock timeout".to_string(),
            Message::Other(s) => s.clone(),
        };
        SessionError {
            code,
            message,
            config: false,
        }
    }
}

/// The rows of a reply: for `shape` below 208 (13 in 16, and an exhausted
/// input) the plausible rows alone, up to 239 with `extra` appended, from
/// 240 `extra` alone.
#[derive(Arbitrary, Debug)]
struct Rows {
    shape: u8,
    plausible: Plausible,
    /// Anything, of any width.
    extra: Vec<Vec<Option<i64>>>,
}

/// A reply shaped like the last statement's: `who` says which session it
/// claims to come from, `picks` choose per value or row between the faithful
/// answer (0, what an exhausted input gives, is always faithful) and its
/// variants.
#[derive(Arbitrary, Debug)]
struct Plausible {
    who: Who,
    picks: Vec<u8>,
    token: i64,
}

/// Which session a reply says it comes from: `wrong` below 224 (seven in
/// eight) the session the machine set up; otherwise another backend pid, a
/// wrong or missing nonce, or no pid at all.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Who {
    wrong: u8,
    pid: i64,
    nonce: Option<i64>,
}

/// What a [`Who`] claims.
#[derive(Debug, Clone, Copy)]
enum Claim {
    Real,
    OtherPid(i64),
    OtherNonce(Option<i64>),
    NoPid,
}

impl Who {
    fn claim(self) -> Claim {
        match self.wrong {
            0..=223 => Claim::Real,
            224..=239 => Claim::OtherPid(self.pid),
            240..=251 => Claim::OtherNonce(self.nonce),
            _ => Claim::NoPid,
        }
    }

    /// `(pid, nonce)` as claimed, for a session whose real ones are these.
    fn session(self, pid: i64, nonce: Option<i64>) -> (Option<i64>, Option<i64>) {
        match self.claim() {
            Claim::Real => (Some(pid), nonce),
            Claim::OtherPid(p) => (Some(p), nonce),
            Claim::OtherNonce(n) => (Some(pid), n),
            Claim::NoPid => (None, nonce),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Channel {
    Handover,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Payload {
    /// The key of `k0` .. `k3`, in decimal.
    Named(u8),
    /// A key seen in a statement, padded with whitespace or not.
    Seen {
        index: u8,
        padded: bool,
    },
    Text(String),
}

/// The fuzzer's side of the machine: the shared [`Harness`] (machine,
/// observer, clock), the fuzzer's time line, ids seen, and the extra checks.
struct Fuzz {
    h: Harness,
    base: Instant,
    /// The time handed in with the next input.
    t: Duration,
    /// The latest time ever handed in: the machine's clock.
    latest: Duration,
    /// Run ids handed out so far.
    runs: u64,
    /// The session asked for last, if it is the current one.
    current: Option<SessionId>,
    /// When the last statement was sent.
    last_sent: Option<Duration>,
    /// The backend pid of the last session that passed setup.
    pid: i64,
    /// The nonce of the last setup sent.
    nonce: Option<i64>,
    /// When the try in flight (if the statement in flight is one) was sent.
    try_sent: Option<Duration>,
    /// A wait woke and no try was answered since.
    woken: bool,
    /// The send time of a try whose answer started no job: its wins may be
    /// held back for the lock delay and start in a later step (a tick, or a
    /// graceful release's notification). Ends with a job start, a session's
    /// end, or the next try.
    held_try: Option<Duration>,
    /// The session each job was started on.
    job_session: BTreeMap<RunId, Option<SessionId>>,
    /// Every key seen in a statement, and the named ones.
    keys: Vec<i64>,
    /// Jobs running (started, exit not yet reported), with their keys.
    running: BTreeMap<RunId, i64>,
    /// How far this input got.
    seen: stats::Seen,
}

fn named_key(i: u8) -> i64 {
    key_for_name(&format!("k{}", i % 4))
}

impl Fuzz {
    fn new(options: Options, seed: u64) -> Option<Fuzz> {
        let h = Harness::new(options, seed).ok()?;
        Some(Fuzz {
            base: h.now(),
            h,
            t: Duration::ZERO,
            latest: Duration::ZERO,
            runs: 0,
            current: None,
            last_sent: None,
            pid: 4242,
            nonce: None,
            try_sent: None,
            held_try: None,
            woken: false,
            job_session: BTreeMap::new(),
            keys: (0..4).map(named_key).collect(),
            running: BTreeMap::new(),
            seen: stats::Seen::default(),
        })
    }

    fn now(&self) -> Instant {
        self.base + self.t
    }

    /// A run id near the real ones: every id handed out, and the next one.
    fn run_id(&self, r: u8) -> RunId {
        RunId(u64::from(r) % (self.runs + 1))
    }

    /// An id near `id`: `id` itself for `delta` within ±95 (about 5 in 6
    /// with the rest), otherwise up to 2 off.
    fn near(id: Option<u64>, delta: i8) -> Option<u64> {
        let off = if delta.unsigned_abs() < 96 {
            0
        } else {
            delta % 3
        };
        id.map(|i| i.wrapping_add_signed(i64::from(off)))
    }

    fn step(&mut self, step: Step) {
        let input = match step {
            Step::Run(lease) => {
                let lease = match lease {
                    Lease::Named(i) => LeaseId::named(format!("k{}", i % 4)).ok(),
                    Lease::Raw(k) => Some(LeaseId::raw(k)),
                    Lease::RawOfName(i) => Some(LeaseId::raw(named_key(i))),
                    Lease::Name(n) => LeaseId::named(n).ok(),
                };
                if let Some(lease) = lease {
                    self.h.set_now(self.now());
                    if let Ok(run) = self.h.start(lease) {
                        assert_eq!(run, RunId(self.runs), "run ids are sequential");
                        self.runs += 1;
                    }
                }
                None
            }
            Step::Exit { run, exit } => Some(Input::JobExited {
                run: self.run_id(run),
                exit: match exit {
                    Exit::Ok => JobExit::Ok,
                    Exit::Failed => JobExit::Failed,
                    Exit::Abandoned => JobExit::Abandoned,
                },
            }),
            Step::Shutdown { run } => Some(Input::Shutdown {
                run: self.run_id(run),
            }),
            Step::Close => Some(Input::Close),
            Step::Opened { delta } => {
                Self::near(self.h.session().map(|s| s.0), delta).map(|s| Input::SessionOpened {
                    session: SessionId(s),
                })
            }
            Step::Lost { delta, error } => {
                Self::near(self.h.session().map(|s| s.0), delta).map(|s| Input::SessionEnded {
                    session: SessionId(s),
                    error: error.map(|e| e.session_error()),
                })
            }
            Step::Reply { delta, rows } => {
                let rows = match rows.shape {
                    0..=207 => self.plausible(rows.plausible),
                    208..=239 => {
                        let mut plausible = self.plausible(rows.plausible);
                        plausible.extend(rows.extra);
                        plausible
                    }
                    _ => rows.extra,
                };
                let query = Self::near(self.h.last_query().map(|q| q.0 .0), delta);
                query.map(|q| Input::Reply {
                    query: QueryId(q),
                    result: Ok(rows),
                })
            }
            Step::Failed { delta, error } => Self::near(self.h.last_query().map(|q| q.0 .0), delta)
                .map(|q| Input::Reply {
                    query: QueryId(q),
                    result: Err(error.session_error()),
                }),
            Step::Notify {
                channel,
                payload,
                sender,
            } => Some(Input::Notification {
                sender_pid: self.pid.wrapping_add(1 + i64::from(sender >> 3)),
                channel: match channel {
                    Channel::Handover => HANDOVER_CHANNEL.to_string(),
                    Channel::Other(c) => c,
                },
                payload: match payload {
                    Payload::Named(i) => named_key(i).to_string(),
                    Payload::Seen { index, padded } => {
                        let k = self.keys[usize::from(index) % self.keys.len()];
                        if padded {
                            format!(" {k}\n")
                        } else {
                            k.to_string()
                        }
                    }
                    Payload::Text(s) => s,
                },
            }),
            Step::Advance { ms } => {
                self.forward(Duration::from_millis(u64::from(ms)));
                Some(Input::Tick)
            }
            Step::AdvanceMicros { us } => {
                self.forward(Duration::from_micros(u64::from(us)));
                Some(Input::Tick)
            }
            Step::ToDeadline => {
                if let Some(d) = self.h.machine().poll_timeout() {
                    let d = d.saturating_duration_since(self.base);
                    self.t = self.t.max(d);
                    self.latest = self.latest.max(self.t);
                }
                Some(Input::Tick)
            }
            Step::Stale { ms } => {
                self.t = self
                    .latest
                    .saturating_sub(Duration::from_millis(u64::from(ms)));
                Some(Input::Tick)
            }
        };
        self.feed(input);
        self.check_deadline();
        self.check_validity();
    }

    fn forward(&mut self, d: Duration) {
        self.t = self.latest + d;
        self.latest = self.t;
    }

    /// Feeds the input (if any) now and drains every command through the
    /// harness's observer, then tracks what the extra checks need.
    fn feed(&mut self, input: Option<Input>) {
        if let Some(Input::JobExited { run, .. }) = &input {
            self.running.remove(run);
        }
        if let Some(Input::SessionEnded { session, .. }) = &input {
            if self.current == Some(*session) {
                self.current = None;
            }
        }
        if let Some(Input::Reply {
            query,
            result: Err(e),
        }) = &input
        {
            let waiting = matches!(self.h.in_flight(), Some((q, Statement::Wait { .. } | Statement::Take { .. })) if q == query);
            if waiting && e.code.as_deref() == Some(lease_proto::server::LOCK_TIMEOUT_SQLSTATE) {
                self.seen.mark(Mark::WaitTimedOut);
            }
        }
        if let Some(Input::Reply {
            query,
            result: Ok(rows),
        }) = &input
        {
            let waiting = matches!(self.h.in_flight(), Some((q, Statement::Wait { .. } | Statement::Take { .. })) if q == query);
            let held =
                lease_proto::reply::WaitReply::parse(rows).is_ok_and(|r| r.freed == Some(false));
            if waiting && held {
                self.seen.mark(Mark::WaitTimedOut);
            }
        }
        // A job may start only in the step that answers the try (or the
        // take: a wait that takes its key) in flight, or at the end of its
        // reply's hold-back.
        let answers_try = match (&input, self.h.in_flight()) {
            (
                Some(Input::Reply {
                    query,
                    result: Ok(_),
                }),
                Some((q, Statement::TryLock { .. } | Statement::Take { .. })),
            ) if query == q => self.try_sent,
            _ => self.held_try,
        };
        let answers_try_reply = matches!(
            (&input, self.h.in_flight()),
            (Some(Input::Reply { query, result: Ok(_) }), Some((q, Statement::TryLock { .. } | Statement::Take { .. }))) if query == q
        );
        if let (
            Some(Input::Reply { query, .. }),
            Some((q, Statement::TryLock { .. } | Statement::Take { .. })),
        ) = (&input, self.h.in_flight())
        {
            if query == q {
                self.woken = false;
            }
        }
        self.h.set_now(self.now());
        let commands = self
            .h
            .step(input)
            .unwrap_or_else(|e| panic!("observer: {e}"));
        if answers_try_reply {
            self.held_try = answers_try;
        }
        for e in self.h.events() {
            match e {
                Event::SessionLost { .. } | Event::SessionOpening { .. } => self.held_try = None,
                Event::SessionReady { backend_pid, .. } => {
                    self.pid = *backend_pid;
                    self.seen.mark(Mark::Ready);
                }
                Event::Refused { .. } => self.seen.mark(Mark::Refused),
                Event::Released { .. } => self.seen.mark(Mark::Released),
                Event::KeyFreed { .. } => {
                    self.woken = true;
                    self.seen.mark(Mark::Woken);
                }
                Event::WaitFailed { .. } => self.seen.mark(Mark::WaitFailed),
                Event::WaitInterrupted { .. } => self.seen.mark(Mark::WaitInterrupted),
                _ => {}
            }
        }
        for c in commands {
            match c {
                Command::OpenSession { session, .. } => self.current = Some(session),
                Command::CloseSession { session } => {
                    if self.current == Some(session) {
                        self.current = None;
                    }
                }
                Command::Query { statement, .. } | Command::Probe { statement, .. } => {
                    self.try_sent = None;
                    match &statement {
                        Statement::Setup { nonce, .. } => self.nonce = Some(*nonce),
                        Statement::TryLock { .. } | Statement::Take { .. } => {
                            self.try_sent = Some(self.latest)
                        }
                        _ => {}
                    }
                    if let Statement::TryLock { keys, .. } | Statement::Release { keys, .. } =
                        &statement
                    {
                        for k in keys {
                            if !self.keys.contains(k) && self.keys.len() < 64 {
                                self.keys.push(*k);
                            }
                        }
                    }
                    let mark = match statement {
                        Statement::TryLock { .. } => Some(Mark::Try),
                        Statement::Heartbeat | Statement::CheckHandover { .. } => {
                            Some(Mark::Heartbeat)
                        }
                        Statement::Verify => Some(Mark::Verify),
                        Statement::Release { .. } => Some(Mark::Release),
                        Statement::Wait { .. } | Statement::Take { .. } => Some(Mark::Wait),
                        Statement::Setup { .. }
                        | Statement::Listen
                        | Statement::Members { .. }
                        | Statement::Prefer { .. } => None,
                    };
                    if let Some(m) = mark {
                        self.seen.mark(m);
                    }
                    self.last_sent = Some(self.latest);
                }
                Command::StartJob {
                    run,
                    lease,
                    valid_until,
                    ..
                } => {
                    let validity = self.h.machine().options().validity_window();
                    let Some(sent) = answers_try else {
                        panic!(
                            "job of {run:?} started in a step that answered no try{}",
                            if self.woken {
                                " (after the watch session's woken wait: it never acquires)"
                            } else {
                                ""
                            }
                        )
                    };
                    assert!(
                        valid_until <= self.base + sent + validity,
                        "job of {run:?} started valid for more than the validity window past its try"
                    );
                    self.seen.mark(Mark::StartJob);
                    self.held_try = None;
                    self.job_session.insert(run, self.current);
                    self.running.insert(run, lease.key());
                }
                Command::CancelJob { .. } => self.seen.mark(Mark::CancelJob),
                Command::FinishRun { .. } => {}
                // The watch session: its waits are never answered here (it
                // times out and falls back to polling); the harness's
                // observer checks that it sends nothing but waits.
                Command::OpenWatch { .. }
                | Command::WatchQuery { .. }
                | Command::CloseWatch { .. } => {}
            }
        }
    }

    /// `poll_timeout()` is never in the past, and a driver waking at it does
    /// not spin there.
    fn check_deadline(&mut self) {
        let mut ticks = 0;
        while let Some(d) = self.h.machine().poll_timeout() {
            let now = self.base + self.latest;
            assert!(
                d >= now,
                "poll_timeout {:?} in the past",
                now.duration_since(d)
            );
            if d > now {
                return;
            }
            // Due now: a driver's timer fires at once and it feeds a tick.
            ticks += 1;
            assert!(
                ticks <= MAX_TICKS_AT_ONE_INSTANT,
                "poll_timeout stays at now after {MAX_TICKS_AT_ONE_INSTANT} ticks: a driver spins"
            );
            self.t = self.latest;
            self.feed(Some(Input::Tick));
        }
    }

    /// A lease with a `valid_until` has a running job; a valid lease was won
    /// on the current session; none is valid longer than the validity window
    /// past the last statement sent.
    fn check_validity(&self) {
        let validity = self.h.machine().options().validity_window();
        let now = self.base + self.latest;
        for r in 0..self.runs {
            let run = RunId(r);
            let Some(until) = self.h.machine().valid_until(run) else {
                continue;
            };
            assert!(
                self.running.contains_key(&run),
                "{run:?} has a valid_until but its job is not running"
            );
            let sent = self.last_sent.expect("a lease is valid, so a try was sent");
            assert!(
                until <= self.base + sent + validity,
                "{run:?} valid until {:?} after the last statement, past the validity window {validity:?}",
                until - (self.base + sent)
            );
            if self.h.machine().is_valid(run, now) {
                let won_on = self.job_session.get(&run).copied().flatten();
                assert!(
                    won_on.is_some() && won_on == self.current,
                    "{run:?} is valid but its session {won_on:?} is not the current one ({:?})",
                    self.current
                );
            }
        }
    }

    /// Rows shaped like the reply to the last statement: see [`Plausible`].
    fn plausible(&self, p: Plausible) -> Vec<Row> {
        let pick = |i: usize| p.picks.get(i).copied().unwrap_or(0);
        let opts = self.h.machine().options();
        match self.h.last_query().map(|q| &q.1) {
            Some(Statement::Setup { nonce, .. }) => {
                let (pid, nonce) = p.who.session(self.pid, Some(*nonce));
                let server_version = match variant(pick(0), 5) {
                    None => 150_000,
                    Some(v) => [170_002, 140_000, 139_999, 130_000, 120_000][usize::from(v)],
                };
                let idle_session_timeout_ms = match variant(pick(2), 3) {
                    None => Some(opts.guard_timeout().as_millis() as i64),
                    Some(0) => Some(0),
                    Some(1) => None,
                    Some(_) => Some(p.token),
                };
                let unix_socket = variant(pick(4), 1).is_some();
                let mut tcp_settings = opts.tcp_settings().map(|(_, v)| Some(v));
                match variant(pick(3), 3) {
                    None if !unix_socket => {}
                    // Over a Unix socket the server reads back 0.
                    None | Some(0) => tcp_settings = [Some(0); 4],
                    Some(1) => tcp_settings = [None; 4],
                    Some(_) => tcp_settings[p.token.rem_euclid(4) as usize] = Some(p.token),
                }
                let mut rows = SetupReply {
                    server_version,
                    in_recovery: variant(pick(1), 1).is_some(),
                    backend_pid: pid.unwrap_or(p.who.pid),
                    idle_session_timeout_ms,
                    tcp_settings,
                    unix_socket,
                    nonce,
                    search_path_catalog: true,
                    promotion: Default::default(),
                    // Any reading: the clock's comparison must not panic.
                    server_clock_us: Some(p.token),
                }
                .to_rows();
                let at = usize::from(pick(6)) % rows.len();
                match variant(pick(5), 3) {
                    None => {}
                    Some(0) => {
                        rows.remove(at);
                    }
                    Some(1) => rows.reverse(),
                    // The first row of a tag counts: an earlier one with
                    // another value wins.
                    Some(_) => {
                        let shadow = vec![rows[at][0], Some(p.token)];
                        rows.insert(0, shadow);
                    }
                }
                rows
            }
            Some(Statement::Listen) | None => Vec::new(),
            Some(Statement::TryLock {
                keys,
                backend_pid,
                nonce,
            }) => {
                let (pid, nonce) = p.who.session(*backend_pid, Some(*nonce));
                let mut reply = TryReply {
                    session: pid.map(|pid| (pid, nonce)),
                    ..TryReply::default()
                };
                let mut doubled = Vec::new();
                for (i, &k) in keys.iter().enumerate() {
                    let b = pick(i);
                    // Another backend, never this one.
                    let other = backend_pid.wrapping_add(1 + i64::from(b >> 3));
                    match (b % 8, (b >> 3) % 4) {
                        (0..=3, _) => reply.won.push((k, p.token)),
                        (4..=6, _) => reply.not_won.push((k, Some(other))),
                        (_, 0) => reply.not_won.push((k, None)),
                        // Held by this session's own backend: another
                        // client shares it.
                        (_, 1) => reply.not_won.push((k, Some(*backend_pid))),
                        // Unanswered.
                        (_, 2) => {}
                        // Answered twice: untrusted.
                        (_, _) => {
                            reply.won.push((k, p.token));
                            doubled.push(vec![Some(k), None, Some(other)]);
                        }
                    }
                }
                let mut rows = reply.to_rows();
                rows.extend(doubled);
                rows
            }
            // A wait answers what a heartbeat answers and whether the key
            // was freed (mostly woken; held at its lock timeout; the row
            // left out).
            Some(Statement::Wait { .. }) => {
                let freed = match pick(1) % 4 {
                    0 | 1 => Some(true),
                    2 => Some(false),
                    _ => None,
                };
                let session = self.heartbeat_reply(p.who);
                // The server's deadlock_timeout: mostly the default, else
                // anything from 1 ms (the wait limit below the shortest wait).
                let deadlock_timeout_ms = match pick(2) % 4 {
                    0 | 1 => Some(1000),
                    2 => Some(i64::from(pick(3)) * 8 + 1),
                    _ => None,
                };
                // Now and then a wait that did not queue (its key crowded).
                let crowded = freed == Some(false) && pick(3) % 5 == 0;
                let reply = lease_proto::reply::WaitReply {
                    session,
                    freed,
                    crowded,
                    deadlock_timeout_ms,
                    ..Default::default()
                };
                let mut rows = reply.to_rows();
                if variant(pick(0), 1).is_some() {
                    rows.reverse();
                }
                rows
            }
            // A take answers what a wait does, and its token when it took
            // the key (mostly taken; held at its lock timeout; crowded; held
            // by this backend already; the outcome or the token left out).
            Some(Statement::Take { .. }) => {
                let (freed, crowded, held_here) = match pick(1) % 6 {
                    0..=2 => (Some(true), false, false),
                    3 => (Some(false), false, false),
                    4 => (Some(false), pick(3) % 2 == 0, pick(3) % 2 == 1),
                    _ => (None, false, false),
                };
                let token = (freed == Some(true) && pick(2) % 8 != 0).then_some(p.token);
                let reply = lease_proto::reply::WaitReply {
                    session: self.heartbeat_reply(p.who),
                    freed,
                    crowded,
                    held_here,
                    token,
                    deadlock_timeout_ms: Some(1000),
                };
                let mut rows = reply.to_rows();
                if variant(pick(0), 1).is_some() {
                    rows.reverse();
                }
                rows
            }
            // A preference is a heartbeat that notifies (this target's
            // options have no priority: never sent).
            Some(Statement::Heartbeat | Statement::Prefer { .. }) => {
                let mut rows = self.heartbeat_reply(p.who).to_rows();
                if variant(pick(0), 1).is_some() {
                    rows.reverse();
                }
                rows
            }
            // A check: a heartbeat that confirms any of the asks (by ordinal,
            // some out of range).
            Some(Statement::CheckHandover { asks }) => {
                let waiting = (0..asks.len() + 1)
                    .filter(|i| variant(pick(1 + i % 6), 1).is_some())
                    .map(|i| (i as i64 + 1, asks.get(i).map_or(p.token & 0xffff, |a| a.1)))
                    .collect();
                lease_proto::reply::CheckReply {
                    session: self.heartbeat_reply(p.who),
                    waiting,
                }
                .to_rows()
            }
            Some(Statement::Verify) => {
                // Faithful: the server holds the keys of the running jobs;
                // a pick may flip any key seen (a lost lease, an orphan).
                let held = (self.keys.iter().enumerate())
                    .filter(|&(i, k)| {
                        let running = self.running.values().any(|r| r == k);
                        running != variant(pick(i + 1), 1).is_some()
                    })
                    .map(|(_, &k)| k)
                    .collect();
                let mut rows = VerifyReply {
                    session: self.heartbeat_reply(p.who),
                    held,
                }
                .to_rows();
                if variant(pick(0), 1).is_some() {
                    rows.reverse();
                }
                rows
            }
            // This target's runs are in no group, so no membership read is
            // sent; answered as a session with no members and no holders.
            Some(Statement::Members { .. }) => {
                let session = self.heartbeat_reply(p.who);
                MembersReply {
                    backend_pid: session.backend_pid,
                    nonce: session.nonce,
                    ..MembersReply::default()
                }
                .to_rows()
            }
            Some(Statement::Release { keys, .. }) => {
                let mut unlocked = Vec::new();
                for (i, &k) in keys.iter().enumerate() {
                    match variant(pick(i), 2) {
                        None => unlocked.push((k, true)),
                        Some(0) => unlocked.push((k, false)),
                        Some(_) => {}
                    }
                }
                ReleaseReply { unlocked }.to_rows()
            }
        }
    }

    /// The heartbeat reply `who` claims for the current session.
    fn heartbeat_reply(&self, who: Who) -> HeartbeatReply {
        let (backend_pid, nonce) = who.session(self.pid, self.nonce);
        HeartbeatReply {
            backend_pid,
            nonce,
            server_clock_us: None,
        }
    }
}

/// `None` (the faithful value) for a pick below 240, so 15 in 16 random
/// picks and every pick of an exhausted input; otherwise one of `n` variants.
fn variant(pick: u8, n: u8) -> Option<u8> {
    pick.checked_sub(240).map(|v| v % n)
}

fuzz_target!(|case: Case| {
    let options = case.options.options();
    if options.validate().is_err() {
        return;
    }
    let mut h = Fuzz::new(options, case.seed).expect("validated options");
    for step in case.steps.into_iter().take(MAX_STEPS) {
        h.step(step);
    }
    stats::add(&h.seen);
});
