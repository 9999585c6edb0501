//! The state the driver and the run futures share, and the one place that
//! routes the core's outputs: [`Shared::drain`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use lease_proto::{
    Input, LeaseId, Machine, Outcome, Output, RunCommand, RunId, RunRejected, SessionCommand,
};

use crate::cancel::{Cancel, CancelTx};
use crate::log::EventLog;
use crate::metrics::Metrics;
use crate::runtime::Clock;

/// Behind every `Locker`, `Lease` and `Driver`.
pub(crate) struct Inner {
    shared: Mutex<Shared>,
    clock: Clock,
}

impl Inner {
    pub(crate) fn new(machine: Machine, clock: Clock) -> Inner {
        let log = EventLog::new(machine.options().role.is_observer());
        let shared = Shared {
            machine,
            clock: clock.clone(),
            slots: HashMap::new(),
            session: VecDeque::new(),
            dirty: false,
            driver: None,
            driver_gone: false,
            lockers_gone: false,
            close_waiters: Vec::new(),
            metrics: Metrics::new(),
            log,
        };
        Inner {
            shared: Mutex::new(shared),
            clock,
        }
    }

    /// Never held across an `.await`. A panic elsewhere cannot leave the
    /// machine half-updated (it never panics), so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    pub(crate) fn input(&self, input: Input) {
        self.lock().input(input);
    }

    /// The runtime's now.
    pub(crate) fn now(&self) -> Instant {
        (self.clock)()
    }

    /// The runtime's clock.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }
}

pub(crate) struct Shared {
    pub(crate) machine: Machine,
    clock: Clock,
    /// One per live run future.
    pub(crate) slots: HashMap<RunId, Slot>,
    /// Session commands for the driver, in order.
    pub(crate) session: VecDeque<SessionCommand>,
    /// An input was fed since the driver last looked (its timer may have moved).
    pub(crate) dirty: bool,
    pub(crate) driver: Option<Waker>,
    /// The driver future ended or was dropped.
    pub(crate) driver_gone: bool,
    /// Every `Locker` handle was dropped.
    pub(crate) lockers_gone: bool,
    pub(crate) close_waiters: Vec<Waker>,
    /// Derives the metrics from what the drain rule routes.
    pub(crate) metrics: Metrics,
    /// Logs the core's events.
    log: EventLog,
}

/// What the core told one run future, waiting for it to look.
#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) start: Option<Start>,
    /// Cancels the `Lease` handles of the current job.
    pub(crate) cancel: Option<CancelTx>,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) waker: Option<Waker>,
}

/// A pending [`RunCommand::StartJob`].
pub(crate) struct Start {
    pub(crate) lease: LeaseId,
    pub(crate) token: i64,
    pub(crate) cancel: Arc<Cancel>,
}

impl Shared {
    /// Feeds one input at the runtime's now, then routes everything the core says.
    pub(crate) fn input(&mut self, input: Input) {
        self.metrics.input(&self.clock, &input);
        let now = (self.clock)();
        self.machine.handle_input(now, input);
        self.drain();
    }

    /// The host (`host:port`, never a password) the lease session opened
    /// on, for the log lines that say where the session is.
    pub(crate) fn set_host(&mut self, host: Option<String>) {
        self.log.set_host(host);
    }

    /// Registers a run of `lease` with the core and gives it a slot, then
    /// routes what the core says.
    pub(crate) fn register(&mut self, lease: LeaseId) -> Result<RunId, RunRejected> {
        let now = (self.clock)();
        let group = lease.group().map(|g| g.id());
        let run = self.machine.run(now, lease)?;
        self.metrics.run_started(run, group, now);
        self.slots.insert(run, Slot::default());
        self.drain();
        Ok(run)
    }

    /// The drain rule: after every input, every output in the order given:
    /// run commands to their run futures, session commands to the driver,
    /// events to tracing; run commands and events to the metrics too; then
    /// wake the driver, whose timer may have moved.
    pub(crate) fn drain(&mut self) {
        while let Some(output) = self.machine.poll_output() {
            match output {
                Output::Run(command) => self.run_command(command),
                Output::Session(command) => self.session.push_back(command),
                Output::Event(event) => {
                    self.log.event(&self.clock, &event);
                    self.metrics.event(&self.clock, &event);
                }
            }
        }
        self.metrics.drained();
        self.dirty = true;
        if let Some(waker) = self.driver.take() {
            waker.wake();
        }
    }

    /// A run command, to the run's slot (and the metrics).
    fn run_command(&mut self, command: RunCommand) {
        self.metrics.run_command(&self.clock, &command);
        match command {
            RunCommand::StartJob {
                run, lease, token, ..
            } => {
                let cancel = Arc::new(Cancel::default());
                self.with_slot(run, |slot| {
                    slot.cancel = Some(CancelTx(cancel.clone()));
                    slot.start = Some(Start {
                        lease,
                        token,
                        cancel,
                    });
                });
            }
            RunCommand::CancelJob { run, reason } => self.with_slot(run, |slot| {
                if let Some(tx) = &slot.cancel {
                    tx.0.set(reason);
                }
            }),
            RunCommand::Finish { run, outcome } => {
                self.with_slot(run, |slot| slot.outcome = Some(outcome));
            }
        }
    }

    /// Updates a run's slot and wakes its future. A run whose future is gone
    /// has no slot: nothing waits for the command.
    fn with_slot(&mut self, run: RunId, f: impl FnOnce(&mut Slot)) {
        if let Some(slot) = self.slots.get_mut(&run) {
            f(slot);
            if let Some(waker) = slot.waker.take() {
                waker.wake();
            }
        }
    }

    /// Wakes every run and `close` caller: the driver is gone.
    pub(crate) fn wake_all(&mut self) {
        for slot in self.slots.values_mut() {
            if let Some(waker) = slot.waker.take() {
                waker.wake();
            }
        }
        self.close_waiters.drain(..).for_each(Waker::wake);
    }
}

/// Locks `m`, ignoring poisoning: the crate's own code never panics while
/// it holds one (a schedule calls its job under one: a job that panics
/// fails its future anyway).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A machine seed that differs between processes and lockers.
pub(crate) fn seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    nanos ^ (u64::from(std::process::id()) << 32) ^ count.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}
