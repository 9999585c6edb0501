//! [`Group`]: runs that take part in a lease group's share.

use std::fmt;
use std::future::Future;

use lease_proto::{GroupId, LeaseId, NameError};

use crate::{run, Lease, Locker, RunError};

/// A lease group's handle on a [`Locker`]: its runs behave exactly as
/// [`Locker::run`]'s (the same contract, [`Lease`] handle and errors, and
/// [`RunError::GroupWithoutNotify`] on a locker without
/// [`Options::notify_handover`](crate::Options::notify_handover)), and
/// take part in the group's share. Every locker running leases of one
/// group is a member; the group's leases are spread evenly over the live
/// members, and a lease moves (its job cancelled with
/// [`Reason::HandedOver`](crate::Reason::HandedOver), then released, then
/// run on its new member) when members join or leave. The rules and
/// bounds: `docs/library.md`, "Lease groups", and `docs/guarantees.md`.
///
/// ```no_run
/// # fn f(locker: lease_driver::Locker) {
/// let reconcilers = locker.group("reconcilers");
/// for i in 0..12 {
///     let run = reconcilers.run(&format!("reconciler-{i}"), |lease| async move {
///         lease.cancelled().await; // a handed-over lease is cancelled too
///         Ok::<(), std::io::Error>(())
///     });
///     // spawn `run` on your runtime
///     # drop(run);
/// }
/// # }
/// ```
pub struct Group<A = ()> {
    locker: Locker<A>,
    group: Result<GroupId, NameError>,
}

impl<A> Clone for Group<A> {
    fn clone(&self) -> Self {
        Group {
            locker: self.locker.clone(),
            group: self.group.clone(),
        }
    }
}

impl<A> fmt::Debug for Group<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group").field("group", &self.group).finish()
    }
}

impl<A> Locker<A> {
    /// The lease group `name` on this locker (see [`Group`]). A bad name
    /// (the rules: [`LeaseId::named`]) is returned by each run, as
    /// [`RunError::Name`].
    #[must_use]
    pub fn group(&self, name: &str) -> Group<A> {
        Group {
            locker: self.clone(),
            group: GroupId::named(name),
        }
    }
}

impl<A> Group<A> {
    /// The group's name and id, if the name is valid.
    pub fn id(&self) -> Result<&GroupId, &NameError> {
        self.group.as_ref()
    }

    /// [`Locker::run`], in the group's share.
    #[must_use = "the run does nothing unless awaited or spawned"]
    pub fn run<F, Fut, E>(
        &self,
        name: &str,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<E>>>
    where
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        self.run_until(name, std::future::pending(), job)
    }

    /// [`Locker::run_until`], in the group's share.
    #[must_use = "the run does nothing unless awaited or spawned"]
    pub fn run_until<S, F, Fut, E>(
        &self,
        name: &str,
        shutdown: S,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<E>>>
    where
        S: Future<Output = ()>,
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        run::run(self.locker.clone(), self.lease(name), shutdown, job)
    }

    /// The lease `name` in this group.
    fn lease(&self, name: &str) -> Result<LeaseId, NameError> {
        (self.group.clone()).and_then(|g| LeaseId::named(name).map(|l| l.in_group(g)))
    }

    /// [`Locker::schedule`] in this group: the group's members share its
    /// schedules as they share its leases (each leads about its share), and
    /// a member that joins or leaves moves schedules, each at most once per
    /// due time as at any takeover (docs/schedules.md).
    ///
    /// # Errors
    /// As [`Locker::schedule`], and [`RunError::GroupWithoutNotify`] as
    /// [`Group::run`].
    #[cfg(feature = "schedule")]
    #[must_use = "the schedule does nothing unless awaited or spawned"]
    pub fn schedule<F, Fut, E>(
        &self,
        name: &str,
        schedule: crate::Schedule,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<std::convert::Infallible>>>
    where
        F: FnMut(crate::Occurrence) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        self.schedule_until(name, schedule, std::future::pending(), job)
    }

    /// [`Group::schedule`] with a graceful shutdown signal (as
    /// [`Locker::schedule_until`]).
    ///
    /// # Errors
    /// As [`Group::schedule`].
    #[cfg(feature = "schedule")]
    #[must_use = "the schedule does nothing unless awaited or spawned"]
    pub fn schedule_until<S, F, Fut, E>(
        &self,
        name: &str,
        schedule: crate::Schedule,
        shutdown: S,
        job: F,
    ) -> impl Future<Output = Result<(), RunError<std::convert::Infallible>>>
    where
        S: Future<Output = ()>,
        F: FnMut(crate::Occurrence) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let lease = self.lease(name);
        crate::schedule::run_schedule(self.locker.clone(), lease, schedule, shutdown, job)
    }
}
