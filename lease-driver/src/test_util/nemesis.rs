//! A nemesis: a random fault schedule ([`schedule`], a proptest strategy)
//! and [`TestServer::run_schedule`], which injects it in the runtime's time.

use std::future::poll_fn;
use std::time::Duration;

use proptest::prelude::*;

/// proptest, as the kit uses it (`proptest!`, `TestRunner`): no dependency
/// of your own needed.
pub use proptest;

use super::{TestAdapter, TestServer};
use crate::{Locker, Runtime};

/// One fault of a schedule; lockers by number (their index in the slice
/// given to [`TestServer::run_schedule`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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

/// The relative weights of the faults a [`schedule`] draws (0: never).
/// The default draws every fault but freezes: a frozen locker's job runs on
/// past its lease (the kit cannot stop it), so two runs overlap and only
/// fencing protects; add them for fencing checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    /// [`Fault::Terminate`].
    pub terminate: u32,
    /// [`Fault::Partition`].
    pub partition: u32,
    /// [`Fault::Freeze`].
    pub freeze: u32,
    /// [`Fault::Slow`].
    pub slow: u32,
    /// [`Fault::Restart`].
    pub restart: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            terminate: 3,
            partition: 3,
            freeze: 0,
            slow: 1,
            restart: 1,
        }
    }
}

/// Up to `max` faults on `lockers` lockers at times within `span`, each
/// lasting up to `longest`, drawn by `mix`, in time order.
pub fn schedule(
    lockers: usize,
    span: Duration,
    longest: Duration,
    max: usize,
    mix: Mix,
) -> impl Strategy<Value = Schedule> {
    let ms = |d: Duration| d.as_millis().max(1) as u64;
    let (span, longest) = (ms(span), ms(longest));
    let locker = 0..lockers.max(1);
    let length = (1..=longest).prop_map(Duration::from_millis);
    let fault = prop_oneof![
        mix.terminate => locker.clone().prop_map(Fault::Terminate),
        mix.partition => (locker.clone(), length.clone()).prop_map(|(l, d)| Fault::Partition(l, d)),
        mix.freeze => (locker, length.clone()).prop_map(|(l, d)| Fault::Freeze(l, d)),
        mix.slow => (1..=50u64).prop_map(|ms| Fault::Slow(Duration::from_millis(ms))),
        mix.restart => length.prop_map(Fault::Restart),
    ];
    proptest::collection::vec((0..span, fault), 0..=max).prop_map(|mut faults| {
        faults.sort_by_key(|(at, _)| *at);
        (faults.into_iter())
            .map(|(at, f)| (Duration::from_millis(at), f))
            .collect()
    })
}

impl<A: TestAdapter> TestServer<A> {
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
