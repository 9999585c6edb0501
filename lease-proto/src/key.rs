//! Lease identities: names, keys and the name-to-key function.

use std::fmt;

/// The namespace mixed into every name before hashing. Changing it changes
/// every key: the golden vectors in the tests pin it.
const NAMESPACE: &[u8] = b"lease/v1/";

/// Maps a lease name to its 64-bit advisory-lock key.
///
/// The function is stable across versions and platforms (golden test vectors
/// pin it): FNV-1a 64 over `"lease/v1/" ++ name` (UTF-8 bytes), then the
/// SplitMix64 finaliser, then bit 63 cleared and bit 62 set. Keys derived from
/// names therefore always lie in `[2^62, 2^63)`: they can never collide with
/// the small (32-bit, or negative) integer keys that other code sharing the
/// database tends to use, and two names collide only by a 62-bit coincidence.
///
/// Use [`LeaseId::raw`] to take a key that other code chose.
pub fn key_for_name(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in NAMESPACE.iter().chain(name.as_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // SplitMix64 finaliser: spreads FNV's weak low bits over the whole word.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    ((h & !(1 << 63)) | (1 << 62)) as i64
}

/// Why a lease name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// The name is empty (or only whitespace).
    Empty,
    /// The name is longer than [`LeaseId::MAX_NAME_LEN`] bytes.
    TooLong(usize),
    /// The name contains a control character (it would garble logs).
    ControlCharacter,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty => f.write_str("lease name is empty"),
            NameError::TooLong(n) => write!(
                f,
                "lease name is {n} bytes long; at most {} are allowed",
                LeaseId::MAX_NAME_LEN
            ),
            NameError::ControlCharacter => f.write_str("lease name contains a control character"),
        }
    }
}

impl std::error::Error for NameError {}

/// What a run contends for: a display name and the advisory-lock key.
///
/// Two runs conflict when their keys are equal, whatever their names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseId {
    name: String,
    key: i64,
    /// The lease group whose share this run takes part in, if any.
    group: Option<GroupId>,
}

impl LeaseId {
    /// The longest accepted name, in bytes.
    pub const MAX_NAME_LEN: usize = 1024;

    /// A lease identified by name; its key is [`key_for_name`]`(name)`.
    ///
    /// # Errors
    /// [`NameError`] for an empty, overlong or control-character name.
    pub fn named(name: impl Into<String>) -> Result<LeaseId, NameError> {
        let name = name.into();
        if name.trim().is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > Self::MAX_NAME_LEN {
            return Err(NameError::TooLong(name.len()));
        }
        if name.chars().any(char::is_control) {
            return Err(NameError::ControlCharacter);
        }
        let key = key_for_name(&name);
        Ok(LeaseId {
            name,
            key,
            group: None,
        })
    }

    /// A lease on a raw advisory-lock key, for interop with
    /// `pg_advisory_lock(bigint)` taken by other code. Its name is `key:<key>`.
    pub fn raw(key: i64) -> LeaseId {
        LeaseId {
            name: format!("key:{key}"),
            key,
            group: None,
        }
    }

    /// The display name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The advisory-lock key.
    pub fn key(&self) -> i64 {
        self.key
    }

    /// This lease as a member of `group`: its run takes part in the group's
    /// share (see `docs/library.md`, "Lease groups"). The key is unchanged.
    #[must_use]
    pub fn in_group(self, group: GroupId) -> LeaseId {
        LeaseId {
            group: Some(group),
            ..self
        }
    }

    /// The group this lease's run takes part in, if any.
    pub fn group(&self) -> Option<&GroupId> {
        self.group.as_ref()
    }
}

/// A lease group: the name its members share, and its 32-bit id, the
/// `classid` of every member's two-int advisory lock (see `docs/library.md`,
/// "Lease groups"). The id is [`group_id_for_name`] of the name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId {
    name: String,
    id: u32,
}

impl GroupId {
    /// A group identified by name; the same rules as [`LeaseId::named`].
    ///
    /// # Errors
    /// [`NameError`] for an empty, overlong or control-character name.
    pub fn named(name: impl Into<String>) -> Result<GroupId, NameError> {
        let lease = LeaseId::named(name)?;
        let id = group_id_for_name(lease.name());
        Ok(GroupId {
            name: lease.name,
            id,
        })
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group's 32-bit id: the `classid` of its members' locks.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.id)
    }
}

/// The 32-bit id of a lease group named `name`: the low half of
/// [`key_for_name`] of `"group/"` and the name. Two names may share an id
/// (a birthday collision is likely only past tens of thousands of groups on
/// one database); their members then count as one membership, which
/// changes the share, never a lease's exclusion.
pub fn group_id_for_name(name: &str) -> u32 {
    key_for_name(&format!("group/{name}")) as u32
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_vectors() {
        // These values must never change: deployed replicas of different
        // versions must agree on every key.
        let golden: &[(&str, i64)] = &[
            ("sweeper", GOLDEN[0]),
            ("billing-reconciler", GOLDEN[1]),
            ("a", GOLDEN[2]),
            ("ünïcödé/名前", GOLDEN[3]),
        ];
        for (name, key) in golden {
            assert_eq!(key_for_name(name), *key, "key of {name:?} changed");
        }
    }

    // Computed independently from the documented algorithm (Python, 2026-11-29).
    const GOLDEN: [i64; 4] = [
        8_183_967_241_282_235_011,
        5_359_779_870_358_670_033,
        5_399_355_126_395_698_521,
        4_787_627_251_290_098_193,
    ];

    #[test]
    fn keys_stay_in_their_namespace() {
        for i in 0..10_000 {
            let k = key_for_name(&format!("job-{i}"));
            assert!(k >= 1 << 62, "{k} outside [2^62, 2^63)");
        }
    }

    #[test]
    fn names_are_validated() {
        assert_eq!(LeaseId::named(""), Err(NameError::Empty));
        assert_eq!(LeaseId::named("  "), Err(NameError::Empty));
        assert_eq!(LeaseId::named("a\nb"), Err(NameError::ControlCharacter));
        assert!(matches!(
            LeaseId::named("x".repeat(1025)),
            Err(NameError::TooLong(1025))
        ));
        let id = LeaseId::named("sweeper").unwrap();
        assert_eq!(id.key(), key_for_name("sweeper"));
        assert_eq!(LeaseId::raw(-7).key(), -7);
        assert_eq!(LeaseId::raw(-7).name(), "key:-7");
    }
}
