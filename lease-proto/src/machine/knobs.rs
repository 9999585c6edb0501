//! The simulator's broken variants of the machine: test knobs, and the
//! deliberate bugs ([`Mutation`]) that show a property catches them. All
//! off in production.

/// Test knobs: the simulator's broken variants, set only through
/// [`Machine::with_knobs`] (the `sim` feature). All off in production.
#[derive(Debug, Clone, Default)]
pub(crate) struct Knobs {
    /// Sessions neither set nor verify the server-side TCP settings.
    pub(crate) tcp_settings_off: bool,
    /// A session given up on is closed at once, while its cancelled jobs may
    /// still run.
    pub(crate) close_doubtful_at_once: bool,
    /// A deliberate bug planted in the machine's rules.
    #[cfg(feature = "sim")]
    pub(crate) mutation: Option<Mutation>,
}

/// A deliberate machine bug ([`SimConfig::mutation`](super::SimConfig::mutation),
/// [`Harness::with_mutation`](super::Harness::with_mutation)), for
/// broken-variant tests of the simulator's properties. Each is consulted in
/// exactly one place of the machine.
#[cfg(feature = "sim")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// Confirm a lease's validity from the arrival of the reply that
    /// confirms it, instead of from the send time of its statement: the
    /// validity window then starts up to a round trip later than the server
    /// guard's idle clock, and the margin no longer covers it.
    ConfirmAtArrival,
    /// Count a handover notification as a graceful release whoever sent
    /// it, as the machine once did: a forged `NOTIFY` (any role may send
    /// one) just before the holder's session is terminated, or a late one
    /// from an earlier holder, cuts the lock delay short.
    NotifyFromAnyone,
    /// Skip the pooler probe after a setup whose settings went by statement
    /// (the startup options were rejected): a lone client behind a
    /// transaction pooler leads.
    NoPoolerProbe,
    /// Ignore what the setup shows of a recent promotion: try on a newly
    /// promoted primary at once, while the old primary's holders still act.
    IgnorePromotion,
    /// The promotion hold as it was: only from what shows a promotion since
    /// the server's start (WAL replayed, a pending checkpoint), so that a
    /// restart of the promoted server during the hold erases it.
    HoldOnlySinceStart,
    /// Reconnect after a server restart with the doubling backoff alone,
    /// as the machine once did (no fast reconnect window): a server down for
    /// a while is tried again up to about as long after it is back.
    NoFastReconnect,
    /// A watcher that acquires: a wake of the watch session counts as the
    /// win of its key, without the lease session's try (the lease session
    /// does not hold it; its heartbeats confirm it all the same).
    WatchAcquires,
    /// A watch session that tries: it sends a try of the key instead of a
    /// wait (the simulator's check that it sends nothing but waits finds it).
    WatchTries,
    /// A lease-group member that ignores its share: it tries every key of
    /// its groups as if it owned them all (it still joins, reads and hands
    /// over as the share says).
    IgnoreShare,
    /// The lock delay only for a win that follows a wake (of the watch
    /// session) or a take, as the machine once had it: a poll (a new session's first try, the periodic try of
    /// a locker that holds another lease) that wins a key the server freed
    /// a moment ago by ending its holder's session starts the job at once.
    LockDelayOnlyAfterWakes,
    /// A try or a take that wins a key reserved meanwhile for another
    /// backend (a hand-over asked for while it was in flight) keeps it and
    /// starts its job, as the machine once did: a standby waiting on the
    /// server, which takes the key at the holder's release, would keep a
    /// key handed over to a named backend.
    KeepReservedWin,
    /// A take's win counts a release's notification from the holder it saw
    /// as graceful whoever the release granted the key to: a take queued
    /// second, granted when the first taker's session is terminated moments
    /// after the graceful release, reads the release's late notification
    /// (its session was blocked meanwhile) and starts its job while the
    /// first taker's may still run.
    IgnoreGrantee,
    /// Hand-over requests as the machine once took them: the holder hands
    /// the lease over at a request without checking that the named backend
    /// waits, and every locker reserves the key for the named backend at
    /// the request: a request for a backend that never takes the key,
    /// repeated, keeps every standby from it.
    HandOverUnchecked,
    /// An observer that tries: its standbys try their keys as any
    /// standby's do (it still never waits on the server nor joins a
    /// group), so it leads a free key.
    ObserverTries,
    /// The server's FATAL answer to a statement in flight (`57P01` when
    /// `pg_terminate_backend` or a fast shutdown lands on it) read as a
    /// failed statement, as `lease run` once read it: the loss does not say
    /// the key may be free, so a cancelled command that ignores SIGTERM is
    /// not killed within half the lock delay, and a session given up on is
    /// not watched for its end. Consulted by the simulated driver
    /// ([`SimConfig::stop_as_lease_run`](super::SimConfig::stop_as_lease_run)),
    /// where the rule lives (`Reason::key_may_be_free`).
    FatalReplyIsStatementFailure,
    /// The membership read as it was: a member lock `(group id, n)` counts
    /// whoever holds it, though `n` is not the holding backend's pid (any
    /// role may take one), so a forged lock
    /// ([`Fault::ForgedMember`](super::Fault::ForgedMember)) is a member that
    /// owns a share and never leads it. Consulted by the simulator's server
    /// model, where the rule lives (the statement's SQL).
    ForgedMemberCounted,
}
