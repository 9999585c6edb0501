//! A nemesis: a random fault schedule ([`schedule`], a proptest strategy)
//! and [`TestServer::run_schedule`], which injects it in the runtime's time.

use std::future::poll_fn;
use std::time::Duration;

use proptest::prelude::*;
use tokio_postgres::NoTls;

use super::TestServer;
use crate::{Adapter, Locker, Runtime};

/// One fault of a schedule; lockers by number (their index in the slice
/// given to [`TestServer::run_schedule`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// [`TestServer::terminate`].
    Terminate(usize),
    /// [`TestServer::partition`] for this long.
    Partition(usize, Duration),
    /// [`TestServer::freeze`] for this long.
    Freeze(usize, Duration),
    /// [`TestServer::slow`]: this one-way latency from now on.
    Slow(Duration),
    /// [`TestServer::restart`] with this downtime.
    Restart(Duration),
}

/// Faults at times from the start of [`TestServer::run_schedule`], in order.
pub type Schedule = Vec<(Duration, Fault)>;

/// Up to `max` faults on `lockers` lockers within `span`, each lasting up
/// to `longest`, in time order. Freezes are left out with `freeze: false`
/// (a frozen locker's job runs on past its lease: overlap is then expected,
/// only fencing protects).
pub fn schedule(
    lockers: usize,
    span: Duration,
    longest: Duration,
    max: usize,
    freeze: bool,
) -> impl Strategy<Value = Schedule> {
    let ms = |d: Duration| d.as_millis().max(1) as u64;
    let (span, longest) = (ms(span), ms(longest));
    let locker = 0..lockers.max(1);
    let length = (1..=longest).prop_map(Duration::from_millis);
    let fault = prop_oneof![
        3 => locker.clone().prop_map(Fault::Terminate),
        3 => (locker.clone(), length.clone()).prop_map(|(l, d)| Fault::Partition(l, d)),
        (if freeze { 2 } else { 0 }) => (locker, length.clone()).prop_map(|(l, d)| Fault::Freeze(l, d)),
        1 => (1..=50u64).prop_map(|ms| Fault::Slow(Duration::from_millis(ms))),
        1 => length.prop_map(Fault::Restart),
    ];
    proptest::collection::vec((0..span, fault), 0..=max).prop_map(|mut faults| {
        faults.sort_by_key(|(at, _)| *at);
        (faults.into_iter())
            .map(|(at, f)| (Duration::from_millis(at), f))
            .collect()
    })
}

impl<A: Adapter<NoTls>> TestServer<A> {
    /// Injects `schedule` on `lockers`, each fault at its time from now
    /// (sleeping on the runtime's timer in between); returns after the
    /// last was injected.
    pub async fn run_schedule<B>(&self, lockers: &[Locker<B>], schedule: &[(Duration, Fault)]) {
        let start = self.runtime.now();
        for (at, fault) in schedule {
            let mut timer = self.runtime.timer(start + *at);
            poll_fn(|cx| timer.as_mut().poll(cx)).await;
            self.inject(lockers, fault);
        }
    }

    /// Injects one fault now.
    pub fn inject<B>(&self, lockers: &[Locker<B>], fault: &Fault) {
        let pick = |i: usize| &lockers[i % lockers.len()];
        match *fault {
            Fault::Terminate(i) => self.terminate(pick(i)),
            Fault::Partition(i, d) => self.partition(pick(i), d),
            Fault::Freeze(i, d) => self.freeze(pick(i), d),
            Fault::Slow(latency) => self.slow(latency),
            Fault::Restart(downtime) => self.restart(downtime),
        }
    }
}
