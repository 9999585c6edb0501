//! The payloads on [`HANDOVER_CHANNEL`](super::HANDOVER_CHANNEL) other than the statements' own
//! results: what a locker sends and reads besides rows.

/// The payload on [`HANDOVER_CHANNEL`](super::HANDOVER_CHANNEL) that asks the locker leading `key`
/// to hand it over to the lease session of backend `pid` (the rule:
/// the machine's `handover`): `to <key> <pid>`, sent with
/// `SELECT pg_catalog.pg_notify('lease_handover_v1', '<payload>')`.
pub fn handover_request_payload(key: i64, pid: i64) -> String {
    format!("to {key} {pid}")
}

/// The key and the release's moment (`None`: a payload without one) of a
/// release's notification on [`HANDOVER_CHANNEL`](super::HANDOVER_CHANNEL).
pub(crate) fn handover_release(payload: &str) -> Option<ReleaseNotice> {
    let mut words = payload.split_whitespace();
    let key = words.next()?.parse().ok()?;
    let at = match words.next() {
        None => None,
        Some(w) => Some(w.parse().ok()?),
    };
    let grantee = match words.next() {
        None => None,
        Some(w) => Some(w.parse::<i64>().ok()?).filter(|&g| g != 0),
    };
    let reserved = match words.next() {
        None => None,
        Some(w) => Some(w.parse::<i64>().ok()?).filter(|&r| r != 0),
    };
    words.next().is_none().then_some(ReleaseNotice {
        key,
        at,
        grantee,
        reserved,
    })
}

/// A release's notification on [`HANDOVER_CHANNEL`](super::HANDOVER_CHANNEL) (`<key> <at> [<grantee>
/// [<reserved>]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReleaseNotice {
    /// The released key.
    pub(crate) key: i64,
    /// The release's moment on the server's clock, in fencing-token units
    /// (`None`: a payload without one).
    pub(crate) at: Option<i64>,
    /// The backend the server granted the key to at the release: the first
    /// [`Statement::Take`](super::Statement::Take) in its queue (`None`: no take was first).
    pub(crate) grantee: Option<i64>,
    /// The backend the releasing holder handed the key over to by name, if
    /// it still waited for the key at the release (see `handover`).
    pub(crate) reserved: Option<i64>,
}

/// The key and backend pid of a [`handover_request_payload`].
pub(crate) fn handover_request(payload: &str) -> Option<(i64, i64)> {
    let mut words = payload.trim().strip_prefix("to ")?.split_whitespace();
    let key = words.next()?.parse().ok()?;
    let pid = words.next()?.parse().ok()?;
    words.next().is_none().then_some((key, pid))
}

/// The key and the claiming member's backend pid of a lease group's claim
/// (`claim <key> <pid>`, sent by [`Statement::Members`](super::Statement::Members)).
pub(crate) fn group_claim(payload: &str) -> Option<(i64, i64)> {
    let mut words = payload.trim().strip_prefix("claim ")?.split_whitespace();
    let key = words.next()?.parse().ok()?;
    let pid = words.next()?.parse().ok()?;
    words.next().is_none().then_some((key, pid))
}

/// A [`Statement::Prefer`](super::Statement::Prefer)'s payload (`prefer <key> <pid> <priority>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Preference {
    pub(crate) key: i64,
    /// The asking standby's lease session backend.
    pub(crate) pid: i64,
    pub(crate) priority: u32,
}

/// The [`Preference`] of a [`Statement::Prefer`](super::Statement::Prefer)'s payload.
pub(crate) fn handover_preference(payload: &str) -> Option<Preference> {
    let mut words = payload.trim().strip_prefix("prefer ")?.split_whitespace();
    let key = words.next()?.parse().ok()?;
    let pid = words.next()?.parse().ok()?;
    let priority = words
        .next()?
        .parse()
        .ok()
        .filter(|p| *p <= crate::options::MAX_PRIORITY)?;
    words
        .next()
        .is_none()
        .then_some(Preference { key, pid, priority })
}
