//! The simulator's server model against a real server: generated sequences of decoded
//! statements over several sessions (setups, listens, tries, takes, waits, heartbeats,
//! verifies, releases, member reads, preferences, hand-over checks; connects, closes,
//! `pg_terminate_backend` of a session, a server restart) run on an ephemeral cluster and on
//! `lease_proto::sim::Postgres` (the model the simulator runs), step by step, and every
//! reply that matters is compared: the rows the machine reads, parsed by the production
//! parsers, errors with their SQLSTATE and message, who holds which key and which group
//! member lock (`pg_locks`), and which notifications reach which session, in which order.
//! What is compared and what is abstracted: docs/simulator.md, "The server model against
//! PostgreSQL".
//!
//! Each real session is a connection of its own, spoken to by the small simple-query client
//! below (one reader thread per connection), so that a statement that waits for a lock stays
//! in flight while the other sessions go on, and a session's replies, notifications and end
//! are read in the order the server sent them. After each step the real side waits until
//! every session has as many new events as the model gave it (or 5 s), then 10 ms more for
//! any the model did not give.
//!
//! `LEASE_DIFF_CASES` (default 24), `LEASE_DIFF_STEPS` (default 40) and `LEASE_DIFF_SEED`
//! (default 1) size the campaign; the server is the one of `LEASE_PG_BINDIR` (default: the
//! system's).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use lease_proto::reply::*;
use lease_proto::server::SEARCH_PATH;
use lease_proto::sim::{ConnId, Postgres, ServerConfig, ServerOutput};
use lease_proto::{QueryId, Statement};
use lease_tests::scenario::Admin;
use lease_tests::{Cluster, KitError};

/// Sessions of a case.
const SESSIONS: usize = 3;
/// The lease keys the statements use.
const KEYS: [i64; 2] = [0x0101_0000_0000_0007, -0x0202_0000_0000_0009];
/// The lease group the member reads use.
const GROUP: u32 = 7;
/// A session's backend pid in a generated statement: resolved on each side to the pid of
/// that session's current backend (or [`ABSENT`] when it has none).
const PLACEHOLDER: i64 = 1_900_000_000;
/// A backend pid no session has (above every pid of a real server here).
const ABSENT: i64 = 4_190_000;
/// The server's `deadlock_timeout` on both sides: a long wait's lock timeout (cut below it)
/// never fires within a case.
const DEADLOCK_TIMEOUT: Duration = Duration::from_secs(60);
/// A short wait's `lock_timeout` (ms): it fires within its step on both sides.
const SHORT_MS: u64 = 1;
/// A long wait's `lock_timeout` (ms).
const LONG_MS: u64 = 50_000;
/// The model's time per step (virtual), and when in a step its deadlines are run.
const STEP: Duration = Duration::from_millis(100);
const STEP_TIMERS: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------
// A minimal simple-query client: what the server sends, in its order.

#[derive(Debug, Clone, PartialEq)]
struct PgError {
    severity: String,
    code: String,
    message: String,
}

#[derive(Debug, Clone)]
enum Wire {
    Reply(Result<Vec<Vec<Option<String>>>, PgError>),
    Notify { pid: i64, payload: String },
    Ended(Option<PgError>),
}

#[derive(Default)]
struct WireState {
    events: Vec<Wire>,
    /// A query was sent and its ReadyForQuery has not come.
    pending: bool,
    rows: Vec<Vec<Option<String>>>,
    error: Option<PgError>,
    /// Where the pending query's reply goes in `events`: after its last CommandComplete
    /// or error (notifications sent before its ReadyForQuery come after it).
    reply_at: Option<usize>,
    fatal: Option<PgError>,
}

type Shared = Arc<(Mutex<WireState>, Condvar)>;

struct RawConn {
    stream: TcpStream,
    pid: i64,
    shared: Shared,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Events already taken.
    taken: usize,
}

fn read_msg(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut body = vec![0u8; len.saturating_sub(4)];
    r.read_exact(&mut body)?;
    Ok((head[0], body))
}

fn cstr(body: &[u8], at: &mut usize) -> String {
    let end = (body[*at..].iter().position(|b| *b == 0)).map_or(body.len(), |p| *at + p);
    let s = String::from_utf8_lossy(&body[*at..end]).into_owned();
    *at = (end + 1).min(body.len());
    s
}

fn parse_error(body: &[u8]) -> PgError {
    let (mut e, mut at, mut localized) = (
        PgError {
            severity: String::new(),
            code: String::new(),
            message: String::new(),
        },
        0,
        String::new(),
    );
    while at < body.len() && body[at] != 0 {
        let field = body[at];
        at += 1;
        let value = cstr(body, &mut at);
        match field {
            b'V' => e.severity = value,
            b'S' => localized = value,
            b'C' => e.code = value,
            b'M' => e.message = value,
            _ => {}
        }
    }
    if e.severity.is_empty() {
        e.severity = localized;
    }
    e
}

fn parse_row(body: &[u8]) -> Vec<Option<String>> {
    let n = u16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    let mut row = Vec::with_capacity(n);
    for _ in 0..n {
        let len = i32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        at += 4;
        if len < 0 {
            row.push(None);
        } else {
            let len = len as usize;
            row.push(Some(
                String::from_utf8_lossy(&body[at..at + len]).into_owned(),
            ));
            at += len;
        }
    }
    row
}

fn reader(mut r: TcpStream, shared: Shared) {
    loop {
        let msg = read_msg(&mut r);
        let (lock, cv) = &*shared;
        let mut st = lock.lock().expect("wire state");
        let Ok((kind, body)) = msg else {
            let fatal = st.fatal.take();
            st.events.push(Wire::Ended(fatal));
            cv.notify_all();
            return;
        };
        match kind {
            b'D' => st.rows.push(parse_row(&body)),
            b'C' | b'I' => st.reply_at = Some(st.events.len()),
            b'E' => {
                let e = parse_error(&body);
                if e.severity == "FATAL" || e.severity == "PANIC" {
                    if st.pending {
                        st.pending = false;
                        st.rows.clear();
                        st.events.push(Wire::Reply(Err(e.clone())));
                    }
                    st.fatal = Some(e);
                } else {
                    st.reply_at = Some(st.events.len());
                    st.error = Some(e);
                }
            }
            b'A' => {
                let pid = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                let mut at = 4;
                let _channel = cstr(&body, &mut at);
                let payload = cstr(&body, &mut at);
                st.events.push(Wire::Notify {
                    pid: pid.into(),
                    payload,
                });
            }
            b'Z' if st.pending => {
                let rows = std::mem::take(&mut st.rows);
                let result = match st.error.take() {
                    Some(e) => Err(e),
                    None => Ok(rows),
                };
                let at = st.reply_at.take().unwrap_or(st.events.len());
                st.events.insert(at, Wire::Reply(result));
                st.pending = false;
            }
            _ => {}
        }
        cv.notify_all();
    }
}

impl RawConn {
    fn connect(port: u16) -> Result<RawConn, KitError> {
        let io = |what: &'static str| {
            move |e: std::io::Error| KitError::Failed {
                context: what.into(),
                detail: e.to_string(),
            }
        };
        let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(io("connect"))?;
        stream.set_nodelay(true).map_err(io("nodelay"))?;
        let mut body = 196_608u32.to_be_bytes().to_vec();
        for (k, v) in [
            ("user", "postgres"),
            ("database", "postgres"),
            ("application_name", "lease-server-model"),
        ] {
            body.extend(k.as_bytes());
            body.push(0);
            body.extend(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut msg = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        msg.extend(body);
        stream.write_all(&msg).map_err(io("startup"))?;
        let mut pid = 0;
        loop {
            let (kind, body) = read_msg(&mut stream).map_err(io("startup reply"))?;
            match kind {
                b'R' if body[..4] != [0, 0, 0, 0] => {
                    return Err(KitError::Invalid("authentication asked".into()))
                }
                b'K' => pid = i32::from_be_bytes([body[0], body[1], body[2], body[3]]).into(),
                b'E' => return Err(KitError::Invalid(format!("{:?}", parse_error(&body)))),
                b'Z' => break,
                _ => {}
            }
        }
        let shared: Shared = Arc::default();
        let r = stream.try_clone().map_err(io("clone"))?;
        let s = shared.clone();
        let reader = std::thread::spawn(move || reader(r, s));
        Ok(RawConn {
            stream,
            pid,
            shared,
            reader: Some(reader),
            taken: 0,
        })
    }

    fn send(&mut self, sql: &str) {
        {
            let mut st = self.shared.0.lock().expect("wire state");
            st.pending = true;
            st.rows.clear();
            st.error = None;
            st.reply_at = None;
        }
        let mut msg = vec![b'Q'];
        msg.extend(((sql.len() + 5) as u32).to_be_bytes());
        msg.extend(sql.as_bytes());
        msg.push(0);
        // A write to a session the server ended fails: its end is read meanwhile.
        let _ = self.stream.write_all(&msg);
    }

    /// Waits until `n` events in all have come, or until `deadline`.
    fn wait_for(&self, n: usize, deadline: Instant) {
        let (lock, cv) = &*self.shared;
        let mut st = lock.lock().expect("wire state");
        while st.events.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            st = cv.wait_timeout(st, left).expect("wire state").0;
        }
    }

    fn take(&mut self) -> Vec<Wire> {
        let st = self.shared.0.lock().expect("wire state");
        let new = st.events[self.taken..].to_vec();
        self.taken = st.events.len();
        new
    }
}

impl Drop for RawConn {
    fn drop(&mut self) {
        let _ = self.stream.write_all(&[b'X', 0, 0, 0, 4]);
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

// ---------------------------------------------------------------------------------------
// The generator.

/// SplitMix64: a seeded generator, the same sequence on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    fn keys(&mut self) -> Vec<i64> {
        match self.below(4) {
            0 => vec![KEYS[0]],
            1 => vec![KEYS[1]],
            2 => vec![KEYS[0], KEYS[1]],
            _ => vec![KEYS[1], KEYS[0]],
        }
    }
}

#[derive(Debug, Clone)]
enum Action {
    Connect(usize),
    /// A statement on an idle session, its pids as placeholders.
    Query(usize, Statement),
    Terminate(usize),
    Close(usize),
    Restart,
}

/// What the generator knows of a session (from the model's events).
#[derive(Debug, Clone, Default)]
struct Gen {
    /// The connection's number in the case, while connected.
    conn: Option<usize>,
    setup: bool,
    listening: bool,
    in_flight: bool,
}

fn nonce_of(conn: usize) -> i64 {
    1000 + conn as i64
}

/// The next action; `held`: the keys each session holds now (the model's, equal to the
/// server's so far), so that takes and waits mostly queue behind another session and
/// releases mostly free a key.
fn generate(rng: &mut Rng, sessions: &[Gen], held: &[Vec<i64>], restart: bool) -> Action {
    if restart {
        return Action::Restart;
    }
    let connected: Vec<usize> = (0..SESSIONS)
        .filter(|i| sessions[*i].conn.is_some())
        .collect();
    let idle: Vec<usize> = (connected.iter().copied())
        .filter(|i| !sessions[*i].in_flight)
        .collect();
    let down: Vec<usize> = (0..SESSIONS)
        .filter(|i| sessions[*i].conn.is_none())
        .collect();
    if !down.is_empty() && (idle.is_empty() || rng.chance(30)) {
        return Action::Connect(rng.pick(&down));
    }
    let r = rng.below(100);
    if (r < 5 || idle.is_empty()) && !connected.is_empty() {
        return Action::Terminate(rng.pick(&connected));
    }
    if r < 8 && !connected.is_empty() {
        return Action::Close(rng.pick(&connected));
    }
    let i = rng.pick(&idle);
    let s = &sessions[i];
    let conn = s.conn.expect("connected");
    let me = PLACEHOLDER + i as i64;
    let anyone = |rng: &mut Rng| match rng.below(10) {
        0 => ABSENT,
        _ => PLACEHOLDER + rng.below(SESSIONS) as i64,
    };
    // Mostly this session's own pid and nonce; sometimes another's.
    let pid = |rng: &mut Rng| if rng.chance(90) { me } else { anyone(rng) };
    let nonce = |rng: &mut Rng| nonce_of(conn) + i64::from(!rng.chance(90));
    let timeout = |rng: &mut Rng| if rng.chance(30) { SHORT_MS } else { LONG_MS };
    let crowd = |rng: &mut Rng| rng.pick(&[None, None, Some(1), Some(2)]);
    let others: Vec<i64> = (0..SESSIONS)
        .filter(|j| *j != i)
        .flat_map(|j| held[j].iter().copied())
        .collect();
    // Mostly a key another session holds.
    let contended = |rng: &mut Rng| {
        if !others.is_empty() && rng.chance(75) {
            rng.pick(&others)
        } else {
            rng.pick(&KEYS)
        }
    };
    if !s.setup {
        let mut settings = vec![("search_path", SEARCH_PATH.to_string())];
        if rng.chance(30) {
            settings.push(("idle_session_timeout", "0".into()));
        }
        return Action::Query(
            i,
            Statement::Setup {
                nonce: nonce_of(conn),
                settings,
            },
        );
    }
    if !s.listening && rng.chance(25) {
        return Action::Query(i, Statement::Listen);
    }
    let statement = match rng.below(20) {
        0..=2 => Statement::TryLock {
            keys: rng.keys(),
            backend_pid: pid(rng),
            nonce: nonce(rng),
        },
        3..=6 => Statement::Take {
            key: contended(rng),
            timeout_ms: timeout(rng),
            crowd: crowd(rng),
            backend_pid: pid(rng),
            nonce: nonce(rng),
        },
        7..=9 => Statement::Wait {
            key: contended(rng),
            timeout_ms: timeout(rng),
            crowd: crowd(rng),
            watch_of: rng.chance(30).then(|| anyone(rng)),
        },
        10 => Statement::Heartbeat,
        11 => Statement::Verify,
        12..=14 => {
            // Mostly the keys this session holds.
            let keys = if !held[i].is_empty() && rng.chance(75) {
                held[i].clone()
            } else {
                rng.keys()
            };
            let notify = rng.chance(70);
            let reserved = if notify && rng.chance(40) {
                vec![(keys[0], anyone(rng), rng.below(2) as i64)]
            } else {
                vec![]
            };
            Statement::Release {
                keys,
                notify,
                reserved,
            }
        }
        15..=16 => {
            let notify = rng.chance(60);
            Statement::Members {
                join: if rng.chance(60) { vec![GROUP] } else { vec![] },
                leave: if rng.chance(15) { vec![GROUP] } else { vec![] },
                groups: vec![GROUP],
                keys: rng.keys(),
                notify,
                announce: if rng.chance(30) { vec![GROUP] } else { vec![] },
                claims: if rng.chance(30) {
                    vec![rng.pick(&KEYS)]
                } else {
                    vec![]
                },
            }
        }
        17 => Statement::Prefer {
            key: rng.pick(&KEYS),
            priority: rng.below(3) as u32 + 1,
        },
        _ => {
            let mut asks = vec![(rng.pick(&KEYS), anyone(rng))];
            if rng.chance(50) {
                asks.push((rng.pick(&KEYS), anyone(rng)));
            }
            Statement::CheckHandover { asks }
        }
    };
    Action::Query(i, statement)
}

/// `statement` with each placeholder pid replaced by `pid_of` that session.
fn resolve(statement: &Statement, pid_of: &dyn Fn(usize) -> Option<i64>) -> Statement {
    let pid = |p: i64| {
        if p >= PLACEHOLDER {
            let i = (p - PLACEHOLDER) as usize;
            pid_of(i).unwrap_or(ABSENT + 1 + i as i64)
        } else {
            p
        }
    };
    let mut s = statement.clone();
    match &mut s {
        Statement::TryLock { backend_pid, .. } | Statement::Take { backend_pid, .. } => {
            *backend_pid = pid(*backend_pid)
        }
        Statement::Wait { watch_of, .. } => *watch_of = watch_of.map(pid),
        Statement::CheckHandover { asks } => {
            for (_, p) in asks {
                *p = pid(*p);
            }
        }
        Statement::Release { reserved, .. } => {
            for (_, p, _) in reserved {
                *p = pid(*p);
            }
        }
        _ => {}
    }
    s
}

// ---------------------------------------------------------------------------------------
// Normalized events: what is compared.

/// Names backend pids by connection (`c3`: the case's third connection), keys by index.
#[derive(Default)]
struct Names {
    pids: BTreeMap<i64, usize>,
}

impl Names {
    fn pid(&self, pid: i64) -> String {
        match self.pids.get(&pid) {
            Some(c) => format!("c{c}"),
            None if pid > ABSENT && pid <= ABSENT + SESSIONS as i64 => "none".into(),
            None if pid == ABSENT => "absent".into(),
            None => "other".into(),
        }
    }
    fn opid(&self, pid: Option<i64>) -> String {
        pid.map_or("-".into(), |p| self.pid(p))
    }
}

fn key_name(key: i64) -> String {
    match KEYS.iter().position(|k| *k == key) {
        Some(i) => format!("k{i}"),
        None => format!("key {key}"),
    }
}

fn session(names: &Names, s: &HeartbeatReply) -> String {
    format!(
        "pid {} nonce {:?} clock {}",
        names.opid(s.backend_pid),
        s.nonce,
        s.server_clock_us.is_some()
    )
}

/// A reply as the machine reads it, its pids named, its clock readings and ages reduced to
/// whether they are there.
fn norm_reply(statement: &Statement, result: Result<Vec<Row>, PgError>, names: &Names) -> String {
    let rows = match result {
        Err(e) => return format!("error {} {}: {}", e.severity, e.code, e.message),
        Ok(rows) => rows,
    };
    let bad = |e: ReplyError| format!("unparsable ({e}): {rows:?}");
    match statement {
        Statement::Setup { .. } => match SetupReply::parse(&rows) {
            Err(e) => bad(e),
            Ok(r) => {
                let p = &r.promotion;
                format!(
                    "setup version {} recovery {} pid {} idle {:?} tcp {:?} unix {} \
                     search_path {} nonce {:?} promotion (replayed {} wal {:?} checkpoint {:?} \
                     age {} history {}) clock {}",
                    r.server_version,
                    r.in_recovery,
                    names.pid(r.backend_pid),
                    r.idle_session_timeout_ms,
                    r.tcp_settings,
                    r.unix_socket,
                    r.search_path_catalog,
                    r.nonce,
                    p.replayed_since_start,
                    p.wal_timeline,
                    p.checkpoint_timeline,
                    p.checkpoint_age_ms.is_some(),
                    p.history_age_ms.is_some(),
                    r.server_clock_us.is_some(),
                )
            }
        },
        Statement::Listen if rows.is_empty() => "listening".into(),
        Statement::Listen => format!("listen rows {rows:?}"),
        Statement::TryLock { keys, .. } => {
            let r = TryReply::parse(keys, &rows);
            // In key order: the server's follows its plan, the machine reads them by key.
            let mut won: Vec<String> = (r.won.iter())
                .map(|(k, t)| format!("{} token {}", key_name(*k), *t > 0))
                .collect();
            let mut lost: Vec<String> = (r.not_won.iter())
                .map(|(k, h)| format!("{} held by {}", key_name(*k), names.opid(*h)))
                .collect();
            won.sort();
            lost.sort();
            format!(
                "try won {won:?} not won {lost:?} untrusted {} session {:?}",
                r.untrusted,
                r.session.map(|(p, n)| (names.pid(p), n))
            )
        }
        Statement::Heartbeat | Statement::Prefer { .. } => match HeartbeatReply::parse(&rows) {
            Err(e) => bad(e),
            Ok(r) => format!("heartbeat {}", session(names, &r)),
        },
        Statement::Verify => match VerifyReply::parse(&rows) {
            Err(e) => bad(e),
            Ok(r) => {
                let held: Vec<String> = r.held.iter().map(|k| key_name(*k)).collect();
                format!("verify {} held {held:?}", session(names, &r.session))
            }
        },
        Statement::Wait { .. } | Statement::Take { .. } => match WaitReply::parse(&rows) {
            Err(e) => bad(e),
            Ok(r) => format!(
                "wait {} freed {:?} crowded {} deadlock_timeout {:?} token {} held_here {}",
                session(names, &r.session),
                r.freed,
                r.crowded,
                r.deadlock_timeout_ms,
                r.token.is_some_and(|t| t > 0),
                r.held_here
            ),
        },
        Statement::Members { .. } => match MembersReply::parse(&rows) {
            Err(e) => bad(e),
            Ok(r) => {
                let mut members: Vec<String> = (r.members.iter())
                    .map(|(g, p)| format!("{g}:{}", names.pid(*p)))
                    .collect();
                members.sort();
                // In key order, as a try's (the machine reads them by key).
                let mut holders: Vec<String> = (r.holders.iter())
                    .map(|(k, h)| format!("{} by {}", key_name(*k), names.opid(*h)))
                    .collect();
                holders.sort();
                format!(
                    "members pid {} nonce {:?} members {members:?} holders {holders:?}",
                    names.opid(r.backend_pid),
                    r.nonce
                )
            }
        },
        Statement::CheckHandover { .. } => match CheckReply::parse(&rows) {
            Err(e) => bad(e),
            Ok(r) => {
                let waiting: Vec<String> = (r.waiting.iter())
                    .map(|(i, p)| format!("{i}:{}", names.pid(*p)))
                    .collect();
                format!("check {} waiting {waiting:?}", session(names, &r.session))
            }
        },
        Statement::Release { .. } => match ReleaseReply::parse(&rows) {
            Err(e) => bad(e),
            Ok(r) => {
                let unlocked: Vec<String> = (r.unlocked.iter())
                    .map(|(k, held)| format!("{} {held}", key_name(*k)))
                    .collect();
                format!("release {unlocked:?}")
            }
        },
    }
}

/// A notification's payload with its pids named and a release's moment reduced to `T`.
fn norm_payload(payload: &str, names: &Names) -> String {
    let words: Vec<&str> = payload.split(' ').collect();
    let pid = |w: &str| w.parse().map_or(format!("'{w}'"), |p| names.pid(p));
    let key = |w: &str| w.parse().map_or(format!("'{w}'"), key_name);
    match words.as_slice() {
        ["to", k, p] => format!("to {} {}", key(k), pid(p)),
        ["prefer", k, p, prio] => format!("prefer {} {} {prio}", key(k), pid(p)),
        ["claim", k, p] => format!("claim {} {}", key(k), pid(p)),
        ["group", g] => format!("group {g}"),
        [k, at, rest @ ..] if k.parse::<i64>().is_ok() && at.parse::<i64>().is_ok() => {
            let rest: Vec<String> = rest.iter().map(|p| pid(p)).collect();
            format!("released {} T {}", key(k), rest.join(" "))
                .trim_end()
                .to_string()
        }
        _ => format!("payload {payload:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// The two sides.

/// The events of one step, per session, in the order each session read them.
type Step = BTreeMap<usize, Vec<String>>;

struct Model {
    pg: Postgres,
    now: Duration,
    conns: [Option<(ConnId, usize)>; SESSIONS],
    pending: [Option<Statement>; SESSIONS],
    names: Names,
    next_query: u64,
}

impl Model {
    fn new(version: i64) -> Model {
        let config = ServerConfig {
            version,
            deadlock_timeout: DEADLOCK_TIMEOUT,
            ..ServerConfig::default()
        };
        Model {
            pg: Postgres::new(config),
            now: Duration::ZERO,
            conns: [None; SESSIONS],
            pending: Default::default(),
            names: Names::default(),
            next_query: 0,
        }
    }

    fn pid_of(&self, i: usize) -> Option<i64> {
        let (c, _) = self.conns[i]?;
        self.pg.backend_pid(c)
    }

    fn act(&mut self, action: &Action, conn_no: usize) -> Step {
        let now = self.now;
        let mut step = Step::new();
        match action {
            Action::Connect(i) => match self.pg.connect(now, conn_no, &[]) {
                Ok(c) => {
                    self.conns[*i] = Some((c, conn_no));
                    let pid = self.pg.backend_pid(c).expect("connected");
                    self.names.pids.insert(pid, conn_no);
                }
                Err(e) => step.entry(*i).or_default().push(format!("refused {e:?}")),
            },
            Action::Query(i, template) => {
                let statement = resolve(template, &|j| self.pid_of(j));
                let (c, _) = self.conns[*i].expect("connected");
                self.next_query += 1;
                self.pending[*i] = Some(statement.clone());
                self.pg.query(now, c, QueryId(self.next_query), &statement);
            }
            Action::Terminate(i) => {
                let (_, client) = self.conns[*i].expect("connected");
                self.pg.terminate(now, client);
            }
            Action::Close(i) => {
                let (c, _) = self.conns[*i].take().expect("connected");
                self.pending[*i] = None;
                self.pg.close(now, c);
            }
            Action::Restart => self.pg.restart(now, Duration::from_millis(1)),
        }
        self.pg.handle_timeout(now + STEP_TIMERS);
        self.now += STEP;
        while let Some(out) = self.pg.poll_output() {
            let conn = match &out {
                ServerOutput::Reply { conn, .. }
                | ServerOutput::Notify { conn, .. }
                | ServerOutput::Ended { conn, .. } => *conn,
                ServerOutput::Granted { .. } => continue,
            };
            let Some(i) = (0..SESSIONS).find(|i| self.conns[*i].is_some_and(|(c, _)| c == conn))
            else {
                continue;
            };
            let events = step.entry(i).or_default();
            match out {
                ServerOutput::Reply { result, .. } => {
                    let statement = self.pending[i].take().expect("a statement in flight");
                    let result = result.map_err(|e| PgError {
                        severity: "ERROR".into(),
                        code: e.code.unwrap_or_default(),
                        message: e.message,
                    });
                    events.push(norm_reply(&statement, result, &self.names));
                }
                ServerOutput::Notify {
                    payload,
                    sender_pid,
                    ..
                } => events.push(format!(
                    "notify {} from {}",
                    norm_payload(&payload, &self.names),
                    self.names.pid(sender_pid)
                )),
                ServerOutput::Ended { error, .. } => {
                    let code = error.code.unwrap_or_default();
                    // The statement in flight, if any, is answered with the FATAL error
                    // first (the model's `Ended` stands for both).
                    if self.pending[i].take().is_some() {
                        events.push(format!("error FATAL {code}: {}", error.message));
                    }
                    events.push(format!("ended FATAL {code}: {}", error.message));
                    self.conns[i] = None;
                }
                ServerOutput::Granted { .. } => {}
            }
        }
        step
    }

    /// The keys session `i` holds.
    fn held_by(&self, i: usize) -> Vec<i64> {
        let Some((c, _)) = self.conns[i] else {
            return Vec::new();
        };
        (self.pg.holders().into_iter())
            .filter(|(_, h)| *h == c)
            .map(|(k, _)| k)
            .collect()
    }

    /// Who holds which key and which member lock.
    fn holders(&self) -> Vec<String> {
        let conn_pid = |c: ConnId| self.names.opid(self.pg.backend_pid(c));
        let mut held: Vec<String> = (self.pg.holders().into_iter())
            .map(|(k, c)| format!("{} by {}", key_name(k), conn_pid(c)))
            .chain(
                (self.pg.members().into_iter())
                    .map(|(g, c)| format!("member {g}:{} by {}", conn_pid(c), conn_pid(c))),
            )
            .collect();
        held.sort();
        held
    }
}

struct Real<'a> {
    cluster: &'a mut Cluster,
    admin: Admin,
    conns: [Option<RawConn>; SESSIONS],
    pending: [Option<Statement>; SESSIONS],
    names: Names,
}

impl Real<'_> {
    fn pid_of(&self, i: usize) -> Option<i64> {
        self.conns[i].as_ref().map(|c| c.pid)
    }

    /// Runs `action`; `expect`: the model's events of the step; `queued`: the sessions
    /// whose statement the model has queued on a lock after it.
    fn act(
        &mut self,
        action: &Action,
        conn_no: usize,
        expect: &Step,
        queued: &[usize],
    ) -> Result<Step, KitError> {
        let mut step = Step::new();
        match action {
            Action::Connect(i) => match RawConn::connect(self.cluster.port()) {
                Ok(c) => {
                    self.names.pids.insert(c.pid, conn_no);
                    self.conns[*i] = Some(c);
                }
                Err(e) => step.entry(*i).or_default().push(format!("refused {e}")),
            },
            Action::Query(i, template) => {
                let statement = resolve(template, &|j| self.pid_of(j));
                self.pending[*i] = Some(statement.clone());
                let c = self.conns[*i].as_mut().expect("connected");
                c.send(&statement.sql());
            }
            Action::Terminate(i) => {
                let pid = self.conns[*i].as_ref().expect("connected").pid;
                self.admin
                    .rows(&format!("SELECT pg_catalog.pg_terminate_backend({pid})"))?;
            }
            Action::Close(i) => {
                let c = self.conns[*i].take().expect("connected");
                let pid = c.pid;
                drop(c);
                self.pending[*i] = None;
                // A backend blocked in a wait notices its client's close only at its next
                // connection check (`WAIT_CONNECTION_CHECK_MS`); the model ends it at once.
                let gone = format!(
                    "SELECT count(*)::int8 FROM pg_catalog.pg_stat_activity WHERE pid = {pid}"
                );
                let deadline = Instant::now() + Duration::from_secs(2);
                while self.admin.ints(&gone)? != [0] && Instant::now() < deadline {
                    std::thread::sleep(MS(5));
                }
            }
            Action::Restart => {
                self.cluster.restart()?;
                self.admin = Admin::connect(&self.cluster.conn_string())?;
            }
        }
        // Every event the model gave, then any it did not give.
        let deadline = Instant::now() + Duration::from_secs(5);
        for (i, c) in self.conns.iter().enumerate() {
            if let Some(c) = c {
                let n = expect.get(&i).map_or(0, Vec::len);
                c.wait_for(c.taken + n, deadline);
            }
        }
        std::thread::sleep(MS(10));
        for i in 0..SESSIONS {
            let Some(c) = self.conns[i].as_mut() else {
                continue;
            };
            let mut ended = false;
            for wire in c.take() {
                let events = step.entry(i).or_default();
                match wire {
                    Wire::Reply(result) => {
                        let Some(statement) = self.pending[i].take() else {
                            events.push(format!("a reply to nothing: {result:?}"));
                            continue;
                        };
                        let rows = result.map(|rows| {
                            (rows.iter())
                                .map(|r| {
                                    decode_text_row(r.iter().map(|c| c.as_deref()))
                                        .unwrap_or_else(|e| panic!("undecodable {r:?}: {e}"))
                                })
                                .collect::<Vec<_>>()
                        });
                        events.push(norm_reply(&statement, rows, &self.names));
                    }
                    Wire::Notify { pid, payload } => events.push(format!(
                        "notify {} from {}",
                        norm_payload(&payload, &self.names),
                        self.names.pid(pid)
                    )),
                    Wire::Ended(e) => {
                        ended = true;
                        events.push(match e {
                            Some(e) => format!("ended {} {}: {}", e.severity, e.code, e.message),
                            None => "ended without an error".into(),
                        });
                    }
                }
            }
            if ended {
                self.conns[i] = None;
                self.pending[i] = None;
            }
        }
        step.retain(|_, v| !v.is_empty());
        // A statement the model queued is queued on the server before the next step: its
        // backend may still be on its way to the lock (a busy machine), and the order in
        // which waiters queue decides who is granted a freed key.
        let deadline = Instant::now() + Duration::from_secs(2);
        for &i in queued {
            let Some(pid) = self.pid_of(i) else {
                continue;
            };
            let waits = format!(
                "SELECT count(*)::int8 FROM pg_catalog.pg_locks WHERE NOT granted AND pid = {pid}"
            );
            while self.admin.ints(&waits)? == [0] && Instant::now() < deadline {
                std::thread::sleep(MS(2));
            }
        }
        Ok(step)
    }

    fn holders(&self) -> Result<Vec<String>, KitError> {
        let rows = self.admin.rows(
            "SELECT objsubid::int8, classid::int8, objid::int8, pid::int8 \
             FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_catalog.pg_database \
             WHERE datname = pg_catalog.current_database())",
        )?;
        let int = |c: &Option<String>| c.as_deref().and_then(|s| s.parse::<i64>().ok());
        let mut held: Vec<String> = (rows.iter())
            .map(|r| {
                let (sub, class, obj, pid) = (int(&r[0]), int(&r[1]), int(&r[2]), int(&r[3]));
                let (class, obj, pid) = (class.unwrap_or(0), obj.unwrap_or(0), pid.unwrap_or(0));
                if sub == Some(1) {
                    let key = (class << 32) | obj;
                    format!("{} by {}", key_name(key), self.names.pid(pid))
                } else {
                    let by = self.names.pid(pid);
                    format!("member {class}:{} by {by}", self.names.pid(obj))
                }
            })
            .collect();
        held.sort();
        Ok(held)
    }

    /// [`Real::holders`] once it reads `want` (a backend's locks go when it has exited), or
    /// after 2 s.
    fn holders_like(&self, want: &[String]) -> Result<Vec<String>, KitError> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let held = self.holders()?;
            if held == want || Instant::now() > deadline {
                return Ok(held);
            }
            std::thread::sleep(MS(5));
        }
    }
}

// ---------------------------------------------------------------------------------------
// The campaign.

#[derive(Default)]
struct Figures {
    cases: usize,
    steps: usize,
    statements: usize,
    /// Statements still in flight after their step (a wait or take queued on a lock).
    blocked: usize,
    notifications: usize,
    terminates: usize,
    closes: usize,
    restarts: usize,
    /// Waits answered during a shutdown (see `shutdown_race`).
    raced: usize,
    /// Release notifications whose grantee raced (see `grantee_race`).
    grantee_races: usize,
    differences: Vec<String>,
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The keys of a notifying release whose first queued take has a wait queued before it
/// (`queue`: the statements in flight on the server, in the order they queued). The take is
/// granted once the waits' transactions end, microseconds after the unlock, and the release
/// reads `pg_locks` about then: its notification names the take's backend or no one, either
/// way on a real server (both seen on 15 and 18). The model names it; the grantee of such a
/// key's notification is not compared.
fn grantee_race(action: &Action, queue: &[(usize, Statement)]) -> Vec<i64> {
    let Action::Query(
        _,
        Statement::Release {
            keys, notify: true, ..
        },
    ) = action
    else {
        return Vec::new();
    };
    let racy = |k: i64| {
        let on_k = queue.iter().filter_map(|(_, s)| match s {
            Statement::Take { key, .. } if *key == k => Some(true),
            Statement::Wait { key, .. } if *key == k => Some(false),
            _ => None,
        });
        let kinds: Vec<bool> = on_k.collect();
        let first_take = kinds.iter().position(|take| *take);
        first_take.is_some_and(|i| i > 0)
    };
    keys.iter().copied().filter(|k| racy(*k)).collect()
}

/// `step` with the grantee of the notifications releasing `keys` replaced by `?`.
fn without_grantee(step: &Step, keys: &[i64]) -> Step {
    let mut step = step.clone();
    for events in step.values_mut() {
        for e in events.iter_mut() {
            for k in keys {
                let head = format!("notify released {} T", key_name(*k));
                let Some(rest) = e.strip_prefix(&head) else {
                    continue;
                };
                let Some((names, sender)) = rest.split_once(" from ") else {
                    continue;
                };
                let words: Vec<&str> = names.split_whitespace().collect();
                let to = if words.len() == 2 { words[1] } else { "" };
                *e = format!("{head} ? {to} from {sender}");
            }
        }
    }
    step
}

/// A shutdown signals every backend; a waiter that another backend's exit frees may be
/// granted its lock before its own signal has come (a busy machine), and then answers before
/// it ends. The model answers none (PostgreSQL signals them together, and one granted with
/// the signal pending ends first): such a reply is taken for the FATAL the model sends. The
/// number taken.
fn shutdown_race(model: &Step, real: &mut Step) -> usize {
    let mut raced = 0;
    for (i, events) in real.iter_mut() {
        let Some(want) = model.get(i) else {
            continue;
        };
        if let ([fatal, end], [reply, real_end]) = (want.as_slice(), events.as_mut_slice()) {
            if fatal.starts_with("error FATAL") && reply.starts_with("wait ") && end == real_end {
                *reply = fatal.clone();
                raced += 1;
            }
        }
    }
    raced
}

fn run_case(
    real: &mut Real,
    version: i64,
    seed: u64,
    steps: usize,
    figures: &mut Figures,
) -> Result<(), KitError> {
    let mut rng = Rng(seed);
    let mut model = Model::new(version);
    real.names = Names::default();
    real.pending = Default::default();
    let mut gens: [Gen; SESSIONS] = Default::default();
    // A server restart in every fourth case, somewhere in its middle half.
    let restart_at = (seed % 4 == 0).then(|| steps / 4 + rng.below(steps / 2 + 1));
    let mut conn_no = 0;
    let mut history = Vec::new();
    // The step at which each session's statement in flight was sent (its place in a queue).
    let mut sent: [Option<usize>; SESSIONS] = [None; SESSIONS];
    for n in 0..steps {
        let held: Vec<Vec<i64>> = (0..SESSIONS).map(|i| model.held_by(i)).collect();
        let action = generate(&mut rng, &gens, &held, restart_at == Some(n));
        if let Action::Connect(_) = action {
            conn_no += 1;
        }
        let queue: Vec<(usize, Statement)> = (0..SESSIONS)
            .filter_map(|i| Some((sent[i]?, model.pending[i].clone()?)))
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect();
        let racy = grantee_race(&action, &queue);
        let mut model_step = model.act(&action, conn_no);
        if let Action::Query(i, _) = &action {
            sent[*i] = Some(n);
        }
        let queued: Vec<usize> = (0..SESSIONS)
            .filter(|i| model.pending[*i].is_some())
            .collect();
        let mut real_step = real.act(&action, conn_no, &model_step, &queued)?;
        if let Action::Restart = action {
            figures.raced += shutdown_race(&model_step, &mut real_step);
        }
        if !racy.is_empty() && model_step != real_step {
            let (m, r) = (
                without_grantee(&model_step, &racy),
                without_grantee(&real_step, &racy),
            );
            if m == r {
                figures.grantee_races += 1;
                (model_step, real_step) = (m, r);
            }
        }
        figures.steps += 1;
        match &action {
            Action::Query(i, _) => {
                figures.statements += 1;
                figures.blocked += usize::from(model.pending[*i].is_some());
            }
            Action::Terminate(_) => figures.terminates += 1,
            Action::Close(_) => figures.closes += 1,
            Action::Restart => figures.restarts += 1,
            Action::Connect(_) => {}
        }
        figures.notifications += (model_step.values().flatten())
            .filter(|e| e.starts_with("notify"))
            .count();
        let model_held = model.holders();
        let real_held = real.holders_like(&model_held)?;
        let line = match &action {
            Action::Query(i, s) => format!("{n}: session {i}: {s:?}"),
            a => format!("{n}: {a:?}"),
        };
        history.push(format!("{line}\n    model: {model_step:?}"));
        if model_step != real_step || model_held != real_held {
            figures.differences.push(format!(
                "seed {seed}, step {line}\n  model: {model_step:?}\n  real:  {real_step:?}\n  \
                 model holds: {model_held:?}\n  real holds:  {real_held:?}\n  the case so far:\n{}",
                history.join("\n")
            ));
            break;
        }
        // What the generator knows, from the model's events.
        match &action {
            Action::Connect(i) => {
                gens[*i] = Gen {
                    conn: model.conns[*i].map(|(_, n)| n),
                    ..Gen::default()
                }
            }
            Action::Query(i, s) => {
                gens[*i].in_flight = true;
                match s {
                    Statement::Setup { .. } => gens[*i].setup = true,
                    Statement::Listen => gens[*i].listening = true,
                    _ => {}
                }
            }
            Action::Close(i) => gens[*i] = Gen::default(),
            _ => {}
        }
        for (i, g) in gens.iter_mut().enumerate() {
            if model.conns[i].is_none() {
                *g = Gen::default();
            } else if model.pending[i].is_none() {
                g.in_flight = false;
            }
        }
    }
    // Every session closed on both sides, and nothing left held.
    for i in 0..SESSIONS {
        if model.conns[i].is_some() {
            model.act(&Action::Close(i), conn_no);
        }
        drop(real.conns[i].take());
    }
    // No backend of the case left (one blocked in a wait exits at its connection check).
    let deadline = Instant::now() + Duration::from_secs(5);
    let backends = "SELECT count(*)::int8 FROM pg_catalog.pg_stat_activity \
                    WHERE application_name = 'lease-server-model'";
    while real.admin.ints(backends)? != [0] && Instant::now() < deadline {
        std::thread::sleep(MS(5));
    }
    let left = real.holders_like(&[])?;
    if !left.is_empty() {
        return Err(KitError::Invalid(format!(
            "left held after the case: {left:?}"
        )));
    }
    figures.cases += 1;
    Ok(())
}

#[test]
fn the_server_model_answers_as_postgresql_does() -> Res {
    let start = Instant::now();
    let cases = env_or("LEASE_DIFF_CASES", 24);
    let steps = env_or("LEASE_DIFF_STEPS", 40) as usize;
    let seed = env_or("LEASE_DIFF_SEED", 1);
    let mut cluster = Cluster::start()?;
    // A long deadlock_timeout on both sides: a long wait never times out within a case.
    cluster.sql(&format!(
        "ALTER SYSTEM SET deadlock_timeout = '{}s'",
        DEADLOCK_TIMEOUT.as_secs()
    ))?;
    cluster.sql("SELECT pg_reload_conf()")?;
    let admin = Admin::connect(&cluster.conn_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let read = format!(
        "SELECT (extract(epoch FROM current_setting('deadlock_timeout')::interval) \
         = {})::int4::int8",
        DEADLOCK_TIMEOUT.as_secs()
    );
    while admin.ints(&read)? != [1] {
        assert!(Instant::now() < deadline, "deadlock_timeout not reloaded");
        std::thread::sleep(MS(20));
    }
    let version = admin.ints("SELECT current_setting('server_version_num')::int8")?[0];
    let mut real = Real {
        cluster: &mut cluster,
        admin,
        conns: Default::default(),
        pending: Default::default(),
        names: Names::default(),
    };
    let mut figures = Figures::default();
    for case in 0..cases {
        run_case(
            &mut real,
            version,
            seed * 1_000_003 + case,
            steps,
            &mut figures,
        )?;
    }
    figure(
        "server model against PostgreSQL",
        format!(
            "version {version}, {} cases, {} steps, {} statements ({} blocked), \
             {} notifications, {} terminates, {} closes, {} restarts ({} waits answered in \
             the shutdown), {} release notifications with a raced grantee, {} differences, \
             {:.1} s",
            figures.cases,
            figures.steps,
            figures.statements,
            figures.blocked,
            figures.notifications,
            figures.terminates,
            figures.closes,
            figures.restarts,
            figures.raced,
            figures.grantee_races,
            figures.differences.len(),
            start.elapsed().as_secs_f64()
        ),
    );
    assert!(
        figures.differences.is_empty(),
        "the model and the server differ:\n{}",
        figures.differences.join("\n\n")
    );
    Ok(())
}
