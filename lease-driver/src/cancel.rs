//! One acquisition's cancellation, shared by its `Lease` handles, without a
//! runtime.

use std::sync::{Arc, OnceLock};

use event_listener::Event;
use lease_proto::Reason;

/// Set at most once (the core cancels an acquisition once: the first reason
/// stays); every waiter wakes.
#[derive(Default)]
pub(crate) struct Cancel {
    reason: OnceLock<Reason>,
    notify: Event,
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

    pub(crate) fn set(&self, reason: Reason) {
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
