//! The machine's one source of randomness: a seeded sequence behind the
//! jitter of standby retries and reconnect backoffs, and the sessions'
//! nonces. One sequence, so that a seed fixes every draw, in order.

use std::time::Duration;

use crate::io::SessionId;
use crate::options::RETRY_JITTER;

/// The seeded jitter of retries and backoffs, and the sessions' nonces.
#[derive(Debug)]
pub(super) struct Jitter {
    state: u64,
}

impl Jitter {
    pub(super) fn new(seed: u64) -> Jitter {
        Jitter { state: seed }
    }

    /// Uniform in [0, 1).
    pub(super) fn random(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (mix(self.state) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A session's nonce: a function of the jitter state and the session,
    /// drawn without advancing the jitter sequence. Non-negative, so it reads
    /// back as the same `int8` text.
    pub(super) fn nonce(&self, session: SessionId) -> i64 {
        let z = mix(self.state ^ mix(session.0.wrapping_add(0x6c65_6173_655f_6e6f)));
        (z >> 1) as i64
    }

    /// A retry interval, jittered down by up to [`RETRY_JITTER`] of it.
    pub(super) fn retry(&mut self, interval: Duration) -> Duration {
        let f = 1.0 - RETRY_JITTER * self.random();
        interval.mul_f64(f)
    }
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
