//! The payloads on [`HANDOVER_CHANNEL`](super::HANDOVER_CHANNEL): every kind
//! of notification a locker sends or reads, parsed and written in one place
//! ([`Notice`]). The kind is the first word: `group`, `to`, `claim`,
//! `prefer`, or a key (a release). A payload of no known kind is ignored,
//! so an older locker ignores the kinds that came after it.

use std::fmt;

/// One notification on the handover channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// `<key> [<at> [<grantee> [<reserved>]]]`: a holder released `key`
    /// (sent by [`Statement::Release`](super::Statement::Release) with
    /// `notify`).
    Release(ReleaseNotice),
    /// `group <id>`: a locker joined lease group `id` (sent by
    /// [`Statement::Members`](super::Statement::Members)).
    Group(u32),
    /// `to <key> <pid>`: the locker leading `key` is asked to hand it over
    /// to the lease session of backend `pid` ([`handover_request_payload`];
    /// the rule: the machine's `handover`). A holder's check announces a
    /// confirmed hand-over in the same form.
    Request { key: i64, pid: i64 },
    /// `claim <key> <pid>`: a lease group's owner of `key` claims it (sent
    /// by [`Statement::Members`](super::Statement::Members)).
    Claim { key: i64, pid: i64 },
    /// `prefer <key> <pid> <priority>`: a standby of a higher priority asks
    /// for `key` (sent by [`Statement::Prefer`](super::Statement::Prefer)).
    Prefer(Preference),
}

/// A release's notification (`<key> <at> [<grantee> [<reserved>]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReleaseNotice {
    /// The released key.
    pub(crate) key: i64,
    /// The release's moment on the server's clock, in fencing-token units
    /// (`None`: a payload without one).
    pub(crate) at: Option<i64>,
    /// The backend the server granted the key to at the release: the first
    /// [`Statement::Take`](super::Statement::Take) in its queue (`None`: no
    /// take was first; `0` in the payload).
    pub(crate) grantee: Option<i64>,
    /// The backend the releasing holder handed the key over to by name, if
    /// it still waited for the key at the release (see `handover`).
    pub(crate) reserved: Option<i64>,
}

/// A [`Notice::Prefer`]'s ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Preference {
    pub(crate) key: i64,
    /// The asking standby's lease session backend.
    pub(crate) pid: i64,
    pub(crate) priority: u32,
}

impl Notice {
    /// The notice a payload is, or `None` for a payload of no known kind or
    /// a malformed one (any client may notify on the channel).
    pub(crate) fn parse(payload: &str) -> Option<Notice> {
        let words: Vec<&str> = payload.split_whitespace().collect();
        let int = |word: &str| word.parse::<i64>().ok();
        // An optional word: absent, or an integer (a malformed one fails).
        let opt = |word: Option<&&str>| match word {
            None => Some(None),
            Some(w) => int(w).map(Some),
        };
        Some(match words.as_slice() {
            ["group", id] => Notice::Group(id.parse().ok()?),
            ["to", key, pid] => Notice::Request {
                key: int(key)?,
                pid: int(pid)?,
            },
            ["claim", key, pid] => Notice::Claim {
                key: int(key)?,
                pid: int(pid)?,
            },
            ["prefer", key, pid, priority] => Notice::Prefer(Preference {
                key: int(key)?,
                pid: int(pid)?,
                priority: (priority.parse().ok()).filter(|p| *p <= crate::options::MAX_PRIORITY)?,
            }),
            [key, rest @ ..] if rest.len() <= 3 => Notice::Release(ReleaseNotice {
                key: int(key)?,
                at: opt(rest.first())?,
                // 0: none.
                grantee: opt(rest.get(1))?.filter(|&g| g != 0),
                reserved: opt(rest.get(2))?.filter(|&r| r != 0),
            }),
            _ => return None,
        })
    }
}

/// The payload, as [`Notice::parse`] reads it.
impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Release(r) => {
                write!(f, "{}", r.key)?;
                if let Some(at) = r.at {
                    write!(f, " {at}")?;
                    match (r.grantee, r.reserved) {
                        (g, Some(reserved)) => write!(f, " {} {reserved}", g.unwrap_or(0)),
                        (Some(g), None) => write!(f, " {g}"),
                        (None, None) => Ok(()),
                    }?;
                }
                Ok(())
            }
            Notice::Group(id) => write!(f, "group {id}"),
            Notice::Request { key, pid } => write!(f, "to {key} {pid}"),
            Notice::Claim { key, pid } => write!(f, "claim {key} {pid}"),
            Notice::Prefer(p) => write!(f, "prefer {} {} {}", p.key, p.pid, p.priority),
        }
    }
}

/// The payload on [`HANDOVER_CHANNEL`](super::HANDOVER_CHANNEL) that asks
/// the locker leading `key` to hand it over to the lease session of backend
/// `pid` (the rule: the machine's `handover`): `to <key> <pid>`, sent with
/// `SELECT pg_catalog.pg_notify('lease_handover_v1', '<payload>')`.
pub fn handover_request_payload(key: i64, pid: i64) -> String {
    Notice::Request { key, pid }.to_string()
}
