//! A nemesis: a random timeline of disruptions ([`timeline`], a proptest strategy)
//! and [`TestServer::run_timeline`], which injects it in the runtime's time.

use std::future::poll_fn;
use std::time::Duration;

use proptest::prelude::*;

/// proptest, as the kit uses it (`proptest!`, `TestRunner`): no dependency
/// of your own needed.
pub use proptest;

use super::{TestAdapter, TestServer};
use crate::{Locker, Runtime};

/// One disruption of a timeline; lockers by number (their index in the slice
/// given to [`TestServer::run_timeline`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disruption {
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

/// Disruptions at times from the start of [`TestServer::run_timeline`], in order.
pub type Timeline = Vec<(Duration, Disruption)>;

/// The relative weights of the disruptions a [`timeline`] draws (0: never).
/// The default draws every disruption but freezes: a frozen locker's job runs on
/// past its lease (the kit cannot stop it), so two runs overlap and only
/// fencing protects; add them for fencing checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    /// [`Disruption::Terminate`].
    pub terminate: u32,
    /// [`Disruption::Partition`].
    pub partition: u32,
    /// [`Disruption::Freeze`].
    pub freeze: u32,
    /// [`Disruption::Slow`].
    pub slow: u32,
    /// [`Disruption::Restart`].
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

/// Up to `max` disruptions on `lockers` lockers at times within `span`, each
/// lasting up to `longest`, drawn by `mix`, in time order.
pub fn timeline(
    lockers: usize,
    span: Duration,
    longest: Duration,
    max: usize,
    mix: Mix,
) -> impl Strategy<Value = Timeline> {
    let ms = |d: Duration| d.as_millis().max(1) as u64;
    let (span, longest) = (ms(span), ms(longest));
    let locker = 0..lockers.max(1);
    let length = (1..=longest).prop_map(Duration::from_millis);
    let disruption = prop_oneof![
        mix.terminate => locker.clone().prop_map(Disruption::Terminate),
        mix.partition => (locker.clone(), length.clone()).prop_map(|(l, d)| Disruption::Partition(l, d)),
        mix.freeze => (locker, length.clone()).prop_map(|(l, d)| Disruption::Freeze(l, d)),
        mix.slow => (1..=50u64).prop_map(|ms| Disruption::Slow(Duration::from_millis(ms))),
        mix.restart => length.prop_map(Disruption::Restart),
    ];
    proptest::collection::vec((0..span, disruption), 0..=max).prop_map(|mut faults| {
        faults.sort_by_key(|(at, _)| *at);
        (faults.into_iter())
            .map(|(at, f)| (Duration::from_millis(at), f))
            .collect()
    })
}

impl<A: TestAdapter> TestServer<A> {
    /// Injects `timeline` on `lockers`, each disruption at its time from now
    /// (sleeping on the runtime's timer in between); returns after the
    /// last was injected.
    pub async fn run_timeline<B>(
        &self,
        lockers: &[Locker<B>],
        timeline: &[(Duration, Disruption)],
    ) {
        let start = self.runtime.now();
        for (at, disruption) in timeline {
            let mut timer = self.runtime.timer(start + *at);
            poll_fn(|cx| timer.as_mut().poll(cx)).await;
            self.inject(lockers, disruption);
        }
    }

    /// Injects one disruption now.
    pub fn inject<B>(&self, lockers: &[Locker<B>], disruption: &Disruption) {
        let pick = |i: usize| &lockers[i % lockers.len()];
        match *disruption {
            Disruption::Terminate(i) => self.terminate(pick(i)),
            Disruption::Partition(i, d) => self.partition(pick(i), d),
            Disruption::Freeze(i, d) => self.freeze(pick(i), d),
            Disruption::Slow(latency) => self.slow(latency),
            Disruption::Restart(downtime) => self.restart(downtime),
        }
    }
}
