//! Schedules (`schedule::Planner`): properties over generated schedules, policies
//! and event sequences, and over failovers between two planners whose clock
//! estimates are off by up to `MAX_CLOCK_ERROR`.

use lease_proto::schedule::{
    Action, CatchUp, Missed, Occurrence, Overlap, Planner, Policy, Record, Spec, MAX_CLOCK_ERROR,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// A Monday noon, UTC: the tests' epoch.
fn base() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_796_558_400)
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        0u64..3,
        prop_oneof![
            Just(Overlap::Skip),
            Just(Overlap::Queue),
            Just(Overlap::Replace)
        ],
        prop_oneof![Just(0u64), 1u64..20_000],
        prop_oneof![
            Just(CatchUp::Latest),
            Just(CatchUp::All),
            Just(CatchUp::Off)
        ],
    )
        .prop_map(|(j, overlap, window, catch_up)| Policy {
            // Up to a third of the shortest period.
            jitter: MS(j * 150),
            overlap,
            catch_up_window: MS(window),
            catch_up,
        })
}

#[derive(Debug, Clone)]
enum Step {
    /// Time passes (ms).
    Pass(u64),
    Lead,
    Resign,
    /// The running job ends, if one runs.
    Finish,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            6 => (1u64..2_500).prop_map(Step::Pass),
            1 => Just(Step::Lead),
            1 => Just(Step::Resign),
            3 => Just(Step::Finish),
        ],
        1..200,
    )
}

/// What one planner did, checked as it goes.
#[derive(Default)]
struct Ledger {
    started: BTreeMap<SystemTime, SystemTime>,
    running: Option<Occurrence>,
    stopping: bool,
    skipped: Vec<(Occurrence, Missed)>,
}

impl Ledger {
    fn apply(&mut self, a: Action, now: SystemTime, leading: bool) -> Result<(), TestCaseError> {
        match a {
            Action::Start(o) => {
                prop_assert!(leading, "{o:?} started while not leading");
                prop_assert!(
                    self.running.is_none(),
                    "{o:?} started beside {:?}",
                    self.running
                );
                prop_assert!(o.start <= now, "{o:?} started before its start, at {now:?}");
                if let Some((&last, _)) = self.started.last_key_value() {
                    prop_assert!(o.due > last, "{o:?} started after the due time {last:?}");
                }
                self.started.insert(o.due, now);
                self.running = Some(o);
            }
            Action::Stop(o) => {
                prop_assert_eq!(Some(o), self.running, "stopped what does not run");
                prop_assert!(!self.stopping, "stopped twice");
                self.stopping = true;
            }
            Action::Skip(o, why) => {
                prop_assert!(
                    !self.started.contains_key(&o.due),
                    "{o:?} started and skipped"
                );
                self.skipped.push((o, why));
            }
        }
        Ok(())
    }
}

fn drain(p: &mut Planner, l: &mut Ledger, now: SystemTime) -> Result<(), TestCaseError> {
    for _ in 0..10_000 {
        match p.poll(now) {
            Some(a) => l.apply(a, now, p.is_leading())?,
            None => return Ok(()),
        }
    }
    Err(TestCaseError::fail("poll never returned None"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// One planner through any sequence of leads, losses, job ends and time:
    /// one run at a time, each due time started at most once and in order, only
    /// while leading, never before its start; a Stop only for the running job.
    #[test]
    fn one_run_at_a_time_each_due_time_at_most_once(
        period_s in 1u64..6, policy in policy(), steps in steps(),
    ) {
        let spec = Spec::every(Duration::from_secs(period_s)).unwrap();
        let mut p = Planner::new("nightly", spec, policy);
        let mut l = Ledger::default();
        let mut now = base();
        for step in steps {
            match step {
                Step::Pass(ms) => {
                    // Wake at each start on the way, as a leader's timer does.
                    let end = now + MS(ms);
                    while let Some(w) = p.wake_at().filter(|w| *w <= end && *w > now) {
                        now = w;
                        drain(&mut p, &mut l, now)?;
                    }
                    now = end;
                }
                Step::Lead => p.lead(now),
                Step::Resign => p.resign(),
                Step::Finish => {
                    if let Some(o) = l.running.take() {
                        l.stopping = false;
                        p.finished(o.due);
                    }
                }
            }
            drain(&mut p, &mut l, now)?;
            prop_assert_eq!(p.running(), l.running);
        }
    }

    /// A leader that leads throughout and whose runs end at once starts every
    /// due time whose start comes later than twice the clock margin after its
    /// grant, on time.
    #[test]
    fn a_steady_leader_misses_nothing(period_s in 1u64..6, jitter_ms in 0u64..300, hours in 1u64..4) {
        let spec = Spec::every(Duration::from_secs(period_s)).unwrap();
        let policy = Policy { jitter: MS(jitter_ms), ..Policy::default() };
        let mut p = Planner::new("steady", spec.clone(), policy);
        let mut l = Ledger::default();
        let granted = base() + MS(123);
        p.lead(granted);
        let end = granted + Duration::from_secs(hours * 3600);
        let mut now = granted;
        drain(&mut p, &mut l, now)?;
        while let Some(w) = p.wake_at().filter(|w| *w <= end) {
            now = w;
            drain(&mut p, &mut l, now)?;
            if let Some(o) = l.running.take() {
                p.finished(o.due);
            }
        }
        let expected: Vec<SystemTime> = p
            .upcoming(granted - Duration::from_secs(1), 100_000)
            .into_iter()
            .filter(|o| o.start > granted + 2 * MAX_CLOCK_ERROR && o.start <= end)
            .map(|o| o.due)
            .collect();
        let started: Vec<SystemTime> = l.started.keys().copied().collect();
        let first_difference = started.iter().zip(&expected).position(|(a, b)| a != b);
        prop_assert!(
            started.len() == expected.len() && first_difference.is_none(),
            "{} started, {} expected; first difference at {first_difference:?}",
            started.len(),
            expected.len()
        );
        for (due, at) in &l.started {
            let o = p.upcoming(*due - MS(1), 1)[0];
            prop_assert_eq!(*at, o.start, "started late");
        }
        prop_assert!(l.skipped.iter().all(|(_, why)| *why == Missed::FailoverMargin));
    }

    /// Leadership moves between two planners; each leads only after the other's
    /// lease ended (a gap of 0 to 3 s), and each reads the server's time with an
    /// error of up to `MAX_CLOCK_ERROR` either way. Without a catch-up window no
    /// due time starts on both, and every due time whose start falls inside a
    /// term, more than three clock errors after its grant and more than one
    /// before its end (and the last poll), starts on that term's leader.
    #[test]
    fn a_failover_never_runs_a_due_time_twice(
        period_ms in 1_000u64..4_000,
        jitter_ms in 0u64..300,
        overlap in prop_oneof![Just(Overlap::Skip), Just(Overlap::Queue), Just(Overlap::Replace)],
        terms in prop::collection::vec((100u64..8_000, 0u64..3_000), 1..12),
        errors in prop::collection::vec(-50i64..=50, 64),
        poll_ms in 1u64..40,
    ) {
        let spec = Spec::every(MS(period_ms)).unwrap();
        let policy = Policy { jitter: MS(jitter_ms), overlap, ..Policy::default() };
        let mut planners = [
            Planner::new("moving", spec.clone(), policy),
            Planner::new("moving", spec.clone(), policy),
        ];
        let mut ledgers = [Ledger::default(), Ledger::default()];
        let mut errs = errors.iter().cycle();
        let mut estimate = |t: SystemTime| {
            let e = *errs.next().unwrap();
            let d = MS(e.unsigned_abs()).min(MAX_CLOCK_ERROR);
            if e < 0 { t - d } else { t + d }
        };
        let mut now = base();
        let mut owned = Vec::new();
        for (i, (length, gap)) in terms.iter().enumerate() {
            let who = i % 2;
            let (p, l) = (&mut planners[who], &mut ledgers[who]);
            let granted = now;
            p.lead(estimate(now));
            drain(p, l, estimate(now))?;
            let end = granted + MS(*length);
            let mut last_poll = granted;
            while now + MS(poll_ms) < end {
                now += MS(poll_ms);
                last_poll = now;
                drain(p, l, estimate(now))?;
                // Runs end within a period, sometimes at once.
                if let Some(o) = l.running {
                    if now >= o.start + MS(period_ms / 2) {
                        l.running = None;
                        l.stopping = false;
                        p.finished(o.due);
                    }
                }
            }
            p.resign();
            drain(p, l, estimate(now))?;
            // The job stops with the lease.
            if let Some(o) = l.running.take() {
                l.stopping = false;
                p.finished(o.due);
            }
            owned.push((who, granted + 3 * MAX_CLOCK_ERROR, last_poll - MAX_CLOCK_ERROR));
            now = end + MS(*gap);
        }
        let a: BTreeSet<_> = ledgers[0].started.keys().collect();
        let b: BTreeSet<_> = ledgers[1].started.keys().collect();
        let both: Vec<_> = a.intersection(&b).collect();
        prop_assert!(both.is_empty(), "due times started on both: {both:?}");
        // Liveness within terms: every start well inside a term ran there,
        // unless a run still going made it skip (or wait behind) it.
        let probe = Planner::new("moving", spec, policy);
        for (who, from, to) in owned {
            if to <= from {
                continue;
            }
            for o in probe.upcoming(from, 10_000).into_iter().take_while(|o| o.start <= to) {
                if o.start <= from {
                    continue;
                }
                let l = &ledgers[who];
                let ran = l.started.contains_key(&o.due);
                let excused = l.skipped.iter().any(|(s, why)| {
                    s.due == o.due && matches!(why, Missed::Overlap | Missed::Late | Missed::LeaseLost)
                });
                let waiting = overlap != Overlap::Skip;
                prop_assert!(ran || excused || waiting, "{o:?} did not run on p{who}");
            }
        }
    }
}

#[test]
fn a_new_leader_catches_up_the_latest_missed_due_time_in_its_window() {
    let spec = Spec::every(Duration::from_secs(60)).unwrap();
    let policy = Policy {
        catch_up_window: Duration::from_secs(600),
        ..Policy::default()
    };
    let mut p = Planner::new("catch-up", spec, policy);
    let now = base() + Duration::from_secs(330);
    p.lead(now);
    let mut actions = Vec::new();
    while let Some(a) = p.poll(now) {
        actions.push(a);
    }
    let (starts, skips): (Vec<_>, Vec<_>) =
        actions.iter().partition(|a| matches!(a, Action::Start(_)));
    assert_eq!(starts.len(), 1, "{actions:?}");
    let Action::Start(o) = starts[0] else {
        unreachable!()
    };
    assert_eq!(o.due, base() + Duration::from_secs(300));
    assert_eq!(skips.len(), 9, "ten due times in the window: {actions:?}");
    assert!(skips
        .iter()
        .all(|a| matches!(a, Action::Skip(_, Missed::Superseded))));
}

#[test]
fn catch_up_all_runs_every_missed_due_time_oldest_first() {
    let spec = Spec::every(Duration::from_secs(60)).unwrap();
    let policy = Policy {
        catch_up_window: Duration::from_secs(200),
        catch_up: CatchUp::All,
        ..Policy::default()
    };
    let mut p = Planner::new("catch-up", spec, policy);
    let now = base() + Duration::from_secs(330);
    p.lead(now);
    let mut ran = Vec::new();
    for _ in 0..5 {
        while let Some(a) = p.poll(now) {
            if let Action::Start(o) = a {
                ran.push(o.due);
                p.finished(o.due);
            }
        }
    }
    let want: Vec<_> = [180, 240, 300]
        .iter()
        .map(|s| base() + Duration::from_secs(*s))
        .collect();
    assert_eq!(ran, want);
}

#[test]
fn replace_stops_the_running_job_before_the_next_starts() {
    let spec = Spec::every(Duration::from_secs(10)).unwrap();
    let policy = Policy {
        overlap: Overlap::Replace,
        ..Policy::default()
    };
    let mut p = Planner::new("replace", spec, policy);
    p.lead(base() + MS(500));
    let first = base() + Duration::from_secs(10);
    assert!(matches!(p.poll(first), Some(Action::Start(o)) if o.due == first));
    let second = first + Duration::from_secs(10);
    assert_eq!(
        p.poll(second),
        Some(Action::Stop(p.running().unwrap())),
        "the running job stops first"
    );
    assert_eq!(p.poll(second), None, "nothing starts beside it");
    p.finished(first);
    assert!(matches!(p.poll(second), Some(Action::Start(o)) if o.due == second));
}

/// The due times of the starts among `actions`.
fn started_dues(actions: Vec<Action>) -> Vec<SystemTime> {
    actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Start(o) => Some(o.due),
            _ => None,
        })
        .collect()
}

/// Every action a planner has at `now`, the runs ending at once.
fn all_at(p: &mut Planner, now: SystemTime) -> Vec<Action> {
    let mut out = Vec::new();
    while let Some(a) = p.poll(now) {
        if let Action::Start(o) = a {
            p.finished(o.due);
        }
        out.push(a);
    }
    out
}

#[test]
fn with_a_record_a_new_leader_runs_what_nobody_ran_and_nothing_claimed() {
    let spec = Spec::every(Duration::from_secs(60)).unwrap();
    let policy = Policy {
        catch_up_window: Duration::from_secs(3600),
        ..Policy::default()
    };
    let claimed = base() + Duration::from_secs(120);
    let now = base() + Duration::from_secs(300) + MS(5);
    // The record's run finished: 180, 240 and 300 were missed by everyone; the
    // latest runs at once, no clock margin.
    let mut p = Planner::new("recorded", spec.clone(), policy);
    let record = Record {
        due: claimed,
        finished: true,
        started: true,
    };
    p.lead_recorded(now, Some(record), false);
    let actions = all_at(&mut p, now);
    let starts = started_dues(actions.clone());
    assert_eq!(
        starts,
        vec![base() + Duration::from_secs(300)],
        "{actions:?}"
    );
    assert_eq!(
        actions
            .iter()
            .filter(|a| matches!(a, Action::Skip(_, Missed::Superseded)))
            .count(),
        2
    );
    // Unfinished and retried: the claimed due time runs again first.
    let mut p = Planner::new("recorded", spec.clone(), policy);
    p.lead_recorded(
        now,
        Some(Record {
            due: claimed,
            finished: false,
            started: true,
        }),
        true,
    );
    let starts = started_dues(all_at(&mut p, now));
    assert_eq!(starts, vec![claimed, base() + Duration::from_secs(300)]);
    // Unfinished, not retried: said so.
    let mut p = Planner::new("recorded", spec.clone(), policy);
    p.lead_recorded(
        now,
        Some(Record {
            due: claimed,
            finished: false,
            started: true,
        }),
        false,
    );
    let actions = all_at(&mut p, now);
    assert!(
        actions.contains(&Action::Skip(
            p.upcoming(claimed - MS(1), 1)[0],
            Missed::Unfinished
        )),
        "{actions:?}"
    );
    // Claimed but never started (its claimer lost the lease at once): it runs,
    // whatever the policy.
    let mut p = Planner::new("recorded", spec.clone(), policy);
    let never = Record {
        due: claimed,
        finished: false,
        started: false,
    };
    p.lead_recorded(now, Some(never), false);
    let starts = started_dues(all_at(&mut p, now));
    assert_eq!(starts, vec![claimed, base() + Duration::from_secs(300)]);
    // No record: nothing was ever missed; the next due time is the first.
    let mut p = Planner::new("recorded", spec, policy);
    p.lead_recorded(now, None, false);
    assert_eq!(all_at(&mut p, now), vec![]);
    assert_eq!(p.wake_at(), Some(base() + Duration::from_secs(360)));
}

/// A year of `30 2 * * *` in Europe/Berlin in virtual time: leadership moves between
/// two planners every few hours to ten days, often at a due time, with outages of up to
/// three days and clock readings up to 50 ms off; each leader polls only at the
/// planner's wake times, as `lease run` does. Without a table (no catch-up window): each
/// due time starts at most once, and every due time of a term after its grant's margin
/// starts, on time. With a table (the claim emulated: a start only for a due time later
/// than the last claimed one) and a one-hour catch-up window: also every due time that
/// nobody ran within the window before a grant. The DST rules hold throughout.
#[test]
fn a_year_of_a_nightly_cron_across_failovers_and_dst() -> Result<(), TestCaseError> {
    for table in [false, true] {
        year(table)?;
    }
    Ok(())
}

fn year(table: bool) -> Result<(), TestCaseError> {
    let spec = Spec::cron("30 2 * * *", Some("Europe/Berlin")).unwrap();
    let policy = Policy {
        catch_up_window: if table {
            Duration::from_secs(3600)
        } else {
            Duration::ZERO
        },
        ..Policy::default()
    };
    let mut planners = [
        Planner::new("nightly", spec.clone(), policy),
        Planner::new("nightly", spec.clone(), policy),
    ];
    let mut started: [BTreeMap<SystemTime, SystemTime>; 2] = Default::default();
    let mut record: Option<Record> = None;
    // 2026-01-01T00:00:00Z; a small deterministic generator.
    let year_start = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
    let year_end = year_start + Duration::from_secs(365 * 86_400);
    let mut seed: u64 = 0x5eed_2026;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut now = year_start;
    let mut who = 0;
    let mut terms = Vec::new();
    let mut caught_up = 0;
    while now < year_end {
        let p = &mut planners[who];
        // Often a takeover at a due time, 0 to 200 ms before or after it.
        let granted = if rand(2) == 0 {
            let due = spec.next_after(now).unwrap();
            (due - MS(100) + MS(rand(200))).max(now)
        } else {
            now
        };
        // The leader's reading of the server's clock: up to 50 ms off either way.
        let estimate = granted - MAX_CLOCK_ERROR + MS(rand(100));
        if table {
            p.lead_recorded(estimate, record, false);
        } else {
            p.lead(estimate);
        }
        let end = granted + Duration::from_secs(3_600 * (1 + rand(24 * 10)));
        // It wakes when its reading shows the next start.
        let mut t = estimate;
        loop {
            while let Some(a) = p.poll(t) {
                match a {
                    Action::Start(o) => {
                        let claimed = !table || record.is_none_or(|r| o.due > r.due);
                        if claimed {
                            record = Some(Record {
                                due: o.due,
                                finished: true,
                                started: true,
                            });
                            if o.start < t - MS(200) {
                                caught_up += 1;
                            }
                            started[who].insert(o.due, t);
                        }
                        p.finished(o.due);
                    }
                    Action::Stop(_) => prop_assert!(false, "nothing overlaps here"),
                    Action::Skip(..) => {}
                }
            }
            match p.wake_at().filter(|w| *w <= end) {
                Some(w) => t = w.max(t),
                None => break,
            }
        }
        p.resign();
        while p.poll(end).is_some() {}
        terms.push((who, granted + 3 * MAX_CLOCK_ERROR, end));
        // An outage of up to three days, or a takeover at once.
        now = end
            + if rand(3) == 0 {
                Duration::from_secs(rand(3 * 86_400))
            } else {
                MS(rand(300))
            };
        who = 1 - who;
    }
    let a: BTreeSet<_> = started[0].keys().collect();
    let b: BTreeSet<_> = started[1].keys().collect();
    prop_assert!(
        a.is_disjoint(&b),
        "table {table}: a due time started on both"
    );
    let probe = Planner::new("nightly", spec.clone(), policy);
    for (who, from, to) in &terms {
        for o in probe
            .upcoming(*from, 1_000)
            .into_iter()
            .take_while(|o| o.start <= *to)
        {
            prop_assert_eq!(
                started[*who].get(&o.due),
                Some(&o.start),
                "table {}: {:?} did not start on time on p{}",
                table,
                o,
                who
            );
        }
    }
    let local: Vec<_> = a.union(&b).map(|t| spec.local(**t)).collect();
    for (day, want) in [
        ("2026-03-29", "2026-03-29T03:00:00+02:00[Europe/Berlin]"),
        ("2026-10-25", "2026-10-25T02:30:00+02:00[Europe/Berlin]"),
    ] {
        let got: Vec<_> = local.iter().filter(|l| l.starts_with(day)).collect();
        prop_assert!(got.len() <= 1, "{}: {:?}", day, got);
        // The day may fall in an outage; when it ran, it ran as stated.
        if let Some(g) = got.first() {
            prop_assert_eq!(g.as_str(), want);
        }
    }
    prop_assert!(!table || caught_up > 0, "the table's catch-up never ran");
    eprintln!(
        "a year of a nightly cron (table: {table}) over {} terms: {} due times started, none \
         twice, {caught_up} of them caught up after a gap",
        terms.len(),
        a.len() + b.len()
    );
    Ok(())
}

/// A policy's jitter and catch-up window are checked against the schedule
/// (the library's `Schedule::jitter`/`catch_up` and `lease run` both ask
/// `Policy::check`), and a planner given an unchecked one never panics.
#[test]
fn a_policy_out_of_range_is_refused_and_never_panics_a_planner() {
    use lease_proto::schedule::{CatchUp, Planner, Policy, Spec, MAX_JITTER};
    let every = Spec::every(Duration::from_secs(60)).unwrap();
    let ok = Policy {
        jitter: Duration::from_secs(59),
        catch_up_window: Duration::from_secs(3600),
        ..Policy::default()
    };
    assert!(ok.check(&every).is_ok());
    let long_jitter = Policy {
        jitter: Duration::from_secs(60),
        ..ok
    };
    let e = long_jitter.check(&every).unwrap_err().to_string();
    assert!(e.contains("shorter than the period"), "{e}");
    let cron = Spec::cron("0 3 * * *", None).unwrap();
    let too_long = Policy {
        jitter: MAX_JITTER + Duration::from_secs(1),
        ..Policy::default()
    };
    assert!(too_long.check(&cron).is_err());
    let huge = Policy {
        catch_up_window: Duration::MAX,
        catch_up: CatchUp::All,
        jitter: Duration::MAX,
        ..Policy::default()
    };
    assert!(huge.check(&cron).is_err());
    // Unchecked, the planner still does not panic.
    let mut p = Planner::new("x", cron, huge);
    let now = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    p.lead(now);
    while p.poll(now).is_some() {}
}

// Daylight saving time and zone changes (the rules: `Spec`'s documentation and
// docs/schedules.md). The zones come from the tz database bundled with jiff, never
// the host's.

/// An RFC 3339 UTC instant (`2026-10-25T00:00:00Z`).
fn ts(s: &str) -> SystemTime {
    SystemTime::from(s.parse::<jiff::Timestamp>().unwrap())
}

/// The due times of `spec` in `(from, to]`, in the schedule's zone.
fn dues_between(spec: &Spec, from: SystemTime, to: SystemTime) -> Vec<String> {
    let mut out = Vec::new();
    let mut t = from;
    while let Some(d) = spec.next_after(t) {
        if d > to {
            break;
        }
        out.push(spec.local(d));
        t = d;
    }
    out
}

/// A list of fixed hours has no `*` and no step: fixed-time, due once in a repeated
/// hour (Europe/Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET).
#[test]
fn a_list_of_fixed_hours_is_due_once_in_a_repeated_hour() {
    for expr in ["0 2,14 * * *", "0 1-3 * * *", "0 0,30 2 * * *"] {
        let spec = Spec::cron(expr, Some("Europe/Berlin")).unwrap();
        let got = dues_between(
            &spec,
            ts("2026-10-24T23:00:00Z"),
            ts("2026-10-25T02:00:00Z"),
        );
        let twice = got
            .iter()
            .filter(|d| d.starts_with("2026-10-25T02:00:00"))
            .count();
        assert_eq!(twice, 1, "{expr}: {got:?}");
        assert!(
            got.contains(&"2026-10-25T02:00:00+02:00[Europe/Berlin]".to_owned()),
            "{expr}: {got:?}"
        );
        let first = ts("2026-10-25T00:00:00Z");
        assert!(
            spec.dst_note(first).unwrap().contains("first pass"),
            "{expr}"
        );
    }
    let spec = Spec::cron("0 2,14 * * *", Some("Europe/Berlin")).unwrap();
    let got = dues_between(
        &spec,
        ts("2026-10-24T23:00:00Z"),
        ts("2026-10-25T06:00:00Z"),
    );
    assert_eq!(got, ["2026-10-25T02:00:00+02:00[Europe/Berlin]"], "{got:?}");
    // `*` or a step in the hour: real time, both passes.
    let spec = Spec::cron("0 */1 * * *", Some("Europe/Berlin")).unwrap();
    let got = dues_between(
        &spec,
        ts("2026-10-24T23:30:00Z"),
        ts("2026-10-25T01:30:00Z"),
    );
    assert_eq!(
        got,
        [
            "2026-10-25T02:00:00+02:00[Europe/Berlin]",
            "2026-10-25T02:00:00+01:00[Europe/Berlin]"
        ],
        "{got:?}"
    );
    assert!(spec
        .dst_note(ts("2026-10-25T01:00:00Z"))
        .unwrap()
        .contains("both passes"));
}

/// A list of fixed hours is due at the end of a gap (Europe/Berlin, 2026-03-29: 02:00
/// CET becomes 03:00 CEST).
#[test]
fn a_list_of_fixed_hours_is_due_at_the_end_of_a_gap() {
    for expr in ["30 2,14 * * *", "30 1-3 * * *"] {
        let spec = Spec::cron(expr, Some("Europe/Berlin")).unwrap();
        let got = dues_between(
            &spec,
            ts("2026-03-29T00:45:00Z"),
            ts("2026-03-29T01:00:00Z"),
        );
        assert_eq!(
            got,
            ["2026-03-29T03:00:00+02:00[Europe/Berlin]"],
            "{expr}: {got:?}"
        );
        let due = ts("2026-03-29T01:00:00Z");
        assert!(
            spec.dst_note(due).unwrap().contains("end of the gap"),
            "{expr}"
        );
    }
    // 02:30 and 03:00 both fall due at 03:00: one due time.
    let spec = Spec::cron("0,30 2-3 * * *", Some("Europe/Berlin")).unwrap();
    let got = dues_between(
        &spec,
        ts("2026-03-28T23:00:00Z"),
        ts("2026-03-29T02:00:00Z"),
    );
    assert_eq!(
        got,
        [
            "2026-03-29T03:00:00+02:00[Europe/Berlin]",
            "2026-03-29T03:30:00+02:00[Europe/Berlin]",
        ],
        "{got:?}"
    );
    // A step: real time, nothing in the gap.
    let spec = Spec::cron("30 */1 * * *", Some("Europe/Berlin")).unwrap();
    let got = dues_between(
        &spec,
        ts("2026-03-29T00:45:00Z"),
        ts("2026-03-29T01:30:00Z"),
    );
    assert_eq!(got, ["2026-03-29T03:30:00+02:00[Europe/Berlin]"], "{got:?}");
}

/// A steady leader (no state table, one leader all night) starts a listed hour once on
/// the autumn night.
#[test]
fn a_steady_leader_starts_a_listed_hour_once_on_the_autumn_night() {
    let spec = Spec::cron("0 2,14 * * *", Some("Europe/Berlin")).unwrap();
    let mut p = Planner::new("nightly", spec.clone(), Policy::default());
    let mut now = ts("2026-10-24T23:00:00Z");
    p.lead(now);
    let end = ts("2026-10-25T06:00:00Z");
    let mut started = Vec::new();
    loop {
        while let Some(a) = p.poll(now) {
            if let Action::Start(o) = a {
                started.push(spec.local(o.due));
                p.finished(o.due);
            }
        }
        match p.wake_at() {
            Some(w) if w <= end => now = w,
            _ => break,
        }
    }
    assert_eq!(started.len(), 1, "started {started:?}");
}

/// A fixed-time daily expression is due exactly once each local day, in zones with
/// unusual transitions (midnight gaps, 30-minute and 2-hour shifts). America/Nuuk is
/// left out: its Saturday-23:00 gap moves that day's 23:30 to Sunday 00:00, as stated.
#[test]
fn a_fixed_time_daily_cron_is_due_once_a_day_in_unusual_zones() {
    let zones = [
        "America/Havana",
        "America/Santiago",
        "Australia/Lord_Howe",
        "Antarctica/Troll",
        "Asia/Beirut",
        "America/Asuncion",
        "Africa/Casablanca",
        "Europe/Dublin",
    ];
    let times = [
        (0, 0),
        (0, 30),
        (1, 0),
        (1, 30),
        (2, 0),
        (2, 30),
        (3, 0),
        (22, 30),
        (23, 30),
    ];
    let mut bad = Vec::new();
    for zone in zones {
        let tz = jiff::tz::TimeZoneDatabase::bundled().get(zone).unwrap();
        for (h, m) in times {
            let spec = Spec::cron(&format!("{m} {h} * * *"), Some(zone)).unwrap();
            let mut t = ts("2025-12-31T00:00:00Z");
            let end = ts("2027-01-02T00:00:00Z");
            let mut days = BTreeMap::<jiff::civil::Date, u32>::new();
            while let Some(d) = spec.next_after(t) {
                if d > end {
                    break;
                }
                let z = jiff::Timestamp::try_from(d).unwrap().to_zoned(tz.clone());
                *days.entry(z.date()).or_default() += 1;
                t = d;
            }
            let mut day = jiff::civil::date(2026, 1, 1);
            while day <= jiff::civil::date(2026, 12, 31) {
                let n = days.get(&day).copied().unwrap_or(0);
                if n != 1 {
                    bad.push(format!("{zone} {h:02}:{m:02} {day}: {n}"));
                }
                day = day.tomorrow().unwrap();
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// America/Nuuk skips Saturday 2026-03-28 23:00-23:59 (the end of the gap is Sunday
/// 00:00). A weekly `30 23 * * 6` is due at the end of that gap: the day is the wall
/// time's, not the gap end's.
#[test]
fn a_weekly_run_in_a_gap_that_ends_the_next_day_is_due_at_the_end_of_the_gap() {
    let spec = Spec::cron("30 23 * * 6", Some("America/Nuuk")).unwrap();
    let got = dues_between(
        &spec,
        ts("2026-03-20T00:00:00Z"),
        ts("2026-04-06T00:00:00Z"),
    );
    assert_eq!(
        got,
        [
            "2026-03-21T23:30:00-02:00[America/Nuuk]",
            "2026-03-29T00:00:00-01:00[America/Nuuk]",
            "2026-04-04T23:30:00-01:00[America/Nuuk]",
        ],
        "Saturdays 21, 28 March and 4 April: {got:?}"
    );
}

/// Pacific/Apia skipped 2011-12-30 entirely (a 24-hour gap). A fixed-time cron whose
/// wall time falls in it is due at the end of the gap, and the schedule goes on.
#[test]
fn a_gap_longer_than_two_hours_does_not_end_the_schedule() {
    let spec = Spec::cron("0 0 30 12 *", Some("Pacific/Apia")).unwrap();
    let got = dues_between(
        &spec,
        ts("2011-12-28T00:00:00Z"),
        ts("2013-01-01T00:00:00Z"),
    );
    assert_eq!(
        got,
        [
            "2011-12-31T00:00:00+14:00[Pacific/Apia]",
            "2012-12-30T00:00:00+14:00[Pacific/Apia]",
        ],
        "{got:?}"
    );
    let mut p = Planner::new("yearly", spec, Policy::default());
    p.lead(ts("2011-12-28T00:00:00Z"));
    assert!(p.wake_at().is_some(), "nothing ahead");
    // Real time (a step): nothing that day, the next year's due times go on.
    let spec = Spec::cron("0 */6 30 12 *", Some("Pacific/Apia")).unwrap();
    let got = dues_between(
        &spec,
        ts("2011-12-28T00:00:00Z"),
        ts("2012-12-29T11:00:00Z"),
    );
    assert_eq!(got, ["2012-12-30T00:00:00+14:00[Pacific/Apia]"], "{got:?}");
}
