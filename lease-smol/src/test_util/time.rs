//! The kit's virtual time: a clock whose timers fire when the kit's
//! executor has nothing else to run, and that executor ([`block_on`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use async_executor::{LocalExecutor, Task};
use lease_driver::{BoxFuture, Connected, Runtime, SessionError};
use tokio_postgres::Config;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A virtual clock: it stands still until the executor of [`block_on`] runs
/// out of work, then jumps to the earliest pending timer.
#[derive(Debug)]
struct Clock {
    state: Mutex<ClockState>,
    /// The thread of its [`block_on`], the only one whose tasks it sees.
    thread: ThreadId,
}

#[derive(Debug)]
struct ClockState {
    now: Instant,
    /// The pending timers, by deadline (in registration order among equal
    /// deadlines).
    timers: BTreeMap<(Instant, u64), Waker>,
    seq: u64,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            state: Mutex::new(ClockState {
                now: Instant::now(),
                timers: BTreeMap::new(),
                seq: 0,
            }),
            thread: thread::current().id(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClockState> {
        lock(&self.state)
    }

    fn now(&self) -> Instant {
        self.lock().now
    }

    /// Moves to the earliest pending timer and wakes every timer due then;
    /// `false` when no timer is pending.
    fn advance(&self) -> bool {
        let mut s = self.lock();
        let Some(&(at, _)) = s.timers.keys().next() else {
            return false;
        };
        s.now = s.now.max(at);
        let now = s.now;
        let mut due = Vec::new();
        while let Some(entry) = s.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        drop(s);
        for waker in due {
            waker.wake();
        }
        true
    }
}

/// What [`block_on`] makes current on its thread.
struct Kit {
    executor: LocalExecutor<'static>,
    clock: Arc<Clock>,
}

thread_local! {
    static KIT: RefCell<Option<Rc<Kit>>> = const { RefCell::new(None) };
}

fn current() -> Option<Rc<Kit>> {
    KIT.with(|kit| kit.borrow().clone())
}

fn current_clock() -> Option<Arc<Clock>> {
    current().map(|kit| kit.clock.clone())
}

/// Makes a kit current on this thread until dropped, restoring the one
/// before (a nested [`block_on`]).
struct Enter(Option<Rc<Kit>>);

impl Enter {
    fn new(kit: Rc<Kit>) -> Enter {
        Enter(KIT.with(|k| k.borrow_mut().replace(kit)))
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        let previous = self.0.take();
        KIT.with(|k| *k.borrow_mut() = previous);
    }
}

/// The main future's waker: notes the wake and passes it to the thread's.
struct MainWaker {
    woken: AtomicBool,
    outer: Mutex<Option<Waker>>,
}

impl MainWaker {
    fn take(&self) -> bool {
        self.woken.swap(false, Ordering::AcqRel)
    }

    fn woken(&self) -> bool {
        self.woken.load(Ordering::Acquire)
    }
}

impl Wake for MainWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(outer) = lock(&self.outer).as_ref() {
            outer.wake_by_ref();
        }
    }
}

/// Runs `future` to completion on this thread, with the tasks of
/// [`spawn`], in virtual time: the clock of [`now`], [`sleep`], [`Timer`]
/// and of every [`TestServer`](super::TestServer) made inside stands still
/// while a task can run, and jumps to the earliest pending timer when none
/// can (tokio's paused clock does the same). A minute of failover runs in
/// milliseconds, and a run is the same from the same seed.
///
/// Tasks still pending when `future` returns are dropped. Spawn the kit's
/// drivers and runs with [`spawn`], not on another executor: the clock moves
/// when this one is idle, whatever other threads are doing (a virtual timer
/// polled on another thread panics, saying so). Real time goes on outside it
/// (async-io's `Timer`, a socket), unseen by the clock: wait on [`sleep`] or
/// [`Timer`], never on async-io's timer, in code under test. With no task to
/// run and no timer pending, it waits in real time for a wake from another
/// thread. The guide: `docs/testing.md` of the repository, "smol".
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    let kit = Rc::new(Kit {
        executor: LocalExecutor::new(),
        clock: Arc::new(Clock::new()),
    });
    let _enter = Enter::new(kit.clone());
    let mut future = pin!(future);
    let main = Arc::new(MainWaker {
        woken: AtomicBool::new(true),
        outer: Mutex::new(None),
    });
    let main_waker = Waker::from(main.clone());
    // Kept across polls while idle: a task woken from another thread wakes it.
    let mut idle: Option<Pin<Box<dyn Future<Output = ()> + '_>>> = None;
    futures_lite::future::block_on(poll_fn(|cx| {
        {
            let mut outer = lock(&main.outer);
            if !outer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *outer = Some(cx.waker().clone());
            }
        }
        loop {
            if main.take() {
                let mut main_cx = Context::from_waker(&main_waker);
                if let Poll::Ready(out) = future.as_mut().poll(&mut main_cx) {
                    return Poll::Ready(out);
                }
            }
            if kit.executor.try_tick() || main.woken() || kit.clock.advance() {
                continue;
            }
            // Nothing to run, no timer: only another thread can wake us.
            let tick = idle.get_or_insert_with(|| Box::pin(kit.executor.tick()));
            match tick.as_mut().poll(cx) {
                Poll::Ready(()) => idle = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }))
}

/// Spawns `future` on the executor of the current [`block_on`]: a
/// [`Task`] (smol's) to `.await`, `.detach()` or drop (which cancels it).
/// It need not be `Send`.
///
/// # Panics
/// Outside [`block_on`].
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> Task<T> {
    let kit = current().expect("lease_smol::test_util::spawn outside test_util::block_on");
    kit.executor.spawn(future)
}

/// The time now: the virtual clock's inside [`block_on`], the system's
/// outside.
pub fn now() -> Instant {
    current_clock().map_or_else(Instant::now, |clock| clock.now())
}

/// A [`Timer`] that fires `duration` from [`now`].
pub fn sleep(duration: Duration) -> Timer {
    Timer::after(duration)
}

/// A timer on the kit's clock: virtual inside [`block_on`], async-io's
/// outside (chosen when it is made). Resolves to the time it fired, as
/// async-io's `Timer` does.
pub struct Timer {
    at: Instant,
    kind: Kind,
}

enum Kind {
    Virtual {
        clock: Arc<Clock>,
        /// Its entry in the clock's timers while pending.
        key: Option<(Instant, u64)>,
    },
    Real(async_io::Timer),
}

impl Timer {
    /// A timer that fires `duration` from [`now`].
    pub fn after(duration: Duration) -> Timer {
        Timer::on(current_clock(), now() + duration)
    }

    /// A timer that fires at `at`.
    pub fn at(at: Instant) -> Timer {
        Timer::on(current_clock(), at)
    }

    fn on(clock: Option<Arc<Clock>>, at: Instant) -> Timer {
        let kind = match clock {
            Some(clock) => Kind::Virtual { clock, key: None },
            None => Kind::Real(async_io::Timer::at(at)),
        };
        Timer { at, kind }
    }

    /// Moves the deadline: a fired timer fires again at the new one. A
    /// pending timer keeps its waker.
    pub fn set_at(&mut self, at: Instant) {
        self.at = at;
        match &mut self.kind {
            Kind::Virtual { clock, key } => {
                let mut s = clock.lock();
                let waker = key.take().and_then(|k| s.timers.remove(&k));
                if let Some(waker) = waker {
                    s.seq += 1;
                    let k = (at, s.seq);
                    s.timers.insert(k, waker);
                    *key = Some(k);
                }
            }
            Kind::Real(timer) => timer.set_at(at),
        }
    }

    fn poll_fire(&mut self, cx: &mut Context<'_>) -> Poll<Instant> {
        let (clock, key) = match &mut self.kind {
            Kind::Real(timer) => return Pin::new(timer).poll(cx),
            Kind::Virtual { clock, key } => (clock, key),
        };
        // Polled elsewhere, it would be fired by a clock that never waits
        // for its task: the clock would run ahead of it.
        assert!(
            thread::current().id() == clock.thread,
            "a timer of lease_smol::test_util's virtual clock polled outside the thread of its \
             test_util::block_on: run the kit's drivers, runs and jobs with test_util::spawn, \
             not on another executor"
        );
        let mut s = clock.lock();
        if s.now >= self.at {
            if let Some(k) = key.take() {
                s.timers.remove(&k);
            }
            return Poll::Ready(s.now);
        }
        let k = match *key {
            Some(k) if k.0 == self.at => k,
            old => {
                if let Some(old) = old {
                    s.timers.remove(&old);
                }
                s.seq += 1;
                (self.at, s.seq)
            }
        };
        *key = Some(k);
        s.timers.insert(k, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Kind::Virtual {
            clock,
            key: Some(k),
        } = &self.kind
        {
            clock.lock().timers.remove(k);
        }
    }
}

impl fmt::Debug for Timer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let virtual_ = matches!(self.kind, Kind::Virtual { .. });
        f.debug_struct("Timer")
            .field("at", &self.at)
            .field("virtual", &virtual_)
            .finish()
    }
}

impl Future for Timer {
    type Output = Instant;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Instant> {
        self.get_mut().poll_fire(cx)
    }
}

impl lease_driver::Timer for Timer {
    fn reset(self: Pin<&mut Self>, at: Instant) {
        self.get_mut().set_at(at);
    }

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().poll_fire(cx).map(|_| ())
    }
}

/// The runtime of the kit's lockers: the clock and timers of the
/// [`block_on`] the [`TestServer`](super::TestServer) was made in (virtual),
/// or the system's and async-io's when made outside one (real time, as
/// before the kit had a clock). The kit opens the sessions itself.
pub struct TestRuntime {
    clock: Option<Arc<Clock>>,
}

impl TestRuntime {
    /// The runtime of the current [`block_on`], or real time outside one.
    pub(crate) fn current() -> TestRuntime {
        TestRuntime {
            clock: current_clock(),
        }
    }
}

impl fmt::Debug for TestRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestRuntime")
            .field("virtual", &self.clock.is_some())
            .finish()
    }
}

impl Runtime for TestRuntime {
    fn now(&self) -> Instant {
        self.clock
            .as_ref()
            .map_or_else(Instant::now, |clock| clock.now())
    }

    fn timer(&self, at: Instant) -> Pin<Box<dyn lease_driver::Timer>> {
        Box::pin(Timer::on(self.clock.clone(), at))
    }

    fn connect(&self, _config: Config) -> BoxFuture<Connected> {
        Box::pin(async {
            Err(SessionError::config(
                "the test kit's runtime opens no connection (its sessions are simulated)",
            ))
        })
    }
}
