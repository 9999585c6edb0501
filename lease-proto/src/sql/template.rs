//! The statements' SQL text: `.sql` files in `templates/`, read at compile
//! time, and the one rule for filling them in.
//!
//! A file holds sections; each starts at a `-- @name` line and runs to the
//! next. Other lines that start with `--` are comments and blank lines are
//! dropped; what is left is sent as written (trailing spaces trimmed).
//! `${name}` in a section is, in this order: a parameter the statement
//! passes, a constant of [`constant`] (a setting's name, a row tag, a raw
//! fragment), or another section (of any file: section names are unique),
//! filled in with constants only. A name that is none of these is a bug,
//! which the rendering of every statement in the tests finds (the golden
//! file, `templates/rendered.sql`).
//!
//! The files `advisory_key.sql`, `primary_timeline.sql` and
//! `wait_prelude.sql` have no sections, no comments and no parameters: they
//! are public constants as they stand.

use std::collections::BTreeMap;
use std::fmt::{self, Write};
use std::sync::OnceLock;

use super::{
    heartbeat_tag, members_tag, setup_tag, wait_outcome, CHECKPOINT_SETTING, HANDOVER_CHANNEL,
    HISTORY_SETTING, NONCE_SETTING, RELEASED_SETTING, SEARCH_PATH, TOKEN_CLOCK_OFFSET,
    TOKEN_SETTING, WAIT_SETTING, WATCH_OF,
};

/// A file's text without surrounding whitespace, as a constant.
pub(super) const fn raw(text: &'static str) -> &'static str {
    match std::str::from_utf8(text.as_bytes().trim_ascii()) {
        Ok(text) => text,
        Err(_) => panic!("a template is not UTF-8"),
    }
}

/// The files with sections, by name.
pub(super) const FILES: [(&str, &str); 8] = [
    ("common.sql", include_str!("templates/common.sql")),
    ("setup.sql", include_str!("templates/setup.sql")),
    ("try_lock.sql", include_str!("templates/try_lock.sql")),
    ("heartbeat.sql", include_str!("templates/heartbeat.sql")),
    ("wait.sql", include_str!("templates/wait.sql")),
    ("release.sql", include_str!("templates/release.sql")),
    ("members.sql", include_str!("templates/members.sql")),
    ("inspect.sql", include_str!("templates/inspect.sql")),
];

/// Every section of [`FILES`], by name, comments and blank lines dropped.
pub(super) fn sections() -> &'static BTreeMap<&'static str, String> {
    static SECTIONS: OnceLock<BTreeMap<&'static str, String>> = OnceLock::new();
    SECTIONS.get_or_init(|| {
        let mut sections = BTreeMap::new();
        for (file, text) in FILES {
            let mut current: Option<(&str, String)> = None;
            for line in text.lines() {
                let trimmed = line.trim_end();
                if let Some(name) = trimmed.strip_prefix("-- @") {
                    if let Some((name, body)) = current.take() {
                        sections.insert(name, body);
                    }
                    current = Some((name, String::new()));
                } else if trimmed.trim_start().starts_with("--") || trimmed.is_empty() {
                } else if let Some((_, body)) = &mut current {
                    if !body.is_empty() {
                        body.push('\n');
                    }
                    body.push_str(trimmed);
                } else {
                    panic!("{file}: SQL before the first section: {line}");
                }
            }
            if let Some((name, body)) = current {
                sections.insert(name, body);
            }
        }
        sections
    })
}

/// The constants a template may name.
fn constant(name: &str) -> Option<String> {
    let text = |s: &str| Some(s.to_owned());
    let int = |n: i64| Some(n.to_string());
    match name {
        "channel" => text(HANDOVER_CHANNEL),
        "nonce_setting" => text(NONCE_SETTING),
        "wait_setting" => text(WAIT_SETTING),
        "token_setting" => text(TOKEN_SETTING),
        "released_setting" => text(RELEASED_SETTING),
        "checkpoint_setting" => text(CHECKPOINT_SETTING),
        "history_setting" => text(HISTORY_SETTING),
        "search_path" => text(SEARCH_PATH),
        "watch_of" => text(WATCH_OF),
        "token_offset" => int(TOKEN_CLOCK_OFFSET),
        "advisory_key" => text(super::ADVISORY_KEY_SQL),
        "prelude" => text(super::WAIT_PRELUDE_SQL),
        "setup.applied" => int(setup_tag::APPLIED),
        "setup.server_version" => int(setup_tag::SERVER_VERSION),
        "setup.in_recovery" => int(setup_tag::IN_RECOVERY),
        "setup.backend_pid" => int(setup_tag::BACKEND_PID),
        "setup.idle_session_timeout_ms" => int(setup_tag::IDLE_SESSION_TIMEOUT_MS),
        "setup.unix_socket" => int(setup_tag::UNIX_SOCKET),
        "setup.nonce" => int(setup_tag::NONCE),
        "setup.search_path" => int(setup_tag::SEARCH_PATH),
        "setup.server_clock_us" => int(setup_tag::SERVER_CLOCK_US),
        "setup.replayed_since_start" => int(setup_tag::REPLAYED_SINCE_START),
        "setup.wal_timeline" => int(setup_tag::WAL_TIMELINE),
        "setup.checkpoint_timeline" => int(setup_tag::CHECKPOINT_TIMELINE),
        "setup.checkpoint_age_ms" => int(setup_tag::CHECKPOINT_AGE_MS),
        "setup.history_age_ms" => int(setup_tag::HISTORY_AGE_MS),
        "heartbeat.backend_pid" => int(heartbeat_tag::BACKEND_PID),
        "heartbeat.held_key" => int(heartbeat_tag::HELD_KEY),
        "heartbeat.nonce" => int(heartbeat_tag::NONCE),
        "heartbeat.freed" => int(heartbeat_tag::FREED),
        "heartbeat.deadlock_timeout_ms" => int(heartbeat_tag::DEADLOCK_TIMEOUT_MS),
        "heartbeat.token" => int(heartbeat_tag::TOKEN),
        "heartbeat.server_clock_us" => int(heartbeat_tag::SERVER_CLOCK_US),
        "heartbeat.waiting" => int(heartbeat_tag::WAITING),
        "wait.held" => int(wait_outcome::HELD),
        "wait.freed" => int(wait_outcome::FREED),
        "wait.crowded" => int(wait_outcome::CROWDED),
        "wait.held_here" => int(wait_outcome::HELD_HERE),
        "members.session" => int(members_tag::SESSION),
        "members.member" => int(members_tag::MEMBER),
        "members.holder" => int(members_tag::HOLDER),
        "members.joined" => int(members_tag::JOINED),
        "members.left" => int(members_tag::LEFT),
        _ => None,
    }
}

/// The parameters of one rendering: `(name, value)`.
pub(crate) type Params<'a> = [(&'a str, &'a dyn fmt::Display)];

/// Section `name` filled in with `params` (see the module docs).
///
/// # Panics
/// When `name` is no section, or a `${…}` in it names nothing: a bug in a
/// template, found by the tests that render every statement.
pub(crate) fn render(name: &str, params: &Params<'_>) -> String {
    let Some(text) = sections().get(name) else {
        panic!("no SQL section {name:?}");
    };
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text.as_str();
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            panic!("section {name:?}: unclosed ${{");
        };
        let var = &after[..end];
        if let Some((_, value)) = params.iter().find(|(n, _)| *n == var) {
            write!(out, "{value}").ok();
        } else if let Some(value) = constant(var) {
            out.push_str(&value);
        } else if sections().contains_key(var) {
            out.push_str(&render(var, &[]));
        } else {
            panic!("section {name:?}: nothing named ${{{var}}}");
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}
