//! [`Spec`]: the due times of a schedule, and [`jitter`].

use super::MIN_PERIOD;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone, TimeZoneDatabase};
use jiff::{SignedDuration, Timestamp, Zoned};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest period of [`Spec::every`]: 365 days.
const MAX_PERIOD: Duration = Duration::from_secs(365 * 24 * 3600);

/// When a schedule is due: every fixed period aligned to the Unix epoch, or at
/// the times a cron expression matches in an IANA time zone.
///
/// Times are the server's ([`SystemTime`] read off the database server's clock).
/// Cron expressions have 5 fields (minute, hour, day of month, month, day of
/// week) or 6 (seconds first); names (`MON`, `JAN`), ranges, lists, steps,
/// `L`, `W`, `#` and the nicknames (`@daily`, `@hourly`, ...) as croner reads
/// them; a day of month and a day of week both given match either (as cron).
///
/// Time zones are IANA names of the tz database bundled with this crate (jiff's),
/// never the host's zoneinfo: every replica computes the same due times whatever
/// its host's zone or tzdata version.
///
/// Daylight saving time (and any other change of a zone's offset), for a
/// *fixed-time* expression: one whose second, minute and hour fields have no `*`
/// and no step (single values, lists and ranges: `30 2 * * *`, `0 2,14 * * *`,
/// `0 1-3 * * *`). Each wall time it names is due once: a wall time the change
/// skips is due at the end of the gap (03:00 when 02:00 jumps to 03:00; on the
/// day, month and weekday of the skipped wall time, however long the gap); a wall
/// time the change repeats is due at its first pass. Wall times due at one
/// instant (02:30 and 03:00, at the end of a gap) are one due time. An expression
/// with `*` or a step in one of those fields (`*/15 * * * *`, `0 */2 * * *`)
/// follows the clock's real time: none of its due times falls in a gap, and a
/// repeated hour has its due times in both passes (as Vixie cron). Each due time
/// of [`Spec::next_after`] is later than the one before it.
#[derive(Clone)]
pub struct Spec(Kind);

#[derive(Clone)]
enum Kind {
    Every(Duration),
    Cron {
        text: String,
        cron: Box<Cron>,
        zone: TimeZone,
        zone_name: String,
        /// A fixed-time expression (see [`Spec`]): due times by wall time.
        fixed: bool,
    },
}

/// A schedule that cannot be used: an empty, short or long period, an invalid
/// cron expression or an unknown time zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError(String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

impl SpecError {
    pub(super) fn new(message: String) -> SpecError {
        SpecError(message)
    }
}

impl Spec {
    /// The period of an `every` schedule (`None`: a cron expression).
    pub fn period(&self) -> Option<Duration> {
        match &self.0 {
            Kind::Every(period) => Some(*period),
            _ => None,
        }
    }

    /// Due every `period`, at the multiples of `period` since the Unix epoch
    /// (`every 15m`: at :00, :15, :30 and :45 of each hour, UTC). From
    /// [`MIN_PERIOD`] (1 s) to 365 days, in whole milliseconds.
    pub fn every(period: Duration) -> Result<Spec, SpecError> {
        if period < MIN_PERIOD {
            return Err(SpecError(format!(
                "the period must be at least {} ms, not {} ms",
                MIN_PERIOD.as_millis(),
                period.as_millis()
            )));
        }
        if period > MAX_PERIOD {
            return Err(SpecError("the period must be at most 365 days".to_owned()));
        }
        if period.subsec_nanos() % 1_000_000 != 0 {
            return Err(SpecError(
                "the period must be a whole number of milliseconds".to_owned(),
            ));
        }
        Ok(Spec(Kind::Every(period)))
    }

    /// Due when `expr` (5 or 6 fields, see [`Spec`]) matches the wall time of
    /// `zone` (an IANA name of the bundled tz database, such as `Europe/Berlin`;
    /// `None` or `"UTC"`: UTC). A name the bundled database lacks (`localtime`, a
    /// path, a POSIX TZ string) is refused: a host's own zone would give each
    /// replica due times of its own.
    pub fn cron(expr: &str, zone: Option<&str>) -> Result<Spec, SpecError> {
        let zone_name = zone.unwrap_or("UTC").to_owned();
        let tz = bundled_zone(&zone_name)?;
        let fields = expr.split_whitespace().count();
        let nickname = expr.trim_start().starts_with('@');
        if !nickname && !(5..=6).contains(&fields) {
            return Err(SpecError(format!(
                "the cron expression {expr:?} has {fields} fields: 5 (minute hour day month \
                 weekday) or 6 (seconds first)"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| SpecError(format!("invalid cron expression {expr:?}: {e}")))?;
        let fixed = fixed_time(&cron, expr);
        let spec = Spec(Kind::Cron {
            text: expr.trim().to_owned(),
            cron: Box::new(cron),
            zone: tz,
            zone_name,
            fixed,
        });
        // An expression that never matches (`0 0 30 2 *`) is refused now,
        // not when the schedule would first be due.
        if spec
            .next_after(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
            .is_none()
        {
            return Err(SpecError(format!(
                "the cron expression {expr:?} never matches a date"
            )));
        }
        Ok(spec)
    }

    /// The first due time strictly after `t`; `None` when there is none (a cron
    /// expression with no match in the next years, or a time beyond the year 9999).
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match &self.0 {
            Kind::Every(period) => {
                let since = t.duration_since(UNIX_EPOCH).ok()?.as_nanos();
                let p = period.as_nanos();
                let next = (since / p + 1).checked_mul(p)?;
                let secs = u64::try_from(next / 1_000_000_000).ok()?;
                let nanos = u32::try_from(next % 1_000_000_000).ok()?;
                UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
            }
            Kind::Cron {
                cron, zone, fixed, ..
            } => {
                // Whole seconds: the first match after the second that holds `t`
                // is after `t`.
                let secs = t.duration_since(UNIX_EPOCH).ok()?.as_secs();
                let from = Timestamp::from_second(i64::try_from(secs).ok()?).ok()?;
                if *fixed {
                    return next_fixed(cron, zone, from, t);
                }
                // Real time: croner walks the zone's instants (none in a gap,
                // both passes of a repeated hour).
                let next = cron
                    .find_next_occurrence(&from.to_zoned(zone.clone()), false)
                    .ok()?;
                Some(SystemTime::from(next.timestamp()))
            }
        }
    }

    /// The time zone of a cron schedule (UTC for [`Spec::every`]).
    pub fn zone_name(&self) -> &str {
        match &self.0 {
            Kind::Every(_) => "UTC",
            Kind::Cron { zone_name, .. } => zone_name,
        }
    }

    /// `due` in the schedule's time zone, as RFC 9557 text
    /// (`2026-03-29T03:00:00+02:00[Europe/Berlin]`).
    pub fn local(&self, due: SystemTime) -> String {
        let zone = match &self.0 {
            Kind::Every(_) => TimeZone::UTC,
            Kind::Cron { zone, .. } => zone.clone(),
        };
        match Timestamp::try_from(due) {
            Ok(ts) => ts.to_zoned(zone).to_string(),
            Err(_) => "?".to_owned(),
        }
    }

    /// What daylight saving time did to `due`, a due time of this schedule:
    /// moved to the end of a gap, the first pass of a repeated wall time, or a
    /// due time in each pass of a repeated hour; `None` when nothing.
    pub fn dst_note(&self, due: SystemTime) -> Option<String> {
        let Kind::Cron {
            cron, zone, fixed, ..
        } = &self.0
        else {
            return None;
        };
        let ts = Timestamp::try_from(due).ok()?;
        let repeated = matches!(
            zone.to_ambiguous_timestamp(zone.to_datetime(ts)).offset(),
            AmbiguousOffset::Fold { .. }
        );
        if !*fixed {
            return repeated.then(|| {
                "the clock repeats this hour: due in both passes (`*` or a step in the \
                 second, minute or hour: real time)"
                    .to_owned()
            });
        }
        if let Some((start, end)) = gap_ending_at(zone, ts) {
            let skipped = start
                .checked_sub(SignedDuration::from_secs(1))
                .ok()
                .and_then(utc_wall)
                .and_then(|w| cron.find_next_occurrence(&w, false).ok())
                .is_some_and(|m| m.datetime() < end);
            if skipped {
                return Some(format!(
                    "the clock skips {start} to {end}: a wall time the expression names \
                     there is due once, at the end of the gap"
                ));
            }
        }
        repeated.then(|| "the clock repeats this wall time: due once, at its first pass".to_owned())
    }
}

/// `name` in the tz database bundled with this crate (jiff's), never the host's:
/// every replica resolves it alike.
fn bundled_zone(name: &str) -> Result<TimeZone, SpecError> {
    TimeZoneDatabase::bundled().get(name).map_err(|_| {
        SpecError(format!(
            "unknown time zone {name:?}: pass an IANA time zone name such as Europe/Berlin \
             or UTC (zones come from the tz database bundled with lease, never the host's: \
             not localtime, a file path or a TZ string)"
        ))
    })
}

/// Whether `cron` is fixed-time: no `*` and no step in its second, minute and
/// hour fields (single values, lists, ranges). `expr`, its text, shows a `/1`
/// step, which croner's pattern does not.
fn fixed_time(cron: &Cron, expr: &str) -> bool {
    let p = &cron.pattern;
    let parsed = [&p.seconds, &p.minutes, &p.hours]
        .iter()
        .all(|f| !f.from_wildcard && f.step == 1);
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let time_fields = match fields.len() {
        _ if expr.trim_start().starts_with('@') => 0,
        6 => 3,
        _ => 2,
    };
    parsed
        && fields
            .iter()
            .take(time_fields)
            .all(|f| !f.contains('*') && !f.contains('/'))
}

/// Wall time `wall` as a time in UTC: croner walks wall times there, with no
/// change of offset in the way.
fn utc_wall(wall: DateTime) -> Option<Zoned> {
    wall.to_zoned(TimeZone::UTC).ok()
}

/// The first due time after `t` (`from`: `t`'s whole second) of a fixed-time
/// expression. Each wall time it names is due at its instant; at the first pass
/// of a repeated wall time; at the end of the gap for a skipped one. That map
/// from wall times to instants never goes back, so the answer is the instant of
/// the first wall time after `t`'s whose instant is after `t`.
fn next_fixed(cron: &Cron, zone: &TimeZone, from: Timestamp, t: SystemTime) -> Option<SystemTime> {
    let mut wall = zone.to_datetime(from);
    loop {
        let c = cron
            .find_next_occurrence(&utc_wall(wall)?, false)
            .ok()?
            .datetime();
        let due = match zone.to_ambiguous_timestamp(c).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(c).ok()?,
            // The end of the gap: the transition after `c` read at the offset
            // after the gap (an instant before the gap).
            AmbiguousOffset::Gap { after, .. } => {
                transition_after(zone, after.to_timestamp(c).ok()?)?
            }
            AmbiguousOffset::Fold { before, .. } => {
                let first = before.to_timestamp(c).ok()?;
                if SystemTime::from(first) <= t {
                    // `t` is in the second pass, after every first pass of this
                    // fold: go on from the fold's last wall time.
                    let end = before.to_datetime(transition_after(zone, first)?);
                    wall = end.checked_sub(SignedDuration::from_secs(1)).ok()?;
                    continue;
                }
                first
            }
        };
        let due = SystemTime::from(due);
        if due > t {
            return Some(due);
        }
        wall = c;
    }
}

/// The first transition of `zone` strictly after `ts`.
fn transition_after(zone: &TimeZone, ts: Timestamp) -> Option<Timestamp> {
    zone.following(ts).next().map(|tr| tr.timestamp())
}

/// The wall times `[start, end)` a gap skips, when `ts` is the end of one.
fn gap_ending_at(zone: &TimeZone, ts: Timestamp) -> Option<(DateTime, DateTime)> {
    let before = zone.to_offset(ts.checked_sub(SignedDuration::from_secs(1)).ok()?);
    let after = zone.to_offset(ts);
    // Transitions fall on whole seconds: a later offset at `ts` than a second
    // before is a gap that ends at `ts`.
    (after > before).then(|| (before.to_datetime(ts), after.to_datetime(ts)))
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Every(period) => write!(f, "every {}", human(*period)),
            Kind::Cron {
                text, zone_name, ..
            } => write!(f, "cron {text:?} in {zone_name}"),
        }
    }
}

/// Reads back what [`Spec`]'s `Display` wrote (`every 15m`, `cron "0 3 * * *" in
/// Europe/Berlin`), as a state table keeps it.
impl std::str::FromStr for Spec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Spec, SpecError> {
        if let Some(period) = s.strip_prefix("every ") {
            let ms = parse_human(period).ok_or_else(|| {
                SpecError(format!("{s:?}: not a period such as 15m, 2s or 1500ms"))
            })?;
            return Spec::every(Duration::from_millis(ms));
        }
        if let Some(rest) = s.strip_prefix("cron \"") {
            if let Some((expr, zone)) = rest.rsplit_once("\" in ") {
                return Spec::cron(expr, Some(zone));
            }
        }
        Err(SpecError(format!(
            "{s:?}: not a schedule (every PERIOD, or cron \"EXPR\" in ZONE)"
        )))
    }
}

/// [`human`]'s text back to milliseconds.
fn parse_human(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().ok()?;
    let size = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1_000,
        "ms" => 1,
        _ => return None,
    };
    n.checked_mul(size)
}

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Spec({self})")
    }
}

/// `d` in the largest unit that divides it: `15m`, `2s`, `1500ms`.
pub(super) fn human(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// The delay of due time `due` of schedule `name`: the same on every replica
/// (a hash of both), in `[0, max)`, whole milliseconds; zero when `max` is.
/// A failover never moves a start.
pub fn jitter(name: &str, due: SystemTime, max: Duration) -> Duration {
    let max_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    if max_ms == 0 {
        return Duration::ZERO;
    }
    let since = due.duration_since(UNIX_EPOCH).unwrap_or_default();
    // FNV-1a, 64 bits: stable across platforms and releases (never std's hasher).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = name
        .as_bytes()
        .iter()
        .copied()
        .chain([0])
        .chain(since.as_secs().to_le_bytes())
        .chain(since.subsec_nanos().to_le_bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Duration::from_millis(h % max_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn at(zone: &str, y: i16, mo: i8, d: i8, h: i8, mi: i8) -> SystemTime {
        let tz = TimeZoneDatabase::bundled().get(zone).unwrap();
        let ts = tz
            .to_ambiguous_zoned(date(y, mo, d).at(h, mi, 0, 0))
            .earlier()
            .unwrap()
            .timestamp();
        SystemTime::from(ts)
    }

    fn utc(t: SystemTime) -> String {
        Timestamp::try_from(t).unwrap().to_string()
    }

    #[test]
    fn every_is_aligned_to_the_epoch() {
        let spec = Spec::every(Duration::from_secs(15 * 60)).unwrap();
        let t = at("UTC", 2026, 12, 6, 14, 7) + Duration::from_millis(1);
        assert_eq!(utc(spec.next_after(t).unwrap()), "2026-12-06T14:15:00Z");
        let on = at("UTC", 2026, 12, 6, 14, 15);
        assert_eq!(utc(spec.next_after(on).unwrap()), "2026-12-06T14:30:00Z");
        assert_eq!(spec.to_string(), "every 15m");
    }

    #[test]
    fn bad_specs_say_why() {
        for (spec, says) in [
            (Spec::every(Duration::from_millis(999)), "at least 1000 ms"),
            (
                Spec::every(Duration::from_micros(1_000_500)),
                "whole number",
            ),
            (
                Spec::every(Duration::from_secs(400 * 86_400)),
                "at most 365 days",
            ),
            (Spec::cron("0 3 * *", None), "4 fields"),
            (Spec::cron("0 3 * * * * *", None), "7 fields"),
            (Spec::cron("61 3 * * *", None), "invalid cron expression"),
            (
                Spec::cron("0 3 * * *", Some("Mars/Olympus")),
                "unknown time zone",
            ),
            (Spec::cron("0 0 30 2 *", None), "never matches"),
        ] {
            let e = spec.unwrap_err().to_string();
            assert!(e.contains(says), "{e:?} should say {says:?}");
        }
    }

    #[test]
    fn a_skipped_wall_time_is_due_once_at_the_end_of_the_gap() {
        // Europe/Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST.
        let spec = Spec::cron("30 2 * * *", Some("Europe/Berlin")).unwrap();
        let before = at("Europe/Berlin", 2026, 3, 28, 12, 0);
        let first = spec.next_after(before).unwrap();
        assert_eq!(
            spec.local(first),
            "2026-03-29T03:00:00+02:00[Europe/Berlin]"
        );
        assert!(spec.dst_note(first).unwrap().contains("end of the gap"));
        let second = spec.next_after(first).unwrap();
        assert_eq!(
            spec.local(second),
            "2026-03-30T02:30:00+02:00[Europe/Berlin]"
        );
        assert_eq!(spec.dst_note(second), None);
    }

    #[test]
    fn a_repeated_wall_time_is_due_once() {
        // Europe/Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET.
        let spec = Spec::cron("30 2 * * *", Some("Europe/Berlin")).unwrap();
        let before = at("Europe/Berlin", 2026, 10, 24, 12, 0);
        let first = spec.next_after(before).unwrap();
        assert_eq!(
            spec.local(first),
            "2026-10-25T02:30:00+02:00[Europe/Berlin]"
        );
        assert!(spec.dst_note(first).unwrap().contains("first pass"));
        let second = spec.next_after(first).unwrap();
        assert_eq!(
            spec.local(second),
            "2026-10-26T02:30:00+01:00[Europe/Berlin]"
        );
    }

    #[test]
    fn a_year_of_a_daily_cron_is_one_due_time_a_day() {
        let spec = Spec::cron("30 2 * * *", Some("America/New_York")).unwrap();
        let mut t = at("America/New_York", 2026, 1, 1, 0, 0);
        let mut days = std::collections::BTreeSet::new();
        for _ in 0..365 {
            let due = spec.next_after(t).unwrap();
            assert!(due > t);
            let local = Timestamp::try_from(due)
                .unwrap()
                .to_zoned(TimeZoneDatabase::bundled().get("America/New_York").unwrap());
            assert!(
                days.insert(local.date()),
                "two due times on {}",
                local.date()
            );
            t = due;
        }
        assert_eq!(days.len(), 365);
    }

    #[test]
    fn fixed_time_is_no_star_and_no_step_in_the_time_fields() {
        let fixed = |expr: &str| match Spec::cron(expr, None).unwrap().0 {
            Kind::Cron { fixed, .. } => fixed,
            Kind::Every(_) => unreachable!(),
        };
        for expr in [
            "30 2 * * *",
            "0 2,14 * * *",
            "0 1-3 * * *",
            "0 30 2 * * *",
            "0,30 2-3 * * MON",
            "@daily",
            "@weekly",
        ] {
            assert!(fixed(expr), "{expr}");
        }
        for expr in [
            "* 2 * * *",
            "0 */2 * * *",
            "0 0-23/1 * * *",
            "*/10 30 2 * * *",
            "0 * * * *",
            "@hourly",
        ] {
            assert!(!fixed(expr), "{expr}");
        }
    }

    #[test]
    fn six_fields_start_with_seconds() {
        let spec = Spec::cron("*/10 * * * * *", None).unwrap();
        let t = at("UTC", 2026, 12, 6, 14, 7) + Duration::from_millis(1500);
        assert_eq!(utc(spec.next_after(t).unwrap()), "2026-12-06T14:07:10Z");
    }

    #[test]
    fn the_text_of_a_spec_reads_back() {
        for spec in [
            Spec::every(Duration::from_secs(900)).unwrap(),
            Spec::every(Duration::from_millis(1500)).unwrap(),
            Spec::every(Duration::from_secs(2 * 86_400)).unwrap(),
            Spec::cron("0 3 * * *", Some("Europe/Berlin")).unwrap(),
            Spec::cron("*/10 * * * * *", None).unwrap(),
        ] {
            let text = spec.to_string();
            let back: Spec = text.parse().unwrap();
            assert_eq!(back.to_string(), text);
        }
        assert!("every 3 days".parse::<Spec>().is_err());
        assert!("hourly".parse::<Spec>().is_err());
    }

    #[test]
    fn jitter_is_stable_and_bounded() {
        let due = at("UTC", 2026, 12, 6, 3, 0);
        let max = Duration::from_secs(30);
        let j = jitter("nightly", due, max);
        assert!(j < max);
        assert_eq!(j, jitter("nightly", due, max));
        assert_eq!(jitter("nightly", due, Duration::ZERO), Duration::ZERO);
        let spread: std::collections::BTreeSet<_> = (0..50)
            .map(|i| jitter("nightly", due + Duration::from_secs(86_400 * i), max))
            .collect();
        assert!(spread.len() > 40, "{spread:?}");
    }
}
