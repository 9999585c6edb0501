//! The state the driver and the run futures share, and the one place that
//! routes the core's outputs: [`Shared::input`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Waker;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use event_listener::Event as Notify;
use lease_proto::{Command, Event, Input, LeaseId, Machine, Outcome, Output, Reason, RunId};

/// Behind every `Locker`, `Lease` and `Driver`.
pub(crate) struct Inner {
    shared: Mutex<Shared>,
}

impl Inner {
    pub(crate) fn new(machine: Machine) -> Inner {
        let shared = Shared {
            machine,
            slots: HashMap::new(),
            session: VecDeque::new(),
            dirty: false,
            driver: None,
            driver_gone: false,
            lockers_gone: false,
            close_waiters: Vec::new(),
        };
        Inner {
            shared: Mutex::new(shared),
        }
    }

    /// Never held across an `.await`. A panic elsewhere cannot leave the
    /// machine half-updated (it never panics), so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn input(&self, input: Input) {
        self.lock().input(input);
    }
}

pub(crate) struct Shared {
    pub(crate) machine: Machine,
    /// One per live run future.
    pub(crate) slots: HashMap<RunId, Slot>,
    /// Session commands for the driver, in order.
    pub(crate) session: VecDeque<Command>,
    /// An input was fed since the driver last looked (its timer may have moved).
    pub(crate) dirty: bool,
    pub(crate) driver: Option<Waker>,
    /// The driver future ended or was dropped.
    pub(crate) driver_gone: bool,
    /// Every `Locker` handle was dropped.
    pub(crate) lockers_gone: bool,
    pub(crate) close_waiters: Vec<Waker>,
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

/// A pending [`Command::StartJob`].
pub(crate) struct Start {
    pub(crate) lease: LeaseId,
    pub(crate) token: i64,
    pub(crate) cancel: Arc<Cancel>,
}

/// One acquisition's cancellation, shared by its `Lease` handles: what
/// `tokio::sync::watch` is to the tokio driver, without a runtime. The core
/// cancels an acquisition at most once: the first reason stays.
#[derive(Default)]
pub(crate) struct Cancel {
    reason: OnceLock<Reason>,
    notify: Notify,
}

impl Cancel {
    pub(crate) fn reason(&self) -> Option<Reason> {
        self.reason.get().cloned()
    }

    /// Resolves with the reason once there is one.
    pub(crate) async fn wait(&self) -> Reason {
        loop {
            let listener = self.notify.listen();
            if let Some(reason) = self.reason() {
                return reason;
            }
            listener.await;
        }
    }

    fn set(&self, reason: Reason) {
        let _ = self.reason.set(reason);
        self.notify.notify(usize::MAX);
    }
}

/// The core's side of a [`Cancel`]. Dropped when the acquisition ends (the
/// next one replaces it, or the run is gone): its leases then read as
/// cancelled with [`Reason::Closed`] unless they had a reason already.
pub(crate) struct CancelTx(pub(crate) Arc<Cancel>);

impl Drop for CancelTx {
    fn drop(&mut self) {
        self.0.set(Reason::Closed);
    }
}

impl Shared {
    /// Feeds one input, then routes everything the core says.
    pub(crate) fn input(&mut self, input: Input) {
        self.machine.handle_input(Instant::now(), input);
        self.drain();
    }

    /// Routes the core's outputs: job commands to their run, session commands
    /// to the driver, events to tracing. Called after every input.
    pub(crate) fn drain(&mut self) {
        while let Some(output) = self.machine.poll_output() {
            let command = match output {
                Output::Event(event) => {
                    log_event(&event);
                    continue;
                }
                Output::Command(command) => command,
            };
            match command {
                Command::StartJob {
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
                Command::CancelJob { run, reason } => self.with_slot(run, |slot| {
                    if let Some(tx) = &slot.cancel {
                        tx.0.set(reason);
                    }
                }),
                Command::FinishRun { run, outcome } => {
                    self.with_slot(run, |slot| slot.outcome = Some(outcome));
                }
                session => self.session.push_back(session),
            }
        }
        self.dirty = true;
        if let Some(waker) = self.driver.take() {
            waker.wake();
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

/// Logs a lease event with the lease's name and key and the run.
macro_rules! lease_event {
    ($level:ident, $run:expr, $lease:expr, $($rest:tt)+) => {
        tracing::$level!(lease = $lease.name(), key = $lease.key(), run = $run.0, $($rest)+)
    };
}

/// One log line per event.
fn log_event(event: &Event) {
    use tracing::{debug, error, info, warn};
    match event {
        Event::SessionOpening {
            session: s,
            failures,
        } => debug!(session = s.0, failures, "lease session connecting"),
        Event::SessionReady {
            session: s,
            backend_pid: pid,
            server_version: v,
        } => {
            info!(
                session = s.0,
                backend_pid = pid,
                server_version = v,
                "lease session ready"
            )
        }
        Event::SessionLost { session: s, reason } => {
            warn!(session = s.0, %reason, "lease session lost")
        }
        Event::SessionIdle { session: s } => debug!(session = s.0, "lease session idle, closed"),
        Event::Acquired { run, lease, token } => {
            lease_event!(info, run, lease, token, "lease acquired")
        }
        Event::Lost { run, lease, reason } => lease_event!(warn, run, lease, %reason, "lease lost"),
        Event::Released { run, lease } => lease_event!(info, run, lease, "lease released"),
        Event::Waiting {
            run,
            lease,
            holder_pid: pid,
        } => {
            lease_event!(
                info,
                run,
                lease,
                holder_pid = pid,
                "lease held elsewhere; standing by"
            )
        }
        Event::TryFailed { error } => warn!(%error, "lease try failed; verifying held keys"),
        Event::UnknownKeyReleased { key } => warn!(key, "unlocking a key held without a run"),
        Event::Refused { refusal } => error!(%refusal, "lease setup refused"),
    }
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
