//! Each [`Statement`] as SQL: which template section it is and what fills it
//! in. The SQL itself is in `templates/` (see `template`).

use std::fmt::{self, Write};

use super::template::render;
use super::{setup_tag, Statement, TCP_SETTINGS};

impl Statement {
    /// The SQL text to send with the simple-query protocol.
    ///
    /// Every function, relation, type and operator in it is qualified with
    /// `pg_catalog.` (operators as `OPERATOR(pg_catalog.=)`), and none of the
    /// constructs that look an operator up by its bare name (`NULLIF`, `IS
    /// DISTINCT FROM`, `IN`, a simple `CASE`) is used: a role may own a
    /// schema with objects named like `pg_catalog`'s and put it first in its
    /// `search_path` (`pg_catalog` comes first only when the path does not
    /// name it). The session's `search_path` is also forced to `pg_catalog`
    /// ([`SEARCH_PATH`](super::SEARCH_PATH), a startup option or the setup's
    /// `set_config`) and read back by the setup, so a statement that slipped
    /// would still resolve there; a unit test scans every statement for
    /// unqualified names.
    pub fn sql(&self) -> String {
        match self {
            Statement::Listen => format!("LISTEN {}", super::HANDOVER_CHANNEL),
            Statement::Setup { nonce, settings } => {
                let set: String = (settings.iter())
                    .map(|(name, value)| {
                        format!("\n  {}", render("set", &[("name", name), ("value", value)]))
                    })
                    .collect();
                let names = std::iter::once("idle_session_timeout")
                    .chain(TCP_SETTINGS)
                    .collect::<Vec<_>>()
                    .join(",");
                let setting = |name: &str| render("setting", &[("name", &name)]);
                let tcp_rows = (TCP_SETTINGS.iter().enumerate())
                    .map(|(i, name)| {
                        let tag = setup_tag::TCP_FIRST + i as i64;
                        render("tcp_row", &[("tag", &tag), ("setting", &setting(name))])
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                let checkpoint_field = |n: i64| render("checkpoint_field", &[("n", &n)]);
                let promotion = render(
                    "promotion",
                    &[
                        ("checkpoint_timeline", &checkpoint_field(1)),
                        ("checkpoint_age", &checkpoint_field(2)),
                    ],
                );
                render(
                    "setup",
                    &[
                        ("nonce", nonce),
                        ("settings", &set),
                        ("setting_names", &names),
                        ("idle_session_timeout", &setting("idle_session_timeout")),
                        ("tcp_rows", &tcp_rows),
                        ("promotion", &promotion),
                    ],
                )
            }
            Statement::TryLock {
                keys,
                backend_pid,
                nonce,
            } => render(
                "try_lock",
                &[
                    ("keys", &KeyArray(keys)),
                    ("backend_pid", backend_pid),
                    ("nonce", nonce),
                ],
            ),
            Statement::Heartbeat => render("heartbeat", &[]),
            Statement::Verify => render("verify", &[]),
            Statement::Wait {
                key,
                timeout_ms,
                crowd,
                watch_of,
            } => render(
                "wait",
                &[
                    ("key", key),
                    ("crowded", &crowd_check(*key, *crowd)),
                    (
                        "named",
                        &watch_of.map_or(String::new(), |pid| render("watch_of", &[("pid", &pid)])),
                    ),
                    ("cut", &cut_lock_timeout(*timeout_ms)),
                ],
            ),
            Statement::Take {
                key,
                timeout_ms,
                crowd,
                backend_pid,
                nonce,
            } => render(
                "take",
                &[
                    ("key", key),
                    ("backend_pid", backend_pid),
                    ("nonce", nonce),
                    ("crowded", &crowd_check(*key, *crowd)),
                    ("cut", &cut_lock_timeout(*timeout_ms)),
                    ("here", &locks_here(*key, true)),
                    ("any_here", &locks_here(*key, false)),
                ],
            ),
            Statement::Prefer { key, priority } => {
                render("prefer", &[("key", key), ("priority", priority)])
            }
            Statement::CheckHandover { asks } => {
                let column = |f: fn(&(i64, i64)) -> i64| asks.iter().map(f).collect::<Vec<_>>();
                let (keys, pids) = (column(|a| a.0), column(|a| a.1));
                let asks = render(
                    "asks",
                    &[("keys", &KeyArray(&keys)), ("pids", &KeyArray(&pids))],
                );
                let waiting = |a: &str| {
                    let named = locks_of(a, &format!("{a}.p"), false);
                    render("waiting", &[("a", &a), ("waiter_named", &named)])
                };
                render(
                    "check_handover",
                    &[
                        ("asks", &asks),
                        ("waiting_a", &waiting("a")),
                        ("waiting_b", &waiting("b")),
                    ],
                )
            }
            Statement::Members {
                join,
                leave,
                groups,
                keys,
                notify,
                announce,
                claims,
            } => {
                let mut sql = String::new();
                if *notify && !claims.is_empty() {
                    sql += &render("claims", &[("claims", &KeyArray(claims))]);
                    sql.push('\n');
                }
                if *notify && !announce.is_empty() {
                    sql += &render("announce", &[("groups", &GroupArray(announce))]);
                    sql.push('\n');
                }
                if !join.is_empty() {
                    let notice = if *notify {
                        format!(", {}", render("group_notice", &[]))
                    } else {
                        String::new()
                    };
                    sql += &render(
                        "join",
                        &[("groups", &GroupArray(join)), ("announce", &notice)],
                    );
                    sql.push('\n');
                }
                if !leave.is_empty() {
                    sql += &render("leave", &[("groups", &GroupArray(leave))]);
                    sql.push('\n');
                }
                let ids: Vec<i64> = groups.iter().map(|g| i64::from(*g)).collect();
                sql += &render(
                    "read",
                    &[("group_ids", &KeyArray(&ids)), ("keys", &KeyArray(keys))],
                );
                sql
            }
            Statement::Release {
                keys,
                notify: false,
                ..
            } => render("release", &[("keys", &KeyArray(keys))]),
            Statement::Release {
                keys,
                notify: true,
                reserved,
            } => {
                let column = |f: fn(&(i64, i64, i64)) -> i64| {
                    KeyArray(&reserved.iter().map(f).collect::<Vec<_>>()).to_string()
                };
                render(
                    "release_notify",
                    &[
                        ("keys", &KeyArray(keys)),
                        ("reserved_keys", &column(|r| r.0)),
                        ("reserved_pids", &column(|r| r.1)),
                        ("reserved_recent", &column(|r| r.2)),
                        ("asked", &locks_of("a", "a.p", true)),
                    ],
                )
            }
        }
    }
}

/// This backend's granted advisory locks on `key` in this database (only the
/// exclusive ones, with `exclusive`), as a `SELECT` for `EXISTS`.
fn locks_here(key: i64, exclusive: bool) -> String {
    let exclusive = if exclusive {
        render("exclusive", &[])
    } else {
        String::new()
    };
    render("locks_here", &[("key", &key), ("exclusive", &exclusive)])
}

/// The advisory locks on key `{a}.k` in this database of backend `pid` (an
/// expression), as a `SELECT` for `EXISTS`: only the waiting ones, or with
/// `granted_too` the granted ones as well.
fn locks_of(a: &str, pid: &str, granted_too: bool) -> String {
    let waiting = if granted_too { "" } else { "AND NOT w.granted" };
    render(
        "locks_of",
        &[("a", &a), ("pid", &pid), ("waiting", &waiting)],
    )
}

/// A wait's crowd check, as the first statement of its `DO` block: with
/// `crowd` waiters of `key` or more with a smaller backend pid queued
/// already, the block records "crowded" and returns without queueing.
fn crowd_check(key: i64, crowd: Option<u32>) -> String {
    crowd.map_or(String::new(), |n| {
        render("crowd_check", &[("n", &n), ("key", &key)])
    })
}

/// A transaction-local `lock_timeout` of `ms`, cut to
/// [`wait_limit_ms`](super::wait_limit_ms) of the session's
/// `deadlock_timeout`, as a statement of a `DO` block.
fn cut_lock_timeout(ms: u64) -> String {
    render("cut_lock_timeout", &[("ms", &ms.max(1))])
}

/// Keys as an `int8[]` literal.
pub(super) struct KeyArray<'a>(pub(super) &'a [i64]);

/// Group ids as the `int4` first halves of their members' locks.
pub(super) struct GroupArray<'a>(pub(super) &'a [u32]);

impl fmt::Display for GroupArray<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("'{")?;
        for (i, g) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_char(',')?;
            }
            write!(f, "{}", *g as i32)?;
        }
        f.write_str("}'::pg_catalog.int4[]")
    }
}

impl fmt::Display for KeyArray<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("'{")?;
        for (i, k) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_char(',')?;
            }
            write!(f, "{k}")?;
        }
        f.write_str("}'::pg_catalog.int8[]")
    }
}
