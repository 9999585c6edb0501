//! The process's secrets, for a last line of defence in what it prints:
//! every password this crate resolves is registered, and [`redact`] replaces
//! them in any text (a log line, a server's error message). Nothing here
//! formats a secret in the first place.

use std::sync::{Mutex, PoisonError};

/// Passwords shorter than this are not redacted: replacing every
/// occurrence of a one- or two-character string would garble every line.
const MIN_REDACTED_LEN: usize = 3;

static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Registers a secret that [`redact`] must replace (resolution registers
/// every password it finds, as decoded and as written).
pub fn add_secret(secret: &str) {
    if secret.len() < MIN_REDACTED_LEN {
        return;
    }
    let mut secrets = SECRETS.lock().unwrap_or_else(PoisonError::into_inner);
    if !secrets.iter().any(|s| s == secret) {
        secrets.push(secret.to_owned());
        // Longest first, so that a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every registered secret replaced by `***`.
pub fn redact(text: &str) -> String {
    let secrets = SECRETS.lock().unwrap_or_else(PoisonError::into_inner);
    let mut out = text.to_owned();
    for secret in secrets.iter() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}
