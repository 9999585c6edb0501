//! A loopback TCP proxy that injects network faults.

use crate::{io_err, KitError};
use socket2::SockRef;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often blocked threads look at the mode. Socket read timeouts are rounded up to the
/// kernel tick, so mode changes take effect (and delays are accurate) within a few ms.
const TICK: Duration = Duration::from_millis(2);

/// What the proxy does with traffic. Changes apply to existing and new connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// A partition neither side can see: forward nothing in either direction and close
    /// nothing. Bytes wait (in the proxy and in kernel buffers) and flow again on `Pass`.
    /// New connections are accepted but not connected upstream until the partition heals.
    BlackHole,
    /// Abort every current connection with a TCP RST on both sides, then behave as `Pass`.
    Reset,
    /// Forward bytes with this extra delay on every chunk, each direction, order preserved.
    Latency(Duration),
}

struct State {
    /// Never `Reset`: a reset bumps `epoch` and switches to `Pass`.
    mode: Mode,
    /// Connections accepted in an older epoch are aborted.
    epoch: u64,
}

struct Shared {
    state: Mutex<State>,
    stop: AtomicBool,
    accepted: AtomicUsize,
    open: AtomicUsize,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A TCP proxy on 127.0.0.1 in front of a loopback upstream, switchable between [`Mode`]s.
///
/// Plain std threads: one accepting, two per connection. Dropping it aborts every connection.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a random port of 127.0.0.1 and forwards to `upstream` (loopback only).
    pub fn start(upstream: SocketAddr) -> Result<FaultProxy, KitError> {
        if !upstream.ip().is_loopback() {
            return Err(KitError::Invalid(format!(
                "FaultProxy forwards to loopback addresses only, not {upstream}"
            )));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(io_err("binding the fault proxy"))?;
        listener
            .set_nonblocking(true)
            .map_err(io_err("configuring the fault proxy listener"))?;
        let addr = listener
            .local_addr()
            .map_err(io_err("reading the fault proxy address"))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: Mode::Pass,
                epoch: 0,
            }),
            stop: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || accept_loop(&listener, upstream, &shared))
        };
        Ok(FaultProxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The port clients connect to, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the mode for existing and new connections (effective within milliseconds).
    pub fn set_mode(&self, mode: Mode) {
        let mut state = self.shared.state();
        if mode == Mode::Reset {
            state.epoch += 1;
            state.mode = Mode::Pass;
        } else {
            state.mode = mode;
        }
    }

    /// How many client connections the proxy has accepted since it started.
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// How many client connections are open right now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                shared.open.fetch_add(1, Ordering::SeqCst);
                let conn = Conn {
                    shared: Arc::clone(shared),
                    epoch: shared.state().epoch,
                    dead: AtomicBool::new(false),
                };
                connections.push(thread::spawn(move || {
                    conn.run(client, upstream);
                    conn.shared.open.fetch_sub(1, Ordering::SeqCst);
                }));
            }
            Err(_) => thread::sleep(TICK),
        }
        connections.retain(|c| !c.is_finished());
    }
    for connection in connections {
        let _ = connection.join();
    }
}

/// What a connection's threads should do right now.
enum Verdict {
    Abort,
    Hold,
    Forward(Duration),
}

/// One proxied connection.
struct Conn {
    shared: Arc<Shared>,
    /// The reset epoch it was accepted in.
    epoch: u64,
    /// Set when either direction failed or aborted: the other one aborts too.
    dead: AtomicBool,
}

impl Conn {
    fn verdict(&self) -> Verdict {
        if self.dead.load(Ordering::SeqCst) || self.shared.stop.load(Ordering::SeqCst) {
            return Verdict::Abort;
        }
        let state = self.shared.state();
        match state.mode {
            _ if state.epoch != self.epoch => Verdict::Abort,
            Mode::BlackHole => Verdict::Hold,
            Mode::Latency(delay) => Verdict::Forward(delay),
            Mode::Pass | Mode::Reset => Verdict::Forward(Duration::ZERO),
        }
    }

    fn run(&self, client: TcpStream, upstream: SocketAddr) {
        // During a partition the connection is accepted but goes nowhere until it heals.
        loop {
            match self.verdict() {
                Verdict::Abort => return self.abort(&client, &client),
                Verdict::Hold => thread::sleep(TICK),
                Verdict::Forward(_) => break,
            }
        }
        let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
            return self.abort(&client, &client);
        };
        for stream in [&client, &server] {
            let setup = stream
                .set_nonblocking(false)
                .and_then(|()| stream.set_nodelay(true))
                .and_then(|()| stream.set_write_timeout(Some(TICK)));
            if setup.is_err() {
                return self.abort(&client, &server);
            }
        }
        thread::scope(|s| {
            s.spawn(|| self.pump(&server, &client));
            self.pump(&client, &server);
        });
    }

    /// Forwards `src` to `dst` until end of file (then half-closes `dst`) or abort.
    fn pump(&self, mut src: &TcpStream, dst: &TcpStream) {
        let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        let mut buf = vec![0; 64 * 1024];
        let mut eof = false;
        loop {
            match self.verdict() {
                Verdict::Abort => return self.abort(src, dst),
                Verdict::Hold => {
                    thread::sleep(TICK);
                    continue;
                }
                Verdict::Forward(_) => {}
            }
            let now = Instant::now();
            if queue.front().is_some_and(|(due, _)| *due <= now) {
                let chunk = queue
                    .pop_front()
                    .map(|(_, chunk)| chunk)
                    .unwrap_or_default();
                if !self.write_all(dst, &chunk) {
                    return self.abort(src, dst);
                }
                continue;
            }
            let wait = match queue.front() {
                Some((due, _)) => (*due - now).min(TICK),
                None if eof => {
                    let _ = dst.shutdown(Shutdown::Write);
                    return;
                }
                None => TICK,
            };
            if eof {
                thread::sleep(wait);
                continue;
            }
            let _ = src.set_read_timeout(Some(wait.max(Duration::from_micros(100))));
            match src.read(&mut buf) {
                Ok(0) => eof = true,
                Ok(n) => {
                    // The mode may have changed during the read: take the delay now.
                    let delay = match self.verdict() {
                        Verdict::Forward(delay) => delay,
                        Verdict::Abort | Verdict::Hold => Duration::ZERO,
                    };
                    queue.push_back((Instant::now() + delay, buf[..n].to_vec()));
                }
                Err(e) if is_timeout(&e) => {}
                Err(_) => return self.abort(src, dst),
            }
        }
    }

    /// Writes all of `chunk`, pausing while black-holed; `false` if the connection must abort.
    fn write_all(&self, mut dst: &TcpStream, chunk: &[u8]) -> bool {
        let mut written = 0;
        while written < chunk.len() {
            match self.verdict() {
                Verdict::Abort => return false,
                Verdict::Hold => thread::sleep(TICK),
                Verdict::Forward(_) => match dst.write(&chunk[written..]) {
                    Ok(n) => written += n,
                    Err(e) if is_timeout(&e) => {}
                    Err(_) => return false,
                },
            }
        }
        true
    }

    /// Makes both sockets send RST when closed, and tells the other direction to stop.
    fn abort(&self, a: &TcpStream, b: &TcpStream) {
        self.dead.store(true, Ordering::SeqCst);
        for stream in [a, b] {
            let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}
