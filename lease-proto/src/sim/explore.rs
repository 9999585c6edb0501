//! The hook of an exhaustive explorer (the workspace's unpublished `check`
//! crate): instead of [`Sim::run_until`], which delivers events in time
//! order, the explorer asks which events are ready ([`Sim::ready`]),
//! delivers the one it chooses ([`Sim::step`]) and injects faults at the
//! instant it chooses ([`Sim::inject_fault`]). Nothing here changes how
//! [`Sim::run_until`] and [`Sim::finish`] run.

use std::collections::BTreeSet;
use std::time::Duration;

use super::net::{ToClient, ToServer};
use super::{Ev, Fault, Heal, Sim};

/// Who an event acts on: events of different actors at the same instant
/// commute (each changes only its actor's state and sends messages that
/// arrive later).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Actor {
    /// The server (a statement, connect or close arriving; its timers).
    Server,
    /// A process (a message arriving, its timer, a job's return).
    Process(usize),
    /// Anything else (a fault's start or end): ordered with everything.
    Global,
}

/// An event the explorer may deliver next: the head of its FIFO channel
/// (a link's direction, or an event of its own).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// When it is due (delivering it later delivers it at the later time).
    pub at: Duration,
    /// Its place in the queue.
    pub seq: u64,
    /// Who it acts on.
    pub actor: Actor,
    /// What it is, for a trace of the choices.
    pub label: String,
}

/// The FIFO channel of an event: messages on one link's direction keep
/// their order; every other event is a channel of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Channel {
    ToServer(usize),
    ToClient(usize),
    Own(u64),
}

fn channel(ev: &Ev, seq: u64) -> Channel {
    match ev {
        Ev::AtServer(p, _) => Channel::ToServer(*p),
        Ev::AtClient(p, _) => Channel::ToClient(*p),
        _ => Channel::Own(seq),
    }
}

fn actor(ev: &Ev) -> Actor {
    match ev {
        Ev::AtServer(..)
        | Ev::IdleCheck(_)
        | Ev::TcpCheck(_)
        | Ev::LockTimeout { .. }
        | Ev::Deliver(..) => Actor::Server,
        Ev::AtClient(p, _)
        | Ev::Deadline(p, _)
        | Ev::JobExit { p, .. }
        | Ev::StartRun { p, .. } => Actor::Process(*p),
        Ev::FaultStart(_) | Ev::Heal(_) | Ev::Close => Actor::Global,
    }
}

fn label(ev: &Ev) -> String {
    match ev {
        Ev::AtServer(p, ToServer::Connect { .. }) => format!("server <- p{p} connect"),
        Ev::AtServer(p, ToServer::Query { statement, .. }) => {
            format!("server <- p{p} {}", statement_kind(statement))
        }
        Ev::AtServer(p, ToServer::Probe { .. }) => format!("server <- p{p} probe"),
        Ev::AtServer(p, ToServer::Close { .. }) => format!("server <- p{p} close"),
        Ev::AtClient(p, msg) => {
            let what = match msg {
                ToClient::Connected { .. } => "connected".to_string(),
                ToClient::Failed { .. } => "connect failed".to_string(),
                ToClient::Reply { result: Ok(_), .. } => "reply".to_string(),
                ToClient::Reply { result: Err(_), .. } => "error reply".to_string(),
                ToClient::Notify { payload, .. } => format!("notify '{payload}'"),
                ToClient::Ended { .. } => "session ended".to_string(),
            };
            format!("p{p} <- {what}")
        }
        Ev::Deadline(p, _) => format!("p{p} timer"),
        Ev::JobExit { p, .. } => format!("p{p} job returns"),
        Ev::StartRun { p, .. } => format!("p{p} starts a run"),
        Ev::IdleCheck(_) => "server idle guard".to_string(),
        Ev::TcpCheck(_) => "server tcp give-up".to_string(),
        Ev::LockTimeout { .. } => "server lock timeout".to_string(),
        Ev::Deliver(p, _) => format!("server -> p{p} late notification"),
        Ev::FaultStart(f) => format!("fault {f:?}"),
        Ev::Heal(h) => match h {
            Heal::Partition(p) => format!("p{p} partition heals"),
            Heal::Freeze(p) => format!("p{p} thaws"),
            Heal::Restart(p) => format!("p{p} restarts"),
            Heal::ServerUp => "server up".to_string(),
            other => format!("heal {other:?}"),
        },
        Ev::Close => "close every machine".to_string(),
    }
}

fn statement_kind(s: &crate::Statement) -> String {
    let text = format!("{s:?}");
    let end = text.find([' ', '{', '(']).unwrap_or(text.len());
    text[..end].to_lowercase()
}

impl Sim {
    /// The events due within `window` of the next one, the head of each
    /// FIFO channel, in queue order (time, then arrival in the queue): the
    /// first is the one [`Sim::run_until`] would deliver.
    #[doc(hidden)]
    pub fn ready(&mut self, window: Duration) -> Vec<Ready> {
        let Some(first) = self.queue.next_at() else {
            return Vec::new();
        };
        let mut channels = BTreeSet::new();
        let mut ready = Vec::new();
        for (at, seq, ev) in self.queue.due(first + window) {
            if channels.insert(channel(ev, seq)) {
                ready.push(Ready {
                    at,
                    seq,
                    actor: actor(ev),
                    label: label(ev),
                });
            }
        }
        ready
    }

    /// Delivers one of the [`Sim::ready`] events, at its time or now if
    /// later, and checks strong safety, as [`Sim::run_until`] does for each.
    #[doc(hidden)]
    pub fn step(&mut self, ready: &Ready) {
        if let Some(ev) = self.queue.take(ready.seq) {
            self.now = self.now.max(ready.at);
            self.dispatch(ev);
            self.check_safety();
        }
    }

    /// Injects `fault` at `at` (or now if later), before any event still
    /// queued, and checks strong safety.
    #[doc(hidden)]
    pub fn inject_fault(&mut self, at: Duration, fault: Fault) {
        self.now = self.now.max(at);
        self.fault(fault);
        self.check_safety();
    }
}

impl Sim {
    /// Delivers the next event due by `until` in time order, as
    /// [`Sim::run_until`] would, and checks strong safety; `false` (and the
    /// clock moved to `until`) when none is left.
    #[doc(hidden)]
    pub fn step_next(&mut self, until: Duration) -> bool {
        match self.queue.pop_until(until) {
            Some((t, ev)) => {
                self.now = t;
                self.dispatch(ev);
                self.check_safety();
                true
            }
            None => {
                self.now = self.now.max(until);
                false
            }
        }
    }
}

impl Sim {
    /// A fingerprint of the whole simulation's state (every machine, the
    /// simulated drivers and jobs, the server model, the links and the
    /// event queue, the random state, what the checks carry; not the trace),
    /// for an explorer's visited set: two simulations with the same
    /// fingerprint, made with the same setup and base instant, go on alike.
    /// Times are absolute (virtual time and the machines' instants), so only
    /// states reached at the same instant can match; ids (pids, run ids,
    /// sessions, event sequence numbers aside) are not renamed. Built from
    /// the state's `Debug` text: costly, for experiments.
    #[doc(hidden)]
    pub fn fingerprint(&self) -> u128 {
        use std::hash::{Hash, Hasher};
        let queue: Vec<(Duration, &Ev)> = (self.queue.due(Duration::MAX).into_iter())
            .map(|(at, _, ev)| (at, ev))
            .collect();
        let r = &self.report;
        let text = format!(
            "{:?}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}",
            self.now,
            self.rng,
            self.procs,
            self.net,
            self.server,
            queue,
            self.next_conn,
            self.next_job,
            self.overlap_since,
            self.max_token,
            self.flaky,
            self.terminate_next_taker,
            r.violations,
            r.max_overlap,
            r.acquisitions,
            r.outcomes,
            self.closing,
        );
        let mut a = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut a);
        let mut b = std::collections::hash_map::DefaultHasher::new();
        (text.len(), &text).hash(&mut b);
        (u128::from(a.finish()) << 64) | u128::from(b.finish())
    }
}
