//! Lease identities: names, keys and the name-to-key function.

use std::fmt;

use unicode_normalization::UnicodeNormalization;

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
///
/// The rules, in one place: [`LeaseId::named`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty (or only whitespace).
    Empty,
    /// The name is longer than [`LeaseId::MAX_NAME_LEN`] bytes.
    TooLong(usize),
    /// The name contains a control character (it would garble logs).
    ControlCharacter,
    /// The name contains an invisible character (the list:
    /// [`LeaseId::named`]): two names that look the same would be two leases.
    Invisible {
        /// The character.
        character: char,
        /// Its position in the name, in characters, from 1.
        position: usize,
    },
    /// The name contains a bidirectional control character (the list:
    /// [`LeaseId::named`]): it would reorder what logs and `lease status`
    /// show.
    BidiControl {
        /// The character.
        character: char,
        /// Its position in the name, in characters, from 1.
        position: usize,
    },
    /// The name is not in Unicode Normalization Form C: the same text in
    /// another form (composed "é" against "e" and a combining accent) would
    /// be another key, so only the NFC form is accepted.
    NotNfc {
        /// The first character that differs from the NFC form.
        character: char,
        /// Its position in the name, in characters, from 1.
        position: usize,
    },
    /// The name ends in `/` and decimal digits, the form of a shard's name
    /// (`NAME/I`, [`LeaseId::shard`]), whose key it would share.
    ShardForm,
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
            NameError::Invisible {
                character,
                position,
            } => write!(
                f,
                "lease name contains the invisible character U+{:04X} at character {position}: \
                 names that look alike would be different leases",
                u32::from(*character)
            ),
            NameError::BidiControl {
                character,
                position,
            } => write!(
                f,
                "lease name contains the bidirectional control character U+{:04X} at character \
                 {position}: it reorders how the name is shown",
                u32::from(*character)
            ),
            NameError::NotNfc {
                character,
                position,
            } => write!(
                f,
                "lease name is not in Unicode NFC form (U+{:04X} at character {position}): \
                 write it composed; names are never normalized, the same text in two forms \
                 would be two leases",
                u32::from(*character)
            ),
            NameError::ShardForm => f.write_str(
                "lease name ends in `/` and digits, the form of a shard's name (NAME/I of \
                 `lease run NAME --shards N`), whose key it would share",
            ),
        }
    }
}

impl std::error::Error for NameError {}

/// Whether `c` is one of the invisible characters [`LeaseId::named`] refuses.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200D}'
            | '\u{2060}'..='\u{2064}'
            | '\u{FEFF}'
    )
}

/// Whether `c` is one of the bidirectional control characters
/// [`LeaseId::named`] refuses.
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// Whether `name` has the form of a shard's name: `/` and one or more ASCII
/// digits at its end ([`LeaseId::shard`] names shard `I` of group `NAME`
/// `NAME/I`).
fn has_shard_form(name: &str) -> bool {
    name.rsplit_once('/')
        .is_some_and(|(_, last)| !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()))
}

/// The checks every name passes, shards' included: not empty, not too long,
/// no control, invisible or bidirectional control character, and NFC.
fn check_text(name: &str) -> Result<(), NameError> {
    if name.trim().is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > LeaseId::MAX_NAME_LEN {
        return Err(NameError::TooLong(name.len()));
    }
    for (i, c) in name.chars().enumerate() {
        let (character, position) = (c, i + 1);
        if c.is_control() {
            return Err(NameError::ControlCharacter);
        }
        if is_invisible(c) {
            return Err(NameError::Invisible {
                character,
                position,
            });
        }
        if is_bidi_control(c) {
            return Err(NameError::BidiControl {
                character,
                position,
            });
        }
    }
    if !unicode_normalization::is_nfc(name) {
        let (i, character) = (name.chars().zip(name.nfc()).enumerate())
            .find_map(|(i, (a, b))| (a != b).then_some((i, a)))
            .unwrap_or_else(|| {
                // The NFC form is a prefix of the name: composition ate its tail.
                let i = name.nfc().count();
                (
                    i,
                    name.chars().nth(i).unwrap_or(char::REPLACEMENT_CHARACTER),
                )
            });
        return Err(NameError::NotNfc {
            character,
            position: i + 1,
        });
    }
    Ok(())
}

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
    /// The rules for names (of leases and of groups), in one place. A name
    /// is refused when it:
    ///
    /// - is empty or only whitespace ([`NameError::Empty`]);
    /// - is longer than [`LeaseId::MAX_NAME_LEN`] bytes
    ///   ([`NameError::TooLong`]);
    /// - contains a control character ([`NameError::ControlCharacter`]);
    /// - contains an invisible character ([`NameError::Invisible`]): U+00AD
    ///   (soft hyphen), U+034F (combining grapheme joiner), U+180E
    ///   (Mongolian vowel separator), U+200B to U+200D (zero-width space,
    ///   non-joiner, joiner), U+2060 to U+2064 (word joiner, invisible
    ///   operators) or U+FEFF (zero-width no-break space, byte-order mark):
    ///   names that look alike would be different leases;
    /// - contains a bidirectional control character
    ///   ([`NameError::BidiControl`]): U+061C (Arabic letter mark), U+200E
    ///   and U+200F (left-to-right and right-to-left marks), U+202A to
    ///   U+202E (embeddings, overrides) or U+2066 to U+2069 (isolates),
    ///   which reorder how the name and what follows it are shown;
    /// - is not in Unicode Normalization Form C ([`NameError::NotNfc`]).
    ///   The key hashes the name's bytes, so "é" composed (U+00E9) and
    ///   decomposed (U+0065 U+0301) would be two leases; a name is never
    ///   normalized (a replica that normalized while another did not would
    ///   split the lease during a rolling upgrade), only refused;
    /// - ends in `/` and ASCII digits ([`NameError::ShardForm`]): that is
    ///   the form of a shard's name, [`LeaseId::shard`], and `NAME/0` would
    ///   be shard 0 of group `NAME` (`lease run NAME --shards N`).
    ///
    /// Every name accepted keeps the key it always had.
    ///
    /// # Errors
    /// [`NameError`] as above.
    pub fn named(name: impl Into<String>) -> Result<LeaseId, NameError> {
        let name = name.into();
        check_text(&name)?;
        if has_shard_form(&name) {
            return Err(NameError::ShardForm);
        }
        let key = key_for_name(&name);
        Ok(LeaseId {
            name,
            key,
            group: None,
        })
    }

    /// Shard `index` of `group`: the lease named `GROUP/INDEX` (decimal),
    /// whose key is [`key_for_name`] of that name, in the group (as
    /// [`LeaseId::in_group`]). The only way to a name of that form:
    /// [`LeaseId::named`] refuses it, so no plain lease shares a shard's key.
    /// `lease run NAME --shards N` runs the shards `0` to `N-1` of `NAME`.
    ///
    /// # Errors
    /// [`NameError::TooLong`] when the shard's name is longer than
    /// [`LeaseId::MAX_NAME_LEN`] bytes.
    pub fn shard(group: &GroupId, index: u32) -> Result<LeaseId, NameError> {
        let name = format!("{}/{index}", group.name());
        if name.len() > Self::MAX_NAME_LEN {
            return Err(NameError::TooLong(name.len()));
        }
        let key = key_for_name(&name);
        Ok(LeaseId {
            name,
            key,
            group: Some(group.clone()),
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
    /// [`NameError`] as for [`LeaseId::named`].
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

    /// "é" composed (U+00E9, NFC) and decomposed (U+0065 U+0301, NFD) hash
    /// to two keys: only the NFC form is a lease name, and it keeps its key
    /// (a name is refused, never normalized).
    #[test]
    fn one_lease_per_name_whatever_its_unicode_form() {
        let (nfc, nfd) = ("\u{e9}", "e\u{301}");
        assert_eq!(key_for_name(nfc), 9_026_850_448_207_742_048);
        assert_eq!(key_for_name(nfd), 4_700_420_084_075_091_565);
        assert_eq!(
            LeaseId::named(nfc).map(|l| l.key()),
            Ok(9_026_850_448_207_742_048)
        );
        // Decomposed accents, a singleton (ANGSTROM SIGN is U+00C5 in NFC),
        // conjoining Hangul jamo, combining marks out of canonical order.
        let refused = [
            (nfd, "U+0065 at character 1"),
            ("cafe\u{301}-sweeper", "U+0065 at character 4"),
            ("\u{212b}ngstr\u{f6}m", "U+212B at character 1"),
            ("job-\u{1100}\u{1161}", "U+1100 at character 5"),
            ("a\u{301}\u{327}", "U+0061 at character 1"),
        ];
        for (name, at) in refused {
            let error = LeaseId::named(name)
                .map(|l| l.key())
                .expect_err("a name not in NFC was accepted: the same text in NFC is another key");
            let text = error.to_string();
            assert!(text.contains("not in Unicode NFC form"), "{name:?}: {text}");
            assert!(text.contains(at), "{name:?}: {text} (want {at})");
        }
        // Every golden name is valid, with its key.
        for (name, key) in [
            ("sweeper", GOLDEN[0]),
            ("billing-reconciler", GOLDEN[1]),
            ("a", GOLDEN[2]),
            ("ünïcödé/名前", GOLDEN[3]),
        ] {
            assert_eq!(LeaseId::named(name).map(|l| l.key()), Ok(key), "{name:?}");
        }
    }

    /// Zero-width and other invisible characters, and bidirectional
    /// controls, are refused: each names its code point and position.
    #[test]
    fn invisible_and_bidi_control_characters_are_refused() {
        let invisible = [
            '\u{00ad}', '\u{034f}', '\u{180e}', '\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}',
            '\u{2061}', '\u{2064}', '\u{feff}',
        ];
        let bidi = [
            '\u{061c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}',
            '\u{202e}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ];
        let mut accepted = Vec::new();
        for (chars, kind) in [(&invisible[..], "invisible"), (&bidi[..], "bidirectional")] {
            for &c in chars {
                let name = format!("job{c}x");
                match LeaseId::named(name.as_str()) {
                    Ok(id) => accepted.push(format!("U+{:04X} (key {})", u32::from(c), id.key())),
                    Err(e) => {
                        let text = e.to_string();
                        let want = format!("U+{:04X} at character 4", u32::from(c));
                        assert!(text.contains(kind) && text.contains(&want), "{text}");
                    }
                }
            }
        }
        assert!(
            accepted.is_empty(),
            "accepted in a lease name: {accepted:?}"
        );
        // Visible neighbours stay valid.
        for name in ["job\u{a0}x", "caf\u{e9}", "\u{05d0}\u{05d1}", "\u{1f600}"] {
            assert!(LeaseId::named(name).is_ok(), "{name:?}");
        }
    }

    /// A plain lease named like a shard (`NAME/0`) would share the key of
    /// shard 0 of group `NAME` (`lease run NAME --shards N`): a name ending
    /// in `/` and digits is refused; other slashes and digits are not.
    #[test]
    fn a_lease_name_cannot_be_a_shards_name() {
        let shard_key = key_for_name("NAME/0");
        assert_eq!(shard_key, 5_049_073_497_831_337_967);
        let mut accepted = Vec::new();
        for name in ["NAME/0", "NAME/17", "NAME/255", "a/b/3", "x/007", "/0"] {
            match LeaseId::named(name) {
                Ok(id) => accepted.push(format!("{name} (key {})", id.key())),
                Err(e) => assert!(e.to_string().contains("shard"), "{name}: {e}"),
            }
        }
        assert!(
            accepted.is_empty(),
            "accepted as plain lease names, each the key of a shard: {accepted:?}"
        );
        for name in [
            "NAME", "NAME/x", "NAME/0a", "NAME/", "v1.2", "NAME0", "a/1/b",
        ] {
            assert!(LeaseId::named(name).is_ok(), "{name:?}");
        }
    }

    /// The refusals are typed, and a shard's key is the key its name always
    /// had: `LeaseId::shard` is the one way to a name of that form.
    #[test]
    fn refusals_are_typed_and_shards_keep_their_keys() {
        let at = |character, position| (character, position);
        let refused = |name: &str| LeaseId::named(name).unwrap_err();
        assert!(matches!(
            refused("job\u{200b}x"),
            NameError::Invisible { character, position } if at(character, position) == at('\u{200b}', 4)
        ));
        assert!(matches!(
            refused("\u{202e}job"),
            NameError::BidiControl { character, position } if at(character, position) == at('\u{202e}', 1)
        ));
        assert!(matches!(
            refused("cafe\u{301}"),
            NameError::NotNfc { character, position } if at(character, position) == at('e', 4)
        ));
        assert_eq!(refused("NAME/0"), NameError::ShardForm);
        assert_eq!(GroupId::named("NAME/0"), Err(NameError::ShardForm));
        let group = GroupId::named("NAME").unwrap();
        for i in [0, 1, 255, 65_535] {
            let shard = LeaseId::shard(&group, i).unwrap();
            assert_eq!(shard.name(), format!("NAME/{i}"));
            assert_eq!(shard.key(), key_for_name(&format!("NAME/{i}")));
            assert_eq!(shard.group(), Some(&group));
        }
        assert_eq!(
            LeaseId::shard(&group, 0).map(|s| s.key()),
            Ok(5_049_073_497_831_337_967)
        );
        let long = GroupId::named("x".repeat(LeaseId::MAX_NAME_LEN - 1)).unwrap();
        assert_eq!(
            LeaseId::shard(&long, 7),
            Err(NameError::TooLong(LeaseId::MAX_NAME_LEN + 1))
        );
    }
}
