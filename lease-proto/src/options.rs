//! Tuning knobs, their defaults, and their validation.

use std::fmt;
use std::time::Duration;

/// Default standby poll interval: how often a standby tries a lease it does not
/// hold. Each wait is jittered down by up to [`RETRY_JITTER`].
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(5);
/// Default heartbeat interval: how often the session proves it is the same live
/// session (backend pid and nonce), which confirms
/// the leases it holds.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// Default query timeout: how long one statement (or a connection attempt with
/// its setup) may take before the session is declared lost (and closed once
/// the cancelled jobs returned).
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Default margin by which the server guard (`idle_session_timeout`) outlasts
/// the validity window.
pub const DEFAULT_GUARD_MARGIN: Duration = Duration::from_secs(1);
/// Default cap on leases (runs) per locker. The server's lock table is shared
/// by every session (`max_locks_per_transaction` x `max_connections`, 6,400
/// slots with the defaults); one session that fills it makes every new
/// connection to the server fail, so the cap stays well below that.
pub const DEFAULT_MAX_LEASES: usize = 1_000;
/// Default [`Options::lock_delay`]: 20 ms.
pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_millis(20);

/// The highest priority of a [`Role::Candidate`]: the one above it ranks a requested
/// hand-over (`lease handover --to`), above every priority.
pub const MAX_PRIORITY: u32 = u32::MAX - 1;
/// Largest accepted [`Options::max_leases`].
pub const MAX_MAX_LEASES: usize = 100_000;
/// Each standby wait is `retry_interval * (1 - RETRY_JITTER * u)`, `u` uniform
/// in `[0, 1)`: replicas started together do not poll in lockstep, and the
/// retry interval stays an upper bound.
pub const RETRY_JITTER: f64 = 0.2;
/// Shortest accepted [`Options::query_timeout`]: it also bounds connecting
/// plus setup, which no server reached over a network (TCP, maybe TLS, a
/// setup round trip) reliably does faster; a shorter one only loops on
/// timeouts.
pub const MIN_QUERY_TIMEOUT: Duration = Duration::from_millis(10);
/// Shortest accepted [`Options::heartbeat_interval`]: each heartbeat is a
/// round trip, which no server reached over a network reliably makes faster
/// (the bound of [`MIN_QUERY_TIMEOUT`]); a shorter interval keeps the next
/// heartbeat due before the last is answered, a busy loop of statements.
/// The validity window, longer than the heartbeat interval, is above it too.
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(10);
/// Shortest accepted [`Options::retry_interval`]: a standby's poll, each
/// wait's lock timeout and the reconnect backoff cap; below a round trip
/// (as [`MIN_HEARTBEAT_INTERVAL`]) they become a busy loop of tries and
/// connection attempts.
pub const MIN_RETRY_INTERVAL: Duration = Duration::from_millis(10);
/// Shortest accepted [`Options::guard_margin`]: the guard is set in the
/// server's unit, whole milliseconds ([`Options::guard_timeout`]); a
/// shorter margin is rounded away and absorbs no drift.
pub const MIN_GUARD_MARGIN: Duration = Duration::from_millis(1);
/// Shortest accepted [`Options::lock_delay`] other than zero (which turns
/// the delay off): below a millisecond it is shorter than the scheduling
/// and clock resolution it is meant to outlast, a unit mistake (`20ns` for
/// `20ms`) rather than a tuning.
pub const MIN_LOCK_DELAY: Duration = Duration::from_millis(1);
/// Largest accepted ratio `heartbeat_interval / query_timeout`. A heartbeat
/// 100 times longer than the longest statement it allows is already unusual;
/// beyond that the values are almost certainly in swapped or mistyped units
/// (`--heartbeat-interval 1h --query-timeout 1ms`).
pub const MAX_HEARTBEAT_PER_QUERY_TIMEOUT: u32 = 100;
/// Largest accepted [`Options::guard_timeout`] (validity plus margin): 10
/// minutes. The lease session tells the server never to give up on its TCP
/// connection before the guard (see [`Options::tcp_settings`]), but some
/// give-ups are outside its reach: a pooler's or proxy's own client socket,
/// or a server on a platform without `TCP_USER_TIMEOUT`, drop a black-holed
/// connection holding unacknowledged data (a reply, a `NOTIFY`) after the
/// kernel's retransmissions, about 15 minutes with Linux's default
/// `tcp_retries2`, and then free the session's locks early. 10 minutes
/// keeps a third of that as room.
pub const MAX_GUARD_TIMEOUT: Duration = Duration::from_secs(600);

/// Tunes a locker: every lease of one session, their timing and their limits
/// (in this crate, a [`Machine`](crate::Machine)). `Options::default()` is
/// production-ready; each field below states its default, and the methods
/// below what the timings add up to.
///
/// Start from the default and set what you change, so that a field added
/// later never breaks your code:
///
/// ```
/// use std::time::Duration;
/// let mut options = lease_proto::Options::default();
/// options.retry_interval = Duration::from_secs(2);
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Options {
    /// Standby poll interval (default 5 s, at least [`MIN_RETRY_INTERVAL`],
    /// jittered down by up to 20 %). With
    /// [`Options::server_wait`] at its default a standby holding nothing
    /// learns of a freed key from the server at once (a locker that holds a
    /// lease, on its watch session), and this is the fallback
    /// and the lock timeout of each wait; otherwise it bounds takeover when
    /// no handover notification arrives (holder crashed, frozen or
    /// partitioned). It is also the cap of the reconnect backoff.
    pub retry_interval: Duration,
    /// How often the holder proves that its session is the same live one
    /// (backend pid and nonce: a live session keeps its advisory locks),
    /// which confirms its leases (default 5 s, at least
    /// [`MIN_HEARTBEAT_INTERVAL`]). Also keeps the session from
    /// looking idle to the server guard. A locker holding nothing sends only
    /// its tries while `retry_interval + query_timeout` is below the guard
    /// (validity + margin; so with the defaults), and heartbeats in between
    /// otherwise.
    pub heartbeat_interval: Duration,
    /// How long one statement may take, and how long connecting plus setup may
    /// take (default 10 s, at least [`MIN_QUERY_TIMEOUT`]). A statement past
    /// it cannot be abandoned politely:
    /// every lease on the session is lost and the session is closed (once the
    /// cancelled jobs have returned). Keep it well above
    /// the worst round trip a healthy server and a busy process produce; it is
    /// independent of the heartbeat interval.
    pub query_timeout: Duration,
    /// How long a lease stays valid after the send time of the last statement
    /// that confirmed it (default `None`: `heartbeat_interval + query_timeout`).
    /// Past it the machine cancels the job on its own and gives up the session
    /// (closed once the cancelled jobs returned),
    /// even if no reply or error has come. Must be longer than
    /// `heartbeat_interval`.
    pub validity: Option<Duration>,
    /// Server guard (default on): the session is opened with
    /// `idle_session_timeout = validity + guard_margin`, so the server ends
    /// the session of a frozen or partitioned holder, releasing its locks,
    /// always after the holder's own validity has ended. Needs PostgreSQL 14.
    ///
    /// Off: a frozen holder keeps its locks until it resumes and a silently
    /// partitioned one until TCP keepalives end its session (hours with Linux
    /// defaults); nobody else leads meanwhile. Turn it off only if the server
    /// ends idle sessions on its own terms.
    pub server_guard: bool,
    /// How much longer the server guard waits than the validity window
    /// (default 1 s, at least [`MIN_GUARD_MARGIN`]). Absorbs clock-rate
    /// drift between holder and server: the
    /// guarantee holds while the drift stays below [`Options::drift_bound`].
    /// The margin in force is never below
    /// `validity / 50` (1 % drift): see [`Options::guard_margin_in_force`].
    pub guard_margin: Duration,
    /// Handover notification (default on): a graceful release sends
    /// `NOTIFY`, and standbys that want that key try at once instead of at
    /// their next poll. Off: a standby takes over within one retry interval,
    /// and a run in a lease group is refused
    /// ([`RunRejected::GroupWithoutNotify`](crate::RunRejected); why:
    /// docs/library.md, "Lease groups").
    pub notify_handover: bool,
    /// How a standby learns that a key it wants was freed: from the server
    /// at once, or at its next poll (default [`ServerWait::IdleAndWatch`]).
    /// Either way the poll every `retry_interval` stays as the fallback.
    pub server_wait: ServerWait,
    /// How long after a try wins a key its job starts, unless a handover
    /// notification from the holder the standby saw says the release was
    /// graceful (default [`DEFAULT_LOCK_DELAY`]; zero, or at least
    /// [`MIN_LOCK_DELAY`]). Chubby's lock-delay: a key
    /// freed because the server ended its holder's session
    /// (`pg_terminate_backend`, a reset connection) is freed the moment the
    /// old holder learns of it, so its job may still be stopping. Every win
    /// gets it, after a wake or a poll alike; the rule: the machine's
    /// `Machine::try_answered`; the bound: docs/guarantees.md, "lock delay".
    pub lock_delay: Duration,
    /// Most runs one locker may have at once (default 1,000, at most 100,000).
    /// A run past it fails with [`RunRejected::TooManyLeases`](crate::RunRejected).
    pub max_leases: usize,
    /// Whether this locker's runs may lead, and with which priority
    /// (default [`Role::Candidate`] of priority 0: leads when it wins a key,
    /// never asks for one).
    pub role: Role,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            retry_interval: DEFAULT_RETRY_INTERVAL,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            query_timeout: DEFAULT_QUERY_TIMEOUT,
            validity: None,
            server_guard: true,
            guard_margin: DEFAULT_GUARD_MARGIN,
            notify_handover: true,
            max_leases: DEFAULT_MAX_LEASES,
            server_wait: ServerWait::IdleAndWatch,
            lock_delay: DEFAULT_LOCK_DELAY,
            role: Role::default(),
        }
    }
}

/// How a standby learns that a key it wants was freed ([`Options::server_wait`]).
///
/// The watch session exists only on top of the idle wait, so "the watch session
/// without waiting on the server" cannot be said:
///
/// ```
/// use lease_proto::{Options, ServerWait};
/// let mut options = Options::default();
/// assert_eq!(options.server_wait, ServerWait::IdleAndWatch);
/// options.server_wait = ServerWait::Idle; // one connection per locker, always
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ServerWait {
    /// Poll only: a standby tries each key it wants every `retry_interval`,
    /// and no session of this locker ever waits on the server (for a pooler
    /// with very few server connections).
    Off,
    /// While a locker holds nothing, its idle session waits for a wanted key
    /// to be freed (one key at a time, under a lock timeout of at most
    /// `retry_interval`) and tries the moment it is, instead of at its next
    /// poll. A locker that holds a lease and wants another polls for it
    /// every `retry_interval`.
    Idle,
    /// [`ServerWait::Idle`], and the watch session (the default): while a
    /// locker holds a lease and wants another, a second connection to the
    /// same server waits there for a wanted key to be freed, so the locker
    /// takes a crashed holder's lease as fast as an idle standby does,
    /// instead of at its next poll: its lease session must stay free for
    /// heartbeats and releases. One more connection per such locker (a
    /// locker with one lease never opens it; nor does one behind a pooler
    /// that rejected the startup options); it never acquires or holds
    /// anything. While it is down, such a locker polls every
    /// `retry_interval`. The rule (when it opens, which key it waits for):
    /// the machine's `watch` module; the bound: docs/guarantees.md,
    /// "instant takeover".
    #[default]
    IdleAndWatch,
}

impl ServerWait {
    /// Whether a locker that holds nothing waits on the server
    /// ([`ServerWait::Idle`] or [`ServerWait::IdleAndWatch`]).
    pub fn idle(self) -> bool {
        self != ServerWait::Off
    }

    /// Whether a locker that holds a lease and wants another opens the watch
    /// session ([`ServerWait::IdleAndWatch`]).
    pub fn watch(self) -> bool {
        self == ServerWait::IdleAndWatch
    }
}

/// Whether a locker's runs may lead, and with which priority ([`Options::role`]).
///
/// An observer has no priority: it never leads, so it never asks to. The
/// combination cannot be written:
///
/// ```compile_fail,E0559
/// let role = lease_proto::Role::Observer { priority: 3 };
/// ```
///
/// ```
/// use lease_proto::{Options, Role};
/// let mut options = Options::default();
/// assert_eq!(options.role, Role::Candidate { priority: 0 });
/// options.role = Role::Candidate { priority: 3 };
/// assert!(options.validate().is_ok());
/// options.role = Role::Observer;
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// A candidate (the default, with priority 0): its runs try their keys
    /// and lead when they win one.
    ///
    /// `priority` (at most [`MAX_PRIORITY`], checked by
    /// [`Options::validate`]): a standby whose try finds its key held asks
    /// the holder to hand the lease over (again less and less often, and no
    /// more once that holder has handed it over three times); a holder of a
    /// lower priority does (as asked by `lease handover --to`) once it sees
    /// the standby wait for the key on the server, one of an equal or higher
    /// priority ignores it. 0 never asks. Not for lease-group runs (their
    /// share decides); a standby that does not wait on the server
    /// ([`ServerWait::Off`], or behind a pooler that rejects startup
    /// options) is never handed a lease by priority. The rule, in one place:
    /// the machine's `Machine::preference_requested`; the bound:
    /// docs/guarantees.md.
    Candidate {
        /// The priority: 0 (never asks) to [`MAX_PRIORITY`].
        priority: u32,
    },
    /// An observer: this locker's runs never lead. They never try a key,
    /// never wait on the server for one (nor open the watch session), never
    /// join a lease group (so they count in no share), and stand by until
    /// they are cancelled or the locker closes; each run learns the key's
    /// holder from a `pg_locks` read per retry interval instead of a try.
    /// The rule, in one place: the machine's `Machine::observes`; the
    /// candidate policy: docs/library.md, "Observers and priorities".
    Observer,
}

impl Default for Role {
    fn default() -> Self {
        Role::Candidate { priority: 0 }
    }
}

impl Role {
    /// Whether this is [`Role::Observer`].
    pub fn is_observer(self) -> bool {
        self == Role::Observer
    }

    /// A candidate's priority; `None` for an observer, which never asks.
    pub fn priority(self) -> Option<u32> {
        match self {
            Role::Candidate { priority } => Some(priority),
            Role::Observer => None,
        }
    }
}

/// Why [`Options`] were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OptionsError {
    /// An interval is zero.
    Zero(&'static str),
    /// An interval is absurdly long (over a day).
    TooLong(&'static str),
    /// The validity window is not longer than the heartbeat interval.
    ValidityNotAboveHeartbeat {
        /// The validity window.
        validity: Duration,
        /// The heartbeat interval.
        heartbeat: Duration,
    },
    /// `max_leases` is 0 or above [`MAX_MAX_LEASES`].
    MaxLeases(usize),
    /// An interval is below its floor: [`MIN_RETRY_INTERVAL`],
    /// [`MIN_HEARTBEAT_INTERVAL`], [`MIN_QUERY_TIMEOUT`],
    /// [`MIN_GUARD_MARGIN`] or (unless zero) [`MIN_LOCK_DELAY`].
    TooShort {
        /// The option, as the messages name it (`"heartbeat interval"`).
        what: &'static str,
        /// The value given.
        value: Duration,
        /// Its floor.
        min: Duration,
    },
    /// The heartbeat interval is more than [`MAX_HEARTBEAT_PER_QUERY_TIMEOUT`]
    /// times the query timeout.
    HeartbeatTooLongForQueryTimeout {
        /// The heartbeat interval.
        heartbeat: Duration,
        /// The query timeout.
        query_timeout: Duration,
    },
    /// The guard timeout (validity plus margin) is above [`MAX_GUARD_TIMEOUT`].
    GuardTooLong(Duration),
    /// The lock delay is longer than the retry interval.
    LockDelayAboveRetry {
        /// The lock delay.
        lock_delay: Duration,
        /// The retry interval.
        retry: Duration,
    },
    /// The lock delay is not below the validity window: a win is held back
    /// that long before its job starts, counted in the lease's validity
    /// (from the try's send time), so no job would ever start.
    LockDelayAboveValidity {
        /// The lock delay.
        lock_delay: Duration,
        /// The validity window.
        limit: Duration,
    },
    /// A priority above [`MAX_PRIORITY`] (the one above it ranks a
    /// `lease handover --to` request).
    PriorityTooHigh(u32),
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionsError::Zero(what) => write!(f, "{what} must be greater than zero"),
            OptionsError::TooLong(what) => write!(f, "{what} must be at most one day"),
            OptionsError::ValidityNotAboveHeartbeat {
                validity,
                heartbeat,
            } => write!(
                f,
                "validity ({validity:?}) must be longer than the heartbeat interval ({heartbeat:?})"
            ),
            OptionsError::MaxLeases(n) => {
                write!(
                    f,
                    "max leases must be between 1 and {MAX_MAX_LEASES}, not {n}"
                )
            }
            OptionsError::TooShort { what, value, min } => {
                write!(f, "{what} ({value:?}) must be at least {min:?}")?;
                match *what {
                    LOCK_DELAY => f.write_str(" (or zero, no delay)"),
                    QUERY_TIMEOUT => f.write_str(": it also bounds connecting and setup"),
                    GUARD_MARGIN => f.write_str(": the server counts whole milliseconds"),
                    _ => f.write_str(": a shorter one is a busy loop of statements"),
                }
            }
            OptionsError::HeartbeatTooLongForQueryTimeout {
                heartbeat,
                query_timeout,
            } => write!(
                f,
                "heartbeat interval ({heartbeat:?}) must be at most {MAX_HEARTBEAT_PER_QUERY_TIMEOUT} times the query timeout ({query_timeout:?})"
            ),
            OptionsError::GuardTooLong(d) => write!(
                f,
                "validity plus guard margin ({d:?}) must be at most {MAX_GUARD_TIMEOUT:?}: a TCP connection with unacknowledged data is dropped after about 15 minutes with Linux defaults, freeing the locks early"
            ),
            OptionsError::LockDelayAboveRetry { lock_delay, retry } => write!(
                f,
                "lock delay ({lock_delay:?}) must be at most the retry interval ({retry:?}): a standby polls at least that often anyway"
            ),
            OptionsError::PriorityTooHigh(p) => write!(
                f,
                "priority {p} is above the highest, {MAX_PRIORITY} (the one above it ranks a requested hand-over)"
            ),
            OptionsError::LockDelayAboveValidity { lock_delay, limit } => write!(
                f,
                "lock delay ({lock_delay:?}) must be below the validity window ({limit:?}): a won lease's job starts that long after the win, within the validity counted from the try"
            ),
        }
    }
}

impl std::error::Error for OptionsError {}

/// The options' names in [`OptionsError`].
const RETRY_INTERVAL: &str = "retry interval";
const HEARTBEAT_INTERVAL: &str = "heartbeat interval";
const QUERY_TIMEOUT: &str = "query timeout";
const GUARD_MARGIN: &str = "guard margin";
const LOCK_DELAY: &str = "lock delay";

impl Options {
    /// The validity window in force: [`Options::validity`] or
    /// `heartbeat_interval + query_timeout` (15 s with the defaults).
    pub fn validity_window(&self) -> Duration {
        self.validity
            .unwrap_or(self.heartbeat_interval + self.query_timeout)
    }

    /// The guard margin in force: [`Options::guard_margin`], raised to
    /// `validity / 50` if it is smaller, so a long validity keeps a margin
    /// proportional to it.
    pub fn guard_margin_in_force(&self) -> Duration {
        self.guard_margin.max(self.validity_window() / 50)
    }

    /// The clock-rate drift between holder and server the guarantee allows:
    /// `margin / (2 * validity + margin)` with the margin in force (3.2 %
    /// with the defaults). The one definition of the bound the docs state;
    /// a holder-side deadline measured on the holder's clock from a
    /// confirming statement must come early enough by this share of its
    /// length (see [`Options::act_after_validity`]).
    pub fn drift_bound(&self) -> f64 {
        let v = self.validity_window().as_secs_f64();
        let m = self.guard_margin_in_force().as_secs_f64();
        m / (2.0 * v + m)
    }

    /// How long after a lease's validity end (on the holder's clock) the
    /// holder's job may still act before the server could free the key and
    /// hand it over, with the server guard; `None` without it (the server
    /// frees a silent holder's key at no moment the holder can know).
    ///
    /// It is the guard timeout measured on the holder's clock, shortened by
    /// the drift the guarantee allows ([`Options::drift_bound`]), so that a
    /// clock running that much slow still ends the job first; floored to the
    /// microsecond (early, never late); less the validity window. Always
    /// positive: `guard (1 - drift) - validity = margin validity / (2
    /// validity + margin)`. `lease run` kills its command there after a lost
    /// lease (docs/guarantees.md of the repository states that promise).
    pub fn act_after_validity(&self) -> Option<Duration> {
        if !self.server_guard {
            return None;
        }
        let guard = self.guard_timeout().mul_f64(1.0 - self.drift_bound());
        let guard = Duration::from_micros(guard.as_micros() as u64);
        Some(guard.saturating_sub(self.validity_window()))
    }

    /// How long after a hand-over's announcement or release no other locker
    /// than the one it names tries the key: two query timeouts, for the
    /// release's notification to reach it and its try to answer (the rule:
    /// the machine's `handover`).
    pub fn handover_window(&self) -> Duration {
        self.query_timeout * 2
    }

    /// The `idle_session_timeout` the session is opened with when the server
    /// guard is on: `validity_window + guard_margin_in_force`, rounded up to
    /// whole milliseconds (the server's unit): 16 s with the defaults.
    pub fn guard_timeout(&self) -> Duration {
        let d = self.validity_window() + self.guard_margin_in_force();
        let ms = d.as_nanos().div_ceil(1_000_000);
        Duration::from_millis(ms as u64)
    }

    /// How long a session on a newly promoted primary tries nothing after
    /// the promotion (see [`PromotionState`](crate::reply::PromotionState)):
    /// [`Options::guard_timeout`] plus [`Options::guard_margin_in_force`]
    /// (17 s with the defaults).
    ///
    /// A holder on the old primary acts until its last confirming
    /// statement's send time plus its validity (its cancelled job until the
    /// guard deadline, `lease run`'s command until SIGKILL there), and that
    /// statement was answered before the old primary stopped answering,
    /// which (the HA tool's part) was before the promotion. The second
    /// margin absorbs clock-rate drift between that holder and the promoted
    /// server, as the first does for the guard. Covers holders whose
    /// validity and margin are not larger than this locker's.
    pub fn promotion_hold(&self) -> Duration {
        self.guard_timeout() + self.guard_margin_in_force()
    }

    /// The server-side TCP settings the lease session is opened with, as
    /// `(name, value)` in the server's units, so that the server cannot give
    /// up on a silent client before [`Options::guard_timeout`] `G`, whatever
    /// the role, database or server configuration says:
    ///
    /// - `tcp_user_timeout = G` (ms): unacknowledged data (a reply, a
    ///   `NOTIFY`) is given up on no earlier than `G` after it was sent, which
    ///   is after the client sent its last statement. With it set, Linux ignores
    ///   `tcp_retries2`, so the bound does not depend on the server's sysctls.
    /// - `tcp_keepalives_idle = ceil(G)` (s): the first keepalive probe of a
    ///   silent connection comes no earlier than `G` after the client's last
    ///   packet; `tcp_keepalives_interval = 1` (s) and
    ///   `tcp_keepalives_count = 10` only decide how soon after that a dead
    ///   client is noticed (the guard usually ends the session first).
    ///
    /// They apply even with the guard off: a partitioned holder then keeps its
    /// locks until about `G`. Over a Unix socket the server ignores them.
    pub fn tcp_settings(&self) -> [(&'static str, i64); 4] {
        let g = self.guard_timeout();
        [
            ("tcp_user_timeout", g.as_millis() as i64),
            ("tcp_keepalives_idle", g.as_millis().div_ceil(1000) as i64),
            ("tcp_keepalives_interval", 1),
            ("tcp_keepalives_count", 10),
        ]
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`OptionsError`] for zero or over-a-day intervals, an interval below
    /// its floor ([`OptionsError::TooShort`]), a validity window not
    /// above the heartbeat interval, `max_leases` outside `1..=100_000`, a heartbeat interval above
    /// [`MAX_HEARTBEAT_PER_QUERY_TIMEOUT`] times the query timeout, or a guard
    /// timeout above [`MAX_GUARD_TIMEOUT`], or a candidate's priority above
    /// [`MAX_PRIORITY`] ([`OptionsError::PriorityTooHigh`]).
    pub fn validate(&self) -> Result<(), OptionsError> {
        const DAY: Duration = Duration::from_secs(86_400);
        let named = [
            (RETRY_INTERVAL, self.retry_interval),
            (HEARTBEAT_INTERVAL, self.heartbeat_interval),
            (QUERY_TIMEOUT, self.query_timeout),
            ("validity", self.validity_window()),
            (GUARD_MARGIN, self.guard_margin),
        ];
        for (what, d) in named {
            if d.is_zero() {
                return Err(OptionsError::Zero(what));
            }
            if d > DAY {
                return Err(OptionsError::TooLong(what));
            }
        }
        // The floors (the validity's is the heartbeat's: it is longer).
        let floors = [
            (RETRY_INTERVAL, self.retry_interval, MIN_RETRY_INTERVAL),
            (
                HEARTBEAT_INTERVAL,
                self.heartbeat_interval,
                MIN_HEARTBEAT_INTERVAL,
            ),
            (QUERY_TIMEOUT, self.query_timeout, MIN_QUERY_TIMEOUT),
            (GUARD_MARGIN, self.guard_margin, MIN_GUARD_MARGIN),
        ];
        let lock_delay =
            (!self.lock_delay.is_zero()).then_some((LOCK_DELAY, self.lock_delay, MIN_LOCK_DELAY));
        for (what, value, min) in floors.into_iter().chain(lock_delay) {
            if value < min {
                return Err(OptionsError::TooShort { what, value, min });
            }
        }
        let validity = self.validity_window();
        if validity <= self.heartbeat_interval {
            return Err(OptionsError::ValidityNotAboveHeartbeat {
                validity,
                heartbeat: self.heartbeat_interval,
            });
        }
        if self.max_leases == 0 || self.max_leases > MAX_MAX_LEASES {
            return Err(OptionsError::MaxLeases(self.max_leases));
        }
        if self.heartbeat_interval > self.query_timeout * MAX_HEARTBEAT_PER_QUERY_TIMEOUT {
            return Err(OptionsError::HeartbeatTooLongForQueryTimeout {
                heartbeat: self.heartbeat_interval,
                query_timeout: self.query_timeout,
            });
        }
        if self.guard_timeout() > MAX_GUARD_TIMEOUT {
            return Err(OptionsError::GuardTooLong(self.guard_timeout()));
        }
        if self.lock_delay > self.retry_interval {
            return Err(OptionsError::LockDelayAboveRetry {
                lock_delay: self.lock_delay,
                retry: self.retry_interval,
            });
        }
        let limit = self.validity_window();
        if self.lock_delay >= limit {
            return Err(OptionsError::LockDelayAboveValidity {
                lock_delay: self.lock_delay,
                limit,
            });
        }
        if let Some(priority) = self.role.priority().filter(|&p| p > MAX_PRIORITY) {
            return Err(OptionsError::PriorityTooHigh(priority));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented() {
        let o = Options::default();
        o.validate().unwrap();
        assert_eq!(o.validity_window(), Duration::from_secs(15));
        assert_eq!(o.guard_timeout(), Duration::from_secs(16));
        // 1 s / (2 x 15 s + 1 s): the "3 %" of the docs.
        assert!((o.drift_bound() - 1.0 / 31.0).abs() < 1e-12);
    }

    /// The job's deadline is `confirmed + validity + act_after_validity` on
    /// the holder's clock. A holder whose clock runs slow by the drift the
    /// guarantee allows (`margin / (2 validity + margin)`) measures that
    /// offset later in real time than the server frees the key.
    #[test]
    fn the_job_deadline_allows_for_the_drift_bound() {
        let cases = [
            Options::default(),
            Options {
                heartbeat_interval: Duration::from_millis(200),
                query_timeout: Duration::from_millis(500),
                guard_margin: Duration::from_millis(300),
                ..Options::default()
            },
            Options {
                validity: Some(Duration::from_secs(500)),
                ..Options::default()
            },
        ];
        for o in cases {
            let v = o.validity_window().as_secs_f64();
            let m = o.guard_margin_in_force().as_secs_f64();
            let drift = m / (2.0 * v + m);
            assert_eq!(drift, o.drift_bound());
            // Holder-clock offset from the confirming statement's send time.
            let after = o.act_after_validity().expect("the server guard is on");
            let offset = o.validity_window() + after;
            // Real time that offset takes on a clock slow by `drift`.
            let real = offset.as_secs_f64() / (1.0 - drift);
            let guard = o.guard_timeout().as_secs_f64();
            assert!(
                real <= guard,
                "validity {v} s, margin {m} s: the job acts until {offset:?} after the \
                 confirming statement on the holder's clock, {real:.4} s of real time on a \
                 clock {:.2} % slow, after the server may free the key ({guard} s)",
                drift * 100.0
            );
            // Still after the validity end.
            assert!(!after.is_zero());
        }
        assert_eq!(
            Options::default().act_after_validity(),
            Some(Duration::from_micros(483_870))
        );
        let unguarded = Options {
            server_guard: false,
            ..Options::default()
        };
        assert_eq!(unguarded.act_after_validity(), None);
    }

    #[test]
    fn bad_options_are_refused() {
        let ms = Duration::from_millis;
        fn bad(f: impl FnOnce(&mut Options)) -> OptionsError {
            let mut o = Options::default();
            f(&mut o);
            o.validate().unwrap_err()
        }
        assert_eq!(
            bad(|o| o.retry_interval = ms(0)),
            OptionsError::Zero("retry interval")
        );
        assert_eq!(
            bad(|o| o.query_timeout = ms(0)),
            OptionsError::Zero("query timeout")
        );
        assert_eq!(
            bad(|o| o.heartbeat_interval = Duration::from_secs(90_000)),
            OptionsError::TooLong("heartbeat interval")
        );
        assert!(matches!(
            bad(|o| o.validity = Some(ms(5000))),
            OptionsError::ValidityNotAboveHeartbeat { .. }
        ));
        assert_eq!(bad(|o| o.max_leases = 0), OptionsError::MaxLeases(0));
        assert_eq!(
            bad(|o| o.max_leases = 100_001),
            OptionsError::MaxLeases(100_001)
        );
        // A 2 s lock delay past a 1.1 s validity window: no win would ever
        // start its job.
        assert_eq!(
            bad(|o| {
                o.heartbeat_interval = ms(100);
                o.query_timeout = ms(1000);
                o.lock_delay = ms(2000);
            }),
            OptionsError::LockDelayAboveValidity {
                lock_delay: ms(2000),
                limit: ms(1100)
            }
        );
    }

    /// Every interval has a floor: a heartbeat of 1 ns would send
    /// heartbeats back to back. Each refusal is one line naming the option
    /// and its floor; the floors themselves stay valid.
    #[test]
    fn intervals_below_their_floor_are_refused() {
        let (ns, ms) = (Duration::from_nanos, Duration::from_millis);
        type Case = (&'static str, fn(&mut Options));
        let cases: [Case; 6] = [
            ("heartbeat interval (1ns)", |o| {
                o.heartbeat_interval = Duration::from_nanos(1)
            }),
            ("heartbeat interval (9ms)", |o| {
                o.heartbeat_interval = Duration::from_millis(9)
            }),
            ("retry interval (1ns)", |o| {
                o.retry_interval = Duration::from_nanos(1);
                o.lock_delay = Duration::ZERO;
            }),
            ("query timeout (1ms)", |o| {
                o.query_timeout = Duration::from_millis(1)
            }),
            ("guard margin (1µs)", |o| {
                o.guard_margin = Duration::from_micros(1)
            }),
            ("lock delay (1ns)", |o| {
                o.lock_delay = Duration::from_nanos(1)
            }),
        ];
        let mut accepted = Vec::new();
        for (what, set) in cases {
            let mut o = Options::default();
            set(&mut o);
            match o.validate() {
                Ok(()) => accepted.push(what),
                Err(e) => {
                    let text = e.to_string();
                    assert!(
                        text.starts_with(what) && text.contains("must be at least"),
                        "{what}: {text}"
                    );
                    assert!(!text.contains('\n'), "{text}");
                }
            }
        }
        assert!(accepted.is_empty(), "accepted: {accepted:?}");
        let o = Options {
            heartbeat_interval: ns(1),
            ..Options::default()
        };
        assert_eq!(
            o.validate(),
            Err(OptionsError::TooShort {
                what: "heartbeat interval",
                value: ns(1),
                min: MIN_HEARTBEAT_INTERVAL
            })
        );
        // At the floors (and a lock delay of zero: no delay), all is valid.
        let mut o = Options {
            heartbeat_interval: ms(10),
            retry_interval: ms(10),
            query_timeout: ms(10),
            guard_margin: ms(1),
            lock_delay: ms(1),
            ..Options::default()
        };
        assert_eq!(o.validate(), Ok(()));
        o.lock_delay = ns(0);
        assert_eq!(o.validate(), Ok(()));
    }

    #[test]
    fn the_guard_is_capped() {
        let o = |validity: u64| Options {
            validity: Some(Duration::from_secs(validity)),
            ..Options::default()
        };
        assert_eq!(o(587).validate(), Ok(()));
        assert_eq!(o(589).guard_timeout(), Duration::from_millis(600_780));
        assert_eq!(
            o(589).validate(),
            Err(OptionsError::GuardTooLong(Duration::from_millis(600_780)))
        );
        assert_eq!(
            Options::default().tcp_settings(),
            [
                ("tcp_user_timeout", 16_000),
                ("tcp_keepalives_idle", 16),
                ("tcp_keepalives_interval", 1),
                ("tcp_keepalives_count", 10)
            ]
        );
    }

    #[test]
    fn the_margin_grows_with_a_long_validity() {
        let o = Options {
            query_timeout: Duration::from_secs(95),
            ..Options::default()
        };
        o.validate().unwrap();
        assert_eq!(o.guard_margin_in_force(), Duration::from_secs(2));
        assert_eq!(o.guard_timeout(), Duration::from_secs(102));
    }

    #[test]
    fn guard_rounds_up_to_milliseconds() {
        let o = Options {
            heartbeat_interval: Duration::from_micros(100_500),
            query_timeout: Duration::from_millis(300),
            guard_margin: Duration::from_millis(100),
            ..Options::default()
        };
        assert_eq!(o.guard_timeout(), Duration::from_millis(501));
    }
}
