//! The statements' SQL (qualification, the golden file, the templates) and
//! the replies' codecs.

use super::*;
use std::collections::BTreeSet;
use std::fmt::Write;

/// Every name in `sql` that PostgreSQL would look up through the
/// session's `search_path`: unqualified function calls, casts to
/// unqualified types, unqualified `pg_*` relations, bare operators, and
/// the constructs that look up `=` by its bare name (`NULLIF`, `IS
/// DISTINCT FROM`, `IN`, `BETWEEN`, `LIKE`, a simple `CASE`).
/// String literals are skipped; a dollar-quoted body is scanned as SQL.
fn unqualified_names(sql: &str) -> Vec<String> {
    #[derive(Debug, PartialEq)]
    enum Tok {
        Name(Vec<String>),
        Op(String),
        Punct(char),
        Number,
        Str,
    }
    let chars: Vec<char> = sql.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    let op_char = |c: char| "+-*/<>=~!@#%^&|`?".contains(c);
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '\'' {
            i += 1;
            while i < chars.len() {
                if chars[i] == '\'' && chars.get(i + 1) == Some(&'\'') {
                    i += 2;
                } else if chars[i] == '\'' {
                    break;
                } else {
                    i += 1;
                }
            }
            i += 1;
            toks.push(Tok::Str);
        } else if c == '$' {
            // A dollar-quote delimiter: its body is SQL (a DO block).
            i += 1;
            while i < chars.len() && chars[i] != '$' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut parts = Vec::new();
            loop {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                parts.push(chars[start..i].iter().collect::<String>().to_lowercase());
                let more = chars.get(i) == Some(&'.')
                    && chars
                        .get(i + 1)
                        .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_');
                if !more {
                    break;
                }
                i += 1;
            }
            // `pg_catalog.` before an operator: `OPERATOR(pg_catalog.=)`.
            if chars.get(i) == Some(&'.') && chars.get(i + 1).is_some_and(|c| op_char(*c)) {
                i += 1;
                let start = i;
                while i < chars.len() && op_char(chars[i]) {
                    i += 1;
                }
                let op: String = chars[start..i].iter().collect();
                parts.push(op);
            }
            toks.push(Tok::Name(parts));
        } else if c.is_ascii_digit()
            || (c == '-'
                && chars.get(i + 1).is_some_and(char::is_ascii_digit)
                && !matches!(toks.last(), Some(Tok::Name(_) | Tok::Number | Tok::Str)))
        {
            i += 1;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            toks.push(Tok::Number);
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            i += 2;
            toks.push(Tok::Op("::".into()));
        } else if op_char(c) {
            let start = i;
            while i < chars.len() && op_char(chars[i]) {
                i += 1;
            }
            toks.push(Tok::Op(chars[start..i].iter().collect()));
        } else {
            i += 1;
            toks.push(Tok::Punct(c));
        }
    }
    const KEYWORDS: &[&str] = &[
        "select", "from", "where", "and", "or", "not", "then", "else", "when", "as", "any", "all",
        "array", "exists", "join", "on", "coalesce", "values", "union", "end", "with", "perform",
        "begin", "is", "null",
        // Grammar, which calls pg_catalog.extract (date_part before 14).
        "extract",
    ];
    const LOOKUPS: &[&str] = &[
        "nullif", "distinct", "in", "between", "like", "ilike", "similar",
    ];
    let catalog = |p: &[String]| p.len() >= 2 && p[0] == "pg_catalog";
    let mut found = Vec::new();
    for (n, tok) in toks.iter().enumerate() {
        let prev = n.checked_sub(1).map(|p| &toks[p]);
        let next = toks.get(n + 1);
        match tok {
            Tok::Name(parts) if catalog(parts) => {}
            Tok::Name(parts) => {
                let name = parts.join(".");
                let after_as = matches!(prev, Some(Tok::Name(p)) if p == &["as"]);
                if matches!(prev, Some(Tok::Op(o)) if o == "::") {
                    found.push(format!("type {name}"));
                } else if LOOKUPS.contains(&name.as_str()) {
                    found.push(format!("{name} (looks up = by name)"));
                } else if name == "case" && !matches!(next, Some(Tok::Name(p)) if p == &["when"]) {
                    found.push("simple CASE (looks up = by name)".into());
                } else if name == "operator" {
                    let inner = toks.get(n + 2);
                    if !matches!(inner, Some(Tok::Name(p)) if catalog(p)) {
                        found.push(format!("operator {inner:?}"));
                    }
                } else if name.starts_with("pg_") {
                    found.push(format!("name {name}"));
                } else if next == Some(&Tok::Punct('('))
                    && !after_as
                    && !KEYWORDS.contains(&name.as_str())
                {
                    found.push(format!("function {name}"));
                }
            }
            Tok::Op(o) if o != "::" => found.push(format!("operator {o}")),
            _ => {}
        }
    }
    found
}

#[test]
fn clock_tokens_are_above_every_token_of_the_scheme_before() {
    // `timeline << 48 | xid` with 48-bit xids, timelines below 256.
    let old_max = (255i64 << 48) | ((1 << 48) - 1);
    assert!(TOKEN_CLOCK_OFFSET > old_max);
    // Room for the clock: 2026 in microseconds, and in 200,000 years.
    let now_us = 1_800_000_000_000_000i64;
    let year_us = 31_557_600_000_000i64;
    assert!(TOKEN_CLOCK_OFFSET
        .checked_add(now_us + 200_000 * year_us)
        .is_some());
    let sql = Statement::TryLock {
        keys: vec![1],
        backend_pid: 7,
        nonce: 9,
    }
    .sql();
    assert!(sql.contains("pg_catalog.clock_timestamp()"), "{sql}");
    assert!(
        sql.contains("OR pg_catalog.pg_is_in_recovery() THEN false"),
        "{sql}"
    );
    // No transaction id, no WAL record: no flush, no synchronous standby.
    for writes in [
        "pg_current_xact_id",
        "txid_current",
        "pg_logical_emit_message",
    ] {
        assert!(!sql.contains(writes), "{sql}");
    }
}

#[test]
fn the_scanner_finds_unqualified_names() {
    for (sql, what) in [
        (
            "SELECT pg_try_advisory_lock(1)",
            "name pg_try_advisory_lock",
        ),
        ("SELECT length('x')", "function length"),
        ("SELECT 1::int8", "type int8"),
        ("SELECT 1 FROM pg_locks", "name pg_locks"),
        ("SELECT 1 WHERE 1 = 1", "operator ="),
        ("SELECT a | b", "operator |"),
        ("SELECT 1 WHERE 1 OPERATOR(evil.=) 1", "operator"),
        ("SELECT nullif(a, '')", "nullif"),
        ("SELECT a IS DISTINCT FROM b", "distinct"),
        ("SELECT 1 WHERE a IN (1, 2)", "in"),
        ("SELECT CASE a WHEN 1 THEN 2 END", "simple CASE"),
        (
            "DO $x$BEGIN PERFORM set_config('a', 'b', true); END$x$",
            "function set_config",
        ),
    ] {
        let found = unqualified_names(sql);
        assert!(
            found.iter().any(|f| f.starts_with(what)),
            "{sql}: {found:?}"
        );
    }
    let clean = "SELECT pg_catalog.length('a = b'), -5, x::pg_catalog.bit(32) \
                 OPERATOR(pg_catalog.|) 1 FROM pg_catalog.unnest(a) AS w(k) \
                 WHERE k OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT 1)) AND coalesce(a, b)";
    assert_eq!(unqualified_names(clean), Vec::<String>::new(), "{clean}");
}

/// Every statement, once per variant (the match has no wildcard: a new
/// variant does not compile until it is listed here).
fn every_statement() -> Vec<Statement> {
    let all = [
        Statement::Setup {
            nonce: -42,
            settings: vec![
                ("search_path", SEARCH_PATH.into()),
                ("idle_session_timeout", "900".into()),
            ],
        },
        Statement::Setup {
            nonce: 1,
            settings: vec![],
        },
        Statement::Listen,
        Statement::TryLock {
            keys: vec![i64::MIN, -1, 7],
            backend_pid: 99,
            nonce: -3,
        },
        Statement::Heartbeat,
        Statement::Verify,
        Statement::Wait {
            key: -5,
            timeout_ms: 2000,
            crowd: None,
            watch_of: Some(77),
        },
        Statement::Wait {
            key: -5,
            timeout_ms: 2000,
            crowd: Some(2),
            watch_of: None,
        },
        Statement::Take {
            key: -5,
            timeout_ms: 900,
            crowd: Some(2),
            backend_pid: 99,
            nonce: -3,
        },
        Statement::Take {
            key: i64::MIN,
            timeout_ms: 1,
            crowd: None,
            backend_pid: 99,
            nonce: 3,
        },
        Statement::Release {
            keys: vec![-1, 2],
            notify: true,
            reserved: vec![],
        },
        Statement::Release {
            keys: vec![-1, 2],
            notify: true,
            reserved: vec![(2, 77, 0), (-1, 78, 79)],
        },
        Statement::Release {
            keys: vec![3],
            notify: false,
            reserved: vec![],
        },
        Statement::Members {
            join: vec![7, u32::MAX],
            leave: vec![9],
            groups: vec![7, u32::MAX],
            keys: vec![-1, 2],
            notify: true,
            announce: vec![7],
            claims: vec![-3, 4],
        },
        Statement::Prefer {
            key: i64::MIN,
            priority: u32::MAX,
        },
        Statement::CheckHandover {
            asks: vec![(5, 77), (i64::MIN, 78)],
        },
        Statement::CheckHandover { asks: vec![] },
    ];
    for s in &all {
        match s {
            Statement::Setup { .. }
            | Statement::Listen
            | Statement::TryLock { .. }
            | Statement::Heartbeat
            | Statement::Verify
            | Statement::Wait { .. }
            | Statement::Take { .. }
            | Statement::Release { .. }
            | Statement::Members { .. }
            | Statement::Prefer { .. }
            | Statement::CheckHandover { .. } => {}
        }
    }
    all.into()
}

#[test]
fn every_statement_qualifies_every_name() {
    let texts = (every_statement().iter())
        .map(Statement::sql)
        .collect::<Vec<_>>()
        .into_iter()
        .chain(
            [
                crate::inspect::holders_sql(),
                crate::inspect::members_sql(),
                WAIT_PRELUDE_SQL,
                ADVISORY_KEY_SQL,
                PRIMARY_TIMELINE_SQL,
            ]
            .map(String::from),
        );
    for sql in texts {
        assert_eq!(unqualified_names(&sql), Vec::<String>::new(), "{sql}");
    }
}

/// A release names the backend a key is handed over to after the
/// grantee (0: none); an older payload parses as before.
#[test]
fn release_payloads_name_the_reserved_backend() {
    let notice = |at, grantee, reserved| {
        Some(Notice::Release(ReleaseNotice {
            key: -5,
            at,
            grantee,
            reserved,
        }))
    };
    assert_eq!(Notice::parse("-5"), notice(None, None, None));
    assert_eq!(Notice::parse("-5 9"), notice(Some(9), None, None));
    assert_eq!(Notice::parse("-5 9 7"), notice(Some(9), Some(7), None));
    assert_eq!(Notice::parse("-5 9 0"), notice(Some(9), None, None));
    assert_eq!(Notice::parse("-5 9 0 8"), notice(Some(9), None, Some(8)));
    assert_eq!(Notice::parse("-5 9 7 8"), notice(Some(9), Some(7), Some(8)));
    assert_eq!(
        Notice::parse(" -5  9 7 8 "),
        notice(Some(9), Some(7), Some(8))
    );
    assert_eq!(Notice::parse("-5 9 7 8 1"), None);
    assert_eq!(Notice::parse("-5 x"), None);
    assert_eq!(Notice::parse(""), None);
}

#[test]
fn the_primary_timeline_reads_a_positive_integer_or_null() {
    assert_eq!(primary_timeline(None), Ok(None));
    assert_eq!(primary_timeline(Some("1")), Ok(Some(1)));
    assert_eq!(
        primary_timeline(Some("4294967295")),
        Ok(Some(4_294_967_295))
    );
    for bad in ["0", "-1", "", "x2", "1.5"] {
        let parsed = primary_timeline(Some(bad));
        assert!(parsed.is_err(), "{bad:?}: {parsed:?}");
    }
}

/// Each kind parses from its own first word only, so a payload is never
/// read as another kind, and a malformed one as nothing: an older locker
/// ignores a newer kind, a newer one reads the old ones as before.
#[test]
fn each_payload_is_one_kind_or_none() {
    let asked = Preference {
        key: -5,
        pid: 4242,
        priority: 3,
    };
    for (payload, notice) in [
        ("prefer -5 4242 3", Some(Notice::Prefer(asked))),
        ("to -5 4242", Some(Notice::Request { key: -5, pid: 4242 })),
        ("claim -5 4242", Some(Notice::Claim { key: -5, pid: 4242 })),
        ("group 9", Some(Notice::Group(9))),
        ("group 4294967295", Some(Notice::Group(u32::MAX))),
        ("group -1", None),
        ("to -5", None),
        ("to -5 4242 1", None),
        ("claim x 4242", None),
        ("prefer -5 4242", None),
        ("prefer -5 4242 -1", None),
        ("prefer -5 4242 3 1", None),
        // Above the highest priority: the rank of a `to` request.
        (&*format!("prefer -5 4242 {}", u32::MAX), None),
        ("hello", None),
    ] {
        assert_eq!(Notice::parse(payload), notice, "{payload}");
    }
    assert_eq!(handover_request_payload(-5, 4242), "to -5 4242");
}

fn any_notice() -> impl proptest::strategy::Strategy<Value = Notice> {
    use proptest::prelude::*;
    let nonzero = any::<i64>().prop_filter("0 means none", |v| *v != 0);
    let release = (
        any::<i64>(),
        proptest::option::of(any::<i64>()),
        proptest::option::of(nonzero.clone()),
        proptest::option::of(nonzero),
    )
        // Without the release's moment, nothing follows the key.
        .prop_map(|(key, at, grantee, reserved)| ReleaseNotice {
            key,
            at,
            grantee: grantee.filter(|_| at.is_some()),
            reserved: reserved.filter(|_| at.is_some()),
        })
        .prop_map(Notice::Release);
    prop_oneof![
        release,
        any::<u32>().prop_map(Notice::Group),
        (any::<i64>(), any::<i64>()).prop_map(|(key, pid)| Notice::Request { key, pid }),
        (any::<i64>(), any::<i64>()).prop_map(|(key, pid)| Notice::Claim { key, pid }),
        (any::<i64>(), any::<i64>(), 0..=crate::options::MAX_PRIORITY)
            .prop_map(|(key, pid, priority)| Notice::Prefer(Preference { key, pid, priority })),
    ]
}

proptest::proptest! {
    #![proptest_config(crate::proptest_config())]

    /// Every notice is written as the payload that parses back to it.
    #[test]
    fn notices_round_trip(notice in any_notice()) {
        proptest::prop_assert_eq!(Notice::parse(&notice.to_string()), Some(notice));
    }

    /// No payload, however malformed, panics the parser; whatever parses
    /// writes back as a payload that parses the same.
    #[test]
    fn any_payload_parses_or_not(payload in "[-a-z0-9 ]{0,40}") {
        if let Some(notice) = Notice::parse(&payload) {
            proptest::prop_assert_eq!(Notice::parse(&notice.to_string()), Some(notice));
        }
    }
}

#[test]
fn decodes_ints_and_nulls() {
    assert_eq!(
        decode_text_row([Some("1"), None, Some("-9223372036854775808")]),
        Ok(vec![Some(1), None, Some(i64::MIN)])
    );
    assert_eq!(
        decode_text_row([Some("1"), Some("x")]),
        Err(DecodeError {
            column: 1,
            text: "x".into()
        })
    );
    assert!(decode_text_row([Some("9223372036854775808")]).is_err());
    assert_eq!(decode_text_row([]), Ok(vec![]));
}

#[test]
fn a_wait_starts_with_its_prelude_and_checks_the_client() {
    let sql = Statement::Wait {
        key: -5,
        timeout_ms: 0,
        crowd: Some(2),
        watch_of: None,
    }
    .sql();
    assert!(sql.starts_with(WAIT_PRELUDE_SQL), "{sql}");
    let check = format!("'client_connection_check_interval', '{WAIT_CONNECTION_CHECK_MS}'");
    assert!(WAIT_PRELUDE_SQL.contains(&check), "{WAIT_PRELUDE_SQL}");
    assert!(
        squash(&sql).contains(&squash(
            "set_config('lock_timeout', (SELECT (CASE WHEN l OPERATOR(pg_catalog.<) 1 THEN l ELSE 1 END)"
        )),
        "{sql}"
    );
    let deadlock_timeout = template::render("deadlock_timeout_ms", &[]);
    assert!(sql.contains(&deadlock_timeout), "{sql}");
    assert!(sql.contains("pg_advisory_xact_lock_shared(-5)"), "{sql}");
    assert!(sql.contains("EXCEPTION WHEN lock_not_available"), "{sql}");
    // The crowd check counts the key's waiters before it queues.
    assert!(sql.contains("NOT granted"), "{sql}");
    assert!(
        sql.contains("IF 2 OPERATOR(pg_catalog.<=) (SELECT"),
        "{sql}"
    );
    for (freed, crowded, held_here, token) in [
        (None, false, false, None),
        (Some(false), false, false, None),
        (Some(true), false, false, None),
        (Some(false), true, false, None),
        (Some(false), false, true, None),
        (Some(true), false, false, Some(TOKEN_CLOCK_OFFSET + 5)),
    ] {
        for deadlock_timeout_ms in [None, Some(1000)] {
            let reply = WaitReply {
                session: HeartbeatReply {
                    backend_pid: Some(7),
                    nonce: Some(9),
                    ..Default::default()
                },
                freed,
                crowded,
                deadlock_timeout_ms,
                token,
                held_here,
            };
            assert_eq!(WaitReply::parse(&reply.to_rows()), Ok(reply));
        }
    }
    let bad = vec![vec![Some(3), Some(4)]];
    assert!(WaitReply::parse(&bad).is_err());
}

#[test]
fn a_wait_stays_a_tenth_below_deadlock_timeout() {
    assert_eq!(wait_limit_ms(1000), 900);
    assert_eq!(wait_limit_ms(50), 40);
    assert_eq!(wait_limit_ms(10), 1);
    assert_eq!(wait_limit_ms(1), 1);
    assert_eq!(wait_limit_ms(2_147_483_647), 1_932_735_283);
}

#[test]
fn the_setup_reads_the_promotion_state() {
    let sql = Statement::Setup {
        nonce: 1,
        settings: vec![],
    }
    .sql();
    let (checkpoint, history) = (
        template::render("checkpoint", &[]),
        template::render("history", &[]),
    );
    assert!(
        sql.starts_with(&format!("{checkpoint}\n{history}\n")),
        "{sql}"
    );
    for tag in [
        setup_tag::REPLAYED_SINCE_START,
        setup_tag::WAL_TIMELINE,
        setup_tag::CHECKPOINT_TIMELINE,
        setup_tag::CHECKPOINT_AGE_MS,
        setup_tag::HISTORY_AGE_MS,
    ] {
        assert!(sql.contains(&format!("UNION ALL SELECT {tag}, ")), "{tag}");
    }
    assert!(checkpoint.contains(&format!("'{CHECKPOINT_SETTING}'")));
    assert!(history.contains(&format!("'{HISTORY_SETTING}'")));
    assert_eq!(
        sql.matches(&format!("'{CHECKPOINT_SETTING}'")).count(),
        3,
        "{sql}"
    );
    assert_eq!(
        sql.matches(&format!("'{HISTORY_SETTING}'")).count(),
        2,
        "{sql}"
    );
}

/// `sql` with every run of whitespace removed (for substrings that a
/// template may break over lines).
fn squash(sql: &str) -> String {
    sql.split_whitespace().collect()
}

/// The rendered-SQL golden file: every statement of [`every_statement`],
/// then the SQL constants, each as psql runs it.
fn golden() -> String {
    let mut out = String::from(
        "-- Every statement of lease-proto as sent, rendered from templates/*.sql by\n\
         -- the test every_statement_renders_as_the_golden_file (LEASE_BLESS=1 rewrites it).\n\n",
    );
    for s in every_statement() {
        writeln!(out, "-- {s:?}\n{};\n", s.sql()).ok();
    }
    for (name, sql) in [
        (
            "server::ADVISORY_KEY_SQL",
            format!("SELECT {ADVISORY_KEY_SQL} FROM pg_catalog.pg_locks"),
        ),
        ("server::PRIMARY_TIMELINE_SQL", PRIMARY_TIMELINE_SQL.into()),
        ("server::WAIT_PRELUDE_SQL", WAIT_PRELUDE_SQL.into()),
        (
            "inspect::holders_sql()",
            crate::inspect::holders_sql().into(),
        ),
        (
            "inspect::members_sql()",
            crate::inspect::members_sql().into(),
        ),
    ] {
        writeln!(out, "-- {name}\n{sql};\n").ok();
    }
    out
}

#[test]
fn every_statement_renders_as_the_golden_file() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/sql/templates/rendered.sql"
    );
    let golden = golden();
    if std::env::var("LEASE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(path, &golden).unwrap();
    }
    let file = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        file == golden,
        "{path} is not what the templates render (run with LEASE_BLESS=1 to rewrite it, and \
         review its diff):\n{golden}"
    );
}

#[test]
fn every_template_section_is_used_and_qualifies_every_name() {
    let sections = template::sections();
    let mut named = String::from(include_str!("render.rs"));
    named.push_str(include_str!("../inspect.rs"));
    named.push_str(include_str!("template.rs"));
    for text in sections.values() {
        named.push_str(text);
    }
    for (name, text) in sections {
        assert!(
            named.contains(&format!("\"{name}\"")) || named.contains(&format!("${{{name}}}")),
            "section {name} is never rendered"
        );
        // The scanner on the template itself, each `${…}` read as a number.
        let mut plain = String::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("${") {
            plain.push_str(&rest[..at]);
            plain.push('0');
            rest = &rest[at + rest[at..].find('}').unwrap() + 1..];
        }
        plain.push_str(rest);
        assert_eq!(
            unqualified_names(&plain),
            Vec::<String>::new(),
            "{name}: {text}"
        );
    }
    let mut seen = BTreeSet::new();
    for (file, text) in template::FILES {
        for line in text.lines() {
            if let Some(name) = line.trim_end().strip_prefix("-- @") {
                assert!(seen.insert(name), "section {name} twice ({file})");
            }
        }
    }
    for raw in [ADVISORY_KEY_SQL, PRIMARY_TIMELINE_SQL, WAIT_PRELUDE_SQL] {
        assert!(!raw.contains("--") && !raw.contains("${"), "{raw}");
    }
}

#[test]
fn key_arrays_render_negative_and_extreme_keys() {
    let sql = Statement::Release {
        keys: vec![i64::MIN, -1, 0, i64::MAX],
        notify: false,
        reserved: vec![],
    }
    .sql();
    assert!(sql.contains("'{-9223372036854775808,-1,0,9223372036854775807}'::pg_catalog.int8[]"));
}

#[test]
fn replies_round_trip() {
    let setup = SetupReply {
        server_version: 170_002,
        in_recovery: false,
        backend_pid: 42,
        idle_session_timeout_ms: Some(900),
        tcp_settings: [Some(1900), Some(2), Some(1), Some(10)],
        unix_socket: false,
        nonce: Some(-7),
        search_path_catalog: true,
        promotion: crate::reply::PromotionState {
            replayed_since_start: true,
            wal_timeline: Some(3),
            checkpoint_timeline: Some(2),
            checkpoint_age_ms: Some(-12),
            history_age_ms: Some(4_000),
        },
        server_clock_us: Some(1_700_000_000_000_000),
    };
    assert_eq!(SetupReply::parse(&setup.to_rows()), Ok(setup));
    let members = MembersReply {
        backend_pid: Some(42),
        nonce: Some(-7),
        members: [(7, 42), (u32::MAX, 43)].into(),
        holders: vec![(1, Some(43)), (2, None)],
    };
    assert_eq!(MembersReply::parse(&members.to_rows()), Ok(members));
    // The join and leave rows carry nothing the machine reads.
    let joined = vec![Some(members_tag::JOINED), Some(-1), Some(1)];
    let left = vec![Some(members_tag::LEFT), Some(9), Some(0)];
    assert_eq!(
        MembersReply::parse(&[joined, left]),
        Ok(MembersReply::default())
    );
    assert!(MembersReply::parse(&[vec![Some(members_tag::MEMBER), Some(-1), Some(1)]]).is_err());
    let try_reply = TryReply {
        won: vec![(1, 77)],
        not_won: vec![(2, Some(9)), (3, None)],
        untrusted: false,
        session: Some((42, Some(7))),
    };
    assert_eq!(TryReply::parse(&[1, 2, 3], &try_reply.to_rows()), try_reply);
    let heartbeat = HeartbeatReply {
        backend_pid: Some(42),
        nonce: Some(3),
        server_clock_us: Some(-1),
    };
    assert_eq!(
        HeartbeatReply::parse(&heartbeat.to_rows()),
        Ok(heartbeat.clone())
    );
    let verify = VerifyReply {
        session: heartbeat,
        held: [1, -5].into(),
    };
    assert_eq!(VerifyReply::parse(&verify.to_rows()), Ok(verify.clone()));
    // A held key is no part of a heartbeat's reply.
    assert!(HeartbeatReply::parse(&verify.to_rows()).is_err());
    let release = ReleaseReply {
        unlocked: vec![(1, true), (2, false)],
    };
    assert_eq!(ReleaseReply::parse(&release.to_rows()), Ok(release));
}

#[test]
fn try_reply_counts_one_answer_per_key_tried() {
    let rows = vec![
        vec![Some(1), Some(5), None],
        vec![Some(1), None, Some(3)], // second answer for 1
        vec![Some(4), Some(5), None], // not tried
        vec![Some(2)],                // malformed: 2 stays unanswered
    ];
    let r = TryReply::parse(&[1, 2], &rows);
    assert_eq!(r.won, vec![(1, 5)]);
    assert!(r.not_won.is_empty());
    assert!(r.untrusted);
    assert_eq!(r.unanswered(&[1, 2]), vec![2]);
}

#[test]
fn malformed_replies_are_errors() {
    assert_eq!(
        SetupReply::parse(&[vec![Some(1), Some(170_000)]]),
        Err(ReplyError::SetupIncomplete {
            missing: "in_recovery"
        })
    );
    assert!(HeartbeatReply::parse(&[vec![Some(3), Some(1)]]).is_err());
    assert!(VerifyReply::parse(&[vec![Some(3), Some(1)]]).is_err());
    assert!(ReleaseReply::parse(&[vec![Some(1), Some(2)]]).is_err());
}

#[test]
fn the_key_expression_is_shared() {
    assert!(Statement::Verify.sql().contains(ADVISORY_KEY_SQL));
    // The steady heartbeat reads no pg_locks: its cost does not grow
    // with the locks other sessions hold.
    assert!(!Statement::Heartbeat.sql().contains("pg_locks"));
    assert!(Statement::TryLock {
        keys: vec![1],
        backend_pid: 7,
        nonce: 9,
    }
    .sql()
    .contains(ADVISORY_KEY_SQL));
}
