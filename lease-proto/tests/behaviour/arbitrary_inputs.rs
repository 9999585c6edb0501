//! Arbitrary input sequences through the machine, every output checked by the
//! [`Observer`](lease_proto::sim::Observer) (the `machine_inputs` fuzz target's counterpart).

use crate::common::*;
use lease_proto::server::*;
use lease_proto::sim::Harness;
use lease_proto::sim::ObserverViolation;
use lease_proto::*;
use proptest::prelude::*;

// ---- arbitrary inputs ------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Run(u8),
    Exit(u8, u8),
    Shutdown(u8),
    Close,
    Opened(i8),
    Lost(i8, bool),
    Reply(i8, Vec<Vec<Option<i64>>>),
    Error(i8),
    Notify(u8),
    Advance(u16),
}

fn step() -> impl Strategy<Value = Step> {
    let small_key = prop_oneof![
        Just(None),
        (0..4u8).prop_map(|i| Some(key(&format!("k{i}")))),
        any::<i64>().prop_map(Some),
        (0..5i64).prop_map(Some)
    ];
    let row = proptest::collection::vec(small_key, 0..4);
    prop_oneof![
        (0..4u8).prop_map(Step::Run),
        (0..6u8, 0..3u8).prop_map(|(r, e)| Step::Exit(r, e)),
        (0..6u8).prop_map(Step::Shutdown),
        Just(Step::Close),
        (-1..1i8).prop_map(Step::Opened),
        (-1..1i8, any::<bool>()).prop_map(|(s, e)| Step::Lost(s, e)),
        (-1..1i8, proptest::collection::vec(row, 0..5)).prop_map(|(q, rows)| Step::Reply(q, rows)),
        (-1..1i8).prop_map(Step::Error),
        (0..4u8).prop_map(Step::Notify),
        prop_oneof![Just(0u16), 0..2000u16].prop_map(Step::Advance),
    ]
}

/// Feeds one step; replies to the query in flight are made plausible half of
/// the time (the keys it asked about), arbitrary otherwise. The harness checks
/// every command and that `poll_timeout` is never in the past (a deadline in
/// the past would make a driver spin).
fn feed(h: &mut Harness, s: Step) -> Result<(), ObserverViolation> {
    let near = |id: Option<u64>, d: i8| id.map(|i| i.wrapping_add_signed(i64::from(d)));
    let session = h.session().map(|s| s.0);
    let query = h.last_query().map(|q| q.0 .0);
    let input = match s {
        Step::Run(i) => {
            let _ = h.start(LeaseId::named(format!("k{i}")).unwrap());
            None
        }
        Step::Exit(r, e) => Some(Input::JobExited {
            run: RunId(u64::from(r)),
            exit: [JobExit::Ok, JobExit::Failed, JobExit::Abandoned][e as usize],
        }),
        Step::Shutdown(r) => Some(Input::Shutdown {
            run: RunId(u64::from(r)),
        }),
        Step::Close => Some(Input::Close),
        Step::Opened(d) => near(session, d).map(|s| Input::SessionOpened {
            session: SessionId(s),
        }),
        Step::Lost(d, e) => near(session, d).map(|s| Input::SessionEnded {
            session: SessionId(s),
            error: e.then(|| SessionError::other("x")),
        }),
        Step::Reply(d, rows) => near(query, d).map(|q| Input::Reply {
            query: QueryId(q),
            result: Ok(rows),
        }),
        Step::Error(d) => near(query, d).map(|q| Input::Reply {
            query: QueryId(q),
            result: Err(SessionError::other("x")),
        }),
        Step::Notify(i) => Some(Input::Notification {
            channel: HANDOVER_CHANNEL.into(),
            payload: key(&format!("k{i}")).to_string(),
            sender_pid: 99,
        }),
        Step::Advance(n) => {
            h.set_now(h.now() + ms(u64::from(n)));
            Some(Input::Tick)
        }
    };
    h.step(input)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: regressions_beside_the_source(),
        rng_seed: rng_seed(),
        ..ProptestConfig::default()
    })]

    /// Whatever arrives, in whatever order: no panic, and every rule the
    /// observer checks holds.
    #[test]
    fn arbitrary_inputs_keep_every_rule(steps in proptest::collection::vec(step(), 0..120)) {
        let mut h = Harness::new(opts(), 3).unwrap();
        for (i, s) in steps.into_iter().enumerate() {
            let d = format!("{s:?}");
            if let Err(e) = feed(&mut h, s) {
                prop_assert!(false, "step {i} ({d}): {e}");
            }
        }
    }
}
