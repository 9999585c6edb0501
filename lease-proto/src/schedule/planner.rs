//! [`Planner`]: what a schedule's leader does at each due time.

use super::{jitter, Spec, SpecError, MAX_CATCH_UP, MAX_CLOCK_ERROR};
use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, SystemTime};

/// One due time of a schedule, and when it starts: `due` plus its [`jitter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Occurrence {
    /// The due time: the run's identity (`NAME@<due as Unix seconds>`).
    pub due: SystemTime,
    /// When it starts, on the server's clock.
    pub start: SystemTime,
}

/// A due time that arrives while the previous run still goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Skip it ([`Missed::Overlap`]). The default.
    #[default]
    Skip,
    /// Start it when the running one ends; one at most waits, later ones are
    /// skipped.
    Queue,
    /// Stop the running one ([`Action::Stop`]: the usual graceful stop) and start
    /// this one when it has ended.
    Replace,
}

/// Which missed due times a new leader runs, of those whose start fell in the
/// catch-up window before its grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// The most recent one; the older ones are skipped ([`Missed::Superseded`]).
    /// The default.
    #[default]
    Latest,
    /// Every one, oldest first, at most [`MAX_CATCH_UP`].
    All,
    /// None ([`Missed::BeforeLead`]).
    Off,
}

/// How a schedule treats overlaps, delays and gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// Each start is its due time plus [`jitter`] of up to this (default: none).
    pub jitter: Duration,
    /// A due time that arrives while the previous run still goes.
    pub overlap: Overlap,
    /// How far before its grant a new leader looks for due times to run
    /// (default: zero, nothing). Without a record of what ran, a due time in
    /// this window may have run on the old leader too: a window is at-least-once
    /// for the due times it covers, no window is at-most-once.
    pub catch_up_window: Duration,
    /// Which of the due times in the catch-up window run.
    pub catch_up: CatchUp,
}

/// The longest [`Policy::jitter`]: a day.
pub const MAX_JITTER: Duration = Duration::from_secs(24 * 3600);

/// The most due times of an `every` schedule a catch-up window may cover
/// (each one it passes over is logged).
pub const MAX_CATCH_UP_SCAN: u32 = 10_000;

/// The longest [`Policy::catch_up_window`]: 366 days.
pub const MAX_CATCH_UP_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

impl Policy {
    /// Whether this policy can serve `spec`: a jitter shorter than an `every`
    /// period and at most [`MAX_JITTER`], a catch-up window at most
    /// [`MAX_CATCH_UP_WINDOW`]. (A cron expression's gaps vary: keep its
    /// jitter below the shortest.)
    ///
    /// # Errors
    /// What is out of range, in one line.
    pub fn check(&self, spec: &Spec) -> Result<(), SpecError> {
        let human = super::spec::human;
        if let Some(period) = spec.period() {
            if self.jitter >= period {
                return Err(SpecError::new(format!(
                    "the jitter ({}) must be shorter than the period ({})",
                    human(self.jitter),
                    human(period)
                )));
            }
        }
        if self.jitter > MAX_JITTER {
            return Err(SpecError::new(format!(
                "the jitter ({}) must be at most a day",
                human(self.jitter)
            )));
        }
        if let Some(period) = spec.period() {
            if self.catch_up_window > period * MAX_CATCH_UP_SCAN {
                return Err(SpecError::new(format!(
                    "the catch-up window ({}) may cover at most {MAX_CATCH_UP_SCAN} due times \
                     (here {})",
                    human(self.catch_up_window),
                    human(period * MAX_CATCH_UP_SCAN)
                )));
            }
        }
        if self.catch_up_window > MAX_CATCH_UP_WINDOW {
            return Err(SpecError::new(format!(
                "the catch-up window ({}) must be at most 366 days",
                human(self.catch_up_window)
            )));
        }
        Ok(())
    }
}

/// Why a due time did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Missed {
    /// The previous run still went ([`Overlap::Skip`], or [`Overlap::Queue`]
    /// with one waiting already).
    Overlap,
    /// The leader was late (stalled, or its clock estimate jumped): a later due
    /// time had started meanwhile, which runs instead.
    Late,
    /// Due before this leader's grant, in the catch-up window, with
    /// [`CatchUp::Off`].
    BeforeLead,
    /// Due before this leader's grant, in the catch-up window, with a more
    /// recent one that runs instead ([`CatchUp::Latest`]).
    Superseded,
    /// Due before this leader's grant, beyond [`MAX_CATCH_UP`] ([`CatchUp::All`]).
    CatchUpCap,
    /// Its start fell within twice [`MAX_CLOCK_ERROR`] after a new leader's
    /// grant, which leaves it to the old leader (without a catch-up window).
    FailoverMargin,
    /// Waiting to start when the lease was lost.
    LeaseLost,
    /// Claimed in the state table by a leader that stopped before it finished,
    /// and not retried.
    Unfinished,
    /// Its claim in the state table was refused (claimed already, or by a newer
    /// leader) or could not be made: it does not start here.
    NotClaimed,
}

impl Missed {
    /// A short name for logs and metric labels (`overlap`, `late`, ...).
    pub fn label(self) -> &'static str {
        match self {
            Missed::Overlap => "overlap",
            Missed::Late => "late",
            Missed::BeforeLead => "before_lead",
            Missed::Superseded => "superseded",
            Missed::CatchUpCap => "catch_up_cap",
            Missed::FailoverMargin => "failover_margin",
            Missed::LeaseLost => "lease_lost",
            Missed::Unfinished => "unfinished",
            Missed::NotClaimed => "not_claimed",
        }
    }
}

impl fmt::Display for Missed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Missed::Overlap => "the previous run was still going",
            Missed::Late => "this leader was late; a later due time runs instead",
            Missed::BeforeLead => "due before this replica led (catch-up: none)",
            Missed::Superseded => {
                "due before this replica led; the latest missed due time runs instead"
            }
            Missed::CatchUpCap => "due before this replica led, beyond the catch-up cap",
            Missed::FailoverMargin => {
                "due within the clock margin of the takeover, left to the old leader"
            }
            Missed::LeaseLost => "waiting to start when the lease was lost",
            Missed::Unfinished => {
                "claimed by a leader that stopped before it finished (not retried)"
            }
            Missed::NotClaimed => "its claim in the state table was refused or failed",
        })
    }
}

/// What a state table says of a schedule: the last due time claimed, and
/// whether its run finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The last due time claimed.
    pub due: SystemTime,
    /// Whether its run finished (and its outcome was recorded).
    pub finished: bool,
    /// Whether its run started: `false` when its claimer lost the lease
    /// between the claim and the start (it runs again, whatever the policy).
    pub started: bool,
}

/// What the leader does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Start the job for this due time.
    Start(Occurrence),
    /// This due time does not run.
    Skip(Occurrence, Missed),
    /// Stop the running job of this due time gracefully ([`Overlap::Replace`]);
    /// report its end with [`Planner::finished`].
    Stop(Occurrence),
}

/// What a schedule's leader does at each due time: a pure state machine over
/// the server's time.
///
/// Feed it [`Planner::lead`] when the lease is granted, [`Planner::resign`] when
/// it is lost, [`Planner::finished`] when a run ends; after each, and whenever
/// the server's time reaches [`Planner::wake_at`], drain [`Planner::poll`].
/// Start a run only while the lease is valid and the clock estimate is within
/// [`MAX_CLOCK_ERROR`].
///
/// What it guarantees, by construction (and checked by the property tests of
/// `tests/behaviour/schedule.rs`): at most one run at a time ([`Action::Stop`]
/// comes before the start that replaces); each due time starts at most once, in
/// due-time order; and, between two planners of which one leads only after the
/// other's lease ended (each estimate of the server's time within
/// [`MAX_CLOCK_ERROR`], the server's clock never stepping back), without a
/// catch-up window no due time starts on both.
#[derive(Debug, Clone)]
pub struct Planner {
    name: String,
    spec: Spec,
    policy: Policy,
    leading: bool,
    /// Due times in order, not yet started or skipped; the first one is the
    /// next to arrive. Generated as needed after `cursor`.
    ahead: VecDeque<Occurrence>,
    /// The last due time generated into `ahead` (or passed over).
    cursor: Option<SystemTime>,
    /// The due time of the last start: none at or before it ever starts.
    last_started: Option<SystemTime>,
    running: Option<Occurrence>,
    stop_sent: bool,
    /// Arrived, waiting for the running one to end ([`Overlap`], catch-up).
    waiting: VecDeque<Occurrence>,
    decided: VecDeque<Action>,
}

impl Planner {
    /// A planner for schedule `name` (its jitter is keyed by the name).
    pub fn new(name: &str, spec: Spec, policy: Policy) -> Planner {
        Planner {
            name: name.to_owned(),
            spec,
            policy,
            leading: false,
            ahead: VecDeque::new(),
            cursor: None,
            last_started: None,
            running: None,
            stop_sent: false,
            waiting: VecDeque::new(),
            decided: VecDeque::new(),
        }
    }

    /// The schedule.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether it leads (between [`Planner::lead`] and [`Planner::resign`]).
    pub fn is_leading(&self) -> bool {
        self.leading
    }

    /// The run going on, if any.
    pub fn running(&self) -> Option<Occurrence> {
        self.running
    }

    fn occurrence(&self, due: SystemTime) -> Occurrence {
        Occurrence {
            due,
            start: due + jitter(&self.name, due, self.policy.jitter),
        }
    }

    /// The lease was granted; `now` is the server's time at the grant (an
    /// estimate taken after it). Due times whose start is up to twice
    /// [`MAX_CLOCK_ERROR`] after `now` belong to before the grant: the catch-up
    /// window's policy decides them; later ones are this leader's.
    pub fn lead(&mut self, now: SystemTime) {
        self.lead_after(now, 2 * MAX_CLOCK_ERROR, self.policy.catch_up_window);
    }

    /// The lease was granted, and a state table says which due time was claimed
    /// last (`None`: none ever was). Every due time after it whose start fell in
    /// the catch-up window is a catch-up candidate (the claim before each start
    /// keeps it at most once, so no clock margin is left to the old leader); with
    /// no record, only due times after `now`. The last claimed due time, if it
    /// never finished, runs again first with `retry_unfinished` or when it never
    /// started ([`Missed::Unfinished`] otherwise).
    pub fn lead_recorded(
        &mut self,
        now: SystemTime,
        record: Option<Record>,
        retry_unfinished: bool,
    ) {
        if self.leading {
            return;
        }
        match record {
            None => self.lead_after(now, Duration::ZERO, Duration::ZERO),
            Some(r) => {
                // Never again a due time the table shows claimed.
                self.cursor = Some(self.cursor.map_or(r.due, |c| c.max(r.due)));
                self.ahead.retain(|o| o.due > r.due);
                self.last_started = Some(self.last_started.map_or(r.due, |l| l.max(r.due)));
                let unfinished = (!r.finished).then(|| self.occurrence(r.due));
                let retry_unfinished = retry_unfinished || !r.started;
                self.lead_after(now, Duration::ZERO, self.policy.catch_up_window);
                if let Some(o) = unfinished {
                    if retry_unfinished {
                        self.last_started = None;
                        self.waiting.push_front(o);
                    } else {
                        self.decided.push_back(Action::Skip(o, Missed::Unfinished));
                    }
                }
            }
        }
    }

    fn lead_after(&mut self, now: SystemTime, margin: Duration, window: Duration) {
        if self.leading {
            return;
        }
        self.leading = true;
        let horizon = now + margin;
        let lower = (now.checked_sub(window.saturating_add(self.policy.jitter))).unwrap_or(now);
        // The due times still ahead from an earlier term, then the new ones up to
        // the horizon; never again one this planner passed over.
        let mut scanned: Vec<Occurrence> = self.ahead.drain(..).collect();
        let mut cursor = self.cursor.map_or(lower, |c| c.max(lower));
        while let Some(due) = self.spec.next_after(cursor) {
            if due > horizon {
                break;
            }
            cursor = due;
            scanned.push(self.occurrence(due));
        }
        self.cursor = Some(cursor);
        let mut before = Vec::new();
        for occ in scanned {
            if occ.start > horizon {
                self.ahead.push_back(occ);
            } else if !window.is_zero() && occ.start.checked_add(window).is_none_or(|end| end > now)
            {
                before.push(occ);
            } else if occ.start > now {
                self.decided
                    .push_back(Action::Skip(occ, Missed::FailoverMargin));
            }
        }
        self.fill();
        match self.policy.catch_up {
            CatchUp::Off => self.decided.extend(
                before
                    .into_iter()
                    .map(|o| Action::Skip(o, Missed::BeforeLead)),
            ),
            CatchUp::Latest => {
                let latest = before.pop();
                self.decided.extend(
                    before
                        .into_iter()
                        .map(|o| Action::Skip(o, Missed::Superseded)),
                );
                self.waiting.extend(latest);
            }
            CatchUp::All => {
                let extra = before.len().saturating_sub(MAX_CATCH_UP);
                for (i, o) in before.into_iter().enumerate() {
                    if i < extra {
                        self.decided.push_back(Action::Skip(o, Missed::CatchUpCap));
                    } else {
                        self.waiting.push_back(o);
                    }
                }
            }
        }
    }

    /// The lease was lost (or released): nothing more starts until the next
    /// [`Planner::lead`]; what waited to start is skipped
    /// ([`Missed::LeaseLost`]). A running job is stopped by the caller, who
    /// reports its end with [`Planner::finished`].
    pub fn resign(&mut self) {
        if !self.leading {
            return;
        }
        self.leading = false;
        while let Some(o) = self.waiting.pop_front() {
            self.decided.push_back(Action::Skip(o, Missed::LeaseLost));
        }
    }

    /// The run of `due` ended (exited, failed or stopped).
    pub fn finished(&mut self, due: SystemTime) {
        if self.running.is_some_and(|r| r.due == due) {
            self.running = None;
            self.stop_sent = false;
        }
    }

    /// The next action at server time `now`, if any; call until `None`.
    pub fn poll(&mut self, now: SystemTime) -> Option<Action> {
        if let Some(a) = self.decided.pop_front() {
            return Some(a);
        }
        if !self.leading {
            return None;
        }
        // Every due time whose start has come: a late leader runs the latest.
        let mut arrived = Vec::new();
        while self.ahead.front().is_some_and(|o| o.start <= now) {
            arrived.extend(self.ahead.pop_front());
            self.fill();
        }
        if let Some(last) = arrived.pop() {
            for o in arrived {
                self.decided.push_back(Action::Skip(o, Missed::Late));
            }
            self.arrive(last);
        }
        if self.running.is_none() && self.waiting.front().is_some_and(|o| o.start <= now) {
            if let Some(o) = self.waiting.pop_front() {
                let start = self.start(o);
                self.decided.push_back(start);
            }
        }
        self.decided.pop_front()
    }

    /// When [`Planner::poll`] next has something, on the server's clock: the
    /// next start, or `None` while not leading or when nothing is ahead.
    /// (Right after an input, poll anyway.)
    pub fn wake_at(&self) -> Option<SystemTime> {
        if !self.leading {
            return None;
        }
        let waiting = self.waiting.front().filter(|_| self.running.is_none());
        match (waiting, self.ahead.front()) {
            (Some(w), Some(a)) => Some(w.start.min(a.start)),
            (w, a) => w.or(a).map(|o| o.start),
        }
    }

    /// The next due times after `t` as this schedule would start them (for
    /// status and `lease schedule next`).
    pub fn upcoming(&self, t: SystemTime, n: usize) -> Vec<Occurrence> {
        let mut out = Vec::with_capacity(n);
        let mut cursor = t;
        while out.len() < n {
            let Some(due) = self.spec.next_after(cursor) else {
                break;
            };
            out.push(self.occurrence(due));
            cursor = due;
        }
        out
    }

    /// A due time whose start came, while leading.
    fn arrive(&mut self, o: Occurrence) {
        let Some(running) = self.running else {
            if self.waiting.is_empty() {
                let start = self.start(o);
                self.decided.push_back(start);
            } else {
                // Catch-up runs wait: this one after them, as queued.
                self.waiting.push_back(o);
            }
            return;
        };
        match self.policy.overlap {
            Overlap::Skip => self.decided.push_back(Action::Skip(o, Missed::Overlap)),
            Overlap::Queue => {
                if self.waiting.is_empty() {
                    self.waiting.push_back(o);
                } else {
                    self.decided.push_back(Action::Skip(o, Missed::Overlap));
                }
            }
            Overlap::Replace => {
                while let Some(w) = self.waiting.pop_front() {
                    self.decided.push_back(Action::Skip(w, Missed::Overlap));
                }
                self.waiting.push_back(o);
                if !self.stop_sent {
                    self.stop_sent = true;
                    self.decided.push_back(Action::Stop(running));
                }
            }
        }
    }

    /// Starts `o` (the caller checked that nothing runs).
    fn start(&mut self, o: Occurrence) -> Action {
        debug_assert!(self.running.is_none());
        if self.last_started.is_some_and(|l| o.due <= l) {
            return Action::Skip(o, Missed::Late);
        }
        self.running = Some(o);
        self.last_started = Some(o.due);
        Action::Start(o)
    }

    /// Keeps one due time ahead.
    fn fill(&mut self) {
        if !self.ahead.is_empty() {
            return;
        }
        let Some(cursor) = self.cursor else {
            return;
        };
        if let Some(due) = self.spec.next_after(cursor) {
            self.cursor = Some(due);
            let occ = self.occurrence(due);
            self.ahead.push_back(occ);
        }
    }
}
