//! Reading the lock table yourself: who holds which lease key and which
//! sessions wait for it, as `lease status` shows it. [`holders_sql`] is the
//! query, [`HolderRow`] one row of it, [`ADVISORY_KEY_SQL`](crate::server::ADVISORY_KEY_SQL)
//! the `pg_locks` expression of a key. Nothing here is the machine's: a lease
//! client never sends it.
//!
//! The model of what the rows say is pure (no I/O): a [`LockTable`] groups
//! one read's rows into each key's holders and waiters ([`LeaseLocks`]),
//! named after the lease where a session says which ([`lease_application_name`]);
//! a [`HolderHistory`] follows the holders across successive reads (when
//! each was first seen: the server records no grant time).

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use crate::key::{key_for_name, LeaseId};
use crate::sql::template::render;

/// A [`holders_sql`] row lacks a column or has one of the wrong type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectError {
    /// The zero-based column (the row's length when columns are missing).
    pub column: usize,
    /// Its text (at most 64 characters), `None` for NULL or missing.
    pub text: Option<String>,
}

impl fmt::Display for InspectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (column, text) = (self.column, &self.text);
        write!(f, "malformed lock table row: column {column} is {text:?}")
    }
}

impl std::error::Error for InspectError {}

/// Who holds and who waits for which advisory key in the current database:
/// one row per single-`bigint` advisory lock request in `pg_locks`, granted
/// (a holder) or not (a waiter: a standby waiting on the server, on its
/// lease session or, while it holds another lease, its watch session, or any
/// other client blocked in `pg_advisory_lock`-like calls), with its session
/// from `pg_stat_activity` (NULLs when it is gone or not visible to the
/// querying role).
///
/// Rows are ordered by key, then granted before waiting, then waiters by
/// `waitstart` (the server's queue order as far as `pg_locks` shows it: a
/// waiter whose `lock_timeout` ran out and that waits again joins the end),
/// then pid. Columns, in order, as [`HolderRow`]'s fields: `key int8, pid
/// int4, mode text, application_name text, client_addr text, client_port
/// int4, backend_start text, state_change text, state text, granted bool,
/// wait_start text`; the times are UTC in RFC 3339 with microseconds.
///
/// What the server does not record, this cannot show: when a granted lock
/// was granted (`pg_locks.waitstart` is NULL once a lock is held; the
/// holder's `backend_start` is only a lower bound), nor a holder's fencing
/// token (the transaction that made it ended long ago; only the holder's
/// process knows it). `wait_start` needs PostgreSQL 14 or later (NULL
/// before; the statement reads it through `to_jsonb`, so it runs on older
/// servers too).
///
/// Unlike [`Statement`](crate::Statement)s this one is for people and tools (`lease status`):
/// its columns are not all `int8`. Send it with the simple-query protocol
/// and parse each row's text columns with [`HolderRow::parse`].
pub fn holders_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        render(
            "holders",
            &[
                ("backend_start", &utc_text("a.backend_start")),
                ("state_change", &utc_text("a.state_change")),
                ("waitstart", &utc_text("h.waitstart")),
            ],
        )
    })
}

/// The members of every lease group in this database: one row per granted
/// member lock (the two-int advisory lock `(group id, backend pid)`,
/// `objsubid` 2, that counts only when its second half is the pid of the
/// backend that holds it: `docs/library.md`, "Lease groups"), in
/// [`holders_sql`]'s columns with the group id as the key, by group and
/// backend start. Parse each row with [`HolderRow::parse`].
pub fn members_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        render(
            "members",
            &[
                ("backend_start", &utc_text("a.backend_start")),
                ("state_change", &utc_text("a.state_change")),
            ],
        )
    })
}

/// A `timestamptz` expression as UTC RFC 3339 text with microseconds.
fn utc_text(e: &str) -> String {
    render("utc_text", &[("e", &e)])
}

/// The number of columns of [`holders_sql`].
const HOLDER_COLUMNS: usize = 11;

/// One row of [`holders_sql`]: an advisory lock request on a key, granted
/// (its holder) or waiting (a standby, or another client), and the session
/// that made it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HolderRow {
    /// The advisory key.
    pub key: i64,
    /// The session's backend pid (`None` for a prepared transaction's lock).
    pub pid: Option<i32>,
    /// The lock mode: `ExclusiveLock` for `pg_advisory_lock` (a lease
    /// holder), `ShareLock` for the `_shared` forms (a standby waiting on
    /// the server asks for one).
    pub mode: Option<String>,
    /// The session's `application_name` (`lease:NAME` for `lease run`).
    pub application_name: Option<String>,
    /// The session's client address.
    pub client_addr: Option<String>,
    /// The session's client port (-1: a Unix socket).
    pub client_port: Option<i32>,
    /// When the session's backend started (UTC, RFC 3339): for a holder a
    /// lower bound of when it took the key, for a standby when it started
    /// standing by (as far as its current session goes).
    pub backend_start: Option<String>,
    /// When the session last changed state (UTC, RFC 3339).
    pub state_change: Option<String>,
    /// The session's state (`idle`, `active`, ...).
    pub state: Option<String>,
    /// The lock is held (`false`: the session waits for it).
    pub granted: bool,
    /// When the session's current wait for this lock began (UTC, RFC
    /// 3339); `None` for a granted lock, and before PostgreSQL 14.
    pub wait_start: Option<String>,
}

impl HolderRow {
    /// Parses one row of [`holders_sql`] as the simple-query protocol
    /// returns it: each column's text, `None` for NULL.
    ///
    /// # Errors
    /// [`InspectError`] for a missing column, a key or pid that
    /// is not an integer, or a `granted` that is not `t` or `f`.
    pub fn parse<'a>(
        columns: impl IntoIterator<Item = Option<&'a str>>,
    ) -> Result<HolderRow, InspectError> {
        let columns: Vec<Option<&str>> = columns.into_iter().collect();
        let bad = |column: usize| InspectError {
            column,
            text: (columns.get(column).copied().flatten()).map(|t| t.chars().take(64).collect()),
        };
        if columns.len() != HOLDER_COLUMNS {
            return Err(bad(columns.len().min(HOLDER_COLUMNS)));
        }
        let text = |i: usize| columns[i].map(str::to_owned);
        let int = |i: usize| -> Result<Option<i32>, InspectError> {
            columns[i]
                .map(|t| t.parse::<i32>().map_err(|_| bad(i)))
                .transpose()
        };
        Ok(HolderRow {
            key: (columns[0].and_then(|t| t.parse::<i64>().ok())).ok_or_else(|| bad(0))?,
            pid: int(1)?,
            mode: text(2),
            application_name: text(3),
            client_addr: text(4),
            client_port: int(5)?,
            backend_start: text(6),
            state_change: text(7),
            state: text(8),
            granted: match columns[9] {
                Some("t") => true,
                Some("f") => false,
                _ => return Err(bad(9)),
            },
            wait_start: text(10),
        })
    }

    /// The columns a server sends for this row, as text (for tests and
    /// simulated servers).
    pub fn to_text(&self) -> Vec<Option<String>> {
        vec![
            Some(self.key.to_string()),
            self.pid.map(|p| p.to_string()),
            self.mode.clone(),
            self.application_name.clone(),
            self.client_addr.clone(),
            self.client_port.map(|p| p.to_string()),
            self.backend_start.clone(),
            self.state_change.clone(),
            self.state.clone(),
            Some(if self.granted { "t" } else { "f" }.to_owned()),
            self.wait_start.clone(),
        ]
    }
}

/// The prefix of [`lease_application_name`].
const APPLICATION_PREFIX: &str = "lease:";

/// The `application_name` that names a lease's session: `lease:NAME` (what
/// `lease run` sets unless told otherwise), cut to the 63 bytes the server
/// keeps (on a character boundary). [`LockTable`] names a key after it; a
/// cut name does not match its key and names nothing.
pub fn lease_application_name(name: &str) -> String {
    lease_application_name_of(name, None)
}

/// [`lease_application_name`] with the holder's identity (a host or pod name):
/// `lease:NAME@IDENTITY`. Within the server's 63 bytes the identity is cut
/// first (dropped when the name leaves it no room), so the name still names
/// its key; [`application_lease_names`] reads both forms back.
pub fn lease_application_name_of(name: &str, identity: Option<&str>) -> String {
    let mut s = format!("{APPLICATION_PREFIX}{name}");
    if let Some(id) = identity.filter(|id| !id.is_empty()) {
        let room = 63usize.saturating_sub(s.len() + 1);
        let mut end = id.len().min(room);
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        if end > 0 {
            s.push('@');
            s.push_str(&id[..end]);
        }
    }
    let mut end = s.len().min(63);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

/// The lease names an `application_name` of the form
/// [`lease_application_name_of`] may give, most likely first: everything after
/// `lease:`, then everything before each `@` from the right (a lease name may
/// hold an `@` itself). Empty for any other form. Match one against a key to
/// know (`key_for_name`).
pub fn application_lease_names(application_name: &str) -> Vec<&str> {
    let Some(rest) = application_name.strip_prefix(APPLICATION_PREFIX) else {
        return Vec::new();
    };
    let mut names = vec![rest];
    names.extend(rest.rmatch_indices('@').map(|(i, _)| &rest[..i]));
    names
}

/// The lease name a row's session gives in its [`lease_application_name_of`],
/// if that name's key is the row's key.
fn lease_name(row: &HolderRow) -> Option<String> {
    let names = application_lease_names(row.application_name.as_deref()?);
    let name = names.into_iter().find(|n| key_for_name(n) == row.key)?;
    Some(name.to_owned())
}

/// One lease (or any advisory key) as the lock table shows it: who holds its
/// key and who waits for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseLocks {
    /// The lease name: the one asked for ([`LockTable::leases`]), or the
    /// one a session on the key gives in its [`lease_application_name`]; `None`
    /// for a key no lease session names.
    pub name: Option<String>,
    /// The advisory key.
    pub key: i64,
    /// The granted requests: none when the key is free, one for a lease
    /// (a key held in a shared mode can have several).
    pub holders: Vec<HolderRow>,
    /// The waiting requests, in queue order ([`holders_sql`]'s): standbys
    /// waiting on the server, or other clients blocked on the key.
    pub waiters: Vec<HolderRow>,
}

/// One read of the lock table ([`holders_sql`]'s rows), by key: every key
/// held or waited for, with its holders and waiters. A view of the leases
/// is read from it ([`LockTable::all`], [`LockTable::leases`]); a view of
/// another grouping of keys would be read from it the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockTable {
    /// Every key of the rows, in the order of their first row (key order
    /// for [`holders_sql`]'s).
    keys: Vec<LeaseLocks>,
}

impl LockTable {
    /// Groups rows by key, keeping their order within a key (holders then
    /// waiters in queue order, for [`holders_sql`]'s). Each key is named
    /// after the first of its sessions that names it.
    pub fn from_rows(rows: impl IntoIterator<Item = HolderRow>) -> LockTable {
        let mut keys: Vec<LeaseLocks> = Vec::new();
        let mut index = HashMap::new();
        for row in rows {
            let i = *index.entry(row.key).or_insert_with(|| {
                keys.push(LeaseLocks {
                    key: row.key,
                    ..LeaseLocks::default()
                });
                keys.len() - 1
            });
            let lease = &mut keys[i];
            if row.granted {
                lease.holders.push(row);
            } else {
                lease.waiters.push(row);
            }
        }
        for lease in &mut keys {
            let mut sessions = lease.holders.iter().chain(&lease.waiters);
            lease.name = sessions.find_map(lease_name);
        }
        LockTable { keys }
    }

    /// Every key held or waited for.
    pub fn all(&self) -> &[LeaseLocks] {
        &self.keys
    }

    /// The locks of `key`, if it is held or waited for.
    pub fn key(&self, key: i64) -> Option<&LeaseLocks> {
        self.keys.iter().find(|l| l.key == key)
    }

    /// The leases `ids`, in that order, held or not, each named as asked.
    pub fn leases(&self, ids: &[LeaseId]) -> Vec<LeaseLocks> {
        (ids.iter())
            .map(|id| LeaseLocks {
                name: Some(id.name().to_owned()),
                ..(self.key(id.key()).cloned()).unwrap_or(LeaseLocks {
                    key: id.key(),
                    ..LeaseLocks::default()
                })
            })
            .collect()
    }
}

/// Since when a holder holds its key, as far as successive reads of the
/// lock table tell ([`HolderHistory::since`]). Exhaustive on purpose: a
/// holder either was there at the first read or appeared at a later one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldSince<T> {
    /// It held the key already at the first read, made at this time.
    Before(T),
    /// The read at this time is the first that showed it: it took the key
    /// after the read before.
    At(T),
}

/// A holder as reads tell it from another: its key, backend pid and backend
/// start (a pid can be reused by a later backend).
type HolderId = (i64, Option<i32>, Option<String>);

/// The holders seen across successive reads of the lock table, each with
/// the read that first showed it (`lease status --watch`'s HELD SINCE). `T`
/// is the caller's time of a read (any clock, or its text).
#[derive(Debug, Clone)]
pub struct HolderHistory<T> {
    /// Reads so far.
    reads: u64,
    /// Each holder of the last read and since when it holds.
    holders: HashMap<HolderId, HeldSince<T>>,
}

impl<T> Default for HolderHistory<T> {
    fn default() -> Self {
        HolderHistory {
            reads: 0,
            holders: HashMap::new(),
        }
    }
}

impl<T: Clone> HolderHistory<T> {
    /// Takes in a read of the lock table made at `at`. A holder that is not
    /// in it is forgotten: if it comes back, it took the key again.
    pub fn update(&mut self, table: &LockTable, at: T) {
        let first = self.reads == 0;
        self.reads += 1;
        let mut current = HashMap::new();
        for lease in table.all() {
            for h in &lease.holders {
                let id = (lease.key, h.pid, h.backend_start.clone());
                let known = self.holders.remove(&id);
                let new = || {
                    if first {
                        HeldSince::Before(at.clone())
                    } else {
                        HeldSince::At(at.clone())
                    }
                };
                current.insert(id, known.unwrap_or_else(new));
            }
        }
        self.holders = current;
    }

    /// Since when `holder` holds its key, if the last read showed it.
    pub fn since(&self, holder: &HolderRow) -> Option<&HeldSince<T>> {
        let id = (holder.key, holder.pid, holder.backend_start.clone());
        self.holders.get(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::ADVISORY_KEY_SQL;

    #[test]
    fn holder_rows_parse_holders_and_waiters() {
        // A holder and a standby waiting on the server, as the simple-query
        // protocol returns them.
        let holder = [
            Some("-3074394522925186474"),
            Some("81234"),
            Some("ExclusiveLock"),
            Some("lease:nightly"),
            Some("127.0.0.1"),
            Some("51234"),
            Some("2026-12-01T10:00:00.123456Z"),
            Some("2026-12-01T10:05:00.000001Z"),
            Some("idle"),
            Some("t"),
            None,
        ];
        let h = HolderRow::parse(holder).unwrap();
        assert_eq!(h.key, -3_074_394_522_925_186_474);
        assert_eq!(h.pid, Some(81234));
        assert!(h.granted && h.wait_start.is_none());
        assert_eq!(h.client_port, Some(51234));
        assert_eq!(h.state.as_deref(), Some("idle"));
        let mut waiter = holder;
        waiter[1] = Some("81240");
        waiter[2] = Some("ShareLock");
        waiter[8] = Some("active");
        waiter[9] = Some("f");
        waiter[10] = Some("2026-12-01T10:05:01.000000Z");
        let w = HolderRow::parse(waiter).unwrap();
        assert!(!w.granted);
        assert_eq!(w.mode.as_deref(), Some("ShareLock"));
        assert_eq!(w.wait_start.as_deref(), Some("2026-12-01T10:05:01.000000Z"));
        // A session gone from pg_stat_activity: NULLs but the lock's own.
        let gone = HolderRow::parse([
            Some("7"),
            None,
            Some("ExclusiveLock"),
            None,
            None,
            None,
            None,
            None,
            None,
            Some("t"),
            None,
        ])
        .unwrap();
        assert_eq!((gone.key, gone.pid, gone.application_name), (7, None, None));
        for row in [h, w] {
            let text = row.to_text();
            assert_eq!(HolderRow::parse(text.iter().map(|c| c.as_deref())), Ok(row));
        }
    }

    #[test]
    fn malformed_holder_rows_are_errors() {
        let good = HolderRow {
            key: 1,
            granted: true,
            ..HolderRow::default()
        }
        .to_text();
        let with = |column: usize, text: Option<&str>| {
            let mut row: Vec<Option<&str>> = good.iter().map(|c| c.as_deref()).collect();
            row[column] = text;
            HolderRow::parse(row)
        };
        assert!(with(0, Some("1")).is_ok());
        assert_eq!(
            with(0, Some("k")),
            Err(InspectError {
                column: 0,
                text: Some("k".into())
            })
        );
        assert!(with(0, None).is_err());
        assert!(with(1, Some("99999999999")).is_err());
        assert!(with(5, Some("-")).is_err());
        assert!(with(9, Some("true")).is_err());
        assert!(with(9, None).is_err());
        // Too few or too many columns.
        let short = good[..10].iter().map(|c| c.as_deref());
        assert_eq!(
            HolderRow::parse(short),
            Err(InspectError {
                column: 10,
                text: None
            })
        );
        let long = good.iter().map(|c| c.as_deref()).chain([Some("x")]);
        assert!(HolderRow::parse(long).is_err());
        // The text in the error is cut short.
        let junk = "x".repeat(1000);
        let err = with(0, Some(&junk)).unwrap_err();
        assert!(err.to_string().len() < 120, "{err}");
    }

    fn holder(key: i64, pid: i32, app: &str) -> HolderRow {
        HolderRow {
            key,
            pid: Some(pid),
            mode: Some("ExclusiveLock".to_owned()),
            application_name: Some(app.to_owned()),
            backend_start: Some(format!("2026-12-01T10:00:00.{pid:06}Z")),
            granted: true,
            ..HolderRow::default()
        }
    }

    fn waiter(key: i64, pid: i32, app: &str) -> HolderRow {
        HolderRow {
            mode: Some("ShareLock".to_owned()),
            granted: false,
            wait_start: Some("2026-12-01T10:05:00.5Z".to_owned()),
            ..holder(key, pid, app)
        }
    }

    fn pids(rows: &[HolderRow]) -> Vec<Option<i32>> {
        rows.iter().map(|r| r.pid).collect()
    }

    #[test]
    fn a_read_groups_holders_and_waiters_by_key_in_queue_order() {
        let a = LeaseId::named("a").unwrap();
        let b = LeaseId::named("b").unwrap();
        let rows = vec![
            holder(a.key(), 42, "lease:a"),
            waiter(a.key(), 50, "lease:a"),
            waiter(a.key(), 49, "psql"),
            // A waiter with nobody holding (the instant after a release).
            waiter(b.key(), 60, "lease:b"),
        ];
        let table = LockTable::from_rows(rows);
        let all = table.all();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].key, all[0].name.as_deref()), (a.key(), Some("a")));
        assert_eq!(pids(&all[0].holders), [Some(42)]);
        assert_eq!(pids(&all[0].waiters), [Some(50), Some(49)]);
        // A key with only waiters is listed too, named from them.
        assert_eq!((all[1].key, all[1].name.as_deref()), (b.key(), Some("b")));
        assert!(all[1].holders.is_empty());
        assert_eq!(pids(&all[1].waiters), [Some(60)]);
        assert_eq!(table.key(b.key()), Some(&all[1]));
        assert_eq!(table.key(7), None);
        // Out of key order, the rows of a key still make one entry.
        let mixed = vec![
            waiter(1, 11, "x"),
            holder(2, 20, "y"),
            holder(1, 10, "x"),
            waiter(1, 12, "x"),
        ];
        let table = LockTable::from_rows(mixed);
        let keys: Vec<i64> = table.all().iter().map(|l| l.key).collect();
        assert_eq!(keys, [1, 2]);
        assert_eq!(pids(&table.all()[0].holders), [Some(10)]);
        assert_eq!(pids(&table.all()[0].waiters), [Some(11), Some(12)]);
        assert_eq!(LockTable::from_rows([]).all(), []);
    }

    #[test]
    fn named_leases_are_shown_held_or_not() {
        let a = LeaseId::named("a").unwrap();
        let b = LeaseId::named("b").unwrap();
        // Named as asked, whatever the session says.
        let table = LockTable::from_rows([holder(a.key(), 42, "other")]);
        let leases = table.leases(&[b.clone(), a.clone()]);
        assert_eq!(leases.len(), 2);
        assert_eq!(
            leases[0],
            LeaseLocks {
                name: Some("b".to_owned()),
                key: b.key(),
                holders: vec![],
                waiters: vec![]
            }
        );
        assert_eq!(leases[1].name.as_deref(), Some("a"));
        assert_eq!(pids(&leases[1].holders), [Some(42)]);
        assert_eq!(table.all()[0].name, None);
    }

    #[test]
    fn keys_are_named_only_by_a_lease_session_whose_name_matches() {
        let sweeper = LeaseId::named("sweeper").unwrap();
        let table = LockTable::from_rows([
            holder(sweeper.key(), 1, "lease:sweeper"),
            holder(7, 2, "other"),
            // `lease:` with a name of another key names nothing.
            holder(8, 3, "lease:sweeper"),
            // A holder that names nothing, a waiter that does.
            holder(9, 4, "psql"),
            waiter(9, 5, &lease_application_name("nine")),
        ]);
        let names: Vec<Option<&str>> = table.all().iter().map(|l| l.name.as_deref()).collect();
        assert_eq!(names, [Some("sweeper"), None, None, None]);
        let nine = LeaseId::named("nine").unwrap();
        let table =
            LockTable::from_rows([holder(9, 4, "psql"), waiter(nine.key(), 5, "lease:nine")]);
        assert_eq!(table.key(nine.key()).unwrap().name.as_deref(), Some("nine"));
    }

    #[test]
    fn identities_are_cut_before_names() {
        assert_eq!(
            lease_application_name_of("job", Some("web-1")),
            "lease:job@web-1"
        );
        assert_eq!(lease_application_name_of("job", Some("")), "lease:job");
        let long = lease_application_name_of("sweeper", Some(&"x".repeat(80)));
        assert_eq!(long.len(), 63);
        assert!(long.starts_with("lease:sweeper@xxx"));
        let row = holder(
            key_for_name("a@b"),
            1,
            &lease_application_name_of("a@b", Some("h@st")),
        );
        assert_eq!(lease_name(&row).as_deref(), Some("a@b"));
        let row = holder(key_for_name("sweeper"), 1, &long);
        assert_eq!(lease_name(&row).as_deref(), Some("sweeper"));
        assert_eq!(application_lease_names("psql"), Vec::<&str>::new());
        let no_room = lease_application_name_of(&"n".repeat(60), Some("web-1"));
        assert_eq!(no_room, format!("lease:{}", "n".repeat(57)));
    }

    #[test]
    fn application_names_fit_the_server() {
        assert_eq!(lease_application_name("job"), "lease:job");
        let long = lease_application_name(&"é".repeat(40));
        assert!(long.len() <= 63);
        assert!(long.starts_with("lease:é"));
        // A cut name names no key.
        let name = "é".repeat(40);
        let row = holder(key_for_name(&name), 1, &long);
        assert_eq!(lease_name(&row), None);
    }

    #[test]
    fn the_history_dates_holders_from_the_read_that_first_showed_them() {
        let mut history = HolderHistory::default();
        let first = holder(1, 42, "lease:a");
        history.update(&LockTable::from_rows([first.clone()]), "T0");
        assert_eq!(history.since(&first), Some(&HeldSince::Before("T0")));
        // Another holder, seen first at T1.
        let next = holder(1, 43, "lease:a");
        let read = LockTable::from_rows([next.clone(), waiter(1, 50, "lease:a")]);
        history.update(&read, "T1");
        assert_eq!(history.since(&next), Some(&HeldSince::At("T1")));
        assert_eq!(history.since(&first), None);
        // Still the same holder later: still since T1.
        history.update(&read, "T2");
        assert_eq!(history.since(&next), Some(&HeldSince::At("T1")));
        // The same pid on a later backend is another holder.
        let reused = HolderRow {
            backend_start: Some("2026-12-01T11:00:00.000000Z".to_owned()),
            ..next.clone()
        };
        history.update(&LockTable::from_rows([reused.clone()]), "T3");
        assert_eq!(history.since(&reused), Some(&HeldSince::At("T3")));
        // Gone, then back: it took the key again.
        history.update(&LockTable::default(), "T4");
        history.update(&LockTable::from_rows([first.clone()]), "T5");
        assert_eq!(history.since(&first), Some(&HeldSince::At("T5")));
    }

    #[test]
    fn the_key_expression_is_shared() {
        assert!(holders_sql().contains(ADVISORY_KEY_SQL));
        assert_eq!(HolderRow::default().to_text().len(), HOLDER_COLUMNS);
    }
}
