//! `lease run --metrics-addr ADDR`: a small HTTP/1.1 endpoint beside the run.
//!
//! - `GET /metrics`: the lease metrics of this process (lease-driver's set, see
//!   docs/metrics.md) in the Prometheus text format, rendered by
//!   `metrics-exporter-prometheus`'s recorder.
//! - `GET /healthz`: 200 while the runner's database session is ready, or has
//!   been ready within [`Health::tolerance`] (a reconnect in progress); 503
//!   with a one-line reason otherwise (no session for longer, or the server
//!   refused).
//! - `GET /leader`: 200 only while this replica runs the command under a
//!   lease that is valid right now ([`Lease::is_valid`]); 503 otherwise. For
//!   a readiness probe or a load balancer that must reach the leader alone.
//!
//! Served by a task on the runner's own current-thread runtime (no thread of
//! its own): it answers only while the runner's event loop runs, and it ends
//! with the runner. A frozen or starved runner answers nothing, which a probe
//! counts as a failure. Every body passes through [`conn::redact`].
//!
//! The HTTP side is hand-written (request line and headers read, one
//! response, `Connection: close`): four routes do not justify a server crate
//! and its dependencies (hyper, or a framework on it).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lease_tokio::{Lease, LeaseId, LeaseState, Locker, SessionState};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::{conn, log};

/// Bucket bounds (seconds) of every `_seconds` histogram: 1 ms to 2 min.
const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// A request (line and headers) larger than this is refused.
const MAX_REQUEST: usize = 8 * 1024;
/// Time a client has to send its request and read the answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 32;
/// How often the session state is sampled for `/healthz`.
const SAMPLE: Duration = Duration::from_millis(100);
/// How often the recorder's upkeep runs (besides before each scrape).
const UPKEEP: Duration = Duration::from_secs(5);

/// The bound listener and the installed recorder, before the runtime starts.
pub struct Endpoints {
    listener: std::net::TcpListener,
    handle: PrometheusHandle,
}

impl Endpoints {
    /// Binds `addr` and installs the Prometheus recorder as the global
    /// `metrics` recorder (before the locker is built, so that its metric
    /// descriptions reach it).
    ///
    /// # Errors
    /// A one-line message when the address cannot be bound or the recorder
    /// not installed.
    pub fn bind(addr: SocketAddr) -> Result<Endpoints, String> {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("--metrics-addr {addr}: cannot listen: {e}"))?;
        let handle = PrometheusBuilder::new()
            .set_buckets(&BUCKETS)
            .map_err(|e| format!("metrics: {e}"))?
            .install_recorder()
            .map_err(|e| format!("metrics: {e}"))?;
        Ok(Endpoints { listener, handle })
    }

    /// The address actually bound (port 0 resolved).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }
}

/// Exports, from the runner's start, the series the alert rules need before anything happened
/// (a counter appears at its first increment, a level at its first move): `lease_leader` and
/// `lease_acquisitions_total` of each lease, `lease_sessions_ready` and
/// `lease_server_clock_steps_total` at 0. Without them, replicas that never led and never
/// connected show nothing, and "nobody leads" or "no session" cannot be told from "no
/// replica". Called once the recorder is installed, before the locker exists (the driver's
/// moves come after and set the true levels).
pub fn zero(leases: &[LeaseId]) {
    if let Some(group) = leases.first().and_then(LeaseId::group) {
        metrics::gauge!("lease_group_leases_held", "group" => group.name().to_owned()).set(0.0);
    }
    for lease in leases {
        metrics::gauge!("lease_leader", "lease" => lease.name().to_owned()).set(0.0);
        metrics::counter!("lease_acquisitions_total", "lease" => lease.name().to_owned())
            .absolute(0);
    }
    metrics::gauge!("lease_sessions_ready").set(0.0);
    metrics::counter!("lease_server_clock_steps_total").absolute(0);
}

/// The leases the commands currently run under, by shard index (0 without
/// `--shards`), shared between the jobs and the endpoint (set when a command
/// starts, cleared when its job ends).
#[derive(Clone, Default)]
pub struct Current(Arc<Mutex<BTreeMap<usize, Lease>>>);

impl Current {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, Lease>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The command of shard `shard` runs under `lease`.
    pub fn set(&self, shard: usize, lease: &Lease) {
        self.lock().insert(shard, lease.clone());
    }

    /// The job of shard `shard` ended.
    pub fn clear(&self, shard: usize) {
        self.lock().remove(&shard);
    }
}

/// What `/healthz` tolerates, and the shape of `/leader`.
#[derive(Debug, Clone, Copy)]
pub struct Health {
    /// How long the session may be other than ready (connecting, setting up,
    /// backing off, doubtful after a loss) before the runner is unhealthy:
    /// one connection attempt and one retry wait (`--query-timeout` +
    /// `--retry-interval`), the time a routine reconnect takes.
    pub tolerance: Duration,
    /// `--shards`: `/leader/I` answers for shard I, `/leader` for any.
    pub shards: Option<u16>,
}

/// Everything a request is answered from.
struct State {
    locker: Locker,
    current: Current,
    handle: PrometheusHandle,
    health: Health,
    /// When the session was last seen ready (the start, before that).
    last_ready: Mutex<Instant>,
}

/// Serves the endpoints until the task is aborted (the runner ends).
pub async fn serve(endpoints: Endpoints, locker: Locker, current: Current, health: Health) {
    let handle = endpoints.handle;
    let listener = match TcpListener::from_std(endpoints.listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("--metrics-addr: cannot serve: {e}");
            return;
        }
    };
    let state = Arc::new(State {
        locker,
        current,
        handle,
        health,
        last_ready: Mutex::new(Instant::now()),
    });
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut sample = tokio::time::interval(SAMPLE);
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut upkeep = tokio::time::interval(UPKEEP);
    upkeep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = sample.tick() => state.sample(),
            _ = upkeep.tick() => state.handle.run_upkeep(),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(permit) = permits.clone().acquire_owned().await else {
                        return;
                    };
                    let state = state.clone();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(CONNECTION_TIMEOUT, respond(stream, &state))
                            .await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: try again shortly.
                    tracing::debug!("--metrics-addr: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// A response: status code and one body.
struct Response {
    code: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn text(code: u16, body: impl Into<String>) -> Response {
        let mut body = body.into();
        body.push('\n');
        Response {
            code,
            content_type: "text/plain; charset=utf-8",
            body,
        }
    }
}

impl State {
    fn sample(&self) {
        if matches!(self.locker.status().session, SessionState::Ready { .. }) {
            *self.last_ready.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }

    fn route(&self, path: &str) -> Response {
        match path {
            "/metrics" => {
                self.handle.run_upkeep();
                Response {
                    code: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    body: self.handle.render(),
                }
            }
            "/healthz" => self.healthz(),
            "/leader" => match self.health.shards {
                None => self.leader(0),
                Some(n) => self.leader_of_any(n),
            },
            _ => match (self.health.shards, path.strip_prefix("/leader/")) {
                (Some(n), Some(segment)) => match segment.parse::<u16>() {
                    Ok(i) if i < n && i.to_string() == segment => self.leader(usize::from(i)),
                    _ => Response::text(
                        404,
                        format!("not found: the shards are /leader/0 to /leader/{}", n - 1),
                    ),
                },
                (Some(_), None) => Response::text(
                    404,
                    "not found: try /metrics, /healthz, /leader or /leader/SHARD",
                ),
                (None, _) => Response::text(404, "not found: try /metrics, /healthz or /leader"),
            },
        }
    }

    /// `/leader` with `--shards n`: 200 while the command of at least one
    /// shard runs under a valid lease, naming them.
    fn leader_of_any(&self, n: u16) -> Response {
        let led: Vec<String> = (self.current.lock().iter())
            .filter(|(_, lease)| lease.is_valid())
            .map(|(i, _)| i.to_string())
            .collect();
        if led.is_empty() {
            Response::text(
                503,
                format!("not leader: {}", role(&self.locker.status().leases)),
            )
        } else {
            Response::text(
                200,
                format!("leader of {} of {n} shards: {}", led.len(), led.join(",")),
            )
        }
    }

    fn healthz(&self) -> Response {
        let status = self.locker.status();
        let now = Instant::now();
        let last_ready = {
            let mut last = self.last_ready.lock().unwrap_or_else(|e| e.into_inner());
            if matches!(status.session, SessionState::Ready { .. }) {
                *last = now;
            }
            *last
        };
        let role = role(&status.leases);
        let down = now.saturating_duration_since(last_ready);
        let session = match &status.session {
            SessionState::Ready { backend_pid } => {
                return Response::text(
                    200,
                    format!("ok: session ready (backend_pid {backend_pid}); {role}"),
                );
            }
            SessionState::Refused(r) => return Response::text(503, format!("refused: {r}")),
            SessionState::Backoff { failures, .. } => {
                format!("cannot reach the database ({failures} failed attempts)")
            }
            SessionState::Connecting => "connecting".to_owned(),
            SessionState::SettingUp => "setting up the session".to_owned(),
            SessionState::Doubtful { .. } => "session given up after a lost lease".to_owned(),
            _ => "no session".to_owned(),
        };
        let down_for = log::millis(down);
        if down < self.health.tolerance {
            Response::text(
                200,
                format!("ok: {session}, not ready for {down_for}; {role}"),
            )
        } else {
            Response::text(
                503,
                format!("unhealthy: {session}, not ready for {down_for}"),
            )
        }
    }

    /// `/leader` (`shard` 0), or `/leader/SHARD` with `--shards`.
    fn leader(&self, shard: usize) -> Response {
        let current = self.current.lock().get(&shard).cloned();
        match current {
            Some(lease) if lease.is_valid() => {
                let left = lease.valid_until().map_or(Duration::ZERO, |v| {
                    v.saturating_duration_since(Instant::now())
                });
                let left = log::millis(left);
                Response::text(
                    200,
                    format!("leader: token {}, valid for {left}", lease.token()),
                )
            }
            Some(_) => Response::text(503, "not leader: the lease is lost or being released"),
            None => {
                let status = self.locker.status();
                let role = match self.health.shards {
                    None => role(&status.leases),
                    Some(_) => role(std::slice::from_ref(
                        match (status.leases.iter()).find(|l| {
                            l.lease.name().rsplit_once('/').map(|(_, i)| i)
                                == Some(&*shard.to_string())
                        }) {
                            Some(l) => l,
                            None => return Response::text(503, "not leader: not contending"),
                        },
                    )),
                };
                Response::text(503, format!("not leader: {role}"))
            }
        }
    }
}

/// This replica's part, for a response body.
fn role(leases: &[lease_tokio::LeaseStatus]) -> String {
    if leases.len() > 1 {
        let leading = (leases.iter())
            .filter(|l| matches!(l.state, LeaseState::Leading { .. }))
            .count();
        return format!("leading {leading} of {} shards", leases.len());
    }
    match leases.first().map(|l| &l.state) {
        Some(LeaseState::Leading { token, .. }) => format!("leading (token {token})"),
        Some(LeaseState::Standby {
            holder_pid: Some(pid),
        }) => format!("standing by (held by backend_pid {pid})"),
        Some(LeaseState::Standby { holder_pid: None }) => "standing by".to_owned(),
        Some(LeaseState::Stopping) => "stopping the command".to_owned(),
        Some(LeaseState::Releasing) => "releasing the lease".to_owned(),
        _ => "not contending".to_owned(),
    }
}

/// Reads one request and writes its response.
async fn respond(mut stream: TcpStream, state: &State) {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n").or_else(|| find(&buf, b"\n\n")) {
            break Some(i);
        }
        if buf.len() > MAX_REQUEST {
            break None;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break (!buf.is_empty()).then_some(buf.len()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let (response, head) = match head_end {
        None => (Response::text(431, "request too large"), false),
        Some(end) => {
            let request = String::from_utf8_lossy(&buf[..end]);
            let mut words = request.lines().next().unwrap_or("").split_whitespace();
            let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let path = target.split(['?', '#']).next().unwrap_or("");
            match method {
                "GET" => (state.route(path), false),
                "HEAD" => (state.route(path), true),
                "" => return,
                _ => (Response::text(405, "only GET and HEAD"), false),
            }
        }
    };
    let body = conn::redact(&response.body);
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
         Connection: close\r\n\r\n",
        response.code,
        reason(response.code),
        response.content_type,
        body.len()
    );
    if !head {
        out.push_str(&body);
    }
    let _ = stream.write_all(out.as_bytes()).await;
    let _ = stream.shutdown().await;
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_found() {
        assert_eq!(find(b"GET / HTTP/1.1\r\n\r\n", b"\r\n\r\n"), Some(14));
        assert_eq!(find(b"GET /", b"\r\n\r\n"), None);
    }
}
