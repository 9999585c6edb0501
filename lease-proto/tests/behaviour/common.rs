//! Helpers shared by the modules: the hand-driven machine's options, names and keys, and
//! the standby that answers everything.

use std::time::Duration;

use lease_proto::reply::*;
use lease_proto::sim::{Command, Fault, Harness};
use lease_proto::*;
use proptest::test_runner::{FailurePersistence, FileFailurePersistence, RngSeed};

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The options of the hand-driven machine tests: heartbeat and retry 200 ms, query
/// timeout 500 ms, guard margin 200 ms.
pub fn opts() -> Options {
    let mut o = Options::default();
    o.retry_interval = ms(200);
    o.heartbeat_interval = ms(200);
    o.query_timeout = ms(500);
    o.guard_margin = ms(200);
    o
}

/// A standby that polls (waiting on the server off).
pub fn polling() -> Options {
    let mut o = opts();
    o.server_wait = ServerWait::Off;
    o
}

/// One machine driven by hand, checked after every input (the shared [`Harness`]).
pub fn harness(o: Options) -> Harness {
    Harness::new(o, 1).expect("valid options")
}

pub fn lease(name: &str) -> LeaseId {
    LeaseId::named(name).expect("a valid lease name")
}

pub fn key(name: &str) -> i64 {
    key_for_name(name)
}

/// A statement error with this SQLSTATE.
pub fn boom(code: &str) -> SessionError {
    SessionError {
        code: Some(code.into()),
        message: "boom".into(),
        config: false,
    }
}

pub fn has(cmds: &[Command], f: impl Fn(&Command) -> bool) -> bool {
    cmds.iter().any(f)
}

/// Starts a run of `name`, connects (backend pid 7) and wins with `token`: the run leads.
pub fn started(h: &mut Harness, name: &str, token: i64) -> RunId {
    let run = h.run(lease(name));
    h.connect(7);
    let cmds = h.win(token);
    assert!(
        has(
            &cmds,
            |c| matches!(c, Command::StartJob { run: r, token: t, .. } if *r == run && *t == token)
        ),
        "{cmds:?}"
    );
    run
}

/// Whether `cmds` cancel a job because its lease is handed over.
pub fn handed_over(cmds: &[Command]) -> bool {
    has(cmds, |c| {
        matches!(
            c,
            Command::CancelJob {
                reason: Reason::HandedOver,
                ..
            }
        )
    })
}

/// The job of `run`, cancelled by a hand-over, returns: the key is released with its
/// handover notification, and the release is answered.
pub fn handed_over_job_returns(h: &mut Harness, run: RunId) {
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert!(
        matches!(h.statement(), Statement::Release { notify: true, .. }),
        "{:?}",
        h.statement()
    );
    h.released();
}

/// The job of `run` returns; its run future is dropped while the release of its key is in
/// flight (the driver's guard reports `Abandoned`); the release is answered: the run must
/// finish `Abandoned` then.
pub fn job_returns_then_run_dropped_mid_release(h: &mut Harness, run: RunId) {
    h.input(Input::JobExited {
        run,
        exit: JobExit::Ok,
    });
    assert!(matches!(h.statement(), Statement::Release { .. }));
    h.input(Input::JobExited {
        run,
        exit: JobExit::Abandoned,
    });
    let cmds = h.released();
    assert!(
        has(&cmds, |c| matches!(
            c,
            Command::FinishRun { run: r, outcome: Outcome::Abandoned } if *r == run
        )),
        "the dropped run did not finish Abandoned: {cmds:?}"
    );
}

/// Answers every statement of a standby that holds nothing and wins
/// nothing for `d`; returns the statements sent.
pub fn standby_at_rest(h: &mut Harness, d: Duration) -> Vec<Statement> {
    let end = h.now() + d;
    let mut sent = Vec::new();
    while h.now() < end {
        match h.in_flight().map(|(_, s)| s.clone()) {
            Some(s @ Statement::TryLock { .. }) => {
                sent.push(s);
                h.advance(ms(1));
                h.lose(Some(99));
            }
            Some(s @ (Statement::Heartbeat | Statement::Verify)) => {
                sent.push(s);
                h.advance(ms(1));
                h.heartbeat(7, &[]);
            }
            Some(s @ Statement::Take { timeout_ms, .. }) => {
                sent.push(s);
                h.advance(ms(timeout_ms));
                h.held_all_along(7);
            }
            Some(s) => panic!("{s:?}"),
            None => {
                h.advance(ms(1));
            }
        }
    }
    sent
}

/// The random seed of the property suites when `PROPTEST_RNG_SEED` is unset.
pub const RNG_SEED: u64 = 20_261_206;

/// The random seed of every property suite's runner: [`RNG_SEED`], so a run on
/// unchanged code draws the same cases each time (CI cannot fail by luck);
/// `PROPTEST_RNG_SEED=N` draws from seed `N`, and `PROPTEST_RNG_SEED=random` from a
/// new random seed each run (a deep or exploratory run). Anything else panics, so a
/// typo does not silently fall back to the fixed seed.
pub fn rng_seed() -> RngSeed {
    match std::env::var("PROPTEST_RNG_SEED") {
        Err(_) => RngSeed::Fixed(RNG_SEED),
        Ok(s) if s.eq_ignore_ascii_case("random") => RngSeed::Random,
        Ok(s) => match s.parse() {
            Ok(n) => RngSeed::Fixed(n),
            Err(_) => panic!("PROPTEST_RNG_SEED={s}: expected a u64 or `random`"),
        },
    }
}

/// Where a `proptest!` block keeps its failing cases: `NAME.proptest-regressions` beside
/// its source file `NAME.rs`. (Proptest's default, `SourceParallel`, would find `main.rs`
/// here and use `tests/proptest-regressions/NAME.txt`.)
pub fn regressions_beside_the_source() -> Option<Box<dyn FailurePersistence>> {
    Some(Box::new(FileFailurePersistence::WithSource(
        "proptest-regressions",
    )))
}

/// Opens the session of the run just started and returns the nonce its setup statement
/// sends.
pub fn open_until_setup(h: &mut Harness) -> i64 {
    let s = h.session().expect("a connection attempt");
    h.input(Input::SessionOpened { session: s });
    let Statement::Setup { nonce, .. } = h.statement() else {
        panic!("expected the setup, got {:?}", h.statement())
    };
    nonce
}

/// The setup reply of a PostgreSQL 15 primary (backend pid 7) that applied everything the
/// session asked for with options `o` and setup `nonce`.
pub fn setup_reply(o: &Options, nonce: i64) -> SetupReply {
    SetupReply {
        server_version: 150_000,
        in_recovery: false,
        backend_pid: 7,
        idle_session_timeout_ms: Some(o.guard_timeout().as_millis() as i64),
        tcp_settings: o.tcp_settings().map(|(_, v)| Some(v)),
        unix_socket: false,
        search_path_catalog: true,
        nonce: Some(nonce),
        promotion: Default::default(),
        server_clock_us: None,
    }
}

/// The latency and server slowness that `faults` add, stacked: how much longer than usual
/// the last messages of a schedule can take.
pub fn stacked_delay<'a>(faults: impl IntoIterator<Item = &'a Fault>) -> Duration {
    faults
        .into_iter()
        .map(|f| match f {
            Fault::Delay { extra, .. } | Fault::SlowServer { extra, .. } => *extra,
            _ => Duration::ZERO,
        })
        .sum()
}

/// The payload of the handover notification of `key`'s graceful release: the key and the
/// release's moment on the server's clock in fencing-token units, [`RELEASED_AT`] (a win
/// whose token is at most the lock delay above it follows that release).
pub fn release_payload(key: i64) -> String {
    format!("{key} {RELEASED_AT}")
}

/// [`release_payload`] naming `grantee` as the backend the server granted the key to at
/// the release (the first take in its queue).
pub fn release_payload_to(key: i64, grantee: i64) -> String {
    format!("{key} {RELEASED_AT} {grantee}")
}

/// [`release_payload_to`] that also names `to` as the backend the key is handed over to
/// (`grantee` 0: none).
pub fn release_payload_reserved(key: i64, grantee: i64, to: i64) -> String {
    format!("{key} {RELEASED_AT} {grantee} {to}")
}

/// The release moment of [`release_payload`]: just below the tokens the hand-driven tests
/// win with (900 and up).
pub const RELEASED_AT: i64 = 900;
