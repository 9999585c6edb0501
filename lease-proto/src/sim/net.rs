//! The network model, as its own sans-IO piece: per-process links with
//! latency, jitter and FIFO delivery, latency spikes, and black-hole
//! partitions that hold bytes until they heal (TCP ends stay open); plus the
//! delivery queue every simulated event waits in.
//!
//! Nothing here draws randomness or reads a clock: the caller hands in the
//! latency sample and the send time, and gets back when the message arrives
//! (or that the link holds it).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use crate::{reply::Row, QueryId, SessionError, Statement};

/// A client's message to the server.
#[derive(Debug, Clone)]
pub(super) enum ToServer {
    Connect {
        conn: u64,
        settings: Vec<(&'static str, String)>,
    },
    Query {
        conn: u64,
        query: QueryId,
        statement: Statement,
    },
    /// A second connection of the client of `conn` ([`SessionCommand::Probe`]
    /// (crate::SessionCommand::Probe)): connects, runs the statement, answers
    /// on `conn`'s link with `conn`'s id (the process routes it), closes.
    Probe {
        conn: u64,
        query: QueryId,
        statement: Statement,
    },
    Close {
        conn: u64,
    },
}

/// The server's message to a client.
#[derive(Debug, Clone)]
pub(super) enum ToClient {
    Connected {
        conn: u64,
    },
    Failed {
        conn: u64,
        error: SessionError,
    },
    Reply {
        conn: u64,
        query: QueryId,
        result: Result<Vec<Row>, SessionError>,
    },
    Notify {
        conn: u64,
        payload: String,
        sender_pid: i64,
    },
    Ended {
        conn: u64,
        error: SessionError,
    },
}

impl ToClient {
    /// The connection it is for.
    pub(super) fn conn(&self) -> u64 {
        match self {
            ToClient::Connected { conn }
            | ToClient::Failed { conn, .. }
            | ToClient::Reply { conn, .. }
            | ToClient::Notify { conn, .. }
            | ToClient::Ended { conn, .. } => *conn,
        }
    }
}

/// Which way a message travels on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    ToServer,
    ToClient,
}

/// One process's link to the server.
#[derive(Debug)]
struct Link<T> {
    /// Partitions in force (they stack; the link works at zero).
    partitions: u32,
    /// Added one-way latency in force.
    extra: Duration,
    /// Messages sent while partitioned, in order.
    held: Vec<T>,
    last_to_server: Duration,
    last_to_client: Duration,
}

/// Every link, by process.
#[derive(Debug)]
pub(super) struct Net<T> {
    links: Vec<Link<T>>,
}

impl<T> Net<T> {
    pub(super) fn new(processes: usize) -> Net<T> {
        Net {
            links: (0..processes)
                .map(|_| Link {
                    partitions: 0,
                    extra: Duration::ZERO,
                    held: Vec::new(),
                    last_to_server: Duration::ZERO,
                    last_to_client: Duration::ZERO,
                })
                .collect(),
        }
    }

    /// The added latency on `p`'s link now.
    pub(super) fn extra(&self, p: usize) -> Duration {
        self.links[p].extra
    }

    /// Sends `msg` on `p`'s link, leaving at `from` with one-way `latency`:
    /// when it arrives (never before an earlier message the same way), or
    /// `None` if the link is partitioned and holds it.
    pub(super) fn send(
        &mut self,
        p: usize,
        way: Direction,
        from: Duration,
        latency: Duration,
        msg: T,
    ) -> Option<(Duration, T)> {
        let link = &mut self.links[p];
        if link.partitions > 0 {
            link.held.push(msg);
            return None;
        }
        let last = match way {
            Direction::ToServer => &mut link.last_to_server,
            Direction::ToClient => &mut link.last_to_client,
        };
        let at = (from + latency).max(*last);
        *last = at;
        Some((at, msg))
    }

    /// Takes back messages to `p`'s client that never left: the next one
    /// arrives no earlier than `after` (the latest still on its way).
    pub(super) fn unsend_to_client(&mut self, p: usize, after: Duration) {
        self.links[p].last_to_client = after;
    }

    /// Black-holes `p`'s link (partitions stack).
    pub(super) fn partition(&mut self, p: usize) {
        self.links[p].partitions += 1;
    }

    /// Whether `p`'s link is partitioned.
    pub(super) fn partitioned(&self, p: usize) -> bool {
        self.links[p].partitions > 0
    }

    /// Ends one partition of `p`'s link: the messages it held, in order, if
    /// that was the last one (they are sent again by the caller).
    pub(super) fn heal(&mut self, p: usize) -> Option<Vec<T>> {
        let link = &mut self.links[p];
        if link.partitions == 0 {
            return None;
        }
        link.partitions -= 1;
        (link.partitions == 0).then(|| std::mem::take(&mut link.held))
    }

    /// The messages `p`'s link holds, in order.
    pub(super) fn held(&self, p: usize) -> &[T] {
        &self.links[p].held
    }

    /// Adds one-way latency on `p`'s link.
    pub(super) fn delay(&mut self, p: usize, extra: Duration) {
        self.links[p].extra += extra;
    }

    /// Takes back latency added by [`Net::delay`].
    pub(super) fn undelay(&mut self, p: usize, extra: Duration) {
        self.links[p].extra = self.links[p].extra.saturating_sub(extra);
    }

    /// Removes every added latency on `p`'s link.
    pub(super) fn clear_delay(&mut self, p: usize) {
        self.links[p].extra = Duration::ZERO;
    }
}

/// Events by virtual time, FIFO among equal times.
#[derive(Debug)]
pub(super) struct Queue<T> {
    seq: u64,
    order: BinaryHeap<Reverse<(Duration, u64)>>,
    events: BTreeMap<u64, T>,
}

impl<T> Queue<T> {
    pub(super) fn new() -> Queue<T> {
        Queue {
            seq: 0,
            order: BinaryHeap::new(),
            events: BTreeMap::new(),
        }
    }

    pub(super) fn push(&mut self, at: Duration, ev: T) {
        self.seq += 1;
        self.events.insert(self.seq, ev);
        self.order.push(Reverse((at, self.seq)));
    }

    /// Removes and returns the first event due at or before `now` that
    /// `wanted` picks, if any (one already arrived, not yet dispatched).
    pub(super) fn take_due(&mut self, now: Duration, wanted: impl Fn(&T) -> bool) -> Option<T> {
        let seq = (self.order.iter())
            .filter(|Reverse((t, _))| *t <= now)
            .map(|Reverse((_, seq))| *seq)
            .filter(|seq| self.events.get(seq).is_some_and(&wanted))
            .min()?;
        // Its heap entry stays: `pop_until` skips entries without an event.
        self.events.remove(&seq)
    }

    /// Removes every queued event `unwanted` picks, whenever it is due (a
    /// reply the server never sent after all).
    pub(super) fn remove_all(&mut self, unwanted: impl Fn(&T) -> bool) {
        // Their heap entries stay: `pop_until` skips entries without an event.
        self.events.retain(|_, ev| !unwanted(ev));
    }

    /// When the latest queued event that `pick` picks is due.
    pub(super) fn latest(&self, pick: impl Fn(&T) -> bool) -> Option<Duration> {
        (self.order.iter())
            .filter(|Reverse((_, seq))| self.events.get(seq).is_some_and(&pick))
            .map(|Reverse((t, _))| *t)
            .max()
    }

    /// Every queued event due at or before `until`, with its time and
    /// sequence number, in delivery order (for the explorer's hook).
    pub(super) fn due(&self, until: Duration) -> Vec<(Duration, u64, &T)> {
        let mut due: Vec<(Duration, u64, &T)> = (self.order.iter())
            .filter(|Reverse((t, _))| *t <= until)
            .filter_map(|Reverse((t, seq))| Some((*t, *seq, self.events.get(seq)?)))
            .collect();
        due.sort_by_key(|(t, seq, _)| (*t, *seq));
        due
    }

    /// Removes the event of sequence number `seq` (its heap entry stays:
    /// `pop_until` skips entries without an event).
    pub(super) fn take(&mut self, seq: u64) -> Option<T> {
        self.events.remove(&seq)
    }

    /// When the next event is due.
    pub(super) fn next_at(&mut self) -> Option<Duration> {
        loop {
            let &Reverse((t, seq)) = self.order.peek()?;
            if self.events.contains_key(&seq) {
                return Some(t);
            }
            self.order.pop();
        }
    }

    /// The next event due at or before `until`, with its time.
    pub(super) fn pop_until(&mut self, until: Duration) -> Option<(Duration, T)> {
        loop {
            let &Reverse((t, seq)) = self.order.peek()?;
            if t > until {
                return None;
            }
            self.order.pop();
            if let Some(ev) = self.events.remove(&seq) {
                return Some((t, ev));
            }
        }
    }
}
